"""The finish of an answer the proxy noised: its outputs (renames, ratios, HAVING, ORDER BY,
LIMIT) computed from the released noisy values, after the data was read (post-processing).

Two ways to one result:

- A finish of arithmetic over the values, comparisons, ORDER BY and LIMIT (what the rewrite
  makes of counts, sums, averages, variances, ratios, HAVING and top-k, :class:`PythonFinish`)
  is computed in Python, in microseconds, with DuckDB's semantics.
- Any other runs as DuckDB SQL on the proxy's scratch connection (:func:`finish_columns`) over a
  relation ``NOISY`` made of the values, one list parameter per column, unnested: one
  statement whose text does not depend on the number of rows.  Measured (medians of 40,
  2026-12-04): 0.9 ms for 1 to 100 rows and 1.9 ms for 1,000, where a VALUES list of cast
  parameters or a table filled by INSERTs took 0.9, 1.3, 3.6 and 23 ms for 1, 8, 100 and
  1,000 rows.

Either way each value is what it would be after an INSERT into :func:`noisy_table`'s table:
DuckDB casts it to its column's type (an int into VARCHAR becomes text, a Decimal into DOUBLE a
float).  The Python finish returns a picked value only where that cast leaves it as it is,
and hands the finish to SQL otherwise.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

import numpy as np
import sqlglot
from sqlglot import exp

from chorus_py.backends import ResultSet, portable_type
from chorus_py.caches import LRU
from chorus_py.errors import BackendError
from rewriters.pipeline import NOISY

log = logging.getLogger("chorus.engine")

#: Up to this many rows (after the key-release threshold) the finish is computed in Python:
#: an average's ordered by its count took 4.3 us a row, against DuckDB's 1.1 ms a statement
#: plus 1 us a row (equal near 400 rows; medians of 50, 2026-12-04).
PYTHON_ROWS = 200

#: A column of released values: (name, DuckDB type).
Column = tuple[str, str]

#: Per DuckDB type of a column of released values: the Python values its cast keeps as they
#: are (exact types: a bool is an int, a datetime a date, to Python).
_KEPT_AS_IS: dict[str, Callable[[Any], bool]] = {
    "BIGINT": lambda v: type(v) is int and -2 ** 63 <= v < 2 ** 63,
    "DOUBLE": lambda v: type(v) is float,
    "VARCHAR": lambda v: type(v) is str and "\x00" not in v,
    "DATE": lambda v: type(v) is date,
    "TIMESTAMP": lambda v: type(v) is datetime and v.tzinfo is None,
    "BOOLEAN": lambda v: type(v) is bool,
}


def noisy_table(columns: Sequence[Column]) -> str:
    """The statement making a table of released values (``Statements.check_scratch_plan``
    plans a finish over it, empty, before the claim)."""
    return f"CREATE TEMP TABLE {NOISY} ({', '.join(f'{n} {t}' for n, t in columns)})"


def finish_values(scratch: Callable[[], Any], columns: Sequence[Column], finish: str,
                  values: Sequence[Sequence[Any]]) -> ResultSet:
    """``finish`` (DuckDB SQL reading the relation ``NOISY``) over the released values of
    ``columns`` (``values[i]`` holds column ``i``: a list, or a NumPy array): computed in
    Python where :class:`PythonFinish` computes it as DuckDB would, on a scratch connection
    (``scratch()`` opens one) otherwise."""
    names = tuple(n for n, _ in columns)
    compiled = _COMPILED.get((finish, names))
    if compiled is None:
        compiled = PythonFinish.of(finish, names) or _IN_SQL
        _COMPILED.put((finish, names), compiled)
    if compiled is not _IN_SQL:
        done = compiled.run(columns, values, scratch)
        if done is not None:
            return done
    return finish_columns(scratch(), columns, finish, values)


def finish_rows(scratch: Callable[[], Any], columns: Sequence[Column], finish: str,
                rows: Sequence[tuple[Any, ...]]) -> ResultSet:
    """:func:`finish_values` over ``rows`` of released values."""
    return finish_values(scratch, columns, finish,
                         [[row[i] for row in rows] for i in range(len(columns))])


def finish_columns(con: Any, columns: Sequence[Column], finish: str,
                   values: Sequence[Sequence[Any]]) -> ResultSet:
    """``finish`` run as DuckDB SQL on the scratch connection ``con`` (closed here) over the
    released values of ``columns`` (``values[i]`` holds column ``i``: a list, or a NumPy
    array).  A failure is reported without DuckDB's detail, which may quote a noisy value."""
    # DuckDB zips the UNNESTs of one SELECT (the lists have the same length) and keeps their
    # order; a column of no rows unnests to no row.
    unnested = ", ".join(f"UNNEST(CAST(? AS {t}[])) AS {n}" for n, t in columns)
    relation = f"{NOISY} AS (SELECT {unnested})"
    head, *tail = finish.split(None, 1)
    if head.upper() == "WITH" and tail:  # a finish with CTEs of its own: the relation first
        statement = f"WITH {relation}, {tail[0]}"
    else:
        statement = f"WITH {relation} {finish}"
    try:
        try:
            cur = con.execute(statement, [_listed(v) for v in values])
        except Exception as err:  # duckdb.Error: it may quote a noisy value: the log only
            log.debug("proxy-noise finish error detail: %s", err)
            raise BackendError(
                "the outputs of this query could not be computed from its noisy values",
                hint="the budget of this query was charged, as it read the data; check the "
                "query's output expressions") from None
        desc = cur.description or []
        return ResultSet(tuple(d[0] for d in desc),
                         tuple(portable_type(str(d[1])) for d in desc), cur.fetchall())
    finally:
        con.close()


