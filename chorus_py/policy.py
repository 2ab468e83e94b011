"""The policy (catalog) file: what the data owner declares, validated once at load time.

The file is TOML (DESIGN.md section 4).  Validation happens in two steps:

1. :func:`load_policy` parses and type-checks the file with pydantic; every error names the file,
   the key path (``tables.trips.columns.fare.upper``) and what was expected.
2. :meth:`Policy.check_against` compares the declared tables and columns with the live database
   (a policy that names something the database lacks is an error at load time).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Mapping
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from chorus_py.blockgrid import (
    WEEKDAYS,
    FixedGrid,
    Grid,
    MonthGrid,
    grid_for,
    is_time_size,
    is_week_size,
    weekday_name,
)
from chorus_py.errors import PolicyError

ColumnType = Literal["int", "float", "text", "bool", "date", "timestamp"]
NUMERIC_TYPES: frozenset[str] = frozenset({"int", "float"})
#: The database types (``backends.portable_type``) each declared type accepts.
LIVE_TYPES: dict[str, tuple[str, ...]] = {
    "int": ("integer",), "float": ("float", "integer"), "text": ("text",), "bool": ("boolean",),
    "date": ("date",), "timestamp": ("timestamp",)}

_IDS_RE = re.compile(r"^\s*([1-9]\d*)\s*ids?\s*$")
_ID_RANGE_RE = re.compile(r"^(.*):(-?\d+)-(-?\d+)$")  # an id-range block: rider_id:0-9999
# Spark Connect: sc://host:port, optionally with the client's parameters (/;use_ssl=true;...).
_SPARK_CONNECT = re.compile(r"sc://[A-Za-z0-9.\-\[\]:]+(/;.*)?")
# A path given as a URI (s3a://bucket/x, hdfs://nn/x, file:/x): absolute by construction.
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:/")
# The most blocks a schedule may have (a query with no filter on the block column is charged
# on all of them).
MAX_BLOCKS = 100_000


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SparkConfig(_Strict):
    """``[backend.spark]``: the tables a Spark backend serves, and where the proxy keeps what
    it stores (``chorus_py.backends.spark``).  On ``spark://local`` relative paths are relative
    to the policy file; on ``sc://`` (Spark Connect) every path is one the cluster reads, given
    whole (``/lake/trips``, ``s3a://lake/trips``), and ``private_dir`` must be set."""

    # Table name -> a Parquet file or directory of Parquet files.
    tables: dict[str, str] = Field(default_factory=dict)
    # A directory whose every ``<name>.parquet`` (file or directory) is the table ``name``.
    warehouse: str | None = None
    # Where stored bounded samples and kept sets are written (Parquet, owner-only).  Unset:
    # ``<policy file name>.spark-private`` next to the policy file.
    private_dir: str | None = None
    # Cores of the local Spark (local[N]); 0: every core of the machine.
    cores: int = Field(default=0, ge=0)
    # Spark's shuffle partitions (spark.sql.shuffle.partitions): few for one machine.
    shuffle_partitions: int = Field(default=4, gt=0)

    @model_validator(mode="after")
    def _some_tables(self) -> SparkConfig:
        if not self.tables and self.warehouse is None:
            raise ValueError("name the tables: tables = { trips = \"data/trips.parquet\" } "
                             "or warehouse = \"data\" (every <name>.parquet in it)")
        return self


class BackendConfig(_Strict):
    """Where the data lives: ``duckdb:///path.duckdb``, ``duckdb:///:memory:``, a Postgres URL,
    ``spark://local`` or ``sc://host:port`` (Spark Connect; both with ``[backend.spark]``)."""

    url: str
    # Rewritten queries running longer are cancelled (and charged: they read data).
    statement_timeout_seconds: float = Field(default=300.0, gt=0, allow_inf_nan=False)
    # Postgres only: where public-only queries run, as a role that can read the public tables
    # and nothing else (checked at start).  Unset: they run on the main connection (a warning).
    public_url: str | None = None
    # Spark only: the Parquet tables and the private directory.
    spark: SparkConfig | None = None

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, url: str) -> str:
        if url.startswith("sc://") and not _SPARK_CONNECT.fullmatch(url):
            raise ValueError("a Spark Connect URL is sc://host:port (e.g. sc://spark:15002)")
        if url.startswith("spark://") and url != "spark://local":
            raise ValueError("the only Spark URL is \"spark://local\" (an in-process Spark)")
        if not url.startswith(("duckdb://", "postgresql://", "postgres://", "spark://",
                               "sc://")):
            raise ValueError("expected a URL starting with duckdb://, postgresql://, "
                             "spark://local or sc://")
        return url

    @model_validator(mode="after")
    def _spark_tables(self) -> BackendConfig:
        if self.dialect == "spark" and self.spark is None:
            raise ValueError("a Spark backend needs [backend.spark] with its tables, "
                             "e.g. tables = { trips = \"data/trips.parquet\" }")
        if self.dialect != "spark" and self.spark is not None:
            raise ValueError("[backend.spark] is for url = \"spark://local\" or sc://")
        if self.url.startswith("sc://") and self.spark is not None:
            # The paths are the cluster's: the proxy can neither list a directory there nor
            # pick a default next to the policy file, and a relative path would be relative to
            # the server's working directory.
            if self.spark.warehouse is not None or self.spark.cores:
                raise ValueError("on sc:// name every table in [backend.spark] tables (a "
                                 "warehouse directory of the cluster cannot be listed) and "
                                 "leave out cores (the cluster has its own)")
            if self.spark.private_dir is None:
                raise ValueError("on sc:// set [backend.spark] private_dir: a directory of the "
                                 "cluster's filesystem that analysts cannot read")
            relative = [p for p in (*self.spark.tables.values(), self.spark.private_dir)
                        if not (p.startswith("/") or _URI.match(p))]
            if relative:
                raise ValueError(f"on sc:// every path is the cluster's and absolute "
                                 f"(/lake/t or s3a://lake/t): {relative[0]}")
        return self

    @model_validator(mode="after")
    def _public_url_on_postgres(self) -> BackendConfig:
        if self.public_url is not None and (
                self.dialect != "postgres"
                or not self.public_url.startswith(("postgresql://", "postgres://"))):
            raise ValueError("public_url is a postgresql:// URL for a Postgres backend (on "
                             "DuckDB public queries run on an in-memory copy of the public "
                             "tables: remove it)")
        return self

    @property
    def dialect(self) -> Literal["duckdb", "postgres", "spark"]:
        """The sqlglot dialect of the backend."""
        if self.url.startswith("duckdb://"):
            return "duckdb"
        return "spark" if self.url.startswith(("spark://", "sc://")) else "postgres"


