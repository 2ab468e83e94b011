"""Per-person questions (``analyses.per_person``): an outer aggregate over one clipped row per
person.

Prepare: the blocks the inner query reads (its table's block column, from its WHERE), the noise
plan of the outer query (one row per person: COUNT -> 1, SUM(v) -> max(|L|, |U|)), the rewrite
of the outer query by ``rewriters.pipeline`` over a placeholder relation, which is then replaced
by the per-person SELECT::

    SELECT <clip(v, L, U)> AS v, ... FROM schema.t AS t
    WHERE <inner filter> AND <claimed blocks> GROUP BY t.unit

No row cap is needed: the inner GROUP BY unit is the barrier that gives each person one row,
and the clip bounds that row's value.  The outgoing verifier checks exactly that shape
(``analyses.outgoing``, per-person barrier).  Bounds come from the query or the policy; with
automatic clipping (the table's ``clipping``), the outer sums' bounds are then narrowed from
noisy histograms of the per-person values (a :class:`~chorus_py.kinds.selection.Selection`).
"""

from __future__ import annotations

import dataclasses

from sqlglot import exp

from analyses.blocks import BlocksRead, blocks_read
from analyses.per_person import RELATION, PerPersonQuery, per_row_derivations
from analyses.query import AggregateQuery
from budget.accounting import Event, events_for_plan
from chorus_py.caches import LRU
from chorus_py.errors import InvalidParameter
from chorus_py.kinds.analytic import (
    AnalyticQuery,
    Proxied,
    aggregate_report,
    finish_plan,
    run_analytic,
)
from chorus_py.kinds.base import Answer, Prepared, Services
from chorus_py.kinds.join import join_blocks
from chorus_py.kinds.selection import (
    Choices,
    Histogram,
    Selection,
    histogram_builders,
    with_contribution,
)
from chorus_py.report import PrivacyReport
from chorus_py.statements import QueryRun
from mechanisms.planning import NoisePlan, NoiseRequest, ThresholdRequest, plan_noise
from rewriters.blocks import BlockRestriction, blocks
from rewriters.clipping import clipping
from rewriters.dialect import rendered
from rewriters.pipeline import pipeline
from rewriters.selection import clipped_arguments


