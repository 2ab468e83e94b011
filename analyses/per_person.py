"""Questions about people, not rows: an outer aggregate over per-person values.

Shape::

    WITH per AS (SELECT rider_id, SUM(fare) AS spend FROM trips [WHERE ...] GROUP BY rider_id)
    SELECT AVG(spend) FROM per [WHERE ...] [GROUP BY ...]

(or the same with ``FROM (SELECT ...) AS per``).  The inner query groups a private table by
its privacy unit, so each person is exactly one row of ``per``; every per-person value is
clipped to an interval [L, U] in SQL (``LEAST(GREATEST(v, L), U)``).  Adding or removing one
person adds or removes exactly one row of ``per`` and changes no other row: a person's value
is an aggregate of that person's rows only (other private tables may be inner-joined only on
the unit, ``b.unit = a.unit``; public tables never change).  ``COUNT(DISTINCT a.unit)`` over
such a join is the same question: the people with a joined row (``_distinct_units``).  The
outer query is therefore an ordinary aggregate over a relation of *stability 1* whose columns
are bounded by [L, U]: COUNT -> 1, SUM(v) -> max(|L|, |U|), AVG via a noisy sum and a noisy
count (``analyses.query``, event-level rules on that relation).

The bounds [L, U] of a value come, in this order, from

1. the query itself: the interval of its expression when every aggregate has a finite natural
   range (AVG/MIN/MAX of a bounded column, or COUNT/SUM under the query's own LEAST,
   GREATEST or CASE);
2. the policy: the expression's interval with COUNT in [0, k] and SUM(x) in
   [k min(l, 0), k max(u, 0)], k = ``max_rows_per_unit`` (what a person may contribute).

Whichever applies, the clip is in the SQL, so the bound holds for every person whatever the
data.  A per-person count whose bounds are integers is an integer, and its values L..U are
public keys (a histogram of trips per rider needs no threshold).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import sqlglot
from sqlglot import exp

from analyses.bounds import Interval, expression_bounds
from analyses.joins import JoinInfo
from analyses.query import AggregateQuery, PublicQuery, analyze_query
from analyses.totality import ConstantCheck
from analyses.trees import sql_text
from analyses.validate import ParsedStatement
from chorus_py.errors import NotSupportedError, QueryRefused
from chorus_py.policy import ColumnPolicy, Policy, TablePolicy

# The name of the per-person relation in the generated SQL (replaced by the inner SELECT).
RELATION = "chorus_per_person"
# A per-person count with at most this many values has public keys L..U; wider ones are
# released through the noisy threshold like any other key.
MAX_PUBLIC_KEYS = 1000
_PER_PERSON_AGGREGATES = (exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max)
# What a per-person value may be built from, around its aggregates.
_VALUE_NODES = (exp.Paren, exp.Neg, exp.Add, exp.Sub, exp.Mul, exp.Least, exp.Greatest,
                exp.Literal, exp.Case, exp.If, exp.Cast, exp.DataType)
_FORBIDDEN_INSIDE = {"having": "HAVING", "limit": "LIMIT", "offset": "OFFSET",
                     "order": "ORDER BY", "distinct": "DISTINCT", "qualify": "QUALIFY"}


@dataclass(frozen=True)
class PerPersonValue:
    """One column of the per-person relation: ``expr`` (over the person's rows, qualified)
    clipped to [lower, upper]; ``origin`` says where the bounds came from."""

    name: str
    expr: exp.Expr
    lower: float
    upper: float
    integral: bool
    origin: str


@dataclass(frozen=True)
class PerPersonQuery:
    """An outer aggregate (``outer``, over the relation ``RELATION``) of per-person values.

    ``rows`` is the inner query's rows as an analysed query (its WHERE, its join and the
    blocks it reads);
    ``values`` the per-person columns; ``alias`` the inner table's alias; ``schema`` the
    backend's schema of the generated SQL.
    """

    table: str
    unit: str
    alias: str
    rows: AggregateQuery
    values: tuple[PerPersonValue, ...]
    outer: AggregateQuery
    schema: str | None
    tables: tuple[str, ...]  # every table the subquery reads (the first, and its joins)

    @property
    def normalized_sql(self) -> str:
        """The analysed query, for caches: the inner rows and the outer query."""
        return self.rows.normalized_sql + " | " + self.outer.normalized_sql + " | " + \
            ", ".join(f"{v.name}={sql_text(v.expr)}:[{v.lower:g},{v.upper:g}]" for v in self.values)


def analyze_per_person(parsed: ParsedStatement, policy: Policy, dialect: str,
                       public_columns: dict[str, dict[str, str]],
                       constants: ConstantCheck | None = None,
                       db: str | None = None) -> PerPersonQuery | None:
    """The per-person reading of ``parsed``, or None when it does not have that shape (an
    outer query reading one subquery or CTE that aggregates with GROUP BY).  Refuses, naming
    the fix, a query of that shape that is not bounded."""
    tree = _distinct_units(parsed.tree, policy)
    found = _inner_select(tree)
    if found is None:
        return None
    inner, outer_alias = found
    source = inner.args["from_"].this if inner.args.get("from_") else None
    if not isinstance(source, exp.Table) or source.name not in policy.tables \
            or policy.tables[source.name].public:
        return None  # aggregation over a public table (or worse): the usual refusals
    table = source.name
    tp = policy.tables[table]
    unit = tp.privacy_unit
    if not isinstance(unit, str):
        raise NotSupportedError(
            f"a per-person subquery needs one privacy unit column; table '{table}' has "
            + ("none (event-level)" if unit is None else "several units per row"),
            hint="aggregate the rows in one SELECT")
    _check_inner_shape(inner, table, unit)
    values, unit_outputs = _values(inner, unit)
    rows = _rows_query(inner, source, values, unit, parsed, policy, dialect, public_columns,
                       constants, db)
    stands = _qualified_aggregates(rows)
    per_values = []
    for name, expr in values:
        n = len(_top_aggregates(expr))
        per_values.append(_bounded_value(name, expr, stands[:n], rows, tp))
        stands = stands[n:]
    outer = _outer_query(tree, outer_alias, tuple(per_values), unit_outputs, table, unit,
                         policy, dialect, constants)
    return PerPersonQuery(table, unit, rows.alias, rows, tuple(per_values), outer, db,
                          rows.tables)


def _distinct_units(tree: exp.Select, policy: Policy) -> exp.Select:
    """``SELECT COUNT(DISTINCT a.unit) FROM a JOIN b ON ... WHERE ...`` (a join, the unit of
    its first table) as the per-person question it is: the number of people with at least one
    joined row, ``SELECT COUNT(*) FROM (SELECT COUNT(*) FROM a JOIN b ... WHERE ... AND a.unit
    IS NOT NULL GROUP BY a.unit)``.  Any other query is returned as it is.

    The same holds for one table with a filter and per-query bounding (``SELECT COUNT(DISTINCT
    unit) FROM a WHERE ...``): the people with a row that passes the filter.  Its ordinary
    reading bounds each unit to one filtered row (Delta = 1 either way: a unit adds at most 1
    to the count, however many rows it has), which ranks every filtered row of the units with
    several; grouping by the unit reads the same rows once, and counts the same people.
    Without a filter the ordinary reading is cheaper (the ranked copy's first row of each
    unit); with materialized bounding it counts the stored sample, as every query there does.
    """
    items = tree.expressions
    source = tree.args["from_"].this if tree.args.get("from_") else None
    if len(items) != 1 or not isinstance(source, exp.Table) \
            or any(tree.args.get(a) for a in ("group", "having", "with_", "distinct")):
        return tree
    count = items[0].this if isinstance(items[0], exp.Alias) else items[0]
    tp = policy.tables.get(source.name)
    if not isinstance(count, exp.Count) or not isinstance(count.this, exp.Distinct) \
            or tp is None or not isinstance(tp.privacy_unit, str):
        return tree
    if not tree.args.get("joins") and (tree.args.get("where") is None
                                       or tp.bounding != "per-query"):
        return tree
    cols = count.this.expressions
    alias = source.alias_or_name
    if len(cols) != 1 or not isinstance(cols[0], exp.Column) \
            or cols[0].name != tp.privacy_unit or cols[0].table not in ("", alias):
        return tree
    unit = exp.column(tp.privacy_unit, table=alias)
    where = exp.Not(this=exp.Is(this=unit.copy(), expression=exp.Null()))
    if tree.args.get("where") is not None:
        where = exp.and_(tree.args["where"].this.copy(), where)
    inner = exp.select(exp.alias_(exp.Count(this=exp.Star()), "chorus_rows")).from_(
        source.copy(), copy=False)
    if tree.args.get("joins"):
        inner.set("joins", [j.copy() for j in tree.args["joins"]])
    inner = inner.where(where, copy=False).group_by(unit, copy=False)
    name = items[0].alias if isinstance(items[0], exp.Alias) else "count"
    outer = exp.select(exp.alias_(exp.Count(this=exp.Star()), name)).from_(
        inner.subquery("chorus_units", copy=False), copy=False)
    for key in ("order", "limit", "offset"):
        if tree.args.get(key) is not None:
            outer.set(key, tree.args[key].copy())
    return outer


# -- the shape --------------------------------------------------------------------------------
def _inner_select(tree: exp.Select) -> tuple[exp.Select, str] | None:
    """The aggregating subquery or CTE the outer query reads, and the outer alias of it."""
    if tree.args.get("joins"):
        return None
    src = tree.args["from_"].this if tree.args.get("from_") else None
    inner: exp.Expr | None = None
    if isinstance(src, exp.Subquery):
        inner = src.this
    elif isinstance(src, exp.Table) and src.args.get("db") is None:
        with_ = tree.args.get("with_")
        ctes = with_.expressions if isinstance(with_, exp.With) else []
        named = [c for c in ctes if c.alias_or_name == src.name]
        if len(named) != 1:
            return None
        if len(ctes) != 1:
            raise NotSupportedError(
                "a per-person query may define one CTE only (the per-person values)",
                hint="remove the other CTEs")
        inner = named[0].this
    if not isinstance(inner, exp.Select) or inner.args.get("group") is None:
        return None
    return inner, src.alias_or_name


def _check_inner_shape(inner: exp.Select, table: str, unit: str) -> None:
    group = inner.args["group"]
    keys = [_positional(k, inner) for k in group.expressions]
    if len(keys) != 1 or not isinstance(keys[0], exp.Column) or keys[0].name != unit \
            or any(group.args.get(a) for a in ("rollup", "cube", "grouping_sets")):
        raise QueryRefused(
            f"a subquery that aggregates '{table}' must GROUP BY its privacy unit '{unit}' "
            "alone: only then does each person give one row to the outer query",
            hint=f"GROUP BY {unit} in the subquery and aggregate its rows in the outer query")
    first = inner.args["from_"].this.alias_or_name
    if keys[0].table not in ("", first):
        raise QueryRefused(
            f"a per-person subquery must GROUP BY the privacy unit of its first table "
            f"({first}.{unit})", hint=f"GROUP BY {first}.{unit}")
    for join in inner.args.get("joins") or []:
        if join.side or (join.kind or "INNER").upper() != "INNER" \
                or join.args.get("on") is None or not isinstance(join.this, exp.Table):
            raise NotSupportedError(
                "a per-person subquery may only INNER JOIN tables with ON conditions",
                hint=f"JOIN other tables ON their {unit} = {first}.{unit}")
    for arg, name in _FORBIDDEN_INSIDE.items():
        if inner.args.get(arg):
            hint = ("move the condition on the per-person value to the outer WHERE"
                    if arg == "having" else f"remove {name} from the subquery")
            raise QueryRefused(f"{name} in a per-person subquery is not supported", hint=hint)
    if inner.args.get("with_") or any(s is not inner for s in inner.find_all(exp.Select)) \
            or inner.find(exp.Window) is not None:
        raise NotSupportedError(
            "a per-person subquery may not hold subqueries or window functions",
            hint=f"one SELECT ... FROM {table} WHERE ... GROUP BY {unit}")


def _positional(key: exp.Expr, inner: exp.Select) -> exp.Expr:
    """``GROUP BY 1``: the first output's expression (the unit, when it is output first)."""
    if isinstance(key, exp.Literal) and key.is_int and \
            1 <= int(key.name) <= len(inner.expressions):
        item = inner.expressions[int(key.name) - 1]
        return item.this if isinstance(item, exp.Alias) else item
    return key


