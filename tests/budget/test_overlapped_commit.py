"""A query's charge commits while its statements run (``Ledger.claim_overlapped``), and nothing
of the query leaves the proxy before that commit is on disk.

The ledger decides a claim in its transaction, then commits it (an fsync on a durable store, as
long as a whole DuckDB answer): the decision is all the statements need, the commit is all the
release needs.  These tests hold or fail the commit at ``before_commit`` (the store's hook
between the transaction's writes and its commit) and check each side of that line.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from budget.ledger import InMemoryLedger, Ledger
from budget.store import SQLiteStore
from chorus_py.engine import Engine
from chorus_py.errors import BackendError, BudgetExhausted
from tests.budget.test_scheduler import check_all, fields
from tests.conftest import nothing_spent


def sqlite_ledger(tmp_path: Path) -> Ledger:
    return Ledger(1.0, 1e-6, store=SQLiteStore(tmp_path / "ledger.sqlite3"))


class DiskFull(Exception):
    """What a store's commit may raise."""


def test_the_claim_comes_back_decided_while_its_commit_is_held(tmp_path: Path) -> None:
    led = sqlite_ledger(tmp_path)
    led.ensure_blocks(["a", "b"])
    store = led.store
    assert isinstance(store, SQLiteStore)
    gate, committing = threading.Event(), threading.Event()

    def held() -> None:
        committing.set()
        assert gate.wait(10)

    store.before_commit = held
    claim, durable = led.claim_overlapped("alice", ["a", "b"], 0.25, 1e-7, views=False)
    # Back as decided: its commit runs (and is held) in the ledger's thread.
    assert committing.wait(5) and not gate.is_set()
    assert claim.state == "consumed"
    assert [b.block_id for b in claim.left] == ["a", "b"]
    assert claim.left[0].epsilon_left == pytest.approx(0.75)
    waited = threading.Event()

    def settle() -> None:
        durable()
        waited.set()

    waiter = threading.Thread(target=settle)
    waiter.start()
    time.sleep(0.2)
    assert not waited.is_set()  # durable waits for the commit
    gate.set()
    waiter.join(10)
    assert waited.is_set()
    store.before_commit = None
    assert fields(led, "a") == fields(led, "b") == (0.0, 0.75, 0.0, 0.25)
    (stored,) = led.claims()
    assert (stored.claim_id, stored.state) == (claim.claim_id, "consumed")
    led.close()
    check_all(Ledger(1.0, 1e-6, store=SQLiteStore(tmp_path / "ledger.sqlite3")))


def test_a_commit_that_fails_makes_durable_raise_and_spends_nothing(tmp_path: Path) -> None:
    led = sqlite_ledger(tmp_path)
    led.ensure_blocks(["a"])
    store = led.store
    assert isinstance(store, SQLiteStore)

    gate = threading.Event()

    def fail() -> None:
        assert gate.wait(10)  # the claim comes back before the commit fails
        raise DiskFull("disk full")

    store.before_commit = fail
    claim, durable = led.claim_overlapped("alice", ["a"], 0.25, 0.0)
    assert claim.state == "consumed"  # as decided; the commit has not succeeded
    gate.set()
    with pytest.raises(DiskFull):
        durable()
    with pytest.raises(DiskFull):  # and again: the caller may ask twice
        durable()
    store.before_commit = None
    assert fields(led, "a") == (0.0, 1.0, 0.0, 0.0)
    assert not led.claims()
    check_all(led)


def test_a_refusal_is_raised_by_the_claim_itself(tmp_path: Path) -> None:
    led = sqlite_ledger(tmp_path)
    led.ensure_blocks(["a"])
    with pytest.raises(BudgetExhausted, match="nothing was spent"):
        led.claim_overlapped("alice", ["a"], 2.0, 0.0, wait_seconds=0)
    assert fields(led, "a") == (0.0, 1.0, 0.0, 0.0)


def test_a_ledger_in_memory_commits_before_returning() -> None:
    led = InMemoryLedger(1.0, 1e-6)
    led.ensure_blocks(["a"])
    claim, durable = led.claim_overlapped("alice", ["a"], 0.5, 0.0)
    assert claim.state == "consumed" and fields(led, "a") == (0.0, 0.5, 0.0, 0.5)
    durable()


