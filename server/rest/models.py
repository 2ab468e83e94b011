"""The REST app's request and response bodies, as pydantic models (the OpenAPI schemas).

Requests are closed (an unknown member is a 422 problem); the privacy report's parts are open,
so a field the engine adds to its report passes through rather than fails.  The dashboard's own
data is modelled beside it, in :mod:`server.dashboard.data`; error bodies in
:mod:`server.rest.problems`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

#: Longest SQL text accepted (characters).
MAX_SQL_CHARS = 50_000


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class QueryRequest(_Model):
    """One SQL statement and, optionally, its privacy parameters."""

    sql: str = Field(min_length=1, max_length=MAX_SQL_CHARS,
                     description="One SELECT statement in the backend's dialect.",
                     examples=["SELECT city, COUNT(*) FROM trips GROUP BY city"])
    epsilon: float | None = Field(
        default=None, gt=0, allow_inf_nan=False,
        description="Privacy cost of this query (default: the policy's default_epsilon).")
    delta: float | None = Field(
        default=None, ge=0, lt=1, allow_inf_nan=False,
        description="Delta (default: the policy's default_delta); needed to release group keys "
        "without public_values.")
    wait_seconds: float | None = Field(
        default=None, ge=0, allow_inf_nan=False,
        description="Query only: how long to wait for budget the scheduler cannot grant at once "
        "(default: the policy's scheduler.wait_seconds, at most its max_wait_seconds).")
    sensitivity: Literal["analytic", "sampled"] | None = Field(
        default=None,
        description="'sampled' opts in to sensitivity sampling: an (epsilon, delta, gamma)-random"
        " DP answer for queries with no analytic bound (a median, SUM(LN(1 + x)), a column "
        "without bounds); default: the policy's privacy.sensitivity.")
    gamma: float | None = Field(
        default=None, gt=0, lt=1, allow_inf_nan=False,
        description="With sensitivity 'sampled': the probability the guarantee may fail over "
        "databases drawn from the table's sampling distribution (default: the policy's "
        "default_gamma, at most its max_gamma).")


class _ReportPart(BaseModel):
    # The engine may add fields to its report: pass them through rather than fail.
    model_config = ConfigDict(extra="allow")


class MeasurementModel(_ReportPart):
    """One noisy measurement per group."""

    id: str
    aggregate: str
    sensitivity: float | None
    derivation: str
    mechanism: dict[str, Any]
    error_bound_95: float | None


class ColumnModel(_ReportPart):
    """How one output column was produced."""

    name: str
    role: str = Field(description="aggregate, derived, group_key or constant")
    source: str
    measurements: list[str]
    mechanism: str | None = None
    scale: float | None = None
    error_bound_95: float | None = None
    note: str = ""


class KeyReleaseModel(_ReportPart):
    """How group keys were released."""

    method: str = Field(description="public_values or threshold")
    threshold: float | None = None
    gate: str | None = None
    delta: float | None = None
    note: str = ""


class ContributionModel(_ReportPart):
    """How many rows per privacy unit the query used, and what choosing that cost."""

    mode: str = Field(description="auto or fixed")
    limit: int
    cap: int | None = None
    epsilon: float
    note: str = ""
    method: str | None = Field(default=None, description="rows of several units: how the "
                               "stored kept set was chosen (greedy, sql-rank, ...)")


class RandomDPModel(_ReportPart):
    """A sampled-sensitivity answer: (epsilon, delta, gamma)-random DP, and how it was sampled."""

    gamma: float
    m: int
    k: int
    rho: float
    n: int
    n_source: str
    sensitivity: float
    distribution: str
    label: str
    note: str = ""


class PrivacyReportModel(_ReportPart):
    """What a query costs (explain) or cost (query), and how its answer was made."""

    analyst: str
    verdict: str = Field(description="allowed")
    charged: bool
    epsilon: float
    delta: float
    noise: str = Field(description="sql, proxy or none (public tables)")
    tables: list[str]
    blocks: list[str]
    stability: int | None = None
    privacy_unit: str | None = None
    measurements: list[MeasurementModel] = []
    columns: list[ColumnModel] = []
    key_release: KeyReleaseModel | None = None
    contribution: ContributionModel | None = None
    rewritten_sql: str | None = None
    notes: list[str] = []
    warnings: list[str] = Field(
        default=[], description="what the analyst should not miss: why no group was released "
        "and what epsilon would release groups of a given size, or (explain) that the "
        "key-release threshold will hide most groups")
    random_dp: RandomDPModel | None = None


class QueryResponse(_Model):
    """A noisy answer: column names, portable types, rows and the privacy report."""

    columns: list[str]
    types: list[str] = Field(description="integer, float, text, date, timestamp, boolean, ...")
    rows: list[list[Any]]
    intervals: list[list[dict[str, Any] | None]] = Field(
        default_factory=list,
        description="per row, per column: the cell's 95% interval (null for a group key or a "
        "constant): text (as chorus query prints it), lower/upper (bias of caps and clipping "
        "included), noise_lower/noise_upper (noise alone), method, bias, notes")
    report: PrivacyReportModel


class ExplainResponse(_Model):
    """What a query would cost, without running or charging anything."""

    report: PrivacyReportModel


class ColumnInfo(_Model):
    """A column an analyst may use."""

    type: str
    lower: float | None = None
    upper: float | None = None
    public_values: list[str | int | float | bool] | None = None
    private_id: bool = False


class TableInfo(_Model):
    """A table an analyst may query."""

    public: bool
    privacy_unit: str | None = None
    max_rows_per_unit: int | None = None
    block_column: str | None = None
    block_size: str | None = None
    # The blocks' public schedule: a UTC timestamp (time blocks) or an id (id ranges); end None:
    # time blocks run up to the current one.
    block_start: str | int | None = None
    block_end: str | int | None = None
    # How the blocks are cut, in words ("pickup_time: 1 week from Monday 00:00 UTC",
    # "pickup_time: 1 calendar month from 1970-01 (UTC)"): what the block ids count.
    block_scheme: str | None = None
    columns: dict[str, ColumnInfo]


class InfoResponse(_Model):
    """Who you are, the backend's SQL dialect, the privacy limits and the tables."""

    analyst: str | None
    owner: bool
    dialect: Literal["duckdb", "postgres"]
    default_epsilon: float
    default_delta: float
    max_epsilon_per_query: float
    max_delta_per_query: float
    epsilon_per_block: float
    delta_per_block: float
    tables: dict[str, TableInfo]


