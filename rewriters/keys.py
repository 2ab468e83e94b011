"""The grid of public group keys a query's answer is LEFT JOINed onto (``rewriters.groups``).

One part per source of keys (``analyses.keys``), cross-joined:

- listed values (declared ``public_values``, or calendar buckets listed over the blocks read):
  one ``VALUES`` list per key;
- keys over one public table of a join: ``SELECT DISTINCT <keys> FROM <schema>.<table> AS
  <alias> WHERE <the query's conditions on that table alone>``, one part per table occurrence,
  so the grid holds the combinations the public table has (public data, read by the database
  with the query; the outgoing verifier accepts a grid that reads public tables only).

The grid depends on the policy, the query, the clock and public tables only, never on a private
row, so which groups come back tells nothing about anyone.
"""

from __future__ import annotations

from sqlglot import exp

from analyses.keys import TableKeys
from analyses.query import AggregateQuery
from rewriters.groups import public_grid
from rewriters.safety import safety


def key_grid(query: AggregateQuery) -> tuple[exp.Select | None, frozenset[str]]:
    """The grid of ``query``'s keys (None: some listed key has no value, so no group) and the
    ids of keys read from public tables (their values may be NULL: matched NULL-safely).

    Raises ValueError on a calendar key whose values were not listed: the kind lists them
    over the blocks the query reads before rewriting (``AggregateQuery.with_key_values``).
    """
    listed: list[tuple[str, tuple[object, ...]]] = []
    tables: dict[str, list[tuple[str, exp.Expr]]] = {}
    for key in query.keys:
        if key.public_values is not None:
            listed.append((key.id, key.public_values))
        elif isinstance(key.domain, TableKeys):
            tables.setdefault(key.domain.alias, []).append((key.id, key.expr))
        else:
            raise ValueError(f"group key {key.id} has no public values listed")
    parts = [_distinct(query, alias, keys) for alias, keys in tables.items()]
    grid = public_grid(listed, parts)
    return grid, frozenset(kid for keys in tables.values() for kid, _ in keys)


def _distinct(query: AggregateQuery, alias: str,
              keys: list[tuple[str, exp.Expr]]) -> exp.Select:
    """``SELECT DISTINCT <key> AS <id>, ... FROM <public table> AS alias WHERE <its own
    conditions>``: the values the join can give these keys (a superset: the private side
    may match fewer rows, whose groups come back as noisy zeros)."""
    join = query.join
    assert join is not None
    source = next(s for s in join.sources if s.alias == alias)
    assert source.public, "keys are read only from public tables"
    tree = join.tree
    conditions = _conjuncts(tree.args["where"].this if tree.args.get("where") else None)
    for j in tree.args.get("joins") or []:
        conditions += _conjuncts(j.args.get("on"))
    own = [safety(c) for c in conditions
           if {col.table for col in c.find_all(exp.Column)} == {alias}]
    table = exp.Table(this=exp.to_identifier(source.table),
                      db=exp.to_identifier(query.schema, quoted=True)
                      if query.schema is not None else None,
                      alias=exp.TableAlias(this=exp.to_identifier(alias)))
    select = exp.select(*[exp.alias_(safety(expr), kid) for kid, expr in keys]).from_(
        table, copy=False).distinct(copy=False)
    return select.where(exp.and_(*own), copy=False) if own else select


def _conjuncts(node: exp.Expr | None) -> list[exp.Expr]:
    """The AND-ed parts of ``node``, through parentheses."""
    if node is None:
        return []
    node = node.unnest()
    if isinstance(node, exp.And):
        return _conjuncts(node.this) + _conjuncts(node.expression)
    return [node]
