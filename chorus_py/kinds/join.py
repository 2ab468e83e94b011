"""The engine's steps for a join query: blocks of every private table, max frequencies, the
smooth bound, the noise plan, the rewrite and a report that never shows data-dependent numbers.

What analysts may see (DESIGN.md section 5): the stability expression S(k) over symbolic
frequencies, the source of each frequency, the rule applied.  When every frequency is pinned in
the policy (or read from a public table) the numbers S(0), the peak k, S* and the scale are
functions of public inputs and are shown too.  When one is read from a private table, S(k), S*,
the scales, the error bounds and the rewritten SQL (whose noise literals are 2 S* / epsilon) are
data-dependent: reports and EXPLAIN say so and show none of them; the rewritten SQL is shown only
in proxy noise mode, where it holds no scale.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import secrets

from sqlglot import exp

from analyses.blocks import BlocksRead, interval_set, read_windows
from analyses.joins import JoinInfo
from analyses.query import AggregateQuery
from analyses.smoothing import ResolvedJoin, resolve
from analyses.trees import dialect_named
from budget.accounting import Event
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
from chorus_py.kinds.templates import TextTemplate
from chorus_py.report import ElasticReport, FrequencyReport, PrivacyReport
from chorus_py.statements import QueryRun
from chorus_py.stores.samples import covers_whole_copy
from chorus_py.stores.schedules import BlockCatalog
from mechanisms import DiscreteLaplace, Mechanism
from mechanisms.key_release import threshold_warning
from mechanisms.planning import THRESHOLD_ID, NoisePlan, ThresholdPlan
from mechanisms.thresholding import key_release_threshold
from rewriters.blocks import BlockRestriction
from rewriters.pipeline import RewrittenQuery, pipeline

RULE = ("S(k) from the elastic rules: private table S = 1 (c with c rows per unit), "
        "mf_k = mf + k (+ c k); public table S = 0, mf_k = mf; join without a shared table: "
        "max(mf_k(a) S_r2, mf_k(b) S_r1); shared: mf_k(a) S_r2 + mf_k(b) S_r1 + S_r1 S_r2; "
        "several equalities: the smallest.  S* = max_k exp(-beta k) S(k), beta = epsilon_i / "
        "(2 ln(2 / delta_i)) per measurement; noise scale 2 S* / epsilon_i (times max|v| for SUM)")


def join_blocks(catalog: BlockCatalog, query: AggregateQuery
                ) -> tuple[BlocksRead, dict[str, BlockRestriction]]:
    """The blocks of every private table occurrence (charged together) and each one's window.

    Each occurrence's blocks come from the filters that read that occurrence alone (WHERE and ON
    conjuncts); dropping the others only widens the interval, so the charge stays conservative.
    A private table without blocks is charged as one block named after the table.
    """
    join = query.join
    assert join is not None
    conds = _conjuncts(join)
    ids: dict[str, None] = {}
    restrictions: dict[str, BlockRestriction] = {}
    for src in join.private_sources:
        block = src.policy.block
        if block is None:
            ids[src.table] = None
            continue
        own = [c for c in conds if {col.table for col in c.find_all(exp.Column)} == {src.alias}]
        where = exp.and_(*own) if own else None
        column_type = src.policy.columns[block.column].type
        reads = read_windows(interval_set(where, block.column, column_type),
                             catalog.windows(src.table, block))
        ids.update(dict.fromkeys(reads.ids))
        restrictions[src.alias] = BlockRestriction(block.column, column_type, reads.start,
                                                   reads.end, reads.separate_runs)
    # start/end are not used for a join: each table has its own window in ``restrictions``.
    return BlocksRead(tuple(ids), 0, 0), restrictions


def _conjuncts(join: JoinInfo) -> list[exp.Expr]:
    tree = join.tree
    found: list[exp.Expr] = []
    parts = [tree.args["where"].this] if tree.args.get("where") else []
    parts += [j.args["on"] for j in tree.args.get("joins") or [] if j.args.get("on")]
    for part in parts:
        part = part.unnest()
        found += [c.unnest() for c in part.flatten()] if isinstance(part, exp.And) else [part]
    return found


def join_events(plan: NoisePlan, resolved: ResolvedJoin) -> tuple[Event, ...]:
    """Ledger events: each measurement is (epsilon_i, delta_i)-DP by the smooth bound, not a pure
    Laplace mechanism, so it is charged by that guarantee (no Rényi curve of pure Laplace)."""
    return tuple(Event.epsilon_delta(resolved.epsilon_each, resolved.delta_each)
                 for _ in plan.mechanisms)


def join_plan(query: AggregateQuery, resolved: ResolvedJoin, epsilon: float,
              delta: float) -> NoisePlan:
    """Discrete Laplace noise of scale b = sensitivity / epsilon_i = 2 S* factor / epsilon_i on
    every measurement (all are integers: counts, and sums in grid steps).

    ``DiscreteLaplace.from_sensitivity`` wants an integer sensitivity and 2 S* is not one, so the
    mechanism is built from its scale: as an object it reads "sensitivity 1 at epsilon 1 / b",
    which is exactly the distribution of scale b.  Its guarantee here is the smooth bound's
    (epsilon_i, delta_i), which is what the ledger is charged (``join_events``).  Each
    measurement costs (epsilon / n, delta / n): the query costs (epsilon, delta).
    """
    mechanisms: dict[str, Mechanism] = {}
    for m in query.measurements:
        assert m.integral, "every join measurement is an integer"
        mechanisms[m.id] = discrete_laplace_of_scale(m.sensitivity / resolved.epsilon_each)
    return NoisePlan(mechanisms, None, epsilon, delta)


def with_gate(plan: NoisePlan, groups: int, epsilon: float, delta: float) -> NoisePlan:
    """``plan`` with the key-release gate of a join (``analyses.join_groups``): a separate
    COUNT(DISTINCT unit) per group, sensitivity D = ``groups`` (a person adds 1 to each of
    their <= D groups), discrete Laplace of scale D / epsilon_t, tau = 1 + b ln(D / delta_t)
    (``mechanisms.thresholding``): (epsilon_t, delta_t) for the keys."""
    gate = DiscreteLaplace.from_sensitivity(groups, epsilon)
    tau = key_release_threshold(gate.scale, groups, delta)
    return dataclasses.replace(plan, threshold=ThresholdPlan(THRESHOLD_ID, gate, tau, delta,
                                                             separate=True))


def discrete_laplace_of_scale(scale: float) -> DiscreteLaplace:
    """Discrete Laplace noise of exactly ``scale``, as "sensitivity 1 at epsilon 1 / scale".

    In floating point 1 / (1 / b) exceeds b for about 6% of the b's, and the mechanism refuses a
    scale below sensitivity / epsilon; the epsilon is then raised by one ulp at a time until it
    does not.  The scale (all that the noise depends on) is never changed, and that epsilon is
    descriptive only: join queries are charged by the smooth bound's guarantee (``join_events``).
    """
    epsilon = 1.0 / scale
    while 1.0 / epsilon > scale:
        epsilon = math.nextafter(epsilon, math.inf)
    return DiscreteLaplace(sensitivity=1.0, epsilon=epsilon, scale=scale)


def join_copies(services: Services, join: JoinInfo,
                restrictions: dict[str, BlockRestriction]
                ) -> tuple[dict[str, tuple[str, str]], frozenset[str]]:
    """The ranked copy each private occurrence bounded per query reads (by alias; none
    while its copy is being built: that occurrence ranks its rows itself, the same answers,
    slower), and the aliases among them whose claimed blocks cover the whole copy: no
    block column, or one window from the schedule's start to its end (the copy holds the
    rows of the schedule when it was built, which only grows: every one of them is in
    the window).  As ``kinds.single`` decides for one table (``_stored_counts``).  Read by
    this kind and by quantiles over joins (``kinds.quantile``), whose cache keys name the
    copies: a copy's name changes with its table's version, so no stale copy is read."""
    copies: dict[str, tuple[str, str]] = {}
    covering: set[str] = set()
    for src in join.private_sources:
        found = services.samples.ranked_relation(src.table, src.policy)
        if found is None:
            continue
        copies[src.alias] = found
        block = src.policy.block
        if block is None or covers_whole_copy(restrictions.get(src.alias),
                                              services.blocks.windows(src.table, block)):
            covering.add(src.alias)
    return copies, frozenset(covering)


class JoinTemplate:
    """The rewrite of a join query and its SQL text with the noise scales left as holes.

    Why this is exact: for a join the rewrite (``rewriters.pipeline``) reads the noise plan only
    for a key-release threshold (thresholded joins do not use a template: ``JoinKind``), and
    the measurements' sensitivities not at all; the plan enters the SQL only through
    ``RewrittenQuery.sql_with_noise``, where every measurement is discrete Laplace whose
    rendering holds its scale b as the one literal ``CAST('<repr(b)>' AS DOUBLE)``
    (``mechanisms.base.float_literal``), twice.  So the text is
    rendered once with a distinct random *placeholder scale* per measurement, and each query
    substitutes the quoted ``'<repr(placeholder)>'`` by ``'<repr(b)>'``: the same characters
    a full rendering prints.  The placeholders are drawn from os.urandom, so an analyst cannot
    plant one in the query; the template is kept only when each occurs exactly as often as in
    one rendering of the mechanism alone (otherwise every call renders in full).  In proxy noise
    mode the SQL is the exact measure query, with no scale at all.
    """

    def __init__(self, rewritten: RewrittenQuery, text: str | TextTemplate | None,
                 holes: dict[str, str] | None) -> None:
        self.rewritten = rewritten
        self._text = text
        self._holes = holes  # measurement id -> quoted placeholder literal
        self.renders = 0  # full SQL renderings after the first (for tests)

    @functools.cached_property
    def proxied(self) -> Proxied:
        """Proxy noise: the columns of the statement and the finish (rendered once)."""
        return Proxied.of(self.rewritten)

    @classmethod
    def build(cls, rewritten: RewrittenQuery, with_noise: bool) -> JoinTemplate:
        """Render the SQL once (with placeholder scales when the database adds the noise)."""
        if not with_noise:
            return cls(rewritten, rewritten.measure_sql(), None)
        draws = secrets.SystemRandom()
        scales = {mid: float(f"{draws.uniform(1e6, 1e7):.6f}") for mid in rewritten.measure_ids}
        plan = NoisePlan({mid: discrete_laplace_of_scale(b) for mid, b in scales.items()},
                         None, 1.0, 0.0)
        text = rewritten.sql_with_noise(plan)
        holes = {mid: f"'{b!r}'" for mid, b in scales.items()}
        expected = _scale_literals(rewritten.dialect)
        cut = TextTemplate(text, holes.values())
        if len(set(holes.values())) != len(holes) or expected == 0 or any(
                cut.count(h) != expected for h in holes.values()):
            return cls(rewritten, None, None)
        return cls(rewritten, cut, holes)

    def sql(self, plan: NoisePlan) -> str:
        """The statement for ``plan`` (its mechanisms discrete Laplace, one per measurement)."""
        if self._holes is None:
            if isinstance(self._text, str):  # proxy noise: the measure query, no noise in SQL
                return self._text
            self.renders += 1
            return self.rewritten.sql_with_noise(plan)
        assert isinstance(self._text, TextTemplate)
        mechanisms = plan.all_mechanisms()
        texts = {}
        for mid, hole in self._holes.items():
            mechanism = mechanisms[mid]
            assert isinstance(mechanism, DiscreteLaplace)
            texts[hole] = f"'{float(mechanism.scale)!r}'"
        return self._text.fill(texts)


@functools.cache
def _scale_literals(dialect: str) -> int:
    """How often one discrete Laplace rendering quotes its scale (the same for every scale)."""
    probe = 1234567.25
    alone = exp.select(discrete_laplace_of_scale(probe).render_sql(exp.column("m"), dialect))
    return alone.sql(dialect_named(dialect)).count(f"'{probe!r}'")


class JoinKind:
    """Queries that join tables, under elastic sensitivity."""

    charges = True

    def __init__(self, services: Services) -> None:
        self.services = services
        self._prepared: LRU[tuple[object, ...], Prepared] = LRU(1024)
        self._templates: LRU[tuple[object, ...], JoinTemplate] = LRU(1024)

    def prepare(self, query: AggregateQuery, analyst: str, epsilon: float,
                delta: float) -> Prepared:
        """Steps 3-5 and 7 for a join query (pure given the cached metrics; nothing charged)."""
        services = self.services
        join = query.join
        assert join is not None
        reads, restrictions = join_blocks(services.blocks, query)
        # Calendar keys of a block column: listed over the blocks read (no threshold).
        query = listed_keys(query, restrictions)
        mf = services.frequencies.values(join.metrics)
        # bounding = "materialized": read the table's stored bounded sample (its current name,
        # which changes when the table does), as a one-table query would.
        samples = {s.alias: (SCHEMA, services.samples.relation(s.table, s.policy))
                   for s in join.private_sources
                   if s.policy.privacy_unit and s.policy.bounding == "materialized"}
        copies, covering = join_copies(services, join, restrictions)
        noise = services.policy.privacy.noise
        # The copies' names change with their tables' versions: a key that names them never
        # serves a statement reading a stale copy (as in kinds.single).
        key = (query.normalized_sql, epsilon, delta, tuple(sorted(restrictions.items())),
               tuple(sorted(mf.items())), noise, tuple(sorted(samples.items())),
               tuple(sorted(copies.items())), covering)
        prepared = self._prepared.get(key)
        if prepared is None:
            prepared = self._prepare_uncached(query, epsilon, delta, reads, restrictions, mf,
                                              samples, copies, covering)
            self._prepared.put(key, prepared)
        return prepared

    def run(self, prepared: Prepared, run: QueryRun) -> Answer:
        """The answer (``kinds.analytic.answer_prepared``)."""
        privacy = self.services.policy.privacy
        return answer_prepared(self.services.statements, prepared, privacy.noise,
                               privacy.max_epsilon_per_query, run)

    def _prepare_uncached(self, query: AggregateQuery, epsilon: float, delta: float,
                          reads: BlocksRead, restrictions: dict[str, BlockRestriction],
                          mf: dict[str, float], samples: dict[str, tuple[str, str]],
                          copies: dict[str, tuple[str, str]],
                          covering: frozenset[str]) -> Prepared:
        services = self.services
        # Keys released by a noisy threshold: the gate takes its share of epsilon and half of
        # delta; the measurements share the rest (so the query costs (epsilon, delta)).
        gate_epsilon = gate_delta = 0.0
        if query.thresholded:
            if not delta > 0:
                raise InvalidParameter(
                    "grouping a join by a column without public values releases its keys "
                    "through a noisy threshold, which needs delta > 0",
                    hint="pass a small delta (e.g. 1e-8)")
            gate_epsilon = epsilon * services.policy.privacy.threshold_epsilon_share
            gate_delta = delta / 2
        try:
            resolved_query, resolved = resolve(query, epsilon - gate_epsilon,
                                               delta - gate_delta, mf)
        except ValueError as err:  # depends on the query's shape and epsilon only
            raise InvalidParameter(str(err), hint="ask for a larger epsilon") from None
        try:
            plan = join_plan(resolved_query, resolved, epsilon, delta)
            if query.thresholded:
                plan = with_gate(plan, resolved_query.groups_per_unit, gate_epsilon,
                                 gate_delta)
        except ValueError:
            # The message would quote the scale, which may be data-dependent: say nothing of it.
            raise InvalidParameter(
                f"cannot calibrate noise for this join at epsilon={epsilon:g}: the noise would "
                "be too large to render", hint="ask for a larger epsilon") from None
        noise = services.policy.privacy.noise
        if query.thresholded:
            # The gate's tau is in the rewrite itself, and the template's placeholder plan
            # has no gate: rendered in full (``JoinTemplate`` notes why the others need not).
            rewritten = pipeline(resolved_query, plan, None, services.dialect, None,
                                 restrictions, samples, copies=copies, covering=covering)
            template = JoinTemplate(rewritten, None, None)
        else:
            # The rewrite and its SQL text do not depend on epsilon, delta or the metrics,
            # only the noise scales in it do: kept apart, a new epsilon or refreshed metrics
            # cost a string substitution instead of a rewrite (``JoinTemplate``).
            template_key = (query.normalized_sql, tuple(sorted(restrictions.items())), noise,
                            services.dialect, tuple(sorted(samples.items())),
                            tuple(sorted(copies.items())), covering)
            template = self._templates.get(template_key)
            if template is None:
                template = JoinTemplate.build(
                    pipeline(resolved_query, plan, None, services.dialect, None, restrictions,
                             samples, copies=copies, covering=covering),
                    noise == "sql")
                self._templates.put(template_key, template)
        sql = template.sql(plan) if noise == "sql" or not query.thresholded \
            else template.rewritten.measure_sql()
        detail = AnalyticQuery(resolved_query, plan, reads,
                               template.proxied if noise == "proxy" else None, sql,
                               resolved=resolved)
        report = aggregate_report(resolved_query, plan, reads, sql, noise)
        report = join_report(report, resolved_query, resolved, mf, noise)
        # Keys by threshold: what tau means for group sizes (public inputs only).
        odds = key_release_odds_of(resolved_query, plan, epsilon)
        warning = None if odds is None else threshold_warning(
            *odds, max_epsilon=services.policy.privacy.max_epsilon_per_query)
        if warning:
            report = dataclasses.replace(report, warnings=(warning,))
        services.statements.verify_outgoing(sql, services.release, query.tables,
                                            gate=plan.gate)
        events = join_events(plan, resolved)
        if plan.threshold is not None:
            events += (Event.from_mechanism(plan.threshold.mechanism),
                       Event.key_release(plan.threshold.delta))
        return Prepared(report, reads.ids, events, detail,
                        statements=(sql,),
                        finish=finish_plan(detail) if noise == "proxy" else None,
                        answer_key=(query.normalized_sql, epsilon, delta, report.blocks))


def join_report(report: PrivacyReport, query: AggregateQuery, resolved: ResolvedJoin,
                mf: dict[str, float], noise: str) -> PrivacyReport:
    """The report of a join query, with every data-dependent number removed."""
    join = query.join
    assert join is not None
    hidden = join.data_dependent
    frequencies = tuple(
        FrequencyReport(m.name, m.source, None if m.source == "data" else mf[m.name])
        for m in join.metrics)
    bound = resolved.bound
    elastic = ElasticReport(
        stability=join.stability.text(), equalities=join.equalities, frequencies=frequencies,
        data_dependent=hidden, rule=RULE,
        at_zero=None if hidden else bound.at_zero, peak_k=None if hidden else bound.peak_k,
        smooth_bound=None if hidden else bound.value, beta=bound.beta)
    notes = [n for n in report.notes if not n.startswith(("at most ", "noise added by the "
                                                          "database"))]
    if noise == "sql":
        notes.append("noise added by the database (random()): discrete Laplace on counts and on "
                     "sums measured in integer grid steps")
    notes += list(join.notes)
    for src in join.private_sources:
        if src.policy.privacy_unit:
            how = ("by a stored random sample (bounding = 'materialized')"
                   if src.policy.bounding == "materialized" else
                   "chosen at random among the rows that pass its filters")
            notes.append(f"{src.table} ({src.alias}): at most {src.cap} rows per "
                         f"{src.policy.privacy_unit}, {how}")
    # The mechanism as the analyst should read it: discrete Laplace at (epsilon_i, delta_i) of
    # scale 2 S* factor / epsilon_i (the scale only when it is not data-dependent).
    measurements = tuple(dataclasses.replace(m, mechanism={
        "name": m.mechanism.get("name"), "epsilon": resolved.epsilon_each,
        "delta": resolved.delta_each, "scale": None if hidden else m.mechanism.get("scale"),
        "smooth_bound": None if hidden else bound.value,
        # A sum measured in grid steps: the step (public: from the bounds) and the scale in
        # steps; the scale above is in the column's units.
        **({"grid_step": m.mechanism["grid_step"],
            "scale_in_grid_steps": None if hidden else m.mechanism["scale_in_grid_steps"]}
           if "grid_step" in m.mechanism else {})}) for m in report.measurements)
    columns = report.columns
    sql = report.rewritten_sql
    if hidden:
        notes.append("the noise scale is data-dependent (it follows the max frequencies read "
                     "from private tables): the sensitivity, scale and error bounds are not "
                     "shown" + ("" if noise == "proxy" else ", nor the rewritten SQL, whose "
                                "noise literals would show them"))
        measurements = tuple(dataclasses.replace(m, sensitivity=None, error_bound_95=None)
                             for m in measurements)
        columns = tuple(dataclasses.replace(c, scale=None, error_bound_95=None)
                        for c in columns)
        if noise != "proxy":
            sql = None
    return dataclasses.replace(
        report, tables=query.tables, stability=None, measurements=measurements,
        columns=columns, rewritten_sql=sql, notes=tuple(notes), elastic=elastic)
