"""One private table under analytic sensitivity: the common case.

Prepare: the blocks the query reads (``analyses.blocks``), the relation it reads (the table, or
a stored bounded sample or kept set in the private schema), the noise plan
(``mechanisms.planning``), the rewrite (``rewriters.pipeline``, as a text template when the
database adds the noise: ``chorus_py.kinds.templates``) and the report.  With automatic caps or
clipping bounds the query is first prepared at the limit and the declared bounds, with a
:class:`~chorus_py.kinds.selection.Selection` to run after the claim; the chosen values give the
final statement.  Choices of an identical earlier query are reused for free
(``privacy.choice_reuse_seconds``).  Everything here is a pure function of (SQL, policy, block
windows, stored-sample names, epsilon, delta, choices) and cached per query shape.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from sqlglot import exp

from analyses.blocks import BlocksRead, blocks_read
from analyses.query import AggregateQuery
from analyses.trees import sql_text
from budget.accounting import Event, events_for_plan
from chorus_py.backends import SCHEMA
from chorus_py.caches import LRU
from chorus_py.errors import InvalidParameter
from chorus_py.kinds.analytic import (
    AnalyticQuery,
    Proxied,
    aggregate_report,
    answer_prepared,
    finish_plan,
    key_release_odds_of,
    listed_keys,
)
from chorus_py.kinds.base import Answer, Prepared, Services
from chorus_py.kinds.selection import (
    CELLS,
    COPIED,
    Choices,
    Selection,
    bounds_groups,
    cap_matters,
    cap_stays_at_limit,
    copy_cells,
    histogram_builders,
    stored_counts,
    with_contribution,
)
from chorus_py.kinds.templates import one_table_sql, proxy_texts, split_proxy_texts
from chorus_py.statements import QueryRun
from mechanisms.key_release import threshold_warning
from mechanisms.planning import NoisePlan, NoiseRequest, ThresholdRequest, plan_noise
from rewriters.blocks import BlockRestriction, month_start
from rewriters.contribution import counted_pays, streamed_pays, unit_ordered
from rewriters.dialect import rendered
from rewriters.pipeline import RewrittenQuery, adds_up_over_parts, measured_ids, pipeline
from rewriters.selection import clipped_arguments


class SingleTableKind:
    """Queries over one private table (and public tables it does not join)."""

    charges = True

    def __init__(self, services: Services) -> None:
        self.services = services
        self._prepared: LRU[tuple[object, ...], Prepared] = LRU(1024)
        self._histograms: LRU[tuple[object, ...], str] = LRU(1024)
        # The blocks a query reads, per (query, block windows): windows change when the data
        # grows (the block catalog re-reads them after its TTL), and with them the key.
        self._reads: LRU[tuple[object, ...], tuple[BlocksRead, BlockRestriction]] = LRU(1024)
        # Rewrites with their noise scales (and caps, bounds) left open (kinds.templates).
        self._templates: LRU[tuple[object, ...], object] = LRU(1024)

    def prepare(self, query: AggregateQuery, analyst: str, epsilon: float,
                delta: float, earlier: Choices | None = None) -> Prepared:
        """The query prepared for its claim; with choices still to make, at the limit and
        the declared bounds, carrying its :class:`Selection` (or the choices of an identical
        earlier query, when they may be reused: found under the selection's key, or
        ``earlier``, which a mixed query found under its own key, ``kinds.mixed``)."""
        prepared = self._prepare(query, epsilon, delta)
        if prepared.selection is None:
            return prepared
        # Kept per analyst (budget.answers): "reused" must never tell one analyst that another
        # just ran this query.
        if earlier is None:
            earlier = self.services.choices.get(analyst, prepared.selection.key)
        if earlier is not None:  # chosen (and paid for) by an identical query: all of epsilon
            return self._prepare(query, epsilon, delta, earlier, reused=True)
        return prepared

    def run(self, prepared: Prepared, run: QueryRun) -> Answer:
        """The answer (``kinds.analytic.answer_prepared``)."""
        privacy = self.services.policy.privacy
        return answer_prepared(self.services.statements, prepared, privacy.noise,
                               privacy.max_epsilon_per_query, run)

    def _prepare(self, query: AggregateQuery, epsilon: float, delta: float,
                 chosen: Choices | None = None, reused: bool = False) -> Prepared:
        """Plan and rewrite; with automatic caps or bounds (contribution / clipping = "auto"),
        at the limit and the declared bounds until ``chosen``.  ``reused``: they were chosen
        by an earlier identical query (privacy.choice_reuse_seconds), so no epsilon goes to
        choosing them."""
        services = self.services
        reads, restriction = self._blocks(query)
        sample = None
        if query.table_policy.multi_attribution:
            sample = (SCHEMA, services.attribution.relation(query.table, query.table_policy))
        elif query.table_policy.bounding == "materialized":
            sample = (SCHEMA, services.samples.relation(query.table, query.table_policy))
        ranked = None if sample is not None else \
            services.samples.ranked_relation(query.table, query.table_policy)
        # The query's own (stability, normalised SQL) and the choices determine everything
        # below: look the plan up before copying the query's trees for the choices.
        # Whether the copy's twins may be read (built, and read_twins) changes the statement.
        twins = ranked is not None and (services.samples.twin(ranked[1]),
                                        services.samples.month_twin(ranked[1]))
        grouped = services.samples.grouped_built(ranked[1]) if ranked is not None else 0
        key = (query.normalized_sql, query.stability, chosen, epsilon, delta, restriction,
               sample, ranked, twins, grouped, reused)
        prepared = self._prepared.get(key)
        if prepared is None:
            prepared = self._prepare_uncached(query, epsilon, delta, reads, restriction,
                                              sample, ranked, chosen, reused)
            self._prepared.put(key, prepared)
        return prepared

    def _prepare_uncached(self, query: AggregateQuery, epsilon: float, delta: float,
                          reads: BlocksRead | None, restriction: BlockRestriction | None,
                          sample: tuple[str, str] | None, ranked: tuple[str, str] | None,
                          chosen: Choices | None, reused: bool) -> Prepared:
        services = self.services
        asked = query
        # Calendar keys of the block column: listed over the blocks read (no threshold).
        query = listed_keys(query, {query.alias: restriction} if restriction else {})
        cap_epsilon = 0.0
        if query.auto_cap and not cap_matters(query):
            # COUNT(DISTINCT unit) alone has sensitivity 1 whatever the rows per unit: nothing
            # to choose.  Bounding after the filter keeps one row per unit; a stored sample is
            # read whole (its ranks are over the whole table: a cap of 1 would keep only each
            # unit's rank-1 row, and a filter would miss the units whose rank-1 row fails it).
            # Grouped by public keys, it has sensitivity min(k, G): the limit keeps every group
            # a unit reaches (a cap of 1 would count each unit in one group only).
            query = query.with_cap(1 if sample is None and not query.keys
                                   else query.table_policy.contribution_bound)
        clipped = clipped_arguments(query) if query.table_policy.auto_clipping else ()
        settled = None  # why no selection runs although the cap is "auto"
        selects = (query.auto_cap and cap_matters(query)) or bool(clipped) \
            or bounds_groups(query)
        if selects and not clipped and chosen is None and not reused:
            # A cap choice the rule cannot make is not paid for: when the test of
            # mechanisms.caps would keep the limit whatever the histogram shows (a known
            # function of the query's shape, epsilon and delta: nothing about the data), the
            # histogram is not run and its share of epsilon goes to the answer.
            share = epsilon * services.policy.privacy.cap_epsilon_share
            if cap_stays_at_limit(query, self._noise_plan(query, epsilon - share, delta),
                                  share):
                selects = False
                settled = (f"at epsilon {epsilon:g} no histogram of rows per "
                           f"{query.privacy_unit} could move this query's totals below the "
                           f"limit {query.table_policy.contribution_bound} (a unit hidden at "
                           "the limit would cost more rows than the noise saved: "
                           "mechanisms.caps, 'What the test costs'), so none is run and all "
                           "of epsilon goes to the answer")
        if selects:
            # One share of epsilon pays for every selection histogram (mechanisms.caps).
            # Reusing an earlier query's noisy choice is post-processing of that release
            # (Dwork and Roth 2014, Proposition 2.1): it costs nothing.
            cap_epsilon = 0.0 if reused else epsilon * services.policy.privacy.cap_epsilon_share
            if chosen is not None:
                query = query.with_cap(chosen.cap).with_bounds(
                    {a: (lo, hi) for a, lo, hi in chosen.bounds})
                if chosen.groups is not None:
                    query = query.with_groups(chosen.groups)
        # At the limit with the choices still to make: rendered for the plans, the report and
        # the claim; the final statement follows within the same run (not a second sighting).
        detail = self._plan(query, epsilon - cap_epsilon, delta, reads, restriction, sample,
                            ranked, sighting=not (cap_epsilon > 0 and chosen is None))
        report = aggregate_report(detail.query, detail.plan, reads, detail.sql,
                                  services.policy.privacy.noise)
        if query.auto_cap or cap_epsilon > 0 or reused:
            report = with_contribution(report, query, cap_epsilon, chosen, clipped, reused,
                                       settled)
        open_epsilon = cap_epsilon if chosen is None else 0.0  # > 0: still to choose
        # With the groups per unit still to choose, the threshold is not known yet (the one at
        # the limit would overstate it): the warning comes with the final plan.
        odds = key_release_odds_of(detail.query, detail.plan, report.epsilon) \
            if open_epsilon == 0 else None
        warning = None if odds is None else threshold_warning(
            *odds, max_epsilon=services.policy.privacy.max_epsilon_per_query)
        if warning:
            report = dataclasses.replace(report, warnings=(warning,))
        detail = dataclasses.replace(detail, cap_epsilon=open_epsilon, chosen=chosen)
        # Before it is cached, so before any claim: a refused statement costs nothing.
        # With choices to make, the statement at the limit and the one at the choices differ
        # in numbers only (the verifier proves it from their tokens).
        services.statements.verify_outgoing(detail.sql, services.release, query.tables,
                                            variants=bool(selects),
                                            groups=detail.query.bounded_groups,
                                            cap=detail.query.stability, gate=detail.plan.gate)
        # While the row cap is still to be chosen the final mechanisms are not known yet: the
        # query's (epsilon, delta) itself, whose Renyi curve bounds that of any mechanism of
        # that cost.
        events = (events_for_plan(detail.plan) if open_epsilon == 0 else
                  (Event.epsilon_delta(report.epsilon, report.delta),))
        selection = None
        statements: tuple[str, ...] = (detail.sql,)
        if open_epsilon > 0:
            # Everything the selection depends on that is public: the query, its epsilon and
            # delta (the rule weighs noise against bias) and the blocks it reads.  Never
            # anything that follows the data (a stored sample's name changes with a
            # fingerprint of the rows): whether the choices are reused shows in the report,
            # and must not tell an analyst that rows changed (as budget.answers explains).
            stored = self._stored_counts(query, ranked)
            # A filtered query's cells read the copy's filtered rows instead of the table's
            # (the same rows), so that their exact result is remembered by the copy's name.
            copy = ranked if stored is None and copy_cells(query) else None
            # Or from the copy's twin in unit order, once built, when that pays; on Postgres
            # cut in two at the twin's middle, run side by side (``choice_histogram``'s part).
            middle = None
            if copy is not None and services.samples.twin(copy[1]):
                middle = services.samples.middle(copy[1])  # None off Postgres
                if cells_twin_pays(*_share(services, query, reads), halves=middle is not None):
                    copy = (copy[0], unit_ordered(copy[1]))
                else:
                    middle = None
            # Groups per unit over every row of the copy: from its grouped twin, once built
            # (a result kept in memory, like the stored counts').
            grouped = self._grouped_twin(query, ranked) \
                if stored is not None and bounds_groups(query) else None
            histograms, parts = self._selection_statements(detail, stored, copy, grouped,
                                                           middle)
            selection = Selection(
                detail.query, detail.plan, open_epsilon, histograms,
                (asked.normalized_sql, epsilon, delta, restriction),
                lambda chosen: self._prepare(asked, epsilon, delta, chosen),
                frozenset({("groups",)}) if grouped is not None else frozenset(), parts)
            # What is sent: the cells' parts instead of the whole when cut.
            statements += tuple(sql for what, _, sql in histograms
                                if not (parts and what == CELLS)) + parts
        return Prepared(report, reads.ids if reads is not None else (query.table,), events,
                        detail, statements=statements,
                        finish=finish_plan(detail) if detail.proxied is not None else None,
                        answer_key=(asked.normalized_sql, epsilon, delta, report.blocks),
                        selection=selection)

    def _plan(self, query: AggregateQuery, epsilon: float, delta: float,
              reads: BlocksRead | None, restriction: BlockRestriction | None,
              sample: tuple[str, str] | None, ranked: tuple[str, str] | None = None,
              sighting: bool = True) -> AnalyticQuery:
        """The noise plan and the rewritten statement (bounding from the ``ranked`` copy when
        there is one)."""
        services = self.services
        plan = self._noise_plan(query, epsilon, delta)
        # Every row of the copy passes the query's filter: its stored ranks <= k are the kept
        # rows (a plain scan instead of the light and heavy branches; the same rows).  Not with
        # g groups per unit: the heavy units' rows are then ranked after the group bound.
        grouped = query.max_groups is not None and query.max_groups < query.stability
        every_row = ranked is not None and self._stored_counts(query, ranked) is not None
        whole = every_row and not grouped
        # Thresholded keys over the whole copy: its grouped twin, once built, holds each unit's
        # groups ranked (the light and middle units a plain scan: rewriters.grouped_copy);
        # without groups per unit, the first row of each (unit, group) marked, which counts a
        # group's units instead of COUNT(DISTINCT unit) (``first_kept_of_group``).
        twin_groups = self._grouped_twin(query, ranked) \
            if every_row and (grouped or query.thresholded) else None
        # A query over one calendar month reads its heavy rows from the month twin: that
        # month's rows alone, in the twin's order (``rewriters.contribution.month_ordered``).
        month = restriction.month() if ranked is not None and restriction is not None \
            and not whole and not grouped and services.samples.month_twin(ranked[1]) else None
        if month is not None and not reads_month_twin(services, query, reads, month):
            month = None
        twin = ranked is not None and not whole and not grouped \
            and services.samples.twin(ranked[1]) \
            and (month is not None or reads_twin(services, query, reads, streamed=True))
        month = month if twin else None
        # On Postgres the light branch of a month reads the month twin too (the first units
        # of its partition's index, ``month_light_pays``).
        sql_dialect = services.dialect
        light_twin = twin and (light_reads_twin(services, query, reads)
                               or (month is not None and month_light_pays(sql_dialect)))
        # Only the noise scales, caps and bounds change between calls of one query shape: its
        # statement comes from its text template (kinds.templates); the tree is not kept.
        # The heavy branch's shape follows the cap (counted_pays): in the key too, and fixed
        # for the template's probes, whose caps are not the query's.
        counted = counted_pays(sql_dialect, query.stability, twin)
        key = (query.normalized_sql, restriction, sample, ranked, whole, twin, month,
               light_twin, counted, twin_groups, sql_dialect)

        def rewrite(q: AggregateQuery, p: NoisePlan) -> RewrittenQuery:
            return pipeline(q, p, restriction, sql_dialect, sample, ranked=ranked,
                            whole=whole or twin_groups is not None, twin=twin, counted=counted,
                            grouped=twin_groups, light_twin=light_twin, month=month)

        proxied: Proxied | None = None
        if services.policy.privacy.noise == "sql":
            sql = one_table_sql(
                self._templates, key, query, plan, sql_dialect, sample is not None,
                lambda q, p: rewrite(q, p).sql_with_noise(p, consume=True), sighting)
        else:
            # The measurements' statement and the finish, templated as one text.
            def texts(q: AggregateQuery, p: NoisePlan) -> str:
                rewritten = rewrite(q, p)  # rendered once, then dropped: no copies
                return proxy_texts(rewritten.measure_sql(consume=True),
                                   sql_text(rewritten.finish, "duckdb", consume=True))

            sql, finish = split_proxy_texts(one_table_sql(
                self._templates, ("proxy", *key), query, plan, sql_dialect, sample is not None,
                texts, sighting))
            proxied = Proxied(tuple(k.id for k in query.keys), measured_ids(query, plan),
                              finish)
        return AnalyticQuery(query, plan, reads, proxied, sql, restriction, sample)

    def _grouped_twin(self, query: AggregateQuery, ranked: tuple[str, str] | None
                      ) -> tuple[str, str] | None:
        """(schema, name) of the grouped twin of the ranked copy ``ranked`` over the keys of
        ``query`` (thresholded, every row of the copy read), when its
        keys are columns of the table and its measurements add up over parts; None otherwise
        or while it is built (``BoundedSamples.grouped``)."""
        unit = query.table_policy.privacy_unit
        if ranked is None or not isinstance(unit, str) or not adds_up_over_parts(query) \
                or not all(isinstance(k.expr, exp.Column) for k in query.keys):
            return None
        block = query.table_policy.block
        name = self.services.samples.grouped(
            ranked[1], unit, tuple(k.expr.name for k in query.keys),
            block.column if block is not None else None)
        return None if name is None else (ranked[0], name)

    def _noise_plan(self, query: AggregateQuery, epsilon: float, delta: float) -> NoisePlan:
        """The split of ``epsilon`` and ``delta`` over the query's measurements (and its
        key-release threshold)."""
        requests = [NoiseRequest(m.id, m.sensitivity, m.integral) for m in query.measurements]
        threshold = None
        if query.thresholded:
            if delta <= 0:
                raise InvalidParameter(
                    "grouping by a column without public_values releases its keys through a "
                    "noisy threshold, which needs delta > 0",
                    hint="pass a small delta (e.g. 1e-8), or group by columns with public_values",
                )
            # D = min(g, k) groups per unit (AggregateQuery.groups_per_unit; k without g).
            threshold = ThresholdRequest(query.threshold_source, query.groups_per_unit)
        try:
            return plan_noise(requests, epsilon, delta, threshold,
                              self.services.policy.privacy.threshold_epsilon_share)
        except ValueError as err:  # e.g. a scale beyond what the mechanisms can render
            raise InvalidParameter(
                f"cannot calibrate noise for epsilon={epsilon:g}: {err}",
                hint="ask for a larger epsilon",
            ) from None

    def _blocks(self, query: AggregateQuery) -> tuple[BlocksRead | None, BlockRestriction | None]:
        block = query.table_policy.block
        if block is None:
            return None, None
        windows = self.services.blocks.windows(query.table, block)
        key = (query.normalized_sql, windows)  # the windows name their table
        found = self._reads.get(key)
        if found is None:
            reads = blocks_read(query, windows)
            column_type = query.table_policy.columns[block.column].type
            found = (reads, BlockRestriction(block.column, column_type, reads.start, reads.end,
                                             reads.separate_runs))
            self._reads.put(key, found)
        return found

    def _stored_counts(self, query: AggregateQuery, ranked: tuple[str, str] | None
                       ) -> tuple[str, str] | None:
        """The ranked copy when its stored row counts are the query's rows per unit
        (``kinds.selection.stored_counts``)."""
        block = query.table_policy.block
        if ranked is None or block is None:
            return stored_counts(query, None, None, ranked)
        _, restriction = self._blocks(query)
        return stored_counts(query, restriction,
                             self.services.blocks.windows(query.table, block), ranked)

    def _selection_statements(self, detail: AnalyticQuery, stored: tuple[str, str] | None,
                              copy: tuple[str, str] | None = None,
                              grouped: tuple[str, str] | None = None,
                              middle: int | None = None
                              ) -> tuple[tuple[tuple[tuple[str, ...], int, str], ...],
                                         tuple[str, ...]]:
        """The selection histograms: (what, bins, SQL) each, in the order the selection reads
        them; the cap and clipping histograms in one statement (over the ranked copy's stored
        row counts when ``stored`` names it, over its filtered rows when ``copy`` names it or
        its twin in unit order).  With the twin's ``middle``, that statement over the twin's
        rows is sent as two parts (its units of at most ``middle`` stored rows, then the
        others), run side by side: they come second, and the statement's SQL is then ``part
        UNION ALL part``, the same rows, never sent (the name its result is remembered by).
        Each SQL sent depends only on the query and the copy: built and verified once per
        query shape."""
        query = detail.query
        out, parts = [], ()
        for what, size, build in histogram_builders(query, detail.restriction, detail.sample,
                                                    one_statement=True, stored=stored,
                                                    copy=copy, dialect=self.services.dialect,
                                                    grouped=grouped):
            if what == CELLS and size == COPIED and middle is not None:
                parts = tuple(self._histogram_sql(detail, stored, copy, grouped, what, None,
                                                  (above, middle)) for above in (False, True))
                out.append((what, size, " UNION ALL ".join(parts)))
                continue
            out.append((what, size, self._histogram_sql(detail, stored, copy, grouped, what,
                                                        build)))
        return tuple(out), parts

    def _histogram_sql(self, detail: AnalyticQuery, stored: tuple[str, str] | None,
                       copy: tuple[str, str] | None, grouped: tuple[str, str] | None,
                       what: tuple[str, ...], build: Callable[[], Any] | None,
                       part: tuple[bool, int] | None = None) -> str:
        """One selection histogram's SQL (``build``'s tree, or the cells' ``part``), rendered
        and verified once per query shape."""
        query = detail.query
        key = (query.normalized_sql, detail.restriction, detail.sample, stored, copy, grouped,
               part, *what)
        sql = self._histograms.get(key)
        if sql is None:
            if build is None:
                (build,) = [b for w, _, b in histogram_builders(
                    query, detail.restriction, detail.sample, one_statement=True, stored=stored,
                    copy=copy, dialect=self.services.dialect, grouped=grouped, part=part)
                    if w == what]
            sql = rendered(build(), self.services.dialect)  # a fresh tree: no copies
            # The selection noises it in the proxy.
            self.services.statements.verify_outgoing(sql, "noised_by_proxy", query.tables)
            self._histograms.put(key, sql)
        return sql


def reads_twin(services: Services, query: AggregateQuery, reads: BlocksRead | None,
               streamed: bool = False) -> bool:
    """``twin_pays`` for ``query`` (a one-table answer, whose heavy branch over the twin is
    ``streamed`` where ``rewriters.contribution.streamed_pays`` says so, or a quantile
    histogram): the share of the schedule's blocks it reads, with its cap."""
    return twin_pays(*_share(services, query, reads), query.stability,
                     query.table_policy.contribution_bound, services.dialect,
                     streamed and streamed_pays(services.dialect, True))


