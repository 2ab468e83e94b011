"""Claims consumed by the transaction that grants them (``consume_on_grant``) and refunds.

The engine charges a query in one durable commit: the claim is granted and consumed together,
before the query runs, and refunded only when the database failed before reading any row.
"""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import pytest

from budget.accounting import RenyiAccountant
from budget.ledger import InMemoryLedger, Ledger, replay
from budget.store import SQLiteStore
from tests.budget.test_scheduler import check_all, dpf_n, fields


def sqlite_ledger(tmp_path: Path) -> Ledger:
    return Ledger(1.0, 1e-6, store=SQLiteStore(tmp_path / "ledger.sqlite3"))


@pytest.mark.parametrize("make", [lambda p: InMemoryLedger(1.0, 1e-6), sqlite_ledger],
                         ids=["memory", "sqlite"])
def test_a_claim_consumed_on_grant_is_charged_in_one_transaction(make, tmp_path: Path) -> None:
    led = make(tmp_path)
    led.ensure_blocks(["a", "b"])
    before = len(led.history())
    claim = led.claim("alice", ["a", "b"], 0.25, 1e-7, consume_on_grant=True)
    assert claim.state == "consumed"
    # unlocked 1 - 0.25, nothing allocated, 0.25 consumed, on both blocks
    assert fields(led, "a") == fields(led, "b") == (0.0, 0.75, 0.0, 0.25)
    events = [row["event"] for row in led.history()[before:]]
    assert events == ["claim_arrived", "claim_granted", "claim_consumed"]
    # The views returned with the claim are what the ledger shows now.
    assert [b.block_id for b in claim.after] == ["a", "b"]
    assert claim.after == tuple(led.remaining(["a", "b"]))
    assert math.isclose(claim.after[0].epsilon_left, 0.75)
    (stored,) = led.claims()
    assert stored.state == "consumed"
    check_all(led)


def test_refund_gives_everything_back_and_replays() -> None:
    led = InMemoryLedger(1.0, 1e-6)
    led.ensure_blocks(["a"])
    claim = led.claim("alice", ["a"], 0.4, 2e-7, consume_on_grant=True)
    led.refund(claim)
    assert claim.state == "released"
    assert fields(led, "a") == (0.0, 1.0, 0.0, 0.0)
    (b,) = led.blocks(["a"])
    assert (b.delta_allocated, b.delta_consumed) == (0.0, 0.0)
    assert b.by_analyst.get("alice", 0.0) == 0.0
    assert led.history()[-1]["event"] == "claim_refunded"
    check_all(led)


def test_only_a_claim_consumed_on_grant_can_be_refunded() -> None:
    led = InMemoryLedger(1.0, 0.0)
    led.ensure_blocks(["a"])
    plain = led.claim("alice", ["a"], 0.1, 0.0)
    with pytest.raises(ValueError, match="only a claim consumed on grant"):
        led.refund(plain)
    led.consume(plain)
    with pytest.raises(ValueError, match="only a claim consumed on grant"):
        led.refund(plain)  # consumed after the query ran: never refundable
    charged = led.claim("alice", ["a"], 0.1, 0.0, consume_on_grant=True)
    led.refund(charged)
    with pytest.raises(ValueError):
        led.refund(charged)  # twice
    assert fields(led, "a")[3] == pytest.approx(0.1)
    check_all(led)


def test_a_refund_reopens_the_block_its_charge_retired() -> None:
    led = InMemoryLedger(1.0, 0.0)
    led.ensure_blocks(["a"])
    claim = led.claim("alice", ["a"], 1.0, 0.0, consume_on_grant=True)
    (b,) = led.blocks(["a"])
    assert b.state == "retired"
    led.refund(claim)
    (b,) = led.blocks(["a"])
    assert b.state == "active" and math.isclose(b.epsilon_left, 1.0)
    assert [r["event"] for r in led.history()[-2:]] == ["claim_refunded", "block_reopened"]
    assert not replay(led.history())["a"].retired
    led.claim("bob", ["a"], 1.0, 0.0, consume_on_grant=True)  # the budget is usable again
    check_all(led)


def test_a_waiting_claim_is_consumed_when_another_pass_grants_it() -> None:
    """DPF-N: the claim waits for unlocked budget; the pass that grants it consumes it."""
    led = dpf_n(2)
    led.ensure_blocks(["a"])
    waiting = led.submit("alice", ["a"], 0.8, 0.0, wait_seconds=60, consume_on_grant=True)
    assert waiting.state == "waiting"  # one arrival unlocked 1/2 only
    led.submit("bob", ["a"], 0.1, 0.0, wait_seconds=60)  # the 2nd arrival unlocks the rest
    assert led.poll(waiting).state == "consumed"
    # bob's claim was granted first (smaller share) but only allocated: 0.1 allocated,
    # alice's 0.8 consumed, 0.1 still unlocked.
    locked, unlocked, allocated, consumed = fields(led, "a")
    assert (locked, allocated, consumed) == (0.0, pytest.approx(0.1), pytest.approx(0.8))
    assert unlocked == pytest.approx(0.1)
    check_all(led)


