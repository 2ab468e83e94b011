"""Literal values checked before anything runs, so a bad one is refused instead of charged.

A literal the database cannot convert (``CAST('x' AS INT)``, ``pickup_time > 'notadate'``) fails
inside the database; inside a ``CASE`` branch it fails only when some row reaches that branch,
which would reveal that row.  So every literal that meets a typed value is parsed here first, by
rules at least as strict as the databases' own.
"""

from __future__ import annotations

import math
import re
from datetime import date, datetime

from sqlglot import exp

_INT = re.compile(r"^\s*[+-]?\d{1,18}\s*$")
_BOOL = {"true", "false", "t", "f", "yes", "no", "on", "off", "1", "0"}


def literal_value(node: exp.Expr) -> tuple[str, str] | None:
    """("string" | "number", text) for a literal, a negated number, or None.

    >>> literal_value(exp.Neg(this=exp.Literal.number(3)))
    ('number', '-3')
    """
    if isinstance(node, exp.Paren):
        return literal_value(node.this)
    if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) and not node.this.is_string:
        return ("number", f"-{node.this.name}")
    if isinstance(node, exp.Literal):
        return ("string" if node.is_string else "number", node.name)
    return None


def fits(text: str, kind: str) -> bool:
    """Whether ``text`` converts to the policy type ``kind`` without error.

    >>> fits("2026-02-30", "date"), fits("2026-03-01 10:00", "timestamp"), fits("1e3", "int")
    (False, True, False)
    """
    text = text.strip()
    if kind == "text":
        return True
    if kind == "int":
        return bool(_INT.match(text))
    if kind == "float":
        try:
            return math.isfinite(float(text))
        except ValueError:
            return False
    if kind == "bool":
        return text.lower() in _BOOL
    if kind == "date":
        try:
            date.fromisoformat(text)
        except ValueError:
            return False
        return True
    if kind == "timestamp":
        try:
            value = datetime.fromisoformat(text)
        except ValueError:
            return False
        return value.tzinfo is None and 1 <= value.year <= 9999
    return False


_INT_BITS = {exp.DType.TINYINT: 8, exp.DType.SMALLINT: 16, exp.DType.INT: 32,
             exp.DType.BIGINT: 64}


def literal_casts(text: str, to: exp.DataType) -> bool:
    """Whether ``CAST('text' AS to)`` succeeds; unknown targets count as failing.

    >>> smallint, integer = exp.DataType.build("smallint"), exp.DataType.build("int")
    >>> literal_casts("300", smallint), literal_casts("70000", smallint)
    (True, False)
    >>> literal_casts("x", integer)
    False
    """
    for kind, bits in _INT_BITS.items():
        if to.is_type(kind):
            return fits(text, "int") and -(2 ** (bits - 1)) <= int(text) < 2 ** (bits - 1)
    kind = cast_kind(to)
    return kind is not None and fits(text, kind)


def cast_kind(to: exp.DataType) -> str | None:
    """The policy type a cast target corresponds to, or None when literals cannot be checked."""
    if to.is_type(*exp.DataType.TEXT_TYPES):
        return "text"
    if to.is_type(exp.DType.DOUBLE, exp.DType.FLOAT):
        return "float"
    if to.is_type(exp.DType.BOOLEAN):
        return "bool"
    if to.is_type(exp.DType.DATE):
        return "date"
    if to.is_type(exp.DType.TIMESTAMP, exp.DType.TIMESTAMPNTZ, exp.DType.DATETIME):
        return "timestamp"
    return None
