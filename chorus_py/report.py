"""Result types: what every front door returns for a query (rows + privacy report)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class MeasurementReport:
    """One noisy number per group: which aggregate, its sensitivity and its noise."""

    id: str
    aggregate: str
    sensitivity: float
    derivation: str
    mechanism: dict[str, Any]
    error_bound_95: float


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
class ContributionReport:
    """How many rows per privacy unit the query used, and what choosing that cost."""

    mode: Literal["auto", "fixed"]
    limit: int
    cap: int | None
    epsilon: float
    note: str = ""


@dataclass(frozen=True)
class BlockRemaining:
    """The privacy guarantee of one block the query reads, after (execute) or before (explain).

    ``epsilon_spent``/``delta_spent``: everything released or granted on the block so far is
    (epsilon_spent, delta_spent)-DP (with Rényi accounting: converted at the best order);
    ``epsilon_left``/``delta_left``: what remains of the block's (epsilon^G, delta^G).
    """

    block: str
    state: Literal["active", "retired"]
    epsilon_left: float
    delta_left: float
    epsilon_spent: float
    delta_spent: float


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

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dictionary."""
        return asdict(self)


@dataclass(frozen=True)
class QueryResult:
    """Rows of a (noisy) answer, with column names, portable types and the privacy report."""

    columns: tuple[str, ...]
    types: tuple[str, ...]
    rows: list[tuple[Any, ...]]
    report: PrivacyReport

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dictionary: ``columns``, ``types``, ``rows``, ``report``."""
        return {
            "columns": list(self.columns),
            "types": list(self.types),
            "rows": [[_jsonable(v) for v in row] for row in self.rows],
            "report": self.report.to_dict(),
        }


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)