class PerPersonKind:
    """An aggregate of per-person values (a subquery or CTE grouped by the privacy unit)."""

    charges = True

    def __init__(self, services: Services) -> None:
        self.services = services
        self._prepared: LRU[tuple[object, ...], Prepared] = LRU(256)

    def prepare(self, query: PerPersonQuery, analyst: str, epsilon: float,
                delta: float) -> Prepared:
        """Plan, rewrite, verify and report; nothing charged.  With bounds still to choose, the
        query is prepared at the policy's bounds with its :class:`Selection` (or with the
        choices of an identical earlier query of this analyst, reused for free)."""
        prepared = self._cached(query, epsilon, delta)
        if prepared.selection is None:
            return prepared
        earlier = self.services.choices.get(analyst, prepared.selection.key)
        if earlier is not None:
            return self._cached(query, epsilon, delta, earlier, reused=True)
        return prepared

    def run(self, prepared: Prepared, run: QueryRun) -> Answer:
        """Run the statement (noised in SQL, or measured then noised by the proxy)."""
        return run_analytic(self.services.statements, prepared.detail,
                            self.services.policy.privacy.noise, run)

    def _cached(self, query: PerPersonQuery, epsilon: float, delta: float,
                chosen: Choices | None = None, reused: bool = False) -> Prepared:
        reads, restrictions = self._blocks(query)
        key = (query.normalized_sql, epsilon, delta, restrictions, chosen, reused)
        found = self._prepared.get(key)
        if found is None:
            found = self._prepare(query, epsilon, delta, reads, restrictions, chosen,
                                  reused)
            self._prepared.put(key, found)
        return found

    def _prepare(self, query: PerPersonQuery, epsilon: float, delta: float,
                 reads: BlocksRead | None, restrictions: Restrictions,
                 chosen: Choices | None, reused: bool) -> Prepared:
        services = self.services
        outer = query.outer
        per_person = relation(query, restrictions)
        # Bounds from the policy are wide (k rows' worth): with automatic clipping, the outer
        # sums' bounds are narrowed per query from noisy histograms of the per-person values
        # (kinds.selection, mechanisms.clip_bounds; event level: each person is one row of
        # weight 1), paid from cap_epsilon_share of epsilon; reused choices cost nothing.
        clipped = clipped_arguments(outer) if outer.table_policy.auto_clipping else ()
        choice_epsilon = 0.0 if reused or not clipped else \
            epsilon * services.policy.privacy.cap_epsilon_share
        if chosen is not None:
            outer = per_row_derivations(outer.with_bounds(
                {a: (lo, hi) for a, lo, hi in chosen.bounds}), query.unit)
        plan = _noise_plan(outer, epsilon - choice_epsilon, delta,
                           services.policy.privacy.threshold_epsilon_share)
        rewritten = pipeline(outer, plan, None, services.dialect)
        rewritten = dataclasses.replace(rewritten, measure=_splice(rewritten.measure,
                                                                   per_person))
        proxy = services.policy.privacy.noise != "sql"
        sql = rewritten.measure_sql(consume=True) if proxy else rewritten.sql_with_noise(plan)
        services.statements.verify_outgoing(sql, services.release, query.tables,
                                            gate=plan.gate)
        detail = AnalyticQuery(outer, plan, reads, Proxied.of(rewritten) if proxy else None, sql,
                               chosen=chosen)
        report = _report(query, aggregate_report(outer, plan, reads, sql,
                                                 services.policy.privacy.noise), reads)
        if clipped:
            report = with_contribution(report, outer, choice_epsilon, chosen, clipped, reused)
        still_open = bool(clipped) and chosen is None
        events = (Event.epsilon_delta(report.epsilon, report.delta),) if still_open \
            else events_for_plan(plan)
        statements: tuple[str, ...] = (sql,)
        selection = None
        if still_open:
            histograms = self._histograms(outer, per_person, query.tables)
            selection = Selection(outer, plan, choice_epsilon, histograms,
                                  (query.normalized_sql, epsilon, delta, restrictions),
                                  lambda choice: self._cached(query, epsilon, delta, choice))
            statements += tuple(h for _, _, h in histograms)
        return Prepared(report, report.blocks, events, detail, statements=statements,
                        finish=finish_plan(detail) if proxy else None,
                        answer_key=(query.normalized_sql, epsilon, delta, report.blocks),
                        selection=selection)

    def _histograms(self, outer: AggregateQuery, per_person: exp.Select,
                    tables: tuple[str, ...]) -> tuple[Histogram, ...]:
        """The value histograms of the outer sums, read from the per-person rows."""
        out = []
        for what, size, build in histogram_builders(outer, None, None):
            tree = _splice(build(), per_person)
            sql = rendered(tree, self.services.dialect)
            self.services.statements.verify_outgoing(sql, "noised_by_proxy", tables)
            out.append((what, size, sql))
        return tuple(out)

    def _blocks(self, query: PerPersonQuery) -> tuple[BlocksRead | None, Restrictions]:
        """The blocks the subquery reads, and each private occurrence's window by alias."""
        rows = query.rows
        if rows.join is not None:
            reads, by_alias = join_blocks(self.services.blocks, rows)
            return reads, tuple(sorted(by_alias.items()))
        block = rows.table_policy.block
        if block is None:
            return None, ()
        reads = blocks_read(rows, self.services.blocks.windows(query.table, block))
        column_type = rows.table_policy.columns[block.column].type
        return reads, ((query.alias, BlockRestriction(block.column, column_type, reads.start,
                                                      reads.end, reads.separate_runs)),)


