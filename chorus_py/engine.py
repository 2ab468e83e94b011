"""The engine: one analyst query in, one noisy answer and its privacy report out.

It ties together the steps of DESIGN.md section 3, each owned by its package:

1. parse and 2. validate  -> ``analyses.validate``
3. resolve and 4. analyse -> ``analyses.query`` (measurements, sensitivities), ``analyses.blocks``
5. plan noise             -> ``mechanisms.planning``
6. claim                  -> ``budget.ledger``
7. rewrite                -> ``rewriters.pipeline``
8. execute                -> ``chorus_py.backends``, each statement first checked by
                             ``analyses.outgoing`` (wall 4 of DESIGN.md section 11)
9. post-process           -> proxy-side noise when the policy asks for it
10. consume               -> ``budget.ledger``, before any row is returned

Anything that fails before step 6 costs nothing.  Before it, the database plans (EXPLAIN) every
statement the query will run, so one that cannot plan is refused free (Wall 6, "charge before
touching").  After it, a failure is refunded only if no statement of the query read a row
(``QueryRun``): once a selection histogram or the answer read the data, the whole charge stays,
and the message holds no data value.  Choices made on the data are kept only from answered
queries.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

import duckdb
import numpy as np
from sqlglot import exp
from sqlglot.optimizer.annotate_types import annotate_types

from analyses.binding import generated_sql
from analyses.blocks import BlocksRead, blocks_read
from analyses.outgoing import Release, check_outgoing, rules_from_policy
from analyses.query import AggregateQuery, PublicQuery, analyze_query, display_sql
from analyses.totality import check_statement_limits
from analyses.validate import TOO_DEEP, parse_statement
from budget.accounting import Event, events_for_plan
from budget.answers import AnswerCache
from budget.ledger import BlockBudget, Claim, Ledger, open_ledger
from chorus_py.backends import (
    Backend,
    ResultSet,
    StatementFailed,
    open_backend,
    portable_type,
)
from chorus_py.errors import (
    BackendError,
    InternalError,
    InvalidParameter,
    PolicyError,
    QueryRefused,
    StatementCanceled,
)
from chorus_py.joined import join_events, prepare_join
from chorus_py.policy import Policy, load_policy
from chorus_py.random_dp import RandomDP
from chorus_py.report import (
    BlockRemaining,
    ColumnReport,
    ContributionReport,
    KeyRelease,
    MeasurementReport,
    PrivacyReport,
    QueryResult,
    SelectionStep,
)
from chorus_py.stores.attribution import AttributionStore, attribution_report
from chorus_py.stores.frequencies import FrequencyCatalog
from chorus_py.stores.samples import SCHEMA, BoundedSamples
from chorus_py.stores.schedules import BlockCatalog
from chorus_py.templates import one_table_sql
from mechanisms import DiscreteLaplace, Snapping
from mechanisms.caps import CapTerm, RowModel, cap_bins, choose, choose_groups
from mechanisms.clip_bounds import STEPS, ClipColumn, magnitude_edges
from mechanisms.planning import (
    THRESHOLD_ID,
    NoisePlan,
    NoiseRequest,
    ThresholdRequest,
    plan_noise,
)
from rewriters.dialect import dialect
from rewriters.pipeline import NOISY, BlockRestriction, RewrittenQuery, cap_histogram, pipeline
from rewriters.selection import (
    ClippedArgument,
    clipped_arguments,
    group_histogram,
    value_histogram,
)

log = logging.getLogger("chorus.engine")

_AGGREGATE_NAMES = {"count": "COUNT", "count_units": "COUNT(DISTINCT unit)", "sum": "SUM",
                    "sum_squares": "SUM of squares"}
# Policy column types as the backends report them (chorus_py.backends.portable_type).
_PORTABLE = {"int": "integer", "float": "float", "text": "text", "bool": "boolean",
             "date": "date", "timestamp": "timestamp"}
_DUCKDB_TYPES = {"integer": "BIGINT", "float": "DOUBLE", "text": "VARCHAR", "date": "DATE",
                 "timestamp": "TIMESTAMP", "boolean": "BOOLEAN"}


class _Prepared:
    """Everything decided before the claim (steps 1-5 and 7): pure, nothing charged."""

    def __init__(self, query: AggregateQuery, plan: NoisePlan, reads: BlocksRead | None,
                 rewritten: RewrittenQuery | None, sql: str, report: PrivacyReport,
                 restriction: BlockRestriction | None, sample: tuple[str, str] | None,
                 cap_epsilon: float) -> None:
        self.query = query
        self.plan = plan
        self.reads = reads
        self.rewritten = rewritten  # None for a single-table query with database noise
        self.sql = sql
        self.report = report
        self.restriction = restriction
        self.sample = sample
        # > 0 when the row cap is still to be chosen (contribution = "auto").
        self.cap_epsilon = cap_epsilon
        self._events: tuple[Event, ...] | None = None

    def for_analyst(self, analyst: str) -> _Prepared:
        """This prepared query as ``analyst`` runs it: the report names them; the ledger
        events are shared (computed once per cached query, not once per run)."""
        out = _Prepared(self.query, self.plan, self.reads, self.rewritten, self.sql,
                        dataclasses.replace(self.report, analyst=analyst), self.restriction,
                        self.sample, self.cap_epsilon)
        out._events = self.ledger_events()
        return out

    def ledger_events(self) -> tuple[Event, ...]:
        """What the ledger records for this query: one event per mechanism.

        Computed once: a prepared query serves every identical query of its cache lifetime.
        While the row cap is still to be chosen (contribution = "auto") the final mechanisms are
        not known yet: the query's (epsilon, delta) itself, whose Rényi curve bounds that of
        any mechanism of that cost.  A join's noise is calibrated to a smooth bound:
        (epsilon, delta)-DP events.
        """
        if self._events is None:
            if self.query.join is not None:
                self._events = join_events(self.plan, self.resolved)  # type: ignore[attr-defined]
            elif self.cap_epsilon == 0:
                self._events = events_for_plan(self.plan)
            else:
                self._events = (Event.epsilon_delta(self.report.epsilon, self.report.delta),)
        return self._events


class QueryRun:
    """One query's trip to the database, as Wall 6 needs it (DESIGN.md section 11): the claim
    it paid and whether any of its statements may have read a row.

    A claim is consumed when granted, before any statement runs.  It is given back only while
    no statement of the query touched data: once one did (a selection histogram included),
    every later failure keeps the whole charge.  ``Engine._run`` consults this object before
    any refund; it is the only place a claim is refunded.
    """

    def __init__(self, claim: Claim | None) -> None:
        self.claim = claim
        self.touched = False
        self.refunded = False

    def read(self) -> None:
        """A statement of the query ran to the end: it read rows."""
        self.touched = True

    def failed(self, touched_data: bool) -> None:
        """A statement failed; ``touched_data``: the backend could not rule out that it read."""
        self.touched = self.touched or touched_data

    def refund_if_untouched(self, ledger: Ledger) -> bool:
        """Refund the claim if nothing of this query read a row; whether it was refunded."""
        if self.claim is None or self.touched or self.refunded:
            return False
        ledger.refund(self.claim)  # consumed on grant: give it back
        self.refunded = True
        return True


class Engine:
    """Answers analyst SQL with differential privacy against one backend and one ledger."""

    def __init__(self, policy: Policy, backend: Backend | None = None,
                 ledger: Ledger | None = None, block_ttl_seconds: float = 60.0) -> None:
        self.policy = policy
        self.dialect = policy.backend.dialect
        self.backend = backend or open_backend(policy.backend.url,
                                               policy.backend.statement_timeout_seconds)
        try:
            live = self.backend.table_columns()
            policy.check_against(live)
            self._check_types(live)
            # Wall 5 (least privilege): public-only queries run on a connection restricted to
            # the public tables; refused at start when it could read a private one.
            self.backend.restrict_public(
                [t for t, tp in policy.tables.items() if tp.public],
                [t for t, tp in policy.tables.items() if not tp.public],
                policy.backend.public_url, block_ttl_seconds)
        except BaseException:
            self.backend.close()
            raise
        self.public_columns = {t: live[t] for t, tp in policy.tables.items() if tp.public}
        try:
            # The schema table_columns read: the generated SQL names every table in it.
            self.schema = str(self.backend.run("SELECT current_schema()").rows[0][0])
        except BaseException:
            self.backend.close()
            raise
        self._outgoing = rules_from_policy(policy, self.schema, SCHEMA)
        # Statements the outgoing check passed (wall 4), by text: checked once per shape.
        self._verified: _LRU[tuple[object, ...], bool] = _LRU(4096)
        try:
            self.ledger = ledger or open_ledger(policy.privacy, policy.source, policy.analysts)
        except BaseException as err:
            self.backend.close()
            if isinstance(err, ValueError | OSError | sqlite3.Error):
                raise PolicyError(f"{policy.source}: privacy.ledger: cannot open the budget "
                                  f"ledger: {err}") from None
            raise
        self.answers = AnswerCache(policy.privacy.answer_cache_seconds)
        self._scratch: duckdb.DuckDBPyConnection | None = None  # opened on first proxy noise
        self._scratch_lock = threading.Lock()
        # Caps, clipping bounds and groups per unit chosen by an identical query's noisy
        # selection: reused for privacy.choice_reuse_seconds (post-processing, no budget).
        self.choices = AnswerCache(policy.privacy.choice_reuse_seconds)
        self.blocks = BlockCatalog()  # the policy's public schedules: reads no data
        self.samples = BoundedSamples(self.backend, block_ttl_seconds, self.blocks)
        self.random_dp = RandomDP(self)  # sensitivity sampling, opt-in per query
        # Max frequencies of join keys (chorus_py.stores.frequencies), re-checked at most once
        # per TTL.
        self.frequencies = FrequencyCatalog(self.backend, block_ttl_seconds)
        # Tables whose rows belong to several units: queries read a stored kept set S.
        self.attribution = AttributionStore(self.backend, self.samples.naming_key,
                                            block_ttl_seconds)
        # Steps 1-5 and 7 are pure functions of (SQL, policy, block windows, epsilon, delta):
        # cache them.  The noise is drawn when the SQL runs, and the budget is charged per call.
        self._analyses: _LRU[str, AggregateQuery | PublicQuery] = _LRU(1024)
        self._constants: _LRU[str, bool] = _LRU(4096)  # verdicts of run_constant
        self._prepared: _LRU[tuple[object, ...], _Prepared] = _LRU(1024)
        self._histograms: _LRU[tuple[object, ...], str] = _LRU(1024)
        # Statement texts the database planned without error (_check_plans).
        self._planned: _LRU[object, bool] = _LRU(4096)
        # The blocks a query reads, per (query, block windows): windows change when the data
        # grows (the block catalog re-reads them after its TTL), and with them the key.
        self._reads: _LRU[tuple[object, ...], tuple[BlocksRead, BlockRestriction]] = _LRU(1024)
        # Rewrites with their noise scales (and caps, bounds) left open: join queries
        # (chorus_py.joined.JoinTemplate) and single-table ones (chorus_py.templates).
        self._templates: _LRU[tuple[object, ...], Any] = _LRU(1024)

    @classmethod
    def from_policy(cls, path: str | Path, **kwargs: Any) -> Engine:
        """Load and check a policy file, connect to its backend."""
        return cls(load_policy(path), **kwargs)

    def close(self) -> None:
        """Close the backend and ledger connections."""
        self.backend.close()
        self.ledger.close()
        with self._scratch_lock:
            if self._scratch is not None:
                self._scratch.close()
                self._scratch = None

    def _scratch_cursor(self) -> duckdb.DuckDBPyConnection:
        """A connection of its own to the engine's in-memory DuckDB, where proxy noise finishes
        an answer over its noisy values.  Opening a database costs about 35 ms, a cursor under
        1 ms; tables a query makes there are TEMP, so each cursor sees only its own."""
        with self._scratch_lock:
            if self._scratch is None:
                self._scratch = duckdb.connect(":memory:")
            return self._scratch.cursor()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- public API ---------------------------------------------------------------------------
    def explain(self, sql: str, analyst: str | None = None, epsilon: float | None = None,
                delta: float | None = None, sensitivity: str | None = None,
                gamma: float | None = None) -> PrivacyReport:
        """What ``execute`` would do and cost, without running or charging anything."""
        analyst = self._analyst(analyst)
        if self.random_dp.wanted(sensitivity, gamma):
            sampled = self.random_dp.explain(sql, analyst, epsilon, delta, gamma)
            if sampled is not None:
                return sampled
        analysis = self._analyse(sql)
        if isinstance(analysis, PublicQuery):
            return self._public_report(analyst, analysis)
        eps, dlt = self._parameters(analyst, epsilon, delta)
        report = self._prepare_reusing(analysis, analyst, eps, dlt)[0].report
        return dataclasses.replace(report, remaining=self._remaining(report.blocks),
                                   accounting=self.ledger.accounting)

    def execute(self, sql: str, analyst: str | None = None, epsilon: float | None = None,
                delta: float | None = None, wait_seconds: float | None = None,
                sensitivity: str | None = None, gamma: float | None = None,
                remaining: bool = True) -> QueryResult:
        """Answer ``sql`` with noise, charging (epsilon, delta) on the blocks it reads.

        A claim the scheduler cannot grant at once waits up to ``wait_seconds`` (default: the
        policy's ``scheduler.wait_seconds``), blocking this thread, then raises BudgetExhausted.
        ``sensitivity = "sampled"`` (with ``gamma``) opts in to sensitivity sampling: random DP
        (``chorus_py.random_dp``); default: the policy's ``privacy.sensitivity``.
        ``remaining=False`` leaves the report's ``remaining`` (each block's budget left) empty:
        for a caller that does not show it, as it costs a conversion per block read, ~90.
        """
        started = time.perf_counter()
        analyst = self._analyst(analyst)
        if self.random_dp.wanted(sensitivity, gamma):
            sampled = self.random_dp.execute(sql, analyst, epsilon, delta, gamma, wait_seconds,
                                             remaining)
            if sampled is not None:
                return sampled
        analysis = self._analyse(sql)
        if isinstance(analysis, PublicQuery):
            public_sql = generated_sql(analysis.tree, analysis.tables, self.dialect, self.schema)
            self.verify_outgoing(public_sql, "exact", analysis.tables)
            result = self._run(public_sql, None, public=True)
            return QueryResult(result.columns, result.types, _portable_rows(result.rows),
                               self._public_report(analyst, analysis))
        eps, dlt = self._parameters(analyst, epsilon, delta)
        prepared, choice_key = self._prepare_reusing(analysis, analyst, eps, dlt)
        report = prepared.report
        # Per analyst (budget.answers): a hit must never tell one that another asked the same.
        answer_key = (analysis.normalized_sql, eps, dlt, report.blocks)
        again = self.answers.get(analyst, answer_key)
        if again is not None:
            return self._answer_again(again, analyst, remaining)
        # Wall 6, charge before touching: every statement the query will run (the selection
        # histograms, the final statement at the limit cap and the declared bounds) is planned
        # by the database first, so one that cannot plan is refused before the claim.
        selection = self._selection_statements(prepared) if prepared.cap_epsilon > 0 else ()
        self._check_plans([prepared.sql, *(sql for _, _, sql in selection)])
        if prepared.rewritten is not None and self.policy.privacy.noise == "proxy":
            self._check_finish(prepared)
        # The claim comes back consumed (charged before anything runs).  ``run`` records whether
        # any statement read a row: only if none did may a failure refund it (_run).
        claim = self._claim(prepared, analysis.table, analyst, sql, wait_seconds, remaining)
        run = QueryRun(claim)
        chosen = None
        if selection:
            chosen = self._choose_cap(prepared, run, selection)
            prepared = self._prepare(analysis, analyst, eps, dlt, *chosen)
        if self.policy.privacy.noise == "sql":
            result = self._run(prepared.sql, run)
        else:
            result = self._run_proxy_noise(prepared, run)
        # Choices made on the data are kept for reuse only now: the query that paid for them
        # succeeded and its claim stays consumed (never after a failure, which may refund).
        if chosen is not None and claim is not None:
            self.choices.put(analyst, choice_key, chosen)
        log.info("analyst=%s epsilon=%g delta=%g blocks=%d groups=%d in %.1f ms", analyst,
                 report.epsilon, report.delta, len(report.blocks), len(result.rows),
                 (time.perf_counter() - started) * 1000)
        charged = dataclasses.replace(
            prepared.report, charged=claim is not None, accounting=self.ledger.accounting,
            remaining=self._remaining_after(claim) if remaining else ())
        answer = QueryResult(result.columns, result.types, _portable_rows(result.rows), charged)
        if claim is not None:
            self.answers.put(analyst, answer_key, answer)
        return answer

    # -- budget (steps 6 and 10) -----------------------------------------------------------
    def _claim(self, prepared: _Prepared, table: str, analyst: str, sql: str,
               wait_seconds: float | None, remaining: bool = True) -> Claim | None:
        """Claim the query's cost on every block it reads (None: it reads no block); with
        ``remaining``, the claim brings back each block's guarantee after it."""
        report = prepared.report
        if prepared.reads is not None and not prepared.reads.ids:
            return None
        ids = prepared.reads.ids if prepared.reads is not None else (table,)
        self.ledger.ensure_blocks(ids)
        try:
            return self.ledger.claim(analyst, ids, report.epsilon, report.delta,
                                     description=sql[:200], events=prepared.ledger_events(),
                                     wait_seconds=wait_seconds, consume_on_grant=True,
                                     views=False if remaining else None)
        except ValueError as err:  # e.g. a negative wait time
            raise InvalidParameter(str(err)) from None

    def _answer_again(self, answer: QueryResult, analyst: str,
                      remaining: bool = True) -> QueryResult:
        """An answer already released, served again: post-processing, no budget spent."""
        report = dataclasses.replace(
            answer.report, analyst=analyst, charged=False,
            remaining=self._remaining(answer.report.blocks) if remaining else (),
            notes=(*answer.report.notes, "the same noisy answer as your earlier identical query "
                   "over the same blocks (privacy.answer_cache_seconds): no budget spent"))
        return QueryResult(answer.columns, answer.types, list(answer.rows), report)

    def _remaining(self, ids: tuple[str, ...]) -> tuple[BlockRemaining, ...]:
        return _block_remaining(self.ledger.remaining(ids))

    def _remaining_after(self, claim: Claim | None) -> tuple[BlockRemaining, ...]:
        """The blocks after a charge: as the charging transaction saw them when it was ours."""
        if claim is None:
            return ()
        if claim.left:  # the guarantees as the charging transaction left them
            return tuple(BlockRemaining(*left) for left in claim.left)
        return _block_remaining(claim.after) if claim.after else self._remaining(claim.blocks)

    # -- steps ----------------------------------------------------------------------------------
    def _analyst(self, analyst: str | None) -> str:
        declared = self.policy.analysts
        if analyst is None:
            if len(declared) == 1:
                return next(iter(declared))
            if not declared:
                return "anonymous"
            raise InvalidParameter(
                "no analyst given", hint=f"pass one of: {', '.join(sorted(declared))}")
        if declared and analyst not in declared:
            raise InvalidParameter(f"unknown analyst '{analyst}'",
                                   hint="the data owner declares analysts in the policy")
        return analyst

    def _parameters(self, analyst: str, epsilon: float | None,
                    delta: float | None) -> tuple[float, float]:
        privacy = self.policy.privacy
        eps = privacy.default_epsilon if epsilon is None else epsilon
        dlt = privacy.default_delta if delta is None else delta
        limit = privacy.max_epsilon_per_query
        per_analyst = self.policy.analysts.get(analyst)
        if per_analyst is not None and per_analyst.max_epsilon_per_query is not None:
            limit = min(limit, per_analyst.max_epsilon_per_query)
        if eps is None:
            raise InvalidParameter("epsilon is missing",
                                   hint="pass epsilon, or set privacy.default_epsilon")
        if not isinstance(eps, int | float) or not math.isfinite(eps) or eps <= 0:
            raise InvalidParameter(f"epsilon must be a positive number, got {eps!r}")
        if eps > limit:
            raise InvalidParameter(f"epsilon {eps:g} is above the per-query maximum {limit:g}",
                                   hint=f"ask for epsilon <= {limit:g}")
        if eps < privacy.min_epsilon_per_query:
            # A floor on every query's cost: probing (many tiny queries, refused or answered)
            # is never nearly free.
            floor = privacy.min_epsilon_per_query
            raise InvalidParameter(
                f"epsilon {eps:g} is below the per-query minimum {floor:g} "
                "(privacy.min_epsilon_per_query)", hint=f"ask for epsilon >= {floor:g}")
        if dlt is None:
            raise InvalidParameter("delta is missing",
                                   hint="pass delta, or set privacy.default_delta")
        if not isinstance(dlt, int | float) or not math.isfinite(dlt) or not 0 <= dlt < 1:
            raise InvalidParameter(f"delta must be in [0, 1), got {dlt!r}")
        if dlt > privacy.max_delta_per_query:
            raise InvalidParameter(
                f"delta {dlt:g} is above the per-query maximum {privacy.max_delta_per_query:g}")
        return float(eps), float(dlt)

    def _analyse(self, sql: str) -> AggregateQuery | PublicQuery:
        hit = self._analyses.get(sql)
        if hit is not None:
            return hit
        limits = self.policy.limits
        check_statement_limits(sql, None, limits)  # the text's length, before parsing it
        parsed = parse_statement(sql, self.dialect, frozenset(self.policy.tables))
        check_statement_limits(sql, parsed.tree, limits)
        try:
            analysis = analyze_query(parsed, self.policy, self.dialect, self.public_columns,
                                     self.run_constant, self.schema)
        except RecursionError:
            raise QueryRefused(TOO_DEEP, hint="simplify the query") from None
        self._analyses.put(sql, analysis)
        return analysis

    def run_constant(self, sql: str) -> bool:
        """Run a statement that reads no table on the backend: True when it succeeds.

        The totality analysis (``analyses.totality``) judges literals, LIKE patterns and time
        functions by what the backend itself does; verdicts are cached per statement.
        """
        verdict = self._constants.get(sql)
        if verdict is None:
            try:
                self.backend.run(sql)
                verdict = True
            except StatementFailed:
                verdict = False
            self._constants.put(sql, verdict)
        return verdict

    def _prepare(self, query: AggregateQuery, analyst: str, epsilon: float, delta: float,
                 cap: int | None = None,
                 bounds: tuple[tuple[str, float, float], ...] = (),
                 groups: int | None = None, reused: bool = False) -> _Prepared:
        """Plan and rewrite; with automatic caps or bounds (contribution / clipping = "auto"),
        at the limit and the declared bounds until ``cap`` (and ``bounds``, and ``groups`` per
        unit for thresholded keys) are chosen.  ``reused``: they were chosen by an earlier
        identical query (privacy.choice_reuse_seconds), so no epsilon goes to choosing them."""
        if query.join is not None:
            joined = prepare_join(self, query, analyst, epsilon, delta)
            self.verify_outgoing(joined.sql, self._release(), query.tables)
            return joined
        reads, restriction = self._blocks(query)
        sample = None
        if query.table_policy.multi_attribution:
            sample = (SCHEMA, self.attribution.relation(query.table, query.table_policy))
        elif query.table_policy.bounding == "materialized":
            sample = (SCHEMA, self.samples.relation(query.table, query.table_policy))
        # The query's own (stability, normalised SQL) and the choices determine everything
        # below: look the plan up before copying the query's trees for the choices.
        key = (query.normalized_sql, query.stability, cap, bounds, groups, epsilon, delta,
               restriction, sample, reused)
        prepared = self._prepared.get(key)
        if prepared is None:
            cap_epsilon = 0.0
            if query.auto_cap and not _cap_matters(query):
                # COUNT(DISTINCT unit) alone is exact with one row per unit: nothing to choose.
                query = query.with_cap(1)
            clipped = clipped_arguments(query) if query.table_policy.auto_clipping else ()
            if (query.auto_cap and _cap_matters(query)) or clipped:
                # One share of epsilon pays for every selection histogram (mechanisms.caps).
                # Reusing an earlier query's noisy choice is post-processing of that release
                # (Dwork and Roth 2014, Proposition 2.1): it costs nothing.
                cap_epsilon = 0.0 if reused else epsilon * self.policy.privacy.cap_epsilon_share
                if cap is not None:
                    query = query.with_cap(cap).with_bounds(
                        {a: (lo, hi) for a, lo, hi in bounds})
                    if groups is not None:
                        query = query.with_groups(groups)
            prepared = self._prepare_uncached(query, epsilon - cap_epsilon, delta, reads,
                                              restriction, sample)
            report = prepared.report
            if query.auto_cap or cap_epsilon > 0 or reused:
                report = self._with_contribution(report, query, cap_epsilon, cap, clipped,
                                                 bounds, groups, reused)
            prepared = _Prepared(prepared.query, prepared.plan, reads, prepared.rewritten,
                                 prepared.sql, report, restriction, sample,
                                 cap_epsilon if cap is None else 0.0)
            # Before it is cached, so before any claim: a refused statement costs nothing.
            self.verify_outgoing(prepared.sql, self._release(), query.tables)
            self._prepared.put(key, prepared)
        return prepared.for_analyst(analyst)

    def _release(self) -> Release:
        """How an answer's statement is released: noised in SQL or by the proxy."""
        return "noised_in_sql" if self.policy.privacy.noise == "sql" else "noised_by_proxy"

    def _prepare_reusing(self, query: AggregateQuery, analyst: str, epsilon: float,
                         delta: float) -> tuple[_Prepared, tuple[object, ...]]:
        """``_prepare``, with the choices of an identical earlier query when they may be
        reused (privacy.choice_reuse_seconds); also the key the choices are kept under."""
        prepared = self._prepare(query, analyst, epsilon, delta)
        # Everything the selection depends on that is public: the query, its epsilon and
        # delta (the rule weighs noise against bias) and the blocks it reads.  Never anything
        # that follows the data (a stored sample's name changes with a fingerprint of the
        # rows): whether the choices are reused shows in the report, and must not tell an
        # analyst that rows changed (as budget.answers explains for answers).
        # Kept per analyst (budget.answers): "reused" must never tell one analyst that another
        # just ran this query.
        key = (query.normalized_sql, epsilon, delta, prepared.restriction)
        earlier = self.choices.get(analyst, key) if prepared.cap_epsilon > 0 else None
        if earlier is not None:  # chosen (and paid for) by an identical query: all of epsilon
            prepared = self._prepare(query, analyst, epsilon, delta, *earlier, reused=True)
        return prepared, key

    def _selection(self, query: AggregateQuery) -> tuple[bool, tuple[ClippedArgument, ...]]:
        """(whether the cap histogram runs, the expressions whose bounds are chosen)."""
        clipped = clipped_arguments(query) if query.table_policy.auto_clipping else ()
        # With a privacy unit the cap histogram also tells the clipping rule how many rows
        # there are; on an event-level table the value histogram counts the rows itself.
        rows = query.privacy_unit is not None and (
            (query.auto_cap and _cap_matters(query)) or bool(clipped))
        return rows, clipped

    def _selection_statements(self, prepared: _Prepared
                              ) -> tuple[tuple[tuple[str, ...], int, str], ...]:
        """The selection histograms ``_choose_cap`` runs: (what, bins, SQL) each, in order.

        Built (and planned, by ``execute``) before the claim; each SQL depends only on the
        query, so it is built once per query shape."""
        query = prepared.query
        limit = query.table_policy.contribution_bound
        with_rows, clipped = self._selection(query)
        builds: list[tuple[tuple[str, ...], int, Any]] = []
        if _bounds_groups(query):  # g first: the histogram of distinct groups per unit
            starts = cap_bins(limit)
            builds.append((("groups",), len(starts), lambda: group_histogram(
                query, prepared.restriction, prepared.sample, starts)))
        for arg in clipped:
            edges = magnitude_edges(max(abs(arg.lower), abs(arg.upper)))
            builds.append((("clip", arg.key), STEPS + 2, lambda e=edges, a=arg: value_histogram(
                query, a.argument, a.lower, a.upper, e, prepared.restriction, prepared.sample)))
        if with_rows:
            starts = cap_bins(limit)
            builds.append((("cap",), len(starts), lambda: cap_histogram(
                query, prepared.restriction, prepared.sample, starts)))
        out = []
        for what, size, build in builds:
            key = (query.normalized_sql, prepared.restriction, prepared.sample, *what)
            sql = self._histograms.get(key)
            if sql is None:  # the histogram's SQL depends only on the query: build it once
                sql = dialect(build(), self.dialect).sql(self.dialect)
                # The engine noises it (_choose_cap).
                self.verify_outgoing(sql, "noised_by_proxy", query.tables)
                self._histograms.put(key, sql)
            out.append((what, size, sql))
        return tuple(out)

    def _choose_cap(self, prepared: _Prepared, run: QueryRun,
                    selection: Sequence[tuple[tuple[str, ...], int, str]]
                    ) -> tuple[int, tuple[tuple[str, float, float], ...], int | None]:
        """Run the noisy histograms (``selection``, from ``_selection_statements``), pick the
        cap and the bounds (``mechanisms.caps``).

        Each histogram has sensitivity 1 and gets an equal part of the selection epsilon, so
        together they cost exactly ``prepared.cap_epsilon`` (basic composition).
        """
        query, plan = prepared.query, prepared.plan
        limit = query.table_policy.contribution_bound
        with_rows, clipped = self._selection(query)
        by_groups = _bounds_groups(query)
        eps_h = prepared.cap_epsilon / (int(with_rows) + int(by_groups) + len(clipped))
        statements = {what: (size, sql) for what, size, sql in selection}
        per_unit = None
        if by_groups:  # g first: the histogram of distinct groups per unit (sensitivity 1)
            starts = cap_bins(limit)
            exact = self._histogram(prepared, run, ("groups",), *statements[("groups",)])
            noisy = DiscreteLaplace.from_sensitivity(1, eps_h).sample(exact)
            gate = plan.threshold  # its epsilon and delta are public: the rule weighs tau(g)
            assert gate is not None
            per_unit = choose_groups(RowModel(starts, tuple(float(v) for v in noisy), limit,
                                              eps_h), gate.mechanism.epsilon, gate.delta)
        columns = []
        for arg in clipped:
            exact = self._histogram(prepared, run, ("clip", arg.key),
                                    *statements[("clip", arg.key)])
            # The exact weights never leave this function: only their noisy version is used.
            noisy = Snapping.from_sensitivity(1.0, eps_h).sample(exact)
            columns.append(ClipColumn(arg.lower, arg.upper, tuple(float(v) for v in noisy),
                                      eps_h))  # its epsilon: biases at their upper estimates
        if with_rows:
            starts = cap_bins(limit)
            exact = self._histogram(prepared, run, ("cap",), *statements[("cap",)])
            noisy = DiscreteLaplace.from_sensitivity(1, eps_h).sample(exact)
            rows = RowModel(starts, tuple(float(v) for v in noisy), limit, eps_h)
        else:  # event level: the units (rows) the value histograms counted
            rows = RowModel.exact_rows(max(max(sum(max(h, 0.0) for h in c.noisy), 1.0)
                                           for c in columns))
        index = {arg.key: i for i, arg in enumerate(clipped)}
        by_id = {m.id: m for m in query.measurements}
        terms = []
        for mid, mechanism in plan.all_mechanisms().items():
            m = by_id.get(mid)
            column = index.get(m.argument.sql()) if m is not None and m.argument is not None \
                else None
            kind = "count" if m is None or m.integral else m.kind
            # With g bounded, the unreleased key-release count's scale is min(g, k) / eps:
            # the cap rule leaves it out (g, not k, sets tau).
            weight = 0.0 if per_unit is not None and mid == THRESHOLD_ID \
                else _cap_weight(query, mid)
            terms.append(CapTerm(weight, mechanism.epsilon,
                                 m.total if m is not None else False, column,
                                 "count" if kind == "count_units" else kind,
                                 bool(m is not None and m.center)))
        groups = 1
        if query.keys and not query.thresholded:
            groups = math.prod(len(k.public_values or ()) for k in query.keys)
        auto = query.auto_cap and _cap_matters(query)
        choice = choose(rows, terms, columns, groups, None if auto else (query.stability,))
        return choice.cap, tuple((arg.key, *columns[i].interval(choice.bounds[i]))
                                 for i, arg in enumerate(clipped)), per_unit

    def _histogram(self, prepared: _Prepared, run: QueryRun, what: tuple[str, ...], size: int,
                   sql: str) -> np.ndarray:
        """Run one selection histogram: its exact (bin, value) rows as a vector of ``size``."""
        exact = np.zeros(size)
        for index, value in self._run(sql, run).rows:
            exact[int(index)] = float(value)
        return exact

    def _check_plans(self, statements: Sequence[str]) -> None:
        """Have the database plan every statement of a query (EXPLAIN), reading no row: one it
        cannot plan is refused here, before the claim, so it costs nothing.

        The verdict "plans fine" is kept per statement text: the text of a query shape (its
        final statement at the limit cap and declared bounds, its histograms) is the same on
        every call, so the extra round trip is paid once per shape.  A failure is not kept: it
        raises, and is rare.
        """
        for sql in statements:
            if sql in self._planned:
                continue
            try:
                self.backend.run("EXPLAIN " + sql)
            except StatementFailed as err:
                # EXPLAIN reads no row, whatever the backend's classification of the error.
                log.warning("a rewritten statement does not plan; refused before the claim")
                log.debug("plan error detail: %s", err.detail)
                raise QueryRefused(
                    "the database cannot plan this query (e.g. a function applied to an "
                    "argument of the wrong type); nothing was charged",
                    hint="check the types of the query's expressions; if the query is valid "
                    "SQL for the database, this is a bug in the proxy: please report it",
                ) from None
            self._planned.put(sql, True)

    def _prepare_uncached(self, query: AggregateQuery, epsilon: float, delta: float,
                          reads: BlocksRead | None, restriction: BlockRestriction | None,
                          sample: tuple[str, str] | None) -> _Prepared:
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
            plan = plan_noise(requests, epsilon, delta, threshold,
                              self.policy.privacy.threshold_epsilon_share)
        except ValueError as err:  # e.g. a scale beyond what the mechanisms can render
            raise InvalidParameter(
                f"cannot calibrate noise for epsilon={epsilon:g}: {err}",
                hint="ask for a larger epsilon",
            ) from None
        rewritten: RewrittenQuery | None = None
        if self.policy.privacy.noise == "sql":
            # Only the noise scales, caps and bounds change between calls of one query shape:
            # filled into its text template (chorus_py.templates); the tree is not kept, only
            # proxy noise reads it.
            sql = one_table_sql(
                self._templates, (query.normalized_sql, restriction, sample, self.dialect),
                query, plan, self.dialect, sample is not None,
                lambda q, p: pipeline(q, p, restriction, self.dialect, sample).sql_with_noise(p))
        else:
            rewritten = pipeline(query, plan, restriction, self.dialect, sample)
            sql = rewritten.measure_sql()
        report = self._report(query, plan, "", reads, sql)
        return _Prepared(query, plan, reads, rewritten, sql, report, restriction, sample, 0.0)

    def _blocks(self, query: AggregateQuery) -> tuple[BlocksRead | None, BlockRestriction | None]:
        block = query.table_policy.block
        if block is None:
            return None, None
        windows = self.blocks.windows(query.table, block)
        key = (query.normalized_sql, windows)  # the windows name their table
        found = self._reads.get(key)
        if found is None:
            reads = blocks_read(query, windows)
            column_type = query.table_policy.columns[block.column].type
            found = (reads, BlockRestriction(block.column, column_type, reads.start, reads.end,
                                             reads.separate_runs))
            self._reads.put(key, found)
        return found

    def verify_outgoing(self, sql: str, release: Release, tables: Sequence[str] = ()) -> None:
        """The outgoing check (``analyses.outgoing``, wall 4) of a statement about to run:
        InternalError if it reads a private table outside the bounding-and-noise structure,
        or one not among ``tables`` (those its analysis reads).  Every statement derived from
        analyst SQL passes here before the backend sees it."""
        # A digest of the text, not the text (several kB per statement), as the cache key.
        key = (hashlib.blake2b(sql.encode(), digest_size=16).digest(), release, *sorted(tables))
        if key in self._verified:
            return
        check_outgoing(sql, self.dialect, self._outgoing, release, frozenset(tables))
        self._verified.put(key, True)

    def _check_finish(self, prepared: _Prepared) -> None:
        """Proxy noise: plan the finishing statement too (it runs in the scratch DuckDB over the
        noisy values, after the data was read), over an empty table of the types it will have,
        so a finish that cannot plan is refused before the claim.

        The keys' types are inferred from the policy's column types; a key whose type cannot
        be inferred leaves the finish unchecked (a failure there then keeps the charge, as
        every failure after a statement read the data does)."""
        rewritten = prepared.rewritten
        assert rewritten is not None
        keys = _key_types(prepared.query)
        if keys is None:
            return
        integral = {m.id for m in prepared.query.measurements if m.integral} | {THRESHOLD_ID}
        columns = tuple(zip(rewritten.key_ids, keys, strict=True)) + tuple(
            (mid, "BIGINT" if mid in integral else "DOUBLE") for mid in rewritten.measure_ids)
        finish = rewritten.finish.sql("duckdb")
        if (finish, columns) in self._planned:
            return
        con = self._scratch_cursor()
        try:
            con.execute(f"CREATE TEMP TABLE {NOISY} (" + ", ".join(
                f"{n} {t}" for n, t in columns) + ")")
            con.execute("EXPLAIN " + finish)
        except duckdb.Error as err:
            log.warning("a proxy-noise finish does not plan; refused before the claim")
            log.debug("plan error detail: %s", err)
            raise QueryRefused(
                "the outputs of this query cannot be computed from its noisy aggregates (e.g. "
                "a function applied to an argument of the wrong type); nothing was charged",
                hint="check the types of the query's output expressions") from None
        finally:
            con.close()
        self._planned.put((finish, columns), True)

    def _run(self, sql: str, run: QueryRun | None, public: bool = False) -> ResultSet:
        """Run one statement of a query; ``run`` is the query's charge (None: nothing claimed,
        e.g. a public query; ``public``: a public-only query, on the restricted connection).
        A failure refunds the claim only when no statement of the query read a row (Wall 6);
        the message never quotes the database's, which may hold data."""
        if run is None:
            run = QueryRun(None)
        try:
            result = self.backend.run_public(sql) if public else self.backend.run(sql)
        except StatementFailed as err:
            # The detail may quote data values: operators see it at debug level, analysts never.
            log.warning("backend error on a rewritten query (touched data: %s)", err.touched_data)
            log.debug("backend error detail: %s", err.detail)
            run.failed(err.touched_data)
            refunded = run.refund_if_untouched(self.ledger)
            if err.cancelled is not None:
                raise StatementCanceled(
                    f"canceling statement due to {err.cancelled}",
                    hint=("the budget of this query was charged (the database may have read "
                          "rows); " if run.claim is not None and not refunded else "")
                    + "ask for less work; the data owner sets backend.statement_timeout_seconds",
                ) from None
            if refunded or (run.claim is None and not err.touched_data):
                raise InternalError(
                    "the database could not plan the rewritten query; nothing was charged",
                    hint="this is a bug in the proxy: please report the query",
                ) from None
            if run.claim is None:  # a public query, or one that reads no block
                raise BackendError(
                    "the database failed while evaluating the query; no detail is shown "
                    "because it could depend on the data",
                    hint="nothing was charged (the query claims no budget); check the query's "
                    "expressions",
                ) from None
            raise BackendError(
                "the database failed while evaluating the query; no detail is shown "
                "because it could depend on the data",
                hint="the budget of this query was charged, as a statement of it read the "
                "data; check the query's expressions",
            ) from None
        run.read()
        return result

    def _run_proxy_noise(self, prepared: _Prepared, run: QueryRun) -> ResultSet:
        exact = self._run(prepared.sql, run)
        rewritten, plan = prepared.rewritten, prepared.plan
        assert rewritten is not None  # proxy noise always keeps the rewrite
        mechanisms = plan.all_mechanisms()
        n_keys = len(rewritten.key_ids)
        columns = list(zip(*exact.rows, strict=True)) if exact.rows else [
            () for _ in exact.columns]
        noisy_columns: list[list[Any]] = [list(c) for c in columns[:n_keys]]
        # Counts (and the key-release count) are integers; everything else is a float.
        integral = {m.id for m in prepared.query.measurements if m.integral} | {THRESHOLD_ID}
        for mid, values in zip(rewritten.measure_ids, columns[n_keys:], strict=True):
            raw = np.array([0.0 if v is None else float(v) for v in values], dtype=float)
            noisy = mechanisms[mid].sample(raw)
            noisy_columns.append([int(v) if mid in integral else float(v) for v in noisy])
        con = self._scratch_cursor()
        try:
            types = [_DUCKDB_TYPES.get(t, "VARCHAR") for t in exact.types[:n_keys]]
            types += ["BIGINT" if mid in integral else "DOUBLE" for mid in rewritten.measure_ids]
            names = list(rewritten.key_ids) + list(rewritten.measure_ids)
            con.execute(f"CREATE TEMP TABLE {NOISY} (" + ", ".join(
                f"{n} {t}" for n, t in zip(names, types, strict=True)) + ")")
            rows = list(zip(*noisy_columns, strict=True))
            if rows:
                con.executemany(f"INSERT INTO {NOISY} VALUES ({', '.join('?' * len(names))})",
                                rows)
            try:
                cur = con.execute(rewritten.finish.sql("duckdb"))
                desc = cur.description or []
                return ResultSet(tuple(d[0] for d in desc),
                                 tuple(portable_type(str(d[1])) for d in desc), cur.fetchall())
            except duckdb.Error as err:
                # After the data was read: charged (the claim stays consumed).  The detail may
                # quote a noisy value: the log only.
                log.debug("proxy-noise finish error detail: %s", err)
                raise BackendError(
                    "the outputs of this query could not be computed from its noisy aggregates",
                    hint="the budget of this query was charged, as its measurements read the "
                    "data; check the query's output expressions") from None
        finally:
            con.close()

    # -- reports -------------------------------------------------------------------------------
    def _with_contribution(self, report: PrivacyReport, query: AggregateQuery,
                           cap_epsilon: float, cap: int | None,
                           clipped: tuple[ClippedArgument, ...],
                           bounds: tuple[tuple[str, float, float], ...],
                           groups: int | None = None, reused: bool = False) -> PrivacyReport:
        limit = query.table_policy.contribution_bound
        mode: Literal["auto", "fixed"] = "auto" if query.auto_cap else "fixed"
        with_rows, _ = self._selection(query)
        by_groups = _bounds_groups(query)
        steps = []
        parts = int(with_rows) + int(by_groups) + len(clipped)
        eps_h = cap_epsilon / parts if parts else 0.0
        if by_groups:
            steps.append(SelectionStep(
                "groups", f"groups per {query.privacy_unit} (sets the key-release threshold: "
                "D = min(g, cap) groups per unit)", f"limit {limit}", eps_h, "discrete_laplace",
                None if groups is None else f"{groups} groups"))
        if with_rows:
            unit = query.privacy_unit
            steps.append(SelectionStep(
                "cap", f"rows per {unit}" if mode == "auto" else
                f"rows per {unit} (estimates the rows kept, for the clipping bounds)",
                f"limit {limit}", eps_h, "discrete_laplace",
                None if cap is None else f"cap {cap}" + ("" if mode == "auto" else " (fixed)")))
        chosen_bounds = {key: (lo, hi) for key, lo, hi in bounds}
        for arg in clipped:
            got = chosen_bounds.get(arg.key)
            steps.append(SelectionStep(
                "bounds", display_sql(arg.argument), f"[{arg.lower:g}, {arg.upper:g}]", eps_h,
                "snapping", None if got is None else f"[{got[0]:g}, {got[1]:g}]"))
        if reused:
            chosen: int | None = cap if mode == "auto" else limit
            note = ("the choices of your identical earlier query (same SQL, epsilon, delta and "
                    "blocks, within privacy.choice_reuse_seconds) are reused: they are noisy, "
                    "differentially private outputs already paid for, so reusing them costs "
                    "nothing and all of epsilon goes to the answer")
            steps = [dataclasses.replace(step, epsilon=0.0, mechanism="reused") for step in steps]
        elif cap_epsilon == 0:
            note = ("COUNT(DISTINCT unit) needs one row per unit: cap 1, no epsilon spent on "
                    "choosing it")
            chosen = query.stability
        else:
            chosen = cap if mode == "auto" else limit
            what = " and ".join(
                (["the cap"] if mode == "auto" else [])
                + (["the groups per unit"] if by_groups else [])
                + (["the clipping bounds of " + ", ".join(s.target for s in steps
                                                          if s.kind == "bounds")]
                   if clipped else []))
            note = (f"{what} chosen per query from noisy histograms (sensitivity 1 each, "
                    f"epsilon {eps_h:g} each, {cap_epsilon:g} in all); "
                    + ("the choices are noisy, differentially private outputs"
                       if cap is not None else
                       f"sensitivities above are shown at the limit {limit} and the declared "
                       "bounds; the choice is made when the query runs"))
        contribution = ContributionReport(mode, limit, chosen, cap_epsilon, note,
                                          steps=tuple(steps))
        return dataclasses.replace(report, epsilon=report.epsilon + cap_epsilon,
                                   contribution=contribution)

    def _public_report(self, analyst: str, query: PublicQuery) -> PrivacyReport:
        return PrivacyReport(
            analyst=analyst, verdict="allowed", charged=False, epsilon=0.0, delta=0.0,
            noise="none", tables=query.tables, blocks=(),
            notes=("public tables only: answered exactly, free of charge",),
        )

    def _report(self, query: AggregateQuery, plan: NoisePlan, analyst: str,
                reads: BlocksRead | None, sql: str) -> PrivacyReport:
        measurements = []
        for m in query.measurements:
            mech = plan.mechanisms[m.id]
            arg = display_sql(m.argument) if m.argument is not None else "*"
            if m.center:
                arg = f"{arg} - {m.center:g}"
            measurements.append(MeasurementReport(
                m.id, f"{_AGGREGATE_NAMES[m.kind]}({arg})" if m.kind != "count_units"
                else f"COUNT(DISTINCT {query.privacy_unit})", m.sensitivity, m.derivation,
                mech.describe(), mech.error_bound(0.95)))
        by_id = {m.id: m for m in measurements}
        columns = []
        for out in query.outputs:
            if out.key is not None:
                columns.append(ColumnReport(out.name, "group_key", out.source, ()))
            elif not out.measurements:
                columns.append(ColumnReport(out.name, "constant", out.source, ()))
            elif out.expr.sql() in by_id:
                m = by_id[out.expr.sql()]
                columns.append(ColumnReport(
                    out.name, "aggregate", out.source, (m.id,), m.mechanism["name"],
                    m.mechanism["scale"], m.error_bound_95))
            else:
                columns.append(ColumnReport(
                    out.name, "derived", out.source, out.measurements,
                    note="post-processing of noisy measurements " + ", ".join(out.measurements)
                    + ": " + out.expr.sql()))
        key_release = None
        if plan.threshold is not None:
            t = plan.threshold
            key_release = KeyRelease(
                "threshold", t.threshold, t.measurement_id, t.delta,
                note=f"a group is released only if its noisy count ({t.measurement_id}, "
                f"scale {t.mechanism.scale:g}) exceeds tau = 1 + b ln(D / delta), D = "
                f"{query.groups_per_unit} groups per unit"
                + (f" (its rows kept in at most {query.max_groups} groups)"
                   if query.max_groups is not None and query.max_groups < query.stability
                   else f" (its <= {query.stability} rows)" if query.privacy_unit else ""),
            )
        elif query.keys:
            key_release = KeyRelease("public_values", note="every declared value, nothing else")
        notes = []
        contribution = None
        if query.table_policy.multi_attribution:
            contribution = attribution_report(query.table_policy)
            notes.append(contribution.note)
        elif query.privacy_unit is not None:
            how = ("a stored random sample (bounding = 'materialized')"
                   if query.table_policy.bounding == "materialized"
                   else "a random choice among the rows that pass the filter")
            notes.append(f"at most {query.stability} rows per {query.privacy_unit}, by {how}")
        notes += [f"epsilon split equally over {len(plan.mechanisms)} noisy measurement(s)"
                 + (" after the key-release count" if plan.threshold and plan.threshold.separate
                    else "")]
        if self.policy.privacy.noise == "proxy":
            notes.append("noise added by the proxy from os.urandom")
        else:
            notes.append("noise added by the database (random()); counts use discrete Laplace, "
                         "sums the snapping mechanism")
        return PrivacyReport(
            analyst=analyst, verdict="allowed", charged=False, epsilon=plan.epsilon,
            delta=plan.delta, noise=self.policy.privacy.noise, tables=(query.table,),
            blocks=reads.ids if reads is not None else (query.table,),
            stability=query.stability, privacy_unit=query.privacy_unit,
            measurements=tuple(measurements), columns=tuple(columns), key_release=key_release,
            rewritten_sql=sql, notes=tuple(notes), contribution=contribution,
        )

    def _check_types(self, live: dict[str, dict[str, str]]) -> None:
        families = {"int": ("integer",), "float": ("float", "integer"), "text": ("text",),
                    "bool": ("boolean",), "date": ("date",), "timestamp": ("timestamp",)}
        for name, table in self.policy.tables.items():
            for col, cp in table.columns.items():
                actual = live[name][col]
                if actual not in families[cp.type]:
                    raise PolicyError(
                        f"{self.policy.source}: tables.{name}.columns.{col}.type: declared "
                        f"'{cp.type}' but the database column is {actual}",
                        hint="declare the type the database has",
                    )


