"""Raising blocks to a larger epsilon_per_block (``Ledger.raise_budgets``, ``chorus budget
reconcile``): under FCFS the new budget is spendable at once, under DPF it joins the locked
budget, under Rényi accounting every order grows; a retired block reopens; budgets never shrink;
the journal replays the raised blocks exactly (SQLite, reopened)."""

from __future__ import annotations

from pathlib import Path

import pytest

from budget.accounting import accountant_for
from budget.ledger import InMemoryLedger, Ledger, replay
from budget.scheduler import SchedulerSettings
from budget.store import SQLiteStore
from chorus_py.errors import BudgetExhausted


def test_fcfs_raise_makes_the_budget_spendable_and_reopens_a_spent_block() -> None:
    led = InMemoryLedger(1.0, 0.0)
    led.ensure_blocks(["a", "b"])
    led.consume(led.claim("alice", ["a"], 1.0, 0.0))
    assert led.blocks()[0].state == "retired"
    with pytest.raises(BudgetExhausted):
        led.claim("alice", ["a"], 0.5, 0.0)
    assert led.raise_budgets(3.0, 0.0) == ["a", "b"]
    a, b = led.blocks()
    assert (a.epsilon_capacity, a.epsilon_unlocked, a.epsilon_consumed) == (3.0, 2.0, 1.0)
    assert a.state == "active" and b.epsilon_unlocked == 3.0
    led.consume(led.claim("alice", ["a"], 2.0, 0.0))  # the whole new budget, no more
    assert led.raise_budgets(3.0, 0.0) == []  # already there: nothing, nothing journaled
    assert led.raise_budgets(2.0, 0.0) == []  # budgets never shrink
    events = [r["event"] for r in led.history()]
    assert events.count("block_budget_raised") == 2 and "block_reopened" in events
    with pytest.raises(ValueError):
        led.raise_budgets(float("nan"), 0.0)


def test_dpf_raise_goes_to_the_locked_budget() -> None:
    led = InMemoryLedger(1.0, 0.0, scheduler=SchedulerSettings("dpf-n", n=4))
    led.ensure_blocks(["a"])
    led.raise_budgets(2.0, 0.0)
    (a,) = led.blocks()
    assert (a.epsilon_capacity, a.epsilon_locked, a.epsilon_unlocked) == (2.0, 2.0, 0.0)


def test_renyi_raise_grows_every_order_and_replays_exactly(tmp_path: Path) -> None:
    def open_() -> Ledger:
        return Ledger(1.0, 1e-6, store=SQLiteStore(tmp_path / "l.sqlite3"),
                      accountant=accountant_for("renyi", 0.5))

    led = open_()
    led.ensure_blocks(["a", "b"])
    led.consume(led.claim("alice", ["a", "b"], 0.3, 1e-8))
    before = {b.block_id: list(b.global_) for b in led.blocks()}
    assert led.raise_budgets(2.0, 1e-5) == ["a", "b"]
    led.close()
    led = open_()  # read back from the file: rows and journal agree
    for view in led.blocks():
        assert all(new >= old for new, old in zip(view.global_, before[view.block_id],
                                                    strict=True))
        assert max(view.global_) > max(before[view.block_id])
        assert (view.epsilon_global, view.delta_global) == (2.0, 1e-5)
        rebuilt = replay(led.history())[view.block_id]
        assert (rebuilt.global_, rebuilt.unlocked, rebuilt.consumed, rebuilt.delta_pool) == (
            list(view.global_), list(view.unlocked), list(view.consumed), view.delta_pool)
    # Lowering delta while raising epsilon would shrink some orders: left alone.
    assert led.raise_budgets(3.0, 1e-6) == []
    led.close()