# The claimed window of every private table occurrence, by alias (hashable: a cache key).
Restrictions = tuple[tuple[str, BlockRestriction], ...]


def relation(query: PerPersonQuery, restrictions: Restrictions) -> exp.Select:
    """The per-person SELECT: each value clipped to [L, U] (NULL stays NULL), the subquery's
    tables (each qualified by the schema) and filter, the claimed blocks of every private
    occurrence, grouped by the unit of the first table."""
    items = []
    for v in query.values:
        clipped = clipping(v.expr, v.lower, v.upper)
        if v.integral:  # an integer in [L, U] (or NULL): the cast is exact and cannot fail
            clipped = exp.cast(clipped, exp.DType.BIGINT)
        items.append(exp.alias_(clipped, v.name))
    where = query.rows.where
    for alias, r in restrictions:
        where = blocks(where, exp.column(r.column, table=alias), r.start, r.end,
                       r.column_type, r.windows)
    join = query.rows.join
    first = join.tree.args["from_"].this.copy() if join is not None else \
        exp.table_(query.table, alias=query.alias)
    select = exp.select(*items).from_(_qualified(first, query.schema), copy=False)
    for j in (join.tree.args.get("joins") or []) if join is not None else []:
        node = j.copy()
        node.set("this", _qualified(node.this, query.schema))
        select.append("joins", node)
    if where is not None:
        select = select.where(where.copy(), copy=False)
    return select.group_by(exp.column(query.unit, table=query.alias), copy=False)


def _qualified(table: exp.Expr, schema: str | None) -> exp.Expr:
    """A base table named in the backend's schema (the outgoing check requires it)."""
    if isinstance(table, exp.Table) and schema is not None:
        table.set("db", exp.to_identifier(schema))
    return table


def _splice(measure: exp.Select, per_person: exp.Select) -> exp.Select:
    """``measure`` with the placeholder relation replaced by the per-person SELECT."""
    def visit(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Table) and node.name == RELATION and not node.args.get("db"):
            return exp.Subquery(this=per_person.copy(),
                                alias=exp.TableAlias(this=exp.to_identifier(node.alias_or_name)))
        return node

    spliced = measure.transform(visit)
    assert isinstance(spliced, exp.Select) and spliced.find(exp.Subquery) is not None
    return spliced


def _noise_plan(outer: AggregateQuery, epsilon: float, delta: float,
                share: float) -> NoisePlan:
    """The split of epsilon (and delta, for a key threshold) over the outer measurements."""
    requests = [NoiseRequest(m.id, m.sensitivity, m.integral) for m in outer.measurements]
    threshold = None
    if outer.thresholded:
        if delta <= 0:
            raise InvalidParameter(
                "grouping per-person values without public keys releases them through a noisy "
                "threshold, which needs delta > 0", hint="pass a small delta (e.g. 1e-8)")
        # One row per person: a person reaches one group (D = 1).
        threshold = ThresholdRequest(outer.threshold_source, 1)
    try:
        return plan_noise(requests, epsilon, delta, threshold, share)
    except ValueError as err:
        raise InvalidParameter(f"cannot calibrate noise for epsilon={epsilon:g}: {err}",
                               hint="ask for a larger epsilon") from None


def _report(query: PerPersonQuery, report: PrivacyReport,
            reads: BlocksRead | None) -> PrivacyReport:
    """The outer query's report, said about the private table and its people."""
    clips = "; ".join(f"{v.name} clipped to [{v.lower:g}, {v.upper:g}] (bounds from "
                      f"{v.origin})" for v in query.values)
    notes = (f"one row per {query.unit}: the subquery groups '{query.table}' by {query.unit}, "
             f"so adding or removing a person adds or removes one row; {clips}",
             *(n for n in report.notes if not n.startswith("at most")))
    return dataclasses.replace(
        report, tables=query.tables, privacy_unit=query.unit, stability=1,
        blocks=reads.ids if reads is not None else (query.table,), notes=notes)
