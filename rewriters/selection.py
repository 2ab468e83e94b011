"""SQL for the private selection of clipping bounds (``mechanisms.clip_bounds``) and of the
groups-per-unit bound g (``mechanisms.caps.choose_groups``).

``value_histogram`` returns, per magnitude bin of a summed expression, the total weight of the
rows in it, each row of a privacy unit weighing 1 / (the unit's non-NULL rows in the query's
filtered relation), so each unit adds exactly 1 (sensitivity 1).  ``group_histogram`` returns
the units per bin of their number of distinct groups; each unit falls in one bin (sensitivity
1).  Their results are exact and stay inside the proxy: the engine adds noise before using them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlglot import exp

from analyses.query import AggregateQuery
from rewriters.blocks import BlockRestriction
from rewriters.clipping import clipping
from rewriters.pipeline import filtered_rows
from rewriters.safety import safety


@dataclass(frozen=True)
class ClippedArgument:
    """A summed expression of the query and its declared bounds [lower, upper]."""

    key: str             # its SQL, the key of ``AggregateQuery.with_bounds``
    argument: exp.Expr
    lower: float
    upper: float


def clipped_arguments(query: AggregateQuery) -> tuple[ClippedArgument, ...]:
    """Every distinct expression the query sums (SUM, AVG, VARIANCE, STDDEV), in order."""
    found: dict[str, ClippedArgument] = {}
    for m in query.measurements:
        if m.kind in ("sum", "sum_squares") and m.argument is not None \
                and m.lower is not None and m.upper is not None:
            found.setdefault(m.argument.sql(), ClippedArgument(m.argument.sql(), m.argument,
                                                               m.lower, m.upper))
    return tuple(found.values())


def value_histogram(query: AggregateQuery, argument: exp.Expr, lower: float, upper: float,
                    edges: Sequence[float], restriction: BlockRestriction | None,
                    sample: tuple[str, str] | None) -> exp.Select:
    """Rows (bin index, weight) of |clip(argument, lower, upper)| over ``edges`` (largest first).

    Bin 0: magnitude >= edges[0]; bin j: edges[j] <= magnitude < edges[j - 1]; bin len(edges):
    below the last edge.  Bins without rows are absent.

    >>> from sqlglot import parse_one
    >>> from chorus_py.policy import TablePolicy
    >>> tp = TablePolicy(privacy_unit="u", max_rows_per_unit=5,
    ...                  columns={"u": {"type": "int"}, "x": {"type": "float"}})
    >>> q = AggregateQuery("t", "t", tp, None, (), (), (), None, (), None, None, 5, False, None)
    >>> print(value_histogram(q, parse_one("t.x"), 0, 10, (10.0, 5.0), None, None)
    ...       .sql())  # doctest: +NORMALIZE_WHITESPACE
    SELECT v.b AS b, SUM(v.w) AS w FROM (SELECT CASE WHEN r.m >= 10.0 THEN 0 WHEN r.m >= 5.0
    THEN 1 ELSE 2 END AS b, r.w AS w FROM (SELECT ABS(CASE WHEN t.x IS NULL THEN NULL ELSE
    LEAST(GREATEST(t.x, 0), 10) END) AS m, CAST(1 AS DOUBLE) / COUNT(*) OVER (PARTITION BY t.u)
    AS w FROM (SELECT t.* FROM t AS t) AS t WHERE NOT t.x IS NULL) AS r) AS v GROUP BY v.b
    """
    alias = query.alias
    rows = filtered_rows(query, restriction, sample)
    value = safety(argument)
    one = exp.cast(exp.Literal.number(1), exp.DType.DOUBLE)
    unit = query.privacy_unit
    if unit is None:
        weight: exp.Expr = one  # event level: every row is its own unit
    else:
        weight = exp.Div(this=one, expression=exp.Window(
            this=exp.Count(this=exp.Star()), partition_by=[exp.column(unit, table=alias)]))
    # The clipped magnitude is computed once per row (m), then binned: written inside every
    # WHEN, it was rendered (and built) once per edge, 26 times.
    # Every tree here is built fresh for this statement: the builders need not copy them.
    per_row = (exp.select(exp.alias_(exp.Abs(this=clipping(value, lower, upper)), "m"),
                          exp.alias_(weight, "w"))
               .from_(rows.subquery(alias, copy=False), copy=False)
               .where(exp.Not(this=exp.Is(this=value.copy(), expression=exp.Null())),
                      copy=False))
    magnitude = exp.column("m", table="r")
    ifs = [exp.If(this=magnitude.copy() >= exp.Literal.number(edge), true=exp.Literal.number(j))
           for j, edge in enumerate(edges)]
    binned = exp.select(
        exp.alias_(exp.Case(ifs=ifs, default=exp.Literal.number(len(edges))), "b"),
        exp.alias_(exp.column("w", table="r"), "w")).from_(per_row.subquery("r", copy=False),
                                                            copy=False)
    return (exp.select(exp.alias_(exp.column("b", table="v"), "b"),
                       exp.alias_(exp.Sum(this=exp.column("w", table="v")), "w"))
            .from_(binned.subquery("v", copy=False), copy=False)
            .group_by(exp.column("b", table="v"), copy=False))


def group_histogram(query: AggregateQuery, restriction: BlockRestriction | None,
                    sample: tuple[str, str] | None, starts: Sequence[int]) -> exp.Select:
    """Rows (bin index, units): units per bin of their distinct groups G_u (bins start at
    ``starts``; a unit with G_u >= starts[i] and < starts[i + 1] is in bin i).  Bins without
    units are absent.  A NULL key is a group of its own, as in GROUP BY.

    >>> from sqlglot import parse_one
    >>> from chorus_py.policy import TablePolicy
    >>> tp = TablePolicy(privacy_unit="u", max_rows_per_unit=5,
    ...                  columns={"u": {"type": "int"}, "h": {"type": "int"}})
    >>> from analyses.query import GroupKey
    >>> q = AggregateQuery("t", "t", tp, None, (GroupKey("k0", parse_one("t.h"), None),), (),
    ...                    (), None, (), None, None, 5, True, None)
    >>> print(group_histogram(q, None, None, (1, 2, 4)).sql())  # doctest: +NORMALIZE_WHITESPACE
    SELECT CASE WHEN u.c >= 4 THEN 2 WHEN u.c >= 2 THEN 1 ELSE 0 END AS b, COUNT(*) AS n FROM
    (SELECT COUNT(*) AS c FROM (SELECT t.u AS u FROM (SELECT t.* FROM t AS t) AS t GROUP BY t.u,
    t.h) AS p GROUP BY p.u) AS u GROUP BY CASE WHEN u.c >= 4 THEN 2 WHEN u.c >= 2 THEN 1 ELSE 0
    END
    """
    unit = query.privacy_unit
    if unit is None or not query.keys:
        raise ValueError("a groups histogram needs a privacy unit and group keys")
    rows = filtered_rows(query, restriction, sample)
    pairs = (exp.select(exp.alias_(exp.column(unit, table=query.alias), "u"))
             .from_(rows.subquery(query.alias))
             .group_by(exp.column(unit, table=query.alias), *[safety(k.expr) for k in query.keys]))
    per_unit = (exp.select(exp.alias_(exp.Count(this=exp.Star()), "c"))
                .from_(pairs.subquery("p")).group_by(exp.column("u", table="p")))
    ifs = [exp.If(this=exp.column("c", table="u") >= exp.Literal.number(start),
                  true=exp.Literal.number(i))
           for i, start in reversed(list(enumerate(starts))) if i > 0]
    bin_index = exp.Case(ifs=ifs, default=exp.Literal.number(0))  # G_u >= 1 always
    return (exp.select(exp.alias_(bin_index, "b"), exp.alias_(exp.Count(this=exp.Star()), "n"))
            .from_(per_unit.subquery("u")).group_by(bin_index.copy()))
