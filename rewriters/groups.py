"""Group keys: public values are completed, other keys are gated by a noisy count.

- When every GROUP BY column declares ``public_values``, the answer has exactly one row per
  combination of declared values (missing groups come back as noisy zeros, undeclared values
  are dropped), so the set of released keys depends on the policy only.
- Otherwise a key is released only if its noisy count exceeds tau (``mechanisms.thresholding``).
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlglot import exp

GRID = "chorus_keys"


def public_grid(keys: Sequence[tuple[str, Sequence[object]]]) -> exp.Select:
    """The cross product of the declared values, one VALUES list per key.

    >>> public_grid([("k0", ["SF", "LA"])]).sql("duckdb")
    "SELECT * FROM (VALUES ('SF'), ('LA')) AS g0(k0)"
    """
    select = exp.select("*")
    for i, (kid, values) in enumerate(keys):
        rows = [exp.Tuple(expressions=[_literal(v)]) for v in values]
        table = exp.Values(expressions=rows, alias=exp.TableAlias(
            this=exp.to_identifier(f"g{i}"), columns=[exp.to_identifier(kid)]))
        select = select.from_(table) if i == 0 else select.join(table, join_type="cross")
    return select


def complete_groups(exact: exp.Select, key_ids: Sequence[str], measure_ids: Sequence[str],
                    grid: exp.Select) -> exp.Select:
    """LEFT JOIN the exact per-group measurements onto the grid of public keys."""
    on = exp.and_(*[exp.column(k, table="e").eq(exp.column(k, table=GRID)) for k in key_ids])
    columns = [exp.column(k, table=GRID) for k in key_ids] + [
        exp.alias_(exp.Coalesce(this=exp.column(m, table="e"),
                                expressions=[exp.Literal.number(0)]), m)
        for m in measure_ids
    ]
    return (
        exp.select(*columns)
        .from_(grid.subquery(GRID))
        .join(exact.subquery("e"), on=on, join_type="left")
    )


def public_filter(key: exp.Expr, values: Sequence[object]) -> exp.Expr:
    """``key IN (values)``: keep only declared values of a public key in a thresholded query."""
    return exp.In(this=key.copy(), expressions=[_literal(v) for v in values])


def _literal(value: object) -> exp.Expr:
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, int | float):
        return exp.Literal.number(value) if value >= 0 else exp.Neg(
            this=exp.Literal.number(-value))
    return exp.Literal.string(str(value))
