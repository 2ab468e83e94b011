"""What the budget ledger says, as numbers: views for the REST app, the dashboard and Prometheus.

The ledger is read only through its public interface: ``budget_view(viewer)`` (its blocks as
one viewer may see them: see :class:`budget.ledger.Viewer`),
``claim_totals()`` (claims counted and summed per analyst and state, by the store) and
``claims(analyst, states)`` (one analyst's claims, shown as :data:`CLAIM_FIELDS`):
no scrape or request reads every claim, as a busy ledger holds millions.  Field names are looked
up tolerantly, so the views keep working while the ledger grows: the first ledger has
``epsilon_global / allocated / consumed / remaining``; the DPF ledger adds ``locked`` and
``unlocked`` budget and claim states such as ``waiting`` and ``refused``.  Whatever numeric field a
block reports is passed through unchanged in :func:`ledger_blocks`.

Nothing here changes the ledger.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, Histogram
from prometheus_client import Counter as PromCounter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from budget.ledger import Viewer
from chorus_py.activity import QueryEvent

# Claim states, grouped the way the dashboard shows them.  Unknown states are counted on their own.
GRANTED_STATES = frozenset({"granted", "allocated", "consumed"})
WAITING_STATES = frozenset({"waiting", "pending", "queued"})
REFUSED_STATES = frozenset({"refused", "rejected", "denied", "timed_out", "timeout", "expired"})
# States that mean the budget was spent (the analyst saw an answer).
SPENT_STATES = frozenset({"consumed"})

#: At most this many blocks that no query has read yet are listed on the dashboard.
MAX_UNTOUCHED_BLOCKS = 2000


def _number(data: Mapping[str, Any], *names: str) -> float | None:
    for name in names:
        value = data.get(name)
        if isinstance(value, bool):
            continue
        if isinstance(value, int | float) and math.isfinite(value):
            return float(value)
    return None


def _epsilon(data: Mapping[str, Any], part: str) -> float | None:
    return _number(data, f"epsilon_{part}", f"{part}_epsilon", part)


def jsonable(value: Any) -> Any:
    """Numbers stay numbers (non-finite ones become None), containers recurse, the rest str."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)


#: What a claim's view holds.  Named, not every field of the claim: a claim can carry the
#: snapshots of its blocks (``after``), which hold every analyst's spending (issue 18).
CLAIM_FIELDS = ("claim_id", "analyst", "blocks", "epsilon", "delta", "state")


def claim_dict(claim: Any) -> dict[str, Any]:
    """One ledger claim as a JSON-ready dictionary of :data:`CLAIM_FIELDS`."""
    return {name: jsonable(getattr(claim, name)) for name in CLAIM_FIELDS}


def ledger_blocks(engine: Any, viewer: Viewer) -> list[dict[str, Any]]:
    """Every block the ledger knows, JSON-ready, as ``viewer`` may see it (block totals for
    everyone; other analysts' names and spending only for the owner: :class:`Viewer`)."""
    return [{str(k): jsonable(v) for k, v in data.items()}
            for data in engine.ledger.budget_view(viewer)]


def ledger_totals(engine: Any, analyst: str | None) -> list[dict[str, Any]]:
    """Claims per analyst and state (``claims``: how many, ``epsilon``/``delta``: their sums),
    only ``analyst``'s, or every analyst's for ``None`` (the owner's pages only: no default, so
    a caller must say which): rows that :func:`claim_states` and :func:`analyst_spending` take
    in place of the claims themselves."""
    return [{k: jsonable(v) for k, v in t._asdict().items()}
            for t in engine.ledger.claim_totals(analyst)]


def spent_claims(engine: Any, analyst: str) -> list[dict[str, Any]]:
    """One analyst's claims in a spent state, oldest first (what :func:`analyst_blocks` needs)."""
    return [claim_dict(c) for c in engine.ledger.claims(analyst, SPENT_STATES)]


