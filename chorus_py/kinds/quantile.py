"""DP quantiles, MEDIAN, MIN and MAX under analytic sensitivity: the exponential mechanism.

Prepare: the query is analysed by ``analyses.quantiles`` (the ordinary analysis, with each
quantile in place of a SUM), its blocks by ``analyses.blocks``, and each distinct quantiled
value gets one histogram statement (``rewriters.quantiles``: one scan, all groups, :data:`BINS`
bins over the declared bounds).  Epsilon is split equally over the quantiles (basic
composition); the quantiles of one column (two or more, at most ``MAX_JOINT``) are drawn
together by the joint exponential mechanism (``mechanisms.joint_quantiles``) at the sum of
their shares, which beats drawing them one by one at the demo's sizes (benchmarks/RESULTS.md,
"quantiles"); each mechanism costs a pure epsilon-DP event.

Run, after the claim: the database returns the exact histograms (they stay in the proxy), the
proxy draws each quantile's bin with the exponential mechanism (``mechanisms.exponential``,
os.urandom), per group, and a value uniformly in the bin; the outputs, HAVING, ORDER BY and
LIMIT are then computed over those values in the scratch DuckDB (post-processing).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import weakref
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from types import MappingProxyType
from typing import Any, Literal, TypeVar

import numpy as np
from sqlglot import exp

from analyses.blocks import BlocksRead, blocks_read
from analyses.join_groups import groups_per_unit
from analyses.keys import TableKeys
from analyses.quantile_joins import join_rows_per_unit
from analyses.quantiles import (
    QuantileQuery,
    QuantileSpec,
    analyze_quantiles,
    asks_quantiles,
    declared_type,
)
from analyses.query import AggregateQuery, PublicQuery, display_sql
from analyses.trees import dialect_named, sql_text
from budget.accounting import Event
from chorus_py.backends import SCHEMA, ResultSet
from chorus_py.caches import LRU, WeightedLRU
from chorus_py.errors import InvalidParameter, QueryRefused
from chorus_py.kinds.analytic import listed_keys
from chorus_py.kinds.base import Answer, Prepared, Services
from chorus_py.kinds.finish import Column, finish_rows, noisy_table
from chorus_py.kinds.join import join_blocks, join_copies
from chorus_py.kinds.quantile_selection import QuantileSelection, quantile_histograms
from chorus_py.kinds.selection import Choices, remembers, stored_counts, with_contribution
from chorus_py.kinds.single import light_reads_twin, reads_twin
from chorus_py.report import ColumnReport, KeyRelease, MeasurementReport, PrivacyReport
from chorus_py.statements import QueryRun
from mechanisms.discrete_laplace import DiscreteLaplace
from mechanisms.exponential import ExponentialMechanism, bin_value, rank_sensitivity, rank_utility
from mechanisms.intervals import Interval, NoInterval
from mechanisms.joint_quantiles import MAX_JOINT, JointQuantiles, cut_value
from mechanisms.thresholding import key_release_threshold
from rewriters.bins import BINS, stored_bin
from rewriters.blocks import BlockRestriction
from rewriters.contribution import counted_pays, presorted_pays
from rewriters.dialect import rendered
from rewriters.keys import key_grid
from rewriters.pipeline import SPLIT_DIALECTS
from rewriters.quantiles import (
    UNITS_COLUMN,
    groups_bounded,
    quantile_finish,
    quantile_group_units,
    quantile_histogram,
    quantile_join_histogram,
)

T = TypeVar("T")
#: A joint mechanism's kept tables of one argument's histogram (``QuantileKind._joint_tables``).
JointTables = Callable[[JointQuantiles, str], tuple[np.ndarray, np.ndarray, list[np.ndarray]]]
#: The most bytes of joint tables kept (two quantiles of one group: about 320 kB).
JOINT_TABLES_BYTES = 32 << 20

#: The most (group, bin) cells one histogram may return.
MAX_CELLS = 2_000_000
#: Keys without public values: the share of epsilon of their key-release count (the analytic
#: kind's default, ``mechanisms.planning.plan_noise``'s threshold_share).
GATE_SHARE = 0.2
#: The DuckDB type of a key released by a threshold, from its column's declared type.
_DECLARED = {"int": "BIGINT", "float": "DOUBLE", "text": "VARCHAR", "bool": "BOOLEAN",
             "date": "DATE", "timestamp": "TIMESTAMP"}


@dataclass(frozen=True)
class KeyGate:
    """Keys without public values, released by a noisy count above a threshold.

    Two counts can gate a group; with k the row cap, D = min(g, k) the most groups one unit's
    rows reach (``AggregateQuery.groups_per_unit``; g the groups-per-unit bound chosen with an
    automatic cap, or none), epsilon_t the gate's epsilon and delta its delta:

    - ``rows``: the group's bounded rows (the sum of its histogram).  One unit's <= k rows
      change the vector of counts by at most k in L1, so discrete Laplace of scale
      b = k / epsilon_t makes the counts of the groups present in both neighbours
      epsilon_t-DP.  A group present only with the unit holds c <= k of its rows:
      P(c + X > tau) < exp(-(tau - c) / b) <= exp(-(tau - k) / b)
      (``mechanisms.thresholding``'s tail bound), and a union bound over its <= D groups gives
      delta at tau = k + b ln(D / delta) = key_release_threshold(b, D, delta) + (k - 1).
    - ``units``: the group's distinct units among the same bounded rows
      (``rewriters.quantiles.quantile_group_units``).  A unit adds 1 to each of its <= D
      groups: L1 sensitivity D, scale b = D / epsilon_t, and a group of that unit alone counts
      1: tau = 1 + b ln(D / delta) = key_release_threshold(b, D, delta), as the analytic kinds'
      gate (``mechanisms.thresholding``).  Its statement draws its own random bounding (a
      statement of its own, like each histogram): each release is DP over its own bounded
      rows, whose per-unit bounds (<= D groups, <= k rows) do not depend on other units, and
      the releases compose; a group the gate releases without histogram rows gets a value
      drawn over its empty histogram (uniform over the bounds), as a public key's.

    Which is lower.  A group of n rows from u units (r = n / u rows per unit) clears the rows
    gate when u > tau_rows / r and the units gate when u > tau_units; with L = ln(D / delta),
    tau_rows / r = (k + (k / epsilon_t) L) / r against tau_units = 1 + (D / epsilon_t) L, so
    the units gate is the lower bar about when D r < k.  With D = k (a fixed cap, or g not
    below k) that needs r < 1, impossible: n >= u always and tau_rows - tau_units = k - 1 only,
    so the rows gate is taken.  With g bounded below k (automatic caps: g is the 99% quantile
    of groups per unit, usually far below a cap that must keep the heavy units' rows), the
    units gate is taken: by hand, k = 50, D = 2, epsilon_t = 0.18, delta = 1e-8, L = ln(2e8) =
    19.11: tau_rows = 50 + 277.8 * 19.11 = 5,359 rows, tau_units = 1 + 11.11 * 19.11 = 213.4
    units; groups of 9 rows per unit need u > 595 units under the rows gate and u > 213 under
    the units gate.  The choice reads only k and D (the policy's limit or choices made from
    noisy histograms): post-processing, nothing about the data.

    Each released group's quantiles are then drawn as with public keys: a unit's rows split
    over groups as k_1 + ... + k_D <= k move each group's rank utility by <= k_j max(p, 1 - p),
    so the draws at Delta = k max(p, 1 - p) cost epsilon_q in all (mechanisms.exponential,
    'Groups'); a group released in one neighbour only is within the delta above.
    """

    mechanism: DiscreteLaplace
    threshold: float
    delta: float
    groups_per_unit: int
    counts: Literal["rows", "units"]

    @classmethod
    def plan(cls, rows_per_unit: int, groups_per_unit: int, epsilon: float, delta: float,
             units: bool) -> KeyGate:
        """The gate at ``epsilon``: counting ``units`` (L1 sensitivity D, one unit alone
        counts 1) or rows (L1 sensitivity k, one unit alone counts <= k)."""
        l1, alone = (groups_per_unit, 1) if units else (rows_per_unit, rows_per_unit)
        mechanism = DiscreteLaplace.from_sensitivity(l1, epsilon)
        tau = key_release_threshold(mechanism.scale, groups_per_unit, delta) + (alone - 1)
        return cls(mechanism, tau, delta, groups_per_unit, "units" if units else "rows")


@dataclass(frozen=True)
class QuantileDetail:
    """The kind's state of a prepared quantile query (``Prepared.detail``)."""

    analysis: QuantileQuery
    # One per quantile, in order; the quantiles of one column drawn jointly share one.
    mechanisms: tuple[ExponentialMechanism | JointQuantiles, ...]
    histograms: tuple[tuple[str, str], ...]       # (argument SQL, statement) per argument
    groups: tuple[tuple[object, ...], ...]        # the public key combinations, in order
    finish: str
    gate: KeyGate | None = None                   # keys released by a threshold
    gate_sql: str | None = None                   # its distinct-units statement (units gate)
    # A histogram row's keys (a declared value's index, a public table's value) -> its group.
    lookup: dict[tuple[object, ...], int] = dataclasses.field(default_factory=dict)
    key_types: dict[str, str] = dataclasses.field(default_factory=dict)  # read, by key id
    # The statements (histograms, units gate) whose exact results are remembered by their
    # text (``kinds.selection.remembers``: they read only the ranked copy and its twins).
    remembered: frozenset[str] = frozenset()


@dataclass(frozen=True)
class TableGroups:
    """The key combinations of a join's keys over public tables (``rewriters.keys``), read
    from those tables before the claim: public data, so the groups answered depend on the
    policy, the query and public tables only.  ``types``: each key's DuckDB type, by id."""

    rows: tuple[tuple[object, ...], ...]
    types: dict[str, str]


class QuantileKind:
    """Quantile, MEDIAN, MIN and MAX queries of one private table."""

    charges = True

    def __init__(self, services: Services,
                 analyse: Callable[[str], AggregateQuery | PublicQuery]) -> None:
        self.services = services
        self._analyse = analyse
        self._analyses: LRU[str, QuantileQuery] = LRU(1024)
        self._prepared: LRU[tuple[object, ...], Prepared] = LRU(1024)
        # Joint mechanisms' tables of remembered histograms, by (mechanism, cells, group).
        self._tables: WeightedLRU[tuple[object, ...], tuple[
            weakref.ref[np.ndarray], tuple[np.ndarray, np.ndarray, list[np.ndarray]]]] = \
            WeightedLRU(JOINT_TABLES_BYTES)

    def accepts(self, sql: str) -> bool:
        """Whether ``sql`` asks a quantile, MIN or MAX."""
        return asks_quantiles(sql, self.services.dialect)

    def analyse(self, sql: str) -> QuantileQuery:
        """The quantile analysis of ``sql`` (cached; refusals cost nothing)."""
        found = self._analyses.get(sql)
        if found is None:
            found = analyze_quantiles(sql, self.services.dialect, self._analyse)
            self._analyses.put(sql, found)
        return found

    def prepare(self, analysis: QuantileQuery, analyst: str, epsilon: float,
                delta: float, earlier: Choices | None = None) -> Prepared:
        """Blocks, histogram statements, mechanisms, report, events: pure, nothing charged.
        With a cap to choose, the choice of an identical earlier query is reused when found
        under the selection's key, or given as ``earlier`` (a mixed query's, ``kinds.mixed``)."""
        query = analysis.query
        if query.join is not None:
            return self._prepare_join(analysis, epsilon, delta)
        reads, restriction = self._blocks(query)
        # Calendar keys of the block column: listed over the blocks read (analyses.keys).
        listed = listed_keys(query, {query.alias: restriction} if restriction else {})
        if listed is not query:
            analysis = dataclasses.replace(analysis, query=listed)
            query = listed
        sample = None
        if query.table_policy.multi_attribution:
            sample = (SCHEMA, self.services.attribution.relation(query.table,
                                                                 query.table_policy))
        elif query.table_policy.bounding == "materialized":
            sample = (SCHEMA, self.services.samples.relation(query.table, query.table_policy))
        prepared = self._cached(analysis, epsilon, delta, reads, restriction, sample)
        if prepared.selection is None:
            return prepared
        # Kept per analyst (budget.answers): "reused" must never tell one analyst that another
        # just ran this query.
        if earlier is None:
            earlier = self.services.choices.get(analyst, prepared.selection.key)
        if earlier is not None:  # chosen (and paid for) by an identical query: all of epsilon
            return self._cached(analysis, epsilon, delta, reads, restriction, sample, earlier,
                                reused=True)
        return prepared

    def _cached(self, analysis: QuantileQuery, epsilon: float, delta: float,
                reads: BlocksRead | None, restriction: BlockRestriction | None,
                sample: tuple[str, str] | None, chosen: Choices | None = None,
                reused: bool = False) -> Prepared:
        # The ranked copy is looked up on every call (the selection's final plan too): its
        # name changes with the table's version, and is part of the key, so a plan over a
        # replaced copy is never taken from the cache.
        ranked = self._ranked(analysis.query, sample)
        # Whether its twin may be read (``_histogram``) is part of the key too.
        twin = ranked is not None and self.services.samples.twin(ranked[1])
        key = (analysis.shape, epsilon, delta, restriction, sample, ranked, twin, chosen,
               reused)
        prepared = self._prepared.get(key)
        if prepared is None:
            split = self.services.dialect in SPLIT_DIALECTS
            prepared = self._prepare(analysis, epsilon, delta, reads,
                                     lambda q, spec: self._histogram(
                                         q, spec, restriction, sample, ranked, split, reads),
                                     restriction=restriction, sample=sample, ranked=ranked,
                                     chosen=chosen, reused=reused)
            self._prepared.put(key, prepared)
        return prepared

    def _histogram(self, query: AggregateQuery, spec: QuantileSpec,
                   restriction: BlockRestriction | None, sample: tuple[str, str] | None,
                   ranked: tuple[str, str] | None, split: bool, reads: BlocksRead | None
                   ) -> exp.Select:
        """The histogram statement of ``spec`` at ``query``'s cap.  The heavy branch reads the
        copy's twin where ``twin_pays`` says so, as a single-table answer's does: on DuckDB
        (one statement) its per-unit top-k aggregate behind ROW_NUMBER runs 2-4x faster on
        rows in unit order at caps 2..9 (``benchmarks.kept_rank``); on Postgres (``split``)
        the twin's index, led by the unit's row count, reads the heavy units' rows from the
        twin's tail, where the copy's bitmap scan visits pages all over it (1M demo trips,
        medians of 15 alternating: the LA MIN/MAX histogram 257-279 -> 200-224 ms, per-city
        median 426 -> 374, SF 213 -> 180, MAX of a column 177 -> 161), in the order of its
        window (``presorted_pays``).  Over the copy the heavy rows are
        numbered by a running count where ``counted_pays`` says so.  Either way the very same
        rows are kept."""
        twin = ranked is not None and not groups_bounded(query) \
            and self.services.samples.twin(ranked[1]) \
            and reads_twin(self.services, query, reads)
        stored = None if ranked is None else stored_bin(
            query.table_policy, spec.argument, query.alias, spec.lower, spec.upper, BINS)
        return quantile_histogram(query, spec.argument, spec.lower, spec.upper, BINS,
                                  restriction, sample, ranked, split,
                                  counted_pays(self.services.dialect, query.stability, twin),
                                  twin, stored,
                                  twin and light_reads_twin(self.services, query, reads),
                                  presorted_pays(self.services.dialect, twin))

    def _ranked(self, query: AggregateQuery, sample: tuple[str, str] | None
                ) -> tuple[str, str] | None:
        """The ranked copy the histograms read (``rewriters.quantiles``): with per-query
        bounding of one unit column, once it is built (None while it is being built: the
        rows are ranked per query, the same kept-row distribution).  The units gate's
        distinct-units statement (``quantile_group_units``) still ranks per query."""
        if sample is not None or not isinstance(query.table_policy.privacy_unit, str):
            return None
        return self.services.samples.ranked_relation(query.table, query.table_policy)

    def _prepare_join(self, analysis: QuantileQuery, epsilon: float,
                      delta: float) -> Prepared:
        """A quantile of a join: S, the join rows one person changes, in place of the row cap
        (``analyses.quantile_joins``); every private table's blocks; each table bounded as the
        join kind bounds it (``rewriters.joins``).  S is a public constant: no cap is chosen
        (``AggregateQuery.auto_cap`` is False for a join), whatever the tables' contribution."""
        services = self.services
        query = analysis.query
        join = query.join
        assert join is not None
        reads, restrictions = join_blocks(services.blocks, query)
        query = listed_keys(query, restrictions)
        mf = services.frequencies.values(join.metrics)  # pinned or public ones only
        rows = join_rows_per_unit(join, mf)
        groups = groups_per_unit(join, [k.expr for k in query.keys], mf) \
            if query.thresholded else None
        query = dataclasses.replace(query, stability=rows, max_groups=groups)
        analysis = dataclasses.replace(analysis, query=query)
        table = self._table_groups(query)
        samples = {s.alias: (SCHEMA, services.samples.relation(s.table, s.policy))
                   for s in join.private_sources
                   if s.policy.privacy_unit and s.policy.bounding == "materialized"}
        # The ranked copies each occurrence reads, as the join kind reads them; their names
        # change with their tables' versions and are in the key: no stale copy is read.
        copies, covering = join_copies(services, join, restrictions)
        key = (analysis.shape, epsilon, delta, tuple(sorted(restrictions.items())),
               tuple(sorted(mf.items())), tuple(sorted(samples.items())),
               tuple(sorted(copies.items())), covering,
               table.rows if table is not None else None)
        prepared = self._prepared.get(key)
        if prepared is None:
            prepared = self._prepare(analysis, epsilon, delta, reads,
                                     lambda q, spec: quantile_join_histogram(
                                         q, spec.argument, spec.lower, spec.upper, BINS,
                                         restrictions, samples, copies, covering),
                                     table=table)
            self._prepared.put(key, prepared)
        return prepared

    def _table_groups(self, query: AggregateQuery) -> TableGroups | None:
        """The combinations of the keys read from joined public tables (None: no such key),
        on the connection restricted to public tables: ``SELECT DISTINCT`` of each public
        table's keys under its own conditions (``rewriters.keys``), a superset of the groups
        the join can give (the others get a quantile drawn from an empty histogram)."""
        keys = tuple(k for k in query.keys if k.public_values is None
                     and isinstance(k.domain, TableKeys))
        if not keys or query.thresholded:
            return None
        grid, _ = key_grid(dataclasses.replace(query, keys=keys))
        assert grid is not None  # no listed key here: the product is never empty by rule
        ids = ", ".join(k.id for k in keys)
        tree = exp.select(*[exp.column(k.id) for k in keys]).from_(grid.subquery("g"))
        services = self.services
        sql = rendered(tree, services.dialect)
        public = tuple(s.table for s in query.join.sources if s.public) if query.join else ()
        services.statements.verify_outgoing(sql, "exact", public)
        result = services.statements.run(sql, None, public=True)
        if len(result.rows) * BINS > MAX_CELLS:
            raise QueryRefused(f"{len(result.rows)} combinations of {ids} are too many groups "
                               "for a quantile query", hint="filter the public table's keys")
        types = {k.id: _PORTABLE_DUCK.get(t, "VARCHAR")
                 for k, t in zip(keys, result.types, strict=True)}
        return TableGroups(tuple(tuple(r) for r in result.rows), types)

    def _prepare(self, analysis: QuantileQuery, epsilon: float, delta: float,
                 reads: BlocksRead | None,
                 histogram: Callable[[AggregateQuery, QuantileSpec], exp.Select], *,
                 table: TableGroups | None = None,
                 restriction: BlockRestriction | None = None,
                 sample: tuple[str, str] | None = None,
                 ranked: tuple[str, str] | None = None, chosen: Choices | None = None,
                 reused: bool = False) -> Prepared:
        """Plan and rewrite.  ``histogram`` builds a quantile's histogram statement over the
        query (of its one table, or of a join: ``table`` then holds the key combinations read
        from joined public tables); ``restriction`` and ``sample``: the one table's blocks and
        bounded copy.  With contribution = "auto" (``AggregateQuery.auto_cap``: one table with
        a privacy unit, per-query bounding; never a join, whose S is a public constant) the
        share ``privacy.cap_epsilon_share`` of epsilon pays for choosing the cap (and, for keys
        released by a threshold, the groups per unit) after the claim: until ``chosen``,
        everything is planned at the limit, with a :class:`QuantileSelection` to run; the
        quantiles (and the key-release count) share the rest.  ``reused``: the choices of an
        identical earlier query, free."""
        services = self.services
        asked = analysis
        query = analysis.query
        selects = query.auto_cap and sample is None
        cap_epsilon = 0.0
        if selects:
            cap_epsilon = 0.0 if reused else epsilon * services.policy.privacy.cap_epsilon_share
            if chosen is not None:
                query = query.with_cap(chosen.cap)
                if chosen.groups is not None:
                    query = query.with_groups(chosen.groups)
                analysis = dataclasses.replace(analysis, query=query)
        gate = None
        rest = epsilon - cap_epsilon  # the answer's epsilon: the key release and the quantiles
        lookup: dict[tuple[object, ...], int] = {}
        if query.thresholded:  # the groups are the data's: none listed, a noisy gate
            groups: tuple[tuple[object, ...], ...] = ()
        else:
            groups, lookup = _public_groups(query, table)
        if query.keys and len(groups) * BINS > MAX_CELLS:
            raise QueryRefused(f"{len(groups)} groups of {BINS} bins each are too many for a "
                               "quantile query", hint="filter the group keys to fewer values")
        try:
            if query.thresholded:
                if not 0 < delta < 1:
                    raise InvalidParameter(
                        "a quantile grouped by a column without public_values releases its "
                        "groups by a noisy threshold, which needs delta > 0",
                        hint="pass a delta, e.g. 1e-7")
                gate = KeyGate.plan(query.stability, query.groups_per_unit,
                                    rest * GATE_SHARE, delta, units=_counts_units(query))
            eps_q = rest * (1 - GATE_SHARE) if gate else rest
            mechanisms = plan_quantiles(analysis, eps_q)
        except ValueError as err:
            raise InvalidParameter(f"cannot calibrate the exponential mechanism: {err}",
                                   hint="ask for a larger epsilon") from None
        histograms = []
        remembered = set()
        for argument in analysis.arguments:
            spec = next(q for q in analysis.quantiles if sql_text(q.argument) == argument)
            tree = histogram(query, spec)
            kept = remembers(tree, ranked)  # before the dialect's rendering of RANDOM()
            sql = rendered(tree, services.dialect)
            if kept:
                remembered.add(sql)
            # Grouped by the keys, then the bins: the groups bound is the keys'.
            services.statements.verify_outgoing(sql, "noised_by_proxy", query.tables,
                                                groups=query.bounded_groups,
                                                group_keys=len(query.keys),
                                                cap=query.stability)
            histograms.append((argument, sql))
        finish = quantile_finish(query.outputs, query.having, query.order, query.limit,
                                 query.offset).sql(dialect_named("duckdb"))
        gate_sql = None
        if query.thresholded and (_counts_units(query) or (selects and chosen is None)):
            # The units gate's statement; at the limit too, before the choice, so that the
            # database plans it before the claim (the choice may take the units gate).
            first = analysis.quantiles[0].argument
            gate_tree = quantile_group_units(query, first, restriction)
            kept = remembers(gate_tree, ranked)
            gate_sql = rendered(gate_tree, services.dialect)
            if kept:
                remembered.add(gate_sql)
            services.statements.verify_outgoing(gate_sql, "noised_by_proxy", query.tables,
                                                groups=query.bounded_groups,
                                                cap=query.stability, gate=UNITS_COLUMN)
        detail = QuantileDetail(analysis, mechanisms, tuple(histograms), groups, finish, gate,
                                gate_sql if _counts_units(query) else None, lookup,
                                table.types if table is not None else {},
                                frozenset(remembered))
        report = _report(analysis, mechanisms, reads,
                         "\n".join(sql for _, sql in histograms), rest, gate, selects)
        if selects:  # the selection steps; the report's epsilon becomes rest + cap_epsilon
            report = with_contribution(report, query, cap_epsilon, chosen, (), reused)
        events = tuple(Event.epsilon_delta(m.epsilon) for m in _distinct(mechanisms))
        if gate is not None:
            events += (Event.from_mechanism(gate.mechanism), Event.key_release(gate.delta))
        statements = tuple(sql for _, sql in histograms) + ((gate_sql,) if gate_sql else ())
        selection = None
        if selects and chosen is None and not reused:
            # Until the cap is chosen the final mechanisms are not known: the claim is the
            # query's (epsilon, delta) itself, whose Renyi curve bounds that of any mechanisms
            # of that cost (as kinds.single does); the selection's share is in it.
            events = (Event.epsilon_delta(report.epsilon, report.delta),)
            selection = self._selection(asked, epsilon, delta, eps_q, restriction, ranked,
                                        lambda c: self._cached(asked, epsilon, delta, reads,
                                                               restriction, sample, c),
                                        cap_epsilon, max(len(groups), 1))
            statements += tuple(sql for _, _, sql in selection.histograms)
        return Prepared(report, reads.ids if reads is not None else query.tables, events,
                        detail, statements=statements,
                        finish=(noisy_table(_columns(detail)), finish),
                        answer_key=(analysis.shape, epsilon, report.delta, report.blocks),
                        selection=selection)

    def _selection(self, analysis: QuantileQuery, epsilon: float, delta: float, eps_q: float,
                   restriction: BlockRestriction | None, ranked: tuple[str, str] | None,
                   apply: Callable[[Choices], Prepared], cap_epsilon: float, groups: int
                   ) -> QuantileSelection:
        """The cap choice of ``analysis`` (asked at the limit, one table): its histograms'
        SQL, built and verified before the claim (wall 6), and the rule's rank errors at every
        cap, from the mechanisms the quantiles would be drawn with at ``eps_q``; ``groups``:
        the public groups (1 without keys or with keys released by a threshold)."""
        query = analysis.query
        block = query.table_policy.block
        windows = None if block is None or ranked is None \
            else self.services.blocks.windows(query.table, block)
        histograms = []
        for what, size, build in quantile_histograms(
                query, restriction, stored_counts(query, restriction, windows, ranked)):
            sql = rendered(build(), self.services.dialect)
            # The selection noises it in the proxy.
            self.services.statements.verify_outgoing(sql, "noised_by_proxy", query.tables)
            histograms.append((what, size, sql))

        # A pure function of k (public inputs): kept, since the selection runs again with
        # the prepared query it belongs to (a mixed query chooses on every run).
        @functools.cache
        def rank_error(k: int) -> float:
            try:  # a cap the mechanisms cannot be calibrated at is never chosen
                capped = dataclasses.replace(analysis, query=query.with_cap(k))
                return sum(_rank_error(m) for m in plan_quantiles(capped, eps_q))
            except ValueError:
                return math.inf

        return QuantileSelection(
            query, cap_epsilon, tuple(q.p for q in analysis.quantiles), rank_error, groups,
            tuple(histograms), ("quantile", analysis.shape, epsilon, delta, restriction), apply)

    def run(self, prepared: Prepared, run: QueryRun) -> Answer:
        """Histograms from the database, bins drawn here, the outputs finished here."""
        detail: QuantileDetail = prepared.detail
        if detail.gate is not None:
            return self._run_gated(detail, detail.gate, run)
        analysis = detail.analysis
        n_keys = len(analysis.query.keys)
        n_groups = len(detail.groups) if n_keys else 1
        counts: dict[str, np.ndarray] = {}
        # Keys by the index of their declared value, bins, counts: all integers, read
        # column-wise (no Python object per histogram row on DuckDB).
        integers = all(k.public_values is not None for k in analysis.query.keys)

        def cells(result: Any) -> np.ndarray:
            dense = _index_cells(result, detail.lookup, n_groups) if integers else \
                _cells(result.rows, analysis.query, detail.lookup, n_groups)
            dense.flags.writeable = False  # when remembered, shared by later queries
            return dense

        for argument, sql in detail.histograms:
            # exact: never leaves this method
            counts[argument] = self._exact(detail, sql, run, ("cells", detail.groups), cells,
                                           integers)
        remembered = {a for a, sql in detail.histograms if sql in detail.remembered}
        rows = []
        for g in range(n_groups):
            values = _draw(detail, {a: c[g] for a, c in counts.items()},
                           lambda m, a, g=g, cells=counts: self._joint_tables(
                               m, cells[a], g, a in remembered))
            keys = detail.groups[g] if n_keys else ()
            rows.append((*keys, *values))
        del counts
        result = self._finish(detail, rows)
        return Answer(result, _RankBars(detail, len(result.rows)))

    def _run_gated(self, detail: QuantileDetail, gate: KeyGate, run: QueryRun) -> Answer:
        """Keys without public values: each group is released when its noisy count (distinct
        units from the gate's statement, or rows from the histograms: :class:`KeyGate`)
        clears the gate's threshold, then its quantiles are drawn as with public keys.  Exact
        counts never leave this method."""
        query = detail.analysis.query
        n_keys = len(query.keys)
        cells = {argument: self._exact(detail, sql, run, ("gated rows", n_keys),
                                       lambda result: _GatedRows.of(result.rows, n_keys))
                 for argument, sql in detail.histograms}
        if detail.gate_sql is not None:  # distinct units per group (of the first argument)
            counts = self._exact(detail, detail.gate_sql, run, ("gate counts", n_keys),
                                 lambda result: _gate_counts(result.rows, n_keys))
            groups = list(counts)
            exact = np.array([counts[g] for g in groups], dtype=float)
        else:
            # A group's count: its rows of the first argument (all arguments count the same
            # rows but for NULL values; each group is gated once, on that one histogram).
            first = cells[detail.histograms[0][0]]
            groups, exact = list(first.groups), first.totals()
        noisy = gate.mechanism.sample(exact) if groups else exact
        rows = []
        # Only the released groups' histograms are made dense (most groups of a key with
        # many values are not released).
        for g, count in zip(groups, noisy, strict=True):
            if not count > gate.threshold:
                continue
            histograms = {argument: found.dense(g) for argument, found in cells.items()}
            keys = tuple(value if key.public_values is None else key.public_values[int(value)]
                         for value, key in zip(g, query.keys, strict=True))
            rows.append((*keys, *_draw(detail, histograms)))
        del cells, exact
        result = self._finish(detail, rows)
        warnings = () if rows else (
            f"no group's noisy {'unit' if gate.counts == 'units' else 'row'} count cleared the "
            f"threshold tau = {gate.threshold:.4g} (scale {gate.mechanism.scale:g}): groups of "
            f"fewer {gate.counts} are not released; a larger epsilon lowers tau",)
        return Answer(result, _RankBars(detail, len(result.rows)), warnings)

    def _joint_tables(self, mechanism: JointQuantiles, cells: np.ndarray, group: int,
                      remembered: bool) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        """``mechanism``'s tables (``JointQuantiles.tables``: a function of the counts alone,
        no draw) of row ``group`` of ``cells``, kept while ``cells`` is a ``remembered`` (read
        only) histogram: the same query again draws afresh from the same tables, 1-2 ms
        fewer per draw over 10,000 bins.  Kept by the array itself (a weak reference: a new
        array at the same address is never taken for it)."""
        if not remembered:  # computed for this query only
            return mechanism.tables(cells[group])
        key = (mechanism, id(cells), group)
        hit = self._tables.get(key)
        if hit is not None and hit[0]() is cells:
            return hit[1]
        tables = mechanism.tables(cells[group])
        c, g, forward = tables
        for array in (c, g, *forward):  # shared by later draws: read only
            array.flags.writeable = False
        self._tables.put(key, (weakref.ref(cells), tables),
                         int(c.nbytes + g.nbytes + sum(f.nbytes for f in forward)))
        return tables

    def _exact(self, detail: QuantileDetail, sql: str, run: QueryRun, what: Hashable,
               derive: Callable[[Any], T], integers: bool = False) -> T:
        """``derive`` of the exact result of the histogram (or units gate) statement ``sql``
        (its integer columns with ``integers``): run now, or remembered by its text when it
        reads only the ranked copy (``QuantileDetail.remembered``; still exact, noised by the
        caller on every use, and counted as rows read)."""
        statements = self.services.statements
        if sql in detail.remembered:
            return statements.run_remembered(sql, run, what, derive, integers)
        return derive(statements.run_integers(sql, run) if integers
                      else statements.run(sql, run))

    def _finish(self, detail: QuantileDetail, rows: list[tuple[Any, ...]]) -> ResultSet:
        return finish_rows(self.services.statements.scratch, _columns(detail), detail.finish,
                           rows)

    def _blocks(self, query: AggregateQuery) -> tuple[BlocksRead | None,
                                                      BlockRestriction | None]:
        block = query.table_policy.block
        if block is None:
            return None, None
        reads = blocks_read(query, self.services.blocks.windows(query.table, block))
        column_type = query.table_policy.columns[block.column].type
        return reads, BlockRestriction(block.column, column_type, reads.start, reads.end,
                                       reads.separate_runs)


def _counts_units(query: AggregateQuery) -> bool:
    """Whether keys released by a threshold are gated on distinct units (:class:`KeyGate`):
    one unit column, per-query bounding, and groups per unit bounded below the cap."""
    return (isinstance(query.table_policy.privacy_unit, str) and query.auto_cap
            and query.groups_per_unit < query.stability)


def _draw(detail: QuantileDetail, histograms: dict[str, np.ndarray],
          joint_tables: JointTables | None = None) -> list[float]:
    """One group's quantiles drawn from its exact histograms (one per argument);
    ``joint_tables``: a joint mechanism's tables of an argument's histogram, when kept."""
    values = []
    cuts: dict[int, tuple[int, ...]] = {}  # one joint draw per column and group
    for spec, mechanism in zip(detail.analysis.quantiles, detail.mechanisms, strict=True):
        argument = sql_text(spec.argument)
        histogram = histograms[argument]
        if isinstance(mechanism, JointQuantiles):
            if id(mechanism) not in cuts:
                tables = joint_tables(mechanism, argument) if joint_tables else None
                cuts[id(mechanism)] = mechanism.sample(histogram, tables)
            cut = cuts[id(mechanism)][mechanism.ps.index(spec.p)]
            values.append(cut_value(cut, BINS, spec.lower, spec.upper, spec.integral))
            continue
        drawn = mechanism.sample(rank_utility(histogram, spec.p))
        values.append(bin_value(drawn, BINS, spec.lower, spec.upper, spec.integral))
    return values


def plan_quantiles(analysis: QuantileQuery, epsilon: float
                   ) -> tuple[ExponentialMechanism | JointQuantiles, ...]:
    """The mechanism of each quantile: epsilon split equally over the quantiles (basic
    composition); the 2 to MAX_JOINT quantiles of one column drawn jointly at the sum of their
    shares (one mechanism object, shared), any other alone at its share."""
    share = epsilon / len(analysis.quantiles)
    k = analysis.query.stability
    by_argument: dict[str, list[int]] = {}
    for i, q in enumerate(analysis.quantiles):
        by_argument.setdefault(sql_text(q.argument), []).append(i)
    found: dict[int, ExponentialMechanism | JointQuantiles] = {}
    for indexes in by_argument.values():
        ps = tuple(sorted({analysis.quantiles[i].p for i in indexes}))
        if 2 <= len(ps) <= MAX_JOINT:
            joint = JointQuantiles(share * len(indexes), k, ps, BINS)
            found.update(dict.fromkeys(indexes, joint))
            continue
        for i in indexes:
            found[i] = ExponentialMechanism(share, rank_sensitivity(analysis.quantiles[i].p, k))
    return tuple(found[i] for i in range(len(analysis.quantiles)))


def _distinct(mechanisms: tuple[ExponentialMechanism | JointQuantiles, ...]
              ) -> list[ExponentialMechanism | JointQuantiles]:
    """Each mechanism once (the quantiles drawn jointly share one release)."""
    return list({id(m): m for m in mechanisms}.values())


def _rank_error(mechanism: ExponentialMechanism | JointQuantiles) -> float:
    """The 95% rank error bound of a quantile drawn by ``mechanism``."""
    if isinstance(mechanism, JointQuantiles):
        return mechanism.rank_error(0.95)
    return mechanism.rank_error(BINS)


def _public_groups(query: AggregateQuery, table: TableGroups | None
                   ) -> tuple[tuple[tuple[object, ...], ...], dict[tuple[object, ...], int]]:
    """Every public group, in order (the product of the declared values and of the public
    tables' key combinations), and the group of each histogram key tuple (a declared value
    by its index, a public table's key by its value)."""
    listed = [i for i, k in enumerate(query.keys) if k.public_values is not None]
    others = [i for i in range(len(query.keys)) if i not in listed]
    factors: list[list[tuple[tuple[object, ...], tuple[object, ...]]]] = [
        [((j,), (v,)) for j, v in enumerate(query.keys[i].public_values or ())] for i in listed]
    if others:
        factors.append([(row, row) for row in (table.rows if table is not None else ())])
    order = listed + others  # the key position of each flattened factor value
    groups, lookup = [], {}
    for combo in itertools.product(*factors):
        hist, out = [None] * len(order), [None] * len(order)
        flat_hist = [v for h, _ in combo for v in h]
        flat_out = [v for _, o in combo for v in o]
        for at, h, o in zip(order, flat_hist, flat_out, strict=True):
            hist[at], out[at] = h, o
        lookup[tuple(hist)] = len(groups)
        groups.append(tuple(out))
    return tuple(groups), lookup


def _cells(rows: list[tuple[Any, ...]], query: AggregateQuery,
           lookup: dict[tuple[object, ...], int], n_groups: int) -> np.ndarray:
    """The dense (group, bin) counts of a histogram's rows (g0, ..., b, n), the groups looked
    up as ``_public_groups`` lists them (a row of no listed group is dropped: a value the
    policy does not declare, filtered already).  Column-wise (each column read once, each
    distinct key tuple looked up once, the counts added by NumPy): a grouped histogram has
    tens of thousands of rows, which a loop over the rows took 40 ms per 10,000 to add up."""
    cells = np.zeros((n_groups, BINS))
    if not rows:
        return cells
    n_keys = len(query.keys)
    # Column by column with comprehensions: zip(*rows) is far slower on many rows.
    bins = np.fromiter((row[n_keys] for row in rows), dtype=np.int64, count=len(rows))
    counts = np.fromiter((row[n_keys + 1] for row in rows), dtype=float, count=len(rows))
    if not n_keys:
        np.add.at(cells[0], bins, counts)
        return cells
    keys = [row[:n_keys] for row in rows]
    found = {k: lookup.get(_histogram_key(k, query)) for k in set(keys)}
    group = np.fromiter((-1 if found[k] is None else found[k] for k in keys), dtype=np.int64,
                        count=len(keys))
    listed = group >= 0
    np.add.at(cells, (group[listed], bins[listed]), counts[listed])
    return cells


@dataclass(frozen=True)
class _GatedRows:
    """A thresholded histogram's rows (g0, ..., b, n) column-wise, read only (it may be
    remembered): the distinct groups in order of first appearance (a row with a NULL key is
    no group here) and the rows' bins and counts sorted by group, group i's rows at
    ``starts[i]:starts[i + 1]``.  Column-wise because a key with many values (a driver) has
    hundreds of thousands of (group, bin) rows, which a per-row loop took 0.6 s to sort out."""

    groups: tuple[tuple[Any, ...], ...]
    index: Mapping[tuple[Any, ...], int]
    bins: np.ndarray
    counts: np.ndarray
    starts: np.ndarray

    @classmethod
    def of(cls, rows: Sequence[tuple[Any, ...]], n_keys: int) -> _GatedRows:
        # Column by column with comprehensions: zip(*rows) over 800,000 rows took 0.5 s.
        index: dict[tuple[Any, ...], int] = {}
        codes = np.fromiter((index.setdefault(row[:n_keys], len(index)) for row in rows),
                            dtype=np.int64, count=len(rows))
        bins = np.fromiter((row[n_keys] for row in rows), dtype=np.int64, count=len(rows))
        counts = np.fromiter((row[n_keys + 1] for row in rows), dtype=float, count=len(rows))
        groups = [g for g in index if not any(v is None for v in g)]
        if len(groups) < len(index):  # drop the rows of NULL keys, number the others again
            renumber = np.full(len(index), -1, dtype=np.int64)
            renumber[[index[g] for g in groups]] = np.arange(len(groups))
            codes = renumber[codes]
            kept = codes >= 0
            codes, bins, counts = codes[kept], bins[kept], counts[kept]
        order = np.argsort(codes, kind="stable")
        bins, counts = bins[order], counts[order]
        starts = np.searchsorted(codes[order], np.arange(len(groups) + 1))
        for array in (bins, counts, starts):
            array.flags.writeable = False
        return cls(tuple(groups), MappingProxyType({g: i for i, g in enumerate(groups)}),
                   bins, counts, starts)

    def totals(self) -> np.ndarray:
        """Each group's count: the sum of its cells (every group has at least one row)."""
        if not self.groups:
            return np.zeros(0)
        return np.add.reduceat(self.counts, self.starts[:-1])

    def dense(self, group: tuple[Any, ...]) -> np.ndarray:
        """The group's counts over the bins (zeros for a group without rows here)."""
        out = np.zeros(BINS)
        i = self.index.get(group)
        if i is not None:
            lo, hi = self.starts[i], self.starts[i + 1]
            np.add.at(out, self.bins[lo:hi], self.counts[lo:hi])
        return out


def _gate_counts(rows: Sequence[tuple[Any, ...]], n_keys: int
                 ) -> Mapping[tuple[Any, ...], float]:
    """The units gate's rows (g0, ..., count) as each group's count, read only; a row with a
    NULL key is no group here."""
    return MappingProxyType({tuple(row[:n_keys]): float(row[n_keys]) for row in rows
                             if not any(v is None for v in row[:n_keys])})


def _index_cells(columns: tuple[np.ndarray, ...], lookup: dict[tuple[object, ...], int],
                 n_groups: int) -> np.ndarray:
    """``_cells`` of a histogram whose keys are all declared values, from its int64 columns
    (g0, ..., b, n; the keys by index, NULL as -1: ``Backend.run_integers``): each distinct
    combination of indexes looked up once (``_public_groups``), one of no listed group dropped
    (a NULL, a value the policy does not declare: filtered already), the counts added by
    NumPy.  The same cells as ``_cells`` of the same rows."""
    cells = np.zeros((n_groups, BINS))
    *keys, bins, counts = columns
    if not len(bins):
        return cells
    if bins.min() < 0 or bins.max() >= BINS:  # never: every counted value has a bin
        raise ValueError("a histogram row outside the bins")
    if not keys:
        np.add.at(cells[0], bins, counts.astype(float))
        return cells
    # One int64 code per row, its indexes (NULL: -1, shifted to 0) in mixed radix: a 1-D
    # np.unique, far faster than one over rows of several columns.
    radix = [int(k.max()) + 2 for k in keys]
    code = np.zeros(len(bins), dtype=np.int64)
    for k, r in zip(keys, radix, strict=True):
        code = code * r + (k + 1)
    distinct, inverse = np.unique(code, return_inverse=True)
    found = np.fromiter((lookup.get(_indexes(int(c), radix), -1) for c in distinct),
                        dtype=np.int64, count=len(distinct))
    group = found[inverse]
    listed = group >= 0
    np.add.at(cells, (group[listed], bins[listed]), counts[listed].astype(float))
    return cells


def _indexes(code: int, radix: list[int]) -> tuple[int | None, ...]:
    """The key indexes ``_index_cells`` coded in mixed ``radix`` (-1, a NULL, as None, the
    key ``_histogram_key`` gives a NULL)."""
    out: list[int | None] = []
    for r in reversed(radix):
        code, digit = divmod(code, r)
        out.append(None if digit == 0 else digit - 1)
    return tuple(reversed(out))


def _histogram_key(values: tuple[Any, ...], query: AggregateQuery) -> tuple[object, ...]:
    """A histogram row's keys as ``_public_groups`` looks them up: declared values by index."""
    return tuple(None if v is None else int(v) if k.public_values is not None else v
                 for v, k in zip(values, query.keys, strict=True))


#: A portable result type (``chorus_py.backends.portable_type``) as a DuckDB column type.
_PORTABLE_DUCK = {"integer": "BIGINT", "float": "DOUBLE", "text": "VARCHAR", "date": "DATE",
                  "timestamp": "TIMESTAMP", "boolean": "BOOLEAN"}


def _duck_type(values: list[object]) -> str:
    if all(isinstance(v, datetime) for v in values):  # calendar keys (analyses.keys)
        return "TIMESTAMP"
    if all(isinstance(v, date) for v in values):
        return "DATE"
    if all(isinstance(v, bool) for v in values):
        return "BOOLEAN"
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return "BIGINT"
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return "DOUBLE"
    return "VARCHAR"


def key_columns(query: AggregateQuery, read: dict[str, str] | None = None) -> list[Column]:
    """The scratch relation's key columns (``k<j>``, type): typed from the declared values,
    from the type ``read`` from a public table (by key id), or from the column's declared type
    for a key released by a threshold."""
    return [(k.id, read[k.id]) if read and k.id in read
            else (k.id, _duck_type(list(k.public_values or ()) or ['?']))
            if k.public_values is not None or declared_type(query, k.expr) is None
            else (k.id, _DECLARED[declared_type(query, k.expr) or ''])
            for k in query.keys]


def _columns(detail: QuantileDetail) -> list[Column]:
    """The finish's scratch columns: key ids typed from the declared values, quantile ids."""
    return [*key_columns(detail.analysis.query, detail.key_types),
            *((q.id, "DOUBLE") for q in detail.analysis.quantiles)]


class _RankBars:
    """Error bars of a quantile answer: none in values (they would need the data's
    distribution); the reason states the rank bound of the exponential mechanism."""

    def __init__(self, detail: QuantileDetail, rows: int) -> None:
        self.detail, self.rows = detail, rows

    def intervals(self) -> tuple[tuple[Interval | NoInterval | None, ...], ...]:
        analysis = self.detail.analysis
        bounds = {q.id: (q, m) for q, m in zip(analysis.quantiles, self.detail.mechanisms,
                                               strict=True)}
        cells: list[Interval | NoInterval | None] = []
        for out in analysis.query.outputs:
            if out.key is not None or not out.measurements:
                cells.append(None)
                continue
            # The rank bound is public (epsilon, Delta, bins); a value interval would need the
            # data's distribution, which is not released.
            reasons = [f"rank within {_rank_error(m):.4g} of {q.p:g} n (95%)"
                       for q, m in (bounds[i] for i in out.measurements)]
            cells.append(NoInterval("; ".join(reasons) + ", no value interval"))
        return tuple(tuple(cells) for _ in range(self.rows))


def _rows_note(query: AggregateQuery, auto: bool) -> str:
    """What bounds one person's rows in the histogram (public inputs only); ``auto``: the
    cap k was chosen per query (never for a join)."""
    k, unit, join = query.stability, query.privacy_unit, query.join
    if join is None:
        return (f"at most {k} rows per {unit} (" + ("chosen per query from a noisy histogram "
                "of rows per unit: mechanisms.quantile_cap" if auto else "the policy's limit")
                + "), chosen at random after the filter") if unit \
            else "event level: one row per neighbour"
    caps = "; ".join(f"{s.table} ({s.alias}): at most {s.cap} rows per "
                     f"{s.policy.privacy_unit or 'row (event level)'}"
                     for s in join.private_sources)
    return (f"join: one person changes at most S = {k} join rows, the join's stability S(k) = "
            f"{join.stability.text()}, constant in k and read from the policy or public tables "
            f"only (analyses.quantile_joins); {caps}, chosen at random after their filters")


def _report(analysis: QuantileQuery,
            mechanisms: tuple[ExponentialMechanism | JointQuantiles, ...],
            reads: BlocksRead | None, sql: str, epsilon: float,
            gate: KeyGate | None = None, auto: bool = False) -> PrivacyReport:
    """The report: each quantile's mechanism, epsilon and utility sensitivity; the bins drawn
    in the proxy whatever ``privacy.noise`` says (the selection needs the histogram).
    ``epsilon``: the answer's (without a cap selection's share, which ``kinds.selection.
    with_contribution`` adds with its steps); ``auto``: the cap is chosen per query."""
    query = analysis.query
    k, unit = query.stability, query.privacy_unit
    measurements = []
    for q, m in zip(analysis.quantiles, mechanisms, strict=True):
        width = (q.upper - q.lower) / BINS
        who = (f"person's <= S = {k} join rows" if query.join is not None
               else f"{unit}'s <= {k} rows" if unit else "row (event level)")
        why = ("rank utility u = -dist(p n, ranks of the bin), one " + who
               + f" move it by <= k max(p, 1 - p) = {k} * {max(q.p, 1 - q.p):g} = "
               f"{m.sensitivity:g} (mechanisms.exponential)")
        if isinstance(m, JointQuantiles):
            why = (f"drawn jointly with the other quantiles of {display_sql(q.argument)} "
                   f"(p = {', '.join(f'{p:g}' for p in m.ps)}): utility u = -sum over the gaps "
                   "between consecutive cuts of |count - asked count|, one " + who
                   + f" move it by <= 2k = {m.sensitivity:g} (mechanisms.joint_quantiles)")
        measurements.append(MeasurementReport(
            q.id, f"{q.function} = the {q.p:g}-quantile of {display_sql(q.argument)} "
            f"clipped to [{q.lower:g}, {q.upper:g}]", m.sensitivity, why,
            {**m.describe(), "bins": BINS, "bin_width": width,
             "rank_error_95": _rank_error(m)}, None))
    by_id = {q.id: (q, m) for q, m in zip(analysis.quantiles, mechanisms, strict=True)}
    columns = []
    for out in query.outputs:
        if out.key is not None:
            columns.append(ColumnReport(out.name, "group_key", out.source, ()))
        elif not out.measurements:
            columns.append(ColumnReport(out.name, "constant", out.source, ()))
        elif sql_text(out.expr) in by_id:
            # scale: the mechanism's 2 Delta / epsilon (utility units, i.e. ranks); its 95%
            # error in values is data-dependent (not shown), in ranks it is in the note.
            q, m = by_id[sql_text(out.expr)]
            columns.append(ColumnReport(
                out.name, "aggregate", out.source, out.measurements, m.name,
                2 * m.sensitivity / m.epsilon,
                note=f"95% rank error within {_rank_error(m):.4g} values of {q.p:g} n"))
        else:
            columns.append(ColumnReport(out.name, "derived", out.source, out.measurements,
                                        note="post-processing of DP quantiles: "
                                        + sql_text(out.expr)))
    joint = [m for m in _distinct(mechanisms) if isinstance(m, JointQuantiles)]
    eps_q = epsilon * (1 - GATE_SHARE) if gate is not None else epsilon
    notes = [f"exponential mechanism over {BINS} bins of the declared bounds, the bin drawn by "
             "the proxy from os.urandom and a value uniform in it; epsilon split equally over "
             f"{len(mechanisms)} quantile(s): {eps_q / len(mechanisms):g} each",
             "" if not joint else "the quantiles of one column are drawn jointly (joint "
             "exponential mechanism, Gillenwater et al. 2021) at the sum of their shares, "
             "each as a cut between bins: " + "; ".join(
                 f"p = {', '.join(f'{p:g}' for p in m.ps)} at epsilon {m.epsilon:g}"
                 for m in joint),
             "MIN and MAX are the DP 1st and 99th percentiles, not the minimum and maximum"
             if any(q.function in ("MIN", "MAX") for q in analysis.quantiles) else "",
             _rows_note(query, auto),
             "the error is stated in ranks (mechanism.rank_error_95): a value interval would "
             "need the data's distribution"]
    key_release = KeyRelease("public_values", note="every declared value, nothing else") \
        if query.keys else None
    if gate is not None:
        b, d = gate.mechanism.scale, gate.groups_per_unit
        if gate.counts == "units":
            measurements.append(MeasurementReport(
                "t0", f"COUNT(DISTINCT {unit}) per group (key release)", float(d),
                f"one {unit} counts 1 in each of the <= D = min(g, k) = {d} groups its rows are "
                f"kept in (L1): discrete Laplace of scale b = {d} / "
                f"{gate.mechanism.epsilon:g}",
                {**gate.mechanism.describe(), "share_of_epsilon": GATE_SHARE}, None))
            rule = (f"tau = 1 + b ln(D / delta) = 1 + {b:g} ln({d} / {gate.delta:g}) = "
                    f"{gate.threshold:.6g}: a group of one {unit}'s rows counts 1, and a unit "
                    f"reaches <= D = {d} groups")
        else:
            measurements.append(MeasurementReport(
                "t0", "COUNT(*) per group (key release)", float(k),
                f"one {unit or 'row'}'s <= {k} rows change the groups' row counts by <= {k} "
                f"in all (L1): discrete Laplace of scale b = {k} / {gate.mechanism.epsilon:g}",
                {**gate.mechanism.describe(), "share_of_epsilon": GATE_SHARE}, None))
            rule = (f"tau = k + b ln(D / delta) = {k} + {b:g} ln({d} / {gate.delta:g}) = "
                    f"{gate.threshold:.6g}: a group of one unit's rows holds <= k = {k} of "
                    f"them, and a unit reaches <= D = {d} groups")
        key_release = KeyRelease(
            "threshold", gate.threshold, "t0", gate.delta,
            note=f"a group is released only if its noisy {gate.counts[:-1]} count (t0, scale "
            f"{b:g}) exceeds " + rule)
        notes[0] = notes[0].replace(
            "epsilon split equally over", f"epsilon {epsilon:g}: {GATE_SHARE:g} of it to the "
            f"key-release count, the rest ({eps_q:g}) split equally over")
        notes.append("groups: released by a noisy threshold; a unit's <= k rows spread over "
                     "groups cost epsilon in all (mechanisms.exponential, 'Groups')")
    elif query.keys:
        notes.append("groups: every declared public value; a unit's <= k rows spread over "
                     "groups cost epsilon in all (mechanisms.exponential, 'Groups')")
    return PrivacyReport(
        analyst="", verdict="allowed", charged=False, epsilon=epsilon,
        delta=gate.delta if gate is not None else 0.0,
        noise="proxy", tables=query.tables,
        blocks=reads.ids if reads is not None else query.tables, stability=k,
        privacy_unit=unit, measurements=tuple(measurements), columns=tuple(columns),
        key_release=key_release, rewritten_sql=sql, notes=tuple(n for n in notes if n))

