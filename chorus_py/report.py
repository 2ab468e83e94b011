"""Result types: what every front door returns for a query (rows + privacy report)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol

from mechanisms.intervals import Interval, NoInterval, format_interval


@dataclass(frozen=True)
class MeasurementReport:
    """One noisy number per group: which aggregate, its sensitivity and its noise."""

    id: str
    aggregate: str
    # None for a join whose sensitivity depends on the data (never shown: ElasticReport).
    sensitivity: float | None
    derivation: str
    mechanism: dict[str, Any]
    error_bound_95: float | None


@dataclass(frozen=True)
class ColumnReport:
    """How one output column was produced."""

    name: str
    role: Literal["aggregate", "derived", "group_key", "constant"]
    source: str
    measurements: tuple[str, ...]
    mechanism: str | None = None
    scale: float | None = None
    error_bound_95: float | None = None
    note: str = ""


@dataclass(frozen=True)
class KeyRelease:
    """How group keys were released: declared public values, or a noisy-count threshold."""

    method: Literal["public_values", "threshold"]
    threshold: float | None = None
    gate: str | None = None
    delta: float | None = None
    note: str = ""


@dataclass(frozen=True)
class SelectionStep:
    """One private selection step: a noisy histogram (sensitivity 1) and what it chose.

    ``kind`` "cap": rows per unit, chooses the row cap; "bounds": magnitudes of a summed
    expression, chooses its clipping interval; "groups": distinct groups per unit, chooses g,
    the most groups a unit's rows are kept in (keys released by thresholding).  ``chosen`` is
    None until the query runs
    (EXPLAIN runs nothing); it is the output of a DP mechanism, nothing exact about the data.
    """

    kind: Literal["cap", "bounds", "groups"]
    target: str
    declared: str
    epsilon: float
    mechanism: str
    chosen: str | None = None
    # How low the answers may come out because of the choice (from the same noisy histograms).
    bias: str | None = None


@dataclass(frozen=True)
class ContributionReport:
    """How many rows per privacy unit the query used, and what choosing that cost.

    ``epsilon`` is the whole selection cost: the sum of the steps' epsilons.  The query's
    epsilon is that plus the epsilons of its measurements (and key-release count).
    """

    mode: Literal["auto", "fixed"]
    limit: int
    cap: int | None
    epsilon: float
    note: str = ""
    # Several units per row: how the stored kept set S was chosen (rewriters.attribution).
    method: str | None = None
    steps: tuple[SelectionStep, ...] = ()


@dataclass(frozen=True)
class FrequencyReport:
    """A max frequency a join's stability uses, and where it comes from.

    ``value`` is given for ``pinned`` (policy) and ``public`` (public table) sources only; a value
    read from a private table (``data``) is data-dependent and never shown.
    """

    name: str
    source: Literal["pinned", "data", "public"]
    value: float | None = None


@dataclass(frozen=True)
class ElasticReport:
    """The elastic sensitivity of a join query (``analyses.joins``, DESIGN.md section 5).

    ``stability`` is S(k) over the symbolic frequencies mf_k; the numbers (S(0), the k where
    exp(-beta k) S(k) peaks, S* and beta) are given only when no frequency is data-dependent.
    """

    stability: str
    equalities: tuple[str, ...]
    frequencies: tuple[FrequencyReport, ...]
    data_dependent: bool
    rule: str
    at_zero: float | None = None
    peak_k: int | None = None
    smooth_bound: float | None = None
    beta: float | None = None


@dataclass(frozen=True)
class RandomDPReport:
    """A sampled-sensitivity answer: (epsilon, delta, gamma)-random DP (chorus_py.kinds.sampled).

    Everything here depends only on the sampling distribution P, never on the private data:
    ``sensitivity`` is the k-th smallest of m sampled L1 differences ||f(D) - f(D')||_1 over
    databases of n rows drawn from P (Rubinstein & Alda 2017, Theorem 15).
    """

    gamma: float
    m: int
    k: int
    rho: float
    n: int
    n_source: str
    sensitivity: float
    distribution: str
    label: str = "random differential privacy"
    note: str = ""


@dataclass(frozen=True)
class BlockRemaining:
    """The privacy guarantee of one block the query reads, after (execute) or before (explain).

    ``epsilon_spent``/``delta_spent``: everything released or granted on the block so far is
    (epsilon_spent, delta_spent)-DP (with Rényi accounting: converted at the best order);
    ``epsilon_left``/``delta_left``: what the analyst can still spend on the block: what remains
    of the block's (epsilon^G, delta^G) or, when smaller, of the analyst's own limit per block
    (``max_epsilon_per_block``), as ``binding`` says.  With such a limit, ``block_epsilon_left``
    is the block's own and ``analyst_epsilon_left`` the analyst's.
    """

    block: str
    state: Literal["active", "retired"]
    epsilon_left: float
    delta_left: float
    epsilon_spent: float
    delta_spent: float
    binding: Literal["block", "analyst"] = "block"
    block_epsilon_left: float | None = None
    analyst_epsilon_left: float | None = None


@dataclass(frozen=True)
class PrivacyReport:
    """What a query costs (``explain``) or cost (``execute``), and how its answer was made."""

    analyst: str
    verdict: Literal["allowed"]
    charged: bool
    epsilon: float
    delta: float
    noise: Literal["sql", "proxy", "none"]
    tables: tuple[str, ...]
    blocks: tuple[str, ...]
    stability: int | None = None
    privacy_unit: str | None = None
    measurements: tuple[MeasurementReport, ...] = ()
    columns: tuple[ColumnReport, ...] = ()
    key_release: KeyRelease | None = None
    contribution: ContributionReport | None = None
    rewritten_sql: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    # Per block read: the (epsilon, delta) guarantee left ("basic" or "renyi" accounting).
    remaining: tuple[BlockRemaining, ...] = ()
    accounting: str = "basic"
    # Set when the analyst opted in to sampled sensitivity: the answer is (epsilon, delta,
    # gamma)-random DP, not (epsilon, delta)-DP.
    random_dp: RandomDPReport | None = None
    elastic: ElasticReport | None = None
    # What the analyst should not miss, shown by every front door: why no group was released
    # (and what epsilon would release them), or, before running, that the key-release threshold
    # will hide most groups.
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dictionary."""
        return asdict(self)


class ErrorBars(Protocol):
    """Where a result's 95% intervals come from (``chorus_py.kinds.analytic.Accuracy``):
    computed on first use, as they cost simulation time and many callers never look."""

    def intervals(self) -> tuple[tuple[Interval | NoInterval | None, ...], ...]:
        """Per row, per column: the interval of a noisy output, None for a key or constant."""
        ...


@dataclass(frozen=True)
class QueryResult:
    """Rows of a (noisy) answer, with column names, portable types and the privacy report.

    ``intervals()`` gives each noisy cell its 95% interval (``mechanisms.intervals``): from the
    noise distributions of the measurements it was computed from, widened by the estimated
    bias of caps and clipping where there is one.  Post-processing of the released values: free.
    """

    columns: tuple[str, ...]
    types: tuple[str, ...]
    rows: list[tuple[Any, ...]]
    report: PrivacyReport
    error_bars: ErrorBars | None = field(default=None, repr=False, compare=False)

    def intervals(self) -> tuple[tuple[Interval | NoInterval | None, ...], ...]:
        """Per row, per column: the cell's 95% interval (None: a group key or a constant, or
        a kind of query without error bars, e.g. public tables, answered exactly)."""
        if self.error_bars is None:
            return tuple((None,) * len(self.columns) for _ in self.rows)
        return self.error_bars.intervals()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dictionary: ``columns``, ``types``, ``rows``, ``intervals``
        (``interval_dict`` per cell), ``report``."""
        return {
            "columns": list(self.columns),
            "types": list(self.types),
            "rows": [[_jsonable(v) for v in row] for row in self.rows],
            "intervals": [[interval_dict(iv) for iv in row] for row in self.intervals()],
            "report": self.report.to_dict(),
        }


def interval_dict(iv: Interval | NoInterval | None) -> dict[str, Any] | None:
    """A cell's interval as JSON: ``text`` as ``chorus query`` prints it; ``lower``/``upper``
    (bias included) and ``noise_lower``/``noise_upper`` (noise alone; infinite ends as None);
    or only ``text`` with the reason when there is no interval."""
    if iv is None:
        return None
    if isinstance(iv, NoInterval):
        return {"text": iv.reason, "lower": None, "upper": None}

    def end(x: float) -> float | None:
        return x if math.isfinite(x) else None

    return {"text": format_interval(iv), "lower": end(iv.lower), "upper": end(iv.upper),
            "noise_lower": end(iv.noise_lower), "noise_upper": end(iv.noise_upper),
            "confidence": iv.confidence, "method": iv.method,
            "bias": [{"direction": b.direction, "fraction": b.fraction, "reason": b.reason}
                     for b in iv.bias], "notes": list(iv.notes)}


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)


def shown(value: float | None, spec: str = ".4g") -> str:
    """A number for text reports; None (a data-dependent value) as 'data-dependent'."""
    return "data-dependent (not shown)" if value is None else format(value, spec)


def elastic_lines(report: PrivacyReport) -> list[str]:
    """EXPLAIN lines for a join: S(k), each max frequency's source, and the numbers when they
    are not data-dependent (S(0), the peak k, S*, beta)."""
    e = report.elastic
    if e is None:
        return []
    lines = [f"join on {', '.join(e.equalities)}", f"elastic stability S(k) = {e.stability}"]
    for f in e.frequencies:
        value = "" if f.value is None else f" = {f.value:g}"
        lines.append(f"max frequency {f.name}: {f.source}{value}"
                     + (" (read from the private table: not shown)" if f.source == "data"
                        else ""))
    if e.data_dependent:
        lines.append("smooth bound: data-dependent (S(0), S* and the noise scale follow from "
                     "max frequencies read from private data and are not shown)")
    else:
        lines.append(f"smooth bound: S(0) = {shown(e.at_zero, 'g')}, exp(-beta k) S(k) peaks at "
                     f"k = {e.peak_k}, S* = {shown(e.smooth_bound)}, beta = {shown(e.beta)}")
    lines.append(f"rule: {e.rule}")
    return lines
