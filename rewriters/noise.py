"""Noise injection: each exact measurement column becomes ``value + noise`` computed in SQL.

The mechanism renders its own SQL (``mechanisms``); this pass only decides where it goes.  The
CTE holding the noisy values is MATERIALIZED so every noisy value is drawn exactly once: an
optimiser that inlined it could evaluate ``random()`` again for HAVING or ORDER BY and release
two different draws of the same value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlglot import exp

from analyses.trees import copy_tree
from mechanisms import Mechanism


def noise(exact: exp.Select, keys: Sequence[str], mechanisms: Mapping[str, Mechanism],
          dialect: str, copy: bool = True) -> exp.Select:
    """Return ``SELECT keys, m0 + noise AS m0, ... FROM (exact) AS chorus_exact``
    (``copy=False``: ``exact`` itself becomes the subquery)."""
    exact = copy_tree(exact) if copy else exact
    columns: list[exp.Expr] = [exp.column(k, table="chorus_exact") for k in keys]
    for mid, mechanism in mechanisms.items():
        value = exp.Coalesce(this=exp.column(mid, table="chorus_exact"),
                             expressions=[exp.Literal.number(0)])
        # render_sql builds a fresh tree: alias it as it is.
        columns.append(exp.alias_(mechanism.render_sql(value, dialect), mid, copy=False))
    return exp.select(*columns).from_(exact.subquery("chorus_exact", copy=False), copy=False)
