"""The bins of a DP quantile's histogram, and the bin a ranked copy stores per bounded column.

A quantile (or MIN / MAX) is drawn from a histogram of the clipped value over ``BINS`` equal
bins of its declared range [lower, upper] (``rewriters.quantiles``).  Computing the bin of
every row (a CASE, FLOOR, a cast) was 6-9 ms of DuckDB's 1M-row histogram and the grouping by
a computed BIGINT the rest.  A value's bin depends only on the value, the declared bounds and
``BINS``, so the ranked copy (``rewriters.contribution.ranked_table``) stores it, as a
SMALLINT, for every bounded numeric column (:func:`stored_bins`): a histogram of a plain
column at its declared bounds then groups the stored bin (``__chorus_bin<i>``) instead of
computing it (benchmarks/RESULTS.md, "Stored quantile bins").

The stored bin is the histogram's own expression (:func:`bin_of`), evaluated by the same
database on the same value, so every row lands in the very cell it would have: the cells'
counts, their sensitivity (each row in one cell) and the draw are unchanged.  The copy's name
covers the binned columns, their bounds and ``BINS`` (``chorus_py.stores.samples``): a policy
with other bounds gets another copy, never a stale bin.
"""

from __future__ import annotations

from sqlglot import exp

from chorus_py.policy import NUMERIC_TYPES, TablePolicy

#: Bins of the histogram over [lower, upper]: the answer's resolution is (upper - lower) / BINS.
BINS = 10_000
#: The prefix of a ranked copy's stored bin columns: ``__chorus_bin0``, ``__chorus_bin1``, ...
STORED_BIN = "__chorus_bin"
# A stored bin is a SMALLINT (2 bytes a row and a column): BINS must fit in it.
assert BINS <= 32_767


def bin_of(v: exp.Expr, lower: float, upper: float, bins: int) -> exp.Expr:
    """The bin in [0, bins) of ``v`` (a DOUBLE, not NULL where it is counted) over [lower,
    upper]: values at or below ``lower`` in bin 0, at or above ``upper`` (and NaN, which both
    engines order above every number) in the last one.

    >>> print(bin_of(exp.column("v"), 0, 10, 100).sql("postgres"))  # doctest: +NORMALIZE_WHITESPACE
    CASE WHEN v <= 0 THEN 0 WHEN v >= 10 THEN 99 ELSE LEAST(CAST(FLOOR((v - 0) * 10.0) AS
    BIGINT), 99) END
    """
    scale = bins / (upper - lower)
    position = exp.Mul(this=exp.Paren(this=exp.Sub(this=v.copy(), expression=_number(lower))),
                       expression=exp.Literal.number(repr(float(scale))))
    # Clipping is the outer branches; inside, FLOOR may round up to `bins` at the very top.
    # ignore_nulls: LEAST as Postgres has it, without the NULL test sqlglot writes around
    # DuckDB's LEAST per row (the position is not NULL where v is not).
    inside = exp.Least(this=exp.cast(exp.Floor(this=position), exp.DType.BIGINT),
                       expressions=[exp.Literal.number(bins - 1)], ignore_nulls=True)
    return exp.Case(ifs=[
        exp.If(this=v.copy() <= _number(lower), true=exp.Literal.number(0)),
        exp.If(this=v.copy() >= _number(upper), true=exp.Literal.number(bins - 1))],
        default=inside)


def stored_bins(policy: TablePolicy) -> tuple[tuple[str, float, float], ...]:
    """(column, lower, upper) of every numeric column of ``policy`` with declared bounds
    (lower < upper), by name: the columns whose bins a ranked copy stores, the i-th as
    ``__chorus_bin<i>``."""
    found = []
    for name in sorted(policy.columns):
        column = policy.columns[name]
        if column.type in NUMERIC_TYPES and column.lower is not None \
                and column.upper is not None and column.lower < column.upper:
            found.append((name, float(column.lower), float(column.upper)))
    return tuple(found)


def stored_column(policy: TablePolicy, argument: exp.Expr, alias: str
                  ) -> tuple[int, float, float] | None:
    """(i, lower, upper) when ``argument`` is a plain column of the table (``alias.column``)
    that a ranked copy stores values of (its bin, magnitude digit, clipped value): the i-th
    of :func:`stored_bins`, with its declared bounds; None otherwise."""
    if not isinstance(argument, exp.Column) or argument.table != alias:
        return None
    for i, (name, low, high) in enumerate(stored_bins(policy)):
        if name == argument.name:
            return i, low, high
    return None


def stored_bin(policy: TablePolicy, argument: exp.Expr, alias: str, lower: float,
               upper: float, bins: int) -> str | None:
    """The name of the ranked copy's stored bin of ``argument`` when it is a plain column of
    the table (``alias.column``) and the histogram bins it exactly as the copy did (its
    declared bounds, ``BINS``); None otherwise (the histogram computes the bin)."""
    found = stored_column(policy, argument, alias)
    if found is None or bins != BINS or found[1:] != (float(lower), float(upper)):
        return None
    return f"{STORED_BIN}{found[0]}"


def stored_bin_columns(policy: TablePolicy, alias: str) -> list[exp.Expr]:
    """The stored bin columns of a ranked copy of a table under ``policy``, over the table's
    rows as ``alias``: each a SMALLINT, NULL where the value is."""
    out: list[exp.Expr] = []
    for i, (name, lower, upper) in enumerate(stored_bins(policy)):
        value = exp.cast(exp.column(name, table=alias, quoted=True), exp.DType.DOUBLE)
        binned = exp.Case(ifs=[exp.If(this=exp.Is(this=value.copy(), expression=exp.Null()),
                                      true=exp.Null())],
                          default=bin_of(value, lower, upper, BINS))
        out.append(exp.alias_(exp.cast(binned, exp.DType.SMALLINT), f"{STORED_BIN}{i}"))
    return out


def _number(value: float) -> exp.Expr:
    """A numeric literal, an integral value without its ".0" (negative: a unary minus)."""
    literal = exp.Literal.number(repr(abs(float(value))).removesuffix(".0"))
    return exp.Neg(this=literal) if value < 0 else literal
