"""The engine: one analyst query in, one noisy answer and its privacy report out.

It orchestrates the steps of DESIGN.md section 3; each is owned by a package, and what differs
between kinds of query by a *kind* (``chorus_py.kinds``: public, single table, join, sampled):

1. parse, 2. validate, 3. resolve, 4. analyse  -> ``analyses`` (``Engine._analyse``, cached)
   then pick the kind                          -> ``Engine._pick``
5. plan noise, 7. rewrite, report              -> ``QueryKind.prepare`` (pure, cached per shape)
   plan every statement (EXPLAIN)              -> ``chorus_py.statements`` (wall 6)
6. claim                                       -> ``budget.ledger`` (consumed on grant; its
                                                  commit overlaps steps 8-9, waited for before
                                                  anything is released: ``QueryRun.settle``)
   choose caps and clipping bounds             -> ``chorus_py.kinds.selection`` (own epsilon)
8. execute, 9. post-process                    -> ``QueryKind.run`` through ``Statements.run``,
                                                  each statement checked by ``analyses.outgoing``
10. report                                     -> the prepared report, with the blocks' budget

Anything that fails before step 6 costs nothing.  After it, a failure is refunded only if no
statement of the query read a row (``chorus_py.statements.QueryRun``): once a selection histogram
or the answer read the data, the whole charge stays, and the message holds no data value.
Choices made on the data are kept only from answered queries.
"""

from __future__ import annotations

import dataclasses
import math
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from analyses.outgoing import rules_from_policy
from analyses.per_person import PerPersonQuery, analyze_per_person
from analyses.query import AggregateQuery, PublicQuery, analyze_query
from analyses.totality import check_statement_limits
from analyses.validate import TOO_DEEP, parse_statement
from budget.answers import AnswerCache
from budget.ledger import BlockBudget, Claim, Ledger, Viewer, open_ledger
from chorus_py.activity import Activity, query_event
from chorus_py.backends import SCHEMA, Backend, open_backend
from chorus_py.caches import LRU
from chorus_py.errors import BudgetExhausted, InvalidParameter, PolicyError, QueryRefused
from chorus_py.kinds.base import Prepared, QueryKind, Services
from chorus_py.kinds.join import JoinKind
from chorus_py.kinds.mixed import MixedKind
from chorus_py.kinds.per_person import PerPersonKind
from chorus_py.kinds.public import PublicKind
from chorus_py.kinds.quantile import QuantileKind
from chorus_py.kinds.sampled import SampledKind, SampledRequest
from chorus_py.kinds.single import SingleTableKind
from chorus_py.policy import LIVE_TYPES, AttributionTable, Policy, block_schemes, load_policy
from chorus_py.report import BlockRemaining, PrivacyReport, QueryResult
from chorus_py.statements import QueryRun, Statements
from chorus_py.stores.attribution import AttributionStore
from chorus_py.stores.frequencies import FrequencyCatalog
from chorus_py.stores.samples import BoundedSamples, ranked_copy_applies
from chorus_py.stores.schedules import BlockCatalog


