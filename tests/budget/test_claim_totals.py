"""Claims counted and summed by the store (``Ledger.claim_totals``) and claims filtered by the
store (``Ledger.claims(analyst, states)``), on the memory, SQLite and Postgres stores: the same
numbers as the per-claim computation the dashboard and the metrics used before."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from budget.ledger import Ledger
from budget.scheduler import ClaimRecord
from budget.store import ClaimTotals, MemoryStore, PostgresStore, SQLiteStore, Store
from chorus_py.errors import BudgetExhausted
from server import metrics as views
from tests.budget.conftest import drop_pg_ledger

# Dyadic values: every sum below is exact whatever order a database adds them in.
D1, D2 = 2.0**-22, 2.0**-23


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    made: Store
    if request.param == "memory":
        made = MemoryStore()
    elif request.param == "sqlite":
        made = SQLiteStore(tmp_path / "ledger.sqlite3")
    else:
        url = request.getfixturevalue("postgres_url")
        drop_pg_ledger(url)
        made = PostgresStore(url)
    yield made
    made.close()
    if request.param == "postgres":
        drop_pg_ledger(url)


@pytest.fixture
def ledger(store: Store) -> Ledger:
    """alice: two consumed claims, one released, one refused; bob: one allocated, one consumed.

    Blocks x, y, z with epsilon 1 and delta 2**-20 each.
    """
    led = Ledger(1.0, 2.0**-20, store=store)
    led.ensure_blocks(["x", "y", "z"])
    led.consume(led.claim("alice", ["x", "y"], 0.25, D1))
    led.consume(led.claim("alice", ["y"], 0.125, D2))
    led.release(led.claim("alice", ["z"], 0.5, 0.0))
    led.claim("bob", ["z"], 0.0625, 0.0)  # stays allocated
    led.consume(led.claim("bob", ["x"], 0.5, D2))
    with pytest.raises(BudgetExhausted):
        led.claim("alice", ["x"], 0.5, 0.0)  # x has 0.25 left: refused, recorded
    return led


# Hand-computed from the fixture's claims.
EXPECTED = [
    ClaimTotals("alice", "consumed", 2, 0.375, D1 + D2),
    ClaimTotals("alice", "refused", 1, 0.5, 0.0),
    ClaimTotals("alice", "released", 1, 0.5, 0.0),
    ClaimTotals("bob", "allocated", 1, 0.0625, 0.0),
    ClaimTotals("bob", "consumed", 1, 0.5, D2),
]


def _totals_rows(totals: list[ClaimTotals]) -> list[dict[str, object]]:
    return [t._asdict() for t in totals]


def test_totals_per_analyst_and_state(ledger: Ledger) -> None:
    assert ledger.claim_totals() == EXPECTED
    assert ledger.claim_totals("bob") == EXPECTED[3:]
    assert ledger.claim_totals("nobody") == []


def test_totals_give_what_the_claims_gave(ledger: Ledger) -> None:
    claims = [views.claim_dict(c) for c in ledger.claims()]
    rows = _totals_rows(ledger.claim_totals())
    assert views.claim_states(rows) == views.claim_states(claims) == {
        "consumed": 3, "released": 1, "allocated": 1, "refused": 1}
    spending = views.analyst_spending(rows)
    assert spending == views.analyst_spending(claims)
    assert spending["alice"] == {"analyst": "alice", "queries": 2, "epsilon": 0.375,
                                 "delta": D1 + D2,
                                 "claims": {"consumed": 2, "refused": 1, "released": 1}}
    assert spending["bob"] == {"analyst": "bob", "queries": 1, "epsilon": 0.5, "delta": D2,
                               "claims": {"allocated": 1, "consumed": 1}}
    alice = views.analyst_spending(_totals_rows(ledger.claim_totals("alice")))
    assert alice == {"alice": spending["alice"]}


def test_claims_filtered_in_the_store(ledger: Ledger) -> None:
    every = ledger.claims()
    spent = ledger.claims("alice", views.SPENT_STATES)
    assert [(c.epsilon, c.blocks) for c in spent] == [(0.25, ("x", "y")), (0.125, ("y",))]
    assert spent == [c for c in every if c.analyst == "alice" and c.state == "consumed"]
    assert [c.state for c in ledger.claims("bob")] == ["allocated", "consumed"]
    assert [c.analyst for c in ledger.claims(states=["refused", "released"])] == ["alice"] * 2
    assert ledger.claims("alice", []) == []
    rows = [views.claim_dict(c) for c in spent]
    assert views.analyst_blocks(rows, "alice") == views.analyst_blocks(
        [views.claim_dict(c) for c in every], "alice") == [
        {"block": "x", "epsilon_consumed": 0.25, "delta_consumed": D1, "queries": 1},
        {"block": "y", "epsilon_consumed": 0.375, "delta_consumed": D1 + D2, "queries": 2}]


def test_a_non_finite_epsilon_counts_zero_everywhere(store: Store) -> None:
    # JSON cannot hold NaN (orjson writes null): the memory store must sum as the SQL ones do,
    # and as the per-claim view did (a non-finite number counted 0).
    with store.transaction("basic") as tx:
        for eps in (math.nan, 0.5):
            tx.add_claim(ClaimRecord(0, "carol", ("x",), (0.5,), 0.0, eps, 0.0,
                                     state="consumed"))
    assert store.claim_totals() == [ClaimTotals("carol", "consumed", 2, 0.5, 0.0)]
