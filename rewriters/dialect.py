"""Dialect output: fix-ups that sqlglot's generator does not make for us.

Postgres has ``round(numeric, integer)`` but no ``round(double precision, integer)``; DuckDB has
both.  For Postgres, ``ROUND(x, n)`` becomes ``ROUND(CAST(x AS NUMERIC), n)``.
"""

from __future__ import annotations

from sqlglot import exp


def dialect(node: exp.Expr, name: str, copy: bool = True) -> exp.Expr:
    """Adapt ``node`` to the backend ``name`` ("duckdb" or "postgres"); returns a copy.

    >>> from sqlglot import parse_one
    >>> dialect(parse_one("SELECT ROUND(AVG(x), 2)"), "postgres").sql("postgres")
    'SELECT ROUND(CAST(AVG(x) AS DECIMAL), 2)'
    """
    if name != "postgres":
        return node.copy() if copy else node

    def visit(sub: exp.Expr) -> exp.Expr:
        if isinstance(sub, exp.Round) and sub.args.get("decimals") is not None:
            sub.set("this", exp.cast(sub.this, exp.DType.DECIMAL))
        return sub

    return (node.copy() if copy else node).transform(visit, copy=False)
