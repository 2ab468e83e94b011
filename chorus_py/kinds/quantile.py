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
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any, Literal

import numpy as np
from sqlglot import exp

from analyses.blocks import BlocksRead, blocks_read
from analyses.quantiles import QuantileQuery, analyze_quantiles, asks_quantiles
from analyses.query import AggregateQuery, PublicQuery, display_sql
from budget.accounting import Event
from chorus_py.backends import SCHEMA, ResultSet, portable_type
from chorus_py.caches import LRU
from chorus_py.errors import BackendError, InvalidParameter, QueryRefused
from chorus_py.kinds.analytic import listed_keys
from chorus_py.kinds.base import Answer, Prepared, Services
from chorus_py.kinds.quantile_selection import QuantileSelection, quantile_histograms
from chorus_py.kinds.selection import Choices, with_contribution
from chorus_py.report import ColumnReport, KeyRelease, MeasurementReport, PrivacyReport
from chorus_py.statements import QueryRun
from mechanisms.discrete_laplace import DiscreteLaplace
from mechanisms.exponential import ExponentialMechanism, bin_value, rank_sensitivity, rank_utility
from mechanisms.intervals import Interval, NoInterval
from mechanisms.joint_quantiles import MAX_JOINT, JointQuantiles, cut_value
from mechanisms.thresholding import key_release_threshold
from rewriters.blocks import BlockRestriction
from rewriters.dialect import dialect
from rewriters.pipeline import NOISY
from rewriters.quantiles import quantile_finish, quantile_group_units, quantile_histogram

#: Bins of the histogram over [lower, upper]: the answer's resolution is (upper - lower) / BINS.
BINS = 10_000
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


