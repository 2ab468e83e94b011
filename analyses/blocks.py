"""Which private blocks a query reads: a conservative interval analysis of its WHERE clause.

The analysis computes a union of intervals of the block column outside which the WHERE clause
cannot be true, and returns the blocks those intervals touch, as runs of consecutive blocks.

- ``=``, ``<``, ``<=``, ``>``, ``>=``, ``BETWEEN``, ``IN (...)`` between the block column and a
  literal narrow it; ``AND`` intersects, ``OR`` unions, ``NOT`` is pushed down (De Morgan;
  ``NOT (c < x)`` is ``c >= x``, ``NOT (c BETWEEN a AND b)`` is ``c < a OR c > b``).
  ``c IS NULL`` reads no block (a row whose block column is NULL belongs to no block and is never
  read).  Anything else (other columns, ``<>``, ``NOT IN``, functions of the column, subqueries,
  ``CURRENT_DATE``) does not narrow it: when the analysis cannot tell, every block is read.
- Literals: ``'2026-01-01'``, ``'2026-01-01 12:00[:00[.ffffff]]'``, ISO offsets (``+02:00``,
  ``Z``), ``DATE '...'``, ``TIMESTAMP '...'``, ``TIMESTAMPTZ '...'``, ``CAST('...' AS ...)``,
  ``'...'::date``; numbers (and numeric strings) for id-range blocks.
- The column may be wrapped in a cast to its own type, or cast to ``DATE`` (``c::date``,
  ``CAST(c AS DATE)``, ``DATE(c)``): ``c::date = d`` reads the day ``[d, d + 1 day)``, etc.

**Time zones.**  Block windows are UTC (``chorus_py.stores.schedules``: a ``timestamp`` without time
zone is read as UTC).  A literal without an offset is taken as written (UTC).  When the database
could read a literal in more than one way, the analysis takes every reading and covers them all:

- a literal with an offset compared with a ``timestamp`` column: Postgres drops the offset
  (``'2026-01-01 00:00+02'::timestamp`` is midnight), DuckDB converts to UTC (22:00 the day
  before): both instants are covered;
- a ``TIMESTAMPTZ`` literal: the database compares in its session time zone, unknown here, so
  the literal covers 14 hours either side of its instant (every offset in use);
- a literal with a time compared with a ``date`` column: both the day (truncated) and the instant.

Soundness does not rest on this analysis: the rewriter restricts the rewritten query to exactly
the blocks returned here (as one window per run of consecutive blocks), so a query never reads a
row of a block it did not pay for.  Over-approximating costs budget; an under-approximation
would only drop rows from the answer, never leak.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Any

from sqlglot import exp

from analyses.query import AggregateQuery

Point = Any  # datetime (time windows) or int/float (id ranges)
# An interval: (low, low inclusive, high, high inclusive); None = unbounded on that side.
Interval = tuple[Point | None, bool, Point | None, bool]
IntervalSet = list[Interval]

ALL: IntervalSet = [(None, False, None, False)]
EMPTY: IntervalSet = []

_DAY = timedelta(days=1)
_TZ_SPREAD = timedelta(hours=14)  # the largest UTC offset in use (UTC+14; UTC-12 is inside)


@dataclass(frozen=True)
class BlockWindows:
    """Consecutive windows: block i is [bound(i), bound(i + 1)) for 0 <= i < count.

    ``width`` cuts them: ranges of ``width`` privacy-unit ids from an int ``start`` (User DP;
    ``column`` names the unit); windows of one fixed length (a timedelta) from a datetime
    ``start``; or a grid (``chorus_py.blockgrid``: calendar months, ISO weeks) with ``start`` on
    one of its boundaries.
    """

    table: str
    start: Any
    width: Any
    count: int
    column: str = ""

    @property
    def end(self) -> Any:
        """End of the last window."""
        return self.bound(self.count)

    def bound(self, i: int) -> Any:
        """The start of block i (``bound(count)`` is the end of the last one)."""
        if isinstance(self.width, int | timedelta):
            return self.start + self.width * i
        return self.width.boundary(self._first + i)

    def index(self, point: Point) -> int:
        """The i whose window [bound(i), bound(i + 1)) holds ``point`` (may lie outside
        0..count - 1)."""
        if isinstance(self.width, timedelta):
            return (point - self.start) // self.width
        if isinstance(self.width, int):
            return math.floor((point - self.start) / self.width)
        return self.width.index(point) - self._first

    @cached_property
    def _first(self) -> int:
        return self.width.index(self.start)

    def ids(self) -> tuple[str, ...]:
        """Block ids such as ``trips/2026-01-01`` (time shown when windows are sub-day),
        ``trips/2026-01`` (calendar months), ``trips/2026-W03`` (ISO weeks), or
        ``trips/rider_id:0-9999`` for id ranges."""
        return self._ids

    @cached_property
    def _ids(self) -> tuple[str, ...]:
        # Computed once per windows object (kept per table until the schedule grows): every
        # query over the table asks for them (about 90 date labels for a quarter of days).
        if isinstance(self.width, int):
            return tuple(f"{self.table}/{self.column}:{lo}-{lo + self.width - 1}"
                         for lo in range(self.start, self.start + self.width * self.count,
                                         self.width))
        if not isinstance(self.width, timedelta):
            return tuple(f"{self.table}/{self.width.label(self._first + i)}"
                         for i in range(self.count))
        daily = self.width % timedelta(days=1) == timedelta(0)
        out = []
        for i in range(self.count):
            start = self.start + self.width * i
            label = start.date().isoformat() if daily else start.isoformat(timespec="minutes")
            out.append(f"{self.table}/{label}")
        return tuple(out)


@dataclass(frozen=True)
class BlocksRead:
    """The block ids a query is charged on, and the windows they cover.

    ``runs`` are the half-open windows [start, end) of each run of consecutive blocks; ``start``
    and ``end`` span all of them.
    """

    ids: tuple[str, ...]
    start: Point
    end: Point
    runs: tuple[tuple[Point, Point], ...] = ()

    @property
    def separate_runs(self) -> tuple[tuple[Point, Point], ...]:
        """The runs when they are not contiguous (one window each), else () (start..end)."""
        return self.runs if len(self.runs) > 1 else ()


def blocks_read(query: AggregateQuery, windows: BlockWindows) -> BlocksRead:
    """The windows of ``windows`` that the query's WHERE clause can reach.

    >>> from datetime import datetime, timedelta
    >>> w = BlockWindows("t", datetime(2026, 1, 1), timedelta(days=1), 10)
    >>> where = _parse("d < '2026-01-03' OR d IN ('2026-01-06', DATE '2026-01-07')")
    >>> [(a.day, b.day) for a, b in _runs(interval_set(where, "d", "timestamp"), w)]
    [(1, 3), (6, 8)]
    """
    block = query.table_policy.block
    assert block is not None
    column_type = query.table_policy.columns[block.column].type
    return read_windows(interval_set(query.where, block.column, column_type), windows)


def read_windows(intervals: IntervalSet, windows: BlockWindows) -> BlocksRead:
    """The blocks of ``windows`` that ``intervals`` touch."""
    runs = _runs(intervals, windows)
    if not runs:
        return BlocksRead((), windows.start, windows.start, ())
    all_ids = windows.ids()
    ids: list[str] = []
    for lo, hi in runs:
        ids.extend(all_ids[windows.index(lo):windows.index(hi)])
    return BlocksRead(tuple(ids), runs[0][0], runs[-1][1], tuple(runs))


def _runs(intervals: IntervalSet, windows: BlockWindows) -> list[tuple[Point, Point]]:
    """Merged runs [start, end) of the blocks the intervals touch."""
    if windows.count == 0:
        return []
    spans = []
    for lo, _lo_incl, hi, hi_incl in intervals:
        first = 0 if lo is None else windows.index(lo)
        last = windows.count - 1
        if hi is not None:
            last = windows.index(hi)
            if not hi_incl and windows.bound(last) == hi:  # "< boundary": the block before
                last -= 1
        first, last = max(first, 0), min(last, windows.count - 1)
        if first <= last:
            spans.append((first, last))
    spans.sort()
    merged: list[list[int]] = []
    for first, last in spans:
        if merged and first <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], last)
        else:
            merged.append([first, last])
    return [(windows.bound(a), windows.bound(b + 1)) for a, b in merged]


# -- the abstract interpretation ------------------------------------------------------------
def interval_set(where: exp.Expr | None, column: str, column_type: str,
                 negated: bool = False) -> IntervalSet:
    """Values of ``column`` for which ``where`` (or NOT where) can be true."""
    if where is None:
        return EMPTY if negated else ALL
    node = where
    if isinstance(node, exp.Paren):
        return interval_set(node.this, column, column_type, negated)
    if isinstance(node, exp.Not):
        return interval_set(node.this, column, column_type, not negated)
    if isinstance(node, exp.And | exp.Or):
        parts = [interval_set(p, column, column_type, negated) for p in node.flatten()]
        conjunction = isinstance(node, exp.And) != negated  # De Morgan
        return _intersect_all(parts) if conjunction else _union(parts)
    if isinstance(node, exp.Boolean):
        return ALL if node.this != negated else EMPTY
    if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null) and _column_of(
            node.this, column, column_type) is not None:
        is_null = not node.args.get("negate")  # sqlglot writes IS NOT NULL as negate=True
        return ALL if negated == is_null else EMPTY
    if isinstance(node, exp.Between):
        return _between(node, column, column_type, negated)
    if isinstance(node, exp.In):
        return _in(node, column, column_type, negated)
    if isinstance(node, exp.EQ | exp.NEQ | exp.GT | exp.GTE | exp.LT | exp.LTE):
        return _comparison(node, column, column_type, negated)
    return ALL


_FLIP = {exp.GT: "<", exp.GTE: "<=", exp.LT: ">", exp.LTE: ">=", exp.EQ: "=", exp.NEQ: "<>"}
_OPS = {exp.GT: ">", exp.GTE: ">=", exp.LT: "<", exp.LTE: "<=", exp.EQ: "=", exp.NEQ: "<>"}
_NOT = {">": "<=", ">=": "<", "<": ">=", "<=": ">", "=": "<>", "<>": "="}


def _comparison(node: exp.Expr, column: str, column_type: str, negated: bool) -> IntervalSet:
    left, right = node.this, node.expression
    op = _OPS[type(node)]
    wrap = _column_of(left, column, column_type)
    if wrap is None:
        wrap = _column_of(right, column, column_type)
        if wrap is None:
            return ALL
        left, right, op = right, left, _FLIP[type(node)]
    value = _literal(right, column_type, wrap)
    if value is None:
        return ALL
    if negated:
        op = _NOT[op]
    return _constraint(op, value, wrap)


def _between(node: exp.Between, column: str, column_type: str, negated: bool) -> IntervalSet:
    wrap = _column_of(node.this, column, column_type)
    if wrap is None:
        return ALL
    low = _literal(node.args["low"], column_type, wrap)
    high = _literal(node.args["high"], column_type, wrap)
    if node.args.get("symmetric"):
        if negated or low is None or high is None:
            return ALL
        low = high = (min(low[0], high[0]), max(low[1], high[1]))
    if negated:
        # NOT (c BETWEEN a AND b) = c < a OR c > b
        parts = []
        parts.append(ALL if low is None else _constraint("<", low, wrap))
        parts.append(ALL if high is None else _constraint(">", high, wrap))
        return _union(parts)
    parts = [ALL if low is None else _constraint(">=", low, wrap),
             ALL if high is None else _constraint("<=", high, wrap)]
    return _intersect_all(parts)


def _in(node: exp.In, column: str, column_type: str, negated: bool) -> IntervalSet:
    wrap = _column_of(node.this, column, column_type)
    if wrap is None or negated or node.args.get("query") is not None:
        return ALL
    values = [_literal(v, column_type, wrap) for v in node.expressions]
    if not values or any(v is None for v in values):
        return ALL
    return _union([_constraint("=", v, wrap) for v in values if v is not None])


def _constraint(op: str, value: tuple[Point, Point], wrap: str) -> IntervalSet:
    """Values of the column with ``wrap(column) op v`` for some v in [value[0], value[1]]."""
    lo, hi = value
    if wrap == "date":
        # The column truncated to its day: trunc(c) op v, v a day or an instant.
        if op in (">", ">="):
            # trunc(c) >= v <=> c >= ceil_day(v);  trunc(c) > v <=> c >= trunc(v) + 1 day
            start = _ceil_day(lo) if op == ">=" else _trunc_day(lo) + _DAY
            return [(start, True, None, False)]
        if op in ("<", "<="):
            # trunc(c) < v <=> c < ceil_day(v);  trunc(c) <= v <=> c < trunc(v) + 1 day
            end = _ceil_day(hi) if op == "<" else _trunc_day(hi) + _DAY
            return [(None, False, end, False)]
        if op == "=":
            return [(_trunc_day(lo), True, _trunc_day(hi) + _DAY, False)]
        return ALL
    if op == ">":
        return [(lo, False, None, False)]
    if op == ">=":
        return [(lo, True, None, False)]
    if op == "<":
        return [(None, False, hi, False)]
    if op == "<=":
        return [(None, False, hi, True)]
    if op == "=":
        return [(lo, True, hi, True)]
    return ALL  # <>: every block may hold other values


def _intersect_all(parts: list[IntervalSet]) -> IntervalSet:
    out = ALL
    for part in parts:
        out = [iv for a in out for b in part if (iv := _intersect(a, b)) is not None]
    return out


def _intersect(a: Interval, b: Interval) -> Interval | None:
    lo, lo_incl = _max_low((a[0], a[1]), (b[0], b[1]))
    hi, hi_incl = _min_high((a[2], a[3]), (b[2], b[3]))
    if lo is not None and hi is not None and (lo > hi or (lo == hi and not (lo_incl
                                                                         and hi_incl))):
        return None
    return lo, lo_incl, hi, hi_incl


def _max_low(a: tuple[Point | None, bool], b: tuple[Point | None, bool]) -> tuple[Any, bool]:
    if a[0] is None:
        return b
    if b[0] is None:
        return a
    if a[0] != b[0]:
        return a if a[0] > b[0] else b
    return a[0], a[1] and b[1]


def _min_high(a: tuple[Point | None, bool], b: tuple[Point | None, bool]) -> tuple[Any, bool]:
    if a[0] is None:
        return b
    if b[0] is None:
        return a
    if a[0] != b[0]:
        return a if a[0] < b[0] else b
    return a[0], a[1] and b[1]


def _union(parts: list[IntervalSet]) -> IntervalSet:
    return [iv for part in parts for iv in part]


# -- column and literal recognition --------------------------------------------------------
def _column_of(node: exp.Expr, column: str, column_type: str) -> str | None:
    """``"id"`` if node is the column (or a cast of it to its own type), ``"date"`` if it is the
    column truncated to its day, else None."""
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Column):
        return "id" if node.name == column else None
    if isinstance(node, exp.Date) and len(node.expressions) == 0 and node.this is not None:
        inner = _column_of(node.this, column, column_type)
        return "date" if inner is not None and column_type in ("timestamp", "date") else None
    if isinstance(node, exp.Cast | exp.TryCast):
        inner = _column_of(node.this, column, column_type)
        if inner is None:
            return None
        to = node.to.this
        if to == exp.DType.DATE and column_type in ("timestamp", "date"):
            return "date"
        if inner == "id" and ((to == exp.DType.TIMESTAMP and column_type in ("timestamp", "date"))
                              or (to in (exp.DType.BIGINT, exp.DType.INT)
                                  and column_type == "int")):
            return "id"  # a cast that keeps every value (a date as its midnight)
    return None


def _literal(node: exp.Expr, column_type: str, wrap: str) -> tuple[Point, Point] | None:
    """The range of values a literal may take when compared with the column, or None."""
    while isinstance(node, exp.Paren):
        node = node.this
    if column_type == "int":
        return _number(node)
    to = None
    if isinstance(node, exp.Cast | exp.TryCast) and isinstance(node.this, exp.Literal):
        to = node.to.this
        node = node.this
    if not isinstance(node, exp.Literal) or not node.is_string:
        return None
    text = node.name.strip()
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        return None
    if to == exp.DType.DATE:
        value = value.replace(tzinfo=None)
        day = _trunc_day(value)
        return day, day
    readings = []
    if value.tzinfo is not None:
        instant = value.astimezone(UTC).replace(tzinfo=None)
        readings += [instant, value.replace(tzinfo=None)]
    else:
        readings.append(value)
    if to in (exp.DType.TIMESTAMPTZ, exp.DType.TIMESTAMPLTZ):
        readings += [r - _TZ_SPREAD for r in readings] + [r + _TZ_SPREAD for r in readings]
    if column_type == "date" and wrap == "id" and to is None:
        readings += [_trunc_day(r) for r in readings]  # the database may cast it to a date
    return min(readings), max(readings)


def _number(node: exp.Expr) -> tuple[Point, Point] | None:
    negative = False
    if isinstance(node, exp.Neg):
        node, negative = node.this, True
    if isinstance(node, exp.Cast) and isinstance(node.this, exp.Literal):
        node = node.this
    if not isinstance(node, exp.Literal):
        return None
    try:
        value = float(node.name)
    except ValueError:
        return None
    if not math.isfinite(value):
        return None
    value = -value if negative else value
    if value.is_integer() and abs(value) < 2**53:
        value = int(value)
    return value, value


def _trunc_day(value: datetime) -> datetime:
    return datetime(value.year, value.month, value.day)


def _ceil_day(value: datetime) -> datetime:
    day = _trunc_day(value)
    return day if day == value else day + _DAY


def _parse(where: str) -> exp.Expr:
    """A WHERE clause of a test query (doctests)."""
    import sqlglot

    return sqlglot.parse_one(f"SELECT 1 FROM t WHERE {where}").args["where"].this


__all__ = ["ALL", "EMPTY", "BlocksRead", "blocks_read", "interval_set", "read_windows"]
