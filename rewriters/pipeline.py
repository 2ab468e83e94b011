"""The rewrite of one private aggregate query, pass by pass, into SQL the backend runs.

Shape of the output (SQL noise mode)::

    WITH chorus_noisy AS MATERIALIZED (                    -- noise: each value drawn once
      SELECT k0, m0 + <noise>, ...
      FROM (                                               -- measure: exact, per group
        SELECT <key> AS k0, COUNT(*) AS m0, SUM(LEAST(GREATEST(x, l), u)) AS m1
        FROM (<at most k random rows per unit>              -- contribution
              of SELECT t.* FROM table AS t WHERE <analyst filter> AND <claimed blocks>) AS t
        GROUP BY <key>) AS chorus_exact)                   -- (public keys: LEFT JOIN a grid)
    SELECT <outputs over k0, m0, ...> FROM chorus_noisy
    WHERE <noisy count > tau> AND <HAVING> ORDER BY ... LIMIT ...

In proxy noise mode the backend runs only the *measure* query; the engine adds the noise in Python
and runs *finish* on the noisy rows in an in-memory DuckDB.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from sqlglot import exp

from analyses.query import AggregateQuery, Measurement
from chorus_py.policy import TablePolicy
from mechanisms.planning import THRESHOLD_ID, NoisePlan
from rewriters.blocks import BlockRestriction, blocks
from rewriters.clipping import clipping, clips_stored, stored_clip
from rewriters.contribution import (
    RANK,
    contribution,
    counted_pays,
    group_bound,
    presorted_pays,
    ranked_branches,
    ranked_contribution,
    ranked_group_contribution,
    ranked_group_heavy,
    ranked_group_parts,
    stored_rank_contribution,
    streamed_pays,
)
from rewriters.dialect import rendered
from rewriters.grouped_copy import (
    first_kept_of_group,
    first_of_group,
    group_key_column,
    stored_group_part,
)
from rewriters.groups import complete_groups, public_filter
from rewriters.joins import join_rows
from rewriters.keys import key_grid
from rewriters.noise import noise
from rewriters.safety import safety

NOISY = "chorus_noisy"
PARTS = "chorus_parts"  # the ranked copy's parts' per-group aggregates (combine_branches)
# Where the ranked copy's light and heavy branches are aggregated apart and combined
# (``combine_branches``).  Postgres runs ``light UNION ALL heavy`` under one aggregate serially (the
# heavy branch's window blocks a parallel plan); apart, the light branch, most of the rows,
# runs with parallel workers (EXPLAIN ANALYZE, 1M demo trips, medians of 5: the answer of
# issue 23's filtered SUM by city 280 -> 165 ms; notes/pgsplit.md).  DuckDB already runs the
# UNION ALL in parallel (14.7 ms as one aggregate, 15.6 ms split: no gain), and Spark keeps
# the one shape its feature tests cover.
SPLIT_DIALECTS = frozenset({"postgres"})


@dataclass(frozen=True)
class RewrittenQuery:
    """The statements the engine runs for one query."""

    measure: exp.Select      # exact measurements per group (never returned to anyone)
    finish: exp.Select       # outputs from the noisy measurements (table chorus_noisy)
    key_ids: tuple[str, ...]
    measure_ids: tuple[str, ...]
    dialect: str

    def sql_with_noise(self, plan: NoisePlan, consume: bool = False) -> str:
        """One statement computing the noisy answer inside the database.

        ``consume``: the caller renders this rewrite once and drops it (a never-seen query
        shape), so its trees go into the statement as they are instead of being copied; the
        rewrite must not be used again."""
        noisy = noise(self.measure, self.key_ids, plan.all_mechanisms(), self.dialect,
                      copy=not consume)
        statement = self.finish if consume else self.finish.copy()
        statement.set("with_", exp.With(expressions=[
            exp.CTE(this=noisy, alias=exp.TableAlias(this=exp.to_identifier(NOISY)),
                    materialized=True)
        ]))
        # A fresh tree already: neither dialect() nor the generator needs to copy it.
        return rendered(statement, self.dialect)

    def measure_sql(self, consume: bool = False) -> str:
        """The exact measurements alone (proxy noise mode), for the backend.

        ``consume``: the caller renders the measurements once (a never-seen query shape) and
        reads only the rest of this rewrite afterwards (its finish, its ids): the dialect's
        changes are made in the tree itself instead of a copy of it (0.5 ms of a cold
        prepare's 4.5 on DuckDB)."""
        return rendered(self.measure, self.dialect, copy=not consume)


def noisy_table() -> exp.Table:
    """The relation ``NOISY`` as a FROM source: built, where ``from_(NOISY)`` parses the name
    with sqlglot's parser on every rewrite (a few percent of a never-seen query's proxy CPU).

    >>> exp.select("m0").from_(noisy_table()).sql()
    'SELECT m0 FROM chorus_noisy'
    """
    return exp.Table(this=exp.to_identifier(NOISY))


def measured_ids(query: AggregateQuery, plan: NoisePlan) -> tuple[str, ...]:
    """The measurements the rewrite's statement returns after the group keys, in order: the
    query's, then the key-release gate's own count when it has one."""
    separate = plan.threshold is not None and plan.threshold.separate
    return tuple(m.id for m in query.measurements) + ((THRESHOLD_ID,) if separate else ())


def pipeline(query: AggregateQuery, plan: NoisePlan, restriction: BlockRestriction | None,
             dialect: str, sample: tuple[str, str] | None = None,
             restrictions: Mapping[str, BlockRestriction] | None = None,
             samples: Mapping[str, tuple[str, str]] | None = None,
             ranked: tuple[str, str] | None = None, whole: bool = False,
             copies: Mapping[str, tuple[str, str]] | None = None,
             covering: Collection[str] = (), twin: bool = False,
             counted: bool | None = None,
             grouped: tuple[str, str] | None = None,
             light_twin: bool = False, month: int | None = None) -> RewrittenQuery:
    """Rewrite ``query`` for ``dialect``; the same tree serves SQL and proxy noise modes.

    ``sample`` names (schema, table) of a stored bounded sample of the query's table: the query
    reads it instead of bounding contributions itself.  The cap is ``query.stability``.
    A join query (``query.join``) reads each table through ``rewriters.joins``, restricted to the
    claimed blocks in ``restrictions`` (by table alias), or from the stored samples in ``samples``.
    ``ranked`` names (schema, table) of a ranked copy of the query's table (per-query bounding
    without sorting the light units' rows: ``rewriters.contribution.ranked_contribution``);
    ``whole``: every row of that copy passes the query's filter (it filters nothing but the
    claimed blocks, which cover the copy), so its stored ranks <= k are the kept rows
    (``rewriters.contribution.stored_rank_contribution``: no window, no UNION ALL).  With
    groups per unit g < k (thresholded keys), whole or not, only the units of more than g rows
    are bounded to g groups and k rows (``ranked_group_contribution``: light, middle and heavy
    parts).  ``twin``: the heavy branch (without groups per unit) reads the copy's twin in unit
    order instead (``rewriters.contribution.ranked_branches``: the same rows, read in the order
    the window ranks them; ``kinds.single`` says when), and with ``light_twin`` the light
    branch too (``kinds.single.light_twin_pays``); with ``month`` (every row the query reads
    lies in that calendar month, ``rewriters.blocks.BlockRestriction.month``) the heavy branch
    reads the month twin's rows of that month instead (``ranked_branches``' ``month``).
    The heavy branch numbers its rows by
    a running count where that pays (``counted_pays``: DuckDB, 4 <= k <= 20, the copy; the same
    numbers as ROW_NUMBER, so the same rows); ``counted`` fixes that choice (a text template's
    probes render other caps in the shape of the query's own).  On the ``SPLIT_DIALECTS`` the light
    and heavy branches (or the three parts) are aggregated apart and their per-group
    measurements added (``combine_branches``).  A join reads the ranked copies ``copies`` (by table
    alias) instead, those in ``covering`` whole when nothing filters them
    (``rewriters.joins.join_rows``).  ``grouped`` names (schema, table) of the ranked copy's
    grouped twin over the query's key columns, for thresholded keys with g groups per unit
    over the ``whole`` copy: its light and middle units are then one scan of it
    (``rewriters.grouped_copy``), its heavy ones the per-query path, added up; without groups
    per unit, its rows of stored rank <= k, each group's distinct units counted by the mark of
    the first row of each (unit, group) instead of COUNT(DISTINCT unit)
    (``first_kept_of_group``).
    """
    tp = query.table_policy
    alias = query.alias

    # 1. Rows: the analyst's filter, the declared public values, the claimed blocks.  (A join
    #    builds the rows of each of its tables in rewriters.joins instead: steps 1-2 skipped.)
    if ranked is not None and (sample is not None or query.join is not None
                               or tp.privacy_unit is None):
        raise ValueError("a ranked copy serves per-query bounding of one table's rows only")
    rows = filtered_rows(query, restriction, sample, ranked) if query.join is None else None
    branches: tuple[exp.Select, ...] | None = None  # the ranked copy's parts, apart

    # 2. Contribution bounding: at most k rows per unit (user-level DP), unless the rows come
    #    from a stored sample, which already keeps the rows of rank <= k.
    if tp.multi_attribution and sample is None:  # only the stored kept set S bounds them
        raise ValueError("a table whose rows belong to several units is read from its S")
    # Thresholded keys: each unit's rows in at most g of its groups, so the key release needs
    # D = min(g, k) groups per unit (``AggregateQuery.groups_per_unit``).  (g >= k would change
    # nothing: k rows reach at most k groups.)  Before the row cap, so the k rows are drawn
    # within the g groups; on a stored sample, among the k rows it keeps; on a ranked copy,
    # only for the units of more than g rows (``ranked_group_parts``).
    g = query.bounded_groups
    keys = [safety(k.expr) for k in query.keys]
    if rows is not None and g is not None and ranked is None:
        assert tp.privacy_unit is not None
        rows = group_bound(rows, tp.privacy_unit, keys, g)
    running = counted_pays(dialect, query.stability, twin) if counted is None else counted
    # No groups per unit over the whole copy: its grouped twin's rows of stored rank <= k,
    # each group's distinct units counted by marks (``first_kept_of_group``).
    marked = grouped is not None and g is None
    if marked:
        if ranked is None or not whole or not query.thresholded:
            raise ValueError("a grouped twin without groups per unit serves thresholded keys "
                             "over a whole ranked copy")
        rows = stored_rank_contribution(filtered_rows(query, restriction, None, grouped),
                                        alias, query.stability)
    elif grouped is not None:
        if ranked is None or g is None or not whole or not adds_up_over_parts(query):
            raise ValueError("a grouped twin serves thresholded keys over a whole ranked copy")
        assert rows is not None and tp.privacy_unit is not None
        branches = (stored_group_part(filtered_rows(query, restriction, None, grouped), alias,
                                      g, query.stability),
                    ranked_group_heavy(rows, alias, tp.privacy_unit, keys, g, query.stability))
    elif ranked is not None and g is not None and dialect in SPLIT_DIALECTS \
            and adds_up_over_parts(query):
        assert rows is not None and tp.privacy_unit is not None
        branches = ranked_group_parts(rows, alias, tp.privacy_unit, keys, g, query.stability)
    elif ranked is not None and g is not None:  # whole or not: the heavy units need ranking
        assert rows is not None and tp.privacy_unit is not None
        rows = ranked_group_contribution(rows, alias, tp.privacy_unit, keys, g,
                                         query.stability)
    elif ranked is not None and whole:
        assert rows is not None
        rows = stored_rank_contribution(rows, alias, query.stability)
    elif ranked is not None and dialect in SPLIT_DIALECTS and adds_up_over_parts(query):
        assert rows is not None and tp.privacy_unit is not None
        branches = ranked_branches(rows, alias, tp.privacy_unit, query.stability, twin,
                                   running, light_twin, presorted_pays(dialect, twin),
                                   streamed_pays(dialect, twin), month)
    elif ranked is not None:
        assert rows is not None and tp.privacy_unit is not None
        rows = ranked_contribution(rows, alias, tp.privacy_unit, query.stability, twin,
                                   running, light_twin, presorted_pays(dialect, twin),
                                   streamed_pays(dialect, twin), month)
    elif rows is not None and tp.privacy_unit is not None and sample is None:
        rows = contribution(rows, tp.privacy_unit, query.stability)

    # 3. Exact measurements per group, with clipping.
    # safety() and _measure_sql() build fresh trees: the builders need not copy them.
    columns: list[exp.Expr] = [exp.alias_(safety(k.expr), k.id, copy=False)
                               for k in query.keys]
    # Every row comes from the ranked copy or its twins (all of them the copy's columns), or
    # from the bounded sample (a table of several units per row reads its kept set S from
    # ``sample`` instead, which stores no clipped values): their clipped values are stored.
    from_sample = sample is not None and not tp.multi_attribution
    stored = tp if (ranked is not None or from_sample) and clips_stored(dialect) else None
    columns += [exp.alias_(_measure_sql(m, alias, tp.privacy_unit, marked, stored), m.id,
                           copy=False) for m in query.measurements]
    measure_ids = list(measured_ids(query, plan))
    if plan.threshold is not None and plan.threshold.separate:
        unit, gate_alias = tp.privacy_unit, alias
        if query.join is not None:
            # A unit-keyed join (analyses.join_groups): every private occurrence carries the
            # same unit value on a row; count it on the first one (never a public table).
            first = query.join.private_sources[0]
            unit, gate_alias = first.policy.privacy_unit, first.alias
            assert isinstance(unit, str)
        gate = _distinct_units(gate_alias, unit, marked) if unit else exp.Count(this=exp.Star())
        columns.append(exp.alias_(gate, THRESHOLD_ID, copy=False))
    if query.join is not None:
        measure = join_rows(query, restrictions or {}, samples, copies, covering).select(
            *columns, copy=False)
        if query.thresholded:  # as filtered_rows does for one table
            for key in query.keys:
                if key.public_values is not None:
                    measure = measure.where(public_filter(key.expr, key.public_values),
                                            copy=False)
    elif branches is not None:
        integral = {m.id: m.integral for m in query.measurements}
        integral[THRESHOLD_ID] = True  # COUNT(DISTINCT unit) or COUNT(*)
        parts = []
        for i, branch in enumerate(branches):
            if i == 0 and grouped is not None:  # the stored keys; units counted by marks
                parts.append(_stored_group_measure(query, branch, columns, measure_ids))
                continue
            part = exp.select(*[c.copy() for c in columns]).from_(
                branch.subquery(alias, copy=False), copy=False)
            if query.keys:
                part = part.group_by(*[safety(k.expr) for k in query.keys], copy=False)
            parts.append(part)
        measure = combine_branches(parts, [k.id for k in query.keys],
                                   [(mid, integral[mid]) for mid in measure_ids])
    else:
        assert rows is not None
        measure = exp.select(*columns).from_(rows.subquery(alias, copy=False), copy=False)
    if query.keys and branches is None:
        measure = measure.group_by(*[safety(k.expr) for k in query.keys], copy=False)
    key_ids = [k.id for k in query.keys]
    if query.keys and not query.thresholded:
        grid, null_safe = key_grid(query)
        measure = complete_groups(measure, key_ids, measure_ids, grid, null_safe)

    # 4. Outputs, HAVING, ORDER BY and LIMIT over the noisy values (post-processing).  After
    #    the outputs, the noisy measurements themselves (``released_measurements``): the proxy
    #    computes each output's error bars from them, then drops them.
    finish = exp.select(*[exp.alias_(safety(o.expr), o.name, quoted=True, copy=False)
                          for o in query.outputs],
                        *[exp.alias_(exp.column(mid), f"chorus_{mid}", copy=False)
                          for mid in released_measurements(query)]).from_(noisy_table(),
                                                                          copy=False)
    conditions = []
    if plan.threshold is not None:
        conditions.append(exp.column(plan.threshold.measurement_id)
                          > exp.Literal.number(plan.threshold.threshold))
    if query.having is not None:
        conditions.append(safety(query.having))
    if conditions:
        finish = finish.where(exp.and_(*conditions), copy=False)
    if query.order:
        finish = finish.order_by(*[
            exp.Ordered(this=safety(o.this), desc=o.args.get("desc"),
                        nulls_first=o.args.get("nulls_first")) for o in query.order], copy=False)
    if query.limit is not None:
        finish = finish.limit(query.limit, copy=False)
    if query.offset is not None:
        finish = finish.offset(query.offset, copy=False)
    return RewrittenQuery(measure, finish, tuple(key_ids), tuple(measure_ids), dialect)


def combine_branches(parts: Sequence[exp.Select], key_ids: Sequence[str],
                     measures: Sequence[tuple[str, bool]]) -> exp.Select:
    """``SELECT keys, SUM(m) ... FROM (P1 UNION ALL P2 [UNION ALL P3]) GROUP BY keys``: the
    per-group measurements of the rows of all the ranked copy's parts (light and heavy
    branches, or ``ranked_group_parts``' three), from each part's own aggregates.

    No unit has rows in two parts (n_u <= k, n_u > k; or n_u <= g, g < n_u <= k, n_u > k), so
    every measurement adds up: a group's COUNT(*), COUNT(x) and SUM are those of its rows in
    any part, and its COUNT(DISTINCT unit) the sum over the parts (disjoint sets of units);
    AVG and VARIANCE are computed from such sums and counts after the noise
    (``analyses.query``).  A group present in one part only is that part's row alone.  SUM
    skips NULLs: a part whose sum is NULL (no non-NULL value there) adds nothing, and all NULL
    stay NULL, as one SUM over the union would.  With no keys each part gives one row (COUNT
    0, SUM NULL when empty), and
    so does the combination.  ``measures``: (id, integral); integral measurements (counts)
    are cast back to BIGINT (Postgres sums a bigint into a numeric), the others to DOUBLE as
    ``_measure_sql`` casts them.
    """
    if len(parts) < 2:
        raise ValueError("combine_branches adds the aggregates of two or more parts")
    union: exp.Query = parts[0]
    for part in parts[1:]:
        union = exp.union(union, part, distinct=False, copy=False)
    columns: list[exp.Expr] = [exp.column(k, table=PARTS) for k in key_ids]
    for mid, integral in measures:
        total = exp.Sum(this=exp.column(mid, table=PARTS))
        columns.append(exp.alias_(exp.cast(
            total, exp.DType.BIGINT if integral else exp.DType.DOUBLE, copy=False),
            mid, copy=False))
    combined = exp.select(*columns).from_(union.subquery(PARTS, copy=False), copy=False)
    if key_ids:
        combined = combined.group_by(*[exp.column(k, table=PARTS) for k in key_ids],
                                     copy=False)
    return combined


def _stored_group_measure(query: AggregateQuery, rows: exp.Select, columns: Sequence[exp.Expr],
                          measure_ids: Sequence[str]) -> exp.Select:
    """The per-group measurements of the grouped twin's part (``rewriters.grouped_copy``):
    grouped by the key columns whose values it stores (``group_key_column``: the keys its
    ranks bound, as the outgoing verifier checks), each distinct-unit count (a ``count_units``
    measurement, the key-release gate) as the sum of the one mark per (unit, group); the
    other measurements as in the other parts."""
    alias = query.alias
    counts_units = {m.id for m in query.measurements if _counts_units(m)}
    if len(measure_ids) > len(query.measurements):  # the gate: COUNT(DISTINCT unit)
        counts_units.add(THRESHOLD_ID)
    out: list[exp.Expr] = [exp.alias_(group_key_column(alias, k.expr.name), k.id, copy=False)
                           for k in query.keys]
    for column in columns[len(query.keys):]:
        out.append(exp.alias_(first_of_group(alias), column.alias, copy=False)
                   if column.alias in counts_units else column.copy())
    return exp.select(*out).from_(rows.subquery(alias, copy=False), copy=False).group_by(
        *[group_key_column(alias, k.expr.name) for k in query.keys], copy=False)


def _counts_units(m: Measurement) -> bool:
    """Whether ``m`` is the COUNT(DISTINCT unit) of one table's rows (a join names the unit
    column it counts: not this)."""
    return m.kind == "count_units" and m.argument is None


def adds_up_over_parts(query: AggregateQuery) -> bool:
    """Whether each measurement of ``query`` over the ranked copy's two branches is the sum of
    its values over each branch (``combine_branches``).  A COUNT(DISTINCT x) of a column other than
    the unit is not: one value may occur in the rows of units of both branches."""
    return not any(m.kind == "count" and isinstance(m.argument, exp.Distinct)
                   for m in query.measurements)


def released_measurements(query: AggregateQuery) -> tuple[str, ...]:
    """The noisy measurements the answer's statement returns after the outputs, in order: every
    measurement of the query (the key-release count stays inside).  They are differentially
    private like the outputs computed from them; the proxy reads them for error bars."""
    return tuple(m.id for m in query.measurements)


def filtered_rows(query: AggregateQuery, restriction: BlockRestriction | None,
                  sample: tuple[str, str] | None,
                  ranked: tuple[str, str] | None = None) -> exp.Select:
    """``SELECT alias.* FROM table WHERE <filter> AND <public keys> AND <claimed blocks>``;
    from the stored ``sample`` (keeping its ranks <= k) or the ``ranked`` copy instead."""
    alias = query.alias
    where = safety(query.where) if query.where is not None else None
    if query.thresholded:
        for key in query.keys:
            if key.public_values is not None:
                filt = public_filter(key.expr, key.public_values)
                where = filt if where is None else exp.and_(where, filt)
    if restriction is not None:
        where = blocks(where, exp.column(restriction.column, table=alias), restriction.start,
                       restriction.end, restriction.column_type, restriction.windows)
    # Qualified by the proxy's schema when known: the statement reads exactly this table.
    source = exp.Table(this=exp.to_identifier(query.table), db=exp.to_identifier(
        query.schema, quoted=True) if query.schema is not None else None)
    if sample is not None:
        source = exp.Table(this=exp.to_identifier(sample[1], quoted=True),
                           db=exp.to_identifier(sample[0]))
        if query.stability < query.table_policy.contribution_bound:
            # The sample ranks each unit's rows at random: keeping ranks <= k keeps k rows.
            cap = exp.column(RANK, table=alias) <= exp.Literal.number(query.stability)
            where = cap if where is None else exp.and_(where, cap)
    elif ranked is not None:  # bounded by the caller (ranked_contribution)
        source = exp.Table(this=exp.to_identifier(ranked[1], quoted=True),
                           db=exp.to_identifier(ranked[0]))
    source.set("alias", exp.TableAlias(this=exp.to_identifier(alias)))
    rows = exp.select(exp.Column(this=exp.Star(), table=exp.to_identifier(alias))).from_(
        source, copy=False)
    return rows.where(where, copy=False) if where is not None else rows


def cap_histogram(query: AggregateQuery, restriction: BlockRestriction | None,
                  sample: tuple[str, str] | None, starts: Sequence[int]) -> exp.Select:
    """Units per bin of their row count in the query's filtered rows (``mechanisms.caps``).

    Returns rows (bin index, units); bins without units are absent.  Its result is exact and
    stays inside the proxy: the engine adds noise before using it.
    """
    unit = query.privacy_unit
    assert unit is not None
    rows = filtered_rows(query, restriction, sample)
    # Every tree here is built fresh for this statement: the builders need not copy them.
    per_unit = (exp.select(exp.alias_(exp.Count(this=exp.Star()), "c", copy=False))
                .from_(rows.subquery("f", copy=False), copy=False)
                .group_by(exp.column(unit, table="f"), copy=False))
    ifs = [exp.If(this=exp.column("c") >= exp.Literal.number(start),
                  true=exp.Literal.number(i))
           for i, start in reversed(list(enumerate(starts)))]
    bin_index = exp.Case(ifs=ifs, default=exp.Literal.number(0))
    return (exp.select(exp.alias_(bin_index, "b", copy=False),
                       exp.alias_(exp.Count(this=exp.Star()), "n", copy=False))
            .from_(per_unit.subquery("u", copy=False), copy=False)
            .group_by(bin_index.copy(), copy=False))


def _distinct_units(alias: str, unit: str, marked: bool) -> exp.Expr:
    """``COUNT(DISTINCT alias.unit)``; ``marked`` (the grouped twin's rows of stored rank
    <= k, ``pipeline``'s marked path): the same number from its marks
    (``first_kept_of_group``)."""
    if marked:
        return first_kept_of_group(alias, unit)
    return exp.Count(this=exp.Distinct(expressions=[exp.column(unit, table=alias)]))


def _measure_sql(m: Measurement, alias: str, unit: str | None, marked: bool = False,
                 stored: TablePolicy | None = None) -> exp.Expr:
    """One measurement's exact aggregate over the rows as ``alias``; ``stored``: the policy of
    a ranked copy (or twin) those rows come from that stores its clipped values
    (``rewriters.clipping.stored_clip``), read instead of clipped per row where they are the
    same values."""
    if m.kind == "count_units" and m.argument is not None:  # a join: the unit column it names
        return exp.Count(this=exp.Distinct(expressions=[safety(m.argument)]))
    if m.kind == "count_units":
        assert unit is not None
        return _distinct_units(alias, unit, marked)
    if m.kind == "count":
        return exp.Count(this=exp.Star() if m.argument is None else safety(m.argument))
    assert m.argument is not None and m.lower is not None and m.upper is not None
    kept = None if stored is None else stored_clip(stored, m.argument, alias, m.lower,
                                                   m.upper)
    value = kept if kept is not None else clipping(safety(m.argument), m.lower, m.upper,
                                                   consume=True)
    if m.center:
        value = exp.Paren(this=exp.Sub(this=value, expression=exp.Literal.number(m.center)))
    if m.grid:  # joins: an integer number of grid steps per row (analyses.query._JOIN_GRID_STEPS)
        steps = exp.Round(this=exp.Div(this=value, expression=exp.Literal.number(m.grid)))
        return exp.cast(exp.Sum(this=exp.cast(steps, exp.DType.BIGINT, copy=False)),
                        exp.DType.BIGINT, copy=False)
    if m.kind == "sum_squares":
        value = exp.Mul(this=value, expression=value.copy())
    return exp.cast(exp.Sum(this=value), exp.DType.DOUBLE, copy=False)