def reads_month_twin(services: Services, query: AggregateQuery, reads: BlocksRead | None,
                     month: int) -> bool:
    """``month_twin_pays`` for ``query``, whose claimed blocks lie in the calendar ``month``:
    the blocks it reads and the schedule's blocks in that month."""
    policy = query.table_policy
    if policy.block is None or reads is None:
        return False
    windows = services.blocks.windows(query.table, policy.block)
    first = max(0, windows.index(month_start(month)))
    last = min(windows.count, windows.index(month_start(month + 1)))
    return month_twin_pays(len(reads.ids), last - first, services.dialect)


def month_twin_pays(read: int, blocks: int, dialect: str) -> bool:
    """Whether a query reading ``read`` of the ``blocks`` scheduled blocks of one calendar
    month reads its heavy rows from the ranked copy's month twin
    (``rewriters.contribution.month_ordered``): on DuckDB from a fifth of the month's blocks
    on.  Its heavy branch then costs one pass over the month's heavy rows, where the copy's
    window grows with the rows read.  Measured on 1M demo trips (January to March, the default
    policy, DP end to end, medians of 7; without: the twin in unit order or the copy, as
    ``twin_pays`` says): all of March (#13) 27.3 -> 19.2 ms, all of January 26.3 -> 18.4, the
    last 7 days 16.3 -> 10.5, but the last 3 days 7.6 -> 10.8 and the last day 6.9 -> 11.1
    (the copy's window over few rows wins).  On Postgres (a partition per month, read through
    its index in the window's order, both branches: ``chorus_py.stores.samples.
    partitioned_month_twin_statements``) from a third of the month's blocks on: the last 31,
    21 and 14 days of March 350 -> 248, 280 -> 168, 195 -> 145 ms, 10 days even (137 / 135),
    7 and 3 days 96 -> 108, 38 -> 70 (the copy's block index and a sort of few rows win).
    The same rows whatever it says.

    >>> [month_twin_pays(n, 31, "duckdb") for n in (31, 7, 3)]
    [True, True, False]
    >>> [month_twin_pays(n, 31, "postgres") for n in (31, 11, 10, 7)]
    [True, True, False, False]
    """
    return blocks > 0 and (5 if dialect == "duckdb" else 3) * read >= blocks


