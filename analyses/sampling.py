"""Which queries sensitivity sampling (random DP, DESIGN.md section 8) answers, and the query
``f`` it evaluates, both on the private table and on databases drawn from the policy's P.

Accepted: one SELECT over one private table (event-level, or one privacy unit column per row:
``chorus_py.kinds.sampled`` bounds contributions and samples unit-level neighbours; rows of several
units and queries that read the unit column are refused), an optional WHERE,
an optional GROUP BY over columns with declared ``public_values``, and outputs that are group
keys or expressions over aggregates: COUNT, SUM, AVG, VARIANCE/STDDEV, MEDIAN,
PERCENTILE_CONT / QUANTILE_CONT, PERCENTILE_DISC / QUANTILE_DISC, over row expressions that may
use LN, LOG, SQRT and EXP (ratios such as ``SUM(a) / SUM(b)`` and ``LN(SUM(x))`` too).  The
allowlists of ``analyses.validate`` still run on every other node, so side-effect functions,
catalogs, joins, writes and parameters are refused exactly as in analytic mode.

``f`` must never fail on some data and not on other data (an error would reveal a row), and its
value is what the sampled sensitivity bounds, so the same guarded ``f`` runs on the real table and
on the samples:

- every float column read inside an expression is first tamed: clamped to [-1e12, 1e12], and
  values of magnitude below 1e-12 set to 0 (NaN and infinities land on the limits;
  ``_tame_column``); integer columns need no taming (|v| <= 2^63, and ``rewriters.safety``
  runs their arithmetic in DOUBLE);
- LN / LOG take NULL for arguments <= 0, SQRT for arguments < 0, EXP's argument is clamped to
  [-230, 230]; divisions get ``NULLIF(d, 0)`` and integer arithmetic is widened
  (``rewriters.safety``);
- a magnitude analysis bounds every numeric sub-expression's non-zero absolute values within
  [lo, hi] and refuses the query when hi > 1e290 or lo < 1e-290, so no overflow or underflow
  error can happen in Postgres (which raises them for doubles) or DuckDB;
- an output that comes out NULL (an empty AVG, a ratio over 0) counts as 0, on samples and data.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.errors import OptimizeError, ParseError, TokenError
from sqlglot.optimizer.annotate_types import annotate_types
from sqlglot.optimizer.qualify import qualify

from analyses.binding import bind_tables
from analyses.query import SQL_TYPES, display_sql, row_context
from analyses.totality import ConstantCheck, check_row, check_statement_limits
from analyses.validate import TOO_DEEP, check_node
from chorus_py.errors import (
    NotSupportedError,
    QueryRefused,
    QuerySyntaxError,
    UndefinedColumn,
)
from chorus_py.policy import NUMERIC_TYPES, Policy, TablePolicy
from rewriters.dialect import dialect as for_dialect
from rewriters.safety import safety

# Aggregates (and their syntax) that only sampled mode accepts.
_PERCENTILES = (exp.Median, exp.PercentileCont, exp.PercentileDisc, exp.Quantile)
_SAMPLED_ONLY: tuple[type[exp.Expr], ...] = (*_PERCENTILES, exp.WithinGroup)
_AGGREGATES = (exp.Count, exp.Sum, exp.Avg, exp.Variance, exp.VariancePop, exp.Stddev,
               exp.StddevPop, exp.StddevSamp, *_PERCENTILES)
_GUARDED = (exp.Ln, exp.Log, exp.Sqrt, exp.Exp)
# Row functions whose result is text or time: no magnitude to track.
_NON_NUMERIC = (exp.Lower, exp.Upper, exp.Trim, exp.TimestampTrunc, exp.DateTrunc,
                exp.CurrentDate, exp.CurrentTimestamp, exp.Nullif)

COLUMN_LIMIT = 1e12       # numeric columns are clamped to [-1e12, 1e12] ...
COLUMN_FLOOR = 1e-12      # ... and magnitudes below 1e-12 become 0
EXP_LIMIT = 230.0         # exp(230) ~ 7.7e99: sums and a product of two stay finite
MAX_MAGNITUDE = 1e290     # refused above: room for sums over up to 1e10 rows
MIN_MAGNITUDE = 1e-290    # refused below: products stay normal doubles, never underflow
MAX_ROWS = 1e10           # the row counts the magnitude analysis allows for
_ULP = 2.0 ** -53         # a non-zero a + b is at least min(|a|, |b|) * 2^-53


@dataclass(frozen=True)
class SampledOutput:
    """An output column: a group key (``key``) or a guarded expression over aggregates."""

    name: str
    expr: exp.Expr | None
    key: str | None
    integral: bool
    source: str


@dataclass(frozen=True)
class SampledQuery:
    """The query f of sensitivity sampling, ready to run on the data or on samples from P."""

    table: str
    table_policy: TablePolicy
    where: exp.Expr | None        # guarded, columns unqualified
    raw_where: exp.Expr | None    # as written (qualified): the block analysis reads it
    keys: tuple[tuple[str, tuple[object, ...]], ...]   # GROUP BY column, its public values
    outputs: tuple[SampledOutput, ...]
    columns: tuple[str, ...]      # every column f reads (drawn from P)
    normalized_sql: str

    @property
    def measured(self) -> tuple[SampledOutput, ...]:
        """The outputs that get noise (not the group keys)."""
        return tuple(o for o in self.outputs if o.key is None)

    @property
    def unit(self) -> str | None:
        """The table's privacy unit column (None: event-level)."""
        unit = self.table_policy.privacy_unit
        return unit if isinstance(unit, str) else None

    @property
    def rows_per_unit(self) -> int:
        """k: the rows one unit keeps after contribution bounding (1 when event-level), which
        are the rows neighbouring databases differ in."""
        return self.table_policy.contribution_bound

    def condition(self, where: exp.Expr | None = None) -> exp.Expr | None:
        """The rows f reads: ``where`` (default: the query's guarded WHERE) and the group keys
        among their declared values."""
        cond = self.where if where is None else where
        for col, values in self.keys:
            inside = exp.In(this=exp.column(col),
                            expressions=[_literal(v) for v in values])
            cond = inside if cond is None else exp.and_(exp.Paren(this=cond.copy()), inside)
        return cond

    def sql(self, dialect: str, source: str | exp.Expr, where: exp.Expr | None = None,
            group_first: tuple[str, ...] = (), filtered: bool = False) -> str:
        """``SELECT group_first, keys, measured outputs FROM source WHERE ... GROUP BY ...``.

        ``where`` replaces the query's own guarded WHERE (the engine adds block restrictions);
        rows whose keys are outside the declared values are left out.  ``filtered``: the
        ``source`` rows already passed ``condition()`` (a contribution-bounded subquery), no
        WHERE is added.
        """
        cond = None if filtered else self.condition(where)
        select = exp.Select()
        for name in group_first:
            select = select.select(exp.column(name), copy=False)
        for col, _ in self.keys:
            select = select.select(exp.column(col), copy=False)
        for i, out in enumerate(self.measured):
            assert out.expr is not None
            value = exp.Coalesce(this=_render(out.expr.copy(), dialect),
                                 expressions=[exp.Literal.number(0)])
            select = select.select(exp.alias_(value, f"o{i}"), copy=False)
        select = select.from_(source, copy=False)
        if cond is not None:
            select = select.where(cond.copy(), copy=False)
        group = [*group_first, *(c for c, _ in self.keys)]
        if group:
            select = select.group_by(*(exp.column(g) for g in group), copy=False)
        # A fresh tree: for_dialect may change it in place (Spark: the row ranks' keyed hash).
        return for_dialect(select, dialect, copy=False).sql(dialect)