def _values(inner: exp.Select, unit: str) -> tuple[list[tuple[str, exp.Expr]], set[str]]:
    """The per-person values (name, expression) and the names the unit is output under."""
    values: list[tuple[str, exp.Expr]] = []
    unit_outputs: set[str] = set()
    for item in inner.expressions:
        expr = item.this if isinstance(item, exp.Alias) else item
        if isinstance(expr, exp.Column) and expr.name == unit:
            unit_outputs.add(item.alias_or_name)
            continue
        aggs = [n for n in expr.find_all(exp.AggFunc)]
        if not aggs:
            raise QueryRefused(
                f"the per-person subquery outputs {sql_text(item)[:80]}, which is neither the "
                f"unit nor an aggregate of the person's rows",
                hint="output aggregates such as COUNT(*) AS n or SUM(fare) AS spend")
        if not isinstance(item, exp.Alias):
            raise QueryRefused(f"name the per-person value {sql_text(expr)[:80]}",
                               hint=f"write {sql_text(expr)[:60]} AS some_name")
        for node in expr.walk():
            inside = any(isinstance(a, exp.AggFunc) for a in _ancestors(node, expr))
            if inside:
                continue
            if isinstance(node, exp.AggFunc):
                if not isinstance(node, _PER_PERSON_AGGREGATES):
                    raise NotSupportedError(
                        f"{node.sql_name()} of a person's rows is not supported",
                        hint="use COUNT, SUM, AVG, MIN or MAX")
            elif isinstance(node, exp.Column):
                raise QueryRefused(
                    f"column {node.name} in a per-person value is outside any aggregate",
                    hint="aggregate it, e.g. SUM(" + node.name + ")")
            elif not isinstance(node, (*_VALUE_NODES, exp.Predicate, exp.Connector,
                                       exp.Not, exp.Boolean, exp.Null)):
                raise NotSupportedError(
                    f"{type(node).__name__.upper()} in a per-person value is not supported",
                    hint="combine aggregates with +, -, * by a constant, LEAST, GREATEST, CASE")
        values.append((item.alias, expr))
    if not values:
        raise QueryRefused("the per-person subquery computes no value",
                           hint="add an aggregate such as COUNT(*) AS n")
    return values, unit_outputs


