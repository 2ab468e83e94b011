"""From a validated SELECT to an :class:`AggregateQuery`: one private table, its filter, its group
keys, the noisy measurements to take and how each output column is computed from them.

The query is first *normalised*: qualified against the policy's columns (sqlglot ``qualify``),
then its CTEs and subqueries are merged into one SELECT (``eliminate_subqueries`` and
``merge_subqueries``).
A CTE or subquery that only filters or projects rows merges away; anything left over (LIMIT,
DISTINCT or aggregation inside, a join) is refused.  The flat query is then read, never changed:
every aggregate becomes one or more *measurements* (COUNT, SUM of a clipped value, ...) that get
noise, and every output expression is *lifted* into an expression over measurement ids (``m0``)
and group-key ids (``k0``), computed after the noise is added (post-processing).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from sqlglot import exp
from sqlglot.errors import OptimizeError
from sqlglot.optimizer.annotate_types import annotate_types
from sqlglot.optimizer.eliminate_ctes import eliminate_ctes
from sqlglot.optimizer.eliminate_subqueries import eliminate_subqueries
from sqlglot.optimizer.merge_subqueries import merge_subqueries
from sqlglot.optimizer.qualify import qualify
from sqlglot.schema import MappingSchema

from analyses.bounds import expression_bounds
from analyses.join_groups import check_join_keys
from analyses.joins import JoinInfo, analyze_joins
from analyses.keys import CalendarKeys, KeyDomain, key_domain, literal_values
from analyses.sensitivity import (
    count_sensitivity,
    count_units_sensitivity,
    square_bounds,
    sum_sensitivity,
)
from analyses.totality import ConstantCheck, RowContext, check_row, duckdb_constants
from analyses.trees import copy_tree, dialect_named, sql_text
from analyses.validate import AGGREGATES, ParsedStatement
from chorus_py.errors import NotSupportedError, QueryRefused, UndefinedColumn
from chorus_py.policy import ColumnPolicy, LimitsConfig, Policy, TablePolicy

MeasurementKind = Literal["count", "count_units", "sum", "sum_squares"]

SQL_TYPES = {
    "int": "BIGINT", "float": "DOUBLE", "text": "TEXT", "bool": "BOOLEAN", "date": "DATE",
    "timestamp": "TIMESTAMP",
}


@dataclass(frozen=True)
class GroupKey:
    """A GROUP BY expression; ``public_values`` when it is a column with declared values (or,
    once resolved, calendar buckets); ``domain`` when its keys are public without being
    declared (``analyses.keys``: calendar buckets of the block column, a public table's)."""

    id: str
    expr: exp.Expr
    public_values: tuple[object, ...] | None
    domain: KeyDomain | None = None


@dataclass(frozen=True)
class Measurement:
    """One noisy number per group: the aggregate the database computes before noise.

    ``argument`` is the row-level value (None for COUNT(*)); sums clip it to [lower, upper].
    ``sensitivity`` is the L1 sensitivity of the vector of this measurement over all groups.
    """

    id: str
    kind: MeasurementKind
    argument: exp.Expr | None
    lower: float | None
    upper: float | None
    sensitivity: float
    derivation: str
    center: float = 0.0
    # Released as a total (COUNT, SUM), not only inside an AVG or VARIANCE: dropped rows bias it.
    total: bool = True
    # Joins: a sum is measured in integer steps of ``grid`` (see ``_JOIN_GRID_STEPS``) and the
    # sensitivity is ``factor`` (rows -> measured units) times 2 S*, known once epsilon is.
    grid: float = 0.0
    factor: float = 0.0

    @property
    def integral(self) -> bool:
        """Counts (and sums on a grid) are integers and get integer (discrete Laplace) noise."""
        return self.kind in ("count", "count_units") or self.grid > 0

    @functools.cached_property
    def argument_sql(self) -> str | None:
        """``argument.sql()``, the key of clipping bounds (rendered once: every pass that
        narrows, plans or templates the bounds looks it up)."""
        return None if self.argument is None else sql_text(self.argument)


@dataclass(frozen=True)
class OutputColumn:
    """An output column as an expression over measurement ids and key ids."""

    name: str
    expr: exp.Expr
    measurements: tuple[str, ...]
    key: str | None
    source: str


@dataclass(frozen=True)
class AggregateQuery:
    """Everything the rewriter and the noise planner need about one private aggregate query."""

    table: str
    alias: str
    table_policy: TablePolicy
    where: exp.Expr | None
    keys: tuple[GroupKey, ...]
    measurements: tuple[Measurement, ...]
    outputs: tuple[OutputColumn, ...]
    having: exp.Expr | None
    order: tuple[exp.Ordered, ...]
    limit: int | None
    offset: int | None
    stability: int
    thresholded: bool
    # A measurement whose noisy value can also decide which groups are released (a distinct
    # count of units, or COUNT(*) without a privacy unit); None means a separate one is needed.
    threshold_source: str | None
    normalized_sql: str = field(default="")
    # A join query: its tables, equalities and elastic stability (``analyses.joins``).  Then
    # ``table`` is the first private table and the sensitivities wait for epsilon and delta
    # (``analyses.smoothing.resolve``).
    join: JoinInfo | None = None
    # The most distinct groups a unit's rows may reach (``rewriters.contribution.group_bound``),
    # chosen with the cap for keys released by thresholding; None: only the row cap bounds them.
    max_groups: int | None = None
    # The schema the proxy reads (``Backend`` current schema): generated SQL qualifies every
    # base table with it, so the statement reads exactly the tables the binding found.  None:
    # bare names (analyses and rewriters used without an engine, e.g. doctests).
    schema: str | None = None

    @property
    def groups_per_unit(self) -> int:
        """D, the most groups one unit reaches: min(g, k) (a unit's <= k rows reach <= k groups).

        The key-release threshold tau = 1 + b ln(D / delta) and the L1 sensitivity of every
        per-group distinct-unit count (each unit adds 1 to <= D groups) use it; row counts and
        sums keep Delta = k (d_max): <= k rows in all, however many groups they fall in.
        A join's D is set once its frequencies are known (``analyses.join_groups``).
        """
        if self.join is not None:
            if self.max_groups is None:
                raise ValueError("the groups per unit of a join are set with its frequencies")
            return self.max_groups
        return min(self.stability, self.max_groups or self.stability)

    @property
    def bounded_groups(self) -> int | None:
        """g when each unit's rows are bounded to g < k groups (``rewriters.contribution
        .group_bound``; the outgoing verifier then requires it), None when only the row cap
        bounds them (g >= k would change nothing: k rows reach at most k groups)."""
        if self.join is None and self.max_groups is not None \
                and self.max_groups < self.stability:
            return self.max_groups
        return None

    @property
    def privacy_unit(self) -> str | None:
        """The privacy unit column (or the several units of a row), None for event-level DP."""
        return self.table_policy.unit_label

    @property
    def auto_cap(self) -> bool:
        """True when the row cap per unit is chosen per query (``contribution = "auto"``)."""
        return (self.join is None and self.privacy_unit is not None
                and self.table_policy.contribution == "auto")

    @property
    def tables(self) -> tuple[str, ...]:
        """Every table the query reads (one, or those of a join, without repeats)."""
        if self.join is None:
            return (self.table,)
        return tuple(dict.fromkeys(s.table for s in self.join.sources))

    def with_cap(self, k: int) -> AggregateQuery:
        """The same query over at most ``k`` rows per unit: stability and sensitivities at k."""
        if not 1 <= k <= self.table_policy.contribution_bound:
            raise ValueError(f"cap {k} outside [1, {self.table_policy.contribution_bound}]")
        rescaled = []
        for m in self.measurements:
            sens, why = _derive(m.kind, k, m.lower, m.upper, m.center, self.privacy_unit,
                                self.keys, self.max_groups)
            rescaled.append(_replaced(m, sensitivity=sens, derivation=why))
        return dataclasses.replace(self, stability=k, measurements=tuple(rescaled))

    def with_groups(self, g: int | None) -> AggregateQuery:
        """The same query with each unit's rows kept in at most ``g`` of its groups (None: no
        bound); the distinct-unit counts' sensitivities become min(g, k) (``groups_per_unit``)."""
        if g is not None and (not self.thresholded or self.privacy_unit is None or g < 1):
            raise ValueError("a groups-per-unit bound needs g >= 1 and thresholded keys of a "
                             "table with a privacy unit")
        bounded = dataclasses.replace(self, max_groups=g)
        rescaled = []
        for m in self.measurements:
            sens, why = _derive(m.kind, self.stability, m.lower, m.upper, m.center,
                                self.privacy_unit, self.keys, g)
            rescaled.append(_replaced(m, sensitivity=sens, derivation=why))
        return dataclasses.replace(bounded, measurements=tuple(rescaled))

    def with_key_values(self, values: dict[str, tuple[object, ...]]) -> AggregateQuery:
        """The same query with the calendar keys' values listed (``analyses.keys.
        calendar_values`` over the blocks read, by key id); sensitivities are derived again,
        since G, the number of groups, is known now (COUNT(DISTINCT unit): min(s, G))."""
        keys = tuple(dataclasses.replace(k, public_values=values[k.id]) if k.id in values
                     else k for k in self.keys)
        listed = dataclasses.replace(self, keys=keys)
        if self.join is not None:  # join sensitivities wait for the smooth bound
            return listed
        rescaled = []
        for m in self.measurements:
            sens, why = _derive(m.kind, self.stability, m.lower, m.upper, m.center,
                                self.privacy_unit, keys, self.max_groups)
            rescaled.append(_replaced(m, sensitivity=sens, derivation=why))
        return dataclasses.replace(listed, measurements=tuple(rescaled))

    def calendar_keys(self) -> dict[str, CalendarKeys]:
        """The keys whose values are calendar buckets still to list, by key id."""
        return {k.id: k.domain for k in self.keys
                if isinstance(k.domain, CalendarKeys) and k.public_values is None}

    def with_bounds(self, bounds: dict[str, tuple[float, float]]) -> AggregateQuery:
        """The same query with summed expressions clipped to narrower intervals.

        ``bounds`` maps an argument's SQL (``m.argument.sql()``) to [l', u'] inside its
        declared [l, u] (``mechanisms.clip_bounds``).  Sensitivities are derived again at the
        current stability; AVG/VARIANCE measurements are re-centred on (l' + u') / 2 (a centre
        of 0 stays 0: a symmetric interval narrows to a symmetric one), and the centre in every
        AVG output becomes the new one, since AVG = c + noisy SUM(x - c) / noisy COUNT.
        """
        rescaled, centres = [], {}
        for m in self.measurements:
            new = bounds.get(m.argument_sql) if m.argument_sql is not None else None
            if new is None or m.lower is None or m.upper is None:
                rescaled.append(m)
                continue
            lo, hi = new
            if not m.lower <= lo <= hi <= m.upper:
                raise ValueError(f"[{lo:g}, {hi:g}] is not inside [{m.lower:g}, {m.upper:g}]")
            center = (lo + hi) / 2 if m.center else 0.0
            if m.center:
                centres[m.id] = (m.center, center)
            sens, why = _derive(m.kind, self.stability, lo, hi, center, self.privacy_unit,
                                self.keys, self.max_groups)
            rescaled.append(_replaced(m, lower=lo, upper=hi, center=center,
                                      sensitivity=sens, derivation=why))

        def recentre(node: exp.Expr) -> exp.Expr:
            # The AVG shape built by _Reader._aggregate: Add(c, Div(m_sum, GREATEST(m_n, 1))).
            if isinstance(node, exp.Add) and isinstance(node.expression, exp.Div) and \
                    isinstance(node.expression.this, exp.Column):
                old_new = centres.get(node.expression.this.name)
                literal = node.this.this if isinstance(node.this, exp.Neg) else node.this
                sign = -1.0 if isinstance(node.this, exp.Neg) else 1.0
                if old_new is not None and isinstance(literal, exp.Literal) and \
                        sign * float(literal.name) == old_new[0]:
                    return exp.Add(this=exp.Literal.number(old_new[1]),
                                   expression=node.expression.copy())
            return node

        def moved(node: exp.Expr) -> exp.Expr:
            return copy_tree(node).transform(recentre, copy=False)

        outputs = tuple(dataclasses.replace(o, expr=moved(o.expr)) for o in self.outputs)
        having = moved(self.having) if self.having is not None else None
        order = tuple(exp.Ordered(this=moved(o.this), desc=o.args.get("desc"),
                                  nulls_first=o.args.get("nulls_first")) for o in self.order)
        return dataclasses.replace(self, measurements=tuple(rescaled), outputs=outputs,
                                   having=having, order=order)


def _replaced(m: Measurement, **changes: Any) -> Measurement:
    """``dataclasses.replace(m, **changes)``, keeping ``m``'s rendered ``argument_sql`` (a
    function of its argument alone, which a cap, bounds or key values leave as it is): every
    rescaled copy would render it again (several renderings per never-seen query)."""
    new = dataclasses.replace(m, **changes)
    if "argument" not in changes and "argument_sql" in m.__dict__:
        new.__dict__["argument_sql"] = m.__dict__["argument_sql"]
    return new


@dataclass(frozen=True)
class PublicQuery:
    """A query that reads public tables only: answered exactly, free of charge, by SQL generated
    from its bound tree (``analyses.binding.generated_sql``)."""

    tree: exp.Select
    tables: tuple[str, ...]


def analyze_query(
    parsed: ParsedStatement, policy: Policy, dialect: str,
    public_columns: dict[str, dict[str, str]], constants: ConstantCheck | None = None,
    db: str | None = None,
) -> AggregateQuery | PublicQuery:
    """Analyse a validated statement against the policy (pure: the input is not changed).

    ``constants`` runs table-free statements on the backend (``analyses.totality``); only the
    duckdb dialect has a default (an in-memory DuckDB).  ``db``, the backend's schema,
    qualifies the tables of the generated SQL (``AggregateQuery.schema``).
    """
    private = [t for t in parsed.tables if not policy.tables[t].public]
    if not private:
        return PublicQuery(tree=parsed.tree, tables=parsed.tables)
    table_name = private[0]
    table_policy = policy.tables[table_name]
    names = output_names(parsed.tree)
    schema = {t: _table_schema(policy.tables[t], public_columns.get(t, {}))
              for t in parsed.tables}
    flat = _normalize(parsed.tree, table_name, table_policy, dialect, schema)
    rows = row_context(dialect, constants, policy.limits)
    if not flat.args.get("joins"):
        return dataclasses.replace(_Reader(flat, table_name, table_policy, names,
                                           rows=rows).read(), schema=db)
    join = analyze_joins(flat, policy)
    columns = {s.alias: _column_policies(s.policy, public_columns.get(s.table, {}))
               for s in join.sources}
    return dataclasses.replace(_Reader(flat, table_name, table_policy, names, join,
                                       columns, rows=rows).read(), schema=db)


def row_context(dialect: str, constants: ConstantCheck | None, limits: LimitsConfig,
                tamed: tuple[float, float] | None = None) -> RowContext:
    """The totality analysis' context (column types are filled in by the reader)."""
    if constants is None:
        if dialect != "duckdb":
            raise ValueError(f"the {dialect} dialect needs a constant checker on its backend")
        constants = duckdb_constants()
    return RowContext(dialect, lambda col: None, constants, limits, tamed)


_PORTABLE = {"integer": "int", "float": "float", "text": "text", "boolean": "bool",
             "date": "date", "timestamp": "timestamp"}


def _column_policies(tp: TablePolicy, live: dict[str, str]) -> dict[str, ColumnPolicy]:
    """Declared columns; for a public table, its live columns (type only: no bounds)."""
    if not tp.public:
        return dict(tp.columns)
    found = {c: ColumnPolicy(type=_PORTABLE[t]) for c, t in live.items() if t in _PORTABLE}
    return {**found, **tp.columns}


def _table_schema(tp: TablePolicy, live: dict[str, str]) -> dict[str, str]:
    return {c: SQL_TYPES[col.type] for c, col in _column_policies(tp, live).items()}


def output_names(tree: exp.Select) -> list[str]:
    """Names as Postgres would give them: the alias, the column name, or the function name."""
    names = []
    for item in tree.expressions:
        if isinstance(item, exp.Star) or (
            isinstance(item, exp.Column) and isinstance(item.this, exp.Star)
        ):
            raise QueryRefused(
                "SELECT * would release raw rows",
                hint="select aggregates such as COUNT(*), SUM(col), AVG(col) with GROUP BY",
            )
        if isinstance(item, exp.Alias):
            names.append(item.alias)
        elif isinstance(item, exp.Column):
            names.append(item.name)
        elif isinstance(item, exp.Func):
            names.append(item.sql_name().lower() if not isinstance(item, exp.Count) else "count")
        else:
            names.append("?column?")
    return names


@functools.lru_cache(maxsize=256)
def _mapping_schema(tables: tuple[tuple[str, tuple[tuple[str, str], ...]], ...],
                    dialect: str) -> MappingSchema:
    """The sqlglot schema of these tables (name, (column, type) pairs): built once per set of
    tables and reused by every query over them (qualify and annotate_types only read it;
    building one normalises every name)."""
    return MappingSchema({t: dict(columns) for t, columns in tables}, dialect=dialect)


def _normalize(tree: exp.Select, table: str, tp: TablePolicy, dialect: str,
               schema: dict[str, dict[str, str]]) -> exp.Select:
    mapping = _mapping_schema(tuple(sorted((t, tuple(c.items())) for t, c in schema.items())),
                              dialect)
    try:
        flat = qualify(copy_tree(tree), schema=mapping, dialect=dialect_named(dialect),
                       validate_qualify_columns=True)
    except OptimizeError as err:
        text = str(err)
        raise UndefinedColumn(
            f"unknown column: {text}" if "olumn" in text else f"cannot resolve the query: {text}",
            hint=f"table '{table}' has the columns: {', '.join(tp.columns)}",
        ) from None
    flat = eliminate_ctes(merge_subqueries(eliminate_subqueries(flat)))
    assert isinstance(flat, exp.Select)
    # Types on every node, for the type checks of row-level expressions.
    flat = annotate_types(flat, schema=mapping, dialect=dialect_named(dialect))
    nested = [s for s in flat.find_all(exp.Select) if s is not flat]
    if flat.args.get("joins") and any(s.args.get("group") or s.find(*AGGREGATES)
                                      for s in nested):
        raise NotSupportedError(
            "aggregation followed by a join of the aggregate is not supported: its stability "
            "is not bounded by the elastic rules",
            hint="join the tables first and aggregate once, in the outermost SELECT")
    if nested or flat.args.get("with_"):
        raise NotSupportedError(
            "subqueries and CTEs may only filter or project rows of one table "
            "(no LIMIT, DISTINCT, aggregation, window or ORDER BY inside)",
            hint="move the aggregation to the outermost SELECT",
        )
    source = flat.args["from_"].this
    if not isinstance(source, exp.Table):
        raise NotSupportedError("the FROM clause must name a table")
    # The merged query must read exactly the base tables the binding found (analyses.binding):
    # a CTE that merging dropped (never used) would otherwise leave the query "private" with
    # another table in its FROM, read under the private table's policy.
    merged = {t.name for t in flat.find_all(exp.Table)}
    if merged != set(schema):
        raise NotSupportedError(
            "the query names tables it does not read (an unused CTE or subquery?)",
            hint="remove the CTEs and subqueries the query does not use")
    if flat.args.get("distinct"):
        raise QueryRefused("SELECT DISTINCT releases raw values", hint="use GROUP BY instead")
    return flat


class _Reader:
    """Reads the flat SELECT once, building measurements and lifted outputs."""

    def __init__(self, flat: exp.Select, table: str, tp: TablePolicy, names: list[str],
                 join: JoinInfo | None = None,
                 columns: dict[str, dict[str, ColumnPolicy]] | None = None, *,
                 rows: RowContext) -> None:
        self.flat = flat
        self.table = table
        self.tp = tp
        self.names = names
        self.join = join
        alias = flat.args["from_"].this.alias_or_name
        # Column policies by table alias (one alias, or every table of a join).
        self.columns = columns if columns is not None else {alias: dict(tp.columns)}
        self.table_of = ({s.alias: s.table for s in join.sources} if join is not None
                         else {alias: table})
        self.stability = tp.contribution_bound
        self.measurements: dict[tuple[str, str], Measurement] = {}
        self.keys: list[GroupKey] = []
        self.aliases: dict[str, exp.Expr] = {}
        self.rows = dataclasses.replace(rows, column_type=self._column_type)

    # -- reading ------------------------------------------------------------------------------
    def read(self) -> AggregateQuery:
        flat = self.flat
        source = flat.args["from_"].this
        alias = source.alias_or_name
        where = flat.args["where"].this if flat.args.get("where") else None
        if where is not None:
            self._check_row(where, "WHERE")
        for join in flat.args.get("joins") or []:
            if join.args.get("on") is not None:
                self._check_row(join.args["on"], "JOIN ON")
        group = flat.args.get("group")
        for i, key in enumerate(group.expressions if group else []):
            self._check_row(key, "GROUP BY")
            if key.find(*AGGREGATES):
                raise QueryRefused("aggregates are not allowed in GROUP BY")
            for col in key.find_all(exp.Column):
                cp = self._column(col)
                if cp is not None and cp.private_id:
                    raise QueryRefused(
                        f"cannot group by {col.name}: it identifies individuals (private_id)",
                        hint=f"filter on it, or count it with COUNT(DISTINCT {col.name})",
                    )
            declared = self._public_values(key)
            self.keys.append(GroupKey(f"k{i}", key, declared, None if declared is not None
                                      else key_domain(key, self._tables(), self._types())))
        if (group and group.args.get("rollup")) or (group and group.args.get("cube")):
            raise NotSupportedError("ROLLUP, CUBE and GROUPING SETS are not supported")
        outputs = []
        for name, item in zip(self.names, flat.expressions, strict=True):
            expr = item.this if isinstance(item, exp.Alias) else item
            lifted = self._lift(expr, "SELECT")
            used = tuple(sorted({c.name for c in lifted.find_all(exp.Column)
                                 if c.name.startswith("m")}))
            key = lifted.name if isinstance(lifted, exp.Column) and lifted.name.startswith("k") \
                else None
            outputs.append(OutputColumn(name, lifted, used, key, display_sql(expr)))
            self.aliases[name] = lifted
            # qualify names unnamed outputs _col_N; ORDER BY 2 then refers to that name.
            self.aliases.setdefault(item.alias_or_name, lifted)
        if not self.measurements:
            raise QueryRefused(
                "the query has no aggregate: raw values are never released",
                hint="use COUNT(*), SUM(col), AVG(col), VARIANCE(col) or STDDEV(col)",
            )
        having = flat.args.get("having")
        lifted_having = self._lift(having.this, "HAVING") if having else None
        order = flat.args.get("order")
        lifted_order = tuple(
            o.copy().set("this", self._lift(o.this, "ORDER BY")) or o for o in
            (order.expressions if order else [])
        )
        lifted_order = tuple(
            exp.Ordered(this=self._lift(o.this, "ORDER BY"), desc=o.args.get("desc"),
                        nulls_first=o.args.get("nulls_first"))
            for o in (order.expressions if order else [])
        )
        public = all(k.public_values is not None or k.domain is not None for k in self.keys)
        thresholded = bool(self.keys) and not public
        if thresholded and self.tp.multi_attribution:
            # The key-release threshold assumes a group only a new unit reaches counts 1; with
            # several units per row such a group holds up to k of its rows.
            raise NotSupportedError(
                "grouping by a column without public_values is not supported on a table whose "
                "rows belong to several privacy units",
                hint="group by columns with public_values")
        if thresholded and self.join is not None:
            # Released by a noisy threshold when one person's groups are bounded by public
            # information (analyses.join_groups), refused naming the fix otherwise.
            key = next(k for k in self.keys if k.public_values is None and k.domain is None)
            check_join_keys(self.join, [k.expr for k in self.keys],
                            f"GROUP BY {display_sql(key.expr)}")
        return AggregateQuery(
            table=self.table, alias=alias, table_policy=self.tp, where=where,
            keys=tuple(self.keys), measurements=tuple(self.measurements.values()),
            outputs=tuple(outputs), having=lifted_having, order=lifted_order,
            limit=_literal_int(flat, "limit"), offset=_literal_int(flat, "offset"),
            stability=self.stability, thresholded=thresholded,
            # A join's gate is always its own count of distinct units (analyses.join_groups).
            threshold_source=self._threshold_source() if thresholded and self.join is None
            else None,
            normalized_sql=sql_text(flat), join=self.join,
        )

    def _tables(self) -> dict[str, tuple[str, TablePolicy]]:
        if self.join is None:
            return {self.flat.args["from_"].this.alias_or_name: (self.table, self.tp)}
        return {s.alias: (s.table, s.policy) for s in self.join.sources}

    def _types(self) -> dict[tuple[str, str], str]:
        return {(alias, name): cp.type for alias, cols in self.columns.items()
                for name, cp in cols.items()}

    def _public_values(self, key: exp.Expr) -> tuple[object, ...] | None:
        """The declared values of a key column, narrowed by ``key = v`` / ``key IN (...)``; the
        values an expression spells out (``analyses.keys.literal_values``).

        The narrowing reads literals of the query only, so the released keys still depend on
        the policy and the query, never on the data.
        """
        if not isinstance(key, exp.Column):
            return literal_values(key)  # a CASE of literals, a condition (analyses.keys)
        cp = self._column(key)
        if cp is None:
            return None
        declared = cp.public_values
        if declared is None:
            return None
        where = self.flat.args.get("where")
        conjuncts = list(where.this.flatten()) if where and isinstance(where.this, exp.And) \
            else ([where.this] if where else [])
        values = list(declared)
        for node in conjuncts:
            node = node.unnest()
            if isinstance(node, exp.EQ) and node.this == key and isinstance(
                node.expression, exp.Literal
            ):
                wanted = [node.expression]
            elif isinstance(node, exp.In) and node.this == key and not node.args.get("query") \
                    and all(isinstance(v, exp.Literal) for v in node.expressions):
                wanted = node.expressions
            else:
                continue
            texts = {w.name for w in wanted}
            values = [v for v in values if str(v) in texts]
        return tuple(values)

    def _threshold_source(self) -> str | None:
        # A distinct-unit count (user level) or a row count (event level) per group is exactly
        # the statistic the threshold is derived for (each group of a new unit has value 1).
        wanted = "count_units" if self.tp.privacy_unit else "count"
        for m in self.measurements.values():
            if m.kind == wanted and m.argument is None:
                return m.id
        return None

    # -- lifting output expressions -------------------------------------------------------------
    def _lift(self, expr: exp.Expr, clause: str) -> exp.Expr:
        def visit(node: exp.Expr) -> exp.Expr:
            for key in self.keys:
                if node == key.expr:
                    return exp.column(key.id)
            if isinstance(node, AGGREGATES):
                return self._aggregate(node)
            if isinstance(node, exp.Column):
                if not node.table and node.name in self.aliases:
                    return self.aliases[node.name].copy()
                raise QueryRefused(
                    f"column {node.name} in {clause} is neither aggregated nor in GROUP BY: "
                    "raw values are never released",
                    hint="wrap it in an aggregate or add it to GROUP BY",
                )
            return node

        return copy_tree(expr).transform(visit, copy=False)

    def _aggregate(self, node: exp.Expr) -> exp.Expr:
        arg = node.this
        if isinstance(node, exp.Count):
            if isinstance(arg, exp.Star):
                return self._measure("count", None)
            if isinstance(arg, exp.Distinct):
                return self._count_distinct(arg)
            self._check_row(arg, "COUNT")
            return self._measure("count", arg)
        if isinstance(arg, exp.Distinct):
            raise NotSupportedError(f"{node.sql_name()}(DISTINCT ...) is not supported")
        self._check_row(arg, node.sql_name())
        lo, hi = self._bounds(arg, node.sql_name())
        # A value that is always 0 (for SUM) or always the same (for AVG and VARIANCE, measured
        # centred) gives a measurement that ignores the data: sensitivity 0, nothing to protect.
        if (lo == hi == 0) or (lo == hi and not isinstance(node, exp.Sum)):
            raise QueryRefused(
                f"{node.sql_name()}({display_sql(arg)}) does not depend on the data: "
                f"{sql_text(arg)} is always {lo:g}",
                hint="compute the constant without an aggregate")
        if isinstance(node, exp.Sum):
            return self._measure("sum", arg, lo, hi)
        # AVG and VARIANCE measure the values centred on c = (l + u) / 2: x - c lies in
        # [-(u - l) / 2, (u - l) / 2], which halves the sum's sensitivity (and quarters that of
        # the sum of squares) compared with max(|l|, |u|), and both statistics are unchanged by
        # the shift.
        center = (lo + hi) / 2
        total = self._measure("sum", arg, lo, hi, center, total=False)
        count = self._measure("count", arg, total=False)
        if isinstance(node, exp.Avg):
            # AVG = c + noisy SUM(x - c) / noisy COUNT, clamped into [l, u] (post-processing).
            mean = exp.Add(this=exp.Literal.number(center), expression=exp.Div(
                this=total, expression=_greatest(count, 1.0)))
            return _clamp(mean, lo, hi)
        squares = self._measure("sum_squares", arg, lo, hi, center, total=False)
        pop = isinstance(node, exp.VariancePop | exp.StddevPop)
        # var = (S2 - S1^2 / n) / (n - 1), or / n for the population variance; clamped to
        # [0, (u - l)^2 / 2], a bound on any sample variance of values in [l, u] with n >= 2.
        n = _greatest(count, 1.0 if pop else 2.0)
        centred = exp.Sub(this=squares, expression=exp.Div(
            this=exp.Mul(this=total, expression=total.copy()), expression=n))
        denom = n.copy() if pop else exp.Sub(this=n.copy(), expression=exp.Literal.number(1))
        var = _clamp(exp.Div(this=exp.Paren(this=centred), expression=exp.Paren(this=denom)),
                     0.0, (hi - lo) * (hi - lo) / 2)
        if isinstance(node, exp.Stddev | exp.StddevPop | exp.StddevSamp):
            return exp.Sqrt(this=var)
        return var

    def _count_distinct(self, distinct: exp.Distinct) -> exp.Expr:
        unit = self.tp.privacy_unit
        cols = distinct.expressions
        if self.join is not None:
            return self._count_distinct_units_of_join(cols)
        if self.tp.multi_attribution:
            # Several units per row: a neighbour adds or removes <= k rows of S, each carrying
            # one value of the column, so the distinct count (per group, in total over groups)
            # moves by <= k: a COUNT with sensitivity s = k, not 1.
            if len(cols) == 1 and isinstance(cols[0], exp.Column) and \
                    cols[0].name in self.tp.unit_columns:
                return self._measure("count", distinct)
            raise NotSupportedError(
                "COUNT(DISTINCT ...) is supported only for one of the privacy unit columns"
                + (f" ({', '.join(self.tp.unit_columns)})" if self.tp.unit_columns else ""),
                hint="COUNT(DISTINCT other_column) has no bounded sensitivity")
        if unit and len(cols) == 1 and isinstance(cols[0], exp.Column) and cols[0].name == unit:
            return self._measure("count_units", None)
        if len(cols) == 1:
            # The distinct values of another column (or row expression): bounding leaves each
            # unit at most s rows (stability s; 1 row for a table without a unit), and each
            # row carries one value, so adding or removing a unit moves the distinct count by
            # at most s in all (per group: only in the groups of its rows, by at most its rows
            # there): a COUNT with Delta = s, like COUNT(*).  Not 1, as for the unit itself:
            # each of the unit's rows may bring a value no other row has.
            self._check_row(cols[0], "COUNT")
            return self._measure("count", distinct)
        raise NotSupportedError(
            "COUNT(DISTINCT ...) takes one column or expression",
            hint="count the distinct values of one column, e.g. COUNT(DISTINCT driver_id)",
        )

    def _count_distinct_units_of_join(self, cols: list[exp.Expr]) -> exp.Expr:
        """COUNT(DISTINCT a.unit) over a join on the unit: the people with a joined row (in
        each group).  One person moves it by 1 in each group they reach
        (``analyses.join_groups``); any other distinct count over a join is refused."""
        join = self.join
        assert join is not None
        col = cols[0] if len(cols) == 1 else None
        src = next((s for s in join.private_sources if isinstance(col, exp.Column)
                    and s.alias == col.table and s.policy.privacy_unit == col.name), None)
        if src is None or col is None:
            units = sorted({f"{s.alias}.{s.policy.privacy_unit}" for s in join.private_sources
                            if isinstance(s.policy.privacy_unit, str)})
            raise NotSupportedError(
                "COUNT(DISTINCT ...) over a join is answered only for the privacy unit "
                + (f"({', '.join(units)})" if units else "(these tables have none)")
                + ": the distinct values of another column have no bounded sensitivity",
                hint="count the people: COUNT(DISTINCT <alias>.<privacy unit>), or ask per "
                "person: WITH per AS (SELECT rider_id, COUNT(DISTINCT city) AS n FROM trips "
                "GROUP BY rider_id) SELECT COUNT(*) FROM per WHERE n >= 2")
        check_join_keys(join, [k.expr for k in self.keys],
                        f"COUNT(DISTINCT {display_sql(col)})" + (" per group" if self.keys
                                                                 else ""))
        return self._measure("count_units", col)

    def _measure(self, kind: MeasurementKind, arg: exp.Expr | None, lo: float | None = None,
                 hi: float | None = None, center: float = 0.0, total: bool = True) -> exp.Expr:
        dedup = (kind, sql_text(arg) if arg is not None else "*", center)
        found = self.measurements.get(dedup)
        if found is None and self.join is not None:
            found = _join_measurement(f"m{len(self.measurements)}", kind, arg, lo, hi, center,
                                      total)
        elif found is None:
            mid = f"m{len(self.measurements)}"
            sens, why = self._sensitivity(kind, lo, hi, center)
            found = Measurement(mid, kind, arg, lo, hi, sens, why, center, total)
        elif total and not found.total:  # also released directly, e.g. COUNT(x) next to AVG(x)
            found = dataclasses.replace(found, total=True)
        self.measurements[dedup] = found
        if found.grid:  # measured in integer steps of the grid: back to the value's units
            return exp.Paren(this=exp.Mul(this=exp.column(found.id),
                                          expression=exp.Literal.number(found.grid)))
        return exp.column(found.id)

    def _sensitivity(self, kind: MeasurementKind, lo: float | None, hi: float | None,
                     center: float) -> tuple[float, str]:
        return _derive(kind, self.stability, lo, hi, center, self.tp.unit_label,
                       tuple(self.keys))

    def _bounds(self, arg: exp.Expr, fname: str) -> tuple[float, float]:
        missing: list[str] = []

        def column_bounds(col: exp.Column) -> tuple[float, float] | None:
            cp = self._column(col)
            if cp is None or cp.lower is None or cp.upper is None:
                missing.append(col)
                return None
            return (cp.lower, cp.upper)

        found = expression_bounds(arg, column_bounds)
        if found is None:
            if missing:
                col = missing[0]
                raise QueryRefused(
                    f"{fname} over column '{col.name}' needs declared bounds",
                    hint=f"the data owner must set lower and upper for "
                    f"tables.{self.table_of.get(col.table, self.table)}.columns.{col.name} in "
                    "the policy",
                )
            raise QueryRefused(
                f"cannot bound the value of {sql_text(arg)} in {fname}",
                hint="use +, -, *, / by a constant, ABS, LEAST, GREATEST or CASE on bounded "
                "columns",
            )
        lo, hi = found
        # Squares of the range must stay finite too (VARIANCE sums squares).
        if not all(math.isfinite(v) for v in (lo, hi, (hi - lo) * (hi - lo), lo * lo, hi * hi)):
            raise QueryRefused(
                f"the value of {display_sql(arg)} in {fname} can overflow a double",
                hint="use smaller constants",
            )
        return found

    # -- row-level safety -------------------------------------------------------------------
    def _check_row(self, node: exp.Expr, clause: str) -> None:
        """Refuse a row-level expression that could raise on some row (analyses.totality)."""
        check_row(node, clause, self.rows, boolean=clause in ("WHERE", "JOIN ON"))

    def _column(self, col: exp.Column) -> ColumnPolicy | None:
        """The policy of a (qualified) column: of its table alias."""
        table = self.columns.get(col.table)
        if table is None and len(self.columns) == 1:
            table = next(iter(self.columns.values()))
        return None if table is None else table.get(col.name)

    def _column_type(self, col: exp.Column) -> str | None:
        cp = self._column(col)
        return None if cp is None else cp.type


# A sum over a join is measured as SUM(ROUND(v / g)) with g = max|v| / _JOIN_GRID_STEPS: an
# integer with discrete Laplace noise, whose output (a multiple of g, a constant of the query) says
# nothing about the data-dependent scale 2 S* / epsilon.  (The snapping mechanism would round to a
# power of two >= the scale, which would show the scale in the output.)  Each row's rounding
# error is at most g / 2 = max|v| / 8192.
_JOIN_GRID_STEPS = 4096


def _join_measurement(mid: str, kind: MeasurementKind, arg: exp.Expr | None,
                      lo: float | None, hi: float | None, center: float,
                      total: bool) -> Measurement:
    """A measurement over a join: its per-row factor; the sensitivity 2 S* factor comes later.

    The sensitivity is infinite until ``analyses.smoothing.resolve`` sets it, so a join query
    used without that step fails (no noise can be calibrated) rather than being under-noised.
    """
    if kind == "count":
        return Measurement(mid, kind, arg, lo, hi, math.inf,
                           "COUNT over a join: Delta = S(k) per changed row", center, total,
                           factor=1.0)
    if kind == "count_units":
        # Not smoothed: its sensitivity (1, or the groups a person reaches) is set with D.
        return Measurement(mid, kind, arg, lo, hi, math.inf,
                           "COUNT(DISTINCT unit) over a join on the unit: +-1 in each group "
                           "a person reaches", center, total)
    if kind != "sum":
        raise NotSupportedError(
            "VARIANCE and STDDEV over a join are not supported",
            hint="use COUNT, SUM or AVG over the join")
    assert lo is not None and hi is not None
    # |v - c| <= top for v clipped to [lo, hi]: a changed join row moves the sum by <= top,
    # that is by <= _JOIN_GRID_STEPS grid steps.
    top = max(abs(lo - center), abs(hi - center))
    grid = top / _JOIN_GRID_STEPS
    return Measurement(mid, kind, arg, lo, hi, math.inf,
                       f"SUM over a join of v clipped to [{lo:g}, {hi:g}]"
                       + (f", minus c = {center:g}" if center else "")
                       + f": Delta = S(k) * max|v| = S(k) * {top:g}", center, total,
                       grid=grid, factor=float(_JOIN_GRID_STEPS))


def _derive(kind: MeasurementKind, s: int, lo: float | None, hi: float | None, center: float,
            unit: str | None, keys: tuple[GroupKey, ...],
            max_groups: int | None = None) -> tuple[float, str]:
    """The L1 sensitivity of one measurement over a relation of stability s, with its reason.

    ``max_groups`` g (thresholded keys): each unit's rows lie in at most g groups.  It lowers
    only COUNT(DISTINCT unit), whose vector moves by 1 in each group the unit reaches: Delta =
    min(s, g).  Row counts and sums keep Delta = s (resp. s * max|v|): the unit's <= s rows,
    however they are spread over its <= g groups, change the vector's L1 norm by at most that.
    """
    stab = (f"stability {s} (at most {s} rows per {unit})" if unit
            else "stability 1 (event-level: one row per neighbour)")
    if kind == "count":
        return float(count_sensitivity(s)), f"COUNT over {stab}: Delta = s = {s}"
    if kind == "count_units":
        groups = None
        if keys and all(k.public_values is not None for k in keys):
            groups = math.prod(len(k.public_values or ()) for k in keys)
        if max_groups is not None:
            groups = max_groups if groups is None else min(groups, max_groups)
        d = count_units_sensitivity(s, bool(keys), groups)
        within = f" (kept in <= {max_groups} groups)" if max_groups is not None else ""
        return float(d), (
            f"COUNT(DISTINCT unit): a unit's <= {s} rows{within} reach at most {d} group(s): "
            f"Delta = {d}"
        )
    assert lo is not None and hi is not None
    value = f"x clipped to [{lo:g}, {hi:g}]" + (f", minus c = {center:g}" if center else "")
    if kind == "sum_squares":
        sq_lo, sq_hi = square_bounds(lo - center, hi - center)
        d = sum_sensitivity(s, sq_lo, sq_hi)
        return d, f"SUM(v^2), v = {value}, {stab}: Delta = {s} * {sq_hi:g} = {d:g}"
    d = sum_sensitivity(s, lo - center, hi - center)
    return d, f"SUM(v), v = {value}, {stab}: Delta = s * max(|v|) = {d:g}"


def display_sql(node: exp.Expr) -> str:
    """SQL for reports: generic dialect, identifiers unquoted."""
    plain = copy_tree(node)
    for ident in plain.find_all(exp.Identifier):
        ident.set("quoted", False)
    return plain.sql(dialect_named(None), copy=False)  # a copy of its own already


def _literal_int(flat: exp.Select, arg: str) -> int | None:
    node = flat.args.get(arg)
    if node is None:
        return None
    value = node.expression if isinstance(node, exp.Limit | exp.Offset) else node
    if not isinstance(value, exp.Literal) or value.is_string or not value.name.isdigit():
        raise QueryRefused(f"{arg.upper()} must be a non-negative integer literal")
    if int(value.name) >= 2**62:  # both databases reject larger ones, at run time
        raise QueryRefused(f"{arg.upper()} {value.name} is too large")
    return int(value.name)


# _greatest and _clamp build the AVG and VARIANCE outputs over noisy measurements, which are
# never NULL (noise is added to COALESCE(m, 0) in SQL, and to 0 for a NULL by the proxy:
# kinds.analytic), and literals: marked as the backends' own GREATEST and LEAST (ignore_nulls,
# which is how Postgres renders them anyway).  Unmarked, sqlglot renders each for DuckDB as
# CASE WHEN <arg> IS NULL ... ELSE GREATEST(<arg>, ...) END, which repeats the argument: the
# clamped AVG wrote its division 4 times, for the database and the outgoing verifier to parse.
def _greatest(node: exp.Expr, floor: float) -> exp.Expr:
    return exp.Greatest(this=node.copy(), expressions=[exp.Literal.number(floor)],
                        ignore_nulls=True)


def _clamp(node: exp.Expr, lo: float, hi: float) -> exp.Expr:
    inner = exp.Greatest(this=node, expressions=[exp.Literal.number(lo)], ignore_nulls=True)
    return exp.Least(this=inner, expressions=[exp.Literal.number(hi)], ignore_nulls=True)