def _listed(values: Sequence[Any]) -> list[Any]:
    """A column as a list of Python values (a NumPy array's items as int or float)."""
    return values.tolist() if isinstance(values, np.ndarray) else list(values)


class _InSQL(Exception):
    """A value this module does not compute as DuckDB would (a NaN compared, an integer
    overflow, a division by zero, a type it leaves to DuckDB): the finish runs as SQL."""


Row = tuple[Any, ...]
Compiled = Callable[[Row], Any]
_INT64 = (-2 ** 63, 2 ** 63)


def _number(value: Any) -> int | float | None:
    """An operand of arithmetic or a comparison: an int (a BIGINT) or a float (a DOUBLE)."""
    if value is None or type(value) is int or type(value) is float:
        return value
    raise _InSQL


def _no_nan(value: Any) -> Any:
    if type(value) is float and math.isnan(value):
        raise _InSQL  # DuckDB orders NaN above every number and equal to itself
    return value


def _int64(value: int | float) -> int | float:
    if type(value) is int and not _INT64[0] <= value < _INT64[1]:
        raise _InSQL  # DuckDB reports the overflow of a BIGINT
    return value


def _arithmetic(op: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def apply(a: Any, b: Any) -> Any:
        a, b = _number(a), _number(b)
        if a is None or b is None:
            return None
        if type(a) is int and type(b) is int:
            return _int64(op(a, b))
        return op(float(a), float(b))
    return apply


def _divide(a: Any, b: Any) -> Any:
    a, b = _number(a), _number(b)
    if a is None or b is None:
        return None
    if b == 0:
        raise _InSQL  # IEEE infinities and NaN in DuckDB
    return float(a) / float(b)  # DuckDB's / is a DOUBLE division, of BIGINTs too


def _extreme(pick: Callable[..., Any]) -> Callable[[list[Any]], Any]:
    def apply(values: list[Any]) -> Any:
        present = [_no_nan(_number(v)) for v in values if v is not None]
        return pick(present) if present else None  # NULL arguments are ignored
    return apply


def _compare(op: Callable[[Any, Any], bool]) -> Callable[[Any, Any], Any]:
    def apply(a: Any, b: Any) -> Any:
        a, b = _no_nan(_number(a)), _no_nan(_number(b))
        return None if a is None or b is None else op(a, b)
    return apply


def _nullif(a: Any, b: Any) -> Any:
    a, b = _no_nan(_number(a)), _no_nan(_number(b))
    return None if a is not None and b is not None and a == b else a


def _sqrt(a: Any) -> Any:
    a = _no_nan(_number(a))
    if a is None:
        return None
    if a < 0:
        raise _InSQL  # NaN in DuckDB
    return math.sqrt(a)


def _neg(a: Any) -> Any:
    a = _number(a)
    return None if a is None else _int64(-a)


def _not(a: Any) -> Any:
    return None if a is None else not a


def _and(a: Any, b: Any) -> Any:
    if a is False or b is False:
        return False
    return None if a is None or b is None else True


def _or(a: Any, b: Any) -> Any:
    if a is True or b is True:
        return True
    return None if a is None or b is None else False


_BINARY: dict[type[exp.Expr], Callable[[Any, Any], Any]] = {
    exp.Add: _arithmetic(operator.add), exp.Sub: _arithmetic(operator.sub),
    exp.Mul: _arithmetic(operator.mul), exp.Div: _divide, exp.Nullif: _nullif,
    exp.GT: _compare(operator.gt), exp.GTE: _compare(operator.ge),
    exp.LT: _compare(operator.lt), exp.LTE: _compare(operator.le),
    exp.EQ: _compare(operator.eq), exp.NEQ: _compare(operator.ne),
    exp.And: _and, exp.Or: _or,
}
_UNARY: dict[type[exp.Expr], Callable[[Any], Any]] = {
    exp.Neg: _neg, exp.Not: _not, exp.Sqrt: _sqrt}


class _Unsupported(Exception):
    """A node this module does not compute: the finish always runs as SQL."""


def _compile(node: exp.Expr, position: dict[str, int]) -> Compiled:
    """``node`` as a function of a row of released values (columns by ``position``)."""
    kind = type(node)
    if kind is exp.Paren:
        return _compile(node.this, position)
    if kind is exp.Column:
        if node.table not in ("", NOISY) or node.args.get("db") \
                or not isinstance(node.this, exp.Identifier) or node.name not in position:
            raise _Unsupported
        at = position[node.name]
        return operator.itemgetter(at)
    if kind is exp.Literal and not node.is_string:
        text = node.this
        value = float(text) if any(c in text for c in ".eE") else int(text)
        return lambda row: value
    if kind is exp.Cast and node.to.is_type(exp.DType.DOUBLE):
        inner = _compile(node.this, position)
        return lambda row: None if (v := _number(inner(row))) is None else float(v)
    if kind in _UNARY:
        unary, inner = _UNARY[kind], _compile(node.this, position)
        return lambda row: unary(inner(row))
    if kind in _BINARY:
        binary = _BINARY[kind]
        left, right = _compile(node.this, position), _compile(node.expression, position)
        return lambda row: binary(left(row), right(row))
    if kind in (exp.Greatest, exp.Least):
        extreme = _extreme(max if kind is exp.Greatest else min)
        parts = [_compile(n, position) for n in (node.this, *node.expressions)]
        return lambda row: extreme([part(row) for part in parts])
    raise _Unsupported


def _sorted_by(node: exp.Expr, outputs: list[tuple[str, Compiled, int | None]],
               position: dict[str, int]) -> Compiled:
    """An ORDER BY key: a number is the position of an output (from 1), a name an output's
    alias or a column (a name that could be either is left to DuckDB), as in SQL."""
    if isinstance(node, exp.Literal) and not node.is_string:
        if not node.this.isdigit() or not 1 <= int(node.this) <= len(outputs):
            raise _Unsupported
        return outputs[int(node.this) - 1][1]
    if isinstance(node, exp.Column) and not node.table:
        name = node.name.lower()
        named = [compute for alias, compute, _ in outputs if alias.lower() == name]
        if named:
            if len(named) > 1 or any(n.lower() == name for n in position):
                raise _Unsupported
            return named[0]
    return _compile(node, position)


def _constant(node: exp.Expr | None) -> int | None:
    """A LIMIT's or OFFSET's count."""
    if node is None:
        return None
    value = node.expression if isinstance(node, exp.Limit | exp.Offset) else node
    if isinstance(value, exp.Literal) and not value.is_string and value.this.isdigit():
        return int(value.this)
    raise _Unsupported


@dataclass(frozen=True)
class PythonFinish:
    """A finish computed in Python: outputs of arithmetic (+, -, *, /, unary minus, GREATEST,
    LEAST, NULLIF, SQRT, casts to DOUBLE) over the released values, a WHERE of comparisons,
    AND, OR and NOT (the key-release threshold, HAVING), ORDER BY and LIMIT / OFFSET, with
    DuckDB's semantics: NULL in, NULL out; GREATEST and LEAST ignore NULL arguments; / divides
    doubles.  Whatever it would compute otherwise than DuckDB (a NaN compared or sorted, a
    BIGINT overflow, a division by zero, a NULL sort key, a value of another type) sends the
    finish to SQL instead (:meth:`run` returns None).

    ``outputs``: per output, its name, how it is computed, and the column it merely picks (or
    None); ``types`` maps the columns' DuckDB types to the outputs' (portable) types, which
    DuckDB says once per set of column types (``DESCRIBE``)."""

    sql: str
    outputs: tuple[tuple[str, Compiled, int | None], ...]
    gates: tuple[tuple[int, float, Compiled], ...]  # the WHERE's "column > number" parts
    where: Compiled | None  # the rest of the WHERE
    order: tuple[tuple[Compiled, bool], ...]  # (key, descending)
    limit: int | None
    offset: int | None
    tree: exp.Select = dataclasses.field(compare=False)  # parsed from ``sql``, read only
    # Per tuple of the columns' DuckDB types: the outputs' portable types, or None when DuckDB
    # computes in DECIMAL what Python would compute otherwise (see :func:`_kind`).
    types: dict[tuple[str, ...], tuple[str, ...] | None] = dataclasses.field(
        default_factory=dict, compare=False)

    @classmethod
    def of(cls, sql: str, names: Sequence[str]) -> PythonFinish | None:
        """The finish ``sql`` (DuckDB) over a relation of columns ``names``, compiled; None
        when it has a part this class does not compute (DISTINCT, GROUP BY, a function, a
        subquery ...).  Compiled from the text, parsed as DuckDB parses it, so that Python
        computes what the text says (a tree built by hand may say otherwise: a division by
        an unparenthesised sum)."""
        try:
            finish = sqlglot.parse_one(sql, read="duckdb")
        except (sqlglot.errors.ParseError, RecursionError):
            return None
        if not isinstance(finish, exp.Select) or set(
                k for k, v in finish.args.items() if v) - {
                    "expressions", "from_", "where", "order", "limit", "offset"}:
            return None
        source = finish.args["from_"].this if finish.args.get("from_") else None
        if not isinstance(source, exp.Table) or source.name != NOISY or source.args.get("db") \
                or source.args.get("alias"):
            return None
        position = {n: i for i, n in enumerate(names)}
        try:
            outputs = []
            for node in finish.expressions:
                value = node.this if isinstance(node, exp.Alias) else node
                picked = position.get(value.name) if isinstance(value, exp.Column) else None
                outputs.append((node.output_name, _compile(value, position), picked))
            gates, rest = _conditions(finish.args.get("where"), position)
            order = finish.args.get("order")
            return cls(
                sql, tuple(outputs), gates,
                _compile(rest, position) if rest is not None else None,
                tuple((_sorted_by(o.this, outputs, position), bool(o.args.get("desc")))
                      for o in (order.expressions if order is not None else ())),
                _constant(finish.args.get("limit")), _constant(finish.args.get("offset")),
                finish)
        except (_Unsupported, RecursionError):  # nested deeper than Python recurses
            return None

    def run(self, columns: Sequence[Column], values: Sequence[Sequence[Any]],
            scratch: Callable[[], Any]) -> ResultSet | None:
        """The finish over the released values of ``columns`` (``values[i]`` holds column
        ``i``: a list, or a NumPy array); None when DuckDB must compute it.  ``scratch`` opens
        a scratch connection (to ask DuckDB the outputs' types the first time these column
        types are seen)."""
        kinds = tuple(t for _, t in columns)
        if kinds not in self.types:
            self.types[kinds] = self._types(columns, scratch)
        types = self.types[kinds]
        if types is None:
            return None
        checks = [_KEPT_AS_IS.get(t) for t in kinds]
        kept: np.ndarray | None = None  # the rows the key-release threshold keeps
        conditions = [self.where] if self.where is not None else []
        for at, tau, condition in self.gates:  # thousands of groups: on arrays, at once
            counts = values[at]
            if kinds[at] == "BIGINT" and isinstance(counts, np.ndarray) \
                    and counts.dtype == np.int64:  # integers: no NULL, no NaN
                passed = counts > tau
                kept = passed if kept is None else kept & passed
            else:
                conditions.append(condition)
        if kept is not None:
            at = np.flatnonzero(kept)
            values = [v[at] if isinstance(v, np.ndarray) else [v[i] for i in at]
                      for v in values]
        if values and len(values[0]) > PYTHON_ROWS:
            return None
        rows: list[Row] = list(zip(*[_listed(v) for v in values], strict=True))
        try:
            for condition in conditions:
                rows = [row for row in rows if condition(row) is True]
            for key, descending in reversed(self.order):  # stable: the last key first
                rows = sorted(rows, key=lambda row, key=key: _sort_key(key(row)),
                              reverse=descending)
            if self.offset:
                rows = rows[self.offset:]
            if self.limit is not None:
                rows = rows[:self.limit]
            out = []
            for row in rows:
                values = []
                for (_, compute, picked), kind in zip(self.outputs, types, strict=True):
                    value = compute(row)
                    if picked is not None:
                        check = checks[picked]
                        if value is not None and (check is None or not check(value)):
                            raise _InSQL  # DuckDB's cast would change it
                    elif value is not None:
                        value = _typed(value, kind)
                    values.append(value)
                out.append(tuple(values))
        except (_InSQL, TypeError, ArithmeticError, ValueError, RecursionError):  # sort keys
            # Python cannot compare, a literal too large for a double, an expression nested
            # deeper than Python recurses (limits.max_expression_depth is the owner's): DuckDB
            # decides
            return None
        return ResultSet(tuple(name for name, _, _ in self.outputs), types, out)

    def _types(self, columns: Sequence[Column], scratch: Callable[[], Any]
               ) -> tuple[str, ...] | None:
        """The outputs' portable types over ``columns``, as DuckDB says; None where Python
        would not compute as DuckDB does (:func:`_kind`) or DuckDB cannot plan the finish."""
        kinds = dict(columns)
        try:
            for node in self.tree.iter_expressions():
                if not isinstance(node, exp.From | exp.Limit | exp.Offset):
                    _kind(node, kinds)
        except (_Unsupported, RecursionError):
            return None
        try:
            return _described(scratch(), columns, self.sql)
        except Exception:  # duckdb.Error: the SQL finish reports it, without its detail
            return None


def _conditions(where: exp.Where | None, position: dict[str, int]
                ) -> tuple[tuple[tuple[int, float, Compiled], ...], exp.Expr | None]:
    """The WHERE's conjuncts ``column > number`` (a noisy count against the key-release
    threshold: on an array when the column holds integers, row by row otherwise), and the
    rest of it (None: nothing else)."""
    if where is None:
        return (), None
    gates, rest = [], []
    for part in where.this.flatten() if isinstance(where.this, exp.And) else [where.this]:
        if isinstance(part, exp.GT) and isinstance(part.this, exp.Column) \
                and part.this.name in position and not part.this.table \
                and isinstance(part.expression, exp.Literal) and not part.expression.is_string:
            gates.append((position[part.this.name], float(part.expression.this),
                          _compile(part, position)))
        else:
            rest.append(part)
    return tuple(gates), exp.and_(*rest) if rest else None


def _kind(node: exp.Expr, kinds: dict[str, str]) -> str:
    """What DuckDB computes ``node`` as, over columns of DuckDB types ``kinds`` (by name):
    "int" (BIGINT), "decimal" (a literal such as 100.0, and BIGINT arithmetic with one),
    "double", "bool" or "other".  Python computes a decimal as a double, which is DuckDB's
    value but for the last bits, except where DuckDB multiplies or adds two decimals, whose
    exact product may overflow its DECIMAL (100.0 * 7021.5702293802915 fails there): that is
    left to DuckDB (``_Unsupported``)."""
    if isinstance(node, exp.Paren | exp.Neg | exp.Nullif):
        inner = _kind(node.this, kinds)
        if isinstance(node, exp.Nullif):
            _kind(node.expression, kinds)
        return inner
    if isinstance(node, exp.Column):
        return {"BIGINT": "int", "DOUBLE": "double"}.get(kinds.get(node.name, ""), "other")
    if isinstance(node, exp.Literal):
        text = node.this
        return "double" if "e" in text.lower() else "decimal" if "." in text else "int"
    if isinstance(node, exp.Cast | exp.Sqrt | exp.Div):
        for child in (node.this, node.args.get("expression")):
            if child is not None:
                _kind(child, kinds)
        return "double"
    if isinstance(node, exp.Add | exp.Sub | exp.Mul):
        both = (_kind(node.this, kinds), _kind(node.expression, kinds))
        if "double" in both:
            return "double"
        if both == ("decimal", "decimal"):
            raise _Unsupported
        return "decimal" if "decimal" in both else "int" if both == ("int", "int") else "other"
    if isinstance(node, exp.Greatest | exp.Least):
        found = {_kind(n, kinds) for n in (node.this, *node.expressions)}
        return next((k for k in ("double", "decimal", "other") if k in found), "int")
    for child in node.iter_expressions():  # comparisons, AND, OR, NOT
        _kind(child, kinds)
    return "bool"


def _sort_key(value: Any) -> Any:
    if value is None:
        raise _InSQL  # where NULLs go depends on the ordering's NULLS FIRST / LAST
    return _no_nan(value)


def _typed(value: Any, kind: str) -> Any:
    """A computed output as DuckDB's type for it (portable ``kind``) holds it."""
    if kind == "float" and type(value) in (int, float):
        return float(value)
    if kind == "integer" and type(value) is int:
        return value
    raise _InSQL


def _described(con: Any, columns: Sequence[Column], finish: str) -> tuple[str, ...]:
    """The portable types of ``finish``'s outputs over a relation of ``columns``."""
    try:
        con.execute(noisy_table(columns))
        cur = con.execute(finish)  # over the empty table: its types, no rows
        return tuple(portable_type(str(d[1])) for d in cur.description or [])
    finally:
        con.close()


#: Compiled finishes by (text, column names); ``_IN_SQL`` for a text Python does not compute.
_COMPILED: LRU[tuple[str, tuple[str, ...]], PythonFinish | object] = LRU(1024)
_IN_SQL = object()
