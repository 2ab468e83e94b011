"""Type checking of row-level expressions, before anything runs.

A type error the database finds only while evaluating rows (text compared with a number inside a
CASE branch, a non-boolean WHERE) would fail exactly when some row reaches it: one exact bit about
that row.  The databases also phrase plan-time type errors as their own.  So the analyser checks
types itself, on the tree annotated by sqlglot's ``annotate_types``, and refuses anything it cannot
type: types fall into five families and every operator must see the families it expects.
"""

from __future__ import annotations

from typing import Literal

from sqlglot import exp

from analyses.literals import literal_value
from analyses.trees import sql_text
from chorus_py.errors import QueryRefused

Family = Literal["number", "text", "time", "interval", "bool", "null", "unknown"]

_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)
_ARITHMETIC = (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod)
_NUMERIC_FUNCTIONS = (exp.Abs, exp.Round, exp.Floor, exp.Ceil, exp.Sign)
_TEXT_FUNCTIONS = (exp.Length, exp.Lower, exp.Upper, exp.Trim)
_SAME_FAMILY = (exp.Least, exp.Greatest, exp.Coalesce, exp.Nullif)


def family(node: exp.Expr) -> Family:
    """The family of an annotated expression's type."""
    if isinstance(node, exp.Null):
        return "null"
    dtype = node.type
    if dtype is None:
        return "unknown"
    if dtype.is_type(*exp.DataType.INTEGER_TYPES, *exp.DataType.REAL_TYPES):
        return "number"
    if dtype.is_type(*exp.DataType.TEXT_TYPES):
        return "text"
    if dtype.is_type(*exp.DataType.TEMPORAL_TYPES):
        return "time"
    if dtype.is_type(exp.DType.BOOLEAN):
        return "bool"
    if dtype.is_type(exp.DType.INTERVAL):
        return "interval"
    if dtype.is_type(exp.DType.NULL):
        return "null"
    return "unknown"


def is_integer(node: exp.Expr) -> bool:
    """True when the annotated type is an integer type (used to avoid integer overflow)."""
    return node.type is not None and node.type.is_type(*exp.DataType.INTEGER_TYPES)


def check_row_types(node: exp.Expr, clause: str, boolean: bool = False) -> None:
    """Refuse ``node`` unless every operator in it gets operands of the families it expects.

    ``boolean`` says the whole expression is a condition (WHERE).
    """
    if boolean:
        _expect(node, ("bool",), clause, "a condition")
    for sub in node.walk():
        if isinstance(sub, exp.And | exp.Or):
            _expect(sub.this, ("bool",), clause, "a condition")
            _expect(sub.expression, ("bool",), clause, "a condition")
        elif isinstance(sub, exp.Not):
            _expect(sub.this, ("bool",), clause, "a condition")
        elif isinstance(sub, exp.Case):
            for branch in sub.args.get("ifs") or []:
                _expect(branch.this, ("bool",), clause, "a CASE condition")
            results = [b.args["true"] for b in sub.args.get("ifs") or []]
            if sub.args.get("default") is not None:
                results.append(sub.args["default"])
            _same_family(results, clause, "CASE results")
        elif isinstance(sub, exp.If):
            _expect(sub.this, ("bool",), clause, "an IF condition")
        elif isinstance(sub, _COMPARISONS):
            _comparable(sub.this, sub.expression, clause)
        elif isinstance(sub, exp.In):
            for item in sub.expressions:
                _comparable(sub.this, item, clause)
        elif isinstance(sub, exp.Between):
            _comparable(sub.this, sub.args["low"], clause)
            _comparable(sub.this, sub.args["high"], clause)
        elif isinstance(sub, exp.Add | exp.Sub) and _date_arithmetic(sub):
            continue
        elif isinstance(sub, _ARITHMETIC):
            _expect(sub.this, ("number",), clause, f"an operand of {sub.key.upper()}")
            _expect(sub.expression, ("number",), clause, f"an operand of {sub.key.upper()}")
        elif isinstance(sub, exp.Neg):
            _expect(sub.this, ("number",), clause, "a negated value")
        elif isinstance(sub, _NUMERIC_FUNCTIONS):
            _expect(sub.this, ("number",), clause, f"the argument of {sub.sql_name()}")
        elif isinstance(sub, _TEXT_FUNCTIONS):
            _expect(sub.this, ("text",), clause, f"the argument of {sub.sql_name()}")
        elif isinstance(sub, exp.Like | exp.ILike):
            _expect(sub.this, ("text",), clause, "the LIKE subject")
        elif isinstance(sub, exp.TimestampTrunc | exp.DateTrunc):
            _expect(sub.this, ("time",), clause, "the argument of DATE_TRUNC")
        elif isinstance(sub, exp.Extract):
            _expect(sub.expression, ("time",), clause, "the argument of EXTRACT")
        elif isinstance(sub, _SAME_FAMILY):
            _same_family([sub.this, *sub.expressions, *(
                [sub.expression] if isinstance(sub, exp.Nullif) else [])], clause,
                f"the arguments of {sub.sql_name()}")


def _date_arithmetic(node: exp.Add | exp.Sub) -> bool:
    """time +/- interval, interval + time, or time - time (the database types these)."""
    pair = (family(node.this), family(node.expression))
    if pair in (("time", "interval"), ("interval", "time") if isinstance(node, exp.Add) else ()):
        return True
    return isinstance(node, exp.Sub) and pair == ("time", "time")


def _expect(node: exp.Expr, families: tuple[Family, ...], clause: str, role: str) -> None:
    found = family(node)
    if found in families or found == "null":
        return
    raise QueryRefused(
        f"{_short(node)} in {clause} is {_describe(found)}, but {role} must be "
        + " or ".join(_describe(f) for f in families),
        hint="fix the types in the query (the database would refuse it too)",
    )


def _comparable(left: exp.Expr, right: exp.Expr, clause: str) -> None:
    a, b = family(left), family(right)
    if "null" in (a, b) or (a == b and a != "unknown"):
        return
    # A string literal next to a date or timestamp is read as one (validated by the analyser).
    for x, y, lit in ((a, b, right), (b, a, left)):
        if x == "time" and y == "text" and (literal_value(lit) or ("",))[0] == "string":
            return
    raise QueryRefused(
        f"cannot compare {_short(left)} ({_describe(a)}) with {_short(right)} ({_describe(b)}) "
        f"in {clause}",
        hint="compare values of the same type; quote text, leave numbers unquoted",
    )


def _same_family(nodes: list[exp.Expr], clause: str, role: str) -> None:
    families = {family(n) for n in nodes} - {"null"}
    if len(families) > 1 or "unknown" in families:
        raise QueryRefused(
            f"{role} in {clause} mix types ({', '.join(sorted(_describe(f) for f in families))})",
            hint="make every branch or argument the same type",
        )


def _describe(found: str) -> str:
    return {"number": "a number", "text": "text", "time": "a date/time", "bool": "a boolean",
            "interval": "an interval", "null": "NULL",
            "unknown": "of a type the proxy cannot check"}[found]


def _short(node: exp.Expr) -> str:
    text = sql_text(node)
    return text if len(text) <= 60 else text[:57] + "..."