class SchedulerConfig(_Strict):
    """How the budget ledger grants claims (``budget.scheduler``; DESIGN.md section 7)."""

    # "fcfs": a claim is granted at once when every block it reads has budget (blocks start fully
    # unlocked).  "dpf-n": Dominant Private block Fairness, N-based (each arriving claim unlocks
    # epsilon^G / n of every block it asks for).  "dpf-t": DPF, time-based (each block unlocks
    # epsilon^G * tick / lifetime every tick).
    policy: Literal["fcfs", "dpf-n", "dpf-t"] = "fcfs"
    n: int | None = Field(default=None, gt=0)
    # How long a claim that does not fit yet may wait for the scheduler (0: refuse at once).
    wait_seconds: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    # Upper limit of a per-query wait override.
    max_wait_seconds: float = Field(default=60.0, ge=0, allow_inf_nan=False)
    lifetime: str | None = None
    tick: str | None = None

    @field_validator("lifetime", "tick")
    @classmethod
    def _duration(cls, value: str | None) -> str | None:
        if value is not None:
            duration_seconds(value)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> SchedulerConfig:
        if self.policy == "dpf-n" and self.n is None:
            raise ValueError("policy 'dpf-n' needs n (claims that share a block's budget)")
        if self.policy != "dpf-n" and self.n is not None:
            raise ValueError("n only applies to policy 'dpf-n'")
        if self.policy == "dpf-t":
            if self.lifetime is None or self.tick is None:
                raise ValueError("policy 'dpf-t' needs lifetime and tick, e.g. "
                                 "lifetime = \"30d\", tick = \"1h\"")
            if duration_seconds(self.tick) > duration_seconds(self.lifetime):
                raise ValueError("tick must not be longer than lifetime")
        elif self.lifetime is not None or self.tick is not None:
            raise ValueError("lifetime and tick only apply to policy 'dpf-t'")
        if self.wait_seconds > self.max_wait_seconds:
            raise ValueError("wait_seconds must not exceed max_wait_seconds")
        return self

    @property
    def lifetime_seconds(self) -> float | None:
        """``lifetime`` in seconds."""
        return None if self.lifetime is None else duration_seconds(self.lifetime)

    @property
    def tick_seconds(self) -> float | None:
        """``tick`` in seconds."""
        return None if self.tick is None else duration_seconds(self.tick)


_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*$")
_DURATION_UNITS = {"s": 1, "sec": 1, "second": 1, "seconds": 1, "m": 60, "min": 60,
                   "minute": 60, "minutes": 60, "h": 3600, "hour": 3600, "hours": 3600,
                   "d": 86400, "day": 86400, "days": 86400, "w": 604800, "week": 604800,
                   "weeks": 604800}


def duration_seconds(text: str) -> float:
    """``"30d"``, ``"1h"``, ``"15 minutes"`` ... in seconds (``ValueError`` otherwise)."""
    match = _DURATION_RE.match(text.lower())
    if not match or match.group(2) not in _DURATION_UNITS or float(match.group(1)) <= 0:
        raise ValueError(f"expected a positive duration such as '30d', '1h' or '15 minutes', "
                         f"got {text!r}")
    return float(match.group(1)) * _DURATION_UNITS[match.group(2)]


class PrivacyConfig(_Strict):
    """Global privacy settings: the budget of every block and the per-query limits."""

    epsilon_per_block: float = Field(gt=0, allow_inf_nan=False)
    delta_per_block: float = Field(default=0.0, ge=0, lt=1)
    # "basic": epsilons (and deltas) add up; "renyi": Rényi-DP curves add up (budget.accounting).
    accounting: Literal["basic", "renyi"] = "basic"
    # Rényi accounting: the share of delta_per_block that pays for queries' own deltas (group-key
    # thresholds); the rest converts Rényi DP back to (epsilon, delta)-DP.
    renyi_delta_share: float = Field(default=0.5, ge=0, lt=1)
    # Where the budget ledger lives: "sqlite:///file" (relative to the policy file), "memory", or
    # "postgresql://..." (several proxies sharing one ledger).  Unset: "sqlite:///<policy file
    # name>.budget.sqlite3" next to the policy file.
    ledger: str | None = None
    # Seconds an identical query (same SQL, epsilon, delta and blocks) is answered again with the
    # same noisy answer, at no cost (budget.answers); 0 turns the cache off.
    answer_cache_seconds: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    default_epsilon: float = Field(default=0.1, gt=0, allow_inf_nan=False)
    default_delta: float = Field(default=0.0, ge=0, lt=1)
    max_epsilon_per_query: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    # The least epsilon a query may ask for: probing (a refused or a tiny query) is never
    # nearly free, as each query costs at least this much on every block it reads.
    min_epsilon_per_query: float = Field(default=0.001, gt=0, allow_inf_nan=False)
    max_delta_per_query: float = Field(default=1e-6, ge=0, lt=1)
    noise: Literal["sql", "proxy"] = "sql"
    scheduler: SchedulerConfig = SchedulerConfig()
    # Share of a query's epsilon spent on the noisy distinct-unit count that decides which
    # non-public group keys may be released (DESIGN.md section 4, "thresholded").
    threshold_epsilon_share: float = Field(default=0.2, gt=0, lt=1)
    # Share of a query's epsilon spent choosing its row cap (tables with contribution = "auto").
    cap_epsilon_share: float = Field(default=0.1, gt=0, lt=1)
    # Seconds during which the cap, clipping bounds and groups per unit chosen by a query are
    # reused by identical queries (same SQL, epsilon, delta and blocks): they are noisy outputs
    # already paid for, so the next query spends no epsilon choosing them; 0: choose every time.
    choice_reuse_seconds: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    # Sensitivity sampling (random DP, DESIGN.md section 8): "analytic" (default) refuses what
    # the analyser cannot bound; "sampled" makes sampled sensitivity the analysts' default.  The
    # analyst's gamma (the chance the guarantee fails over databases drawn from the table's
    # sampling distribution) is at most max_gamma; sampling_m databases are drawn (more if
    # gamma needs it: chorus_py.kinds.sampled).
    sensitivity: Literal["analytic", "sampled"] = "analytic"
    default_gamma: float = Field(default=0.05, gt=0, lt=1)
    max_gamma: float = Field(default=0.05, gt=0, lt=1)
    sampling_m: int = Field(default=2000, ge=1, le=200_000)

    @model_validator(mode="after")
    def _defaults_within_limits(self) -> PrivacyConfig:
        if self.default_gamma > self.max_gamma:
            raise ValueError("default_gamma must not exceed max_gamma")
        if self.default_epsilon > self.max_epsilon_per_query:
            raise ValueError("default_epsilon must not exceed max_epsilon_per_query")
        if self.min_epsilon_per_query > self.max_epsilon_per_query:
            raise ValueError("min_epsilon_per_query must not exceed max_epsilon_per_query")
        if self.default_epsilon < self.min_epsilon_per_query:
            raise ValueError("default_epsilon must not be below min_epsilon_per_query")
        if self.default_delta > self.max_delta_per_query:
            raise ValueError("default_delta must not exceed max_delta_per_query")
        if self.max_epsilon_per_query > self.epsilon_per_block:
            raise ValueError("max_epsilon_per_query must not exceed epsilon_per_block")
        if self.accounting == "renyi" and self.delta_per_block <= 0:
            raise ValueError("accounting = 'renyi' needs delta_per_block > 0 (Rényi DP converts "
                             "to (epsilon, delta)-DP)")
        if self.ledger is not None and not (
                self.ledger == "memory"
                or self.ledger.startswith(("sqlite:///", "postgresql://", "postgres://"))):
            raise ValueError("ledger must be \"memory\", \"sqlite:///file\" or a "
                             "postgresql:// URL")
        return self


