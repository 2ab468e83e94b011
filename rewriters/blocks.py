"""Restrict a query to the private blocks it paid for.

The ledger charged the query on a set of consecutive block windows [start, end); this pass ANDs
``start <= block_column AND block_column < end`` into the WHERE clause, so rows of any other
block (including blocks that appear after the claim, and rows whose block column is NULL) are
never read.
"""

from __future__ import annotations

from datetime import date, datetime

from sqlglot import exp


def blocks(where: exp.Expr | None, column: exp.Column, start: datetime | date,
           end: datetime | date, column_type: str) -> exp.Expr:
    """Return ``where AND start <= column AND column < end``.

    >>> from datetime import datetime
    >>> blocks(None, exp.column("ts", table="t"), datetime(2026, 1, 1), datetime(2026, 1, 2),
    ...        "timestamp").sql()
    "CAST('2026-01-01 00:00:00' AS TIMESTAMP) <= t.ts AND t.ts < CAST('2026-01-02 00:00:00' AS TIMESTAMP)"
    """
    kind = exp.DType.DATE if column_type == "date" else exp.DType.TIMESTAMP
    lo = exp.cast(exp.Literal.string(_text(start, column_type)), kind)
    hi = exp.cast(exp.Literal.string(_text(end, column_type)), kind)
    bound = exp.and_(lo <= column.copy(), column.copy() < hi)
    return bound if where is None else exp.and_(exp.Paren(this=where.copy()), bound)


def _text(value: datetime | date, column_type: str) -> str:
    if column_type == "date":
        return value.strftime("%Y-%m-%d")
    return value.strftime("%Y-%m-%d %H:%M:%S")