def wants_sampling(sql: str, dialect: str, policy: Policy) -> bool:
    """Whether ``sql`` reads a private table (otherwise the analytic path answers it free)."""
    tree = _parse(sql, dialect)
    tables = bind_tables(tree, dialect, frozenset(policy.tables)).tables
    return any(not policy.tables[t].public for t in tables)


def analyze_sampled(sql: str, policy: Policy, dialect: str,
                    constants: ConstantCheck | None = None) -> SampledQuery:
    """Validate ``sql`` for sampled mode and build its guarded f (refusals cost nothing)."""
    check_statement_limits(sql, None, policy.limits)
    tree = _parse(sql, dialect)
    check_statement_limits(sql, tree, policy.limits)
    for node in tree.walk():
        if not isinstance(node, _SAMPLED_ONLY):
            check_node(node)
    tables = bind_tables(tree, dialect, frozenset(policy.tables)).tables
    private = [t for t in tables if not policy.tables[t].public]
    if len(tables) > 1 or len(private) != 1:
        raise NotSupportedError("sampled sensitivity answers queries over one private table",
                                hint="query one private table, without joins")
    table = private[0]
    tp = policy.tables[table]
    if tp.multi_attribution:
        raise NotSupportedError(
            f"sampled sensitivity is not available for '{table}': its rows belong to several "
            f"privacy units ({tp.unit_label}), and the sampler models one unit as a run of at "
            "most max_rows_per_unit rows of its own, which rows shared between units are not",
            hint="use analytic sensitivity (declare bounds), or query a table with one privacy "
            "unit per row")
    if tp.sampling is None:
        raise QueryRefused(
            f"the policy names no sampling distribution P for table '{table}'",
            hint=f"the data owner must name a reference table or declare column domains in "
            f"the policy ([tables.{table}.sampling])")
    for arg in ("with_", "distinct", "having", "order", "limit", "offset", "joins"):
        if tree.args.get(arg):
            raise NotSupportedError(
                f"{arg.rstrip('_').upper()} is not supported with sampled sensitivity",
                hint="sampled mode answers SELECT aggregates FROM one table [WHERE ...] "
                "[GROUP BY public-valued columns]")
    if any(s is not tree for s in tree.find_all(exp.Select)):
        raise NotSupportedError("subqueries are not supported with sampled sensitivity")
    try:
        return _Builder(tree, table, tp, dialect, constants, policy).build()
    except RecursionError:
        raise QueryRefused(TOO_DEEP, hint="simplify the query") from None


