"""The durable ledgers (SQLite, Postgres): restart, crash (SIGKILL) and multi-process races."""

from __future__ import annotations

import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from budget.accounting import RenyiAccountant
from budget.ledger import Ledger, LedgerMismatch, replay
from budget.scheduler import SchedulerSettings
from budget.store import PostgresStore, SQLiteStore, Store
from chorus_py.errors import BudgetExhausted

ROOT = Path(__file__).resolve().parents[2]
EIGHTH = 0.125


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.sqlite3'}"


def open_store(url: str) -> Store:
    if url.startswith("sqlite:///"):
        return SQLiteStore(url.removeprefix("sqlite:///"))
    return PostgresStore(url)


def open_ledger(url: str, **kw: object) -> Ledger:
    return Ledger(1.0, 0.0, store=open_store(url), **kw)  # type: ignore[arg-type]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return sqlite_url(tmp_path)
    return request.getfixturevalue("pg_ledger_url")


def check_consistent(led: Ledger) -> None:
    """Invariant, claims add up to the block fields, journal replays to the stored state."""
    claims = led.claims()
    rebuilt = replay(led.history())
    for b in led.blocks():
        assert math.isclose(b.global_[0], b.locked[0] + b.unlocked[0] + b.allocated[0]
                            + b.consumed[0], abs_tol=1e-12)
        mine = [c for c in claims if b.block_id in c.blocks]
        for state, value in (("allocated", b.epsilon_allocated), ("consumed", b.epsilon_consumed)):
            assert math.isclose(value, math.fsum(c.demand[0] for c in mine if c.state == state),
                                abs_tol=1e-12), (state, b)
        r = rebuilt[b.block_id]
        assert (tuple(r.unlocked), tuple(r.allocated), tuple(r.consumed)) == (
            b.unlocked, b.allocated, b.consumed)