class BlockModel(BaseModel):
    """One private block as the ledger reports it (more fields appear as the ledger grows)."""

    model_config = ConfigDict(extra="allow")

    block: str
    epsilon_global: float | None = None
    epsilon_allocated: float | None = None
    epsilon_consumed: float | None = None
    epsilon_remaining: float | None = None
    delta_global: float | None = None
    delta_consumed: float | None = None
    delta_remaining: float | None = None
    by_analyst: dict[str, float] | None = Field(
        default=None, description="epsilon spent on this block per analyst: every analyst's "
        "for the data owner's token, only your own entry for an analyst's token")


class BudgetResponse(_Model):
    """The budget of every block the ledger holds; a block not listed has never been read."""

    epsilon_per_block: float
    delta_per_block: float
    blocks: list[BlockModel]


class AnalystBlock(_Model):
    """What one analyst spent on one block."""

    block: str
    epsilon_consumed: float
    delta_consumed: float
    queries: int


class AnalystBudgetResponse(_Model):
    """One analyst's spending: answered queries, epsilon and delta, per block and in total."""

    analyst: str
    queries: int
    epsilon_consumed: float
    delta_consumed: float
    claims: dict[str, int] = Field(description="claims of this analyst, by ledger state")
    blocks: list[AnalystBlock]


class HealthResponse(_Model):
    """The proxy is up and its backend answers."""

    status: Literal["ok"]