def _parse(sql: str, dialect: str) -> exp.Select:
    if not sql or not sql.strip():
        raise QuerySyntaxError("the query is empty", hint="send one SELECT statement")
    try:
        statements = [s for s in sqlglot.parse(sql, dialect=dialect) if s is not None]
    except (ParseError, TokenError) as err:
        raise QuerySyntaxError(f"syntax error: {str(err).splitlines()[0]}") from None
    except RecursionError:
        raise QueryRefused(TOO_DEEP, hint="simplify the query") from None
    if len(statements) != 1 or not isinstance(statements[0], exp.Select):
        raise QueryRefused("send exactly one SELECT statement")
    return statements[0]


class _Builder:
    def __init__(self, tree: exp.Select, table: str, tp: TablePolicy, dialect: str,
                 constants: ConstantCheck | None, policy: Policy) -> None:
        self.table, self.tp, self.dialect = table, tp, dialect
        schema = {table: {c: SQL_TYPES[col.type] for c, col in tp.columns.items()}}
        try:
            flat = qualify(tree.copy(), schema=schema, dialect=dialect,
                           validate_qualify_columns=True)
        except OptimizeError as err:
            raise UndefinedColumn(f"cannot resolve the query: {err}",
                                  hint=f"table '{table}' has the columns: "
                                  f"{', '.join(tp.columns)}") from None
        assert isinstance(flat, exp.Select)
        self.flat = annotate_types(flat, schema=schema, dialect=dialect)
        rows = row_context(dialect, constants, policy.limits, tamed=(COLUMN_LIMIT, COLUMN_FLOOR))
        self.rows = dataclasses.replace(rows, column_type=self._column_type)
        self.columns: list[str] = []

    def build(self) -> SampledQuery:
        flat = self.flat
        raw_where = flat.args["where"].this if flat.args.get("where") else None
        where = None
        if raw_where is not None:
            self._check_row(raw_where, "WHERE")
            where, _ = self._row(raw_where)
        keys: list[tuple[str, tuple[object, ...]]] = []
        group = flat.args.get("group")
        for key in group.expressions if group else []:
            if not isinstance(key, exp.Column) or self.tp.columns[key.name].public_values is None:
                raise NotSupportedError(
                    f"sampled mode groups only by columns with declared public_values, not "
                    f"{display_sql(key)}", hint="group by a column the policy lists values for")
            values = self.tp.columns[key.name].public_values
            assert values is not None
            keys.append((key.name, values))
            self._read(key.name)
        outputs = []
        for item in flat.expressions:
            name = item.alias_or_name
            expr = item.this if isinstance(item, exp.Alias) else item
            if isinstance(expr, exp.Column) and any(expr.name == k for k, _ in keys):
                outputs.append(SampledOutput(name, None, expr.name, False, display_sql(expr)))
                continue
            if not expr.find(*_AGGREGATES):
                raise QueryRefused(
                    f"output {display_sql(expr)} has no aggregate: raw values are never "
                    "released", hint="wrap it in an aggregate or GROUP BY it")
            guarded, _ = self._post(expr)
            integral = isinstance(expr, exp.Count)
            outputs.append(SampledOutput(name, _unqualify(guarded), None, integral,
                                         display_sql(expr)))
        if not any(o.key is None for o in outputs):
            raise QueryRefused("the query has no aggregate: raw values are never released")
        return SampledQuery(self.table, self.tp, _unqualify(where) if where else None,
                            raw_where, tuple(keys), tuple(outputs), tuple(self.columns),
                            flat.sql())

    # -- checks ---------------------------------------------------------------------------
    def _read(self, column: str) -> None:
        if self.tp.columns[column].private_id:
            raise QueryRefused(f"column {column} identifies individuals (private_id)")
        if column == self.tp.privacy_unit:
            # The sampled databases draw every row i.i.d. from P, units being runs of rows: a
            # unit's rows share no unit value there, so f could not see a unit's rows together.
            raise QueryRefused(
                f"sampled sensitivity cannot read the privacy unit column {column}: the "
                "sampled databases draw each row independently, so they do not model the "
                "rows one unit shares", hint="leave the privacy unit out of the query, or use "
                "analytic sensitivity")
        if column not in self.columns:
            self.columns.append(column)

    def _column_type(self, col: exp.Column) -> str | None:
        """A column's declared type, for the row checks (one table: its alias needs no lookup)."""
        cp = self.tp.columns.get(col.name)
        return None if cp is None else cp.type

    def _check_row(self, node: exp.Expr, clause: str) -> None:
        """The analytic mode's row checks (types, casts, comparisons, LIKE, intervals), on a
        copy whose guarded functions (LN, SQRT, ...) are replaced by their argument."""
        if node.find(exp.Pow) is not None:
            raise QueryRefused(f"POWER is not allowed on rows ({clause}) in sampled mode: it "
                               "can fail or overflow on some values", hint="write x * x")
        for fn in node.find_all(exp.Log):
            if fn.args.get("expression") is not None:
                raise QueryRefused(f"LOG with a base is not allowed on rows ({clause})",
                                   hint="use LN(x) / LN(base)")
        stripped = node.copy().transform(
            lambda n: n.this.copy() if isinstance(n, _GUARDED) else n)
        # One table, no join: the only condition is WHERE.
        check_row(stripped, clause, self.rows, boolean=clause == "WHERE")
        for col in node.find_all(exp.Column):
            self._read(col.name)

    # -- row-level expressions ---------------------------------------------------------------
    def _row(self, node: exp.Expr) -> tuple[exp.Expr, tuple[float, float] | None]:
        """A guarded copy of a row expression and its magnitude interval (None: not numeric)."""
        node = safety(node, tame_floats=False)  # _Magnitudes tames numeric reads itself
        return _Magnitudes(self.tp, row=True).guard(node)

    def _post(self, expr: exp.Expr) -> tuple[exp.Expr, tuple[float, float] | None]:
        canon = _canonical_percentiles(expr)
        # Row checks on the arguments as written (typed), before any rewrite.
        for agg in canon.find_all(*_AGGREGATES):
            arg = agg.this
            if isinstance(arg, exp.Distinct):
                raise NotSupportedError("DISTINCT inside aggregates is not supported in sampled "
                                        "mode")
            if isinstance(arg, exp.Star):
                continue
            if arg.find(*_AGGREGATES):
                raise QueryRefused("aggregates cannot be nested")
            self._check_row(arg, agg.sql_name())

        def argument(agg: exp.Expr) -> tuple[exp.Expr, tuple[float, float] | None]:
            return self._row(agg.this)

        mags = _Magnitudes(self.tp, row=False, aggregate=argument)
        return mags.guard(safety(canon, tame_floats=False))