def light_reads_twin(services: Services, query: AggregateQuery, reads: BlocksRead | None
                     ) -> bool:
    """``light_twin_pays`` for ``query``, as ``reads_twin``."""
    return light_twin_pays(*_share(services, query, reads))


def _share(services: Services, query: AggregateQuery, reads: BlocksRead | None
           ) -> tuple[int, int]:
    """(blocks read, blocks in the schedule) of ``query``; (1, 1) without blocks."""
    policy = query.table_policy
    if policy.block is None or reads is None:  # no blocks: the whole table is read
        return 1, 1
    return len(reads.ids), services.blocks.windows(query.table, policy.block).count


def month_light_pays(dialect: str) -> bool:
    """Whether the light branch of a query whose heavy branch reads the month twin reads it
    too: on Postgres, whose month twin holds each month in a partition of its own, sorted and
    indexed by the unit's row count first, so ``__chorus_unit_rows <= k`` reads the first
    pages of that month's index; the copy's index on the count finds the light units' rows
    of every month, scattered over the whole copy (1M demo trips, March at cap 2: 13,617
    heap pages for 15,195 rows of March, 30-140 ms, against 234 pages, 15 ms).  DuckDB's
    copy in block order already skips the other months.  The same rows either way.

    >>> month_light_pays("postgres"), month_light_pays("duckdb")
    (True, False)
    """
    return dialect == "postgres"