class Engine:
    """Answers analyst SQL with differential privacy against one backend and one ledger."""

    def __init__(self, policy: Policy, backend: Backend | None = None,
                 ledger: Ledger | None = None, block_ttl_seconds: float = 60.0,
                 build_ranked_copies: bool = True) -> None:
        self.policy = policy
        self.dialect = policy.backend.dialect
        self.backend = backend or open_backend(policy.backend.url,
                                               policy.backend.statement_timeout_seconds,
                                               policy.backend.spark)
        try:
            live = self.backend.table_columns()
            policy.check_against(live)
            self._check_types(live)
            # Wall 5 (least privilege): public-only queries run on a connection restricted to
            # the public tables; refused at start when it could read a private one.
            # The private tables include the attribution tables the policy names (who wrote
            # which paper): the main connection reads them, and they are declared.
            self.backend.restrict_public(
                [t for t, tp in policy.tables.items() if tp.public],
                [t for t, tp in policy.tables.items() if not tp.public]
                + [tp.privacy_unit.table for tp in policy.tables.values()
                   if isinstance(tp.privacy_unit, AttributionTable)],
                policy.backend.public_url, block_ttl_seconds)
            # The schema table_columns read: the generated SQL names every table in it.
            self.schema = self.backend.current_schema()
        except BaseException:
            self.backend.close()
            raise
        try:
            self.ledger = ledger or open_ledger(policy.privacy, policy.source, policy.analysts)
        except BaseException as err:
            self.backend.close()
            if isinstance(err, ValueError | OSError | sqlite3.Error):
                raise PolicyError(f"{policy.source}: privacy.ledger: cannot open the budget "
                                  f"ledger: {err}") from None
            raise
        try:
            # Blocks cut two ways would overlap (fresh budget for the same rows): refused.
            self.ledger.check_block_schemes(block_schemes(policy))
        except BaseException:
            self.backend.close()
            if ledger is None:
                self.ledger.close()
            raise
        self.statements = Statements(self.backend, self.ledger, self.dialect,
                                     rules_from_policy(policy, self.schema, SCHEMA))
        self.answers = AnswerCache(policy.privacy.answer_cache_seconds)
        # Caps, clipping bounds and groups per unit chosen by an identical query's noisy
        # selection: reused for privacy.choice_reuse_seconds (post-processing, no budget).
        self.choices = AnswerCache(policy.privacy.choice_reuse_seconds)
        self.blocks = BlockCatalog()  # the policy's public schedules: reads no data
        # A one-shot command (build_ranked_copies=False) reads a ranked copy a server built but
        # never starts a build (it would wait for it at exit).
        self.samples = BoundedSamples(self.backend, block_ttl_seconds, self.blocks,
                                      build_ranked_copies)
        # Max frequencies of join keys (chorus_py.stores.frequencies), re-checked at most once
        # per TTL.
        self.frequencies = FrequencyCatalog(self.backend, block_ttl_seconds)
        # Tables whose rows belong to several units: queries read a stored kept set S.
        self.attribution = AttributionStore(self.backend, self.samples.naming_key,
                                            block_ttl_seconds)
        self.public_columns = {t: live[t] for t, tp in policy.tables.items() if tp.public}
        services = Services(
            policy, self.dialect, self.schema, self.statements, self.blocks, self.samples,
            self.attribution, self.frequencies, self.choices, self.public_columns)
        self.public = PublicKind(services)
        self.single = SingleTableKind(services)
        self.join = JoinKind(services)
        self.sampled = SampledKind(services)  # sensitivity sampling, opt-in per query
        self.quantile = QuantileKind(services, self._analyse)  # DP quantiles, MIN, MAX
        self.per_person = PerPersonKind(services)  # aggregates of per-person values
        # Quantiles next to COUNT/SUM/AVG-like aggregates: both kinds, one charge.
        self.mixed = MixedKind(services, self.quantile, self.single, self.join, self._analyse)
        # What the doors and the engine did, for the log and the metrics (chorus_py.activity).
        self.activity = Activity()
        # Steps 1-4 are pure functions of (SQL, policy): cached.
        self._analyses: LRU[str, AggregateQuery | PublicQuery | PerPersonQuery] = LRU(1024)
        # Which of the quantile kinds takes a text ("mixed", "quantile" or "": neither): a
        # parse each, so without this every query paid two parses (17% of the proxy's CPU
        # per query over the wire, measured with py-spy).
        self._quantile_routes: LRU[str, str] = LRU(1024)

    @classmethod
    def from_policy(cls, path: str | Path, **kwargs: Any) -> Engine:
        """Load and check a policy file, connect to its backend."""
        return cls(load_policy(path), **kwargs)

    def adopt_policy(self, policy: Policy) -> None:
        """Take a reloaded policy that differs from the current one only in what
        :func:`chorus_py.reload.reload_differences` allows (analysts, their tokens, passwords
        and limits; the owner's token).  Two attribute assignments, no lock: a query in
        flight finishes under what it read, the next one reads the new policy; sessions and
        caches stay (they depend on the tables and budgets, which are unchanged)."""
        self.ledger.analyst_caps = {name: a.max_epsilon_per_block
                                    for name, a in policy.analysts.items()
                                    if a.max_epsilon_per_block is not None}
        self.policy = policy

    def warm_up(self, wait: bool = False) -> None:
        """Start building the ranked copies that per-query bounding reads (``ranked_copy``,
        ``chorus_py.stores.samples``), so that the first queries need not rank their rows
        themselves for long; ``wait``: until they are built."""
        for table, tp in self.policy.tables.items():
            if ranked_copy_applies(tp):
                self.samples.ranked(table, tp)
        if wait:
            self.samples.wait()

    def close(self) -> None:
        """Close the backend and ledger connections (after any ranked copy being built)."""
        self.samples.wait()
        self.backend.close()
        self.ledger.close()
        self.statements.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- public API ---------------------------------------------------------------------------
    def prepare(self, sql: str, analyst: str | None = None, epsilon: float | None = None,
                delta: float | None = None, sensitivity: str | None = None,
                gamma: float | None = None) -> tuple[QueryKind, Prepared]:
        """Steps 1-5 and 7: the query's kind and the query prepared for its claim (pure:
        nothing runs on the data, nothing is charged)."""
        return self._prepare(sql, self._analyst(analyst), epsilon, delta, sensitivity, gamma)

    def explain(self, sql: str, analyst: str | None = None, epsilon: float | None = None,
                delta: float | None = None, sensitivity: str | None = None,
                gamma: float | None = None, door: str = "python") -> PrivacyReport:
        """What ``execute`` would do and cost, without running or charging anything
        (``door``: which front door asked, for the log and the metrics)."""
        started = time.perf_counter()
        try:
            report = self._explain(sql, analyst, epsilon, delta, sensitivity, gamma)
        except BaseException as err:
            self.activity.query(query_event(door, "explain", analyst, sql, started, error=err))
            raise
        self.activity.query(query_event(door, "explain", report.analyst or analyst, sql,
                                        started, report))
        return report

    def _explain(self, sql: str, analyst: str | None, epsilon: float | None,
                 delta: float | None, sensitivity: str | None,
                 gamma: float | None) -> PrivacyReport:
        analyst = self._analyst(analyst)
        kind, prepared = self._prepare(sql, analyst, epsilon, delta, sensitivity, gamma)
        if not kind.charges:
            return prepared.report
        return dataclasses.replace(prepared.report, analyst=analyst,
                                   remaining=self._remaining(prepared.report.blocks, analyst),
                                   accounting=self.ledger.accounting)

    def execute(self, sql: str, analyst: str | None = None, epsilon: float | None = None,
                delta: float | None = None, wait_seconds: float | None = None,
                sensitivity: str | None = None, gamma: float | None = None,
                remaining: bool = True, door: str = "python") -> QueryResult:
        """Answer ``sql`` with noise, charging (epsilon, delta) on the blocks it reads.

        A claim the scheduler cannot grant at once waits up to ``wait_seconds`` (default: the
        policy's ``scheduler.wait_seconds``), blocking this thread, then raises BudgetExhausted.
        ``sensitivity = "sampled"`` (with ``gamma``) opts in to sensitivity sampling: random DP
        (``chorus_py.kinds.sampled``); default: the policy's ``privacy.sensitivity``.
        ``remaining=False`` leaves the report's ``remaining`` (each block's budget left) empty:
        for a caller that does not show it, as it costs a conversion per block read, ~90.
        ``door`` names the front door that asked, for the log and the metrics
        (``chorus_py.activity``): every query, answered or refused, is recorded once.
        """
        started = time.perf_counter()
        try:
            result = self._execute(sql, analyst, epsilon, delta, wait_seconds, sensitivity,
                                   gamma, remaining)
        except BaseException as err:
            self.activity.query(query_event(door, "query", analyst, sql, started, error=err))
            raise
        self.activity.query(query_event(door, "query", result.report.analyst or analyst, sql,
                                        started, result.report))
        return result

    def _execute(self, sql: str, analyst: str | None, epsilon: float | None,
                 delta: float | None, wait_seconds: float | None, sensitivity: str | None,
                 gamma: float | None, remaining: bool) -> QueryResult:
        analyst = self._analyst(analyst)
        kind, prepared = self._prepare(sql, analyst, epsilon, delta, sensitivity, gamma)
        # Per analyst (budget.answers): a hit must never tell one that another asked the same.
        key = prepared.answer_key
        again = self.answers.get(analyst, key) if key is not None else None
        if again is not None:
            return self._answer_again(again, analyst, remaining)
        # Wall 6, charge before touching: every statement the query will run (the selection
        # histograms, the final statement at the limit cap and the declared bounds) is planned
        # by the database first, so one that cannot plan is refused before the claim.
        self.statements.check_plans(prepared.statements)
        if prepared.finish is not None:
            self.statements.check_scratch_plan(*prepared.finish)
        # The claim comes back consumed (charged before anything runs).  ``run`` records whether
        # any statement read a row: only if none did may a failure refund it (Statements.run).
        # Its commit overlaps the statements (Ledger.claim_overlapped): ``run.settle`` waits for
        # it before anything of the query leaves, an error included.
        claim, durable = self._claim(prepared, analyst, sql, wait_seconds, remaining)
        run = QueryRun(claim, durable)
        selection = prepared.selection
        chosen = None
        try:
            if selection is not None:
                chosen = selection.choose(self.statements, run)
                prepared = selection.apply(chosen)
            answer = kind.run(prepared, run)
        except BaseException:
            run.settle()  # an unrecorded charge is the error shown, not the query's
            raise
        run.settle()
        result = answer.result
        # Choices made on the data are kept for reuse only now: the query that paid for them
        # succeeded and its claim stays consumed (never after a failure, which may refund).
        if selection is not None and chosen is not None and claim is not None:
            for reuse_key, kept in selection.kept(chosen):
                self.choices.put(analyst, reuse_key, kept)
        report = prepared.report
        if kind.charges:
            report = dataclasses.replace(
                report, analyst=analyst, charged=claim is not None,
                accounting=self.ledger.accounting,
                warnings=(*report.warnings, *answer.warnings),
                remaining=self._remaining_after(claim) if remaining else ())
        released = QueryResult(result.columns, result.types, result.rows, report,
                               answer.error_bars)
        if claim is not None and key is not None:
            self.answers.put(analyst, key, released)
        return released

    # -- steps ----------------------------------------------------------------------------------
    def _prepare(self, sql: str, analyst: str, epsilon: float | None, delta: float | None,
                 sensitivity: str | None, gamma: float | None) -> tuple[QueryKind, Prepared]:
        kind, analysis = self._pick(sql, sensitivity, gamma)
        eps, dlt = self._parameters(analyst, epsilon, delta) if kind.charges else (0.0, 0.0)
        return kind, kind.prepare(analysis, analyst, eps, dlt)

    def _pick(self, sql: str, sensitivity: str | None,
              gamma: float | None) -> tuple[QueryKind, Any]:
        """The kind that answers ``sql``, and what its ``prepare`` takes."""
        if self.sampled.wanted(sensitivity, gamma) and self.sampled.accepts(sql):
            return self.sampled, SampledRequest(sql, gamma)
        route = self._quantile_routes.get(sql)
        if route is None:
            route = "mixed" if self.mixed.accepts(sql) else \
                "quantile" if self.quantile.accepts(sql) else ""
            self._quantile_routes.put(sql, route)
        if route == "mixed":
            return self.mixed, self.mixed.analyse(sql)
        if route == "quantile":
            return self.quantile, self.quantile.analyse(sql)
        analysis = self._analyse(sql)
        if isinstance(analysis, PublicQuery):
            return self.public, analysis
        if isinstance(analysis, PerPersonQuery):
            return self.per_person, analysis
        return (self.join if analysis.join is not None else self.single), analysis

    def _analyse(self, sql: str) -> AggregateQuery | PublicQuery | PerPersonQuery:
        hit = self._analyses.get(sql)
        if hit is not None:
            return hit
        limits = self.policy.limits
        check_statement_limits(sql, None, limits)  # the text's length, before parsing it
        parsed = parse_statement(sql, self.dialect, frozenset(self.policy.tables))
        check_statement_limits(sql, parsed.tree, limits)
        try:
            analysis = analyze_per_person(parsed, self.policy, self.dialect,
                                          self.public_columns, self.statements.run_constant,
                                          self.schema) or analyze_query(
                parsed, self.policy, self.dialect, self.public_columns,
                self.statements.run_constant, self.schema)
        except RecursionError:
            raise QueryRefused(TOO_DEEP, hint="simplify the query") from None
        self._analyses.put(sql, analysis)
        return analysis

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

    # -- budget (steps 6 and 10) -----------------------------------------------------------
    def _claim(self, prepared: Prepared, analyst: str, sql: str, wait_seconds: float | None,
               remaining: bool = True) -> tuple[Claim | None, Callable[[], None] | None]:
        """Claim the query's cost on every block it reads (None: it reads no block, e.g. a
        public query), and what waits for the charge to be on disk; with ``remaining``, the
        claim brings back each block's guarantee after it."""
        if not prepared.blocks:
            return None, None
        report = prepared.report
        self.ledger.ensure_blocks(prepared.blocks)
        try:
            return self.ledger.claim_overlapped(
                analyst, prepared.blocks, report.epsilon, report.delta, description=sql[:200],
                events=prepared.events, wait_seconds=wait_seconds,
                views=False if remaining else None)
        except ValueError as err:  # e.g. a negative wait time
            raise InvalidParameter(str(err)) from None
        except BudgetExhausted as err:
            # Say what this analyst can still ask for, not only that this ask is too much.
            left = self._left_message(analyst, prepared.blocks, report.delta)
            if not left:
                raise
            raise BudgetExhausted(f"{err.message}. {left[0].upper()}{left[1:]}",
                                  hint=err.hint) from None

    def _answer_again(self, answer: QueryResult, analyst: str,
                      remaining: bool = True) -> QueryResult:
        """An answer already released, served again: post-processing, no budget spent."""
        report = dataclasses.replace(
            answer.report, analyst=analyst, charged=False,
            remaining=self._remaining(answer.report.blocks, analyst) if remaining else (),
            notes=(*answer.report.notes, "the same noisy answer as your earlier identical query "
                   "over the same blocks (privacy.answer_cache_seconds): no budget spent"))
        return QueryResult(answer.columns, answer.types, list(answer.rows), report,
                           answer.error_bars)

    def _remaining(self, ids: tuple[str, ...], analyst: str) -> tuple[BlockRemaining, ...]:
        return self._binding(analyst, _block_remaining(self.ledger.remaining(ids)))

    def _remaining_after(self, claim: Claim | None) -> tuple[BlockRemaining, ...]:
        """The blocks after a charge: as the charging transaction saw them when it was ours."""
        if claim is None:
            return ()
        if claim.left:  # the guarantees as the charging transaction left them
            left = tuple(BlockRemaining(*left) for left in claim.left)
        elif claim.after:
            left = _block_remaining(claim.after)
        else:
            return self._remaining(claim.blocks, claim.analyst)
        return self._binding(claim.analyst, left)

    def _cap(self, analyst: str) -> float | None:
        mine = self.policy.analysts.get(analyst)
        return None if mine is None else mine.max_epsilon_per_block

    def _binding(self, analyst: str,
                 blocks: tuple[BlockRemaining, ...]) -> tuple[BlockRemaining, ...]:
        """Each block's epsilon left for ``analyst``: the smaller of the block's budget left and
        their own limit per block left (one more ledger read, only for an analyst with a
        limit).  Read through the analyst's own view: never another's spending."""
        cap = self._cap(analyst)
        if cap is None or not blocks:
            return blocks
        views = self.ledger.budget_view(Viewer.of(analyst), [r.block for r in blocks])
        spent = {v["block"]: v["by_analyst"].get(analyst, 0.0) for v in views}
        return tuple(_bind(r, cap - spent.get(r.block, 0.0)) for r in blocks)

    def budget_left(self, analyst: str | None = None) -> list[tuple[BlockRemaining, float]]:
        """Every block the ledger holds, as ``analyst`` may see it: what they can still spend
        on it (their own limit per block applied, as in a report's ``remaining``) and what they
        spent on it themselves.  Block totals are public; only their own spending is read (the
        ledger's view for them, ``Viewer.of``)."""
        analyst = self._analyst(analyst)
        cap = self._cap(analyst)
        out = []
        for view in self.ledger.budget_view(Viewer.of(analyst)):
            spent, left = view["guarantee_spent"], view["guarantee_left"]
            block = BlockRemaining(view["block"],
                                   "retired" if view["state"] == "retired" else "active",
                                   left["epsilon"], left["delta"], spent["epsilon"],
                                   spent["delta"])
            mine = view["by_analyst"].get(analyst, 0.0)
            out.append((block if cap is None else _bind(block, cap - mine), mine))
        return out

    def _left_message(self, analyst: str, blocks: tuple[str, ...], delta: float) -> str:
        """What ``analyst`` has left on ``blocks`` (for a budget refusal): the tightest block,
        whether their own limit or the block's budget binds there, and the delta left when
        it is below the query's ``delta`` (else a refusal for delta reads as one for epsilon,
        with plenty of epsilon left)."""
        left = self._remaining(blocks, analyst)
        if not left:
            return ""
        tight = min(left, key=lambda r: (r.epsilon_left, r.block))
        cap = self._cap(analyst)
        where = f"{len(left)} block(s) this query reads" if len(left) > 1 else "this block"
        text = (f"you have epsilon {tight.epsilon_left:.4g} left on the {where} "
                f"(tightest: {tight.block}")
        if cap is not None and tight.analyst_epsilon_left is not None:
            text += (f", where your own limit of {cap:g} per block leaves "
                     f"{tight.analyst_epsilon_left:.4g} and the block's budget "
                     f"{tight.block_epsilon_left:.4g})")
        else:
            text += f", whose budget leaves {tight.epsilon_left:.4g})"
        short = min(left, key=lambda r: (r.delta_left, r.block))
        if delta > 0 and short.delta_left < delta:
            text += (f"; delta is short: {short.delta_left:.3g} left on {short.block} where "
                     f"this query asks delta {delta:g} (ask with a smaller delta)")
        return text + "; SHOW chorus.budget (or GET /v1/budget) lists every block"

    def _check_types(self, live: dict[str, dict[str, str]]) -> None:
        for name, table in self.policy.tables.items():
            for col, cp in table.columns.items():
                actual = live[name][col]
                if actual not in LIVE_TYPES[cp.type]:
                    raise PolicyError(
                        f"{self.policy.source}: tables.{name}.columns.{col}.type: declared "
                        f"'{cp.type}' but the database column is {actual}",
                        hint="declare the type the database has",
                    )


def _bind(left: BlockRemaining, mine: float) -> BlockRemaining:
    """A block's budget left, with the analyst's own limit left (``mine``) when it binds."""
    mine = max(0.0, mine)
    return dataclasses.replace(
        left, epsilon_left=min(left.epsilon_left, mine),
        binding="analyst" if mine < left.epsilon_left else "block",
        block_epsilon_left=left.epsilon_left, analyst_epsilon_left=mine)


def _block_remaining(blocks: Sequence[BlockBudget]) -> tuple[BlockRemaining, ...]:
    return tuple(BlockRemaining(b.block_id, "retired" if b.state == "retired" else "active",
                                b.epsilon_left, b.delta_left, b.epsilon_spent, b.delta_spent)
                 for b in blocks)