def test_under_load_the_claim_commits_in_the_callers_thread(tmp_path: Path) -> None:
    """With another claim committing, a claim joins the group commit in its own thread (no
    hand-over to the ledger's threads, which would only add CPU): it returns committed."""
    led = sqlite_ledger(tmp_path)
    led.ensure_blocks(["a"])
    store = led.store
    assert isinstance(store, SQLiteStore)
    gate = threading.Event()
    committers: list[str] = []

    def held() -> None:
        committers.append(threading.current_thread().name)
        gate.wait(10)

    store.before_commit = held
    first = threading.Thread(target=led.claim, args=("alice", ["a"], 0.1, 0.0),
                             kwargs={"consume_on_grant": True}, name="first")
    first.start()
    deadline = time.monotonic() + 5
    while not led._arrivals and time.monotonic() < deadline:
        time.sleep(0.001)
    returned: list[object] = []
    second = threading.Thread(target=lambda: returned.append(
        led.claim_overlapped("bob", ["a"], 0.1, 0.0)), name="second")
    second.start()
    time.sleep(0.2)
    assert not returned  # queued behind the held commit, not handed over and back
    gate.set()
    first.join(10)
    second.join(10)
    store.before_commit = None
    (claim, durable), = returned  # type: ignore[misc]
    assert claim.state == "consumed"
    assert committers == ["first", "second"]  # bob's transaction ran in bob's thread
    durable()
    assert fields(led, "a")[3] == pytest.approx(0.2)


def test_an_idle_ledger_decides_in_the_callers_thread_and_commits_in_its_own(
        tmp_path: Path) -> None:
    """No hand-over before the decision (the caller's thread decides), none after it (the
    commit thread finishes the transaction and releases its locks)."""
    led = sqlite_ledger(tmp_path)
    led.ensure_blocks(["a"])
    store = led.store
    assert isinstance(store, SQLiteStore)
    deciders: list[int] = []
    committers: list[int] = []
    arrive = led._arrive

    def recorded(*args: object, **kwargs: object) -> object:
        deciders.append(threading.get_ident())
        return arrive(*args, **kwargs)  # type: ignore[arg-type]

    led._arrive = recorded  # type: ignore[method-assign]
    store.before_commit = lambda: committers.append(threading.get_ident())
    _, durable = led.claim_overlapped("alice", ["a"], 0.25, 0.0)
    durable()
    store.before_commit = None
    assert deciders == [threading.get_ident()]
    assert len(committers) == 1 and committers[0] != threading.get_ident()
    # The locks were released by the commit thread: the next transaction goes on at once.
    assert led.claim("bob", ["a"], 0.25, 0.0, consume_on_grant=True).state == "consumed"
    assert fields(led, "a") == (0.0, 0.5, 0.0, 0.5)
    check_all(led)


def test_a_claim_waits_for_the_decided_ones_commit_and_never_overspends(
        tmp_path: Path) -> None:
    """Two claims for the last budget, the second arriving while the first's commit is held:
    the second is decided on the committed state (refused), never on the state before it."""
    led = sqlite_ledger(tmp_path)
    led.ensure_blocks(["a"])
    store = led.store
    assert isinstance(store, SQLiteStore)
    gate = threading.Event()
    store.before_commit = lambda: gate.wait(10) and None
    claim, durable = led.claim_overlapped("alice", ["a"], 0.75, 0.0, wait_seconds=0)
    assert claim.state == "consumed"
    outcome: list[object] = []

    def second() -> None:
        try:
            led.claim_overlapped("bob", ["a"], 0.75, 0.0, wait_seconds=0)
            outcome.append("granted")
        except BudgetExhausted as err:
            outcome.append(err)

    other = threading.Thread(target=second)
    other.start()
    time.sleep(0.2)
    assert not outcome  # queued behind the held commit
    gate.set()
    other.join(10)
    durable()
    store.before_commit = None
    assert len(outcome) == 1 and isinstance(outcome[0], BudgetExhausted)
    assert fields(led, "a") == (0.0, 0.25, 0.0, 0.75)
    check_all(led)


