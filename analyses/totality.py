"""Totality: a row-level expression is accepted only when it provably cannot raise an error.

An error that depends on one row's value (an overflow for a large fare, a failing cast inside a
CASE branch only one person's row reaches) tells the analyst that value, whatever the noise:
binary search on the error costs no epsilon at all, since refusals and failures are free.  So
every expression evaluated per row (WHERE, GROUP BY keys, aggregate arguments, join ON) must be
*total* on the backend that runs it: for every value its columns' types allow -- not only the
declared bounds, which the data is not forced into before the expression runs -- including NULL,
and for floats NaN, +/-Infinity and denormals.  Every CASE branch is checked, taken or not.

One rule per node kind (``_RULES`` and ``_check_node``); a kind without a rule is refused by
name.  The numeric rule tracks, per expression, an interval of its finite values and the
smallest magnitude a non-zero value can have, so a Postgres float8 overflow ("value out of
range: overflow") or underflow (a zero product or quotient of non-zero operands) is proved
impossible or refused.  (DuckDB returns Infinity and 0 there, and the rewriter casts integer
arithmetic to DOUBLE and guards every divisor with NULLIF(d, 0): ``rewriters.safety``.)

Constants are never judged by Python's parsers: every column-free sub-expression, every literal
that meets a typed value (``ts > '2026-01-01'``), every LIKE pattern and every time function of a
column (tried on the edge values of the column's type: its minimum, maximum and +/-infinity) is
run once by the backend itself in a statement that reads no table, through the injected
``ConstantCheck`` (``chorus_py.engine`` caches the verdicts).  What the backend rejects is
refused.

Bounded cost (wall 8): each row-level expression has a cost per row, every CASE branch counted as
if evaluated; string functions cost the length bound of their input.  The limits are policy
keys under ``[limits]`` (``chorus_py.policy.LimitsConfig``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlglot import exp

from analyses.literals import literal_value
from analyses.trees import sql_text
from analyses.typecheck import check_row_types
from chorus_py.errors import QueryRefused
from chorus_py.policy import LimitsConfig
from rewriters.dialect import dialect
from rewriters.safety import (
    FLOAT_COLUMN_LEAST,
    FLOAT_COLUMN_MOST,
    TAMED_BY,
    TIME_READ_RANGE,
    TIMESTAMP_TYPES,
    safety,
)

# Runs ``SELECT <expression> IS NULL`` (reading no table) on the backend; True when it ran.
ConstantCheck = Callable[[str], bool]
# The policy type of a column ("int", "float", "text", "bool", "date", "timestamp"), or None.
ColumnType = Callable[[exp.Column], str | None]

_MAX = 1.7976931348623157e308
_TINIEST = 5e-324  # the smallest positive double (a denormal)
_BIGINT = 2.0 ** 63
# Backends whose double arithmetic is treated as raising on overflow and underflow: Postgres
# raises; Spark (ANSI mode) returns Infinity but raises on some conversions, and is held to the
# stricter rule rather than proven case by case.
_STRICT_FLOAT = frozenset({"postgres", "spark"})

# Node kinds with a rule on rows.  Anything else is refused, naming the kind.
_PLAIN = (
    exp.Column, exp.Identifier, exp.Literal, exp.Boolean, exp.Null, exp.Paren, exp.Not, exp.And,
    exp.Or, exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Is, exp.In, exp.Between,
    exp.Case, exp.If, exp.DataType, exp.DataTypeParam, exp.Var, exp.Least, exp.Greatest,
    exp.Coalesce, exp.Nullif, exp.CurrentDate, exp.CurrentTimestamp,
)
_ARITHMETIC = (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod, exp.Neg, exp.Abs, exp.Sign,
               exp.Round, exp.Floor, exp.Ceil)
_STRING = (exp.Lower, exp.Upper, exp.Trim, exp.Length, exp.DPipe, exp.Concat)
_TIME = (exp.TimestampTrunc, exp.DateTrunc, exp.Extract)
_RULES = _PLAIN + _ARITHMETIC + _STRING + _TIME + (exp.Cast, exp.Like, exp.ILike, exp.Interval)

# Functions that are total on noisy aggregates only (post-processing), never on rows.
_POST_ONLY = (exp.Sqrt, exp.Ln, exp.Log, exp.Exp, exp.Pow)

# Units DATE_TRUNC and EXTRACT accept (singular, lower case).
TIME_UNITS = frozenset({
    "microsecond", "millisecond", "second", "minute", "hour", "day", "week", "month", "quarter",
    "year", "decade", "century", "millennium", "dow", "doy", "epoch", "isodow", "isoyear",
})



@dataclass(frozen=True)
class Num:
    """What a numeric expression's finite values can be: in [lo, hi], and 0 or |v| >= tiny.

    Non-finite values (NaN, +/-Infinity) may occur too: they never make an operation raise
    (Postgres reports overflow and underflow only for finite operands).
    """

    lo: float
    hi: float
    tiny: float

    @property
    def big(self) -> float:
        """The largest magnitude."""
        return max(abs(self.lo), abs(self.hi))

    @property
    def least_nonzero(self) -> float:
        """The smallest magnitude of a non-zero value."""
        gap = self.lo if self.lo > 0 else (-self.hi if self.hi < 0 else 0.0)
        return max(self.tiny, gap)


@dataclass
class RowContext:
    """What the totality analysis needs besides the expression.

    ``dialect``: the backend that runs it ("duckdb", "postgres" or "spark"); ``column_type``:
    declared column types; ``constants``: runs a table-free statement on that backend.
    """

    dialect: str
    column_type: ColumnType
    constants: ConstantCheck
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    # (largest magnitude, least non-zero magnitude) of numeric column reads when the rewriter
    # tames them first (sampled mode, ``analyses.sampling``); None: any value of the type.
    tamed: tuple[float, float] | None = None


def check_row(node: exp.Expr, clause: str, ctx: RowContext, boolean: bool = False) -> None:
    """Refuse ``node`` (evaluated per row in ``clause``) unless it provably cannot raise.

    ``boolean``: the expression is a condition (WHERE, ON).  The tree must carry sqlglot's type
    annotations (``annotate_types``).  Raises :class:`QueryRefused` naming the node and the fix.
    """
    check_row_types(node, clause, boolean=boolean)
    _Totality(clause, ctx).check(node)


def duckdb_constants() -> ConstantCheck:
    """A :data:`ConstantCheck` on an in-memory DuckDB: the engine itself, for the duckdb dialect
    (the proxy's DuckDB backends run the same library), for callers without a backend."""
    import duckdb

    con = duckdb.connect()

    def run(sql: str) -> bool:
        try:
            con.execute(sql).fetchall()
        except duckdb.Error:
            return False
        return True

    return run


def check_statement_limits(sql: str, tree: exp.Expr | None, limits: LimitsConfig) -> None:
    """Refuse a statement whose text, literals or tree exceed the ``[limits]`` of the policy.

    ``tree``: the parsed statement, or None to check the text alone (before parsing it).
    """
    if len(sql) > limits.max_sql_chars:
        raise QueryRefused(
            f"the query is {len(sql)} characters long, above the limit of "
            f"{limits.max_sql_chars} (limits.max_sql_chars)", hint="send a shorter query")
    if tree is None:
        return
    count = 0
    stack: list[tuple[exp.Expr, int]] = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > limits.max_expression_nodes:
            raise QueryRefused(
                f"the query has more than {limits.max_expression_nodes} syntax nodes "
                "(limits.max_expression_nodes)", hint="simplify the query")
        if depth > limits.max_expression_depth:
            raise QueryRefused(
                f"the query nests deeper than {limits.max_expression_depth} levels "
                "(limits.max_expression_depth)", hint="simplify the query")
        if isinstance(node, exp.Literal) and len(node.name) > limits.max_literal_chars:
            raise QueryRefused(
                f"a literal of {len(node.name)} characters is above the limit of "
                f"{limits.max_literal_chars} (limits.max_literal_chars)",
                hint="use shorter literals")
        stack.extend((child, depth + 1) for child in node.iter_expressions())


class _Totality:
    def __init__(self, clause: str, ctx: RowContext) -> None:
        self.clause = clause
        self.ctx = ctx
        self.nums: dict[int, Num | None] = {}
        self.lengths: dict[int, int] = {}

    # -- driver --------------------------------------------------------------------------------
    def check(self, root: exp.Expr) -> None:
        order = list(root.walk(bfs=False))  # parents before children
        for node in order:
            self._allowed(node)
        cost = 0
        for node in reversed(order):  # children before parents
            self._check_node(node)
            cost += self._cost(node)
        if cost > self.ctx.limits.max_row_cost:
            raise QueryRefused(
                f"{_short(root)} in {self.clause} costs about {cost} work units per row, above "
                f"the limit of {self.ctx.limits.max_row_cost} (limits.max_row_cost)",
                hint="use fewer or shorter string operations")
        self._constants(root)

    def _allowed(self, node: exp.Expr) -> None:
        if isinstance(node, _POST_ONLY):
            raise QueryRefused(
                f"{node.sql_name()} is not allowed on rows ({self.clause}): it can fail on some "
                "values, and an error would reveal the row",
                hint="apply it to the aggregate's result instead, e.g. SQRT(SUM(x))")
        if not isinstance(node, _RULES):
            name = node.sql_name() if isinstance(node, exp.Func) else type(node).__name__
            raise QueryRefused(
                f"{name} is not allowed on rows ({self.clause}): the proxy has no proof that it "
                "cannot fail on some value", hint="use arithmetic, comparisons, CASE, COALESCE "
                "and the functions listed in the README")

    # -- rules per node kind ---------------------------------------------------------------------
    def _check_node(self, node: exp.Expr) -> None:
        if isinstance(node, exp.Like | exp.ILike):
            self._like(node)
        elif isinstance(node, exp.Interval):
            self._interval(node)
        elif isinstance(node, _TIME):
            self._time_function(node)
        elif isinstance(node, exp.Cast):
            self._cast(node)
        elif isinstance(node, exp.EQ | exp.NEQ | exp.GT | exp.GTE | exp.LT | exp.LTE):
            self._compare(node.this, node.expression)
        elif isinstance(node, exp.In):
            for item in node.expressions:
                self._compare(node.this, item)
        elif isinstance(node, exp.Between):
            self._compare(node.this, node.args["low"])
            self._compare(node.this, node.args["high"])
        elif isinstance(node, exp.Sub) and _time(node.this) and _time(node.expression) \
                and not (_constant(node.this) and _constant(node.expression)):
            raise QueryRefused(
                f"subtracting dates or timestamps ({_short(node)}) is not allowed on rows "
                f"({self.clause}): the difference of far-apart values overflows",
                hint="compare each timestamp with a literal instead")
        if isinstance(node, _MIXING) and not _constant(node):
            self._same_time_type(node)
        if isinstance(node, exp.Round):
            digits = node.args.get("decimals")
            if digits is not None and (literal_value(digits) is None
                                       or not _is_int(literal_value(digits)[1])):
                raise QueryRefused(f"ROUND's digits must be an integer literal ({self.clause})")
        self._num(node)  # the numeric rule (overflow, underflow) for every numeric node

    def _same_time_type(self, node: exp.Expr) -> None:
        # A DATE next to a TIMESTAMP is converted to one: the latest dates do not fit.
        operands = _compared(node)
        kinds = {_annotated_time(p) for p in operands} - {None}
        if len(kinds) < 2:
            return
        dates = [p for p in operands if _annotated_time(p) == "date"]
        if all(_constant(p) for p in dates):
            for date in dates:  # a date constant: the backend converts it, once, here
                self._run(exp.Cast(this=date.copy(), to=exp.DataType.build("TIMESTAMP")),
                          f"{_short(date)} as a timestamp")
        else:
            raise QueryRefused(
                f"{_short(node)} in {self.clause} mixes a DATE with a TIMESTAMP: the backend "
                "converts the date, which fails for dates beyond the timestamp range",
                hint="compare values of one type, e.g. a DATE column with a DATE literal")

    def _like(self, node: exp.Like | exp.ILike) -> None:
        pattern = literal_value(node.expression)
        if pattern is None or pattern[0] != "string" or node.args.get("escape") is not None:
            raise QueryRefused(f"LIKE patterns must be string literals ({self.clause})",
                               hint="write the pattern as a quoted literal, without ESCAPE")
        text = pattern[1]
        # Postgres raises on a pattern ending in its escape character, but only once a subject
        # gets that far in the match: whether it raises depends on the row.
        trailing = len(text) - len(text.rstrip("\\"))
        if trailing % 2:
            raise QueryRefused(
                f"the LIKE pattern {sql_text(node.expression)} in {self.clause} ends with an "
                "escape character (a backslash)", hint="write a literal backslash as '\\\\'")
        literal = exp.Literal.string(text)
        kind = exp.ILike if isinstance(node, exp.ILike) else exp.Like
        for subject in (literal, exp.Literal.string("")):
            self._run(kind(this=subject.copy(), expression=literal.copy()),
                      f"the LIKE pattern {sql_text(node.expression)}")

    def _interval(self, node: exp.Interval) -> None:
        if literal_value(node.this) is None:
            raise QueryRefused(
                f"interval amounts must be literals ({_short(node)} in {self.clause})",
                hint="write e.g. INTERVAL '3' DAY")
        parent = node.parent
        while isinstance(parent, exp.Paren):
            parent = parent.parent
        if isinstance(parent, exp.Add | exp.Sub) and not _constant(parent):
            # A timestamp plus an interval overflows for late enough rows.
            raise QueryRefused(
                f"interval arithmetic is not allowed on rows ({self.clause})",
                hint="compare the timestamp with a literal instead, e.g. "
                "pickup_time >= '2026-03-01'")

    def _time_function(self, node: exp.Expr) -> None:
        unit = node.this if isinstance(node, exp.Extract) else node.args.get("unit")
        arg = node.expression if isinstance(node, exp.Extract) else node.this
        name = unit.name.lower().rstrip("s") if isinstance(unit, exp.Literal | exp.Var) else ""
        fname = "EXTRACT" if isinstance(node, exp.Extract) else "DATE_TRUNC"
        if name not in TIME_UNITS:
            raise QueryRefused(f"{fname}'s unit must be a literal time unit ({self.clause})",
                               hint="one of: " + ", ".join(sorted(TIME_UNITS)))
        self._on_time_edges(node, arg, f"{fname}({name} ...)")

    def _cast(self, cast: exp.Cast) -> None:
        to = cast.to
        if _constant(cast.this):
            return  # run by the backend with the other constants
        src = _policy_type(cast.this, self.ctx)
        if to.is_type(*exp.DataType.TEXT_TYPES) and src in ("int", "float", "text", "bool"):
            return
        if to.is_type(exp.DType.DOUBLE, exp.DType.FLOAT) and src in ("int", "float"):
            return
        if src in ("date", "timestamp") and to.is_type(
                exp.DType.DATE, exp.DType.TIMESTAMP, *exp.DataType.TEXT_TYPES):
            self._on_time_edges(cast, cast.this, f"the cast {_short(cast)}")
            return
        raise QueryRefused(
            f"the cast {sql_text(cast)} in {self.clause} may fail on some rows",
            hint="casts on rows may only go to TEXT, to DOUBLE from a number, or between "
            "DATE and TIMESTAMP")

    def _compare(self, left: exp.Expr, right: exp.Expr) -> None:
        # The backend converts a string literal next to a typed column to the column's type:
        # that conversion is tried by the backend itself, never by a Python parser.
        for a, b in ((left, right), (right, left)):
            kind = _policy_type(a, self.ctx)
            literal = literal_value(b)
            if kind is None or literal is None or _constant(a):
                continue
            form, text = literal
            if kind == "text" and form == "number":
                raise QueryRefused(
                    f"{_short(a)} is text but is compared with the number {text} in "
                    f"{self.clause}", hint=f"quote the value: '{text}'")
            if kind in ("int", "float") and form == "string":
                raise QueryRefused(
                    f"{_short(a)} is a number but is compared with the text {sql_text(b)} in "
                    f"{self.clause}", hint="write the number without quotes")
            if kind in ("date", "timestamp"):
                if form == "number":
                    raise QueryRefused(
                        f"{_short(a)} is a {kind} but is compared with the number {text} in "
                        f"{self.clause}", hint=f"compare with a {kind} such as '2026-01-31'")
                target = exp.DataType.build("DATE" if kind == "date" else "TIMESTAMP")
                self._run(exp.Cast(this=exp.Literal.string(text), to=target),
                          f"'{text}' as a {kind} (compared with {_short(a)})",
                          hint="use ISO format, e.g. '2026-01-31' or '2026-01-31 08:00:00'")
            if kind == "bool" and form == "string":
                self._run(exp.Cast(this=exp.Literal.string(text),
                                   to=exp.DataType.build("BOOLEAN")),
                          f"'{text}' as a boolean (compared with {_short(a)})")

    # -- the numeric rule --------------------------------------------------------------------------
    def _num(self, node: exp.Expr) -> Num | None:
        key = id(node)
        if key in self.nums:
            return self.nums[key]
        found = self._num_of(node)
        self.nums[key] = found
        return found

    def _num_of(self, node: exp.Expr) -> Num | None:
        if isinstance(node, exp.Paren):
            return self._num(node.this)
        if isinstance(node, exp.Column):
            kind = self.ctx.column_type(node)
            if kind in ("int", "float") and self.ctx.tamed is not None:
                top, least = self.ctx.tamed
                return Num(-top, top, least)
            if kind == "int":  # the rewriter widens integer arithmetic to DOUBLE
                return Num(-_BIGINT, _BIGINT, 1.0)
            if kind == "float" and _operand_of(node, TAMED_BY):  # rewriters.safety tames it
                return Num(-FLOAT_COLUMN_MOST, FLOAT_COLUMN_MOST, FLOAT_COLUMN_LEAST)
            if kind == "float":  # any double: the data is not clamped before this expression
                return Num(-_MAX, _MAX, FLOAT_COLUMN_LEAST)
            return None
        if isinstance(node, exp.Literal):
            if node.is_string:
                return None
            try:
                value = float(node.name)
            except ValueError:
                return self._refuse_number(node)
            if not math.isfinite(value) or (value == 0.0 and _nonzero_digits(node.name)):
                return self._refuse_number(node)
            return Num(value, value, abs(value) if value else _MAX)
        if isinstance(node, exp.Neg):
            inner = self._num(node.this)
            return None if inner is None else Num(-inner.hi, -inner.lo, inner.tiny)
        if isinstance(node, exp.Add | exp.Sub):
            a, b = self._num(node.this), self._num(node.expression)
            if a is None or b is None:
                return None
            if isinstance(node, exp.Add):
                lo, hi = a.lo + b.lo, a.hi + b.hi
            else:
                lo, hi = a.lo - b.hi, a.hi - b.lo
            self._finite(node, lo, hi)
            # Both operands are multiples of their quanta, so the sum is a multiple of the
            # smaller one: non-zero sums are at least that large.
            return Num(lo, hi, min(_quantum(a.tiny), _quantum(b.tiny)))
        if isinstance(node, exp.Mul):
            a, b = self._num(node.this), self._num(node.expression)
            if a is None or b is None:
                return None
            ends = [x * y for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
            self._finite(node, min(ends), max(ends))
            # IEEE rounding is monotone: no non-zero product is smaller than this one.
            tiny = min(a.tiny * b.tiny, _MAX)
            if tiny == 0.0:
                self._underflow(node)
            return Num(min(ends), max(ends), tiny)
        if isinstance(node, exp.Div):
            a, b = self._num(node.this), self._num(node.expression)
            if a is None or b is None:
                return None
            # The rewriter turns a zero divisor into NULL (NULLIF): only non-zero ones divide.
            big = a.big / b.least_nonzero
            self._finite(node, -big, big)
            tiny = min(a.tiny / b.big, _MAX) if b.big else _MAX
            if tiny == 0.0:
                self._underflow(node)
            negative = (a.lo < 0 < b.hi) or (a.hi > 0 and b.lo < 0)
            positive = (a.hi > 0 < b.hi) or (a.lo < 0 and b.lo < 0)
            return Num(-big if negative else 0.0, big if positive else 0.0, tiny)
        if isinstance(node, exp.Mod):
            a, b = self._num(node.this), self._num(node.expression)
            if a is None or b is None:
                return None
            return Num(-a.big, a.big, min(_quantum(a.tiny), _quantum(b.tiny)))
        if isinstance(node, exp.Abs):
            inner = self._num(node.this)
            return None if inner is None else Num(0.0, inner.big, inner.tiny)
        if isinstance(node, exp.Sign):
            return Num(-1.0, 1.0, 1.0)
        if isinstance(node, exp.Floor | exp.Ceil):
            inner = self._num(node.this)
            # (Infinite ends stay infinite: only DuckDB gets here with them, where they are fine.)
            return None if inner is None else Num(_floor(inner.lo), _ceil(inner.hi), 1.0)
        if isinstance(node, exp.Round):
            inner = self._num(node.this)
            if inner is None:
                return None
            digits = node.args.get("decimals")
            places = int(float(literal_value(digits)[1])) if digits is not None else 0
            step = 10.0 ** -places if -308 < places < 308 else (0.0 if places > 0 else _MAX)
            lo, hi = inner.lo - step, inner.hi + step
            if digits is not None and self.ctx.dialect in _STRICT_FLOAT:
                # Postgres rounds in NUMERIC (rewriters.dialect); a double converts to NUMERIC
                # with 15 significant digits, so the largest doubles come back above the
                # largest double, and converting back raises.
                lo, hi = lo * (1 + 1e-14), hi * (1 + 1e-14)
            self._finite(node, lo, hi)
            return Num(lo, hi, min(inner.tiny, step) if step else inner.tiny)
        if isinstance(node, exp.Length):
            return Num(0.0, 2.0 ** 31, 1.0)
        if isinstance(node, exp.Extract):
            return Num(-1e14, 1e14, 1e-6)
        if isinstance(node, exp.Cast):
            if not node.to.is_type(*exp.DataType.NUMERIC_TYPES):
                return None
            return self._num(node.this)
        if isinstance(node, exp.Least | exp.Greatest | exp.Coalesce | exp.Nullif | exp.Case
                      | exp.If):
            parts = _results(node)
            nums = [self._num(p) for p in parts if not isinstance(p, exp.Null)]
            if not nums or any(n is None for n in nums):
                return None
            known = [n for n in nums if n is not None]
            return Num(min(n.lo for n in known), max(n.hi for n in known),
                       min(n.tiny for n in known))
        return None

    def _finite(self, node: exp.Expr, lo: float, hi: float) -> None:
        if self.ctx.dialect not in _STRICT_FLOAT or (math.isfinite(lo) and math.isfinite(hi)):
            return
        raise QueryRefused(
            f"{_short(node)} in {self.clause} can overflow a double precision value for some "
            "values of its columns (Postgres raises an error instead of returning Infinity, "
            "and that error would reveal the row)",
            hint="use smaller constants: a float column read in arithmetic may be as large as "
            "1e150 in magnitude (declared bounds hold only once a value is clipped)")

    def _underflow(self, node: exp.Expr) -> None:
        if self.ctx.dialect not in _STRICT_FLOAT:
            return
        raise QueryRefused(
            f"{_short(node)} in {self.clause} can underflow a double precision value (a "
            "non-zero result too small to represent) for some values of its columns, which "
            "Postgres reports as an error that would reveal the row",
            hint="avoid multiplying or dividing by very small or very large constants: a float "
            "column read in arithmetic may be as small as 1e-150 in magnitude")

    def _refuse_number(self, node: exp.Expr) -> None:
        raise QueryRefused(f"the number {node.name[:40]} in {self.clause} is out of range of "
                           "a double precision value", hint="use a smaller number")

    # -- constants, run by the backend -------------------------------------------------------------
    def _constants(self, root: exp.Expr) -> None:
        stack = [root]
        while stack:
            node = stack.pop()
            if isinstance(node, exp.DataType | exp.DataTypeParam | exp.Var | exp.Identifier):
                continue
            if _constant(node):
                if not isinstance(node, exp.Null | exp.Boolean) and not (
                        isinstance(node, exp.Literal) and node.is_string):
                    self._run(node, f"the constant {_short(node)}")
                continue
            stack.extend(node.iter_expressions())

    def _on_time_edges(self, node: exp.Expr, arg: exp.Expr, what: str) -> None:
        """Run ``node`` with its time argument replaced by each edge value of its type."""
        if _constant(arg):
            return
        while isinstance(arg, exp.Paren):
            arg = arg.this
        kind = _policy_type(arg, self.ctx)
        if not isinstance(arg, exp.Column) or kind not in TIME_READ_RANGE:
            raise QueryRefused(f"{what} in {self.clause}: the proxy can check it only on a DATE "
                               "or TIMESTAMP column", hint="apply it to the column itself")
        edges = TIME_READ_RANGE[kind]
        target = exp.DataType.build("DATE" if kind == "date" else "TIMESTAMP")
        for edge in edges:
            probe = node.copy()
            replaced = next(n for n in probe.walk() if n == arg)
            replaced.replace(exp.Cast(this=exp.Literal.string(edge), to=target.copy()))
            self._run(probe, f"{what} (on the {kind} {edge})",
                      hint="a value of the column's type makes it fail on the backend; leave "
                      "it out of the query")

    def _run(self, node: exp.Expr, what: str, hint: str | None = None) -> None:
        # As the rewriter will run it: integer arithmetic widened, divisors guarded.
        guarded = dialect(safety(node), self.ctx.dialect)
        sql = exp.select(exp.Is(this=exp.Paren(this=guarded), expression=exp.Null())).sql(
            self.ctx.dialect)
        if not self.ctx.constants(sql):
            raise QueryRefused(f"{what} in {self.clause} fails on the backend",
                               hint=hint or "fix the literal (the database rejects it)")

    # -- cost --------------------------------------------------------------------------------------
    def _cost(self, node: exp.Expr) -> int:
        if isinstance(node, _STRING):
            return max(1, sum(self._length(c) for c in node.iter_expressions()))
        if isinstance(node, exp.Like | exp.ILike):
            # A pattern with wildcards can backtrack: subject length times pattern length.
            return max(1, self._length(node.this) * max(1, self._length(node.expression)))
        return 1

    def _length(self, node: exp.Expr) -> int:
        key = id(node)
        if key in self.lengths:
            return self.lengths[key]
        if isinstance(node, exp.Literal):
            found = len(node.name)
        elif isinstance(node, exp.Column):
            found = self.ctx.limits.text_column_chars
        elif isinstance(node, exp.DPipe | exp.Concat):
            found = sum(self._length(c) for c in node.iter_expressions())
        elif isinstance(node, exp.Lower | exp.Upper | exp.Trim | exp.Paren):
            found = self._length(node.this)
        elif isinstance(node, exp.Case | exp.If | exp.Coalesce | exp.Nullif | exp.Least
                        | exp.Greatest):
            found = max([self._length(p) for p in _results(node)] or [0])
        else:
            found = 64  # numbers, times and booleans as text
        self.lengths[key] = found
        return found


_MIXING = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.In, exp.Between, exp.Least,
           exp.Greatest, exp.Coalesce, exp.Nullif, exp.Case, exp.If)


def _compared(node: exp.Expr) -> list[exp.Expr]:
    """The operands whose values ``node`` compares or chooses among (one type in the end)."""
    if isinstance(node, exp.Between):
        return [node.this, node.args["low"], node.args["high"]]
    if isinstance(node, exp.In):
        return [node.this, *node.expressions]
    if isinstance(node, exp.Nullif):
        return [node.this, node.expression]
    if isinstance(node, exp.Case | exp.If | exp.Least | exp.Greatest | exp.Coalesce):
        return _results(node)
    return [node.this, node.expression]


def _results(node: exp.Expr) -> list[exp.Expr]:
    """The expressions whose value ``node`` can return (CASE branches, function arguments)."""
    if isinstance(node, exp.Case):
        parts = [i.args["true"] for i in node.args.get("ifs") or []]
        default = node.args.get("default")
        return parts + ([default] if default is not None else [])
    if isinstance(node, exp.If):
        return [p for p in (node.args.get("true"), node.args.get("false")) if p is not None]
    if isinstance(node, exp.Nullif):
        return [node.this]
    return [node.this, *node.expressions]


def _constant(node: exp.Expr) -> bool:
    """Whether ``node`` reads no column: its value is the same on every row."""
    return node.find(exp.Column) is None


def _time(node: exp.Expr) -> bool:
    return node.type is not None and node.type.is_type(*exp.DataType.TEMPORAL_TYPES)


def _annotated_time(node: exp.Expr) -> str | None:
    if node.type is not None and node.type.is_type(exp.DType.DATE):
        return "date"
    if node.type is not None and node.type.is_type(*TIMESTAMP_TYPES):
        return "timestamp"
    return None


def _policy_type(node: exp.Expr, ctx: RowContext) -> str | None:
    while isinstance(node, exp.Paren):
        node = node.this
    return ctx.column_type(node) if isinstance(node, exp.Column) else None


def _quantum(tiny: float) -> float:
    """Every double of magnitude >= ``tiny`` is a multiple of this power of two."""
    if tiny >= _MAX:
        return _MAX
    exponent = math.frexp(tiny)[1] - 1  # tiny is in [2^exponent, 2^(exponent+1))
    return max(math.ldexp(1.0, exponent - 52), _TINIEST)


def _floor(value: float) -> float:
    return float(math.floor(value)) if math.isfinite(value) else value


def _ceil(value: float) -> float:
    return float(math.ceil(value)) if math.isfinite(value) else value


def _is_int(text: str) -> bool:
    try:
        return float(text).is_integer() and abs(float(text)) < 1000
    except ValueError:
        return False


def _nonzero_digits(text: str) -> bool:
    mantissa = text.lower().split("e")[0]
    return any(c in "123456789" for c in mantissa)


def _short(node: exp.Expr) -> str:
    text = sql_text(node)
    return text if len(text) <= 60 else text[:57] + "..."


def _operand_of(node: exp.Expr, kinds: tuple[type[exp.Expr], ...]) -> bool:
    """Whether ``node``'s nearest parent that is not a parenthesis is one of ``kinds``."""
    parent = node.parent
    while isinstance(parent, exp.Paren):
        parent = parent.parent
    return isinstance(parent, kinds)