def _ancestors(node: exp.Expr, stop: exp.Expr) -> list[exp.Expr]:
    out = []
    parent = node.parent
    while parent is not None and node is not stop:
        out.append(parent)
        if parent is stop:
            break
        parent = parent.parent
    return out


def _stand_in(agg: exp.Expr) -> exp.Expr:
    """The one-table aggregate that checks ``agg``'s argument (totality, bounds)."""
    arg = agg.this
    if isinstance(agg, exp.Count):
        if isinstance(arg, exp.Distinct):
            return exp.Count(this=arg.expressions[0].copy()) if len(arg.expressions) == 1 \
                else _refuse_distinct()
        return agg.copy()
    return exp.Sum(this=arg.copy())  # SUM needs declared bounds, like AVG, MIN and MAX


def _refuse_distinct() -> exp.Expr:
    raise NotSupportedError("COUNT(DISTINCT a, b) per person is not supported",
                            hint="count one column")


def _rows_query(inner: exp.Select, source: exp.Table, values: list[tuple[str, exp.Expr]],
                unit: str, parsed: ParsedStatement, policy: Policy, dialect: str,
                public_columns: dict[str, dict[str, str]], constants: ConstantCheck | None,
                db: str | None) -> AggregateQuery:
    """The inner query as a one-table query ``SELECT COUNT(*), <stand-ins> FROM t WHERE ...``:
    analysed by ``analyses.query`` (qualified names, the WHERE and every argument proven
    total, arguments bounded), and read for its blocks."""
    items: list[exp.Expr] = [exp.alias_(exp.Count(this=exp.Star()), "chorus_rows")]
    for i, agg in enumerate(a for _, expr in values for a in _top_aggregates(expr)):
        items.append(exp.alias_(_stand_in(agg), f"chorus_a{i}"))
    synthetic = exp.select(*items).from_(source.copy(), copy=False)
    joins = inner.args.get("joins") or []
    if joins:
        synthetic.set("joins", [j.copy() for j in joins])
    where = inner.args.get("where")
    if where is not None:
        synthetic = synthetic.where(where.this.copy(), copy=False)
    read = {t.name for t in synthetic.find_all(exp.Table)}
    tables = tuple(t for t in parsed.tables if t in read)
    analysed = analyze_query(ParsedStatement(synthetic, tables), policy, dialect, public_columns,
                             constants, db)
    assert not isinstance(analysed, PublicQuery)
    if analysed.join is not None:
        _check_unit_joins(analysed.join, analysed.alias, unit)
    return analysed


