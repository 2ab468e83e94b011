"""Coverage of the output intervals: over repeated releases of known data, >= 95% hold the truth.

Each case is a real query analysed by ``analyses.query`` (COUNT, SUM, AVG, VARIANCE, STDDEV and a
ratio of sums), its noise planned by ``mechanisms.planning``, and its exact measurements computed
from a fixed data set.  R releases are drawn by the mechanisms' own SQL renderings, run for real
in DuckDB and Postgres (``setseed``: the test is deterministic), and every output's interval
(``mechanisms.intervals``, seeded simulation) is checked against the output at the exact
measurements.

Tolerance.  A method with coverage exactly 95% shows a binomial count over R = 4000 releases with
standard deviation sqrt(0.95 0.05 / R) = 0.34%; each check allows 3 of them below 95% (94.0%),
and the coverage pooled over all outputs of a case (R x outputs intervals, not independent across
outputs of one release, so the same per-release bound is used) must reach 95% - 1 sd.  Seeded, the
test is deterministic; the bounds only say how far a correct method may fall by chance.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import duckdb
import numpy as np
import pytest
from sqlglot import exp, parse_one

from analyses.query import AggregateQuery, Measurement, analyze_query
from analyses.validate import parse_statement
from chorus_py.policy import parse_policy
from mechanisms import Mechanism, Snapping
from mechanisms.intervals import DEFAULT_DRAWS, Interval, output_intervals
from mechanisms.planning import NoiseRequest, plan_noise
from tests.mechanisms.stats import value_expr

R = 4000
SD = math.sqrt(0.95 * 0.05 / R)
SEED = 0.25

SQL = ("SELECT COUNT(*) AS n, SUM(x) AS total, AVG(x) AS mean, VARIANCE(x) AS var, "
       "STDDEV(x) AS sd, SUM(x) / SUM(y) AS ratio, SUM(x) - 40 * COUNT(*) AS excess FROM v")


def _query() -> AggregateQuery:
    policy = parse_policy({
        "backend": {"url": "duckdb:///:memory:"}, "privacy": {"epsilon_per_block": 10},
        "tables": {"v": {"columns": {"x": {"type": "float", "lower": 0, "upper": 100},
                                     "y": {"type": "float", "lower": 0, "upper": 10}}}}})
    parsed = parse_statement(SQL, "duckdb", frozenset(policy.tables))
    query = analyze_query(parsed, policy, "duckdb", {})
    assert isinstance(query, AggregateQuery)
    return query


def _data(rows: int) -> dict[str, np.ndarray]:
    """Heavy-tailed x (mostly small, a few at the bound) and y, fixed by the seed."""
    gen = np.random.default_rng(rows)
    return {"x": np.clip(gen.lognormal(2.5, 1.0, rows), 0, 100),
            "y": np.clip(gen.exponential(3.0, rows), 0, 10)}


def _exact(m: Measurement, data: dict[str, np.ndarray]) -> float:
    """The measurement on the data, as the rewritten SQL computes it (values clipped already)."""
    if m.argument is None:
        return float(len(data["x"]))
    values = data[m.argument.name]
    if m.kind == "count":
        return float(values.size)
    if m.kind == "sum":
        return float(np.sum(values - m.center))
    assert m.kind == "sum_squares"
    return float(np.sum((values - m.center) ** 2))


def _duck_releases(con: duckdb.DuckDBPyConnection, plan: dict[str, Mechanism],
                   exact: dict[str, float]) -> dict[str, np.ndarray]:
    cols = ", ".join(f"{plan[m].render_sql(value_expr(_typed(plan[m], v)), 'duckdb').sql('duckdb')}"
                     f" AS {m}" for m, v in exact.items())
    con.execute(f"SELECT setseed({SEED})").fetchall()
    got = con.sql(f"SELECT {cols} FROM range({R})").fetchnumpy()
    return {m: np.asarray(got[m], dtype=np.float64) for m in exact}


def _pg_releases(con: object, plan: dict[str, Mechanism],
                 exact: dict[str, float]) -> dict[str, np.ndarray]:
    cols = ", ".join(
        f"{plan[m].render_sql(value_expr(_typed(plan[m], v)), 'postgres').sql('postgres')}"
        f" AS {m}" for m, v in exact.items())
    con.execute(f"SELECT setseed({SEED})")  # type: ignore[attr-defined]
    rows = con.execute(  # type: ignore[attr-defined]
        f"SELECT {cols} FROM generate_series(1, {R})").fetchall()
    arr = np.asarray(rows, dtype=np.float64)
    return {m: arr[:, i] for i, m in enumerate(exact)}


def _typed(mech: Mechanism, value: float) -> float:
    # Counts are integers in SQL; sums are doubles.
    return value if isinstance(mech, Snapping) else int(value)  # type: ignore[return-value]


def _truth(expr: exp.Expr, exact: dict[str, float]) -> float:
    con = duckdb.connect()
    row = con.execute(f"SELECT CAST({expr.sql('duckdb')} AS DOUBLE) FROM (SELECT "
                      + ", ".join(f"CAST({v!r} AS DOUBLE) AS {m}" for m, v in exact.items())
                      + ")").fetchone()
    con.close()
    assert row is not None and row[0] is not None
    return float(row[0])


Releases = Callable[[dict[str, Mechanism], dict[str, float]], dict[str, np.ndarray]]


def _coverage(rows: int, epsilon: float, releases: Releases) -> dict[str, float]:
    query = _query()
    plan = plan_noise([NoiseRequest(m.id, m.sensitivity, m.integral) for m in query.measurements],
                      epsilon, 0.0).mechanisms
    data = _data(rows)
    exact = {m.id: _exact(m, data) for m in query.measurements}
    released = releases(plan, exact)
    found = {}
    for i, out in enumerate(query.outputs):
        truth = _truth(out.expr, exact)
        used = {m: released[m] for m in out.measurements}
        ivs = output_intervals(out.expr, used, plan, draws=DEFAULT_DRAWS,
                               rng=np.random.default_rng(i))
        assert all(isinstance(iv, Interval) for iv in ivs)
        found[out.name] = float(np.mean([iv.lower <= truth <= iv.upper  # type: ignore[union-attr]
                                         for iv in ivs]))
    return found


def _check(found: dict[str, float]) -> None:
    low = {name: c for name, c in found.items() if c < 0.95 - 3 * SD}
    assert not low, f"coverage below {0.95 - 3 * SD:.4f}: {low} (all: {found})"
    pooled = float(np.mean(list(found.values())))
    assert pooled >= 0.95 - SD, f"pooled coverage {pooled:.4f} (all: {found})"


def test_the_data_and_outputs_are_as_described() -> None:
    query = _query()
    assert [o.name for o in query.outputs] == ["n", "total", "mean", "var", "sd", "ratio",
                                               "excess"]
    data = _data(2000)
    exact = {m.id: _exact(m, data) for m in query.measurements}
    truths = {o.name: _truth(o.expr, exact) for o in query.outputs}
    assert truths["mean"] == pytest.approx(np.mean(data["x"]))
    assert truths["var"] == pytest.approx(np.var(data["x"], ddof=1))
    assert truths["ratio"] == pytest.approx(np.sum(data["x"]) / np.sum(data["y"]))


@pytest.mark.parametrize(("rows", "epsilon"), [(2000, 1.0), (2000, 0.1), (100, 1.0), (100, 0.1)])
def test_coverage_duckdb(rows: int, epsilon: float) -> None:
    con = duckdb.connect()
    try:
        _check(_coverage(rows, epsilon, lambda plan, exact: _duck_releases(con, plan, exact)))
    finally:
        con.close()


@pytest.mark.postgres
@pytest.mark.parametrize(("rows", "epsilon"), [(2000, 0.5)])
def test_coverage_postgres(pg: object, rows: int, epsilon: float) -> None:
    _check(_coverage(rows, epsilon, lambda plan, exact: _pg_releases(pg, plan, exact)))


@pytest.mark.parametrize("phase", [0.0, 0.25, 0.5, 0.75])
def test_coverage_of_snapped_sums_at_every_grid_offset(phase: float) -> None:
    # Snapping rounds to a grid of step Lambda (1.6 b here): the noise of one release depends on
    # where the true value falls on the grid, and a "Laplace, then rounded" simulation covers
    # some offsets only ~91% of the time.  The box model must hold at every offset.
    snap = Snapping.from_sensitivity(1.0, 0.8)
    assert snap.Lambda / snap.scale == pytest.approx(1.6, rel=0.01)
    exact = {"m0": (1000 + phase) * snap.Lambda, "m1": (300 + phase / 2) * snap.Lambda}
    plan: dict[str, Mechanism] = {"m0": snap, "m1": snap}
    con = duckdb.connect()
    try:
        released = _duck_releases(con, plan, exact)
    finally:
        con.close()
    found = {}
    for sql in ("m0 + m1", "m0 - m1", "m0 + 3 * m1"):
        expr = parse_one(sql)
        truth = _truth(expr, exact)
        ivs = output_intervals(expr, released, plan, draws=DEFAULT_DRAWS,
                               rng=np.random.default_rng(7))
        found[sql] = float(np.mean([iv.lower <= truth <= iv.upper  # type: ignore[union-attr]
                                    for iv in ivs]))
    _check(found)