def _canonical_percentiles(expr: exp.Expr) -> exp.Expr:
    """MEDIAN, QUANTILE(_CONT/_DISC), PERCENTILE_CONT/DISC ... WITHIN GROUP as one node kind:
    ``exp.PercentileCont`` / ``exp.PercentileDisc`` with ``this`` = value, ``expression`` = p."""

    def visit(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.WithinGroup):
            inner, order = node.this, node.expression
            if not isinstance(inner, exp.PercentileCont | exp.PercentileDisc) or not isinstance(
                    order, exp.Order) or len(order.expressions) != 1 \
                    or order.expressions[0].args.get("desc"):
                raise NotSupportedError("only PERCENTILE_CONT/DISC(p) WITHIN GROUP (ORDER BY "
                                        "value) is supported")
            return _percentile(type(inner), order.expressions[0].this, inner.this)
        if isinstance(node, exp.Median):
            return _percentile(exp.PercentileCont, node.this, exp.Literal.number(0.5))
        if isinstance(node, exp.Quantile):  # DuckDB's QUANTILE is QUANTILE_DISC
            return _percentile(exp.PercentileDisc, node.this, node.args.get("quantile"))
        if isinstance(node, exp.PercentileCont | exp.PercentileDisc) and not isinstance(
                node.parent, exp.WithinGroup):  # QUANTILE_CONT(x, p) / QUANTILE_DISC(x, p)
            return _percentile(type(node), node.this, node.args.get("expression"))
        return node

    return expr.copy().transform(visit)


