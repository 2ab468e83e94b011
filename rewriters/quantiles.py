"""SQL for DP quantiles (``chorus_py.kinds.quantile``): the histogram the database computes in
one scan, and the finish the proxy runs over the selected values.

``quantile_histogram`` counts, per group (a public key by the index of its declared value, a
key released by a threshold by its value) and per bin of the clipped value, the rows of the
query: its filter, its claimed blocks, then (keys released by a threshold, with a chosen
groups-per-unit bound g) each unit's rows in at most g of its groups, then at most k rows per
unit (``rewriters.contribution``), NULL values left out as the
percentile functions leave them.  Its exact counts stay in the proxy: only the bins the
exponential mechanism draws from them leave it (``mechanisms.exponential``).

With per-query bounding and a ranked copy of the table (``chorus_py.stores.samples``), the
histogram reads the copy instead: units with n_u <= k rows in all are kept whole by a plain
scan and only the heavier units' filtered rows are ranked, in their stored random order
(``rewriters.contribution.ranked_contribution``; with a groups-per-unit bound g < k, the
units with n_u <= g kept whole and the others' groups drawn afresh: ``ranked_group_branches``),
the same kept-row distribution as ranking every filtered row; a plain column at its declared
bounds is binned by the copy's stored bin (``rewriters.bins``).  The stored ranks alone (``stored_rank_contribution``) never serve here:
the histogram drops NULL values after the copy was ranked, so a unit with a NULL value among
its k lowest ranks would keep fewer than min(c_u, k) of its counted rows.  Over a join
(``quantile_join_histogram``) each occurrence reads its copy as ``rewriters.joins`` reads it:
the NOT NULL test is a condition of the occurrence whose value it tests (light and heavy
units), and only an occurrence no condition reads may keep its stored ranks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence

from sqlglot import exp

from analyses.query import AggregateQuery, OutputColumn
from rewriters.bins import bin_of
from rewriters.blocks import BlockRestriction
from rewriters.contribution import (
    contribution,
    group_bound,
    ranked_branches,
    ranked_contribution,
    ranked_group_branches,
    ranked_group_contribution,
)
from rewriters.groups import public_filter
from rewriters.joins import join_rows
from rewriters.pipeline import combine_branches, filtered_rows, noisy_table
from rewriters.safety import safety


def quantile_histogram(query: AggregateQuery, argument: exp.Expr, lower: float, upper: float,
                       bins: int, restriction: BlockRestriction | None,
                       sample: tuple[str, str] | None, ranked: tuple[str, str] | None = None,
                       split: bool = False, counted: bool = False, twin: bool = False,
                       stored: str | None = None, light_twin: bool = False,
                       presorted: bool = False) -> exp.Select:
    """Rows (g0, ..., b, n): per group (index or value) and bin b in [0, bins) of the value clipped to
    [lower, upper], the number n of rows.  Bins and groups without rows are absent.

    ``ranked`` names (schema, table) of the table's ranked copy (per-query bounding: read
    instead of ranking every filtered row; never with a stored ``sample``).  ``split``: its light and heavy
    branches are counted apart and their counts added per (group, bin) (``rewriters.pipeline.
    combine_branches``: no unit has rows in both, so each cell's sum is the count of one aggregation
    over the union; Postgres then runs the light branch, most rows, with parallel workers).
    ``counted``: the heavy branch numbers its rows by a running count instead of ROW_NUMBER
    (``rewriters.contribution.kept_rank``: the same rows; not with groups per unit).
    ``twin``: the heavy branch reads the copy's twin in unit order (``rewriters.contribution.
    ranked_branches``: the same rows; not with groups per unit), with ``light_twin`` its light
    branch too; ``presorted``: its window partitioned by the unit's row count and the unit
    (``rewriters.contribution.presorted_pays``: the same rows).  ``stored``: the ranked
    copy's stored bin of ``argument``
    (``rewriters.bins.stored_bin``: a plain column at its declared bounds and these bins),
    grouped instead of computing each row's bin: the same cells.

    >>> from sqlglot import parse_one
    >>> from chorus_py.policy import TablePolicy
    >>> tp = TablePolicy(privacy_unit="u", max_rows_per_unit=2,
    ...                  columns={"u": {"type": "int"}, "x": {"type": "float"}})
    >>> q = AggregateQuery("t", "t", tp, None, (), (), (), None, (), None, None, 2, False, None)
    >>> from rewriters.dialect import dialect
    >>> tree = quantile_histogram(q, parse_one("t.x"), 0, 10, 100, None, None)
    >>> print(dialect(tree, "postgres").sql("postgres"))  # doctest: +NORMALIZE_WHITESPACE
    SELECT h.b AS b, COUNT(*) AS n FROM (SELECT CASE WHEN r.v <= 0 THEN 0 WHEN r.v >= 10 THEN 99
    ELSE LEAST(CAST(FLOOR((r.v - 0) * 10.0) AS BIGINT), 99) END AS b FROM (SELECT CAST(t.x AS
    DOUBLE PRECISION) AS v FROM (SELECT * FROM (SELECT r.*, ROW_NUMBER() OVER (PARTITION BY r.u
    ORDER BY r.__chorus_rand) AS __chorus_rank FROM (SELECT t.*, RANDOM() AS __chorus_rand FROM t
    AS t WHERE NOT t.x IS NULL) AS r) AS b WHERE b.__chorus_rank <= 2) AS t) AS r) AS h GROUP BY
    h.b
    """
    if not (upper > lower and bins >= 1):
        raise ValueError("a quantile histogram needs upper > lower and at least one bin")
    unit = query.table_policy.privacy_unit
    if ranked is not None and (sample is not None or not isinstance(unit, str)):
        raise ValueError("a ranked copy serves per-query bounding of one unit column")
    if ranked is not None:
        assert isinstance(unit, str)
        rows = _filtered(query, argument, restriction, None, ranked)
        if split:
            # Keys indexed per row here: on Postgres the per-row index costs little beside the
            # scan, and indexing per cell would add a third aggregation (measured ~20 ms
            # slower on 1M trips); combine_branches adds up cells by their columns only.
            light, heavy = (_histogram_of(query, argument, branch, lower, upper, bins,
                                          by_value=False, stored=stored)
                            for branch in _copy_branches(query, rows, unit, counted, twin,
                                                         light_twin, presorted))
            # Each (group, bin) count is integral: cast back to BIGINT after the sum.
            return combine_branches([light, heavy],
                                    [*(f"g{i}" for i in range(len(query.keys))), "b"],
                                    [("n", True)])
        return _indexed(query, _histogram_of(query, argument,
                                             _copy_bounded(query, rows, unit, counted, twin,
                                                           light_twin, presorted),
                                             lower, upper, bins, stored=stored))
    return _indexed(query, _histogram_of(query, argument,
                                         _bounded_rows(query, argument, restriction, sample),
                                         lower, upper, bins))


def _copy_branches(query: AggregateQuery, rows: exp.Select, unit: str, counted: bool,
                   twin: bool, light_twin: bool = False, presorted: bool = False
                   ) -> tuple[exp.Select, exp.Select]:
    """The light and heavy branches of the ranked copy's ``rows`` (filtered): by the row cap
    k (``ranked_branches``), or, keys released by a threshold with g < k groups per unit, by g
    groups then k rows (``ranked_group_branches``: the groups drawn afresh, as
    ``group_bound`` draws them)."""
    if groups_bounded(query):
        assert query.max_groups is not None
        return ranked_group_branches(rows, query.alias, unit,
                                     [safety(k.expr) for k in query.keys], query.max_groups,
                                     query.stability)
    return ranked_branches(rows, query.alias, unit, query.stability, twin, counted,
                           light_twin, presorted)


def _copy_bounded(query: AggregateQuery, rows: exp.Select, unit: str, counted: bool,
                  twin: bool, light_twin: bool = False, presorted: bool = False
                  ) -> exp.Union:
    """The branches of ``_copy_branches`` as one relation (light UNION ALL heavy)."""
    if groups_bounded(query):
        assert query.max_groups is not None
        return ranked_group_contribution(rows, query.alias, unit,
                                         [safety(k.expr) for k in query.keys],
                                         query.max_groups, query.stability)
    return ranked_contribution(rows, query.alias, unit, query.stability, twin, counted,
                               light_twin, presorted)


def _histogram_of(query: AggregateQuery, argument: exp.Expr, rows: exp.Query, lower: float,
                  upper: float, bins: int, by_value: bool = True,
                  stored: str | None = None) -> exp.Select:
    """(g0, ..., b, n) over ``rows``, the bounded rows of the query's table (alias kept), every
    key by its value (``by_value``: ``_indexed`` maps declared values to their indexes, per
    cell), or a key with public values by the index of its value, per row; each row's bin
    read from the ranked copy's ``stored`` bin column when there is one."""
    keys = [exp.alias_(safety(k.expr), f"g{i}") for i, k in enumerate(query.keys)] \
        if by_value else _key_columns(query)
    if stored is not None:
        per_row = exp.select(*keys, exp.alias_(exp.column(stored, table=query.alias), "b")
                             ).from_(rows.subquery(query.alias, copy=False), copy=False)
        return _counted(per_row, len(query.keys))
    # The value once per row (v, a double: not NULL, filtered before), then its bin: written
    # inside the bin's CASE it would be rendered once per branch.
    per_row = exp.select(*keys,
                         exp.alias_(exp.cast(safety(argument), exp.DType.DOUBLE), "v")).from_(
        rows.subquery(query.alias, copy=False), copy=False)
    return _binned(per_row, len(query.keys), lower, upper, bins)


