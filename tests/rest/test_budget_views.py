"""The dashboard's and metrics' view of the ledger, for both ledger shapes (with and without
locked budget), and on a live DPF-N ledger."""

from __future__ import annotations

from pathlib import Path

import pytest

from chorus_py.engine import Engine
from server import metrics as views
from tests.rest.harness import ALICE_TOKEN, OWNER_TOKEN, policy_with_tokens, serve_engine


def test_bar_without_locking() -> None:
    bar = views.bar_view({"block": "b", "epsilon_global": 10.0, "epsilon_allocated": 1.0,
                          "epsilon_consumed": 2.0, "epsilon_remaining": 7.0}, 10.0)
    assert bar == {"block": "b", "total": 10.0, "consumed": 2.0, "allocated": 1.0,
                   "unlocked": 7.0, "locked": 0.0, "untouched": False}


def test_bar_with_locking() -> None:
    bar = views.bar_view({"block": "b", "epsilon_global": 10.0, "epsilon_locked": 6.0,
                          "epsilon_unlocked": 1.5, "epsilon_allocated": 0.5,
                          "epsilon_consumed": 2.0, "epsilon_remaining": 7.5,
                          "guarantee_left": {"epsilon": 8.0}}, 10.0)
    assert (bar["consumed"], bar["allocated"], bar["unlocked"], bar["locked"]) == (
        2.0, 0.5, 1.5, 6.0)


def test_bar_ignores_vectors_and_missing_fields() -> None:
    bar = views.bar_view({"block": "b", "epsilon_consumed": [1.0, 2.0]}, 4.0)
    assert bar["total"] == 4.0 and bar["consumed"] == 0.0 and bar["unlocked"] == 4.0


def test_claims_summary_and_spending() -> None:
    claims = [
        {"analyst": "a", "state": "consumed", "epsilon": 0.5, "delta": 0.0, "blocks": ["x", "y"]},
        {"analyst": "a", "state": "refused", "epsilon": 9.0, "delta": 0.0, "blocks": ["x"]},
        {"analyst": "b", "state": "waiting", "epsilon": 1.0, "delta": 0.0, "blocks": ["y"]},
        {"analyst": "b", "state": "released", "epsilon": 1.0, "delta": 0.0, "blocks": ["y"]},
        {"analyst": "b", "state": "allocated", "epsilon": 1.0, "delta": 0.0, "blocks": ["y"]},
    ]
    states = views.claim_states(claims)
    assert views.claims_summary(states, refused_seen=0) == {
        "granted": 2, "waiting": 1, "refused": 1, "released": 1}
    assert views.claims_summary(states, refused_seen=3)["refused"] == 3
    spending = views.analyst_spending(claims)
    assert spending["a"]["queries"] == 1 and spending["a"]["epsilon"] == 0.5
    assert spending["b"]["queries"] == 0 and spending["b"]["claims"]["waiting"] == 1
    assert views.analyst_blocks(claims, "a") == [
        {"block": "x", "epsilon_consumed": 0.5, "delta_consumed": 0.0, "queries": 1},
        {"block": "y", "epsilon_consumed": 0.5, "delta_consumed": 0.0, "queries": 1}]


def test_jsonable() -> None:
    assert views.jsonable({"a": (1, float("inf")), "b": {2: float("nan")}}) == {
        "a": [1, None], "b": {"2": None}}


def test_dpf_ledger_shows_locked_budget(duckdb_data: str, tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(policy_with_tokens(duckdb_data, epsilon_per_block=10.0, max_epsilon=1.0,
                                         scheduler='{ policy = "dpf-n", n = 4 }'))
    with Engine.from_policy(policy) as engine, serve_engine(engine) as server:
        with server.client(ALICE_TOKEN) as alice:
            answer = alice.post("/v1/query", json={"sql": "SELECT COUNT(*) FROM visits",
                                                   "epsilon": 1.0})
        assert answer.status_code == 200, answer.text
        with server.client(OWNER_TOKEN) as owner:
            data = owner.get("/v1/dashboard").json()
            budget = owner.get("/v1/budget").json()
    visits = next(b for b in data["blocks"] if b["block"] == "visits")
    # one arrival unlocked a quarter of the block; the query consumed 1 of it
    assert visits["locked"] == pytest.approx(7.5)
    assert visits["consumed"] == pytest.approx(1.0)
    assert visits["unlocked"] == pytest.approx(1.5)
    assert data["scheduler"] == "dpf-n"
    raw = next(b for b in budget["blocks"] if b["block"] == "visits")
    assert raw["epsilon_locked"] == pytest.approx(7.5)  # the ledger's own fields pass through