class LimitsConfig(_Strict):
    """Bounded cost (DESIGN.md section 11, wall 8): how large a query and its per-row work may be.

    No CASE branch taken for one person's row may be made much slower than another, or the
    query's run time would tell whether that row exists; and no query may make the analyser or
    the database do unbounded work.  Each limit is checked before any budget is touched.
    """

    # Characters of SQL text in one query.
    max_sql_chars: int = Field(default=100_000, ge=100, le=10_000_000)
    # Characters of one literal (a string or a number).
    max_literal_chars: int = Field(default=1024, ge=16, le=1_000_000)
    # Nodes of the parsed statement, and how deeply they nest.
    max_expression_nodes: int = Field(default=2000, ge=10, le=1_000_000)
    max_expression_depth: int = Field(default=64, ge=4, le=1000)
    # Work units per row of one row-level expression, every CASE branch counted (a string
    # function costs the length bound of its input in characters, other nodes 1; a text column
    # is counted as text_column_chars characters).
    max_row_cost: int = Field(default=100_000, ge=100, le=100_000_000)
    text_column_chars: int = Field(default=256, ge=1, le=1_000_000)


class ColumnPolicy(_Strict):
    """One column: its type, and for numbers the clipping bounds that make SUM/AVG possible."""

    type: ColumnType
    lower: float | None = Field(default=None, allow_inf_nan=False)
    upper: float | None = Field(default=None, allow_inf_nan=False)
    public_values: tuple[str | int | float | bool, ...] | None = None
    private_id: bool = False
    # Joins (analyses.joins): a declared upper bound on how many rows share one value of this
    # column.  Pinned, it is used instead of reading the max frequency from the data, and the
    # noise scale of joins on it can be shown exactly.  The data owner guarantees it holds.
    max_frequency: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _bounds_make_sense(self) -> ColumnPolicy:
        if (self.lower is None) != (self.upper is None):
            raise ValueError("give both lower and upper, or neither")
        if self.lower is not None:
            if self.type not in NUMERIC_TYPES:
                raise ValueError(f"bounds only apply to int or float columns, not {self.type}")
            assert self.upper is not None
            if not self.lower <= self.upper:
                raise ValueError("lower must be <= upper")
        if self.public_values is not None and len(self.public_values) == 0:
            raise ValueError("public_values must list at least one value")
        return self

    @property
    def bounded(self) -> bool:
        """True when the column has declared clipping bounds."""
        return self.lower is not None


