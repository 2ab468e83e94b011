"""Wall 8, bounded cost: every front door applies the statement timeout, and cancel reaches every
engine that runs a statement (the backend, and the wire server's fake catalog).

The slow statement is an allowed one: a cross join of the public table (5 rows, 16 times: 1.5e11
rows), which the analyser accepts and the database must grind through.  A stopped statement
fails with a clear error naming the timeout, and the front door answers the next query.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from chorus_py.backends import StatementFailed
from chorus_py.clients import dbapi
from chorus_py.engine import Engine
from chorus_py.errors import OperationalError, StatementCanceled
from chorus_py.policy import load_policy
from server.pgwire.server import Limits
from tests.rest.harness import ALICE_TOKEN, policy_with_tokens, serve_engine
from tests.server.conftest import start_wire

SLOW = "SELECT COUNT(*) FROM " + ", ".join(f"cities c{i}" for i in range(16))
QUICK = "SELECT COUNT(*) FROM cities"
CHORUS = Path(sys.executable).parent / "chorus"
# Generous: two CPUs shared by parallel test runs; without the timeout these take minutes.
STOPPED_WITHIN = 8.0


def _timed(path: Path, url: str) -> Path:
    """The policy at ``path`` with a 1 s backend statement timeout."""
    path.write_text(path.read_text().replace(
        f'url = "{url}"', f'url = "{url}"\nstatement_timeout_seconds = 1', 1))
    return path


@pytest.fixture(params=["duckdb", pytest.param("postgres", marks=pytest.mark.postgres)])
def timed(request: pytest.FixtureRequest, write_policy: Callable[..., Path]) -> tuple[str, Path]:
    """(backend, policy with a 1 s statement timeout), once per backend."""
    url = request.getfixturevalue(f"{request.param}_data")
    return request.param, _timed(write_policy(url), url)


def test_the_backend_stops_a_slow_statement(timed: tuple[str, Path]) -> None:
    kind, policy = timed
    slow = ("SELECT pg_sleep(60)" if kind == "postgres"
            else "SELECT COUNT(*) FROM range(100000000000) t(i) WHERE i % 7 = 3")
    with Engine(load_policy(policy)) as engine:
        for run in (engine.backend.run, engine.backend.run_public):
            started = time.monotonic()
            with pytest.raises(StatementFailed) as info:
                run(slow)
            assert time.monotonic() - started < STOPPED_WITHIN
            assert info.value.cancelled == "statement timeout" and info.value.touched_data
        assert engine.backend.run(QUICK).rows == [(5,)]


def test_the_engine_and_the_dbapi_stop_a_slow_statement(timed: tuple[str, Path]) -> None:
    _, policy = timed
    with Engine(load_policy(policy)) as engine:
        started = time.monotonic()
        with pytest.raises(StatementCanceled, match="statement timeout"):
            engine.execute(SLOW, analyst="alice")
        assert time.monotonic() - started < STOPPED_WITHIN
        with dbapi.connect(engine=engine, analyst="alice") as con:
            cur = con.cursor()
            started = time.monotonic()
            with pytest.raises(OperationalError, match="statement timeout") as info:
                cur.execute(SLOW)
            assert time.monotonic() - started < STOPPED_WITHIN
            assert info.value.sqlstate == "57014"
            cur.execute(QUICK)
            assert cur.fetchall() == [(5,)]


def test_rest_stops_a_slow_statement(timed: tuple[str, Path], tmp_path: Path,
                                     request: pytest.FixtureRequest) -> None:
    kind, _ = timed
    url = request.getfixturevalue(f"{kind}_data")
    policy = tmp_path / "rest.toml"
    policy.write_text(policy_with_tokens(url))
    with Engine(load_policy(_timed(policy, url))) as engine, serve_engine(engine) as server, \
            server.client(ALICE_TOKEN) as client:
        started = time.monotonic()
        slow = client.post("/v1/query", json={"sql": SLOW})
        assert time.monotonic() - started < STOPPED_WITHIN
        assert slow.status_code == 504 and "statement timeout" in slow.text
        quick = client.post("/v1/query", json={"sql": QUICK})
        assert quick.status_code == 200 and quick.json()["rows"] == [[5]]


def test_the_cli_stops_a_slow_statement(timed: tuple[str, Path]) -> None:
    _, policy = timed
    started = time.monotonic()
    out = subprocess.run([str(CHORUS), "query", "--policy", str(policy), "--analyst", "alice",
                          SLOW], capture_output=True, text=True, timeout=120, check=False)
    # The process's own start (imports, opening the backend) is part of the time here.
    assert time.monotonic() - started < STOPPED_WITHIN + 10
    assert out.returncode != 0 and "canceling statement due to statement timeout" in out.stderr


def test_the_wire_stops_a_slow_statement(timed: tuple[str, Path]) -> None:
    kind, policy = timed
    with start_wire(policy, backend=kind) as wire, \
            psycopg.connect(wire.url(), autocommit=True) as con:
        started = time.monotonic()
        with pytest.raises(psycopg.errors.QueryCanceled, match="statement timeout"):
            con.execute(SLOW)
        assert time.monotonic() - started < STOPPED_WITHIN
        assert con.execute(QUICK).fetchone() == (5,)


# Answered by the fake catalog (no policy table): 1e12 rows of DuckDB work.
SLOW_CATALOG = ("SELECT COUNT(*) FROM generate_series(1, 1000000) a, "
                "generate_series(1, 1000000) b")


def test_the_catalog_stops_at_the_timeout_and_frees_every_worker(
        duckdb_data: str, write_policy: Callable[..., Path]) -> None:
    """As many slow catalog queries as the server has workers, all at once: each is stopped
    at the timeout, and the server answers the next query (no worker left busy)."""
    workers = Limits().workers
    with start_wire(write_policy(duckdb_data), server="statement_timeout_seconds = 1") as wire:
        errors: list[BaseException] = []

        def slow() -> None:
            try:
                with psycopg.connect(wire.url(), autocommit=True) as con:
                    con.execute(SLOW_CATALOG)
            except psycopg.Error as err:
                errors.append(err)

        started = time.monotonic()
        threads = [threading.Thread(target=slow) for _ in range(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert time.monotonic() - started < STOPPED_WITHIN + 4
        assert len(errors) == workers
        assert all(isinstance(e, psycopg.errors.QueryCanceled) and "statement timeout" in str(e)
                   for e in errors)
        with psycopg.connect(wire.url(), autocommit=True) as con:
            started = time.monotonic()
            assert con.execute("SELECT 1").fetchone() == (1,)
            assert con.execute(QUICK).fetchone() == (5,)
            assert time.monotonic() - started < 5


def test_a_cancel_request_stops_a_catalog_query(duckdb_data: str,
                                                write_policy: Callable[..., Path]) -> None:
    with start_wire(write_policy(duckdb_data)) as wire, \
            psycopg.connect(wire.url(), autocommit=True) as con:
        timer = threading.Timer(0.5, con.cancel_safe)
        timer.start()
        started = time.monotonic()
        with pytest.raises(psycopg.errors.QueryCanceled, match="user request"):
            con.execute(SLOW_CATALOG)
        timer.join()
        assert time.monotonic() - started < STOPPED_WITHIN
        assert con.execute("SELECT 1").fetchone() == (1,)
