"""Queries that ask quantiles (MEDIAN, percentiles, MIN, MAX) next to COUNT/SUM/AVG-like
aggregates: how they split into two sub-queries and a finish (``chorus_py.kinds.mixed``).

``SELECT city, AVG(fare) / MEDIAN(fare) AS r FROM trips GROUP BY city HAVING COUNT(*) > 100``
becomes

- the quantile part ``SELECT city, MEDIAN(fare) FROM trips GROUP BY city``,
- the analytic part ``SELECT city, AVG(fare), COUNT(*) FROM trips GROUP BY city``: the same
  FROM, WHERE and GROUP BY, the group keys first, then every distinct aggregate of that kind
  the query names anywhere (SELECT, HAVING, ORDER BY), once each;
- the finish ``SELECT a0 / q0 AS r FROM chorus_noisy WHERE a1 > 100``, run in the proxy's
  scratch DuckDB over the parts' released rows (keys k<i>, quantiles q<i>, aggregates a<j>).

Why the finish is safe: it reads only the released values (the keys, public; every aggregate
the *noisy* measurement of a part, each charged in that part), so its outputs, HAVING, ORDER BY
and LIMIT are post-processing.  An aggregate named only in HAVING or ORDER BY is one more
measurement of its part, charged like the others: an exact value never filters or orders
anything.  Nothing else reaches the finish: an expression of it may hold only the lifted
aggregates, group keys, output names, literals and the functions ``analyses.validate`` allows
(no subquery, no window, no aggregate inside another), checked here before anything runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from analyses.aggregate_filters import filters_as_case
from analyses.quantiles import is_quantile, may_ask_quantiles, parsed_to_read
from analyses.query import display_sql, output_names
from analyses.trees import dialect_named, sql_text
from analyses.validate import AGGREGATES, check_node
from chorus_py.errors import NotSupportedError
from rewriters.pipeline import NOISY

#: The scratch table's column of a merged row's index (error bars follow a row through the
#: finish's HAVING, ORDER BY and LIMIT).
ROW = "chorus_row"


@dataclass(frozen=True)
class MixedSplit:
    """A mixed query split in two parts and a finish (module docstring).

    ``sources``: per output, the scratch column it is exactly (``k0``, ``q1``, ``a0``: its
    report column and error bar come from that part), or None for an expression of several."""

    sql: str
    quantile_sql: str
    analytic_sql: str
    keys: int
    quantiles: tuple[str, ...]   # the quantile part's aggregates (display text), q<i>
    analytic: tuple[str, ...]    # the analytic part's aggregates, a<j>
    counts: tuple[bool, ...]     # per a<j>: a COUNT (an integer)
    outputs: tuple[exp.Expr, ...]  # each output over the scratch columns
    names: tuple[str, ...]
    sources: tuple[str | None, ...]
    texts: tuple[str, ...]       # each output as the analyst wrote it
    finish: str                  # DuckDB SQL over chorus_noisy


def asks_mixed(sql: str, dialect: str) -> bool:
    """Whether ``sql`` holds both a quantile (MEDIAN, percentile, MIN, MAX) and another
    aggregate (a cheap parse; False if it does not parse)."""
    if not may_ask_quantiles(sql):
        return False
    trees = parsed_to_read(sql, dialect)
    return trees is not None and any(_has_quantile(tree) and _has_other(tree) for tree in trees)


def _has_quantile(node: exp.Expr) -> bool:
    return any(is_quantile(n) for n in node.walk())


def _has_other(node: exp.Expr) -> bool:
    """A COUNT/SUM/AVG-like aggregate (``analyses.validate.AGGREGATES``: no quantile)."""
    return next(node.find_all(*AGGREGATES), None) is not None


def _is_aggregate(node: exp.Expr) -> bool:
    return is_quantile(node) or isinstance(node, AGGREGATES)


class _Lifter:
    """Replaces each aggregate by its part's column and each group key by its key column,
    collecting the distinct aggregates of each part (one measurement each, whatever the
    number of times the query names it)."""

    def __init__(self, keys: list[exp.Expr]) -> None:
        self.keys = keys
        self.quantiles: dict[str, exp.Expr] = {}
        self.analytic: dict[str, exp.Expr] = {}
        self.strays: list[exp.Column] = []

    def lift(self, node: exp.Expr, aliases: dict[str, exp.Expr]) -> exp.Expr:
        """``node`` over the scratch columns; ``aliases``: output names usable here (HAVING,
        ORDER BY), each by its lifted expression."""
        for bad in node.walk():
            if isinstance(bad, exp.Window):
                raise NotSupportedError(
                    f"{display_sql(bad)}: window functions are not supported",
                    hint="select the aggregates and compute running values yourself")
            if isinstance(bad, exp.Select | exp.Subquery):
                raise NotSupportedError(
                    "a subquery in the outputs, HAVING or ORDER BY of a query that mixes "
                    "quantiles with other aggregates is not supported",
                    hint="ask it as a separate query")
        return node.copy().transform(lambda n: self._visit(n, aliases))

    def _visit(self, node: exp.Expr, aliases: dict[str, exp.Expr]) -> exp.Expr:
        target = node.this if isinstance(node, exp.Filter) else node
        if _is_aggregate(target):
            inner = next((n for n in target.walk() if n is not target and _is_aggregate(n)),
                         None)
            if inner is not None:
                raise NotSupportedError(
                    f"{display_sql(node)}: an aggregate inside another aggregate is not "
                    "supported", hint="aggregate the table's columns only")
            text = sql_text(node)
            if is_quantile(target):
                found, prefix = self.quantiles, "q"
            else:
                found, prefix = self.analytic, "a"
            found.setdefault(text, node)
            return exp.column(f"{prefix}{list(found).index(text)}")
        for i, key in enumerate(self.keys):
            if _same(node, key):
                return exp.column(f"k{i}")
        if isinstance(node, exp.Column):
            if not node.table and node.name in aliases:
                return aliases[node.name].copy()
            self.strays.append(node)
        return node


def _same(node: exp.Expr, key: exp.Expr) -> bool:
    """Whether ``node`` is the group key ``key``: the same text, or a bare column of its name."""
    if sql_text(node) == sql_text(key):
        return True
    return (isinstance(node, exp.Column) and isinstance(key, exp.Column) and not node.table
            and node.name == key.name)


def plain_percentile(node: exp.Expr) -> exp.Expr:
    """``PERCENTILE_CONT(p) WITHIN GROUP (ORDER BY x [DESC])`` as ``PERCENTILE_CONT(x, p')``
    (p' = 1 - p for DESC, as ``analyses.quantiles`` reads it): sqlglot writes the WITHIN GROUP
    form for DuckDB as ``QUANTILE_CONT(x, p ORDER BY x)``, which parses back with the ORDER BY
    in the fraction's place, so the quantile part of a mixed query, handed on as text, was
    refused on DuckDB (and answered on Postgres)."""
    if not isinstance(node, exp.WithinGroup) \
            or not isinstance(node.this, exp.PercentileCont | exp.PercentileDisc):
        return node
    order = node.expression
    fraction = node.this.this
    if not isinstance(order, exp.Order) or len(order.expressions) != 1 \
            or not isinstance(fraction, exp.Literal) or fraction.is_string:
        return node  # left as written: the quantile analysis refuses it with its reason
    ordered = order.expressions[0]
    p = float(fraction.this)
    plain = type(node.this)(this=ordered.this.copy(),
                            expression=exp.Literal.number(1.0 - p if ordered.args.get("desc")
                                                          else fraction.this))
    return plain


def split_mixed(sql: str, dialect: str) -> MixedSplit:
    """Split a mixed query (see the module docstring); refusals raise and cost nothing."""
    try:
        tree = filters_as_case(sqlglot.parse_one(sql, read=dialect_named(dialect)))
    except (ParseError, TokenError) as err:  # asks_mixed parsed it: not expected
        raise NotSupportedError(f"syntax error: {err}") from None
    if not isinstance(tree, exp.Select):
        raise NotSupportedError("quantiles next to other aggregates are answered in one "
                                "SELECT only", hint="ask them in separate queries")
    if tree.args.get("distinct") is not None:
        raise NotSupportedError("SELECT DISTINCT in a query that mixes quantiles with other "
                                "aggregates is not supported", hint="leave out DISTINCT")
    items = list(tree.expressions)
    names = output_names(tree)
    group = tree.args.get("group")
    keys = [_resolve_key(g, items) for g in (group.expressions if group is not None else ())]
    lifter = _Lifter(keys)
    outputs = [lifter.lift(item.this if isinstance(item, exp.Alias) else item, {})
               for item in items]
    aliases = {name: out for name, out, item in zip(names, outputs, items, strict=True)
               if isinstance(item, exp.Alias)}
    having_node = tree.args.get("having")
    having = lifter.lift(having_node.this, aliases) if having_node is not None else None
    order = []
    for o in (tree.args.get("order") or exp.Order()).expressions:
        term = o.this if isinstance(o, exp.Ordered) else o
        if not (isinstance(term, exp.Literal) and not term.is_string):
            term = lifter.lift(term, {n: exp.column(n, quoted=True) for n in aliases})
        order.append(exp.Ordered(this=term, desc=o.args.get("desc"),
                                 nulls_first=o.args.get("nulls_first")))
    if lifter.strays:
        raise NotSupportedError(
            f"{display_sql(lifter.strays[0])} is neither a group key nor inside an aggregate",
            hint=f"add {display_sql(lifter.strays[0])} to GROUP BY, or aggregate it")
    for node in (*outputs, *([having] if having is not None else []),
                 *(o.this for o in order)):
        for n in node.walk():
            check_node(n)  # the finish allows what any query's outputs allow, nothing more
    limit, offset = _count(tree.args.get("limit"), "LIMIT"), _count(tree.args.get("offset"),
                                                                     "OFFSET")

    def part(selected: dict[str, exp.Expr]) -> str:
        sub = tree.copy()
        sub.set("expressions", [e.copy() for e in (*keys, *selected.values())])
        if group is not None:
            sub.set("group", exp.Group(expressions=[k.copy() for k in keys]))
        for arg in ("having", "order", "limit", "offset"):
            sub.set(arg, None)
        if dialect == "duckdb":
            sub = sub.transform(plain_percentile, copy=False)
        return sub.sql(dialect_named(dialect))

    finish = exp.select(*[exp.alias_(o.copy(), n, quoted=True) for o, n in zip(outputs, names,
                                                                         strict=True)],
                        exp.column(ROW)).from_(NOISY)
    if having is not None:
        finish = finish.where(having, copy=False)
    if order:
        finish = finish.order_by(*order, copy=False)
    if limit is not None:
        finish = finish.limit(limit, copy=False)
    if offset is not None:
        finish = finish.offset(offset, copy=False)
    sources = tuple(o.name if isinstance(o, exp.Column) and not o.table else None
                    for o in outputs)
    return MixedSplit(
        sql, part(lifter.quantiles), part(lifter.analytic), len(keys),
        tuple(display_sql(q) for q in lifter.quantiles.values()),
        tuple(display_sql(a) for a in lifter.analytic.values()),
        tuple(isinstance(a.this if isinstance(a, exp.Filter) else a, exp.Count)
              for a in lifter.analytic.values()), tuple(outputs),
        tuple(_name(item, name) for item, name in zip(items, names, strict=True)), sources,
        tuple(display_sql(item) for item in items), finish.sql(dialect_named("duckdb")))


def _name(item: exp.Expr, name: str) -> str:
    """An unnamed PERCENTILE_CONT(...) WITHIN GROUP (...) is named as Postgres names it."""
    if isinstance(item, exp.WithinGroup):
        return item.this.sql_name().lower()
    return name


def _resolve_key(node: exp.Expr, items: list[exp.Expr]) -> exp.Expr:
    """A GROUP BY term as an expression: an ordinal (GROUP BY 2) or an output name (GROUP BY
    c, for ``x AS c``) names a select item."""
    if isinstance(node, exp.Literal) and not node.is_string and node.name.isdigit():
        index = int(node.name) - 1
        if 0 <= index < len(items):
            item = items[index]
            return (item.this if isinstance(item, exp.Alias) else item).copy()
    if isinstance(node, exp.Column) and not node.table:
        for item in items:
            if isinstance(item, exp.Alias) and item.alias == node.name \
                    and not any(_is_aggregate(n) for n in item.walk()):
                return item.this.copy()
    return node


def _count(node: exp.Expr | None, what: str) -> int | None:
    if node is None:
        return None
    value = node.expression if isinstance(node, exp.Limit | exp.Offset) else node
    if isinstance(value, exp.Literal) and not value.is_string and value.name.isdigit():
        return int(value.name)
    raise NotSupportedError(f"{what} must be a non-negative integer literal")
