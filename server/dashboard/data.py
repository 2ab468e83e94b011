"""What the budget dashboard draws: every block's epsilon, the history, claims and analysts.

:func:`build_dashboard` builds the body of ``GET /v1/dashboard`` (the owner's view only: the REST
app checks the owner token) from the ledger's views in :mod:`server.metrics`; the models below
are its OpenAPI schema.  Blocks the ledger has never charged are drawn as untouched (at most
:data:`server.metrics.MAX_UNTOUCHED_BLOCKS` of them).  Nothing here changes the ledger.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from budget.ledger import Viewer
from server import metrics as budget_views
from server.metrics import Metrics


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BarModel(_Model):
    """One block's epsilon in four stacked parts (untouched: not yet in the ledger)."""

    block: str
    total: float
    consumed: float
    allocated: float
    unlocked: float
    locked: float
    untouched: bool


class HistoryPoint(_Model):
    """Total epsilon consumed and allocated over all blocks at time ``t`` (Unix seconds)."""

    t: float
    consumed: float
    allocated: float


class ClaimsSummary(_Model):
    """Claims granted, waiting, refused (and released), plus the ledger's own states."""

    granted: int
    waiting: int
    refused: int
    released: int
    by_state: dict[str, int]


class AnalystSpending(_Model):
    """What one analyst spent."""

    analyst: str
    queries: int
    epsilon: float
    delta: float


class DashboardResponse(_Model):
    """Everything the budget dashboard draws."""

    generated_at: float
    epsilon_per_block: float
    delta_per_block: float
    accounting: str
    scheduler: str
    blocks: list[BarModel]
    untouched_not_shown: int
    history: list[HistoryPoint]
    claims: ClaimsSummary
    analysts: list[AnalystSpending]
    refusals: dict[str, int] = Field(description="refusals seen by this server, by SQLSTATE")
    requests: dict[str, int] = Field(description="query/explain requests by outcome")


def build_dashboard(engine: Any, history: budget_views.BudgetHistory,
                    metrics: Metrics) -> dict[str, Any]:
    """Everything the dashboard draws but the request counters, which the REST app keeps
    (``refusals`` and ``requests`` of :class:`DashboardResponse`); records a history point."""
    privacy = engine.policy.privacy
    blocks = budget_views.ledger_blocks(engine, Viewer.owner())  # the owner's page only
    totals = budget_views.ledger_totals(engine, None)  # counts and sums: no claim is read
    history.record(blocks)
    bars = {b["block"]: budget_views.bar_view(b, privacy.epsilon_per_block) for b in blocks}
    untouched = [i for i in budget_views.known_block_ids(engine) if i not in bars]
    hidden = max(0, len(untouched) - budget_views.MAX_UNTOUCHED_BLOCKS)
    for block_id in untouched[:budget_views.MAX_UNTOUCHED_BLOCKS]:
        bars[block_id] = {"block": block_id, "total": privacy.epsilon_per_block,
                          "consumed": 0.0, "allocated": 0.0, "unlocked": 0.0, "locked": 0.0,
                          "untouched": True}
    by_state = budget_views.claim_states(totals)
    summary = budget_views.claims_summary(by_state, metrics.budget_refusals)
    spending = budget_views.analyst_spending(totals)
    for name in engine.policy.analysts:
        spending.setdefault(name, {"analyst": name, "queries": 0, "epsilon": 0.0,
                                   "delta": 0.0, "claims": {}})
    return {
        "generated_at": time.time(),
        "epsilon_per_block": privacy.epsilon_per_block,
        "delta_per_block": privacy.delta_per_block,
        "accounting": str(privacy.accounting),
        "scheduler": str(privacy.scheduler.policy),
        "blocks": [bars[k] for k in sorted(bars)],
        "untouched_not_shown": hidden,
        "history": history.points(),
        "claims": {**summary, "by_state": by_state},
        "analysts": [{k: s[k] for k in ("analyst", "queries", "epsilon", "delta")}
                     for _, s in sorted(spending.items())],
    }