def light_twin_pays(read: int, blocks: int) -> bool:
    """Whether a query whose heavy branch reads the twin (``twin_pays``) reads its light
    branch (the units of at most k rows) from the twin too: when the query reads the whole
    schedule.  The copy's block order then skips nothing, and the twin holds its units by
    their row counts, so ``__chorus_unit_rows <= k`` reads its first rows only: on DuckDB it
    skips the heavier units' row groups by their min/max, on Postgres it reads the first pages
    of the twin's index where the copy's index on the count finds the same rows scattered over
    the whole copy.  Measured on 1M demo trips, DuckDB (the light branch alone, medians of
    21-41): cap 4 2.9 -> 1.3 ms, cap 2 1.8 -> 1.0, cap 3 3.6 -> 1.2, cap 28 10.3 -> 7.2, cap
    150 4.1 -> 3.6; at cap 200, where nothing is skipped, even (2.9 / 2.9, 9.7 / 9.1, 5.2 /
    5.6).  Postgres (held-out ``AVG(distance_km) WHERE fare BETWEEN 10 AND 20``, its whole
    answer statement, medians of 7): cap 1 407 -> 343 ms, cap 3 419 -> 374 (the light branch
    101 -> 19 ms: 11,607 heap pages of the copy against 737 of the twin), cap 5 421 -> 376,
    cap 7 411 -> 368, cap 10 385 -> 336, cap 20 261 / 259; the light branch alone at caps
    50 and 200 even (88 / 90, 95 / 97).  Not from the cap, so the statement at the limit and
    the final one at the chosen cap stay one text with other numbers
    (``analyses.outgoing.literal_shape``).  A query over part of the schedule keeps the copy,
    whose block order (DuckDB) or block index (Postgres) skips the other blocks.  The same
    rows whatever it says.

    >>> light_twin_pays(90, 90), light_twin_pays(31, 90)
    (True, False)
    """
    return blocks > 0 and read == blocks