def _percentile(kind: type[exp.Expr], value: exp.Expr, p: exp.Expr | None) -> exp.Expr:
    number = None
    if isinstance(p, exp.Literal) and not p.is_string:
        number = float(p.name)
    if number is None or not 0.0 <= number <= 1.0:
        raise QueryRefused("a percentile's fraction must be a number literal in [0, 1]")
    return kind(this=value.copy(), expression=exp.Literal.number(number))


def _render(node: exp.Expr, dialect: str) -> exp.Expr:
    """Percentiles in the dialect's own syntax."""

    def visit(sub: exp.Expr) -> exp.Expr:
        if isinstance(sub, exp.PercentileCont | exp.PercentileDisc) and sub.args.get(
                "expression") is not None:
            value, p = sub.this, sub.args["expression"]
            cont = isinstance(sub, exp.PercentileCont)
            if dialect == "duckdb":
                return exp.Anonymous(this="QUANTILE_CONT" if cont else "QUANTILE_DISC",
                                     expressions=[value, p])
            inner = (exp.PercentileCont if cont else exp.PercentileDisc)(this=p)
            return exp.WithinGroup(this=inner, expression=exp.Order(
                expressions=[exp.Ordered(this=value, nulls_first=False)]))
        return sub

    return node.transform(visit)


def _unqualify(node: exp.Expr) -> exp.Expr:
    def visit(sub: exp.Expr) -> exp.Expr:
        if isinstance(sub, exp.Column):
            return exp.column(sub.name)
        return sub

    return node.copy().transform(visit)


def _literal(value: object) -> exp.Expr:
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, int | float):
        return exp.Literal.number(value)
    return exp.Literal.string(str(value))


Magnitude = tuple[float, float]  # non-zero |values| lie in [lo, hi]; lo = inf: always 0


