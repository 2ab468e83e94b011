"""Queries that ask quantiles (MEDIAN, percentiles, MIN, MAX) next to COUNT/SUM/AVG-like
aggregates: how they split into two sub-queries (``chorus_py.kinds.mixed`` answers them).

``SELECT city, MEDIAN(fare), COUNT(*) FROM trips GROUP BY city`` becomes the quantile part
``SELECT city, MEDIAN(fare) FROM trips GROUP BY city`` and the analytic part
``SELECT city, COUNT(*) FROM trips GROUP BY city``: same FROM, WHERE and GROUP BY, each with
the query's non-aggregate items (its group keys and constants, which match the parts' rows)
and its own aggregate items.  ORDER BY, LIMIT and OFFSET are applied to the merged rows
(post-processing of released values); each ORDER BY term must name an output.

Refused here, before anything is charged: an output that combines both parts in one
expression (``MAX(fare) - AVG(fare)``), HAVING, a group key that is not selected (the parts'
rows could not be matched), and anything that is not one SELECT.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from analyses.quantiles import is_quantile
from analyses.query import display_sql
from analyses.validate import AGGREGATES
from chorus_py.errors import NotSupportedError

Part = Literal["key", "quantile", "analytic"]


@dataclass(frozen=True)
class MixedSplit:
    """A mixed query split in two: the parts' SQL, where each output comes from (``part``,
    index among that part's aggregate items; keys by index among the key items, which lead
    both parts' rows), and the merged rows' ORDER BY (output index, descending, nulls first)
    and LIMIT / OFFSET."""

    sql: str
    quantile_sql: str
    analytic_sql: str
    outputs: tuple[tuple[Part, int], ...]
    order: tuple[tuple[int, bool, bool], ...]
    limit: int | None
    offset: int


def asks_mixed(sql: str, dialect: str) -> bool:
    """Whether ``sql`` holds both a quantile (MEDIAN, percentile, MIN, MAX) and another
    aggregate (a cheap parse; False if it does not parse)."""
    try:
        trees = sqlglot.parse(sql, read=dialect)
    except (ParseError, TokenError, RecursionError, ValueError):
        return False
    return any(tree is not None and _has_quantile(tree) and _has_other(tree)
               for tree in trees)


def _has_quantile(node: exp.Expr) -> bool:
    return any(is_quantile(n) for n in node.walk())


def _has_other(node: exp.Expr) -> bool:
    """A COUNT/SUM/AVG-like aggregate (``analyses.validate.AGGREGATES``: no quantile)."""
    return next(node.find_all(*AGGREGATES), None) is not None


def split_mixed(sql: str, dialect: str) -> MixedSplit:
    """Split a mixed query (see the module docstring); refusals raise and cost nothing."""
    try:
        tree = sqlglot.parse_one(sql, read=dialect)
    except (ParseError, TokenError) as err:  # asks_mixed parsed it: not expected
        raise NotSupportedError(f"syntax error: {err}") from None
    if not isinstance(tree, exp.Select):
        raise NotSupportedError("quantiles next to other aggregates are answered in one "
                                "SELECT only", hint="ask them in separate queries")
    if tree.args.get("having") is not None:
        raise NotSupportedError(
            "HAVING in a query that mixes quantiles (MEDIAN, percentiles, MIN, MAX) with "
            "COUNT/SUM/AVG-like aggregates is not supported",
            hint="ask the quantiles and the other aggregates in separate queries")
    items = list(tree.expressions)
    group = tree.args.get("group")
    if group is not None:  # GROUP BY 2 names an item by position: the parts renumber them
        group = group.copy()
        group.set("expressions", [_resolve_ordinal(g, items) for g in group.expressions])
    keys: list[exp.Expr] = []
    quantiles: list[exp.Expr] = []
    analytic: list[exp.Expr] = []
    outputs: list[tuple[Part, int]] = []
    for item in items:
        q, a = _has_quantile(item), _has_other(item)
        if q and a:
            raise NotSupportedError(
                f"{display_sql(item)} combines a quantile (MEDIAN, percentile, MIN, MAX) and "
                "a COUNT/SUM/AVG-like aggregate in one expression: the two are answered by "
                "different mechanisms and this is not supported",
                hint="select them as separate columns and combine them yourself")
        found: list[exp.Expr] = quantiles if q else analytic if a else keys
        outputs.append(("quantile" if q else "analytic" if a else "key", len(found)))
        found.append(item)
    for key in group.expressions if group is not None else ():
        if not any(_names(key, item) for item in keys):
            raise NotSupportedError(
                f"GROUP BY {display_sql(key)} is not selected: a query that mixes quantiles "
                "with other aggregates matches their rows by the group keys",
                hint=f"add {display_sql(key)} to the SELECT list")
    order = tuple(_order_term(o, items) for o in (tree.args.get("order") or exp.Order())
                  .expressions)
    limit, offset = _count(tree.args.get("limit"), "LIMIT"), _count(tree.args.get("offset"),
                                                                     "OFFSET")

    def part(selected: list[exp.Expr]) -> str:
        sub = tree.copy()
        sub.set("expressions", [e.copy() for e in (*keys, *selected)])
        if group is not None:
            sub.set("group", group.copy())
        for arg in ("order", "limit", "offset"):
            sub.set(arg, None)
        return sub.sql(dialect)

    return MixedSplit(sql, part(quantiles), part(analytic), tuple(outputs), order,
                      limit, offset or 0)


def _resolve_ordinal(node: exp.Expr, items: list[exp.Expr]) -> exp.Expr:
    if isinstance(node, exp.Literal) and not node.is_string and node.name.isdigit():
        index = int(node.name) - 1
        if 0 <= index < len(items):
            item = items[index]
            return (item.this if isinstance(item, exp.Alias) else item).copy()
    return node


def _names(key: exp.Expr, item: exp.Expr) -> bool:
    """Whether the select item ``item`` is the group key ``key`` (by alias or by text)."""
    bare = item.this if isinstance(item, exp.Alias) else item
    if isinstance(key, exp.Column) and not key.table and item.alias_or_name == key.name:
        return True
    return bare.sql() == key.sql()


def _order_term(ordered: exp.Expr, items: list[exp.Expr]) -> tuple[int, bool, bool]:
    """(output index, desc, nulls first) of one ORDER BY term, which must name an output:
    its position, its name, or its expression."""
    term = ordered.this if isinstance(ordered, exp.Ordered) else ordered
    desc = bool(ordered.args.get("desc"))
    nulls_first = ordered.args.get("nulls_first")
    # Postgres' default: NULLs sort as if larger than every value.
    first = desc if nulls_first is None else bool(nulls_first)
    if isinstance(term, exp.Literal) and not term.is_string and term.name.isdigit() \
            and 1 <= int(term.name) <= len(items):
        return int(term.name) - 1, desc, first
    for i, item in enumerate(items):
        if _names(term, item):
            return i, desc, first
    raise NotSupportedError(
        f"ORDER BY {display_sql(term)}: in a query that mixes quantiles with other "
        "aggregates, ORDER BY names an output (its position, name or expression)",
        hint="order by a selected column")


def _count(node: exp.Expr | None, what: str) -> int | None:
    if node is None:
        return None
    value = node.expression if isinstance(node, exp.Limit | exp.Offset) else node
    if isinstance(value, exp.Literal) and not value.is_string and value.name.isdigit():
        return int(value.name)
    raise NotSupportedError(f"{what} must be a non-negative integer literal")
