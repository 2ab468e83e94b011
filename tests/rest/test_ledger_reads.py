"""Metrics, the dashboard and the analyst endpoint never read every claim of the ledger: they
ask the store for totals (one GROUP BY) and for one analyst's spent claims, and registering the
Prometheus collector reads nothing at all.  A busy ledger holds millions of claims."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from budget.ledger import Ledger
from budget.scheduler import ClaimRecord
from budget.store import ClaimTotals, SQLiteStore
from chorus_py.engine import Engine
from chorus_py.policy import load_policy
from server.metrics import Metrics, _LedgerCollector
from tests.rest.harness import ALICE_TOKEN, OWNER_TOKEN, policy_with_tokens, serve_engine

D = 2.0**-20  # dyadic: sums are exact in any order
DAY1, DAY2 = "trips/2026-01-01", "trips/2026-01-02"


class CountingStore(SQLiteStore):
    """A real SQLite ledger that records every claim read it is asked for."""

    def __init__(self, path: Path) -> None:
        self.reads: list[tuple[Any, ...]] = []
        super().__init__(path)

    def claims(self, analyst: str | None = None,
               states: Iterable[str] | None = None) -> list[ClaimRecord]:
        self.reads.append(("claims", analyst, None if states is None else frozenset(states)))
        return super().claims(analyst, states)

    def claim_totals(self, analyst: str | None = None) -> list[ClaimTotals]:
        self.reads.append(("claim_totals", analyst))
        return super().claim_totals(analyst)


@pytest.fixture
def engine(duckdb_data: str, tmp_path: Path) -> Iterator[Engine]:
    """alice consumed 0.25 (one block) and 0.5 (two blocks); bob consumed 0.0625 and
    released 0.125."""
    path = tmp_path / "policy.toml"
    path.write_text(policy_with_tokens(duckdb_data))
    policy = load_policy(path)
    store = CountingStore(tmp_path / "ledger.sqlite3")
    ledger = Ledger(policy.privacy.epsilon_per_block, policy.privacy.delta_per_block,
                    store=store)
    ledger.ensure_blocks([DAY1, DAY2])
    ledger.consume(ledger.claim("alice", [DAY1], 0.25, D))
    ledger.consume(ledger.claim("alice", [DAY1, DAY2], 0.5, 0.0))
    ledger.consume(ledger.claim("bob", [DAY2], 0.0625, 0.0))
    ledger.release(ledger.claim("bob", [DAY2], 0.125, 0.0))
    made = Engine(policy, ledger=ledger)
    store.reads.clear()
    yield made
    made.close()


def _reads(engine: Engine) -> list[tuple[Any, ...]]:
    store = engine.ledger.store
    assert isinstance(store, CountingStore)
    return store.reads


def test_registering_the_metrics_reads_no_claim(engine: Engine) -> None:
    metrics = Metrics(engine)
    assert _reads(engine) == []
    # describe() gives the registry the collector's names: a second one is refused as a
    # duplicate, still without reading the ledger.
    with pytest.raises(ValueError, match="Duplicated"):
        metrics.registry.register(_LedgerCollector(engine))
    assert _reads(engine) == []

    text = generate_latest(metrics.registry).decode()
    assert _reads(engine) == [("claim_totals", None)]  # a scrape: one aggregate, no claim
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert {s.labels["state"]: s.value for s in families["chorus_claims"].samples} == {
        "consumed": 3.0, "released": 1.0}
    assert {s.labels["analyst"]: s.value
            for s in families["chorus_analyst_epsilon_consumed"].samples} == {
        "alice": 0.75, "bob": 0.0625}


def test_dashboard_and_analyst_endpoint_read_no_claim_list(engine: Engine) -> None:
    with serve_engine(engine) as server:
        assert _reads(engine) == []  # the app's metrics were registered without a read
        with server.client(OWNER_TOKEN) as owner:
            dashboard = owner.get("/v1/dashboard").json()
            assert owner.get("/metrics").status_code == 200
        with server.client(ALICE_TOKEN) as alice:
            mine = alice.get("/v1/budget/analysts/alice").json()
    assert dashboard["claims"] == {"granted": 3, "waiting": 0, "refused": 0, "released": 1,
                                   "by_state": {"consumed": 3, "released": 1}}
    assert dashboard["analysts"] == [
        {"analyst": "alice", "queries": 2, "epsilon": 0.75, "delta": D},
        {"analyst": "bob", "queries": 1, "epsilon": 0.0625, "delta": 0.0}]
    assert mine == {
        "analyst": "alice", "queries": 2, "epsilon_consumed": 0.75, "delta_consumed": D,
        "claims": {"consumed": 2},
        "blocks": [{"block": DAY1, "epsilon_consumed": 0.75, "delta_consumed": D, "queries": 2},
                   {"block": DAY2, "epsilon_consumed": 0.5, "delta_consumed": 0.0,
                    "queries": 1}]}
    assert sorted(_reads(engine), key=str) == sorted([
        ("claim_totals", None),  # the dashboard
        ("claim_totals", None),  # /metrics
        ("claim_totals", "alice"),
        ("claims", "alice", frozenset({"consumed"}))], key=str)