class QuantileKind:
    """Quantile, MEDIAN, MIN and MAX queries of one private table."""

    charges = True

    def __init__(self, services: Services,
                 analyse: Callable[[str], AggregateQuery | PublicQuery]) -> None:
        self.services = services
        self._analyse = analyse
        self._analyses: LRU[str, QuantileQuery] = LRU(1024)
        self._prepared: LRU[tuple[object, ...], Prepared] = LRU(1024)

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
                delta: float) -> Prepared:
        """Blocks, histogram statements, mechanisms, report, events: pure, nothing charged."""
        query = analysis.query
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
        earlier = self.services.choices.get(analyst, prepared.selection.key)
        if earlier is not None:  # chosen (and paid for) by an identical query: all of epsilon
            return self._cached(analysis, epsilon, delta, reads, restriction, sample, earlier,
                                reused=True)
        return prepared

    def _cached(self, analysis: QuantileQuery, epsilon: float, delta: float,
                reads: BlocksRead | None, restriction: BlockRestriction | None,
                sample: tuple[str, str] | None, chosen: Choices | None = None,
                reused: bool = False) -> Prepared:
        key = (analysis.shape, epsilon, delta, restriction, sample, chosen, reused)
        prepared = self._prepared.get(key)
        if prepared is None:
            prepared = self._prepare(analysis, epsilon, delta, reads, restriction, sample,
                                     chosen, reused)
            self._prepared.put(key, prepared)
        return prepared

    def _prepare(self, analysis: QuantileQuery, epsilon: float, delta: float,
                 reads: BlocksRead | None,
                 restriction: BlockRestriction | None,
                 sample: tuple[str, str] | None, chosen: Choices | None = None,
                 reused: bool = False) -> Prepared:
        """Plan and rewrite.  With contribution = "auto" (``AggregateQuery.auto_cap``: a
        privacy unit, per-query bounding) the share ``privacy.cap_epsilon_share`` of epsilon
        pays for choosing the cap (and, for keys released by a threshold, the groups per
        unit) after the claim: until ``chosen``, everything is planned at the limit, with a
        :class:`QuantileSelection` to run; the quantiles (and the key-release count) share
        the rest.  ``reused``: the choices of an identical earlier query, free."""
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
        groups = _grid(query)
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
        for argument in analysis.arguments:
            spec = next(q for q in analysis.quantiles if q.argument.sql() == argument)
            tree = quantile_histogram(query, spec.argument, spec.lower, spec.upper, BINS,
                                      restriction, sample)
            sql = dialect(tree, services.dialect, copy=False).sql(services.dialect, copy=False)
            services.statements.verify_outgoing(sql, "noised_by_proxy", query.tables)
            histograms.append((argument, sql))
        finish = quantile_finish(query.outputs, query.having, query.order, query.limit,
                                 query.offset).sql("duckdb")
        gate_sql = None
        if query.thresholded and (_counts_units(query) or (selects and chosen is None)):
            # The units gate's statement; at the limit too, before the choice, so that the
            # database plans it before the claim (the choice may take the units gate).
            first = analysis.quantiles[0].argument
            gate_sql = dialect(quantile_group_units(query, first, restriction),
                               services.dialect, copy=False).sql(services.dialect, copy=False)
            services.statements.verify_outgoing(gate_sql, "noised_by_proxy", query.tables)
        detail = QuantileDetail(analysis, mechanisms, tuple(histograms), groups, finish, gate,
                                gate_sql if _counts_units(query) else None)
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
            selection = self._selection(asked, epsilon, delta, eps_q, restriction,
                                        lambda c: self._cached(asked, epsilon, delta, reads,
                                                               restriction, sample, c),
                                        cap_epsilon)
            statements += tuple(sql for _, _, sql in selection.histograms)
        return Prepared(report, reads.ids if reads is not None else (query.table,), events,
                        detail, statements=statements, finish=(_create(detail), finish),
                        answer_key=(analysis.shape, epsilon, report.delta, report.blocks),
                        selection=selection)

    def _selection(self, analysis: QuantileQuery, epsilon: float, delta: float, eps_q: float,
                   restriction: BlockRestriction | None,
                   apply: Callable[[Choices], Prepared], cap_epsilon: float
                   ) -> QuantileSelection:
        """The cap choice of ``analysis`` (asked at the limit): its histograms' SQL, built and
        verified before the claim (wall 6), and the rule's rank errors at every cap, from the
        mechanisms the quantiles would be drawn with at ``eps_q``."""
        query = analysis.query
        histograms = []
        for what, size, build in quantile_histograms(query, restriction):
            sql = dialect(build(), self.services.dialect, copy=False).sql(
                self.services.dialect, copy=False)
            # The selection noises it in the proxy.
            self.services.statements.verify_outgoing(sql, "noised_by_proxy", query.tables)
            histograms.append((what, size, sql))

        def rank_error(k: int) -> float:
            try:  # a cap the mechanisms cannot be calibrated at is never chosen
                capped = dataclasses.replace(analysis, query=query.with_cap(k))
                return sum(_rank_error(m) for m in plan_quantiles(capped, eps_q))
            except ValueError:
                return math.inf

        groups = max(len(_grid(query)), 1)
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
        for argument, sql in detail.histograms:
            cells = np.zeros((n_groups, BINS))
            for row in self.services.statements.run(sql, run).rows:
                group = _group_index(row[:n_keys], analysis)
                if group is not None:
                    cells[group, int(row[n_keys])] += float(row[n_keys + 1])
            counts[argument] = cells  # exact: never leaves this function
        rows = []
        for g in range(n_groups):
            values = _draw(detail, {a: c[g] for a, c in counts.items()})
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
        cells: dict[str, dict[tuple[Any, ...], list[tuple[int, float]]]] = {}
        for argument, sql in detail.histograms:
            found = cells.setdefault(argument, {})
            for row in self.services.statements.run(sql, run).rows:
                if any(v is None for v in row[:n_keys]):  # a NULL key is not a group here
                    continue
                found.setdefault(tuple(row[:n_keys]), []).append((int(row[n_keys]),
                                                                  float(row[n_keys + 1])))
        if detail.gate_sql is not None:  # distinct units per group (of the first argument)
            counts = {tuple(row[:n_keys]): float(row[n_keys])
                     for row in self.services.statements.run(detail.gate_sql, run).rows
                     if not any(v is None for v in row[:n_keys])}
        else:
            # A group's count: its rows of the first argument (all arguments count the same
            # rows but for NULL values; each group is gated once, on that one histogram).
            first = cells[detail.histograms[0][0]]
            counts = {g: float(sum(n for _, n in first[g])) for g in first}
        groups = list(counts)
        exact = np.array([counts[g] for g in groups], dtype=float)
        noisy = gate.mechanism.sample(exact) if groups else exact
        rows = []
        for g, count in zip(groups, noisy, strict=True):
            if not count > gate.threshold:
                continue
            histograms = {}
            for argument, found in cells.items():
                dense = np.zeros(BINS)
                for b, n in found.get(g, ()):
                    dense[b] += n
                histograms[argument] = dense
            keys = tuple(value if key.public_values is None else key.public_values[int(value)]
                         for value, key in zip(g, query.keys, strict=True))
            rows.append((*keys, *_draw(detail, histograms)))
        del cells, counts, exact
        result = self._finish(detail, rows)
        warnings = () if rows else (
            f"no group's noisy {'unit' if gate.counts == 'units' else 'row'} count cleared the "
            f"threshold tau = {gate.threshold:.4g} (scale {gate.mechanism.scale:g}): groups of "
            f"fewer {gate.counts} are not released; a larger epsilon lowers tau",)
        return Answer(result, _RankBars(detail, len(result.rows)), warnings)

    def _finish(self, detail: QuantileDetail, rows: list[tuple[Any, ...]]) -> ResultSet:
        con = self.services.statements.scratch()
        try:
            con.execute(_create(detail))
            if rows:
                con.executemany(f"INSERT INTO {NOISY} VALUES ({', '.join('?' * len(rows[0]))})",
                                rows)
            try:
                cur = con.execute(detail.finish)
            except Exception:  # duckdb.Error; the detail may quote a noisy value: not shown
                raise BackendError(
                    "the outputs of this query could not be computed from its DP quantiles",
                    hint="the budget of this query was charged, as its histograms read the "
                    "data; check the query's output expressions") from None
            desc = cur.description or []
            return ResultSet(tuple(d[0] for d in desc),
                             tuple(portable_type(str(d[1])) for d in desc), cur.fetchall())
        finally:
            con.close()

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