def _indexes_keys(query: AggregateQuery) -> bool:
    """Whether a key of ``query`` has public values (counted by the index of its value)."""
    return any(k.public_values is not None for k in query.keys)


def _indexed(query: AggregateQuery, cells: exp.Query) -> exp.Query:
    """``cells`` (g0, ..., b, n; every key by its value) with each key that has public values
    by the index of its value (``_key_index``), the counts of cells that land on one
    (group, bin) added up; ``cells`` itself when no key has public values.

    The histogram groups its rows by the keys' values and the index is computed once per
    cell, not once per row (a CASE of one comparison per declared value: a third of the
    grouped histogram's time on DuckDB, issue 23).  The same rows as indexing every row
    first: every counted row's key is a declared value (``public_filter`` in the filter, so
    never NULL), each value has one index, and the sum of a (group, bin)'s cells is the
    number of its rows whichever values they came from.  Integral: cast back to BIGINT
    after the sum (Postgres sums a bigint into a numeric, DuckDB into a HUGEINT)."""
    if not _indexes_keys(query):
        return cells
    keys: list[exp.Expr] = [
        exp.column(f"g{i}", table="x") if k.public_values is None
        else _key_index(exp.column(f"g{i}", table="x"), k.public_values)
        for i, k in enumerate(query.keys)]
    group = [*keys, exp.column("b", table="x")]
    return (exp.select(*[exp.alias_(e.copy(), f"g{i}") for i, e in enumerate(keys)],
                       exp.alias_(exp.column("b", table="x"), "b"),
                       exp.alias_(exp.cast(exp.Sum(this=exp.column("n", table="x")),
                                           exp.DType.BIGINT), "n"))
            .from_(cells.subquery("x", copy=False), copy=False)
            .group_by(*group, copy=False))