def test_a_decision_that_fails_releases_the_ledger(tmp_path: Path) -> None:
    """An error while deciding (in the caller's thread) rolls the transaction back there: the
    claim raises, nothing is spent, and the next claim is not blocked."""
    led = sqlite_ledger(tmp_path)
    led.ensure_blocks(["a"])

    def broken(*args: object, **kwargs: object) -> object:
        raise DiskFull("read failed")

    arrive = led._arrive
    led._arrive = broken  # type: ignore[method-assign]
    with pytest.raises(DiskFull):
        led.claim_overlapped("alice", ["a"], 0.25, 0.0)
    led._arrive = arrive  # type: ignore[method-assign]
    assert not led._arrivals and fields(led, "a") == (0.0, 1.0, 0.0, 0.0)
    _, durable = led.claim_overlapped("alice", ["a"], 0.25, 0.0)
    durable()
    assert fields(led, "a") == (0.0, 0.75, 0.0, 0.25)
    check_all(led)


# -- the engine: statements overlap the commit, the release waits for it ----------------------

@pytest.fixture
def timeline(engine: Engine, monkeypatch: pytest.MonkeyPatch
             ) -> tuple[list[str], Callable[[Callable[[], None]], None]]:
    """What happened in which order: statements sent, commits begun and ended."""
    events: list[str] = []
    run = engine.backend.run

    def logged(sql: str, *args: object, **kwargs: object) -> object:
        events.append("statement")
        return run(sql, *args, **kwargs)

    monkeypatch.setattr(engine.backend, "run", logged)
    store = engine.ledger.store
    assert isinstance(store, SQLiteStore)  # a policy file's default ledger

    def hook(during: Callable[[], None]) -> None:
        def before_commit() -> None:
            events.append("commit begins")
            during()
            events.append("commit ends")
        store.before_commit = before_commit

    yield events, hook
    store.before_commit = None


def test_the_answer_runs_during_the_commit_and_is_released_after_it(
        engine: Engine, timeline: tuple[list[str], Callable[[Callable[[], None]], None]]) -> None:
    events, hook = timeline
    sql = "SELECT COUNT(*) FROM trips"
    engine.execute(sql, epsilon=0.5, analyst="alice")  # caches and the ranked copy ready
    events.clear()
    hook(lambda: time.sleep(0.3))
    started = time.perf_counter()
    result = engine.execute(sql, epsilon=0.5, analyst="alice")
    assert time.perf_counter() - started >= 0.3  # released only once the commit ended
    assert result.report.charged and len(result.rows) == 1
    assert events.index("statement") < events.index("commit ends")  # ran during the commit


def test_an_answer_whose_charge_failed_to_commit_is_never_released(
        engine: Engine, timeline: tuple[list[str], Callable[[Callable[[], None]], None]]) -> None:
    events, hook = timeline

    def fail() -> None:  # once the answer has run: the commit fails after it
        deadline = time.monotonic() + 10
        while "statement" not in events and time.monotonic() < deadline:
            time.sleep(0.001)
        raise DiskFull("disk full")

    hook(fail)
    with pytest.raises(DiskFull):
        engine.execute("SELECT COUNT(*) FROM trips", epsilon=0.5, analyst="alice")
    assert "statement" in events  # the database answered; the answer stayed in the proxy
    assert nothing_spent(engine)


def test_a_data_error_is_shown_only_on_a_recorded_charge(
        engine: Engine, timeline: tuple[list[str], Callable[[Callable[[], None]], None]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure that may depend on the data (after a statement read rows) is an answer too:
    with the commit failing, the analyst sees the ledger's error, never the data's."""
    from chorus_py.backends import StatementFailed

    failed = threading.Event()

    def failing(sql: str, *args: object, **kwargs: object) -> object:
        failed.set()
        raise StatementFailed(True, "division by zero")

    sql = "SELECT SUM(fare) FROM trips"
    engine.execute(sql, epsilon=0.5, analyst="alice")
    monkeypatch.setattr(engine.backend, "run", failing)
    with pytest.raises(BackendError, match="charged"):  # the commit is fine: the data's error
        engine.execute(sql, epsilon=0.5, analyst="alice")
    spent = [b.epsilon_consumed for b in engine.ledger.blocks()]
    _, hook = timeline
    failed.clear()

    def fail() -> None:  # once the statement has failed: both errors are there to show
        assert failed.wait(10)
        raise DiskFull("disk full")

    hook(fail)
    with pytest.raises(DiskFull):
        engine.execute(sql, epsilon=0.5, analyst="alice")
    assert [b.epsilon_consumed for b in engine.ledger.blocks()] == spent
