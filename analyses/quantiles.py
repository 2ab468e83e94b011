"""DP quantiles: which queries ask for them, and what each asks (``chorus_py.kinds.quantile``).

Accepted: MEDIAN(x); PERCENTILE_CONT(p) / PERCENTILE_DISC(p) WITHIN GROUP (ORDER BY x [DESC]);
DuckDB's QUANTILE(x, p), QUANTILE_CONT / QUANTILE_DISC(x, p), APPROX_QUANTILE(x, p); MIN(x) and
MAX(x), answered as the 1st and 99th percentiles (:data:`MIN_P`, :data:`MAX_P`): the true
minimum of a column has no bounded sensitivity (one person moves it to any bound), a
low percentile does.  ``ORDER BY x DESC`` asks for the (1 - p)-quantile.

The rest of the query is analysed by ``analyses.query`` itself, so the table, filter, block,
group keys, totality and declared bounds follow exactly the rules of every other aggregate:
each quantile is first replaced by a marked ``SUM(x)`` (which needs x bounded and total, as a
quantile over the clipped x does), then the markers in the lifted outputs become the quantile's
own id ``q<i>``.  Joins are accepted when the join rows one person changes are bounded by a
public constant (``analyses.quantile_joins``).  Other aggregates in the same query are split
off by ``analyses.mixed``; what stays refused names the mode that answers it.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable
from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from analyses.aggregate_filters import filters_as_case
from analyses.join_groups import check_join_keys
from analyses.keys import TableKeys
from analyses.quantile_joins import check_quantile_join
from analyses.query import AggregateQuery, OutputColumn, PublicQuery, display_sql
from analyses.trees import dialect_named, sql_text
from analyses.validate import AGGREGATES
from chorus_py.errors import NotSupportedError, QueryRefused

#: MIN(x) and MAX(x) are answered as these quantiles (documented in docs/analyst-guide.md).
MIN_P = 0.01
MAX_P = 0.99

_FRACTION_FUNCTIONS = (exp.PercentileCont, exp.PercentileDisc, exp.Quantile,
                       exp.ApproxQuantile)
QUANTILE_NODES: tuple[type[exp.Expr], ...] = (exp.Median, exp.Min, exp.Max, exp.WithinGroup,
                                              *_FRACTION_FUNCTIONS)
# A marker no analyst query can contain next to an aggregate: the query holds no other
# aggregate (checked before the substitution), so ``SUM(x) + marker`` comes only from here.
_MARKER = "90719925474099{:03d}"
_MAX_QUANTILES = 64

SAMPLED_HINT = ("or opt in to sensitivity sampling, which answers any percentile: "
                "SET chorus.sensitivity = 'sampled' (REST: \"sensitivity\": \"sampled\")")


@dataclass(frozen=True)
class QuantileSpec:
    """One quantile the query asks: q<i> = the p-quantile of ``argument`` clipped to
    [lower, upper]; ``integral`` for an integer column (answers are rounded)."""

    id: str
    p: float
    function: str
    source: str
    argument: exp.Expr
    lower: float
    upper: float
    integral: bool


@dataclass(frozen=True)
class QuantileQuery:
    """A quantile query: the analysed query (its table, filter, keys, stability; its outputs,
    HAVING and ORDER BY over key ids ``k<j>`` and quantile ids ``q<i>``) and its quantiles."""

    query: AggregateQuery
    quantiles: tuple[QuantileSpec, ...]

    @property
    def shape(self) -> tuple[object, ...]:
        """What determines the answer's statements and meaning: the normalised query (its
        quantiles show there as the same marked SUMs, whatever their p) and each quantile's
        function, p and argument, and the output names.  Caches key on this."""
        return (self.query.normalized_sql,
                tuple((q.function, q.p, sql_text(q.argument)) for q in self.quantiles),
                tuple(o.name for o in self.query.outputs))

    @property
    def arguments(self) -> tuple[str, ...]:
        """The distinct quantiled expressions (their SQL), in order: one histogram each."""
        return tuple(dict.fromkeys(sql_text(q.argument) for q in self.quantiles))


#: Every function sqlglot reads as a quantile, MEDIAN, MIN or MAX holds one of these words in
#: its name, in each dialect the proxy reads (tests/test_quantiles.py checks sqlglot's tables).
_QUANTILE_WORDS = re.compile(r"MIN|MAX|PERCENTILE|QUANTILE|MEDIAN", re.IGNORECASE)


def may_ask_quantiles(sql: str) -> bool:
    """False when ``sql`` cannot hold a quantile, MEDIAN, MIN or MAX (none of their names'
    words appears in its text): the routing then skips a parse, a tenth of a never-seen
    query's analysis.  A text it lets through is parsed (:func:`parsed_to_read`); one it
    turned away wrongly would reach the ordinary analysis, which refuses aggregates it does
    not know: never a quantile answered without its own mechanism.

    >>> may_ask_quantiles("SELECT COUNT(*) FROM trips"), may_ask_quantiles("SELECT max(x) FROM t")
    (False, True)
    """
    return _QUANTILE_WORDS.search(sql) is not None


def asks_quantiles(sql: str, dialect: str) -> bool:
    """Whether ``sql`` holds a quantile, MIN or MAX (a cheap parse; False if it does not parse:
    the ordinary path then reports the syntax error)."""
    if not may_ask_quantiles(sql):
        return False
    trees = parsed_to_read(sql, dialect)
    return trees is not None and any(any(is_quantile(n) for n in tree.walk()) for tree in trees)


@functools.lru_cache(maxsize=8)
def parsed_to_read(sql: str, dialect: str) -> tuple[exp.Expr, ...] | None:
    """The statements of ``sql`` (None: it does not parse), for questions that only read them:
    the engine asks ``analyses.mixed.asks_mixed`` then :func:`asks_quantiles` of one text, which
    parsed it twice.  Shared between callers: never to be changed."""
    try:
        trees = sqlglot.parse(sql, read=dialect_named(dialect))
        return tuple(tree for tree in trees if tree is not None)
    except (ParseError, TokenError, RecursionError, ValueError):
        return None


def is_quantile(node: exp.Expr) -> bool:
    """Whether ``node`` is a quantile, MEDIAN, MIN or MAX aggregate (one node per quantile:
    not the PERCENTILE_CONT inside its WITHIN GROUP)."""
    if isinstance(node, exp.WithinGroup):
        return isinstance(node.this, exp.PercentileCont | exp.PercentileDisc)
    if isinstance(node, exp.Min | exp.Max):
        return not node.expressions  # MIN(a, b) is LEAST in some dialects: not an aggregate
    return isinstance(node, QUANTILE_NODES) and not isinstance(node.parent, exp.WithinGroup)


def substitute(tree: exp.Expr) -> tuple[exp.Expr, list[tuple[float, str, str]]]:
    """A copy of ``tree`` with quantile i replaced by ``(SUM(x) + marker_i)``, and for each
    distinct quantile (p, function name, source text).  Refuses other aggregates next to
    quantiles."""
    other = next((n for n in tree.find_all(*AGGREGATES)), None)
    if other is not None:
        raise NotSupportedError(
            f"{display_sql(other)} next to a quantile, MIN or MAX: a query answers either "
            "quantiles or COUNT/SUM/AVG-like aggregates, not both here",
            hint="name each aggregate on its own (outputs, HAVING and ORDER BY may combine "
            "them: analyses.mixed), never one inside another, or ask them in separate queries")
    found: list[tuple[float, str, str]] = []
    # The same quantile asked twice (in SELECT and HAVING or ORDER BY, or MEDIAN(x) next to
    # PERCENTILE_CONT(0.5) ... x) is one release: one draw, one charge, the same value in both.
    seen: dict[tuple[float, str], int] = {}

    def visit(node: exp.Expr) -> exp.Expr:
        if not is_quantile(node):
            return node
        value, p, name = _read(node)
        index = seen.get((p, sql_text(value)))
        if index is None:
            if len(found) >= _MAX_QUANTILES:
                raise QueryRefused(f"more than {_MAX_QUANTILES} quantiles in one query")
            index = seen[(p, sql_text(value))] = len(found)
            found.append((p, name, display_sql(node)))
        marker = exp.Literal.number(_MARKER.format(index))
        return exp.Paren(this=exp.Add(this=exp.Sum(this=value.copy()), expression=marker))

    return tree.copy().transform(visit), found


def _read(node: exp.Expr) -> tuple[exp.Expr, float, str]:
    """(value, p, function name) of one quantile node."""
    if isinstance(node, exp.WithinGroup):
        inner, order = node.this, node.expression
        if not isinstance(order, exp.Order) or len(order.expressions) != 1:
            raise NotSupportedError("PERCENTILE_CONT/DISC need WITHIN GROUP (ORDER BY one "
                                    "expression)")
        ordered = order.expressions[0]
        p = _fraction(inner.this, inner.sql_name())
        return (_value(ordered.this, inner.sql_name()),
                1.0 - p if ordered.args.get("desc") else p, inner.sql_name())
    if isinstance(node, exp.Median):
        return _value(node.this, "MEDIAN"), 0.5, "MEDIAN"
    if isinstance(node, exp.Min):
        return _value(node.this, "MIN"), MIN_P, "MIN"
    if isinstance(node, exp.Max):
        return _value(node.this, "MAX"), MAX_P, "MAX"
    name = node.sql_name()
    p_node = node.args.get("quantile") if isinstance(node, exp.Quantile | exp.ApproxQuantile) \
        else node.args.get("expression")
    return _value(node.this, name), _fraction(p_node, name), name


def _value(node: exp.Expr | None, name: str) -> exp.Expr:
    if node is None or isinstance(node, exp.Star):
        raise QueryRefused(f"{name} needs a value to rank")
    if isinstance(node, exp.Distinct):
        raise NotSupportedError(f"{name}(DISTINCT ...) is not supported",
                                hint=f"use {name}(column)")
    return node


def _fraction(node: exp.Expr | None, name: str) -> float:
    if not isinstance(node, exp.Literal) or node.is_string:
        raise QueryRefused(f"{name}: the fraction must be a number literal in [0, 1]",
                           hint="e.g. PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY fare)")
    p = float(node.name)
    if not 0.0 <= p <= 1.0:
        raise QueryRefused(f"{name}: the fraction {node.name} is outside [0, 1]")
    return p


def analyze_quantiles(sql: str, dialect: str,
                      analyse: Callable[[str], object]) -> QuantileQuery:
    """Analyse a quantile query: ``analyse`` is the ordinary analysis (parse, validate, bind,
    ``analyses.query.analyze_query``) applied to the query with its quantiles substituted."""
    try:
        tree = filters_as_case(sqlglot.parse_one(sql, read=dialect_named(dialect)))
    except (ParseError, TokenError) as err:  # asks_quantiles parsed it: not expected
        raise QueryRefused(f"syntax error: {err}") from None
    replaced, found = substitute(tree)
    analysis = analyse(replaced.sql(dialect_named(dialect)))
    if isinstance(analysis, PublicQuery):
        raise QueryRefused("quantiles of public tables need no privacy: the proxy answers "
                           "public tables exactly only with ordinary aggregates",
                           hint="use the aggregates COUNT, SUM, AVG on public tables")
    where = "a quantile, MIN or MAX"
    if not isinstance(analysis, AggregateQuery):  # a per-person question (analyses.per_person)
        raise NotSupportedError(
            f"{where} of per-person values is not supported yet",
            hint="ask the per-person question with COUNT, SUM or AVG, or the quantile of the "
                 "table's own rows")
    if analysis.join is not None:
        # The join's rows per person must be a public constant (analyses.quantile_joins);
        # keys released by a threshold need a public bound on the groups a person reaches.
        check_quantile_join(analysis.join)
        if analysis.thresholded:
            check_join_keys(analysis.join, [k.expr for k in analysis.keys
                                            if k.public_values is None and k.domain is None],
                            f"{where} grouped by a column without public values")
        if analysis.thresholded and any(isinstance(k.domain, TableKeys)
                                        for k in analysis.keys):
            raise NotSupportedError(
                f"{where} grouped both by a column of a joined public table and by a column "
                "without public values is not supported",
                hint="group by the public table's columns and columns with public_values, or "
                "ask COUNT/SUM/AVG with these keys")
    if analysis.thresholded:
        # Keys without public values are released in the proxy by a noisy count above a
        # threshold (chorus_py.kinds.quantile): a plain column, whose declared type types them.
        key = next((k for k in analysis.keys if k.public_values is None
                    and not isinstance(k.expr, exp.Column)), None)
        if key is not None:
            raise NotSupportedError(
                f"{where} grouped by {display_sql(key.expr)}, an expression without public "
                "values, is not supported",
                hint="group the quantile by a column, a column with public_values (the data "
                "owner declares them) or a calendar bucket of the block column (DATE_TRUNC, "
                f"EXTRACT), or ask COUNT/SUM/AVG grouped by {display_sql(key.expr)}")
    by_marker = {_MARKER.format(i): i for i in range(len(found))}
    measured = {m.id: m for m in analysis.measurements}
    specs: dict[int, QuantileSpec] = {}

    def unmark(node: exp.Expr) -> exp.Expr:
        summed = _measured_column(node.this) if isinstance(node, exp.Add) else None
        if isinstance(node, exp.Add) and isinstance(node.expression, exp.Literal) and \
                node.expression.name in by_marker and summed is not None:
            i = by_marker[node.expression.name]
            m = measured[summed.name]
            assert m.lower is not None and m.upper is not None and m.argument is not None
            p, name, source = found[i]
            specs[i] = QuantileSpec(f"q{i}", p, name, source, m.argument, m.lower, m.upper,
                                    _integral(analysis, m.argument))
            return exp.column(f"q{i}")
        return node

    outputs = tuple(dataclasses.replace(o, expr=_bare(o.expr.transform(unmark)),
                                        source=_unmarked_text(o.source, found))
                    for o in analysis.outputs)
    having = analysis.having.transform(unmark) if analysis.having is not None else None
    order = tuple(exp.Ordered(this=o.this.transform(unmark), desc=o.args.get("desc"),
                              nulls_first=o.args.get("nulls_first")) for o in analysis.order)
    outputs = tuple(dataclasses.replace(o, measurements=_quantile_ids(o), name=_name(item, o))
                    for o, item in zip(outputs, tree.expressions, strict=True))
    if any(c.name.startswith("m") for o in outputs for c in o.expr.find_all(exp.Column)):
        raise NotSupportedError("a query answers either quantiles or other aggregates")
    query = dataclasses.replace(analysis, outputs=outputs, having=having, order=order)
    return QuantileQuery(query, tuple(specs[i] for i in sorted(specs)))


def _measured_column(node: exp.Expr) -> exp.Column | None:
    """The measurement column of a lifted SUM: ``m0``, or ``(m0 * grid)`` in a join, where
    sums are measured in grid steps (``analyses.query``)."""
    if isinstance(node, exp.Paren) and isinstance(node.this, exp.Mul) \
            and isinstance(node.this.expression, exp.Literal):
        node = node.this.this
    return node if isinstance(node, exp.Column) else None


def _bare(node: exp.Expr) -> exp.Expr:
    """``(q0)`` as ``q0``: the parentheses the substitution put around each quantile."""
    return node.transform(lambda n: n.this if isinstance(n, exp.Paren)
                          and isinstance(n.this, exp.Column) else n)


def _name(item: exp.Expr, out: OutputColumn) -> str:
    """An unnamed quantile output is named as Postgres names it: its function, lower case."""
    if isinstance(item, exp.Alias) or not is_quantile(item):
        return out.name
    inner = item.this if isinstance(item, exp.WithinGroup) else item
    return inner.sql_name().lower()


def _quantile_ids(out: OutputColumn) -> tuple[str, ...]:
    return tuple(sorted({c.name for c in out.expr.find_all(exp.Column)
                         if c.name.startswith("q")}))


def _unmarked_text(text: str, found: list[tuple[float, str, str]]) -> str:
    """``text`` (an output's source, rendered from the marked tree) with each marked
    ``(SUM(x) + marker_i)`` back as the analyst wrote the quantile (``MEDIAN(fare)``)."""
    for i, (_, _, source) in enumerate(found):
        tail = f" + {_MARKER.format(i)})"
        while (end := text.find(tail)) >= 0:
            depth, start = 0, end - 1
            while start >= 0:  # back to the parenthesis that opens "(SUM(x) + marker"
                depth += {")": 1, "(": -1}.get(text[start], 0)
                if depth < 0:
                    break
                start -= 1
            if start < 0:
                break
            text = text[:start] + source + text[end + len(tail):]
    return text


def _integral(query: AggregateQuery, argument: exp.Expr) -> bool:
    """Whether the quantiled value is an integer column (its answers are rounded)."""
    return declared_type(query, argument) == "int"


def declared_type(query: AggregateQuery, node: exp.Expr) -> str | None:
    """The declared type of a column of the query (of the table its alias names, in a join),
    None for an expression or an undeclared column."""
    if not isinstance(node, exp.Column):
        return None
    policy = query.table_policy
    if query.join is not None:
        source = next((s for s in query.join.sources if s.alias == node.table), None)
        if source is None:
            return None
        policy = source.policy
    column = policy.columns.get(node.name)
    return column.type if column is not None else None
