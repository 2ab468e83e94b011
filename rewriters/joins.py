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
and so that each table reads only the blocks it paid for.  A filter on a public table joined by
an equality reaches the private tables' subqueries too, as a semi-join (``x IN (SELECT y FROM
<the public table's filtered rows>)``): the cap is spent on rows the join keeps.  Public tables
are read as they are.

A private table with a ranked copy (``chorus_py.stores.samples``, ``ranked_copy``) is read from
the copy, as a one-table query reads it: the rows of stored rank ``<= c`` by a plain scan when
the occurrence keeps every row of the copy (no filter of its own, no semi-join, claimed blocks
that cover the copy: ``rewriters.contribution.stored_rank_contribution``), otherwise its light
units whole and its heavier units' filtered rows ranked in stored order
(``ranked_contribution``).  Either way each unit keeps min(c_u, c) of the occurrence's c_u
filtered rows, chosen uniformly among them, as ``contribution`` keeps them: the same rows in
distribution, the same stability, without sorting every row of the table.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from sqlglot import exp

from analyses.query import AggregateQuery
from rewriters.blocks import BlockRestriction, blocks
from rewriters.contribution import contribution, ranked_contribution, stored_rank_contribution
from rewriters.safety import safety


def _conjuncts(node: exp.Expr | None) -> list[exp.Expr]:
    """The AND-ed parts of ``node``, through any parentheses."""
    if node is None:
        return []
    node = node.unnest()
    if isinstance(node, exp.And):
        return [part for child in (node.this, node.expression) for part in _conjuncts(child)]
    return [node]


def _column_pair(cond: exp.Expr) -> tuple[exp.Column, exp.Column] | None:
    """(a, b) for ``a = b`` between plain columns of two different aliases."""
    if not isinstance(cond, exp.EQ):
        return None
    a, b = cond.this.unnest(), cond.expression.unnest()
    if isinstance(a, exp.Column) and isinstance(b, exp.Column) and a.table != b.table:
        return a, b
    return None


def join_rows(query: AggregateQuery, restrictions: Mapping[str, BlockRestriction],
              samples: Mapping[str, tuple[str, str]] | None = None,
              copies: Mapping[str, tuple[str, str]] | None = None,
              covering: Collection[str] = ()) -> exp.Select:
    """The analyst's FROM/JOIN/WHERE with each table replaced by its bounded, restricted rows.

    ``samples`` maps the alias of a table with ``bounding = "materialized"`` to its stored
    bounded sample (schema, table), which already keeps at most c rows per unit, chosen at
    random before any filter (``chorus_py.stores.samples``): that occurrence reads the sample and
    is not bounded again.  ``copies`` maps the alias of a table bounded per query to its ranked
    copy (schema, table), which that occurrence reads and bounds (module docstring);
    ``covering``: the aliases among them whose claimed blocks cover the whole copy (no block
    column, or every block of the schedule), so that with no filter of their own every row of
    the copy is theirs.  The select list is left empty for the caller to fill.
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

    sources = {s.alias: s for s in join.sources}
    pairs = [pair for cond in filters if (pair := _column_pair(cond)) is not None]

    def semi_joins(src_alias: str) -> list[exp.Expr]:
        """``a.x IN (SELECT o.y FROM <o's rows> AS o)`` for every equality a.x = o.y with a
        table o that has filters of its own, so the cap is spent on rows the join keeps
        (bounding after the filters, as in a one-table query).  Only for a public o: its rows
        never change, so which rows a unit keeps still depends on that unit's rows alone (and
        public data), and the stability is as before.  (A private o of the same unit joined on
        the unit filters whole units, whose caps do not interact: nothing to gain.)"""
        out: list[exp.Expr] = []
        for a, b in pairs:
            mine, other = (a, b) if a.table == src_alias else (b, a) if b.table == src_alias \
                else (None, None)
            if mine is None or other is None or other.table not in sources:
                continue
            o = sources[other.table]
            if not o.public or not own[o.alias]:
                continue
            inner = rows_of(o.alias)
            out.append(exp.In(this=exp.column(mine.name, table=src_alias),
                              query=exp.Subquery(this=exp.select(
                                  exp.column(other.name, table=o.alias)).from_(
                                      inner.subquery(o.alias, copy=False), copy=False))))
        return out

    def rows_of(src_alias: str, with_semi_joins: bool = False) -> exp.Query:
        """The rows of one occurrence: its own filters, its claimed blocks, its bounding."""
        src = sources[src_alias]
        sample = (samples or {}).get(src.alias)
        copy = None if src.public or sample is not None else (copies or {}).get(src.alias)
        table = exp.Table(this=exp.to_identifier(src.table),
                          db=exp.to_identifier(query.schema, quoted=True)
                          if query.schema is not None else None,
                          alias=exp.TableAlias(this=exp.to_identifier(src.alias)))
        if sample is not None:
            table = exp.Table(this=exp.to_identifier(sample[1], quoted=True),
                              db=exp.to_identifier(sample[0]),
                              alias=exp.TableAlias(this=exp.to_identifier(src.alias)))
        elif copy is not None:
            table = exp.Table(this=exp.to_identifier(copy[1], quoted=True),
                              db=exp.to_identifier(copy[0]),
                              alias=exp.TableAlias(this=exp.to_identifier(src.alias)))
        if src.public:
            rows = exp.select(exp.Column(this=exp.Star(), table=exp.to_identifier(src.alias))) \
                .from_(table, copy=False)
            return rows.where(exp.and_(*[safety(c) for c in own[src.alias]]), copy=False) \
                if own[src.alias] else rows
        conditions = [safety(c) for c in own[src.alias]]
        if with_semi_joins:
            conditions += semi_joins(src_alias)
        where: exp.Expr | None = exp.and_(*conditions) if conditions else None
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
        if unit is not None and copy is not None and not conditions \
                and src.alias in covering:
            # Every row of the copy is one of this occurrence's rows (nothing filters them but
            # blocks that cover the copy): its stored ranks <= c are the kept rows.
            return stored_rank_contribution(rows, src.alias, src.cap)
        if unit is not None and copy is not None:
            return ranked_contribution(rows, src.alias, unit, src.cap)
        if unit is not None and sample is None:
            return contribution(rows, unit, src.cap)
        return rows

    def source(src_alias: str) -> exp.Expr:
        if sources[src_alias].public:
            return exp.Table(this=exp.to_identifier(sources[src_alias].table),
                             db=exp.to_identifier(query.schema, quoted=True)
                             if query.schema is not None else None,
                             alias=exp.TableAlias(this=exp.to_identifier(src_alias)))
        return rows_of(src_alias, with_semi_joins=True).subquery(src_alias, copy=False)

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
