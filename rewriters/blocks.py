"""Restrict a query to the private blocks it paid for.

The ledger charged the query on a set of consecutive block windows [start, end); this pass ANDs
``start <= block_column AND block_column < end`` into the WHERE clause, so rows of any other
block (including blocks that appear after the claim, and rows whose block column is NULL) are
never read.  When the charged blocks form several runs (``IN``/``OR`` on the block column), it
ANDs the OR of one such window per run.  Id-range blocks (User DP) compare integers.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime

from sqlglot import exp

from analyses.trees import copy_tree


@dataclass(frozen=True)
class BlockRestriction:
    """The claimed blocks as one window [start, end) of the block column, or one per run."""

    column: str
    column_type: str
    start: datetime | date | int
    end: datetime | date | int
    windows: tuple[tuple[datetime | date | int, datetime | date | int], ...] = ()


def blocks(where: exp.Expr | None, column: exp.Column, start: datetime | date | int,
           end: datetime | date | int, column_type: str,
           windows: tuple[tuple[datetime | date | int, datetime | date | int], ...] = ()
           ) -> exp.Expr:
    """Return ``where AND start <= column AND column < end`` (one window per run if given).

    >>> from datetime import datetime
    >>> blocks(None, exp.column("ts", table="t"), datetime(2026, 1, 1), datetime(2026, 1, 2),
    ...        "timestamp").sql()
    "CAST('2026-01-01 00:00:00' AS TIMESTAMP) <= t.ts AND t.ts < CAST('2026-01-02 00:00:00' AS TIMESTAMP)"
    """
    runs = windows or ((start, end),)
    # Fresh trees, each placed once: the builders need not copy them.
    bounds = [exp.and_(_value(lo, column_type) <= column.copy(),
                       column.copy() < _value(hi, column_type), copy=False) for lo, hi in runs]
    bound = bounds[0] if len(bounds) == 1 else exp.Paren(this=exp.or_(*bounds, copy=False))
    return bound if where is None else exp.and_(exp.Paren(this=copy_tree(where)), bound,
                                                copy=False)


def _value(value: datetime | date | int, column_type: str) -> exp.Expr:
    if column_type == "int":
        return exp.Literal.number(int(value))  # type: ignore[arg-type]
    kind = exp.DType.DATE if column_type == "date" else exp.DType.TIMESTAMP
    return exp.cast(exp.Literal.string(_text(value, column_type)), kind)  # type: ignore[arg-type]


def _text(value: datetime | date, column_type: str) -> str:
    if column_type == "date":
        return value.strftime("%Y-%m-%d")
    return value.strftime("%Y-%m-%d %H:%M:%S")
