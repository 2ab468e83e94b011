"""Dialect output: fix-ups that sqlglot's generator does not make for us.

Postgres has ``round(numeric, integer)`` but no ``round(double precision, integer)``; DuckDB has
both.  For Postgres, ``ROUND(x, n)`` becomes ``ROUND(CAST(x AS NUMERIC), n)``.

Spark evaluates ``rand()`` per partition, and evaluates a partition again when a task is retried
(or a plan reads a subquery twice): a row could draw another number the second time, and a
person keep other rows.  For Spark every ``RANDOM()`` the rewriters use to rank rows becomes a
keyed hash of the row, ``XXHASH64(:chorus_key, <row>.*)``: the same row gets the same number
however often and wherever it is evaluated.  ``:chorus_key`` is a named parameter the Spark
backend binds to a fresh 63-bit secret from :mod:`secrets` for every statement
(``chorus_py.backends.spark``), so analysts cannot predict the ranking, and it is never part of
the SQL text.  (The privacy of contribution bounding does not rest on that randomness: a unit's
kept rows depend on its own rows only, so neighbours differ in at most k rows whichever are kept;
the rank's randomness keeps the kept rows an unbiased choice.)

Spark also refuses a ``ROW_NUMBER()`` window without ORDER BY.  The selection histograms mark
one row per unit with ``ROW_NUMBER() OVER (PARTITION BY unit) = 1`` (any row will do): for Spark
the window is ordered by its own partition keys, a tie, so it still numbers the rows in any
order.  Postgres and DuckDB get no ORDER BY: there the mark's window then shares the unit
counts' window (one WindowAgg instead of two, a fifth less time on Postgres).
"""

from __future__ import annotations

from sqlglot import exp

from analyses.trees import copy_tree, dialect_named

#: The named parameter of the per-statement key the Spark backend binds.
SPARK_KEY = "chorus_key"


def dialect(node: exp.Expr, name: str, copy: bool = True) -> exp.Expr:
    """Adapt ``node`` to the backend ``name`` ("duckdb", "postgres" or "spark"); returns a copy.

    >>> from sqlglot import parse_one
    >>> dialect(parse_one("SELECT ROUND(AVG(x), 2)"), "postgres").sql("postgres")
    'SELECT ROUND(CAST(AVG(x) AS DECIMAL), 2)'
    >>> dialect(parse_one("SELECT t.*, RANDOM() AS r FROM trips AS t"), "spark").sql("spark")
    'SELECT t.*, XXHASH64(:chorus_key, t.*) AS r FROM trips AS t'
    >>> dialect(parse_one("SELECT ROW_NUMBER() OVER (PARTITION BY u) FROM t"), "spark").sql("spark")
    'SELECT ROW_NUMBER() OVER (PARTITION BY u ORDER BY u) FROM t'
    """
    if name == "spark":
        return (copy_tree(node) if copy else node).transform(_for_spark, copy=False)
    if name != "postgres":
        return copy_tree(node) if copy else node

    def visit(sub: exp.Expr) -> exp.Expr:
        if isinstance(sub, exp.Round) and sub.args.get("decimals") is not None:
            sub.set("this", exp.cast(sub.this, exp.DType.DECIMAL))
        return sub

    return (copy_tree(node) if copy else node).transform(visit, copy=False)


def rendered(node: exp.Expr, name: str, copy: bool = False) -> str:
    """The text of ``node`` adapted to the backend ``name`` (:func:`dialect`), in its SQL.
    ``copy``: leave ``node`` as it was; by default the adaptation and the generator may change
    it, for a tree built to be sent (no copy made).

    >>> from sqlglot import parse_one
    >>> rendered(parse_one("SELECT ROUND(AVG(x), 2) FROM t"), "postgres")
    'SELECT ROUND(CAST(AVG(x) AS DECIMAL), 2) FROM t'
    """
    return dialect(node, name, copy=copy).sql(dialect_named(name), copy=False)


def _for_spark(sub: exp.Expr) -> exp.Expr:
    if isinstance(sub, exp.Window) and isinstance(sub.this, exp.RowNumber) \
            and not sub.args.get("order") and sub.args.get("partition_by"):
        sub.set("order", exp.Order(expressions=[
            exp.Ordered(this=key.copy(), nulls_first=True)  # Spark's own default order
            for key in sub.args["partition_by"]]))
        return sub
    return _keyed_hash(sub)


def _keyed_hash(sub: exp.Expr) -> exp.Expr:
    """``RANDOM()`` in a projection next to ``x.*`` (or ``*``): ``XXHASH64(:chorus_key, x.*)``.

    The row's identity is all of its columns: two rows with the same values are interchangeable,
    so whichever of them a unit keeps, the kept rows are the same.  A ``RANDOM()`` anywhere else
    has no row to hash (the noise of ``noise = "sql"``, which the policy refuses on Spark):
    ValueError, never a ``rand()`` sent to Spark."""
    if not isinstance(sub, exp.Rand):
        return sub
    select = sub.find_ancestor(exp.Select)
    stars = [p for p in (select.expressions if select is not None else [])
             if isinstance(p, exp.Star) or (isinstance(p, exp.Column)
                                            and isinstance(p.this, exp.Star))]
    if not stars:
        raise ValueError("RANDOM() outside a projection of whole rows has no Spark rendering "
                         "(Spark draws rand() again on a retried task)")
    return exp.func("XXHASH64", exp.Placeholder(this=SPARK_KEY), stars[0].copy())