def bar_view(data: Mapping[str, Any], epsilon_per_block: float) -> dict[str, Any]:
    """The four stacked parts of one block's epsilon: consumed, allocated, unlocked, locked.

    Without locking (the first ledger), everything not yet allocated or consumed is unlocked.
    """
    total = _epsilon(data, "global")
    total = epsilon_per_block if total is None else total
    consumed = _epsilon(data, "consumed") or 0.0
    allocated = _epsilon(data, "allocated") or 0.0
    locked = _epsilon(data, "locked")
    unlocked = _epsilon(data, "unlocked")
    if unlocked is None:
        remaining = _epsilon(data, "remaining")
        if remaining is None:
            remaining = total - consumed - allocated - (locked or 0.0)
        unlocked = remaining if locked is None else max(0.0, remaining - locked)
    return {
        "block": str(data.get("block", "?")),
        "total": total,
        "consumed": consumed,
        "allocated": allocated,
        "unlocked": max(0.0, unlocked),
        "locked": locked or 0.0,
        "untouched": False,
    }


def _count(row: Mapping[str, Any]) -> int:
    """How many claims a row stands for: a total says (``claims``), a claim is one."""
    n = row.get("claims", 1)
    return n if isinstance(n, int) and not isinstance(n, bool) else 1


def claim_states(rows: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """How many claims are in each state, as the ledger names them (rows: claims or totals)."""
    out: Counter[str] = Counter()
    for row in rows:
        out[str(row.get("state", "unknown"))] += _count(row)
    return dict(out)


def claims_summary(by_state: Mapping[str, int], refused_seen: int) -> dict[str, int]:
    """Claims granted, waiting and refused.

    ``refused_seen`` counts budget refusals this process observed; a ledger that records refused
    claims itself reports at least as many, so the larger of the two is shown.
    """
    granted = sum(n for s, n in by_state.items() if s in GRANTED_STATES)
    waiting = sum(n for s, n in by_state.items() if s in WAITING_STATES)
    refused = sum(n for s, n in by_state.items() if s in REFUSED_STATES)
    released = by_state.get("released", 0)
    return {"granted": granted, "waiting": waiting, "refused": max(refused, refused_seen),
            "released": released}


def analyst_spending(rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per analyst: queries answered and epsilon/delta spent (consumed claims), claims by state.

    ``rows`` are claims or totals (:func:`ledger_totals`): the result is the same.
    """
    out: dict[str, dict[str, Any]] = {}
    for row in rows:
        name = str(row.get("analyst", "?"))
        entry = out.setdefault(name, {"analyst": name, "queries": 0, "epsilon": 0.0,
                                      "delta": 0.0, "claims": {}})
        state, n = str(row.get("state", "unknown")), _count(row)
        entry["claims"][state] = entry["claims"].get(state, 0) + n
        if state in SPENT_STATES:
            entry["queries"] += n
            entry["epsilon"] += _number(row, "epsilon") or 0.0
            entry["delta"] += _number(row, "delta") or 0.0
    return out


def analyst_blocks(claims: Iterable[Mapping[str, Any]], analyst: str) -> list[dict[str, Any]]:
    """Epsilon/delta one analyst spent on each block (consumed claims only), sorted by block."""
    per: dict[str, dict[str, Any]] = {}
    for claim in claims:
        if claim.get("analyst") != analyst or claim.get("state") not in SPENT_STATES:
            continue
        blocks = claim.get("blocks") or []
        for block in blocks if isinstance(blocks, list) else [blocks]:
            entry = per.setdefault(str(block), {"block": str(block), "epsilon_consumed": 0.0,
                                                "delta_consumed": 0.0, "queries": 0})
            entry["epsilon_consumed"] += _number(claim, "epsilon") or 0.0
            entry["delta_consumed"] += _number(claim, "delta") or 0.0
            entry["queries"] += 1
    return [per[k] for k in sorted(per)]


def known_block_ids(engine: Any) -> list[str]:
    """Block ids of every windowed private table (public metadata: the policy's schedule and the
    clock, never the data; no query to the backend)."""
    ids: list[str] = []
    for name, table in engine.policy.tables.items():
        if table.public or table.block is None:
            continue
        ids.extend(engine.blocks.windows(name, table.block).ids())
    return ids


class BudgetHistory:
    """A bounded, thread-safe series of (time, total epsilon consumed / allocated) points."""

    def __init__(self, max_points: int = 720, min_interval_s: float = 1.0) -> None:
        self._points: deque[dict[str, float]] = deque(maxlen=max_points)
        self._min_interval = min_interval_s
        self._lock = threading.Lock()

    def due(self) -> bool:
        """True when the last point is older than ``min_interval_s`` (or there is none)."""
        with self._lock:
            return not self._points or time.time() - self._points[-1]["t"] >= self._min_interval

    def record(self, blocks: list[dict[str, Any]]) -> None:
        """Add a point (or replace the last one when it is younger than ``min_interval_s``)."""
        point = {
            "t": time.time(),
            "consumed": sum(_epsilon(b, "consumed") or 0.0 for b in blocks),
            "allocated": sum(_epsilon(b, "allocated") or 0.0 for b in blocks),
        }
        with self._lock:
            if self._points and point["t"] - self._points[-1]["t"] < self._min_interval:
                self._points[-1] = point
            else:
                self._points.append(point)

    def points(self) -> list[dict[str, float]]:
        """Oldest first."""
        with self._lock:
            return list(self._points)


def _ledger_families() -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
    """The ledger's metric families, without samples: budget per block, claims, spending."""
    return (
        GaugeMetricFamily(
            "chorus_block_epsilon", "Epsilon of each private block, by part "
            "(consumed, allocated, unlocked, locked, total).", labels=["block", "part"]),
        GaugeMetricFamily("chorus_claims", "Budget claims in the ledger, by state.",
                          labels=["state"]),
        GaugeMetricFamily("chorus_analyst_epsilon_consumed",
                          "Epsilon spent by each analyst (sum over answered queries).",
                          labels=["analyst"]),
    )


class _LedgerCollector(Collector):
    """Reads the ledger at scrape time: budget per block, claims per state, spending."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """The families without samples: the registry calls this, not ``collect``, when the
        collector is registered, so registering reads nothing from the ledger."""
        yield from _ledger_families()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        # Only the data owner may scrape /metrics: it lists every analyst's spending.
        blocks = ledger_blocks(self._engine, Viewer.owner())
        totals = ledger_totals(self._engine, None)
        epsilon_per_block = self._engine.policy.privacy.epsilon_per_block
        budget, states, spent = _ledger_families()
        for data in blocks:
            bar = bar_view(data, epsilon_per_block)
            for part in ("consumed", "allocated", "unlocked", "locked", "total"):
                budget.add_metric([bar["block"], part], bar[part])
        yield budget
        for state, n in sorted(claim_states(totals).items()):
            states.add_metric([state], n)
        yield states
        for name, entry in sorted(analyst_spending(totals).items()):
            spent.add_metric([name], entry["epsilon"])
        yield spent


#: Latency buckets (seconds) of every query histogram.
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                    30.0)


class Metrics:
    """The Prometheus metrics of one REST app (its own registry, so apps never share counters).

    The REST counters (``chorus_rest_requests``, ``chorus_query_duration_seconds``) are fed by
    the app; everything else by the engine's activity (:mod:`chorus_py.activity`), which every
    front door of ``chorus serve`` reports to: wire, REST and in-process DB-API queries, their
    refusals and cost, failed logins, wire connections and the database's health.
    """

    def __init__(self, engine: Any) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = PromCounter(
            "chorus_rest_requests", "REST requests answered, by endpoint and outcome.",
            ["endpoint", "outcome"], registry=self.registry)
        self.latency = Histogram(
            "chorus_query_duration_seconds", "Time to answer a REST query or explain request.",
            ["endpoint"], registry=self.registry, buckets=_LATENCY_BUCKETS)
        self.queries = PromCounter(
            "chorus_queries", "Queries and EXPLAINs of every front door, by door, action and "
            "outcome (answered, refused, canceled, failed).", ["door", "action", "outcome"],
            registry=self.registry)
        self.refusals = PromCounter(
            "chorus_refusals", "Queries refused, by front door, SQLSTATE (class 53: privacy "
            "budget) and reason (the error's class).", ["door", "sqlstate", "reason"],
            registry=self.registry)
        self.epsilon = PromCounter(
            "chorus_epsilon_charged", "Epsilon charged by answered queries, by front door.",
            ["door"], registry=self.registry)
        self.delta = PromCounter(
            "chorus_delta_charged", "Delta charged by answered queries, by front door.",
            ["door"], registry=self.registry)
        self.door_latency = Histogram(
            "chorus_door_query_duration_seconds", "Time the engine took for a query or "
            "EXPLAIN, by front door and action.", ["door", "action"], registry=self.registry,
            buckets=_LATENCY_BUCKETS)
        self.connections = Gauge(
            "chorus_connections", "Open connections, by front door (wire).", ["door"],
            registry=self.registry)
        self.connections_opened = PromCounter(
            "chorus_connections_opened", "Connections accepted, by front door (wire).",
            ["door"], registry=self.registry)
        self.failed_logins = PromCounter(
            "chorus_failed_logins", "Failed logins (wrong password, unknown user or token), by "
            "front door.", ["door"], registry=self.registry)
        self.backend_up = Gauge(
            "chorus_backend_up", "1 when the last health probe reached the database, else 0.",
            registry=self.registry)
        self.registry.register(_LedgerCollector(engine))
        self._budget_refusals = 0
        self._lock = threading.Lock()
        self._children: dict[tuple[str, str, str], tuple[Any, ...]] = {}
        activity = getattr(engine, "activity", None)
        if activity is not None:
            activity.subscribe(self)

    # -- chorus_py.activity.ActivityListener
    def on_query(self, event: QueryEvent) -> None:
        """Count one query of any front door."""
        key = (event.door, event.action, event.outcome)
        children = self._children.get(key)
        if children is None:  # labels() looks up under a lock: once per key, not per query
            children = self._children.setdefault(key, (
                self.queries.labels(*key), self.door_latency.labels(*key[:2]),
                self.epsilon.labels(key[0]), self.delta.labels(key[0])))
        queries, latency, epsilon, delta = children
        queries.inc()
        latency.observe(event.ms / 1000)
        if event.outcome == "refused":
            self.refused(event.door, event.sqlstate or "", event.reason or "")
        if event.charged:
            epsilon.inc(event.epsilon or 0.0)
            delta.inc(event.delta or 0.0)

    def on_login_failed(self, door: str) -> None:
        """Count a failed login."""
        self.failed_logins.labels(door).inc()

    def on_connection(self, door: str, opened: bool) -> None:
        """Count a connection opened or closed."""
        if opened:
            self.connections_opened.labels(door).inc()
            self.connections.labels(door).inc()
        else:
            self.connections.labels(door).dec()

    def on_health(self, up: bool) -> None:
        """The database's health as the last probe saw it."""
        self.backend_up.set(1 if up else 0)

    def refused(self, door: str, sqlstate: str, reason: str) -> None:
        """Count a refusal; budget refusals (class 53) also feed the dashboard."""
        self.refusals.labels(door, sqlstate, reason).inc()
        if sqlstate.startswith("53"):
            with self._lock:
                self._budget_refusals += 1

    @property
    def budget_refusals(self) -> int:
        """Budget refusals observed by this app (every front door)."""
        with self._lock:
            return self._budget_refusals
