"""An aggregate's FILTER clause, written as the CASE the engine already analyses.

``AGG(x) FILTER (WHERE c)`` aggregates the rows where ``c`` is true; the same rows are
aggregated by ``AGG(CASE WHEN c THEN x END)``, since every aggregate the engine answers skips
NULL arguments (``COUNT(*) FILTER (WHERE c)`` becomes ``COUNT(CASE WHEN c THEN 1 END)``).  Both
forms give NULL (SUM, AVG, ...) or 0 (COUNT) when no row passes.  Rewriting the spelling before
any analysis keeps one path for the sensitivity, clipping and bounding: the CASE forms are
analysed, bounded and tested as they are (a kept row whose ``c`` is false contributes nothing).

Only a FILTER directly on an aggregate is rewritten; one on anything else (a window function)
stays, and the allowlist refuses it.
"""

from __future__ import annotations

from sqlglot import exp

from analyses.trees import copy_tree

# Aggregates whose argument(s) the CASE replaces; quantiles (WITHIN GROUP) are handled apart.
_AGGREGATES: tuple[type[exp.Expr], ...] = (
    exp.Count, exp.Sum, exp.Avg, exp.Variance, exp.VariancePop, exp.Stddev, exp.StddevPop,
    exp.StddevSamp, exp.Min, exp.Max, exp.Median,
)


def filters_as_case(tree: exp.Expr) -> exp.Expr:
    """``tree`` with each ``AGG(...) FILTER (WHERE c)`` written ``AGG(CASE WHEN c THEN ... END)``.

    >>> from sqlglot import parse_one
    >>> print(filters_as_case(parse_one(
    ...     "SELECT COUNT(*) FILTER (WHERE fare > 30), SUM(fare) FILTER (WHERE city = 'SF') "
    ...     "FROM trips", "postgres")).sql(pretty=True))
    SELECT
      COUNT(CASE WHEN fare > 30 THEN 1 END),
      SUM(CASE WHEN city = 'SF' THEN fare END)
    FROM trips
    """
    def visit(node: exp.Expr) -> exp.Expr:
        if not isinstance(node, exp.Filter):
            return node
        where = node.expression
        rewritten = _filtered(node.this, where.this if isinstance(where, exp.Where) else None)
        return node if rewritten is None else rewritten

    return copy_tree(tree).transform(visit, copy=False)


def _filtered(aggregate: exp.Expr, condition: exp.Expr | None) -> exp.Expr | None:
    """``aggregate`` over the rows where ``condition`` holds, or None when the form is not one
    this module rewrites (left to the allowlist)."""
    if condition is None:
        return None
    if isinstance(aggregate, exp.WithinGroup):  # PERCENTILE_CONT(p) WITHIN GROUP (ORDER BY x)
        order = aggregate.expression
        keys = order.expressions if isinstance(order, exp.Order) else []
        if len(keys) != 1 or not isinstance(keys[0], exp.Ordered):
            return None
        copy = aggregate.copy()
        ordered = copy.expression.expressions[0]
        ordered.set("this", _when(condition, ordered.this))
        return copy
    if not isinstance(aggregate, _AGGREGATES):
        return None
    copy = aggregate.copy()
    argument = copy.this
    if isinstance(argument, exp.Star):  # COUNT(*): the rows where c holds
        copy.set("this", _when(condition, exp.Literal.number(1)))
    elif isinstance(argument, exp.Distinct):  # COUNT(DISTINCT x): the distinct x where c holds
        argument.set("expressions", [_when(condition, e) for e in argument.expressions])
    elif argument is not None and not copy.expressions:
        copy.set("this", _when(condition, argument))
    else:
        return None
    return copy


def _when(condition: exp.Expr, value: exp.Expr) -> exp.Case:
    """``CASE WHEN condition THEN value END`` (NULL where the condition is false or NULL)."""
    return exp.Case(ifs=[exp.If(this=condition.copy(), true=value.copy())])
