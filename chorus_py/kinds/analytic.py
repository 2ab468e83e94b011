"""What the two analytic kinds (one table, ``single``; joins, ``join``) share: the prepared
query's state, its report, and how its statement runs, noised by the database or by the proxy.

Noise in SQL (``privacy.noise = "sql"``): the rewritten statement adds the noise itself and its
answer is released as it comes.  Proxy noise (``"proxy"``): the statement returns the exact
measurements, which never leave this module: the proxy adds noise from os.urandom, then finishes
the outputs (ratios, arithmetic, HAVING, ORDER BY) over the noisy values in its scratch DuckDB.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import numpy as np
from sqlglot import exp
from sqlglot.optimizer.annotate_types import annotate_types

from analyses.blocks import BlocksRead
from analyses.keys import calendar_values, check_grid_size
from analyses.query import AggregateQuery, OutputColumn, display_sql
from analyses.smoothing import ResolvedJoin
from analyses.trees import dialect_named, sql_text
from chorus_py.backends import ResultSet, portable_type
from chorus_py.kinds.base import Answer, Prepared
from chorus_py.kinds.finish import finish_values, noisy_table
from chorus_py.kinds.selection import Choices
from chorus_py.report import (
    ColumnReport,
    KeyRelease,
    MeasurementReport,
    PrivacyReport,
)
from chorus_py.statements import QueryRun, Statements
from chorus_py.stores.attribution import attribution_report
from mechanisms.discrete_laplace import DiscreteLaplace
from mechanisms.intervals import (
    Bias,
    Interval,
    NoInterval,
    clamp_count,
    output_intervals,
    postprocessed,
    with_bias,
)
from mechanisms.key_release import KeyReleaseOdds, empty_result_message, key_release_odds
from mechanisms.planning import THRESHOLD_ID, NoisePlan
from rewriters.blocks import BlockRestriction
from rewriters.pipeline import RewrittenQuery, released_measurements

log = logging.getLogger("chorus.engine")

_AGGREGATE_NAMES = {"count": "COUNT", "count_units": "COUNT(DISTINCT unit)", "sum": "SUM",
                    "sum_squares": "SUM of squares"}
# Policy column types as the backends report them (chorus_py.backends.portable_type).
_PORTABLE = {"int": "integer", "float": "float", "text": "text", "bool": "boolean",
             "date": "date", "timestamp": "timestamp"}
_DUCKDB_TYPES = {"integer": "BIGINT", "float": "DOUBLE", "text": "VARCHAR", "date": "DATE",
                 "timestamp": "TIMESTAMP", "boolean": "BOOLEAN"}


@dataclass(frozen=True)
class Proxied:
    """What proxy noise needs of a rewrite: the columns its statement returns (group keys,
    then exact measurements) and the finish (DuckDB SQL over the noisy values, reading
    ``NOISY``: ``kinds.finish``)."""

    key_ids: tuple[str, ...]
    measure_ids: tuple[str, ...]
    finish: str

    @classmethod
    def of(cls, rewritten: RewrittenQuery) -> Proxied:
        """The parts of ``rewritten`` (its finish rendered now)."""
        return cls(rewritten.key_ids, rewritten.measure_ids, sql_text(rewritten.finish, "duckdb"))


@dataclass(frozen=True)
class AnalyticQuery:
    """The kind's state of a prepared analytic query (``Prepared.detail``).

    ``proxied``: what the proxy needs to noise and finish the answer (None: noise in SQL).
    ``cap_epsilon``: > 0 while the row cap (and bounds) are still to be chosen.
    ``resolved``: a join's smooth bound (None for one table).
    """

    query: AggregateQuery
    plan: NoisePlan
    reads: BlocksRead | None
    proxied: Proxied | None
    sql: str
    restriction: BlockRestriction | None = None
    sample: tuple[str, str] | None = None
    cap_epsilon: float = 0.0
    resolved: ResolvedJoin | None = None
    chosen: Choices | None = None  # the private choices the statement was made with


def run_analytic(statements: Statements, detail: AnalyticQuery, noise: str,
                 run: QueryRun) -> Answer:
    """Run the statement of an analytic query; with proxy noise, noise and finish it here.
    The statement returns the outputs, then the noisy measurements
    (``rewriters.pipeline.released_measurements``), split apart here."""
    if noise == "sql":
        result = portable(statements.run(detail.sql, run))
    else:
        result = portable(_run_proxy_noise(statements, detail, run))
    query = detail.query
    n = len(query.outputs)
    counts = _count_outputs(query)
    rows = [tuple(clamp_count(v) if i in counts and v is not None else v
                  for i, v in enumerate(r[:n])) for r in result.rows]
    noisy = tuple(tuple(None if v is None else float(v) for v in r[n:]) for r in result.rows)
    hidden = query.join is not None and query.join.data_dependent
    return Answer(ResultSet(result.columns[:n], result.types[:n], rows),
                  None if hidden else Accuracy(query, detail.plan, rows, noisy, detail.chosen))


def answer_prepared(statements: Statements, prepared: Prepared, noise: str,
                    max_epsilon: float, run: QueryRun) -> Answer:
    """The answer of a prepared analytic query (one table or a join): noised in SQL, or by
    the proxy.  When thresholding released no group, the answer says why, and what epsilon
    (up to ``max_epsilon``, the policy's per-query maximum) would release groups of a given
    size."""
    detail: AnalyticQuery = prepared.detail
    answer = run_analytic(statements, detail, noise, run)
    odds = key_release_odds_of(detail.query, detail.plan, prepared.report.epsilon)
    if odds is not None and not answer.result.rows:
        return dataclasses.replace(answer, warnings=(empty_result_message(
            *odds, max_epsilon=max_epsilon),))
    return answer


def key_release_odds_of(query: AggregateQuery, plan: NoisePlan,
                        epsilon: float) -> tuple[KeyReleaseOdds, str] | None:
    """What the key-release threshold of ``plan`` means for group sizes at the query's
    ``epsilon`` (``mechanisms.key_release``), and what its gate counts; None without one.
    Public inputs only (tau, the gate's scale, delta, D): free to show before and after."""
    gate = plan.threshold
    if gate is None or not isinstance(gate.mechanism, DiscreteLaplace):
        return None
    counted = f"distinct {query.privacy_unit}" if query.privacy_unit else "rows"
    return key_release_odds(gate.mechanism, gate.threshold, gate.delta,
                            query.groups_per_unit, epsilon), counted


def _show_key(expr: exp.Expr) -> str:
    """A group key as the report names it: SQL as Postgres writes it, names unquoted."""
    plain = expr.copy()
    for ident in plain.find_all(exp.Identifier):
        ident.set("quoted", False)
    return plain.sql(dialect_named("postgres"), copy=False)  # a copy of its own already


def listed_keys(query: AggregateQuery,
                restrictions: Mapping[str, BlockRestriction]) -> AggregateQuery:
    """``query`` with its calendar keys listed over the blocks it reads (``restrictions``, by
    table alias): the windows the rewrite restricts the rows to, so every row's bucket is in
    the list (``analyses.keys``).  Refuses grids beyond ``analyses.keys.MAX_KEYS`` keys.  A
    function of the policy's schedule, the clock and the query: never of the data."""
    pending = query.calendar_keys()
    if not pending or query.thresholded:
        return query
    values = {}
    for kid, domain in pending.items():
        restriction = restrictions.get(domain.alias)
        if restriction is None:  # keys.key_domain found a block: the kind restricts to it
            raise ValueError(f"no block restriction for the calendar key {kid}")
        runs = restriction.windows or ((restriction.start, restriction.end),)
        values[kid] = calendar_values(domain, runs)  # type: ignore[arg-type]
    check_grid_size(len(values.get(k.id, k.public_values or ())) for k in query.keys
                    if k.id in values or k.public_values is not None)
    return query.with_key_values(values)


def _count_outputs(query: AggregateQuery) -> frozenset[int]:
    """The output columns that are a noisy count as it is (COUNT, COUNT(DISTINCT unit)):
    released clamped at 0, as a count is never negative (post-processing)."""
    kinds = {m.id: m.kind for m in query.measurements}
    return frozenset(i for i, out in enumerate(query.outputs)
                     if isinstance(out.expr, exp.Column) and not out.expr.table
                     and kinds.get(out.expr.name) in ("count", "count_units"))


class Accuracy:
    """The error bars of an analytic answer (``mechanisms.intervals``), computed once, on first
    use: each noisy output of each row gets the 95% interval of its expression over the noisy
    measurements of that row, from their mechanisms' noise.  Counts are clamped at 0 like their
    released values.  Post-processing of released values and public noise scales: free.  (A
    join whose noise scale is data-dependent gets none: an interval's width would show it.)"""

    def __init__(self, query: AggregateQuery, plan: NoisePlan, rows: list[tuple[Any, ...]],
                 noisy: tuple[tuple[float | None, ...], ...],
                 chosen: Choices | None = None) -> None:
        self._query, self._plan, self._rows, self._noisy = query, plan, rows, noisy
        self._chosen = chosen
        self._lock = threading.Lock()
        self._done: tuple[tuple[Interval | NoInterval | None, ...], ...] | None = None

    def intervals(self) -> tuple[tuple[Interval | NoInterval | None, ...], ...]:
        """Per row, per column: the interval of a noisy output, None for a key or constant."""
        with self._lock:
            if self._done is None:
                self._done = self._compute()
            return self._done

    def _compute(self) -> tuple[tuple[Interval | NoInterval | None, ...], ...]:
        query, rows = self._query, self._rows
        if not rows:
            return ()
        ids = released_measurements(query)
        released = {mid: [r[j] for r in self._noisy] for j, mid in enumerate(ids)}
        keys = {out.key: [r[i] for r in rows] for i, out in enumerate(query.outputs)
                if out.key is not None}
        mechanisms = self._plan.all_mechanisms()
        counts = _count_outputs(query)
        columns: list[tuple[Interval | NoInterval | None, ...]] = []
        for i, out in enumerate(query.outputs):
            if out.key is not None or not out.measurements:
                columns.append((None,) * len(rows))
                continue
            if any(v is None for m in out.measurements for v in released.get(m, [None])):
                columns.append((NoInterval("no interval: a measurement is NULL"),) * len(rows))
                continue
            found = output_intervals(
                out.expr, {m: released[m] for m in out.measurements},  # type: ignore[misc]
                {m: mechanisms[m] for m in out.measurements}, keys=keys)
            if i in counts:
                found = tuple(postprocessed(iv, lower=0.0, integral=True)
                              if isinstance(iv, Interval) else iv for iv in found)
            bias = self._bias(out)
            if bias is not None:
                found = tuple(with_bias(iv, bias) if isinstance(iv, Interval) else iv
                              for iv in found)
            columns.append(found)
        return tuple(zip(*columns, strict=True))

    def _bias(self, out: OutputColumn) -> Bias | None:
        """How low ``out`` may come out because of the chosen cap and clipping bounds, at the
        upper estimates of ``mechanisms.selection_bias``: a total (COUNT, SUM released as it
        is) loses the rows above the cap; a SUM or AVG of a one-signed clipped column moves
        toward 0 by its clipping loss.  None when nothing was chosen or nothing is lost."""
        chosen = self._chosen
        if chosen is None:
            return None
        by_id = {m.id: m for m in self._query.measurements}
        used = [by_id[m] for m in out.measurements if m in by_id]
        single = used[0] if len(used) == 1 and isinstance(out.expr, exp.Column) else None
        kept, reasons, signs = 1.0, [], set()
        if chosen.cap_bias is not None and single is not None and single.total \
                and single.kind in ("count", "sum") and chosen.cap_bias.upper > 0:
            kept *= 1 - chosen.cap_bias.upper
            reasons.append(f"{self._query.privacy_unit or 'unit'} rows above the cap")
        clipped = dict(chosen.clip_bias)
        for m in used:
            found = clipped.get(m.argument_sql) if m.kind == "sum" and m.argument else None
            if found is None or not found.one_signed or found.upper <= 0:
                continue
            kept *= 1 - found.upper
            reasons.append(f"values clipped to [{m.lower:g}, {m.upper:g}]")
            signs.add("low" if (m.lower or 0) >= 0 else "high")
        if kept >= 1 or len(signs) > 1:
            return None
        return Bias(signs.pop() if signs else "low", min(1 - kept, 0.999), ", ".join(reasons))


def portable(result: ResultSet) -> ResultSet:
    """Postgres NUMERIC arrives as Decimal: report it as float, like every other backend."""
    rows = [tuple(float(v) if isinstance(v, Decimal) else v for v in row) for row in result.rows]
    return ResultSet(result.columns, result.types, rows)


def _run_proxy_noise(statements: Statements, detail: AnalyticQuery, run: QueryRun) -> ResultSet:
    exact = statements.run(detail.sql, run)
    proxied, plan = detail.proxied, detail.plan
    assert proxied is not None  # proxy noise always keeps what it needs
    mechanisms = plan.all_mechanisms()
    n_keys = len(proxied.key_ids)
    columns: list[Sequence[Any]] = list(zip(*exact.rows, strict=True)) if exact.rows else [
        () for _ in exact.columns]
    # Counts (and the key-release count) are integers; everything else is a float.
    integral = _integral(detail.query)

    def noised(mid: str, values: Sequence[Any]) -> np.ndarray:
        raw = np.array(values if None not in values else [
            0.0 if v is None else v for v in values], dtype=float)
        noisy = mechanisms[mid].sample(raw)
        return noisy.astype(np.int64) if mid in integral else noisy

    drawn: dict[str, np.ndarray] = {}
    gate = plan.threshold
    if gate is not None and gate.measurement_id in proxied.measure_ids:
        # Keys released by a threshold (thousands of groups, most below it): the gate's noisy
        # count first, then the other measurements of the released groups only.  The finish
        # applies the same gate again (``noisy > tau``), to the same noisy counts.
        at = n_keys + proxied.measure_ids.index(gate.measurement_id)
        counts = noised(gate.measurement_id, columns[at])
        kept = np.flatnonzero(counts > gate.threshold)
        drawn[gate.measurement_id] = counts[kept]
        columns = [[values[i] for i in kept] for values in columns]
    noisy_columns: list[Sequence[Any]] = list(columns[:n_keys])
    for mid, values in zip(proxied.measure_ids, columns[n_keys:], strict=True):
        noisy_columns.append(drawn[mid] if mid in drawn else noised(mid, values))
    types = [_DUCKDB_TYPES.get(t, "VARCHAR") for t in exact.types[:n_keys]]
    types += ["BIGINT" if mid in integral else "DOUBLE" for mid in proxied.measure_ids]
    scratch = list(zip(proxied.key_ids + proxied.measure_ids, types, strict=True))
    return finish_values(statements.scratch, scratch, proxied.finish, noisy_columns)


def _integral(query: AggregateQuery) -> set[str]:
    return {m.id for m in query.measurements if m.integral} | {THRESHOLD_ID}


def finish_plan(detail: AnalyticQuery) -> tuple[str, str] | None:
    """Proxy noise: what plans the finishing statement before the claim (it runs in the
    scratch DuckDB over the noisy values, after the data was read): the empty table of the
    types it will have, and the finish (``Statements.check_scratch_plan``).

    The keys' types are inferred from the policy's column types; a key whose type cannot
    be inferred leaves the finish unchecked (None: a failure there then keeps the charge, as
    every failure after a statement read the data does)."""
    proxied = detail.proxied
    assert proxied is not None
    keys = _key_types(detail.query)
    if keys is None:
        return None
    integral = _integral(detail.query)
    columns = tuple(zip(proxied.key_ids, keys, strict=True)) + tuple(
        (mid, "BIGINT" if mid in integral else "DOUBLE") for mid in proxied.measure_ids)
    return noisy_table(columns), proxied.finish


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
            found = _DUCKDB_TYPES.get(portable_type(sql_text(typed, "duckdb") if typed else ""))
        if found is None:
            return None
        out.append(found)
    return out


def aggregate_report(query: AggregateQuery, plan: NoisePlan, reads: BlocksRead | None, sql: str,
                     noise: str) -> PrivacyReport:
    """The report of an analytic query: its measurements with their sensitivities and
    mechanisms, what each output column is, how keys are released, how rows are bounded."""
    measurements = []
    for m in query.measurements:
        mech = plan.mechanisms[m.id]
        arg = display_sql(m.argument) if m.argument is not None else "*"
        if m.center:
            arg = f"{arg} - {m.center:g}"
        described, bound, sensitivity = mech.describe(), mech.error_bound(0.95), m.sensitivity
        if m.grid:
            # A join's sum is measured in integer grid steps; the analyst reads its value in the
            # column's units, so sensitivity, scale and error bound are shown in them too (the
            # step and the scale in steps stay in the mechanism's description).
            described = {**described, "scale": described["scale"] * m.grid,
                         "grid_step": m.grid, "scale_in_grid_steps": described["scale"]}
            bound = None if bound is None else bound * m.grid
            sensitivity = sensitivity * m.grid
        measurements.append(MeasurementReport(
            m.id, f"{_AGGREGATE_NAMES[m.kind]}({arg})" if m.kind != "count_units"
            else f"COUNT(DISTINCT {query.privacy_unit})", sensitivity, m.derivation,
            described, bound))
    by_id = {m.id: m for m in measurements}
    columns = []
    for out in query.outputs:
        if out.key is not None:
            columns.append(ColumnReport(out.name, "group_key", out.source, ()))
        elif not out.measurements:
            columns.append(ColumnReport(out.name, "constant", out.source, ()))
        elif (rendered := sql_text(out.expr)) in by_id:
            m = by_id[rendered]
            columns.append(ColumnReport(
                out.name, "aggregate", out.source, (m.id,), m.mechanism["name"],
                m.mechanism["scale"], m.error_bound_95))
        else:
            columns.append(ColumnReport(
                out.name, "derived", out.source, out.measurements,
                note="post-processing of noisy measurements " + ", ".join(out.measurements)
                + ": " + rendered))
    key_release = None
    if plan.threshold is not None:
        t = plan.threshold
        key_release = KeyRelease(
            "threshold", t.threshold, t.measurement_id, t.delta,
            note=f"a group is released only if its noisy count ({t.measurement_id}, "
            f"scale {t.mechanism.scale:g}) exceeds tau = 1 + b ln(D / delta), D = "
            f"{query.groups_per_unit} groups per unit"
            + (" (the groups one person's rows of the join on the unit can reach)"
               if query.join is not None
               else f" (its rows kept in at most {query.max_groups} groups)"
               if query.max_groups is not None and query.max_groups < query.stability
               else f" (its <= {query.stability} rows)" if query.privacy_unit else ""),
        )
    elif query.keys:
        spelled = [k for k in query.keys if not isinstance(k.expr, exp.Column)
                   and k.domain is None]
        key_release = KeyRelease("public_values", note="; ".join(
            f"{_show_key(k.expr)}: " + (k.domain.describe() if k.domain is not None
                                          else "every value the query spells out "
                                          f"({', '.join(map(repr, k.public_values or ()))}), "
                                          "nothing else" if k in spelled
                                          else "every declared value, nothing else")
            for k in query.keys) if any(k.domain is not None for k in query.keys) or spelled
            else "every declared value, nothing else")
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
    if noise == "proxy":
        notes.append("noise added by the proxy from os.urandom")
    else:
        notes.append("noise added by the database (random()); counts use discrete Laplace, "
                     "sums the snapping mechanism")
    return PrivacyReport(
        analyst="", verdict="allowed", charged=False, epsilon=plan.epsilon,
        delta=plan.delta, noise="proxy" if noise == "proxy" else "sql", tables=(query.table,),
        blocks=reads.ids if reads is not None else (query.table,),
        stability=query.stability, privacy_unit=query.privacy_unit,
        measurements=tuple(measurements), columns=tuple(columns), key_release=key_release,
        rewritten_sql=sql, notes=tuple(notes), contribution=contribution,
    )
