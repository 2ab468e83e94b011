"""Session behaviour over a real socket: settings, budget, EXPLAIN, extended-protocol details.

Checked at the byte level where clients hide it: Describe never executes (nothing read, nothing
charged), Flush is answered without Sync, portals suspend at max_rows, an error skips to Sync,
catalog queries never reach the database.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from tests.server.conftest import RawClient, Wire, error_fields, message, start_wire


def spent(wire: Wire) -> float:
    return sum(b.epsilon_consumed + b.epsilon_allocated for b in wire.engine.ledger.blocks())


def count_backend_calls(wire: Wire) -> list[str]:
    calls: list[str] = []
    run = wire.engine.backend.run

    def spy(sql: str) -> object:
        calls.append(sql)
        return run(sql)

    wire.engine.backend.run = spy  # type: ignore[method-assign]
    return calls


def test_settings_and_budget(wire: Wire) -> None:
    with psycopg.connect(wire.url("bob"), autocommit=True) as con:
        # bob may spend at most 0.5 per query; the policy's default is 1.0
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="per-query maximum"):
            con.execute("SELECT COUNT(*) FROM trips")
        assert con.execute("SHOW chorus.epsilon").fetchone() == ("1",)
        con.execute("SET chorus.epsilon = 0.5")
        con.execute("SET chorus.delta TO 1e-9")
        assert con.execute("SHOW chorus.epsilon").fetchone() == ("0.5",)
        assert con.execute("SHOW chorus.delta").fetchone() == ("1e-09",)
        before = spent(wire)
        con.execute("SELECT COUNT(*) FROM trips WHERE pickup_time < '2026-01-03'")
        assert spent(wire) == pytest.approx(before + 2 * 0.5)  # two daily blocks, bob's 0.5
        claims = [c for c in wire.engine.ledger.claims() if getattr(c, "analyst", "") == "bob"]
        assert claims, "the connection's analyst is charged"
        cur = con.execute("SHOW chorus.budget")  # compact: what bob can spend, rounded
        names = [d.name for d in cur.description]
        assert names == ["block", "state", "epsilon_left", "limited_by", "your_epsilon_spent",
                         "epsilon_spent", "delta_left"]
        compact = {row[0]: dict(zip(names, row, strict=True)) for row in cur.fetchall()}
        assert compact["trips/2026-01-01"] | {"epsilon_spent": 0, "delta_left": 0} == {
            "block": "trips/2026-01-01", "state": "active", "epsilon_left": 999.5,
            "limited_by": "block", "your_epsilon_spent": 0.5, "epsilon_spent": 0,
            "delta_left": 0}
        cur = con.execute("SHOW chorus.budget_full")  # every field of the ledger
        names = [d.name for d in cur.description]
        rows = cur.fetchall()
        assert names[0] == "block" and "epsilon_global" in names
        first = dict(zip(names, rows[0], strict=True))
        assert first["block"] == "trips/2026-01-01" and first["epsilon_global"] == 1000.0
        assert len(rows) >= 2  # the ledger lists the blocks queries have touched
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            con.execute("SET chorus.delta = 2")
        with pytest.raises(psycopg.errors.UndefinedObject):
            con.execute("SET chorus.nope = 1")
        con.execute("RESET ALL")
        assert con.execute("SHOW chorus.epsilon").fetchone() == ("1",)
        # client settings are accepted and shown
        con.execute("SET application_name = 'notebook'")
        assert con.execute("SHOW application_name").fetchone() == ("notebook",)
        assert con.info.parameter_status("application_name") == "notebook"
        assert con.execute("SHOW server_version").fetchone()[0].startswith("15.0")


def test_explain_costs_nothing(wire: Wire) -> None:
    calls = count_backend_calls(wire)
    before = spent(wire)
    with psycopg.connect(wire.url(), autocommit=True) as con:
        rows = con.execute("EXPLAIN SELECT city, AVG(fare) FROM trips GROUP BY city").fetchall()
        text = "\n".join(r[0] for r in rows)
        assert "verdict: allowed" in text and "epsilon=1" in text
        assert "snapping" in text and "rewritten SQL:" in text
        (plan,) = con.execute("EXPLAIN (FORMAT JSON) SELECT COUNT(*) FROM trips WHERE fare > %s",
                              (10,), prepare=True).fetchone()
        assert json.loads(plan)["epsilon"] == 1.0
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            con.execute("EXPLAIN SELECT * FROM trips")
        with pytest.raises(psycopg.errors.FeatureNotSupported):
            con.execute("EXPLAIN ANALYZE SELECT COUNT(*) FROM trips")
    assert spent(wire) == before
    # no rewritten (noisy) query ran: at most the block windows were looked up
    assert not [c for c in calls if "random()" in c.lower()]


def test_catalog_never_reaches_the_database(duckdb_wire: Wire) -> None:
    calls = count_backend_calls(duckdb_wire)
    with psycopg.connect(duckdb_wire.url(), autocommit=True) as con:
        for sql in ["SELECT version()", "SELECT current_schema(), current_user",
                    "SELECT relname FROM pg_catalog.pg_class ORDER BY 1",
                    "SELECT table_name, column_name FROM information_schema.columns "
                    "WHERE table_name = 'visits'",
                    "SELECT oid, typname FROM pg_type WHERE typname = 'int8'"]:
            con.execute(sql).fetchall()
        assert con.execute("SELECT relname FROM pg_class ORDER BY 1").fetchall() == [
            ("cities",), ("trips",), ("visits",)]
        assert con.execute("SELECT current_user").fetchone() == ("alice",)
        cols = con.execute("SELECT column_name FROM information_schema.columns "
                           "WHERE table_name = %s ORDER BY ordinal_position",
                           ("visits",), prepare=True).fetchall()
        assert cols == [("visit_id",), ("page",), ("seconds",)]
        # statistics and relations the fake catalog does not describe are simply absent
        for sql in ["SELECT * FROM pg_catalog.pg_stats", "SELECT reltuples FROM pg_class "
                    "WHERE relname = 'trips'"]:
            try:
                rows = con.execute(sql).fetchall()
            except psycopg.errors.UndefinedTable:
                continue
            assert rows == [(-1.0,)]  # never a real row count
        with pytest.raises(psycopg.Error):
            con.execute("SELECT pg_read_file('/etc/passwd')")
    assert calls == []


def _frames(client: RawClient, until: bytes = b"Z") -> list[bytes]:
    kinds = []
    while True:
        kind, _body = client.read_message()
        kinds.append(kind)
        if kind == until:
            return kinds


def test_extended_protocol_details(duckdb_wire: Wire) -> None:
    wire = duckdb_wire
    client = RawClient(wire.host, wire.port)
    try:
        assert client.login()[-1][0] == b"Z"
        calls = count_backend_calls(wire)
        before = spent(wire)
        # Describe of a statement: parameter types inferred from the columns, result columns
        # predicted from the query's shape; nothing runs, nothing is charged
        client.send(message(b"P", b"s1\0SELECT city, COUNT(*) AS n FROM trips WHERE fare > $1 "
                            b"AND pickup_time < $2 GROUP BY city\0\0\0")
                    + message(b"D", b"Ss1\0") + message(b"S"))
        out = client.read_until_ready()
        assert [k for k, _ in out] == [b"1", b"t", b"T", b"Z"]
        n, a, b = struct.unpack("!hII", out[1][1])
        assert (n, a, b) == (2, 701, 1114)  # float8 (fare), timestamp (pickup_time)
        assert b"city\0" in out[2][1] and b"n\0" in out[2][1]
        assert calls == [] and spent(wire) == before
        # Flush answers without Sync (asyncpg and pg8000 rely on it)
        client.send(message(b"B", b"\0s1\0\0\0\0\x02" + struct.pack("!i", 2) + b"10"
                            + struct.pack("!i", 10) + b"2026-02-01\0\0")
                    + message(b"D", b"P\0") + message(b"E", b"\0" + struct.pack("!i", 2))
                    + message(b"H"))
        kinds = _frames(client, until=b"s")  # rows come in pages of 2: PortalSuspended
        assert kinds[:3] == [b"2", b"T", b"N"] and kinds.count(b"D") == 2
        client.send(message(b"E", b"\0" + struct.pack("!i", 0)) + message(b"S"))
        kinds = _frames(client)
        assert kinds.count(b"D") == 3 and kinds[-2:] == [b"C", b"Z"]
        # an error skips everything up to Sync, then the connection works again
        client.send(message(b"P", b"\0SELECT * FROM trips\0\0\0")
                    + message(b"B", b"\0\0" + b"\0" * 6) + message(b"D", b"P\0")
                    + message(b"E", b"\0\0\0\0\0") + message(b"S"))
        out = client.read_until_ready()
        kinds = [k for k, _ in out]
        assert b"E" in kinds and kinds[-1] == b"Z" and kinds.count(b"E") == 1
        # several statements in one simple query, and an empty one
        client.send(message(b"Q", b"SET chorus.epsilon = 0.5; SHOW chorus.epsilon; ;\0"))
        out = client.read_until_ready()
        assert [k for k, _ in out] == [b"C", b"T", b"D", b"C", b"Z"]
        client.send(message(b"Q", b"  \0"))
        assert [k for k, _ in client.read_until_ready()] == [b"I", b"Z"]
        client.send(message(b"Q", b"COPY trips TO STDOUT\0"))
        out = client.read_until_ready()
        assert error_fields(out[0][1])["C"] == "42501"
        client.send(message(b"X"))
    finally:
        client.close()


def test_budget_exhausted(duckdb_data: str, write_policy: Callable[..., Path]) -> None:
    with start_wire(write_policy(duckdb_data, epsilon_per_block=2.0, max_epsilon=1.0)) as wire, \
            psycopg.connect(wire.url(), autocommit=True) as con:
        sql = "SELECT COUNT(*) FROM trips WHERE pickup_time < '2026-01-02'"
        con.execute(sql)
        con.execute(sql)
        with pytest.raises(psycopg.Error) as info:
            con.execute(sql)
        assert info.value.sqlstate == "53400"
        assert con.execute("SELECT COUNT(*) FROM trips WHERE pickup_time >= '2026-03-01'"
                           ).fetchone()[0] is not None


def test_wait_seconds_setting_reaches_the_scheduler(duckdb_data: str,
                                                    write_policy: Callable[..., Path]) -> None:
    """SET chorus.wait_seconds: a claim that does not fit yet waits that long, then is refused.

    DPF-N with n = 4: each arrival unlocks a quarter of a block's budget (2.5 of 10), so a
    query asking for epsilon 8 cannot be granted after one or two arrivals; with no wait it is
    refused at once, with chorus.wait_seconds = 1.5 after about 1.5 s, naming the wait.
    """
    policy = write_policy(duckdb_data, epsilon_per_block=10.0, max_epsilon=8.0)
    policy.write_text(policy.read_text().replace(
        'noise = "sql"', 'noise = "sql"\nscheduler = { policy = "dpf-n", n = 4, '
        'wait_seconds = 0, max_wait_seconds = 2 }'))
    with start_wire(policy) as wire, psycopg.connect(wire.url(), autocommit=True) as con:
        sql = "SELECT COUNT(*) FROM trips WHERE pickup_time < '2026-01-02'"
        assert con.execute("SHOW chorus.wait_seconds").fetchone() == ("0",)
        con.execute("SET chorus.epsilon = 8")
        started = time.monotonic()
        with pytest.raises(psycopg.Error) as info:
            con.execute(sql)
        assert info.value.sqlstate == "53400" and time.monotonic() - started < 1.4
        assert "wait time" not in str(info.value)
        con.execute("SET chorus.wait_seconds = 1.5")
        assert con.execute("SHOW chorus.wait_seconds").fetchone() == ("1.5",)
        started = time.monotonic()
        with pytest.raises(psycopg.Error) as info:
            con.execute(sql)
        # The deadline is the ledger's wall clock at the claim's arrival + 1.5 s; the client's
        # monotonic clock may read a few ms less (seen once: 1.49 s).  Without the wait it is
        # refused at once (< 1.4 s above).
        assert info.value.sqlstate == "53400" and time.monotonic() - started >= 1.45
        assert "wait time of 1.5 s" in str(info.value)
        for bad in ("-1", "3", "'soon'"):  # negative, above max_wait_seconds, not a number
            with pytest.raises(psycopg.Error) as info:
                con.execute(f"SET chorus.wait_seconds = {bad}")
            assert info.value.sqlstate == "22023", bad
        con.execute("RESET chorus.wait_seconds")
        assert con.execute("SHOW chorus.wait_seconds").fetchone() == ("0",)
        # Both claims were refused (and recorded as such): nothing was allocated or spent.
        assert all(b.epsilon_allocated == 0 == b.epsilon_consumed
                   for b in wire.engine.ledger.blocks())
        assert {c.state for c in wire.engine.ledger.claims()} == {"refused"}