def worker(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.budget.ledger_worker", *args],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def read_until(proc: subprocess.Popen[str], prefix: str, timeout: float = 30.0) -> list[str]:
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            err = proc.stderr.read() if proc.stderr else ""
            raise AssertionError(f"worker ended: {lines} {err}")
        lines.append(line.strip())
        if line.startswith(prefix):
            return lines
    raise AssertionError(f"no {prefix} line within {timeout} s: {lines}")


def kill(proc: subprocess.Popen[str]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


# -- restart -------------------------------------------------------------------------------------
def test_restart_restores_the_exact_state(store_url: str) -> None:
    led = open_ledger(store_url, scheduler=SchedulerSettings("dpf-n", n=4))
    led.ensure_blocks(["a", "b"])
    consumed = led.claim("x", ["a", "b"], EIGHTH, 0.0)
    led.consume(consumed)
    released = led.claim("x", ["a"], EIGHTH, 0.0)
    led.release(released)
    held = led.claim("y", ["b"], EIGHTH, 0.0)
    before, claims, history = led.blocks(), led.claims(), led.history()
    led.close()
    again = open_ledger(store_url, scheduler=SchedulerSettings("dpf-n", n=4))
    assert again.blocks() == before
    assert again.claims() == claims
    assert again.history() == history
    again.consume(held)  # the claim made before the restart settles after it
    assert [b.epsilon_consumed for b in again.blocks()] == [EIGHTH, 2 * EIGHTH]
    check_consistent(again)
    again.close()


def test_a_ledger_refuses_other_accounting_units(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    open_ledger(url).close()
    with pytest.raises(LedgerMismatch, match="accounting = basic"):
        Ledger(1.0, 1e-6, store=open_store(url), accountant=RenyiAccountant())


def test_journal_cannot_be_rewritten(tmp_path: Path) -> None:
    import sqlite3

    url = sqlite_url(tmp_path)
    led = open_ledger(url)
    led.ensure_blocks(["a"])
    led.close()
    con = sqlite3.connect(url.removeprefix("sqlite:///"))
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        con.execute("DELETE FROM ledger_journal")
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        con.execute("UPDATE ledger_journal SET event = 'x'")
    con.close()


# -- crash -------------------------------------------------------------------------------------
@pytest.mark.parametrize("commit_number", [6, 7], ids=["in-claim", "in-consume"])
def test_sigkill_inside_a_commit_loses_and_doubles_nothing(tmp_path: Path,
                                                           commit_number: int) -> None:
    # Commits of the worker: 1 ensure_blocks, then claim (2, 4, 6, ...) and consume (3, 5, 7, ...)
    # in turn: 6 freezes inside the 3rd claim, 7 inside its consume.
    url = sqlite_url(tmp_path)
    proc = worker("crash", url, str(commit_number))
    lines = read_until(proc, "IN_COMMIT")
    kill(proc)
    reported = [int(x.split()[1]) for x in lines if x.startswith("CONSUMED")]
    assert reported  # the worker got somewhere before freezing
    led = open_ledger(url)  # recovery runs on open
    claims = {c.claim_id: c for c in led.claims()}
    for claim_id in reported:
        assert claims[claim_id].state == "consumed"  # nothing lost
    # The frozen transaction left no trace (a claim) or was settled by recovery (a consume):
    # either way every claim is closed and charged exactly once.
    assert all(c.state in ("consumed", "refused") for c in claims.values())
    n = sum(c.state == "consumed" for c in claims.values())
    assert n in (len(reported), len(reported) + 1)
    for b in led.blocks():
        assert b.epsilon_consumed == pytest.approx(0.01 * n)
        assert b.epsilon_allocated == 0.0
    check_consistent(led)
    assert led.recover() == []  # idempotent


def test_allocated_claim_of_a_killed_process_is_charged_once(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    proc = worker("hold", url, "allocated")
    (line,) = read_until(proc, "ALLOCATED")
    claim_id = int(line.split()[1])
    kill(proc)
    led = open_ledger(url)
    (claim,) = led.claims()
    assert (claim.claim_id, claim.state) == (claim_id, "consumed")
    assert led.history()[-1]["data"]["recovered"]
    assert [b.epsilon_consumed for b in led.blocks()] == [0.25] * 3
    check_consistent(led)
    led.close()
    again = open_ledger(url)  # a second restart changes nothing
    assert [b.epsilon_consumed for b in again.blocks()] == [0.25] * 3


def test_waiting_claim_of_a_killed_process_is_dropped(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    mine = open_ledger(url)
    mine.ensure_blocks(["a", "b", "c"])
    holding = mine.claim("me", ["a"], 0.5, 0.0)
    proc = worker("hold", url, "waiting")
    read_until(proc, "WAITING")
    kill(proc)
    other = open_ledger(url)  # recovers the dead worker's claim, never this process's own
    states = {c.analyst: c.state for c in other.claims()}
    assert states == {"me": "allocated", "hold": "refused"}
    mine.consume(holding)
    check_consistent(other)


# -- concurrency -------------------------------------------------------------------------------
def race(url: str, tmp_path: Path, prepare: Callable[[Ledger], None]) -> tuple[int, Ledger]:
    led = open_ledger(url)
    prepare(led)
    go = tmp_path / "go"
    procs = [worker("race", url, "16", str(2.0**-7), str(go)) for _ in range(2)]
    time.sleep(1.5)  # let both import and open the ledger
    go.touch()
    wins = 0
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        result = json.loads(out.strip().splitlines()[-1])
        assert result["errors"] == []
        wins += result["wins"]
    return wins, led


def test_two_processes_of_16_threads_never_overspend(store_url: str, tmp_path: Path) -> None:
    def nearly_exhausted(led: Ledger) -> None:
        led.ensure_blocks(["day"])
        led.consume(led.claim("setup", ["day"], 0.875, 0.0))  # 1/8 = 16 claims of 2^-7 left

    wins, led = race(store_url, tmp_path, nearly_exhausted)
    (day,) = led.blocks()
    assert wins == 16  # dyadic amounts: exactly the budget that was left, no more, no less
    assert day.epsilon_consumed == 1.0 and day.epsilon_allocated == 0.0
    assert day.state == "retired"
    states = [c.state for c in led.claims()]
    assert states.count("consumed") == 17 and set(states) == {"consumed", "refused"}
    check_consistent(led)
    with pytest.raises(BudgetExhausted, match="day"):
        led.claim("late", ["day"], 2.0**-7, 0.0)


def test_a_locked_ledger_is_a_clear_error_and_spends_nothing(tmp_path: Path) -> None:
    import sqlite3

    from budget.store import LedgerUnavailable

    url = sqlite_url(tmp_path)
    led = Ledger(1.0, 0.0, store=SQLiteStore(url.removeprefix("sqlite:///"),
                                              busy_timeout_seconds=0.1))
    led.ensure_blocks(["a"])
    blocker = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    with pytest.raises(LedgerUnavailable, match=r"unavailable .* nothing was spent") as info:
        led.claim("x", ["a"], 0.5, 0.0)
    assert info.value.sqlstate == "08006"
    blocker.execute("ROLLBACK")
    assert led.claims() == [] and led.blocks()[0].epsilon_allocated == 0.0


@pytest.mark.postgres
def test_postgres_journal_is_append_only_and_sqlalchemy_urls_work(pg_ledger_url: str) -> None:
    url = pg_ledger_url.replace("postgresql://", "postgresql+psycopg://", 1)
    led = Ledger(1.0, 0.0, store=PostgresStore(url))
    led.ensure_blocks(["a"])
    led.close()
    with psycopg.connect(pg_ledger_url, autocommit=True) as con:
        for sql in ("DELETE FROM chorus_ledger_journal",
                    "UPDATE chorus_ledger_journal SET event = 'x'",
                    "TRUNCATE chorus_ledger_journal"):
            with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
                con.execute(sql)
    again = open_ledger(pg_ledger_url)  # the schema (trigger included) is created only once
    assert [r["event"] for r in again.history()] == ["block_created"]
    again.close()


def test_a_claim_reads_and_writes_only_its_blocks(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from budget.store import _SQLTx

    led = open_ledger(sqlite_url(tmp_path))
    led.ensure_blocks([f"d{i:02d}" for i in range(90)])
    loaded: list[list[str]] = []
    written: list[str] = []
    load, changed = _SQLTx._load_blocks, _SQLTx.changed_blocks

    def spy_load(self: _SQLTx, ids: list[str]) -> object:
        loaded.append(list(ids))
        return load(self, ids)

    def spy_changed(self: _SQLTx) -> list:  # type: ignore[type-arg]
        out = changed(self)
        written.extend(b.block_id for b in out)
        return out

    def no_scan(self: _SQLTx) -> None:
        raise AssertionError("a claim must not read every block")

    monkeypatch.setattr(_SQLTx, "_load_blocks", spy_load)
    monkeypatch.setattr(_SQLTx, "changed_blocks", spy_changed)
    monkeypatch.setattr(_SQLTx, "_load_all_blocks", no_scan)
    led.consume(led.claim("x", ["d03", "d04"], EIGHTH, 0.0))
    assert {b for ids in loaded for b in ids} == {"d03", "d04"}
    assert set(written) == {"d03", "d04"}
    monkeypatch.undo()
    check_consistent(led)
    led.close()


# -- the blocks a store keeps between its transactions --------------------------------------------
def test_cached_blocks_see_every_other_ledgers_commit(store_url: str) -> None:
    """Two ledgers on one database (two proxies): each one's cached blocks are dropped as soon
    as the other commits, so neither can grant what the other already spent."""
    a, b = open_ledger(store_url), open_ledger(store_url)
    a.ensure_blocks(["d1", "d2"])
    for _ in range(3):  # 3 x 1/8 through a: a's cache holds the blocks after each commit
        a.claim("x", ["d1", "d2"], EIGHTH, 0.0, consume_on_grant=True)
    for _ in range(4):  # 4 x 1/8 through b, which a has not seen
        b.claim("x", ["d1", "d2"], EIGHTH, 0.0, consume_on_grant=True)
    last = a.claim("x", ["d1"], EIGHTH, 0.0, consume_on_grant=True)  # 8/8 in all on d1
    assert [round(x.epsilon_spent, 9) for x in last.after] == [1.0]
    with pytest.raises(BudgetExhausted):
        a.claim("x", ["d1"], EIGHTH, 0.0, consume_on_grant=True)
    with pytest.raises(BudgetExhausted):
        b.claim("x", ["d1", "d2"], EIGHTH, 0.0, consume_on_grant=True)
    assert [round(x.epsilon_spent, 9) for x in b.blocks(["d1", "d2"])] == [1.0, 0.875]
    check_consistent(a)
    a.close()
    b.close()


def test_a_rolled_back_transaction_leaves_no_trace_in_cached_blocks(tmp_path: Path) -> None:
    led = open_ledger(sqlite_url(tmp_path))
    led.ensure_blocks(["d1"])
    led.claim("x", ["d1"], EIGHTH, 0.0, consume_on_grant=True)  # d1 is now cached
    store = led.store
    assert isinstance(store, SQLiteStore)

    def fail() -> None:
        raise OSError("disk full")

    store.before_commit = fail  # the transaction's writes are made, then rolled back
    with pytest.raises(OSError):
        led.claim("x", ["d1"], EIGHTH, 0.0, consume_on_grant=True)
    store.before_commit = None
    # The failed claim changed d1 in memory before rolling back: that copy must be gone.
    after = led.claim("x", ["d1"], EIGHTH, 0.0, consume_on_grant=True)
    assert [round(x.epsilon_spent, 9) for x in after.after] == [0.25]
    assert [round(x.epsilon_spent, 9) for x in led.blocks(["d1"])] == [0.25]
    check_consistent(led)
    led.close()


@pytest.mark.postgres
def test_a_write_connection_the_server_closed_is_replaced(pg_ledger_url: str) -> None:
    """Write transactions share one kept connection; if Postgres drops it between two of them
    (a restart, an idle timeout), the next transaction runs on a new one."""
    led = open_ledger(pg_ledger_url)
    led.ensure_blocks(["d"])
    led.claim("x", ["d"], EIGHTH, 0.0, consume_on_grant=True)
    store = led.store
    assert isinstance(store, PostgresStore) and store._writer is not None
    pid = store._writer.connection.dbapi_connection.info.backend_pid  # type: ignore[union-attr]
    with psycopg.connect(pg_ledger_url, autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
    after = led.claim("x", ["d"], EIGHTH, 0.0, consume_on_grant=True)
    assert [round(b.epsilon_spent, 9) for b in after.after] == [0.25]
    assert store._writer.connection.dbapi_connection.info.backend_pid != pid  # type: ignore
    check_consistent(led)
    led.close()


def test_two_processes_on_a_sqlite_ledger_take_turns(tmp_path: Path) -> None:
    """Processes sharing a SQLite ledger (``chorus serve --workers``) queue on a file lock:
    with SQLite's busy handler alone, the process that waited slept while the other took the
    write lock again and again (one process won all 500 claims in 2 of 5 runs)."""
    url = sqlite_url(tmp_path)
    led = open_ledger(url)
    led.ensure_blocks(["day"])
    go = tmp_path / "go"
    procs = [worker("race", url, "4", str(2.0**-9), str(go)) for _ in range(2)]
    for proc in procs:  # both have opened the ledger (a loaded machine imports slowly)
        read_until(proc, "READY", timeout=60)
    go.touch()
    wins = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        wins.append(json.loads(out.strip().splitlines()[-1])["wins"])
    assert sum(wins) == 512
    assert min(wins) >= 64, wins  # each at least an eighth (about half, measured)
    assert Path(f"{url.removeprefix('sqlite:///')}-lock").exists()



def test_a_new_sqlite_ledger_opens_while_another_process_writes_the_file(
        tmp_path: Path) -> None:
    """``chorus serve --workers`` starts its processes together on a ledger file that may be
    new: while one holds the write lock of a file still in rollback-journal mode, the other's
    switch to WAL needs an exclusive lock, and SQLite answers "database is locked" at once
    instead of waiting (deadlock avoidance; a worker died of it in CI). It must wait."""
    path = tmp_path / "ledger.sqlite3"
    # Another process, first to the file, in the middle of a write.
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    other.execute("CREATE TABLE early (x INTEGER)")
    release = threading.Timer(0.5, other.execute, ("COMMIT",))
    release.start()
    try:
        led = Ledger(1.0, 0.0, store=SQLiteStore(path))
        led.ensure_blocks(["day"])
        assert [b.block_id for b in led.blocks()] == ["day"]
        assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        led.close()
    finally:
        release.join()
        other.close()