class _Magnitudes:
    """Guards functions and bounds magnitudes (see the module doc), bottom-up."""

    def __init__(self, tp: TablePolicy, row: bool, aggregate: object = None) -> None:
        self.tp = tp
        self.row = row
        self.aggregate = aggregate

    def guard(self, node: exp.Expr) -> tuple[exp.Expr, Magnitude | None]:
        out, mag = self._visit(node)
        return out, mag

    def _visit(self, node: exp.Expr) -> tuple[exp.Expr, Magnitude | None]:
        if not self.row and isinstance(node, exp.Count):
            if not isinstance(node.this, exp.Star):
                assert callable(self.aggregate)
                arg, _ = self.aggregate(node)
                node = exp.Count(this=arg)
            return node, _check(node, (1.0, MAX_ROWS))
        if not self.row and isinstance(node, _AGGREGATES):
            assert callable(self.aggregate)
            arg, mag = self.aggregate(node)
            if mag is None:
                raise QueryRefused(f"{node.sql_name()} needs a numeric argument")
            copy = node.copy()
            copy.set("this", arg)
            lo, hi = mag
            if isinstance(node, exp.Sum):
                bound = (lo * _ULP, hi * MAX_ROWS)
            elif isinstance(node, exp.Avg):
                bound = (lo * _ULP / MAX_ROWS, hi)
            elif isinstance(node, exp.PercentileCont | exp.PercentileDisc):
                bound = (lo * _ULP * 1e-10, hi)  # interpolation between two values
            else:  # variance and standard deviation: sums of squares of deviations
                bound = ((lo * _ULP) ** 2 / MAX_ROWS, (2 * hi) ** 2 * MAX_ROWS)
            return copy, _check(node, bound)
        if isinstance(node, exp.Column):
            if not self.row:
                raise QueryRefused(
                    f"column {node.name} is used outside an aggregate: raw values are never "
                    "released", hint="wrap it in an aggregate, or output the GROUP BY key alone")
            col = self.tp.columns[node.name]
            if col.type not in NUMERIC_TYPES:
                return node, None
            if col.type == "int":  # |v| in {0} U [1, 2^63]; safety() widens its arithmetic
                return node, (1.0, 2.0 ** 63)
            return _tame_column(node), (COLUMN_FLOOR, COLUMN_LIMIT)
        if isinstance(node, exp.Literal):
            if node.is_string:
                return node, None
            v = abs(float(node.name))
            return node, (math.inf, 0.0) if v == 0 else (v, v)
        # Children first (copying), then this node's rule.
        mags: dict[str, Magnitude | None] = {}
        new = node.copy()
        for key, value in node.args.items():
            if isinstance(value, exp.Expr):
                child, mag = self._visit(value)
                new.set(key, child)
                mags[key] = mag
            elif isinstance(value, list):
                items = []
                for i, v in enumerate(value):
                    if isinstance(v, exp.Expr):
                        child, mag = self._visit(v)
                        items.append(child)
                        mags[f"{key}.{i}"] = mag
                    else:
                        items.append(v)
                new.set(key, items)
        return self._rule(node, new, mags)

    def _rule(self, old: exp.Expr, new: exp.Expr,
              mags: dict[str, Magnitude | None]) -> tuple[exp.Expr, Magnitude | None]:
        a, b = mags.get("this"), mags.get("expression")
        numeric = [m for m in mags.values() if m is not None]
        if isinstance(old, exp.Paren | exp.Neg | exp.Abs):
            return new, a
        if isinstance(old, exp.Cast):
            return new, a
        if isinstance(old, exp.Add | exp.Sub):
            if a is None or b is None:
                return new, None
            return new, _check(old, (min(a[0], b[0]) * _ULP, a[1] + b[1]))
        if isinstance(old, exp.Mul):
            if a is None or b is None:
                return new, None
            return new, _check(old, (a[0] * b[0], a[1] * b[1]))
        if isinstance(old, exp.Div):
            if a is None or b is None:
                return new, None
            # The divisor is NULLIF(d, 0): its magnitude is d's (the NULLIF rule below).
            return new, _check(old, (a[0] / b[1] if b[1] > 0 else math.inf,
                                     a[1] / b[0] if a[1] > 0 else 0.0))
        if isinstance(old, exp.Mod):
            if a is None or b is None:
                return new, None
            return new, _check(old, (min(a[0], b[0]) * _ULP, b[1]))
        if isinstance(old, exp.Nullif):
            return new, a
        if isinstance(old, exp.Sign):
            return new, (1.0, 1.0)
        if isinstance(old, exp.Floor | exp.Ceil | exp.Round):
            if a is None:
                return new, None
            decimals = old.args.get("decimals") if isinstance(old, exp.Round) else None
            # FLOOR/CEIL/ROUND(x): a non-zero result is an integer; ROUND(x, d): a multiple of
            # 10^-d (d a literal, checked by the row checks; a negative d rounds to >= 1).
            lo = 1.0
            if decimals is not None:
                digits = decimals.this if isinstance(decimals, exp.Neg) else decimals
                places = float(digits.name) if isinstance(digits, exp.Literal) else 300.0
                lo = 1.0 if isinstance(decimals, exp.Neg) else min(a[0], 10.0 ** -places)
            return new, _check(old, (lo, a[1] + 1.0))
        if isinstance(old, exp.If):  # a CASE branch, or IF(cond, a, b): the values it yields
            return new, _union(old, [mags.get("true"), mags.get("false")])
        if isinstance(old, exp.Case):
            return new, _union(old, [m for k, m in mags.items() if k != "this"])
        if isinstance(old, exp.Least | exp.Greatest | exp.Coalesce):
            return new, _union(old, list(mags.values()))
        if isinstance(old, exp.Length):
            return new, (1.0, 2.0 ** 31)
        if isinstance(old, exp.Extract):
            return new, (1e-6, 1e12)
        if isinstance(old, exp.Ln | exp.Log):
            if a is None:
                return new, None
            x = new.this
            guarded = exp.Case(ifs=[exp.If(this=exp.GT(this=x.copy(),
                                                       expression=exp.Literal.number(0)),
                                           true=x.copy())])
            new.set("this", guarded)
            lo, hi = a
            top = max(abs(math.log(lo)), abs(math.log(hi))) if hi > 0 else 0.0
            return new, _check(old, (2.0 ** -54, max(top, 1.0)))
        if isinstance(old, exp.Sqrt):
            if a is None:
                return new, None
            x = new.this
            new.set("this", exp.Case(ifs=[exp.If(
                this=exp.GTE(this=x.copy(), expression=exp.Literal.number(0)), true=x.copy())]))
            return new, _check(old, (math.sqrt(a[0]) if math.isfinite(a[0]) else math.inf,
                                     math.sqrt(a[1])))
        if isinstance(old, exp.Exp):
            if a is None:
                return new, None
            x = new.this
            new.set("this", _clamp(x, EXP_LIMIT))
            top = min(a[1], EXP_LIMIT)
            return new, _check(old, (math.exp(-top), math.exp(top)))
        if isinstance(old, exp.Pow):
            raise QueryRefused("POWER is not supported in sampled mode", hint="write x * x")
        if numeric and isinstance(old, exp.Func) and not isinstance(old, _NON_NUMERIC):
            raise QueryRefused(f"{old.sql_name()} is not supported in sampled mode")
        return new, None  # comparisons, boolean logic, text: no magnitude


