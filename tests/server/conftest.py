"""A running wire server (real socket, own event loop thread) on each backend, for real clients.

The server runs in this process, so it shares the session's DuckDB file (a second process could
not open it while tests hold it).  Analysts: alice (password "alice-pw"), bob ("bob-pw", at
most epsilon 0.5 per query) and carol (declared without a password: cannot log in).
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from chorus_py.engine import Engine
from chorus_py.policy import load_policy
from server.pgwire.scram import make_verifier
from server.pgwire.server import build_wire_server, running_server

PASSWORDS = {"alice": "alice-pw", "bob": "bob-pw"}
_VERIFIERS = {name: make_verifier(pw) for name, pw in PASSWORDS.items()}


def with_passwords(policy: Path, server: str = "") -> Path:
    """Give the test policy's analysts alice and bob passwords; add carol (none) and [server]."""
    text = policy.read_text()
    text = text.replace("[analysts.alice]",
                        f'[analysts.alice]\npassword = "{_VERIFIERS["alice"]}"')
    text = text.replace("[analysts.bob]", f'[analysts.bob]\npassword = "{_VERIFIERS["bob"]}"')
    text += "\n[analysts.carol]\n" + (f"\n[server]\n{server}\n" if server else "")
    policy.write_text(text)
    return policy


@dataclass
class Wire:
    """A running server: where it listens, its engine, and how to reach it."""

    host: str
    port: int
    engine: Engine
    server: Any
    backend: str

    def url(self, user: str = "alice", password: str | None = None, **params: str) -> str:
        pw = PASSWORDS.get(user, "x") if password is None else password
        query = "&".join(f"{k}={v}" for k, v in {"sslmode": "disable", **params}.items())
        return f"postgresql://{user}:{pw}@{self.host}:{self.port}/chorus?{query}"

    def kwargs(self, user: str = "alice") -> dict[str, Any]:
        return {"host": self.host, "port": self.port, "user": user,
                "password": PASSWORDS[user], "dbname": "chorus", "sslmode": "disable"}


@contextmanager
def start_wire(policy: Path, *, backend: str = "duckdb", server: str = "",
               wrap: Callable[[Engine], Any] | None = None) -> Iterator[Wire]:
    """Run a wire server for a test policy (written by the ``write_policy`` fixture)."""
    engine = Engine(load_policy(with_passwords(policy, server)))
    engine.warm_up(wait=True)  # as `chorus serve` starts, but waiting: the same SQL every time
    try:
        wire_server = build_wire_server(wrap(engine) if wrap else engine)
        with running_server(wire_server) as (host, port):
            yield Wire(host, port, engine, wire_server, backend)
    finally:
        engine.close()


@pytest.fixture(params=["duckdb", pytest.param("postgres", marks=pytest.mark.postgres)])
def wire(request: pytest.FixtureRequest, write_policy: Callable[..., Path]) -> Iterator[Wire]:
    """A wire server with the test policy, once per backend."""
    url = request.getfixturevalue(f"{request.param}_data")
    with start_wire(write_policy(url), backend=request.param) as w:
        yield w


@pytest.fixture
def duckdb_wire(duckdb_data: str, write_policy: Callable[..., Path]) -> Iterator[Wire]:
    """A wire server on DuckDB only (protocol-level tests that do not depend on the backend)."""
    with start_wire(write_policy(duckdb_data)) as w:
        yield w


# -- a tiny raw client for protocol-level tests -------------------------------------------------


def startup_packet(user: str, database: str = "chorus", **params: str) -> bytes:
    body = struct.pack("!i", 196608)
    for k, v in {"user": user, "database": database, **params}.items():
        body += k.encode() + b"\0" + v.encode() + b"\0"
    body += b"\0"
    return struct.pack("!i", len(body) + 4) + body


def message(kind: bytes, body: bytes = b"") -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


class RawClient:
    """Speaks the protocol byte by byte (SCRAM done here too), for tests that need control."""

    def __init__(self, host: str, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.buffer = b""

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_message(self) -> tuple[bytes, bytes]:
        while len(self.buffer) < 5:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            self.buffer += chunk
        kind, length = self.buffer[:1], struct.unpack("!i", self.buffer[1:5])[0]
        while len(self.buffer) < length + 1:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            self.buffer += chunk
        body = self.buffer[5:length + 1]
        self.buffer = self.buffer[length + 1:]
        return kind, body

    def read_until_ready(self) -> list[tuple[bytes, bytes]]:
        out = []
        while True:
            kind, body = self.read_message()
            out.append((kind, body))
            if kind == b"Z":
                return out

    def login(self, user: str = "alice", password: str | None = None) -> list[tuple[bytes, bytes]]:
        import base64
        import hashlib
        import hmac
        import secrets

        password = PASSWORDS[user] if password is None else password
        self.send(startup_packet(user))
        kind, body = self.read_message()
        assert kind == b"R" and struct.unpack("!i", body[:4])[0] == 10, (kind, body)
        nonce = base64.b64encode(secrets.token_bytes(18)).decode()
        first_bare = f"n=,r={nonce}"
        initial = ("n,," + first_bare).encode()
        self.send(message(b"p", b"SCRAM-SHA-256\0" + struct.pack("!i", len(initial)) + initial))
        kind, body = self.read_message()
        if kind == b"E":
            return [(kind, body)]
        server_first = body[4:].decode()
        attrs = dict(part.split("=", 1) for part in server_first.split(","))
        salted = hashlib.pbkdf2_hmac("sha256", password.encode(), base64.b64decode(attrs["s"]),
                                     int(attrs["i"]))
        client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
        stored = hashlib.sha256(client_key).digest()
        without_proof = f"c=biws,r={attrs['r']}"
        auth = f"{first_bare},{server_first},{without_proof}".encode()
        signature = hmac.new(stored, auth, hashlib.sha256).digest()
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self.send(message(b"p", f"{without_proof},p={base64.b64encode(proof).decode()}".encode()))
        out = []
        while True:
            kind, body = self.read_message()
            out.append((kind, body))
            if kind in (b"Z", b"E"):
                return out


def error_fields(body: bytes) -> dict[str, str]:
    fields = {}
    for part in body.split(b"\0"):
        if part:
            fields[chr(part[0])] = part[1:].decode()
    return fields
