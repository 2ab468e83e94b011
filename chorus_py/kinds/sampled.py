"""The sampled kind: sensitivity sampling and Sample-Then-Respond (random DP, DESIGN.md
section 8).

Rubinstein & Aldà, "Pain-Free Random Differential Privacy with Sensitivity Sampling" (ICML
2017), Algorithms 1 and 2 with Theorem 15 (``mechanisms.sampling``):

1. SensitivitySampler: draw m databases of n + 1 rows from the policy's sampling distribution P
   (declared column distributions, or rows of a public reference table), never from the private
   data.  D_i is rows 1..n of database i; D'_i is D_i with its row n replaced by row n + 1 (with
   a privacy unit: n + k rows, the last k of D_i replaced; see Neighbours below).  All
   2m databases are evaluated in **one** query on an in-memory DuckDB holding only the samples
   (``GROUP BY sample_id, side``), and G_i = ||f(D_i) - f(D'_i)||_1 over every output column and
   every declared group.  The sensitivity is the k-th smallest G_i.
2. Respond: the true answer f(D) is computed on the real backend, and the proxy adds noise
   calibrated to that sensitivity (``mechanisms.planning``: the snapping mechanism for real
   outputs, discrete Laplace for COUNT outputs, at ceil(sensitivity)), epsilon split equally over
   the output columns as in analytic mode.

Cost: exactly the query's epsilon (delta 0: both mechanisms are pure DP), charged through the
engine's ordinary claim; refusals happen before the claim and cost nothing.

**n** is public: ``[tables.T.sampling] rows`` when the owner declares it, otherwise the row count
of the public reference table.  It is never read from the private table, so EXPLAIN can compute
and show the sampled sensitivity free of charge; it is cached per (query, P, n, m, k, rows per
unit, block restriction).

**Neighbours, event level**: one row replaced, as in the paper (D' = D with row n swapped).

**Neighbours, one privacy unit per row** (user-level DP; k here is rows per unit, not Theorem 15's
order index). The real query runs over the contribution-bounded relation: each unit keeps at most k
= ``max_rows_per_unit`` random rows (``rewriters.contribution`` over the filtered rows, or the
stored sample of bounding = "materialized"; contribution = "auto" uses that limit, no cap is chosen
per query). The choice of a unit's rows depends only on that unit's rows and on randomness of its
own, so two databases that differ in one unit's data give bounded relations that differ in at most
k rows, all of that unit: after bounding, a unit plays the part the row plays in the paper. The
sampler therefore draws the *bounded* relation: n rows i.i.d. from P, units being runs of k rows,
and D' = D with its last k rows (one unit) replaced by k fresh draws (another unit); for k = 1 this
is exactly the paper's swap. Why Theorem 15 still holds: its proof uses only that G_1, ..., G_m are
i.i.d. copies of G = ||f(D) - f(D')||_1 for the distribution of pairs (D, D') in the definition of
random DP (uniform convergence of their empirical CDF, DKW). Changing that pair distribution to "k
rows replaced" changes what the guarantee is about, not the proof: with probability >= 1 - gamma
over (D, D') drawn that way, the release is (epsilon, delta)-indistinguishable on them. Limits (the
first is said in every report's random_dp note): (1) the k rows of one unit are drawn i.i.d. from
P, while a real unit's rows are often alike (one rider's fares): when a unit's rows move f together
(a SUM of k large values) the real difference can reach k times a row's, which i.i.d. draws make
rare, so the sampled value is a quantile of P's model, below the analytic k * max(|l|, |u|) of a
clipped SUM (it equals it only when P puts enough mass on the extremes); (2) every unit is modelled
with exactly k rows and the relation with n rows (n / k units), not with the real numbers of units
and rows per unit; (3) a unit is replaced, not added or removed (n is public, as in the paper); (4)
f never reads the unit column (``analyses.sampling`` refuses it: the samples give a unit's rows no
common value), and rows of several units (a list or an attribution table) are refused.

**Blocks.**  The query is charged on the blocks its WHERE reaches (``analyses.blocks``) and the
database reads only their rows (``rewriters.blocks``).  f on the samples is that restricted f
when the query reads the block column (P draws it, and rows P draws outside the claimed windows
are left out as on the data); a query that does not read it reads every block and P's rows are
taken as rows of the table's blocks.  A query whose WHERE reaches no block reads no row: its
answer is a constant of the query, released without sampling or noise, charging nothing.

Sensitivity 0 (f never changed on the samples) is refused rather than released without noise:
it nearly always means P does not describe the data.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
from collections import OrderedDict
from decimal import Decimal
from itertools import product
from typing import Any

import duckdb
import numpy as np
from sqlglot import exp

from analyses.blocks import BlocksRead, interval_set, read_windows
from analyses.sampling import SampledQuery, analyze_sampled, wants_sampling
from budget.accounting import events_for_plan
from chorus_py.backends import SCHEMA, ResultSet
from chorus_py.errors import InvalidParameter, QueryRefused
from chorus_py.kinds.base import Answer, Prepared, Services
from chorus_py.policy import SamplingColumn, TablePolicy
from chorus_py.report import (
    ColumnReport,
    KeyRelease,
    MeasurementReport,
    PrivacyReport,
    RandomDPReport,
)
from chorus_py.statements import QueryRun
from mechanisms.planning import NoisePlan, NoiseRequest, plan_noise
from mechanisms.sampling import SamplerParameters, order_statistic, sampler_parameters
from rewriters.blocks import blocks as restrict_blocks
from rewriters.contribution import contribution

SAMPLES = "chorus_samples"
# m (n + 1) rows are drawn per sampled sensitivity: ~ 1 s per 2-5 million on this machine.
MAX_SAMPLED_ROWS = 50_000_000
_DRAWS = "chorus_draws"
_REFERENCE = "chorus_reference"
_DUCK_TYPES = {"int": "BIGINT", "float": "DOUBLE", "text": "VARCHAR", "bool": "BOOLEAN",
               "date": "DATE", "timestamp": "TIMESTAMP"}


def sampled_differences(query: SampledQuery, table_policy: TablePolicy, n: int, m: int,
                        reference: list[tuple[Any, ...]] | None = None,
                        seed: float | None = None, swap: int = 1,
                        where: exp.Expr | None = None) -> np.ndarray:
    """The m sampled L1 differences G_i = ||f(D_i) - f(D'_i)||_1 (SensitivitySampler).

    ``reference`` holds the rows (in ``query.columns`` order) of the public reference table
    when P is its empirical distribution; otherwise P comes from the declared column domains.
    ``seed`` (in [-1, 1]) makes the draws reproducible (benchmarks and tests).
    ``swap`` is how many rows neighbours differ in: 1 (event level), or k, one unit's rows
    after contribution bounding (see the module doc).  ``where`` replaces the query's WHERE
    (the block restriction the real query runs with).
    """
    if not 1 <= swap < n:
        raise ValueError(f"need 1 <= swap < n, got swap = {swap}, n = {n}")
    con = duckdb.connect(":memory:")
    try:
        if seed is not None:
            con.execute(f"SELECT setseed({float(seed)!r})")
        _draw(con, query, table_policy, n + swap, m, reference)
        # D = rows 0..n-1 (side 0); D' = rows 0..n-swap-1 and rows n..n+swap-1 (side 1): the
        # last `swap` rows of D (one unit) replaced by `swap` fresh draws (another unit).
        con.execute(
            f"CREATE VIEW {SAMPLES} AS "
            f"SELECT * EXCLUDE (row_idx), 0 AS side FROM {_DRAWS} WHERE row_idx < {n} "
            f"UNION ALL "
            f"SELECT * EXCLUDE (row_idx), 1 AS side FROM {_DRAWS} "
            f"WHERE row_idx < {n - swap} OR row_idx >= {n}")
        sql = query.sql("duckdb", SAMPLES, where=where, group_first=("sample_id", "side"))
        rows = con.execute(sql).fetchall()
    finally:
        con.close()
    outputs = len(query.measured)
    index = _group_index(query)
    # values[sample, side, group, output]; a group absent from a database has f = 0 there.
    values = np.zeros((m, 2, max(len(index), 1), outputs))
    offset = 2 + len(query.keys)
    for row in rows:
        group = index.get(tuple(_key(v) for v in row[2:offset]), 0) if query.keys else 0
        values[int(row[0]), int(row[1]), group] = [_number(v) for v in row[offset:]]
    return np.abs(values[:, 0] - values[:, 1]).reshape(m, -1).sum(axis=1)


def _group_index(query: SampledQuery) -> dict[tuple[Any, ...], int]:
    combos = product(*(values for _, values in query.keys)) if query.keys else iter(())
    return {tuple(_key(v) for v in combo): i for i, combo in enumerate(combos)}


def _key(value: Any) -> Any:
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | float | Decimal):
        return float(value)
    return str(value)


def _number(value: Any) -> float:
    x = 0.0 if value is None else float(value)
    if not math.isfinite(x):  # cannot happen with the guards of analyses.sampling
        raise QueryRefused("the query produced a non-finite value on a sampled database")
    return x


def _draw(con: duckdb.DuckDBPyConnection, query: SampledQuery, tp: TablePolicy, rows: int,
          m: int, reference: list[tuple[Any, ...]] | None) -> None:
    """``chorus_draws(sample_id, row_idx, <columns>)``: m databases of ``rows`` rows from P."""
    cols = list(query.columns)
    if reference is not None:
        types = [_DUCK_TYPES[tp.columns[c].type] for c in cols]
        con.execute(f"CREATE TABLE {_REFERENCE} (rid BIGINT, "
                    + ", ".join(f'"{c}" {t}' for c, t in zip(cols, types, strict=True)) + ")")
        con.executemany(f"INSERT INTO {_REFERENCE} VALUES ({', '.join('?' * (len(cols) + 1))})",
                        [(i, *row) for i, row in enumerate(reference)])
        picked = ", ".join(f'r."{c}"' for c in cols)
        con.execute(
            f"CREATE TABLE {_DRAWS} AS SELECT d.sample_id, d.row_idx, {picked} FROM ("
            f"SELECT s.range AS sample_id, i.range AS row_idx, "
            f"CAST(FLOOR(random() * {len(reference)}) AS BIGINT) AS pick "
            f"FROM range({m}) s, range({rows}) i) d JOIN {_REFERENCE} r ON r.rid = d.pick")
        return
    # Each column independently; draws that need two uniforms (normal) or a shared one
    # (weighted choice) read u1/u2 columns of their own.
    uniforms = []
    exprs = []
    for i, c in enumerate(cols):
        spec = tp.sampling.columns.get(c) if tp.sampling is not None else None
        expr, used = _column_draw(c, tp, spec, f"u{i}a", f"u{i}b")
        uniforms += used
        exprs.append(f'{expr} AS "{c}"')
    inner = ", ".join(["s.range AS sample_id", "i.range AS row_idx",
                       *(f"random() AS {u}" for u in uniforms)])
    con.execute(f"CREATE TABLE {_DRAWS} AS SELECT sample_id, row_idx, {', '.join(exprs)} "
                f"FROM (SELECT {inner} FROM range({m}) s, range({rows}) i)")


def _column_draw(column: str, tp: TablePolicy, spec: SamplingColumn | None, ua: str,
                 ub: str) -> tuple[str, list[str]]:
    """A DuckDB expression drawing one value of ``column`` from P, and the uniforms it reads."""
    cp = tp.columns[column]
    if spec is None:  # the declared domain: bounds or public values, uniformly
        if cp.public_values is not None:
            spec = SamplingColumn(distribution="choice", values=cp.public_values)
        elif cp.lower is not None and cp.upper is not None and cp.lower < cp.upper:
            spec = SamplingColumn(distribution="uniform", lower=cp.lower, upper=cp.upper)
        else:
            raise QueryRefused(
                f"the sampling distribution P of this table says nothing about column "
                f"'{column}'", hint=f"the data owner can declare tables.<table>.sampling.columns"
                f".{column}, or bounds / public_values for it")
    typ = _DUCK_TYPES[cp.type]
    d = spec.distribution
    if d == "choice":
        assert spec.values is not None
        values = list(spec.values)
        weights = list(spec.weights) if spec.weights is not None else [1.0] * len(values)
        total = sum(weights)
        arms, acc = [], 0.0
        for v, w in zip(values[:-1], weights[:-1], strict=True):
            acc += w / total
            arms.append(f"WHEN {ua} < {acc!r} THEN {_sql_value(v)}")
        expr = f"CASE {' '.join(arms)} ELSE {_sql_value(values[-1])} END" if arms else \
            _sql_value(values[0])
        return f"CAST({expr} AS {typ})", [ua]
    if cp.type not in ("int", "float"):
        raise QueryRefused(f"distribution '{d}' needs a numeric column, and '{column}' is "
                           f"{cp.type}", hint="use distribution = \"choice\" with values")
    if d == "uniform":
        lo, hi = spec.lower, spec.upper
        assert lo is not None and hi is not None
        expr = (f"FLOOR({lo!r} + ({hi!r} - {lo!r} + 1) * {ua})" if cp.type == "int"
                else f"({lo!r} + ({hi!r} - {lo!r}) * {ua})")
        return f"CAST({expr} AS {typ})", [ua]
    if d == "exponential":
        assert spec.mean is not None
        expr = f"(-{spec.mean!r} * LN(1 - {ua}))"
        used = [ua]
    else:  # normal / lognormal, by Box-Muller: sqrt(-2 ln(1 - u1)) cos(2 pi u2)
        assert spec.mean is not None and spec.sd is not None
        expr = (f"({spec.mean!r} + {spec.sd!r} * SQRT(-2 * LN(1 - {ua})) * "
                f"COS(2 * PI() * {ub}))")
        if d == "lognormal":
            expr = f"EXP({expr})"
        used = [ua, ub]
    if cp.type == "int":
        expr = f"ROUND({expr})"
    return f"CAST({expr} AS {typ})", used


def _sql_value(value: object) -> str:
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int | float):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


@dataclasses.dataclass(frozen=True)
class _Calibration:
    params: SamplerParameters
    n: int
    n_source: str
    sensitivity: float
    distribution: str


@dataclasses.dataclass(frozen=True)
class SampledRequest:
    """A query that opted in to sensitivity sampling, before its analysis: the SQL and the
    gamma asked for (None: the policy's default)."""

    sql: str
    gamma: float | None


@dataclasses.dataclass(frozen=True)
class SampledPlan:
    """The kind's state of a prepared sampled query (``Prepared.detail``): the analysed query,
    its noise (None: it reads no block, its answer depends on no row and is released as it
    is, free) and the statement that computes f(D)."""

    query: SampledQuery
    plan: NoisePlan | None
    sql: str


class SampledKind:
    """Sensitivity sampling (opt-in per query, or the policy's default)."""

    charges = True

    def __init__(self, services: Services) -> None:
        self.services = services
        self._lock = threading.Lock()
        self._sensitivities: OrderedDict[tuple[Any, ...], float] = OrderedDict()

    # -- opting in ----------------------------------------------------------------------------
    def wanted(self, sensitivity: str | None, gamma: float | None) -> bool:
        """Whether this query asked (or the policy defaults) to sample its sensitivity."""
        mode = sensitivity if sensitivity is not None else self.services.policy.privacy.sensitivity
        if mode not in ("analytic", "sampled"):
            raise InvalidParameter(f"sensitivity must be 'analytic' or 'sampled', got {mode!r}")
        if mode == "analytic" and gamma is not None:
            raise InvalidParameter("gamma applies only to sampled sensitivity",
                                   hint="also set sensitivity = 'sampled'")
        return mode == "sampled"

    def accepts(self, sql: str) -> bool:
        """Whether sampling applies: the query reads a private table (public-only queries are
        answered exactly, whatever the mode)."""
        return wants_sampling(sql, self.services.dialect, self.services.policy)

    def _gamma(self, gamma: float | None) -> float:
        privacy = self.services.policy.privacy
        g = privacy.default_gamma if gamma is None else gamma
        if isinstance(g, bool) or not isinstance(g, int | float) or not math.isfinite(g) \
                or not 0 < g < 1:
            raise InvalidParameter(f"gamma must be a number in (0, 1), got {g!r}")
        if g > privacy.max_gamma:
            raise InvalidParameter(f"gamma {g:g} is above the policy maximum "
                                   f"{privacy.max_gamma:g}",
                                   hint=f"ask for gamma <= {privacy.max_gamma:g}")
        return float(g)

    # -- the kind's steps -----------------------------------------------------------------------
    def prepare(self, request: SampledRequest, analyst: str, epsilon: float,
                delta: float) -> Prepared:
        """Sample (or look up) the sensitivity, plan the noise, report: nothing charged.
        Delta is not used: both mechanisms are pure DP."""
        services = self.services
        g = self._gamma(request.gamma)
        query = analyze_sampled(request.sql, services.policy, services.dialect,
                                services.statements.run_constant)
        reads, where = self._blocks(query)
        backend_sql = self._backend_sql(query, where)
        # Before any claim.
        services.statements.verify_outgoing(backend_sql, "sampled", (query.table,))
        if reads is not None and not reads.ids:
            return Prepared(self._unread_report(query, analyst, backend_sql), (), (),
                            SampledPlan(query, None, backend_sql),
                            statements=(backend_sql,))
        # f on the samples is f as the database runs it: with the block restriction, when the
        # query reads the block column (P draws it).  A query that does not read it reads every
        # block, and P's rows are taken as rows of the table's blocks.
        block = query.table_policy.block
        sample_where = where if block is not None and block.column in query.columns else None
        calibration = self._calibrate(query, g, sample_where)
        requests = [NoiseRequest(f"o{i}", math.ceil(calibration.sensitivity) if o.integral
                                 else calibration.sensitivity, o.integral)
                    for i, o in enumerate(query.measured)]
        try:
            plan = plan_noise(requests, epsilon, 0.0)
        except ValueError as err:
            raise InvalidParameter(f"cannot calibrate noise for epsilon={epsilon:g}: {err}",
                                   hint="ask for a larger epsilon") from None
        report = self._report(query, plan, calibration, analyst, reads, backend_sql)
        return Prepared(report, reads.ids if reads is not None else (query.table,),
                        events_for_plan(plan), SampledPlan(query, plan, backend_sql),
                        statements=(backend_sql,))

    def run(self, prepared: Prepared, run: QueryRun) -> Answer:
        """Respond: f(D) on the real backend, plus noise added here."""
        detail: SampledPlan = prepared.detail
        query = detail.query
        exact = self.services.statements.run(detail.sql, run)
        rows = self._respond(query, detail.plan, exact.rows)
        types = tuple("text" if o.key is not None else ("integer" if o.integral else "float")
                      for o in query.outputs)
        return Answer(ResultSet(tuple(o.name for o in query.outputs), types, rows))

    # -- steps ------------------------------------------------------------------------------------
    def _backend_sql(self, query: SampledQuery, where: exp.Expr | None) -> str:
        """f over the private table: its rows restricted to the claimed blocks and, with a
        privacy unit, bounded to at most k rows per unit (the relation neighbours differ in
        k rows of; ``rewriters.contribution``, or the stored sample of bounding =
        "materialized", which keeps k random rows per unit of the whole table)."""
        dialect, tp = self.services.dialect, query.table_policy
        # Qualified by the proxy's schema: generated SQL names exactly the table it means.
        table = exp.Table(this=exp.to_identifier(query.table, quoted=True),
                          db=exp.to_identifier(self.services.schema, quoted=True))
        if query.unit is None:
            return query.sql(dialect, table, where=where)
        if tp.bounding == "materialized":
            name = self.services.samples.relation(query.table, tp)
            stored = exp.Table(this=exp.to_identifier(name, quoted=True),
                               db=exp.to_identifier(SCHEMA))
            return query.sql(dialect, stored, where=where)
        # Per query: the filtered rows first, then k random rows of each unit among them.
        rows = exp.select("*").from_(table)
        cond = query.condition(where)
        if cond is not None:
            rows = rows.where(cond)
        bounded = contribution(rows, query.unit, query.rows_per_unit)
        return query.sql(dialect, bounded.subquery("chorus_rows"), filtered=True)

    def _calibrate(self, query: SampledQuery, gamma: float,
                   where: exp.Expr | None) -> _Calibration:
        privacy = self.services.policy.privacy
        sampling = query.table_policy.sampling
        assert sampling is not None
        minimal = sampler_parameters(gamma)
        params = sampler_parameters(gamma, max(privacy.sampling_m, minimal.m))
        reference = None
        if sampling.reference is not None:
            reference = self._reference(sampling.reference, query)
            n = sampling.rows if sampling.rows is not None else len(reference)
            n_source = ("declared in the policy (sampling.rows)" if sampling.rows is not None
                        else f"the row count of the public reference table '{sampling.reference}'")
            distribution = f"rows of the public table '{sampling.reference}', drawn uniformly"
        else:
            assert sampling.rows is not None
            n, n_source = sampling.rows, "declared in the policy (sampling.rows)"
            distribution = "; ".join(
                f"{c}: {_describe_column(query.table_policy, c)}" for c in query.columns)
        swap = query.rows_per_unit
        if n <= swap:
            raise QueryRefused(
                f"the sampled databases would hold n = {n} rows, not more than the {swap} "
                "row(s) neighbours differ in", hint=f"the data owner can declare "
                f"[tables.{query.table}.sampling] rows > {swap} (or a larger reference table)")
        if params.m * (n + swap) > MAX_SAMPLED_ROWS:
            raise QueryRefused(
                f"sampling would draw m (n + k) = {params.m} x {n + swap} rows, more than the "
                f"{MAX_SAMPLED_ROWS:,} the proxy evaluates per query",
                hint="ask for a larger gamma (fewer samples), or the data owner can lower "
                "privacy.sampling_m or the table's sampling.rows")
        key = (query.normalized_sql, json.dumps(sampling.model_dump(), sort_keys=True,
                                                default=str), n, params.m, params.k, swap,
               where.sql() if where is not None else None)
        with self._lock:
            sens = self._sensitivities.get(key)
        if sens is None:
            diffs = sampled_differences(query, query.table_policy, n, params.m, reference,
                                        swap=swap, where=where)
            sens = order_statistic(diffs, params.k)
            with self._lock:
                self._sensitivities[key] = sens
                if len(self._sensitivities) > 1024:
                    self._sensitivities.popitem(last=False)
        if not sens > 0:
            raise QueryRefused(
                "the sampled sensitivity is 0: on the databases drawn from P the answer never "
                "changed when one row (one unit's rows) was replaced, so P does not describe "
                "this query's data",
                hint="the data owner should widen the sampling distribution P, or use analytic "
                "sensitivity")
        return _Calibration(params, n, n_source, sens, distribution)

    def _reference(self, table: str, query: SampledQuery) -> list[tuple[Any, ...]]:
        live = self.services.public_columns.get(table, {})
        missing = [c for c in query.columns if c not in live]
        if missing:
            raise QueryRefused(
                f"the reference table '{table}' has no column '{missing[0]}'",
                hint="the reference table needs every column the query reads")
        sql = exp.select(*(exp.column(c, quoted=True) for c in query.columns)).from_(
            exp.Table(this=exp.to_identifier(table, quoted=True),
                      db=exp.to_identifier(self.services.schema, quoted=True))
        ).sql(self.services.dialect)
        self.services.statements.verify_outgoing(sql, "exact", (table,))  # a public reference table
        rows = self.services.statements.run(sql, None).rows
        if len(rows) < 1:
            raise QueryRefused(f"the reference table '{table}' is empty")
        return [tuple(float(v) if isinstance(v, Decimal) else v for v in r) for r in rows]

    def _blocks(self, query: SampledQuery) -> tuple[BlocksRead | None, Any]:
        block = query.table_policy.block
        if block is None:
            return None, None
        windows = self.services.blocks.windows(query.table, block)
        column_type = query.table_policy.columns[block.column].type
        reads = read_windows(interval_set(query.raw_where, block.column, column_type), windows)
        where = restrict_blocks(query.where, exp.column(block.column), reads.start, reads.end,
                                column_type, reads.separate_runs)
        return reads, where

    def _respond(self, query: SampledQuery, plan: NoisePlan | None,
                 rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        """f(D) plus noise (none without a plan: f read no row); every declared group is
        released (a missing group has f = 0)."""
        index = _group_index(query)
        groups = max(len(index), 1)
        exact = np.zeros((groups, len(query.measured)))
        nkeys = len(query.keys)
        for row in rows:
            group = index.get(tuple(_key(v) for v in row[:nkeys]), None) if nkeys else 0
            if group is not None:
                exact[group] = [_number(v) for v in row[nkeys:]]
        noisy = exact
        if plan is not None:
            noisy = np.empty_like(exact)
            for i in range(len(query.measured)):
                noisy[:, i] = plan.mechanisms[f"o{i}"].sample(exact[:, i])
        combos = list(product(*(v for _, v in query.keys))) if query.keys else [()]
        result = []
        for g, combo in enumerate(combos):
            keys = dict(zip((c for c, _ in query.keys), combo, strict=True))
            values = iter(noisy[g])
            row = []
            for out in query.outputs:
                if out.key is not None:
                    row.append(keys[out.key])
                else:
                    v = next(values)
                    row.append(int(v) if out.integral else float(v))
            result.append(tuple(row))
        return result

    def _report(self, query: SampledQuery, plan: NoisePlan, cal: _Calibration, analyst: str,
                reads: BlocksRead | None, sql: str) -> PrivacyReport:
        p = cal.params
        how = (f"the {p.k}-th smallest of m = {p.m} sampled ||f(D) - f(D')||_1 over databases "
               f"of n = {cal.n} rows from P (rho = {p.rho:.4g}; Rubinstein & Alda 2017, "
               "Theorem 15)")
        measurements, columns = [], []
        i = 0
        for out in query.outputs:
            if out.key is not None:
                columns.append(ColumnReport(out.name, "group_key", out.source, ()))
                continue
            mid = f"o{i}"
            i += 1
            mech = plan.mechanisms[mid]
            measurements.append(MeasurementReport(mid, out.source, float(mech.sensitivity),
                                                  "sampled: " + how, mech.describe(),
                                                  mech.error_bound(0.95)))
            columns.append(ColumnReport(out.name, "aggregate", out.source, (mid,),
                                        mech.name, mech.scale, mech.error_bound(0.95)))
        k = query.rows_per_unit
        neighbours = ("one row" if query.unit is None else
                      f"the rows of one {query.unit} (at most {k} after contribution bounding; "
                      f"sampled as {k} rows drawn i.i.d. from P, replaced by {k} fresh draws: "
                      "a real unit whose rows are alike can move the answer more)")
        rdp = RandomDPReport(
            gamma=p.gamma, m=p.m, k=p.k, rho=p.rho, n=cal.n, n_source=cal.n_source,
            sensitivity=cal.sensitivity, distribution=cal.distribution,
            note=f"(epsilon, delta, gamma)-random DP: with probability >= 1 - {p.gamma:g} over "
            f"databases drawn from P the answer is (epsilon, delta)-DP; neighbours differ in "
            f"{neighbours}")
        notes = [
            f"random differential privacy with gamma = {p.gamma:g}: the sensitivity was "
            "sampled, not proven",
            f"epsilon split equally over {len(plan.mechanisms)} output column(s), each "
            "calibrated to the sampled L1 sensitivity of all outputs and groups",
            "noise added by the proxy from os.urandom",
        ]
        if query.unit is not None:
            notes.insert(1, _bounding_note(query))
        return PrivacyReport(
            analyst=analyst, verdict="allowed", charged=False, epsilon=plan.epsilon,
            delta=plan.delta, noise="proxy", tables=(query.table,),
            blocks=reads.ids if reads is not None else (query.table,), stability=k,
            privacy_unit=query.unit, measurements=tuple(measurements), columns=tuple(columns),
            key_release=KeyRelease("public_values", note="every declared value, nothing else")
            if query.keys else None,
            rewritten_sql=sql, notes=tuple(notes), random_dp=rdp)

    def _unread_report(self, query: SampledQuery, analyst: str, sql: str) -> PrivacyReport:
        """A query whose WHERE reaches no block: it reads no row (the rewritten SQL keeps it
        inside the empty set of blocks), so its answer is a constant of the query, released
        without sampling or noise, charging nothing."""
        block = query.table_policy.block
        assert block is not None
        columns = tuple(
            ColumnReport(o.name, "group_key", o.source, ()) if o.key is not None else
            ColumnReport(o.name, "constant", o.source, (),
                         note="the value of the aggregate over no row")
            for o in query.outputs)
        note = (f"the query reads no block of '{query.table}' (its WHERE reaches no window of "
                f"{block.column} in its schedule): the answer depends on no row, so it is "
                "released without sampling or noise and charges nothing")
        return PrivacyReport(
            analyst=analyst, verdict="allowed", charged=False, epsilon=0.0, delta=0.0,
            noise="none", tables=(query.table,), blocks=(), stability=query.rows_per_unit,
            privacy_unit=query.unit, columns=columns,
            key_release=KeyRelease("public_values", note="every declared value, nothing else")
            if query.keys else None, rewritten_sql=sql, notes=(note,))


def _bounding_note(query: SampledQuery) -> str:
    tp = query.table_policy
    how = ("a stored random sample of the whole table (bounding = 'materialized')"
           if tp.bounding == "materialized"
           else "a random choice among the rows that pass the filter")
    note = f"at most {query.rows_per_unit} rows per {query.unit}, by {how}"
    if tp.contribution == "auto":
        note += ("; sampled mode uses the policy's limit max_rows_per_unit (no cap is chosen "
                 "per query)")
    return note


def _describe_column(tp: TablePolicy, column: str) -> str:
    spec = tp.sampling.columns.get(column) if tp.sampling is not None else None
    if spec is not None:
        params = {k: v for k, v in spec.model_dump().items()
                  if v is not None and k != "distribution"}
        return f"{spec.distribution}({', '.join(f'{k}={v}' for k, v in params.items())})"
    cp = tp.columns[column]
    if cp.public_values is not None:
        return f"uniform over the declared values {list(cp.public_values)}"
    if cp.lower is None or cp.upper is None:
        return "no declared domain"
    return f"uniform over the declared bounds [{cp.lower:g}, {cp.upper:g}]"
