"""Group keys: public values are completed, other keys are gated by a noisy count.

- When every GROUP BY key is public (a column that declares ``public_values``, a calendar
  bucket of the block column, a column of a joined public table: ``analyses.keys``), the answer
  has exactly one row per combination of public keys (missing groups come back as noisy zeros,
  other values are dropped), so the set of released keys depends on the policy, the clock and
  public tables only.
- Otherwise a key is released only if its noisy count exceeds tau (``mechanisms.thresholding``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import date, datetime

from sqlglot import exp

from analyses.trees import join_to, select_star

GRID = "chorus_keys"


def public_grid(keys: Sequence[tuple[str, Sequence[object]]],
                tables: Sequence[exp.Select] = ()) -> exp.Select | None:
    """The cross product of the declared values, one VALUES list per key, and of ``tables``
    (SELECTs over public tables whose outputs are named by key id: ``rewriters.keys``); None
    when a key has no value left (the query's WHERE kept none of the declared ones): there is
    no group.

    >>> public_grid([("k0", ["SF", "LA"])]).sql("duckdb")
    "SELECT * FROM (VALUES ('SF'), ('LA')) AS g0(k0)"
    >>> public_grid([("k0", ["SF"]), ("k1", [])]) is None
    True
    """
    if any(not values for _, values in keys):
        return None  # an empty VALUES list is not SQL, and the product would be empty anyway
    parts: list[exp.Expr] = []
    for i, (kid, values) in enumerate(keys):
        rows = [exp.Tuple(expressions=[_literal(v)]) for v in values]
        parts.append(exp.Values(expressions=rows, alias=exp.TableAlias(
            this=exp.to_identifier(f"g{i}"), columns=[exp.to_identifier(kid)])))
    parts += [t.subquery(f"g{len(keys) + i}") for i, t in enumerate(tables)]
    select = select_star(parts[0])  # fresh parts: placed without copies
    for part in parts[1:]:
        join_to(select, part, kind="CROSS")
    return select


def complete_groups(exact: exp.Select, key_ids: Sequence[str], measure_ids: Sequence[str],
                    grid: exp.Select | None, null_safe: Collection[str] = ()) -> exp.Select:
    """LEFT JOIN the exact per-group measurements onto the grid of public keys; the keys in
    ``null_safe`` (read from public tables, which may hold NULLs) match with IS NOT DISTINCT
    FROM, so a NULL key's group gets its measurements.

    With no grid (``public_grid`` found a key with no public value left) the answer has no
    row, whatever the data: the same columns, of the exact query's types, under ``WHERE
    FALSE``, so the statement stays valid SQL with the shape the noise and finish expect.
    """
    if grid is None:
        columns = [exp.column(k, table="e") for k in key_ids] + [
            exp.alias_(exp.Coalesce(this=exp.column(m, table="e"),
                                    expressions=[exp.Literal.number(0)]), m, copy=False)
            for m in measure_ids
        ]
        return exp.select(*columns).from_(exact.subquery("e", copy=False), copy=False).where(
            exp.false(), copy=False)
    on = exp.and_(*[exp.NullSafeEQ(this=exp.column(k, table="e"),
                                   expression=exp.column(k, table=GRID)) if k in null_safe
                    else exp.column(k, table="e").eq(exp.column(k, table=GRID))
                    for k in key_ids])
    columns = [exp.column(k, table=GRID) for k in key_ids] + [
        exp.alias_(exp.Coalesce(this=exp.column(m, table="e"),
                                expressions=[exp.Literal.number(0)]), m, copy=False)
        for m in measure_ids
    ]
    # ``exact`` and ``grid`` are the caller's fresh trees (rewriters.pipeline): placed as
    # they are, not copied (the measurements are most of the statement).
    select = exp.Select(expressions=columns, from_=exp.From(this=grid.subquery(GRID, copy=False)))
    return join_to(select, exact.subquery("e", copy=False), side="LEFT", on=on)


def public_filter(key: exp.Expr, values: Sequence[object]) -> exp.Expr:
    """``key IN (values)``: keep only declared values of a public key in a thresholded query;
    ``FALSE`` when none is left (``IN ()`` is not SQL).

    >>> public_filter(exp.column("city"), []).sql()
    'FALSE'
    """
    if not values:
        return exp.false()
    return exp.In(this=key.copy(), expressions=[_literal(v) for v in values])


def _literal(value: object) -> exp.Expr:
    if isinstance(value, datetime):  # calendar buckets (analyses.keys): before date
        return exp.cast(exp.Literal.string(value.strftime("%Y-%m-%d %H:%M:%S")),
                        exp.DType.TIMESTAMP)
    if isinstance(value, date):
        return exp.cast(exp.Literal.string(value.isoformat()), exp.DType.DATE)
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, int | float):
        return exp.Literal.number(value) if value >= 0 else exp.Neg(
            this=exp.Literal.number(-value))
    return exp.Literal.string(str(value))