def _check_unit_joins(join: JoinInfo, first: str, unit: str) -> None:
    """Every private table of the subquery must be joined to the first on the privacy unit
    (``b.unit = a.unit``, directly or through others): a person's group then holds only that
    person's rows, whatever the other tables hold.  Public tables join freely (they never
    change between neighbours)."""
    units = {s.alias: s.policy.privacy_unit for s in join.sources if not s.public}
    edges: dict[str, set[str]] = {}
    for j in join.tree.args.get("joins") or []:
        for cond in j.args["on"].flatten() if isinstance(j.args["on"], exp.And) \
                else [j.args["on"]]:
            cond = cond.unnest()
            if isinstance(cond, exp.EQ) and isinstance(cond.this, exp.Column) \
                    and isinstance(cond.expression, exp.Column):
                a, b = cond.this, cond.expression
                if units.get(a.table) == a.name and units.get(b.table) == b.name:
                    edges.setdefault(a.table, set()).add(b.table)
                    edges.setdefault(b.table, set()).add(a.table)
    reached, todo = {first}, [first]
    while todo:
        for nxt in edges.get(todo.pop(), set()) - reached:
            reached.add(nxt)
            todo.append(nxt)
    for s in join.private_sources:
        if s.policy.privacy_unit != unit or s.alias not in reached:
            raise QueryRefused(
                f"table '{s.table}' ({s.alias}) is joined in a per-person subquery other than "
                f"on the privacy unit: a person's value could hold other people's rows",
                hint=f"join it ON {s.alias}.{unit} = {first}.{unit}")