class BlockConfig(_Strict):
    """How a table is cut into private blocks, on a public schedule.

    Time windows of ``size`` ("1 hour", "1 day", "1 week", "1 month", "3 months", "1 year") on a
    date/timestamp ``column`` (Event and User-Time DP), or ranges of ``size`` ids ("10000 ids")
    of the privacy unit (User DP).  Weeks begin on ``week_start`` (ISO: Monday by default);
    months are calendar months.

    The blocks are declared, never read from the data (DESIGN.md section 11, wall 7): time
    blocks run from ``start`` to ``end`` (exclusive; unset: up to the block holding the current
    UTC time, so a new block appears when its window begins, whatever the data holds); id-range
    blocks cover ``[start, end)``.  Rows outside the schedule belong to no block and are never
    read.  Boundaries lie on the grid of ``size`` (``chorus_py.blockgrid``: fixed steps from
    1970-01-01 00:00 UTC, weeks from their start day, calendar months; for ids, multiples of the
    size), so that editing ``start`` or ``end`` adds or removes whole blocks and never creates
    a block overlapping an existing one (which would bring fresh budget for the same rows).
    """

    column: str
    size: str = "1 day"
    start: datetime | int | None = None
    end: datetime | int | None = None
    # The day weeks begin on (only for sizes in weeks); unset: Monday, as ISO weeks.
    week_start: Literal[WEEKDAYS] | None = None  # type: ignore[valid-type]

    @field_validator("size")
    @classmethod
    def _parse_size(cls, size: str) -> str:
        if not (is_time_size(size) or _IDS_RE.match(size)):
            raise ValueError("expected a window such as '1 hour', '1 day', '1 week' or "
                             "'1 month', or a range of ids such as '10000 ids'")
        return size

    @field_validator("week_start", mode="before")
    @classmethod
    def _day_name(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("start", "end", mode="before")
    @classmethod
    def _parse_bound(cls, value: object) -> object:
        """A TOML date or datetime, an ISO string (UTC unless it has an offset) or an integer
        id; datetimes are kept as naive UTC (the block windows' convention)."""
        if value is None or (isinstance(value, int) and not isinstance(value, bool)):
            return value
        if isinstance(value, str):
            try:
                value = datetime.fromisoformat(value.strip())
            except ValueError:
                raise ValueError("expected a date or timestamp such as \"2026-01-01\" or "
                                 "\"2026-01-01T06:00:00Z\" (UTC unless an offset is given), or "
                                 "an integer id for id-range blocks") from None
        if isinstance(value, datetime):
            if value.tzinfo is not None:
                value = value.astimezone(UTC).replace(tzinfo=None)
            return value
        if isinstance(value, date):
            return datetime(value.year, value.month, value.day)
        raise ValueError("expected a date, a timestamp or an integer id")

    @model_validator(mode="after")
    def _public_schedule(self) -> BlockConfig:
        per = self.ids_per_block
        if self.week_start is not None and not is_week_size(self.size):
            raise ValueError(f"week_start applies to blocks of whole weeks, not "
                             f"'{self.size.strip()}': remove it, or use size = \"1 week\"")
        if per is not None:
            if not isinstance(self.start, int) or not isinstance(self.end, int):
                raise ValueError(
                    f"id-range blocks need their declared range of ids, never derived from the "
                    f"data: add start and end (integers, multiples of {per}), e.g. "
                    f"block = {{ column = \"{self.column}\", size = \"{self.size.strip()}\", "
                    f"start = 0, end = {per * 100} }}")
            for name, bound in (("start", self.start), ("end", self.end)):
                if bound % per:
                    raise ValueError(f"{name} = {bound} is not a multiple of the block size "
                                     f"{per}: use {bound - bound % per} or "
                                     f"{bound - bound % per + per}")
            if self.end <= self.start:
                raise ValueError("end must be greater than start")
        else:
            if self.start is None:
                raise ValueError(
                    "time blocks need the public start of their schedule, never derived from "
                    "the data: add start (UTC), e.g. block = { column = "
                    f"\"{self.column}\", size = \"{self.size.strip()}\", start = \"2026-01-01\" }}"
                    ", and end = \"...\" (exclusive) for data that stops; without end, blocks "
                    "run up to the current time")
            if not isinstance(self.start, datetime) or not isinstance(self.end,
                                                                       datetime | None):
                raise ValueError("start and end of time blocks are dates or timestamps (UTC), "
                                 "e.g. start = \"2026-01-01\"")
            grid = self.grid
            for name, point in (("start", self.start), ("end", self.end)):
                if point is None:
                    continue
                below = grid.boundary(grid.index(point))
                if below != point:
                    raise ValueError(
                        f"{name} = {point.isoformat()} is not on a boundary of "
                        f"'{self.size.strip()}' blocks ({_grid_words(grid)}): use "
                        f"{below.isoformat()} or "
                        f"{grid.boundary(grid.index(point) + 1).isoformat()}"
                        + _thursday_hint(self, point))
            if self.end is not None and self.end <= self.start:
                raise ValueError("end must be later than start")
        count = self.count_at(datetime.now(UTC).replace(tzinfo=None))
        if count > MAX_BLOCKS:
            raise ValueError(f"the schedule has {count} blocks, more than {MAX_BLOCKS} (each "
                             "query reads and charges up to all of them): use larger blocks or "
                             "a later start")
        return self

    @property
    def ids_per_block(self) -> int | None:
        """The width of an id-range block (User DP), or None for time windows."""
        match = _IDS_RE.match(self.size)
        return int(match.group(1)) if match else None

    @property
    def grid(self) -> Grid:
        """Where time blocks begin and end and what they are called (``chorus_py.blockgrid``)."""
        return grid_for(self.size, self.week_start or "monday")

    @property
    def seconds(self) -> int:
        """The window length in seconds (windows of a fixed length only, not months)."""
        grid = self.grid
        if not isinstance(grid, FixedGrid):
            raise ValueError(f"blocks of {self.size!r} are calendar months, of varying length")
        return int(grid.step.total_seconds())

    @property
    def width(self) -> timedelta:
        """The window length (windows of a fixed length only, not months)."""
        return timedelta(seconds=self.seconds)

    @property
    def whole_days(self) -> bool:
        """True when every boundary is a midnight (days, weeks, months)."""
        grid = self.grid
        return isinstance(grid, MonthGrid) or (grid.step % timedelta(days=1) == timedelta(0)
                                               and grid.origin.time() == datetime.min.time())

    @property
    def scheme(self) -> str:
        """How this config cuts its table, in words: the ledger records it per table and refuses
        another (``budget.ledger.Ledger.check_block_schemes``)."""
        per = self.ids_per_block
        cut = f"ranges of {per} ids from 0" if per is not None else self.grid.scheme
        return f"{self.column}: {cut}"

    def names(self, label: str) -> bool:
        """True when ``label`` (a block id without its table) is a block this config can cut,
        at any time (not only in the schedule's current span)."""
        per = self.ids_per_block
        if per is None:
            return self.grid.index_of_label(label) is not None
        match = _ID_RANGE_RE.match(label)
        if match is None or match.group(1) != self.column:
            return False
        lo, hi = int(match.group(2)), int(match.group(3))
        return lo % per == 0 and hi == lo + per - 1

    def count_at(self, now: datetime) -> int:
        """How many blocks the schedule has at ``now`` (naive UTC): a function of the policy
        and the clock only.  Time blocks: those that have begun by ``now``, before ``end``;
        id-range blocks: all of ``[start, end)``."""
        per = self.ids_per_block
        if per is not None:
            assert isinstance(self.start, int) and isinstance(self.end, int)
            return (self.end - self.start) // per
        assert isinstance(self.start, datetime)
        if now < self.start:
            return 0
        grid = self.grid
        first = grid.index(self.start)
        count = grid.index(now) - first + 1
        if isinstance(self.end, datetime):
            count = min(count, grid.index(self.end) - first)
        return count


def _grid_words(grid: Grid) -> str:
    if isinstance(grid, MonthGrid):
        return "the first of a month, 00:00 UTC"
    if grid.step % timedelta(weeks=1) == timedelta(0):
        return f"weeks begin on {weekday_name(grid.origin)}, 00:00 UTC"
    return "counted from 1970-01-01 00:00 UTC"


def _thursday_hint(block: BlockConfig, point: datetime) -> str:
    """Weeks began on Thursdays (1970-01-01) before they had a start day: say how to keep them."""
    if block.week_start is None and is_week_size(block.size) and point.weekday() == 3:
        return ("; or keep the blocks of a policy written before weeks began on Mondays with "
                "week_start = \"thursday\"")
    return ""


class SamplingColumn(_Strict):
    """The distribution of one column in a table's sampling distribution P (random DP)."""

    # uniform(lower, upper); normal(mean, sd); lognormal(mean, sd of the log); exponential(mean);
    # choice: one of ``values`` (with ``weights``, uniform without).
    distribution: Literal["uniform", "normal", "lognormal", "exponential", "choice"]
    lower: float | None = Field(default=None, allow_inf_nan=False)
    upper: float | None = Field(default=None, allow_inf_nan=False)
    mean: float | None = Field(default=None, allow_inf_nan=False)
    sd: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    values: tuple[str | int | float | bool, ...] | None = None
    weights: tuple[float, ...] | None = None

    @model_validator(mode="after")
    def _parameters(self) -> SamplingColumn:
        needs = {"uniform": ("lower", "upper"), "normal": ("mean", "sd"),
                 "lognormal": ("mean", "sd"), "exponential": ("mean",), "choice": ("values",)}
        given = {k for k in ("lower", "upper", "mean", "sd", "values", "weights")
                 if getattr(self, k) is not None}
        wanted = set(needs[self.distribution]) | ({"weights"} if self.distribution == "choice"
                                                  else set())
        missing = set(needs[self.distribution]) - given
        if missing or given - wanted:
            raise ValueError(f"distribution '{self.distribution}' takes "
                             + " and ".join(needs[self.distribution])
                             + (" (and optional weights)" if self.distribution == "choice"
                                else ""))
        if self.distribution == "uniform":
            assert self.lower is not None and self.upper is not None
            if not self.lower < self.upper:
                raise ValueError("lower must be < upper")
        if self.distribution == "exponential" and not (self.mean or 0) > 0:
            raise ValueError("the mean of an exponential must be > 0")
        if self.values is not None and not self.values:
            raise ValueError("values must list at least one value")
        if self.weights is not None:
            assert self.values is not None
            if len(self.weights) != len(self.values) or any(
                    not (w >= 0 and w < float("inf")) for w in self.weights) \
                    or sum(self.weights) <= 0:
                raise ValueError("weights: one non-negative weight per value, not all 0")
        return self


class SamplingConfig(_Strict):
    """A table's sampling distribution P for sensitivity sampling (random DP, never the data).

    ``reference``: a public table of the policy whose rows are drawn uniformly (P is its
    empirical distribution); otherwise each column the query reads is drawn independently from
    ``columns`` or, when not listed there, uniformly from its declared bounds or public_values.
    ``rows``: n, the size of the databases drawn (public; default: the reference's row count).
    """

    reference: str | None = None
    rows: int | None = Field(default=None, ge=2, le=10_000_000)
    columns: dict[str, SamplingColumn] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_source(self) -> SamplingConfig:
        if self.reference is not None and self.columns:
            raise ValueError("give a reference table or column distributions, not both")
        if self.reference is None and self.rows is None:
            raise ValueError("without a reference table, rows (n, the size of the sampled "
                             "databases) is required")
        return self


class AttributionTable(_Strict):
    """``privacy_unit`` as a table of (row id, unit id) pairs: a row belongs to many units.

    E.g. ``{ table = "paper_authors", row_id = "paper_id", unit_id = "author_id" }``: the
    table's ``row_id`` column (``row_id`` of the table policy, by default the same name) joins
    ``paper_authors.paper_id``.
    """

    table: str
    row_id: str
    unit_id: str


class BalanceConfig(_Strict):
    """``attribution_method = "greedy-balanced"``: c1 rows with <= u units, then c2 with more."""

    u: int = Field(default=2, ge=1)
    c1: int = Field(default=1, ge=1)
    c2: int = Field(default=1, ge=1)


AttributionMethod = Literal["greedy", "greedy-sparse", "sql-rank", "greedy-balanced", "ilp"]


class TablePolicy(_Strict):
    """A table: public (free to read) or private (every query pays for the blocks it reads)."""

    public: bool = False
    # One column; several columns (a trip: ["rider_id", "driver_id"]), or an attribution table
    # (a paper: its authors), for rows that belong to several units (rewriters.attribution).
    privacy_unit: str | tuple[str, ...] | AttributionTable | None = None
    max_rows_per_unit: int | None = Field(default=None, gt=0)
    block: BlockConfig | None = None
    # "per-query": every query keeps <= k random rows per unit of its own filtered rows (most
    # accurate).  "materialized": the proxy stores one random sample of <= k rows per unit in its
    # own schema, rebuilt when the table changes, and queries filter that sample (much faster on
    # large tables; filtered queries keep fewer rows of units with more than k rows).
    bounding: Literal["per-query", "materialized"] = "per-query"
    # Per-query bounding reads a copy of the table the proxy keeps in its schema, each row with
    # its random rank in its unit and its unit's row count (chorus_py.stores.samples): units
    # with at most k rows are kept whole without a sort, the same kept rows in distribution,
    # several times faster.  It costs the table's size in storage, rebuilt when the table
    # changes.  false: every query ranks its filtered rows itself.
    ranked_copy: bool = True
    # "auto": max_rows_per_unit is a hard limit and each query picks its own cap k below it,
    # privately, from a noisy histogram of rows per unit (privacy.cap_epsilon_share of its
    # epsilon); "fixed": every query uses max_rows_per_unit.
    contribution: Literal["auto", "fixed"] = "auto"
    # "auto": each SUM/AVG/VARIANCE/STDDEV clips its values to bounds chosen per query inside
    # the declared [lower, upper], privately (mechanisms.clip_bounds), paid from the same
    # cap_epsilon_share; "fixed": the declared bounds.  Unset: "auto" when the table has a
    # privacy_unit and contribution = "auto", else "fixed".
    clipping: Literal["auto", "fixed"] | None = None
    columns: dict[str, ColumnPolicy] = Field(default_factory=dict)
    # P for sensitivity sampling (random DP); None: sampled mode is refused on this table.
    sampling: SamplingConfig | None = None
    # Several units per row: a unique int column naming each row (the kept set S stores them),
    # how S is chosen, and the balance of "greedy-balanced" (rewriters.attribution).
    row_id: str | None = None
    attribution_method: AttributionMethod | None = None
    attribution_balance: BalanceConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _attribution_defaults(cls, data: object) -> object:
        # Several units per row are bounded by one stored selection S (fixed cap, materialised):
        # those are the defaults, and other values are refused by _attribution.
        if isinstance(data, dict) and isinstance(data.get("privacy_unit"), list | tuple | dict):
            return {"contribution": "fixed", "bounding": "materialized", **data}
        return data

    @model_validator(mode="after")
    def _attribution(self) -> TablePolicy:
        check_attribution(self)
        return self

    @model_validator(mode="after")
    def _consistent(self) -> TablePolicy:
        if self.sampling is not None:
            unknown = [c for c in self.sampling.columns if c not in self.columns]
            if self.public or unknown:
                raise ValueError("sampling applies to private tables, to declared columns ("
                                 + ", ".join(unknown) + " not declared)" if unknown else
                                 "a public table takes no sampling distribution")
        if self.public:
            if self.privacy_unit or self.max_rows_per_unit or self.block:
                raise ValueError("a public table takes no privacy_unit, max_rows_per_unit or block")
            return self
        if not self.columns:
            raise ValueError("a private table must declare its columns")
        if self.privacy_unit is not None and not self.multi_attribution:
            if self.privacy_unit not in self.columns:
                raise ValueError(f"privacy_unit '{self.privacy_unit}' is not a declared column")
            if self.max_rows_per_unit is None:
                raise ValueError("a table with a privacy_unit needs max_rows_per_unit")
        elif self.privacy_unit is None and self.max_rows_per_unit is not None:
            raise ValueError("max_rows_per_unit needs a privacy_unit")
        if self.bounding == "materialized" and self.privacy_unit is None:
            raise ValueError("bounding = 'materialized' needs a privacy_unit")
        if self.block is not None:
            col = self.columns.get(self.block.column)
            if col is None:
                raise ValueError(f"block column '{self.block.column}' is not a declared column")
            if self.block.ids_per_block is not None:
                # User DP: all rows of a unit must fall in one block, so the blocks are ranges
                # of the unit's own (integer) id.
                if self.block.column != self.privacy_unit or col.type != "int":
                    raise ValueError("id-range blocks ('N ids') must be on the privacy_unit "
                                     "column, of type int")
            elif col.type not in ("date", "timestamp"):
                raise ValueError("block column must be of type date or timestamp (or the int "
                                 "privacy_unit with size = 'N ids')")
            elif col.type == "date" and not self.block.whole_days:
                # A date is its midnight: a sub-day window could only be restricted by whole
                # days, reading rows of the day's first block while charging another.
                raise ValueError("blocks of a date column must be whole days (e.g. '1 day', "
                                 "'1 week'); use a timestamp column for shorter blocks")
        return self

    @property
    def contribution_bound(self) -> int:
        """Rows one privacy unit may contribute: max_rows_per_unit, or 1 for event-level DP."""
        return self.max_rows_per_unit or 1

    @property
    def multi_attribution(self) -> bool:
        """True when a row may belong to several privacy units (a list or an attribution table)."""
        return isinstance(self.privacy_unit, tuple | AttributionTable)

    @property
    def unit_columns(self) -> tuple[str, ...]:
        """The columns naming the row's units (none for an attribution table)."""
        unit = self.privacy_unit
        return (unit,) if isinstance(unit, str) else unit if isinstance(unit, tuple) else ()

    @property
    def unit_label(self) -> str | None:
        """The privacy unit for reports: a column name, or the several units of a row."""
        unit = self.privacy_unit
        if isinstance(unit, tuple):
            return "unit of (" + ", ".join(unit) + ")"
        if isinstance(unit, AttributionTable):
            return f"unit of {unit.table}.{unit.unit_id}"
        return unit

    @property
    def auto_clipping(self) -> bool:
        """True when sums clip to bounds chosen per query (``clipping``, or its default)."""
        if self.clipping is not None:
            return self.clipping == "auto"
        return self.privacy_unit is not None and self.contribution == "auto"


def check_attribution(tp: TablePolicy) -> None:
    """Policy rules of tables whose rows belong to several units (``ValueError`` if broken)."""
    unit = tp.privacy_unit
    if not tp.multi_attribution:
        if tp.row_id is not None or tp.attribution_method is not None \
                or tp.attribution_balance is not None:
            raise ValueError("row_id, attribution_method and attribution_balance apply only to "
                             "a privacy_unit with several units per row (a list of columns or "
                             "{ table, row_id, unit_id })")
        return
    if tp.public:
        raise ValueError("a public table takes no privacy_unit")
    if tp.max_rows_per_unit is None:
        raise ValueError("a table with a privacy_unit needs max_rows_per_unit")
    if tp.contribution != "fixed" or tp.bounding != "materialized":
        raise ValueError("with several units per row the proxy keeps one stored selection S of "
                         "rows (at most max_rows_per_unit per unit), chosen once from the whole "
                         "table: set contribution = \"fixed\" and bounding = \"materialized\" "
                         "(the defaults for such tables), a per-query cap or sample would depend "
                         "on other units' rows")
    if isinstance(unit, tuple):
        if len(set(unit)) < 2:
            raise ValueError("a list privacy_unit names at least two different columns (use a "
                             "string for one)")
        missing = [c for c in unit if c not in tp.columns]
        if missing:
            raise ValueError(f"privacy_unit '{missing[0]}' is not a declared column")
        types = {tp.columns[c].type for c in unit}
        if len(types) > 1 or not types <= {"int", "text"}:
            raise ValueError("the privacy_unit columns must share one type, int or text: a "
                             "value names the same unit in every column")
        if tp.row_id is None:
            raise ValueError("a privacy_unit with several columns needs row_id = \"<a unique "
                             "int column>\", by which the proxy stores the rows it keeps")
    row_id = tp.row_id or (unit.row_id if isinstance(unit, AttributionTable) else None)
    if row_id not in tp.columns or tp.columns[row_id].type != "int":
        raise ValueError(f"row_id '{row_id}' must be a declared int column (unique per row)")
    if tp.attribution_balance is not None and tp.attribution_method != "greedy-balanced":
        raise ValueError("attribution_balance applies only to attribution_method = "
                         "\"greedy-balanced\"")


def _sha256_hex(value: str | None) -> str | None:
    if value is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", value):
        raise ValueError("expected the SHA-256 of the token as 64 hex digits, e.g. from "
                         "`printf %s TOKEN | sha256sum`")
    return None if value is None else value.lower()


class AnalystPolicy(_Strict):
    """An analyst. Credentials (SCRAM verifier, REST token hash) belong to the front doors."""

    password: str | None = None
    # SHA-256 (hex) of the analyst's REST bearer token, or a list of them: two at once while a
    # token is rotated (`chorus token add`, then `chorus token revoke` of the old one).  The
    # tokens themselves are never stored.
    token_sha256: str | tuple[str, ...] | None = None
    max_epsilon_per_query: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    # The most this analyst may spend on any one block, in total (the sum of the epsilons of
    # their queries that read it); unset: only the block's own budget limits them.
    max_epsilon_per_block: float | None = Field(default=None, gt=0, allow_inf_nan=False)

    @field_validator("token_sha256")
    @classmethod
    def _token_hash(cls, value: str | tuple[str, ...] | None
                    ) -> str | tuple[str, ...] | None:
        if isinstance(value, tuple):
            digests = tuple(_sha256_hex(v) or "" for v in value)
            if not digests or len(set(digests)) != len(digests):
                raise ValueError("list each token's SHA-256 once (at least one)")
            return digests
        return _sha256_hex(value)

    @property
    def token_digests(self) -> tuple[str, ...]:
        """Every SHA-256 under which this analyst's REST tokens are accepted."""
        value = self.token_sha256
        return () if value is None else (value,) if isinstance(value, str) else value

    @field_validator("password")
    @classmethod
    def _scram_verifier(cls, value: str | None) -> str | None:
        # Only a SCRAM-SHA-256 verifier (Postgres's format) is accepted, never a plain password.
        if value is not None and not _SCRAM_RE.fullmatch(value):
            raise ValueError("expected a SCRAM-SHA-256 verifier 'SCRAM-SHA-256$<iterations>:"
                             "<salt>$<StoredKey>:<ServerKey>' from `chorus passwd`, never a "
                             "plain password")
        return value


_SCRAM_RE = re.compile(r"SCRAM-SHA-256\$[1-9][0-9]*:[A-Za-z0-9+/]+={0,2}\$"
                       r"[A-Za-z0-9+/]{43}=:[A-Za-z0-9+/]{43}=")


class ServerConfig(_Strict):
    """Settings of the network front doors shared by all analysts."""

    # SHA-256 (hex) of the data owner's token: it opens the budget dashboard, /metrics and every
    # analyst's budget over REST.  Without it those pages stay closed.
    owner_token_sha256: str | None = None
    # Wire protocol: TLS certificate and key (PEM files, relative to the policy file); without
    # them clients that ask for TLS are told it is not available.
    tls_cert: str | None = None
    tls_key: str | None = None
    # Wire protocol: "require" refuses every connection that did not start TLS first (passwords
    # and answers never cross the network in the clear); "optional" lets the client choose.
    # Also accepted as ``ssl`` (Postgres's own word for it).
    tls: Literal["optional", "require"] = Field(
        default="optional", validation_alias=AliasChoices("tls", "ssl"))
    max_connections: int = Field(default=100, gt=0)
    # A client must finish logging in within login_timeout_seconds; an idle one is disconnected
    # after idle_timeout_seconds; a statement running longer than statement_timeout_seconds is
    # cancelled (default: backend.statement_timeout_seconds).
    login_timeout_seconds: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    idle_timeout_seconds: float = Field(default=3600.0, gt=0, allow_inf_nan=False)
    statement_timeout_seconds: float | None = Field(default=None, gt=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _tls_pair(self) -> ServerConfig:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("give both tls_cert and tls_key, or neither")
        if self.tls == "require" and self.tls_cert is None:
            raise ValueError('tls = "require" needs a certificate: give tls_cert and tls_key '
                             "(PEM files, paths relative to the policy file)")
        return self

    @field_validator("owner_token_sha256")
    @classmethod
    def _token_hash(cls, value: str | None) -> str | None:
        return _sha256_hex(value)


class Policy(_Strict):
    """The whole policy file."""

    backend: BackendConfig
    privacy: PrivacyConfig
    tables: dict[str, TablePolicy]
    analysts: dict[str, AnalystPolicy] = Field(default_factory=dict)
    server: ServerConfig = ServerConfig()
    limits: LimitsConfig = LimitsConfig()
    source: str = "<memory>"

    @field_validator("tables")
    @classmethod
    def _lowercase_names(cls, tables: dict[str, TablePolicy]) -> dict[str, TablePolicy]:
        for name, table in tables.items():
            if name != name.lower() or any(c != c.lower() for c in table.columns):
                raise ValueError(f"table and column names must be lower case ('{name}')")
        for name, table in tables.items():
            ref = table.sampling.reference if table.sampling is not None else None
            if ref is not None and (ref not in tables or not tables[ref].public):
                raise ValueError(f"{name}.sampling.reference: '{ref}' must be a public table "
                                 "of the policy")
        return tables

    @model_validator(mode="before")
    @classmethod
    def _noise_by_backend(cls, data: object) -> object:
        """Where the noise is drawn when the policy does not say: by the proxy on Spark and on
        DuckDB, by the database on Postgres.

        - Spark (and the proxy only): Spark evaluates ``rand()`` per partition and evaluates a
          partition again when a task is retried or a plan reads a subquery twice, so a noisy
          value drawn in Spark could differ between two reads of one answer (two draws of the
          noise, twice the privacy loss); the proxy draws it once, from os.urandom.
        - DuckDB runs inside the proxy's process, so its exact aggregates are in that process's
          memory wherever the noise is drawn: the proxy draws it from os.urandom rather than
          DuckDB's pseudo-random generator, and skips the noise expressions, which DuckDB
          sets up at every run (about 0.15 ms an operator, 0.6 ms a measurement: 0.3-1.7 ms a
          query on the demo, ``benchmarks/RESULTS.md``).
        - Postgres draws it in SQL: the exact aggregates never leave the database."""
        if isinstance(data, dict):
            backend, privacy = data.get("backend"), data.get("privacy")
            url = str(backend.get("url", "")) if isinstance(backend, dict) else ""
            if url.startswith(("spark://", "sc://", "duckdb://")) \
                    and isinstance(privacy, dict) and "noise" not in privacy:
                return {**data, "privacy": {**privacy, "noise": "proxy"}}
        return data

    @model_validator(mode="after")
    def _spark_noise_by_proxy(self) -> Policy:
        if self.backend.dialect == "spark" and self.privacy.noise != "proxy":
            raise ValueError("privacy.noise = \"sql\" is not available on Spark (its rand() is "
                             "drawn again when a task is retried): remove the setting, the proxy "
                             "then adds the noise (\"proxy\")")
        return self

    @model_validator(mode="after")
    def _analyst_limits_above_the_floor(self) -> Policy:
        floor = self.privacy.min_epsilon_per_query
        for name, analyst in self.analysts.items():
            limit = analyst.max_epsilon_per_query
            if limit is not None and limit < floor:
                raise ValueError(
                    f"analysts.{name}.max_epsilon_per_query ({limit:g}) is below "
                    f"privacy.min_epsilon_per_query ({floor:g}): they could ask nothing")
        return self

    def table(self, name: str) -> TablePolicy | None:
        """The policy of a table, by (lower-case) name."""
        return self.tables.get(name.lower())

    def check_against(self, live_columns: Mapping[str, Mapping[str, str]]) -> None:
        """Fail if a declared table or column is missing from the database.

        ``live_columns`` maps each table of the database to its columns (name -> type).
        """
        for name, table in self.tables.items():
            if name not in live_columns:
                raise PolicyError(
                    f"{self.source}: tables.{name}: the database has no table '{name}'",
                    hint="create the table, or remove it from the policy",
                )
            missing = [c for c in table.columns if c not in live_columns[name]]
            if missing:
                raise PolicyError(
                    f"{self.source}: tables.{name}.columns.{missing[0]}: "
                    f"the table '{name}' has no column '{missing[0]}'",
                    hint=f"columns in the database: {', '.join(sorted(live_columns[name]))}",
                )
            unit = table.privacy_unit
            if isinstance(unit, AttributionTable):
                lacking = [c for c in (unit.row_id, unit.unit_id)
                           if c not in live_columns.get(unit.table, {})]
                if lacking:
                    raise PolicyError(
                        f"{self.source}: tables.{name}.privacy_unit: the attribution table "
                        f"'{unit.table}' is missing or has no column '{lacking[0]}'",
                        hint="create it with one row per (row id, unit id) pair")


def block_schemes(policy: Policy) -> dict[str, tuple[str, Callable[[str], bool]]]:
    """Per private table: how its blocks are cut (in words), and a test of whether a ledger's
    block id is one of them.  A table without a block config is one block, named by the table.
    """
    out: dict[str, tuple[str, Callable[[str], bool]]] = {}
    for name, table in policy.tables.items():
        if table.public:
            continue
        block = table.block
        if block is None:
            out[name] = ("one block: the whole table", lambda i, n=name: i == n)
        else:
            prefix = f"{name}/"
            out[name] = (block.scheme, lambda i, p=prefix, b=block: i.startswith(p)
                         and b.names(i[len(p):]))
    return out


def _format_error(source: str, err: ValidationError) -> str:
    lines = []
    for item in err.errors():
        key = ".".join(str(p) for p in item["loc"]) or "(top level)"
        msg = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            msg = "unknown key (check its spelling against examples/policy.toml)"
        elif item["type"] == "missing":
            msg = "required key is missing"
        lines.append(f"{source}: {key}: {msg}")
    return "\n".join(lines)


def parse_policy(data: Mapping[str, object], source: str = "<memory>") -> Policy:
    """Validate an already-parsed TOML document."""
    if "source" in data:  # an internal field: the file name, never read from the file
        raise PolicyError(f"{source}: source: unknown key (check its spelling against "
                          "examples/policy.toml)")
    try:
        return Policy.model_validate({**data, "source": source})
    except ValidationError as err:
        raise PolicyError(_format_error(source, err)) from None


def load_policy(path: str | Path) -> Policy:
    """Read and validate a policy file; errors name the file, the key and what is expected."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise PolicyError(f"{path}: cannot read the policy file ({err.strerror})") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise PolicyError(f"{path}: not valid TOML: {err}") from None
    policy = parse_policy(data, source=str(path))
    url = policy.backend.url
    # "duckdb:///x.duckdb" is relative to the policy file, so a policy travels with its data;
    # "duckdb:////abs/x.duckdb" is absolute (the SQLAlchemy convention).
    if url.startswith("duckdb:///") and not url.startswith("duckdb:///:memory:"):
        db_path = Path(url.removeprefix("duckdb:///"))
        if not db_path.is_absolute():
            resolved = (path.parent / db_path).resolve()
            backend = policy.backend.model_copy(update={"url": f"duckdb:///{resolved}"})
            policy = policy.model_copy(update={"backend": backend})
    spark = policy.backend.spark
    if spark is not None and not url.startswith("sc://"):  # sc://: the cluster's paths
        # Like the DuckDB file, the Parquet paths are relative to the policy file.
        def under(p: str) -> str:
            return str((path.parent / p).resolve())

        private = spark.private_dir or f"{path.name}.spark-private"
        spark = spark.model_copy(update={
            "tables": {name: under(p) for name, p in spark.tables.items()},
            "warehouse": under(spark.warehouse) if spark.warehouse is not None else None,
            "private_dir": under(private)})
        policy = policy.model_copy(update={
            "backend": policy.backend.model_copy(update={"spark": spark})})
    return policy


