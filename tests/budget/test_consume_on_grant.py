"""Claims consumed by the transaction that grants them (``consume_on_grant``) and refunds.

The engine charges a query in one durable commit: the claim is granted and consumed together,
before the query runs, and refunded only when the database failed before reading any row.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

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