def _top_aggregates(expr: exp.Expr) -> list[exp.Expr]:
    """The aggregates of ``expr``, outermost only, in a stable (pre-order) order."""
    out: list[exp.Expr] = []

    def visit(node: exp.Expr) -> None:
        if isinstance(node, exp.AggFunc):
            out.append(node)
            return
        for child in node.iter_expressions():
            visit(child)

    visit(expr)
    return out


def _qualified_aggregates(rows: AggregateQuery) -> list[exp.Expr]:
    """The stand-ins' arguments as the analysis qualified them, in order (None for *)."""
    flat = sqlglot.parse_one(rows.normalized_sql)
    assert isinstance(flat, exp.Select)
    return [item.this if isinstance(item, exp.Alias) else item for item in flat.expressions[1:]]


# -- bounds -------------------------------------------------------------------------------------
def _bounded_value(name: str, expr: exp.Expr, stands: list[exp.Expr], rows: AggregateQuery,
                   tp: TablePolicy) -> PerPersonValue:
    """The value with its aggregates' arguments qualified (``stands``: the analysed
    stand-ins of its aggregates, in order), and its clipping bounds."""
    k = tp.contribution_bound
    natural: dict[str, Interval] = {}
    capped: dict[str, Interval] = {}
    aggs = _top_aggregates(expr)
    built: exp.Expr = exp.Paren(this=expr.copy())  # a root that survives replacing
    final: dict[str, exp.Expr] = {}
    for i, (agg, copy, stand) in enumerate(zip(aggs, _top_aggregates(built), stands,
                                              strict=True)):
        placeholder = f"chorus_v{i}"
        arg = stand.this
        new: exp.Expr
        if isinstance(agg, exp.Count):
            new = exp.Count(this=exp.Star()) if isinstance(agg.this, exp.Star) else (
                exp.Count(this=exp.Distinct(expressions=[arg.copy()]))
                if isinstance(agg.this, exp.Distinct) else exp.Count(this=arg.copy()))
            natural[placeholder] = (0.0, math.inf)
            capped[placeholder] = (0.0, float(k))
        else:
            lo, hi = _argument_bounds(rows, stand)
            new = type(agg)(this=arg.copy())
            if isinstance(agg, exp.Sum):
                # The sum of a person's n values in [l, u] lies in [n min(l, 0), n max(u, 0)]:
                # unbounded in n; within k rows, in [k min(l, 0), k max(u, 0)].
                natural[placeholder] = (-math.inf if lo < 0 else 0.0, math.inf if hi > 0 else 0.0)
                capped[placeholder] = (k * min(lo, 0.0), k * max(hi, 0.0))
            else:  # AVG, MIN, MAX of values in [l, u]
                natural[placeholder] = capped[placeholder] = (lo, hi)
        copy.replace(exp.column(placeholder))
        # Every aggregate is read as a DOUBLE: per-person arithmetic then never overflows an
        # integer (an error that would depend on the person's data).
        final[placeholder] = exp.cast(new, exp.DType.DOUBLE)
    found = _finite(_bounds(built, natural))
    origin = "the query's own expression"
    if found is None:
        found = _finite(_bounds(built, capped))
        origin = (f"the policy: COUNT <= max_rows_per_unit = {k} and SUM over at most {k} "
                  f"rows per {tp.privacy_unit}")
    if found is None:
        raise QueryRefused(
            f"the per-person value {name} has no bound",
            hint=f"clip it in the query, e.g. LEAST({sql_text(expr)[:40]}, 100) AS {name}")
    lower, upper = found
    if lower == upper:
        raise QueryRefused(f"the per-person value {name} is always {lower:g}",
                           hint="compute the constant without an aggregate")
    value = built.transform(lambda n: final[n.name].copy()
                            if isinstance(n, exp.Column) and n.name in final else n).unnest()
    integral = all(isinstance(a, exp.Count) for a in aggs) and lower.is_integer() \
        and upper.is_integer() and all(
            not isinstance(n, exp.Cast) and not (isinstance(n, exp.Literal) and not n.is_int)
            for n in _outside_aggregates(expr))
    return PerPersonValue(name, value, lower, upper, integral, origin)


