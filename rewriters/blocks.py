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

    def month(self) -> int | None:
        """The calendar month every claimed window lies in, as ``month_number`` counts it
        (None: they span several months, or the blocks are ids).  A ranked copy's month twin
        holds each month's rows apart (``rewriters.contribution.month_ordered``): a query
        claiming blocks of one month reads only that month's rows there.

        >>> BlockRestriction("ts", "timestamp", datetime(2026, 3, 1), datetime(2026, 4, 1)).month()
        674
        >>> BlockRestriction("ts", "timestamp", datetime(2026, 3, 1), datetime(2026, 4, 2)).month()
        >>> BlockRestriction("d", "date", date(2026, 1, 30), date(2026, 2, 1)).month()
        672
        """
        start, end = self.start, self.end
        if self.column_type not in MONTHLY_TYPES or not isinstance(start, date) \
                or not isinstance(end, date):
            return None
        month = month_number(start)
        following = month_start(month + 1)
        # end is exclusive: a claim up to the next month's first instant stays in this month.
        return month if end <= (following.date() if type(end) is date else following) else None


#: Block column types whose values fall in calendar months (``month_number``, ``month_sql``).
MONTHLY_TYPES = ("date", "timestamp")


def month_number(point: date) -> int:
    """Calendar months since January 1970 (0) of a date or naive timestamp: 2026-03 is 674.

    >>> month_number(date(1970, 1, 31)), month_number(datetime(2026, 3, 31, 23, 59))
    (0, 674)
    """
    return (point.year - 1970) * 12 + point.month - 1


def month_start(month: int) -> datetime:
    """The first instant of the calendar month ``month`` (``month_number``'s count).

    >>> month_start(674), month_start(0)
    (datetime.datetime(2026, 3, 1, 0, 0), datetime.datetime(1970, 1, 1, 0, 0))
    """
    return datetime(1970 + month // 12, month % 12 + 1, 1)


def month_sql(column: exp.Expr) -> exp.Expr:
    """``month_number`` of ``column`` (a date or timestamp without time zone) in SQL, the same
    integer on DuckDB and Postgres: ``CAST((EXTRACT(YEAR FROM c) - 1970) * 12 + EXTRACT(MONTH
    FROM c) - 1 AS INT)``.  (Without a time zone the fields are those of the stored value.)

    >>> month_sql(exp.column("ts", table="t")).sql("postgres")
    'CAST((EXTRACT(YEAR FROM t.ts) - 1970) * 12 + EXTRACT(MONTH FROM t.ts) - 1 AS INT)'
    """
    year = exp.Extract(this=exp.var("YEAR"), expression=column)
    month = exp.Extract(this=exp.var("MONTH"), expression=column.copy())
    number = exp.Sub(this=exp.Add(this=exp.Mul(this=exp.Paren(this=exp.Sub(
        this=year, expression=exp.Literal.number(1970))), expression=exp.Literal.number(12)),
        expression=month), expression=exp.Literal.number(1))
    return exp.cast(number, exp.DType.INT)  # type: ignore[arg-type]


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
    # Fresh trees, each placed once, built by their constructors: a builder's deep copy
    # (``exp.cast``, ``Expr.copy``) made this most of a query's restriction's cost.
    bounds = [exp.And(this=exp.LTE(this=_value(lo, column_type), expression=copy_tree(column)),
                      expression=exp.LT(this=copy_tree(column),
                                        expression=_value(hi, column_type)))
              for lo, hi in runs]
    bound = bounds[0] if len(bounds) == 1 else exp.Paren(this=exp.or_(*bounds, copy=False))
    return bound if where is None else exp.and_(exp.Paren(this=copy_tree(where)), bound,
                                                copy=False)


def _value(value: datetime | date | int, column_type: str) -> exp.Expr:
    if column_type == "int":
        return exp.Literal.number(int(value))  # type: ignore[arg-type]
    kind = exp.DType.DATE if column_type == "date" else exp.DType.TIMESTAMP
    return exp.Cast(this=exp.Literal.string(_text(value, column_type)),  # type: ignore[arg-type]
                    to=exp.DataType(this=kind))


def _text(value: datetime | date, column_type: str) -> str:
    if column_type == "date":
        return value.strftime("%Y-%m-%d")
    return value.strftime("%Y-%m-%d %H:%M:%S")