def cells_twin_pays(read: int, blocks: int, halves: bool = False) -> bool:
    """Whether the choices' cells of a filtered query (``rewriters.selection.choice_histogram``
    over the ranked copy's filtered rows) read the copy's twin in unit order instead: when the
    query reads at least half of the schedule's blocks, or a quarter with ``halves`` (Postgres:
    the twin's two halves run side by side, ``BoundedSamples.middle``).  Its windows are
    partitioned by the unit: over the twin they meet each unit's rows one after the other
    (DuckDB's partitions stay in cache; Postgres reads the twin's index in the partitions'
    order and sorts nothing), but the twin is not in block order, so the blocks not read are
    scanned too, which the copy's zone maps (DuckDB) or block index (Postgres) skip.  The same
    rows either way.  Measured on 1M demo trips (``benchmarks.choice_cells``, Postgres): the
    halves over March, 31 of 90 days, 106 ms against the copy's 197; over the last week 59
    against 52.

    >>> cells_twin_pays(90, 90), cells_twin_pays(45, 90), cells_twin_pays(31, 90)
    (True, True, False)
    >>> cells_twin_pays(31, 90, halves=True), cells_twin_pays(7, 90, halves=True)
    (True, False)
    """
    return blocks > 0 and (4 if halves else 2) * read >= blocks


