"""Which private blocks a query reads: a conservative interval analysis of its WHERE clause.

Only top-level AND-ed comparisons between the block column and a date/timestamp literal narrow
the range (``=``, ``<``, ``<=``, ``>``, ``>=``, ``BETWEEN``); anything else (OR, NOT, functions of
the column) leaves it open, i.e. every block is read.  Literals are read as UTC, like the windows.

Soundness does not rest on this analysis alone: the rewriter restricts the rewritten query to the
windows returned here, so a query can never read a row of a block it did not pay for.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime

from sqlglot import exp

from analyses.query import AggregateQuery
from chorus_py.statistics import BlockWindows


@dataclass(frozen=True)
class BlocksRead:
    """The block ids a query is charged on, and the window [start, end) they cover."""

    ids: tuple[str, ...]
    start: datetime
    end: datetime


def blocks_read(query: AggregateQuery, windows: BlockWindows) -> BlocksRead:
    """The windows of ``windows`` that the query's WHERE clause can reach."""
    block = query.table_policy.block
    assert block is not None
    low, high = _interval(query.where, block.column)
    first, last = 0, windows.count - 1
    if low is not None:
        first = max(first, (low - windows.start) // windows.width)
    if high is not None:
        last = min(last, (high - windows.start) // windows.width)
    if windows.count == 0 or last < first:
        return BlocksRead((), windows.start, windows.start)
    ids = windows.ids()[first:last + 1]
    return BlocksRead(ids, windows.start + windows.width * first,
                      windows.start + windows.width * (last + 1))


def _interval(where: exp.Expr | None, column: str) -> tuple[datetime | None, datetime | None]:
    """[low, high] (both inclusive, None = open) implied by the top-level conjuncts."""
    low: datetime | None = None
    high: datetime | None = None
    conjuncts = list(where.flatten()) if isinstance(where, exp.And) else [where]
    for node in conjuncts:
        for lo, hi in _bounds(node, column):
            if lo is not None:
                low = lo if low is None else max(low, lo)
            if hi is not None:
                high = hi if high is None else min(high, hi)
    return low, high


def _bounds(node: exp.Expr | None, column: str) -> list[tuple[datetime | None, datetime | None]]:
    if isinstance(node, exp.Paren):
        return _bounds(node.this, column)
    if isinstance(node, exp.Between) and _is_column(node.this, column):
        return [(_literal_time(node.args["low"]), _literal_time(node.args["high"]))]
    if not isinstance(node, exp.EQ | exp.GT | exp.GTE | exp.LT | exp.LTE):
        return []
    left, right = node.this, node.expression
    flipped = False
    if _is_column(right, column):
        left, right, flipped = right, left, True
    if not _is_column(left, column):
        return []
    value = _literal_time(right)
    if value is None:
        return []
    if isinstance(node, exp.EQ):
        return [(value, value)]
    lower = isinstance(node, exp.GT | exp.GTE) != flipped  # column > value: a lower bound
    return [(value, None)] if lower else [(None, value)]


def _is_column(node: exp.Expr, column: str) -> bool:
    return isinstance(node, exp.Column) and node.name == column


def _literal_time(node: exp.Expr) -> datetime | None:
    if isinstance(node, exp.Cast) and isinstance(node.this, exp.Literal):
        node = node.this
    if not isinstance(node, exp.Literal) or not node.is_string:
        return None
    try:
        value = datetime.fromisoformat(node.name.strip())
    except ValueError:
        try:
            day = date.fromisoformat(node.name.strip())
        except ValueError:
            return None
        value = datetime(day.year, day.month, day.day)
    return value if value.tzinfo is None else value.astimezone(UTC).replace(tzinfo=None)