def _key_types(query: AggregateQuery) -> list[str] | None:
    """The DuckDB type each group key of ``query`` gets in the proxy-noise finish, inferred
    from the policy's column types; None when one cannot be inferred."""
    tables = {query.alias: query.table_policy}
    if query.join is not None:
        tables = {s.alias: s.policy for s in query.join.sources}
    schema = {alias: {c: _DUCKDB_TYPES[_PORTABLE[cp.type]] for c, cp in tp.columns.items()}
              for alias, tp in tables.items()}
    out = []
    for key in query.keys:
        if isinstance(key.expr, exp.Column):
            found = schema.get(key.expr.table, {}).get(key.expr.name)
        else:
            expr = key.expr.copy()
            for column in expr.find_all(exp.Column):
                declared = schema.get(column.table, {}).get(column.name)
                if declared is None:
                    return None
                column.type = exp.DataType.build(declared)
            try:
                typed = annotate_types(expr).type
            except Exception:  # sqlglot cannot type it: leave the finish unchecked
                return None
            found = _DUCKDB_TYPES.get(portable_type(typed.sql("duckdb") if typed else ""))
        if found is None:
            return None
        out.append(found)
    return out


def _bounds_groups(query: AggregateQuery) -> bool:
    """Whether the query's rows per unit are also kept in at most g groups, g chosen with the
    cap: automatic caps and keys released by thresholding (``mechanisms.caps.choose_groups``)."""
    return query.auto_cap and query.thresholded and query.privacy_unit is not None