def quantile_join_histogram(query: AggregateQuery, argument: exp.Expr, lower: float,
                            upper: float, bins: int,
                            restrictions: Mapping[str, BlockRestriction],
                            samples: Mapping[str, tuple[str, str]] | None,
                            copies: Mapping[str, tuple[str, str]] | None = None,
                            covering: Collection[str] = ()) -> exp.Select:
    """The histogram of :func:`quantile_histogram` over the rows of a join: each table's
    bounded, block-restricted rows (``rewriters.joins.join_rows``), joined as the analyst
    wrote it.  The conditions the histogram adds (the value is not NULL, the keys are
    declared values) join the analyst's filter, so those that read one table are applied
    before its rows are bounded, as in a one-table query.

    ``copies`` and ``covering``: the ranked copies the occurrences read, and those whose
    blocks cover their copy (``join_rows``).  An occurrence reads its copy whole (stored
    ranks ``<= c`` by a plain scan) only when no condition of its own filters it, and the
    NOT NULL test on a value of one occurrence is such a condition: that side's light units
    are kept whole and its heavy units' non-NULL rows ranked in stored order, so a unit with
    NULL values among its lowest stored ranks still keeps min(c_u, c) counted rows.  A side
    the NULL test does not read keeps min(c_u, c) of all its rows either way.
    """
    if not (upper > lower and bins >= 1):
        raise ValueError("a quantile histogram needs upper > lower and at least one bin")
    join = query.join
    if join is None:
        raise ValueError("a join histogram needs a join query")
    tree = join.tree.copy()
    extra: list[exp.Expr] = [exp.Not(this=exp.Is(this=argument.copy(), expression=exp.Null()))]
    extra += [public_filter(k.expr, k.public_values) for k in query.keys
              if k.public_values is not None]
    old = tree.args.get("where")
    tree.set("where", exp.Where(this=exp.and_(*([old.this.copy()] if old else []), *extra)))
    bound = dataclasses.replace(query, join=dataclasses.replace(join, tree=tree))
    rows = join_rows(bound, restrictions, samples, copies, covering)
    columns: list[exp.Expr] = [exp.alias_(
        safety(k.expr) if k.public_values is None else _key_index(safety(k.expr),
                                                                  k.public_values),
        f"g{i}") for i, k in enumerate(query.keys)]
    rows.set("expressions", [*columns, exp.alias_(exp.cast(safety(argument), exp.DType.DOUBLE),
                                                  "v")])
    return _binned(rows, len(query.keys), lower, upper, bins)