def _union(node: exp.Expr, parts: list[Magnitude | None]) -> Magnitude | None:
    found = [m for m in parts if m is not None]
    if not found:
        return None
    return _check(node, (min(m[0] for m in found), max(m[1] for m in found)))


def _check(node: exp.Expr, mag: Magnitude) -> Magnitude:
    lo, hi = mag
    if hi > MAX_MAGNITUDE or (math.isfinite(lo) and lo < MIN_MAGNITUDE):
        raise QueryRefused(
            f"the value of {display_sql(node)} can overflow or underflow a double on some "
            "data, and the error would reveal a row",
            hint="use smaller constants or fewer nested products / exponentials")
    return mag


def _clamp(x: exp.Expr, limit: float) -> exp.Expr:
    """``CASE WHEN x > L THEN L WHEN x < -L THEN -L ELSE x END`` (NULL stays NULL)."""
    return exp.Case(ifs=[
        exp.If(this=exp.GT(this=x.copy(), expression=exp.Literal.number(limit)),
               true=exp.Literal.number(limit)),
        exp.If(this=exp.LT(this=x.copy(), expression=exp.Literal.number(-limit)),
               true=exp.Literal.number(-limit)),
    ], default=x.copy())


def _tame_column(col: exp.Column) -> exp.Expr:
    """The column as a DOUBLE in {0} U [1e-12, 1e12] in magnitude; NaN and +inf -> 1e12."""
    x = exp.cast(col.copy(), exp.DType.DOUBLE)
    big, small = exp.Literal.number(COLUMN_LIMIT), exp.Literal.number(COLUMN_FLOOR)
    neg_big = exp.Literal.number(-COLUMN_LIMIT)
    neg_small = exp.Literal.number(-COLUMN_FLOOR)
    return exp.Paren(this=exp.Case(ifs=[
        # NaN compares greater than every number in both databases: it lands here.
        exp.If(this=exp.GT(this=x.copy(), expression=big), true=big.copy()),
        exp.If(this=exp.LT(this=x.copy(), expression=neg_big), true=neg_big.copy()),
        exp.If(this=exp.and_(exp.GT(this=x.copy(), expression=neg_small),
                             exp.LT(this=x.copy(), expression=small)),
               true=exp.Literal.number(0)),
    ], default=x.copy()))