def twin_pays(read: int, blocks: int, cap: int, limit: int, dialect: str,
              streamed: bool = False) -> bool:
    """Whether a query that reads ``read`` of the schedule's ``blocks`` blocks at row cap
    ``cap`` (of the policy's ``limit``) reads its heavy rows from the ranked copy's twin in unit
    order rather than from the copy.  The twin spares the window most of its sort, but it is
    not in block order: the whole of it is scanned, where the copy's zone maps (DuckDB) or
    block index (Postgres) skip the blocks not read.  So: when the query reads at least half
    of the blocks, or, on DuckDB, at least a quarter with a cap <= limit / 8 (nearly every
    filtered row is then in the heavy branch: the ranking it speeds up is of most of the rows
    read).  Not that on Postgres, whose window sorts either way: the twin saves it less than
    the skipped blocks (1M demo trips, March of January-March at cap 2: 3.51x -> 3.54x and
    4.32x -> 4.55x the raw query in two runs).  Measured: ``benchmarks.unit_order``.  A heavy
    branch ``streamed`` over the twin (DuckDB, ``rewriters.contribution.streamed_rank``) costs
    about one pass over the twin's heavy rows whatever the share, and the window over the
    copy grows with the rows it ranks: the twin from a sixteenth of the blocks on (1M demo
    trips, the heavy rows of the last d days alone, medians of 9, copy window / twin
    streamed: d = 3 at caps 2, 9, 30: 4.6 / 7.0, 4.1 / 5.7, 2.6 / 3.3 ms; d = 7: 12.6 /
    8.0, 7.8 / 5.9, 4.2 / 3.2; d = 22: 39.0 / 9.7, 34.7 / 7.4, 10.2 / 4.0).  Whatever it
    says, the kept rows are the same.

    >>> twin_pays(90, 90, 200, 200, "duckdb"), twin_pays(31, 90, 2, 200, "duckdb")
    (True, True)
    >>> twin_pays(31, 90, 50, 200, "duckdb"), twin_pays(31, 90, 2, 200, "postgres")
    (False, False)
    >>> twin_pays(7, 90, 50, 200, "duckdb", streamed=True)
    True
    """
    if streamed:
        return blocks > 0 and 16 * read >= blocks
    quarter = dialect == "duckdb" and 8 * cap <= limit
    return blocks > 0 and (2 * read >= blocks or (quarter and 4 * read >= blocks))