def _binned(per_row: exp.Select, n_keys: int, lower: float, upper: float,
            bins: int) -> exp.Select:
    """(g0, ..., b, n) from rows (g0, ..., v): v's bin over [lower, upper], counted."""
    binned = exp.select(*[exp.column(f"g{i}", table="r") for i in range(n_keys)],
                        exp.alias_(bin_of(exp.column("v", table="r"), lower, upper, bins),
                                   "b")).from_(per_row.subquery("r", copy=False), copy=False)
    return _counted(binned, n_keys)


def _counted(binned: exp.Select, n_keys: int) -> exp.Select:
    """(g0, ..., b, n) from rows (g0, ..., b): the rows of each cell, counted."""
    group = [exp.column(f"g{i}", table="h") for i in range(n_keys)]
    group.append(exp.column("b", table="h"))
    return (exp.select(*[exp.alias_(c, c.name) for c in group],
                       exp.alias_(exp.Count(this=exp.Star()), "n"))
            .from_(binned.subquery("h", copy=False), copy=False)
            .group_by(*[c.copy() for c in group], copy=False))


def _bounded_rows(query: AggregateQuery, argument: exp.Expr,
                  restriction: BlockRestriction | None,
                  sample: tuple[str, str] | None) -> exp.Select:
    """The rows a quantile of ``argument`` reads: the query's filter, the declared public key
    values, the claimed blocks, non-NULL values; then (a chosen groups-per-unit bound g) each
    unit's rows in at most g of its groups; then at most k rows per unit."""
    rows = _filtered(query, argument, restriction, sample, None)
    unit = query.table_policy.privacy_unit
    if query.table_policy.multi_attribution and sample is None:  # only its kept set S bounds it
        raise ValueError("a table whose rows belong to several units is read from its S")
    if isinstance(unit, str) and groups_bounded(query):
        # Keys released by a threshold, with the groups per unit chosen (contribution =
        # "auto"): each unit's rows in at most g of its groups, before the row cap (as in
        # rewriters.pipeline), so the key release needs D = min(g, k) groups per unit.
        rows = group_bound(rows, unit, [safety(k.expr) for k in query.keys], query.max_groups)
    if isinstance(unit, str) and sample is None:
        rows = contribution(rows, unit, query.stability)
    return rows


def _filtered(query: AggregateQuery, argument: exp.Expr, restriction: BlockRestriction | None,
              sample: tuple[str, str] | None, ranked: tuple[str, str] | None) -> exp.Select:
    """The query's rows before bounding: its filter, the declared public key values, the
    claimed blocks, non-NULL values of ``argument``; from the table, its ``sample`` or its
    ``ranked`` copy (``rewriters.pipeline.filtered_rows``)."""
    # filtered_rows makes the whole filter safe (rewriters.safety): the raw expressions here.
    where = exp.Not(this=exp.Is(this=argument.copy(), expression=exp.Null()))
    for key in query.keys:  # undeclared key values are dropped, as in every public-key query
        if key.public_values is not None:
            where = exp.and_(where, public_filter(key.expr, key.public_values))
    if query.where is not None:
        where = exp.and_(query.where.copy(), where)
    return filtered_rows(dataclasses.replace(query, where=where), restriction, sample, ranked)


def groups_bounded(query: AggregateQuery) -> bool:
    """Whether each unit's rows are first bounded to g groups (keys released by a threshold,
    g chosen below the cap k)."""
    return query.bounded_groups is not None


#: The output of ``quantile_group_units`` the proxy's key-release threshold reads.
UNITS_COLUMN = "n"


