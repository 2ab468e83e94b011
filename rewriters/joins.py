"""The measure query of a join: every table occurrence replaced by its bounded, block-restricted
rows, then the analyst's joins and filter, then the exact measurements per group.

Shape::

    SELECT <key> AS k0, COUNT(*) AS m0, SUM(ROUND((LEAST(GREATEST(x, l), u) - c) / g)) AS m1
    FROM (<at most c random rows per unit> of
          SELECT o.* FROM orders AS o WHERE <o's own filters> AND <o's claimed blocks>) AS o
    JOIN (SELECT r.* FROM recommendations AS r WHERE ...) AS r ON o.customer_id = r.customer_id
    WHERE <analyst filter>
    GROUP BY <key>

A filter that reads one table only is also applied inside that table's subquery, before the
contribution bounding (as in a one-table query, the cap is spent on rows that pass the filter),
and so that each table reads only the blocks it paid for.  Public tables are read as they are.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlglot import exp

from analyses.query import AggregateQuery
from rewriters.blocks import BlockRestriction, blocks
from rewriters.contribution import contribution
from rewriters.safety import safety


def _conjuncts(node: exp.Expr | None) -> list[exp.Expr]:
    if node is None:
        return []
    node = node.unnest()
    return [c.unnest() for c in node.flatten()] if isinstance(node, exp.And) else [node]


def join_rows(query: AggregateQuery, restrictions: Mapping[str, BlockRestriction],
              samples: Mapping[str, tuple[str, str]] | None = None) -> exp.Select:
    """The analyst's FROM/JOIN/WHERE with each table replaced by its bounded, restricted rows.

    ``samples`` maps the alias of a table with ``bounding = "materialized"`` to its stored
    bounded sample (schema, table), which already keeps at most c rows per unit, chosen at
    random before any filter (``chorus_py.stores.samples``): that occurrence reads the sample and
    is not bounded again.  The select list is left empty for the caller to fill.
    """
    join = query.join
    assert join is not None
    tree = join.tree
    own: dict[str, list[exp.Expr]] = {s.alias: [] for s in join.sources}
    filters = _conjuncts(tree.args["where"].this if tree.args.get("where") else None)
    for j in tree.args.get("joins") or []:
        filters += _conjuncts(j.args.get("on"))
    for cond in filters:
        aliases = {c.table for c in cond.find_all(exp.Column)}
        if len(aliases) == 1 and next(iter(aliases)) in own:
            own[next(iter(aliases))].append(cond)

    def source(src_alias: str) -> exp.Expr:
        src = next(s for s in join.sources if s.alias == src_alias)
        sample = (samples or {}).get(src.alias)
        table = exp.Table(this=exp.to_identifier(src.table),
                          db=exp.to_identifier(query.schema, quoted=True)
                          if query.schema is not None else None,
                          alias=exp.TableAlias(this=exp.to_identifier(src.alias)))
        if sample is not None:
            table = exp.Table(this=exp.to_identifier(sample[1], quoted=True),
                              db=exp.to_identifier(sample[0]),
                              alias=exp.TableAlias(this=exp.to_identifier(src.alias)))
        if src.public:
            return table
        where: exp.Expr | None = exp.and_(*[safety(c) for c in own[src.alias]]) \
            if own[src.alias] else None
        restriction = restrictions.get(src.alias)
        if restriction is not None:
            where = blocks(where, exp.column(restriction.column, table=src.alias),
                           restriction.start, restriction.end, restriction.column_type,
                           restriction.windows)
        # Every tree here is built fresh for this call: builders mutate in place (copy=False)
        # instead of copying the growing tree at each step.
        rows = exp.select(exp.Column(this=exp.Star(), table=exp.to_identifier(src.alias))) \
            .from_(table, copy=False)
        if where is not None:
            rows = rows.where(where, copy=False)
        unit = src.policy.privacy_unit
        if unit is not None and sample is None:
            rows = contribution(rows, unit, src.cap)
        return rows.subquery(src.alias, copy=False)

    first = tree.args["from_"].this
    out = exp.Select().from_(source(first.alias_or_name), copy=False)
    for j in tree.args.get("joins") or []:
        target = j.this.alias_or_name
        on = j.args.get("on")
        join_node = exp.Join(this=source(target))
        if on is not None:
            join_node.set("on", safety(on))
        out.append("joins", join_node)
    if tree.args.get("where"):
        out = out.where(safety(tree.args["where"].this), copy=False)
    return out
