"""Thousands of random and mutated protocol messages over real sockets.

The server must stay up, close only the offending connection, and keep answering well-formed
clients; the budget ledger must stay consistent.  Seeded, bounded in count and time.
"""

from __future__ import annotations

import logging
import random
import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from tests.server.conftest import RawClient, message, start_wire, startup_packet

SEED = 20261201
CONNECTIONS = 160
MESSAGES_PER_CONNECTION = 25
SQL = ["SELECT COUNT(*) FROM trips", "SELECT city, AVG(fare) FROM trips GROUP BY city",
       "SELECT * FROM trips", "SET chorus.epsilon = 0.01", "SHOW chorus.budget",
       "SELECT relname FROM pg_class", "SELECT version()", "BEGIN", "COMMIT", "ROLLBACK",
       "SELECT COUNT(*) FROM trips WHERE fare > $1", "EXPLAIN SELECT SUM(fare) FROM trips",
       "SELECT $1::int", "", "SELECT 1; SELECT 2", "SET datestyle = 'SQL'", "SELEC 1"]


def _valid(rng: random.Random) -> bytes:
    sql = rng.choice(SQL).encode()
    name = rng.choice([b"", b"s1", b"s2", b"p"])
    kind = rng.randrange(9)
    if kind == 0:
        return message(b"Q", sql + b"\0")
    if kind == 1:
        return message(b"P", name + b"\0" + sql + b"\0" + struct.pack("!h", 0))
    if kind == 2:
        params = [rng.choice([b"10", b"x", b"\x00\x00\x00\x05", b""])
                  for _ in range(rng.randrange(3))]
        body = b"\0" + name + b"\0" + struct.pack("!hh", 1, rng.randrange(2))
        body += struct.pack("!h", len(params)) + b"".join(
            struct.pack("!i", len(v)) + v for v in params) + struct.pack("!hh", 1,
                                                                         rng.randrange(2))
        return message(b"B", body)
    if kind == 3:
        return message(b"D", rng.choice([b"S", b"P"]) + name + b"\0")
    if kind == 4:
        return message(b"E", b"\0" + struct.pack("!i", rng.choice([0, 1, 2])))
    if kind == 5:
        return message(b"C", rng.choice([b"S", b"P"]) + name + b"\0")
    if kind == 6:
        return message(b"H")
    if kind == 7:
        return message(rng.choice([b"d", b"c", b"f", b"F", b"p"]), rng.randbytes(8))
    return message(b"S")


def _mutate(rng: random.Random, data: bytes) -> bytes:
    choice = rng.randrange(6)
    if choice == 0:  # flip bytes
        buf = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            buf[rng.randrange(len(buf))] = rng.randrange(256)
        return bytes(buf)
    if choice == 1:  # truncate
        return data[:rng.randrange(len(data))]
    if choice == 2:  # a wrong length
        return data[:1] + struct.pack("!i", rng.choice([-5, 0, 3, 1 << 30, len(data) + 50])) \
            + data[5:]
    if choice == 3:  # random type byte and body
        return bytes([rng.randrange(256)]) + struct.pack("!i", 12) + rng.randbytes(8)
    if choice == 4:  # pure noise
        return rng.randbytes(rng.randint(1, 64))
    return data


def _drain(sock: socket.socket, timeout: float) -> bool:
    """Read what the server sent; False once it closed the connection."""
    sock.settimeout(timeout)
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return False
            if chunk.endswith(b"Z\x00\x00\x00\x05I") or chunk.endswith(
                    b"Z\x00\x00\x00\x05T") or chunk.endswith(b"Z\x00\x00\x00\x05E"):
                return True
    except TimeoutError:
        return True
    except OSError:
        return False


def test_fuzz(duckdb_data: str, write_policy: Callable[..., Path],
              caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="chorus.pgwire")
    rng = random.Random(SEED)
    policy = write_policy(duckdb_data, epsilon_per_block=1e6)
    sent = 0
    started = time.monotonic()
    with start_wire(policy, server="login_timeout_seconds = 2") as wire:
        good = psycopg.connect(wire.url(), autocommit=True)  # stays open throughout
        for i in range(CONNECTIONS):
            if i % 4 == 0:  # garbage before or instead of the startup message
                with socket.create_connection((wire.host, wire.port), timeout=2) as sock:
                    data = _mutate(rng, startup_packet(rng.choice(["alice", "x" * 300])))
                    sock.sendall(data + rng.randbytes(rng.randint(0, 32)))
                    sent += 1
                    _drain(sock, 0.05)
                continue
            client = RawClient(wire.host, wire.port, timeout=5)
            try:
                assert client.login()[-1][0] == b"Z"
                batch = []
                for _ in range(MESSAGES_PER_CONNECTION):
                    data = _valid(rng)
                    batch.append(_mutate(rng, data) if rng.random() < 0.05 else data)
                client.send(b"".join(batch) + message(b"S"))  # pipelined, like real clients
                sent += len(batch)
                _drain(client.sock, 0.5)
            except OSError:
                pass  # the server closed this connection: allowed
            finally:
                client.close()
            if i % 20 == 0:  # a well-formed client keeps being answered meanwhile
                assert good.execute("SELECT 1").fetchone() == (1,)
        assert sent >= 2000
        assert good.execute("SELECT COUNT(*) FROM trips").fetchone()[0] is not None
        good.close()
        with psycopg.connect(wire.url("bob"), autocommit=True) as con:
            con.execute("SET chorus.epsilon = 0.5")
            assert con.execute("SELECT COUNT(*) FROM trips").fetchone()[0] is not None
        deadline = time.monotonic() + 5
        while wire.server.connections and time.monotonic() < deadline:
            time.sleep(0.05)
        assert wire.server.connections == 0  # every fuzzed connection was cleaned up
        for block in wire.engine.ledger.blocks():  # nothing spent beyond any block's budget
            assert 0 <= block.epsilon_consumed <= block.epsilon_global + 1e-9
    assert time.monotonic() - started < 60
    # every bad message was answered as a protocol or SQL error, none as a bug in the proxy
    assert [r.getMessage() for r in caplog.records] == []