def quantile_group_units(query: AggregateQuery, argument: exp.Expr,
                         restriction: BlockRestriction | None) -> exp.Select:
    """Rows (g0, ..., n): per group (keys as in ``quantile_histogram``), the number n of distinct
    privacy units among the rows a quantile of ``argument`` reads (``_bounded_rows``: one
    column's units, per-query bounding).  Groups without rows are absent.  The proxy adds
    noise and keeps the groups above its threshold (``chorus_py.kinds.quantile.KeyGate``).

    >>> from sqlglot import parse_one
    >>> from chorus_py.policy import TablePolicy
    >>> from analyses.query import GroupKey
    >>> tp = TablePolicy(privacy_unit="u", max_rows_per_unit=2,
    ...                  columns={"u": {"type": "int"}, "h": {"type": "int"}})
    >>> q = AggregateQuery("t", "t", tp, None, (GroupKey("k0", parse_one("t.h"), None),), (),
    ...                    (), None, (), None, None, 2, True, None)
    >>> from rewriters.dialect import dialect
    >>> tree = quantile_group_units(q, parse_one("t.x"), None)
    >>> print(dialect(tree, "postgres").sql("postgres"))  # doctest: +NORMALIZE_WHITESPACE
    SELECT r.g0 AS g0, COUNT(DISTINCT r.u) AS n FROM (SELECT t.h AS g0, t.u AS u FROM (SELECT *
    FROM (SELECT r.*, ROW_NUMBER() OVER (PARTITION BY r.u ORDER BY r.__chorus_rand) AS
    __chorus_rank FROM (SELECT t.*, RANDOM() AS __chorus_rand FROM t AS t WHERE NOT t.x IS NULL)
    AS r) AS b WHERE b.__chorus_rank <= 2) AS t) AS r GROUP BY r.g0
    """
    unit = query.table_policy.privacy_unit
    if not isinstance(unit, str) or not query.keys:
        raise ValueError("distinct units per group need one privacy-unit column and group keys")
    rows = _bounded_rows(query, argument, restriction, None)
    alias = query.alias
    per_row = exp.select(*_key_columns(query),
                         exp.alias_(exp.column(unit, table=alias), "u")).from_(
        rows.subquery(alias, copy=False), copy=False)
    group = [exp.column(f"g{i}", table="r") for i in range(len(query.keys))]
    return (exp.select(*[exp.alias_(c, c.name) for c in group],
                       exp.alias_(exp.Count(this=exp.Distinct(
                           expressions=[exp.column("u", table="r")])), UNITS_COLUMN))
            .from_(per_row.subquery("r", copy=False), copy=False)
            .group_by(*[c.copy() for c in group], copy=False))


def _key_columns(query: AggregateQuery) -> list[exp.Expr]:
    """``g<i>`` per key: a key with public values by the index of its value, any other (released
    by a threshold in the proxy) by its value."""
    return [exp.alias_(
        safety(k.expr) if k.public_values is None else _key_index(safety(k.expr),
                                                                  k.public_values),
        f"g{i}") for i, k in enumerate(query.keys)]


def _key_index(key: exp.Expr, values: Sequence[object]) -> exp.Expr:
    """``CASE WHEN key IN (v0) THEN 0 WHEN key IN (v1) THEN 1 ... END``: the index of the
    row's key among the declared values (rendered as ``rewriters.groups`` renders them)."""
    ifs = [exp.If(this=public_filter(key, [v]), true=exp.Literal.number(i))
           for i, v in enumerate(values)]
    return exp.Case(ifs=ifs, default=exp.Null()) if ifs else exp.Null()


def quantile_finish(outputs: Sequence[OutputColumn], having: exp.Expr | None,
                    order: Sequence[exp.Ordered], limit: int | None,
                    offset: int | None) -> exp.Select:
    """The outputs, HAVING, ORDER BY, LIMIT over the table ``chorus_noisy`` of key ids and
    quantile ids (post-processing, in the proxy's scratch DuckDB)."""
    finish = exp.select(*[exp.alias_(o.expr.copy(), o.name, quoted=True)
                          for o in outputs]).from_(noisy_table(), copy=False)
    if having is not None:
        finish = finish.where(having.copy(), copy=False)
    if order:
        finish = finish.order_by(*[o.copy() for o in order], copy=False)
    if limit is not None:
        finish = finish.limit(limit, copy=False)
    if offset is not None:
        finish = finish.offset(offset, copy=False)
    return finish