def _cap_matters(query: AggregateQuery) -> bool:
    """Whether some noise scale of the query grows with the row cap k."""
    if query.thresholded:
        return True  # the key-release count reaches up to k groups per unit
    return any(_cap_weight(query, m.id) > 0 for m in query.measurements)


def _cap_weight(query: AggregateQuery, mid: str) -> float:
    """w_m of ``mechanisms.caps``: how a measurement's noise, in rows, grows with the cap."""
    kinds = {m.id: m.kind for m in query.measurements}
    kind = kinds.get(mid, "count")  # the separate key-release count behaves like a count
    if kind == "count_units":
        return 1.0 if query.keys else 0.0  # ungrouped: sensitivity 1 whatever the cap
    return 1.0 if kind == "count" else 2.0


def _block_remaining(blocks: Sequence[BlockBudget]) -> tuple[BlockRemaining, ...]:
    return tuple(BlockRemaining(b.block_id, "retired" if b.state == "retired" else "active",
                                b.epsilon_left, b.delta_left, b.epsilon_spent, b.delta_spent)
                 for b in blocks)


def _portable_rows(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Postgres NUMERIC arrives as Decimal: report it as float, like every other backend."""
    return [tuple(float(v) if isinstance(v, Decimal) else v for v in row) for row in rows]


K = TypeVar("K")
V = TypeVar("V")


class _LRU(Generic[K, V]):
    """A small thread-safe least-recently-used cache."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._items: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._items[key] = value
            if len(self._items) > self._size:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._items