def _grid(query: AggregateQuery) -> tuple[tuple[object, ...], ...]:
    """The public key combinations, in order: none for keys released by a threshold (the
    groups are the data's, released by a noisy gate) or without keys."""
    if query.thresholded or not query.keys:
        return ()
    return tuple(itertools.product(*[k.public_values or () for k in query.keys]))


def _draw(detail: QuantileDetail, histograms: dict[str, np.ndarray]) -> list[float]:
    """One group's quantiles drawn from its exact histograms (one per argument)."""
    values = []
    cuts: dict[int, tuple[int, ...]] = {}  # one joint draw per column and group
    for spec, mechanism in zip(detail.analysis.quantiles, detail.mechanisms, strict=True):
        histogram = histograms[spec.argument.sql()]
        if isinstance(mechanism, JointQuantiles):
            if id(mechanism) not in cuts:
                cuts[id(mechanism)] = mechanism.sample(histogram)
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
        by_argument.setdefault(q.argument.sql(), []).append(i)
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


def _group_index(keys: tuple[Any, ...], analysis: QuantileQuery) -> int | None:
    """The row-major index of a histogram row's key-value indexes in the public grid."""
    index = 0
    for value, key in zip(keys, analysis.query.keys, strict=True):
        if value is None:  # a value the policy does not declare: filtered out already
            return None
        index = index * len(key.public_values or ()) + int(value)
    return index


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


def _create(detail: QuantileDetail) -> str:
    """The scratch table of the finish: key ids typed from the declared values, quantile ids."""
    query = detail.analysis.query
    tp = query.table_policy
    columns = [f"{k.id} {_duck_type(list(k.public_values or ()) or ['?'])}"
               if k.public_values is not None or not isinstance(k.expr, exp.Column)
               else f"{k.id} {_DECLARED[tp.columns[k.expr.name].type]}" for k in query.keys]
    columns += [f"{q.id} DOUBLE" for q in detail.analysis.quantiles]
    return f"CREATE TEMP TABLE {NOISY} ({', '.join(columns)})"


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
        who = f"{unit}'s <= {k} rows" if unit else "row (event level)"
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
        elif out.expr.sql() in by_id:
            # scale: the mechanism's 2 Delta / epsilon (utility units, i.e. ranks); its 95%
            # error in values is data-dependent (not shown), in ranks it is in the note.
            q, m = by_id[out.expr.sql()]
            columns.append(ColumnReport(
                out.name, "aggregate", out.source, out.measurements, m.name,
                2 * m.sensitivity / m.epsilon,
                note=f"95% rank error within {_rank_error(m):.4g} values of {q.p:g} n"))
        else:
            columns.append(ColumnReport(out.name, "derived", out.source, out.measurements,
                                        note="post-processing of DP quantiles: "
                                        + out.expr.sql()))
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
             (f"at most {k} rows per {unit} (" + ("chosen per query from a noisy histogram "
              "of rows per unit: mechanisms.quantile_cap" if auto else "the policy's limit")
              + "), chosen at random after the filter") if unit
             else "event level: one row per neighbour",
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
        noise="proxy", tables=(query.table,),
        blocks=reads.ids if reads is not None else (query.table,), stability=k,
        privacy_unit=unit, measurements=tuple(measurements), columns=tuple(columns),
        key_release=key_release, rewritten_sql=sql, notes=tuple(n for n in notes if n))

