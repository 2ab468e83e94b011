"""Reading literals out of the tree.

Whether a literal converts to a type is never judged here (by a Python parser): the backend that
will run the query decides, once, in a statement that reads no table (``analyses.totality``).
"""

from __future__ import annotations

from sqlglot import exp


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