@pytest.mark.parametrize("bad", [None, 5], ids=["all-good", "one-bad"])
def test_concurrent_claims_share_a_commit_and_a_bad_one_fails_alone(tmp_path: Path,
                                                                    bad: int | None) -> None:
    """Group commit: claims arriving during a transaction ride in the next one together.

    The first commit is held until the 7 other threads have queued behind it: they then share
    one commit.  With a claim naming an unknown block in the queue, it alone fails and the
    batch it was in is replayed claim by claim.
    """
    led = sqlite_ledger(tmp_path)
    led.ensure_blocks(["a", "b"])
    commits = []
    gate = threading.Event()

    def slow_commit() -> None:
        commits.append(1)
        gate.wait(5)  # hold the first transaction until everyone has queued
    store = led.store
    assert isinstance(store, SQLiteStore)
    store.before_commit = slow_commit
    results: dict[int, object] = {}

    def claim(i: int) -> None:
        try:
            blocks = ["nope"] if i == bad else ["a", "b"]
            results[i] = led.claim(f"analyst{i}", blocks, 0.1, 0.0, consume_on_grant=True)
        except Exception as err:
            results[i] = err

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 5
    while len(led._arrivals) < 8 and time.monotonic() < deadline:
        time.sleep(0.01)
    gate.set()
    for t in threads:
        t.join(10)
    store.before_commit = None
    good = [i for i in range(8) if i != bad]
    assert all(results[i].state == "consumed" for i in good)  # type: ignore[attr-defined]
    spent = 0.1 * len(good)
    assert math.isclose(fields(led, "a")[3], spent) and math.isclose(fields(led, "b")[3], spent)
    if bad is None:
        assert len(commits) == 2  # the first claim, then the 7 queued behind it together
    else:
        assert isinstance(results[bad], KeyError)
        assert len(commits) == 1 + 6  # the batch rolled back; its 6 good claims alone
    assert len({results[i].claim_id for i in good}) == len(good)  # type: ignore[attr-defined]
    check_all(led)


def test_batched_claims_decide_exactly_as_alone() -> None:
    """The last budget goes to the earliest arrival of a batch; the next is refused."""
    led = InMemoryLedger(1.0, 0.0)
    led.ensure_blocks(["a"])
    results: list[object] = []

    def claim(eps: float) -> None:
        try:
            results.append(led.claim("alice", ["a"], eps, 0.0, consume_on_grant=True).epsilon)
        except Exception as err:
            results.append(type(err).__name__)

    threads = [threading.Thread(target=claim, args=(0.3,)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(map(str, results)) == ["0.3"] * 3 + ["BudgetExhausted"] * 3
    check_all(led)


def test_left_gives_the_same_guarantees_as_the_views() -> None:
    for accounting in ("basic", "renyi"):
        led = InMemoryLedger(1.0, 1e-6, **({"accountant": RenyiAccountant()}
                                            if accounting == "renyi" else {}))
        led.ensure_blocks(["a", "b"])
        led.claim("x", ["a"], 0.25, 1e-8, consume_on_grant=True)
        full = led.claim("x", ["a", "b"], 0.25, 1e-8, consume_on_grant=True)
        light = led.claim("x", ["b", "a"], 0.25, 1e-8, consume_on_grant=True, views=False)
        assert full.left == () and light.after == ()
        views = {b.block_id: b for b in led.remaining(["a", "b"])}
        assert [x.block_id for x in light.left] == ["b", "a"]
        for x in light.left:
            v = views[x.block_id]
            assert x == (v.block_id, v.state, v.epsilon_left, v.delta_left, v.epsilon_spent,
                         v.delta_spent)
        if accounting == "basic":  # by hand: a has 3 x 1/4 spent, b 2 x 1/4
            assert [round(x.epsilon_left, 12) for x in light.left] == [0.5, 0.25]


def test_no_views_charges_the_same_and_brings_nothing_back() -> None:
    led = InMemoryLedger(1.0, 1e-6)
    led.ensure_blocks(["a", "b"])
    bare = led.claim("x", ["a", "b"], 0.25, 1e-8, consume_on_grant=True, views=None)
    assert bare.state == "consumed" and bare.after == () and bare.left == ()
    light = led.claim("x", ["a", "b"], 0.25, 1e-8, consume_on_grant=True, views=False)
    # By hand: two claims of 1/4 each on both blocks.
    assert [round(x.epsilon_left, 12) for x in light.left] == [0.5, 0.5]
    assert [round(x.delta_spent, 20) for x in light.left] == [2e-8, 2e-8]
    check_all(led)