def _outside_aggregates(expr: exp.Expr) -> list[exp.Expr]:
    """The nodes of ``expr`` not inside an aggregate."""
    if isinstance(expr, exp.AggFunc):
        return []
    return [expr, *(n for c in expr.iter_expressions() for n in _outside_aggregates(c))]


def _argument_bounds(rows: AggregateQuery, stand: exp.Expr) -> tuple[float, float]:
    """The declared bounds of a stand-in SUM's argument (``analyses.query`` found them)."""
    for m in rows.measurements:
        if (m.kind == "sum" and m.argument is not None
                and sql_text(m.argument) == sql_text(stand.this)):
            assert m.lower is not None and m.upper is not None
            return m.lower, m.upper
    raise AssertionError(f"no measurement for {sql_text(stand)}")


def _bounds(value: exp.Expr, leaves: dict[str, Interval]) -> Interval | None:
    """The interval of ``value`` with its aggregates in ``leaves`` (None: unbounded; an
    infinite end may overflow a cast's rounding, which means the same)."""
    try:
        return expression_bounds(value, lambda c: leaves.get(c.name))
    except OverflowError:
        return None


def _finite(found: Interval | None) -> Interval | None:
    if found is None or not all(math.isfinite(v) for v in found):
        return None
    return found


# -- the outer query ----------------------------------------------------------------------------
def _outer_query(tree: exp.Select, alias: str, values: tuple[PerPersonValue, ...],
                 unit_outputs: set[str], table: str, unit: str, policy: Policy, dialect: str,
                 constants: ConstantCheck | None) -> AggregateQuery:
    """The outer query over the per-person relation, analysed as a table of one row per
    person: no privacy unit of its own (a neighbour changes one row), columns bounded."""
    outer = tree.copy()
    outer.set("with_", None)
    outer.args["from_"].set("this", exp.table_(RELATION, alias=alias))
    for col in outer.find_all(exp.Column):
        if col.name in unit_outputs:
            raise QueryRefused(
                f"the outer query uses {col.name}, the privacy unit: it identifies a person",
                hint="aggregate the per-person values; count people with COUNT(*)")
    columns = {v.name: ColumnPolicy(
        type="int" if v.integral else "float", lower=v.lower, upper=v.upper,
        public_values=tuple(range(int(v.lower), int(v.upper) + 1))
        if v.integral and v.upper - v.lower < MAX_PUBLIC_KEYS else None) for v in values}
    # Bounds that came from the policy are narrowed per query when the table's clipping is
    # automatic, as for row values (its setting, or its default).
    auto = policy.tables[table].auto_clipping and any("policy" in v.origin for v in values)
    virtual = TablePolicy(columns=columns, clipping="auto" if auto else "fixed")
    tables = {**policy.tables, RELATION: virtual}
    local = policy.model_copy(update={"tables": tables})
    analysed = analyze_query(ParsedStatement(outer, (RELATION,)), local, dialect, {}, constants)
    assert not isinstance(analysed, PublicQuery)
    return per_row_derivations(analysed, unit)


def per_row_derivations(outer: AggregateQuery, unit: str) -> AggregateQuery:
    """``outer`` with its event-level derivations said in the unit's words (one row per
    person is what event level means for the per-person relation)."""
    measurements = tuple(dataclasses.replace(m, derivation=m.derivation.replace(
        "stability 1 (event-level: one row per neighbour)",
        f"one row per {unit} (the subquery groups by {unit}), value clipped")
    ) for m in outer.measurements)
    return dataclasses.replace(outer, measurements=measurements)
