"""Sensitivity sampling on tables with private blocks and with a privacy unit.

Blocks: a sampled query is charged exactly the blocks its WHERE reaches, reads only their rows,
and a query that reaches no block reads nothing and costs nothing.  Privacy units: the query runs
over the contribution-bounded relation (at most k rows per unit), neighbours are sampled as k
rows replaced (``chorus_py.kinds.sampled``), and tables whose rows belong to several units are
refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyses.sampling import analyze_sampled
from chorus_py.engine import Engine
from chorus_py.errors import NotSupportedError, QueryRefused
from chorus_py.kinds.sampled import sampled_differences
from chorus_py.policy import parse_policy
from mechanisms.sampling import order_statistic, sampler_parameters
from tests.conftest import nothing_spent, tolerance

# -- blocks ----------------------------------------------------------------------------------

# 1000 events over five days (200 a day): day i % 5 of January 2026, amount i % 100.
DAYS_SQL = [
    "CREATE TABLE rdp_days (ts TIMESTAMP, amount DOUBLE PRECISION)",
    "INSERT INTO rdp_days SELECT CAST('2026-01-01' AS TIMESTAMP) + (i % 5) * INTERVAL '1 day' "
    "+ i * INTERVAL '1 second', CAST(i % 100 AS DOUBLE PRECISION) "
    "FROM generate_series(0, 999) AS s(i)",
]
DAYS_POLICY = """
[backend]
url = "{url}"
[privacy]
epsilon_per_block = 100
ledger = "memory"
max_epsilon_per_query = 100
[tables.rdp_days]
block = {{ column = "ts", size = "1 day", start = "2026-01-01", end = "2026-01-06" }}
[tables.rdp_days.columns]
ts = {{ type = "timestamp" }}
amount = {{ type = "float" }}
[tables.rdp_days.sampling]
rows = 1000
columns.amount = {{ distribution = "uniform", lower = 0, upper = 100 }}
columns.ts = {{ distribution = "choice", values = [%s] }}
"""
NOON = ", ".join(f'"2026-01-0{d} 12:00:00"' for d in range(1, 6))
SAMPLED: dict[str, Any] = {"sensitivity": "sampled", "gamma": 0.05}


def _spent(engine: Engine) -> dict[str, float]:
    return {b.block_id: b.epsilon_consumed for b in engine.ledger.blocks()
            if b.epsilon_consumed}


def test_charges_and_reads_exactly_the_blocks_reached(scratch: Callable[..., Engine]) -> None:
    engine = scratch("rdp_days", DAYS_SQL, DAYS_POLICY % NOON)
    result = engine.execute(
        "SELECT SUM(amount) AS s, COUNT(*) AS n FROM rdp_days "
        "WHERE ts >= '2026-01-02' AND ts < '2026-01-04'", epsilon=50.0, **SAMPLED)
    report = result.report
    days = ("rdp_days/2026-01-02", "rdp_days/2026-01-03")
    assert report.blocks == days and report.charged and report.random_dp is not None
    assert _spent(engine) == {d: pytest.approx(50.0) for d in days}
    # The rewritten SQL is held inside the two windows it paid for.
    assert "2026-01-02 00:00:00" in report.rewritten_sql
    assert "2026-01-04 00:00:00" in report.rewritten_sql
    kept = [i % 100 for i in range(1000) if i % 5 in (1, 2)]
    for value, truth, column in zip(result.rows[0], (sum(kept), len(kept)), report.columns,
                                    strict=True):
        assert abs(value - truth) <= tolerance(column)


def test_a_query_reaching_no_block_costs_nothing(scratch: Callable[..., Engine]) -> None:
    engine = scratch("rdp_days", DAYS_SQL, DAYS_POLICY % NOON)
    sql = "SELECT SUM(amount) AS s, COUNT(*) AS n FROM rdp_days WHERE ts >= '2027-01-01'"
    explained = engine.explain(sql, epsilon=5.0, **SAMPLED)
    result = engine.execute(sql, epsilon=5.0, **SAMPLED)
    for report in (explained, result.report):
        assert report.blocks == () and not report.charged
        assert (report.epsilon, report.noise, report.random_dp) == (0.0, "none", None)
        assert "reads no block" in report.notes[0]
    assert result.rows == [(0.0, 0)]  # the aggregates over no row, exactly
    assert nothing_spent(engine)
    assert not engine.sampled._sensitivities  # nothing was sampled


def test_samples_see_the_block_restriction(scratch: Callable[..., Engine]) -> None:
    """f on the samples is the restricted f the database runs: P draws half its rows in
    February, past the last block; they pass the WHERE but not the restriction."""
    engine = scratch("rdp_days", DAYS_SQL, DAYS_POLICY % (
        '"2026-01-04 12:00:00", "2026-02-01 12:00:00"'))
    report = engine.explain("SELECT COUNT(*) FROM rdp_days WHERE ts >= '2026-01-04'",
                            epsilon=5.0, **SAMPLED)
    assert report.blocks == ("rdp_days/2026-01-04", "rdp_days/2026-01-05")
    # Unrestricted, every sampled row passes and the count never changes (sensitivity 0,
    # refused); restricted, a replaced row changes it by 0 or 1 (each with probability 1/2).
    assert report.random_dp is not None and report.random_dp.sensitivity == 1
    assert nothing_spent(engine)


# -- privacy units ------------------------------------------------------------------------------

# Units 1..300 with one row each (v = uid % 100), and unit 0 with 400 rows of v = 99.5.
UNITS_SQL = [
    "CREATE TABLE rdp_units (uid BIGINT, v DOUBLE PRECISION)",
    "INSERT INTO rdp_units SELECT i, CAST(i % 100 AS DOUBLE PRECISION) "
    "FROM generate_series(1, 300) AS s(i)",
    "INSERT INTO rdp_units SELECT 0, 99.5 FROM generate_series(1, 400) AS s(i)",
]
UNITS_POLICY = """
[backend]
url = "{url}"
[privacy]
epsilon_per_block = 1000
ledger = "memory"
max_epsilon_per_query = 500
[tables.rdp_units]
privacy_unit = "uid"
max_rows_per_unit = 3
contribution = "%s"
bounding = "%s"
[tables.rdp_units.columns]
uid = {{ type = "int", private_id = true }}
v = {{ type = "float" }}
[tables.rdp_units.sampling]
rows = 1000
columns.v = {{ distribution = "uniform", lower = 0, upper = 100 }}
"""


@pytest.mark.parametrize(("contribution", "bounding"),
                         [("fixed", "per-query"), ("auto", "per-query"),
                          ("fixed", "materialized")])
def test_unit_tables_answer_over_the_bounded_relation(scratch: Callable[..., Engine],
                                                      contribution: str, bounding: str) -> None:
    engine = scratch("rdp_units", UNITS_SQL, UNITS_POLICY % (contribution, bounding))
    result = engine.execute("SELECT COUNT(*) AS n, SUM(v) AS s FROM rdp_units WHERE v >= 50",
                            epsilon=400.0, **SAMPLED)
    report = result.report
    rdp = report.random_dp
    assert rdp is not None and rdp.label == "random differential privacy"
    assert "the rows of one uid" in rdp.note
    assert (report.stability, report.privacy_unit, report.charged) == (3, "uid", True)
    assert _spent(engine) == {"rdp_units": pytest.approx(400.0)}
    # Unit 0 keeps 3 of its 400 rows: 150 light units (v in 50..99, three times) + 3 rows.
    truth = (153, 3 * sum(range(50, 100)) + 3 * 99.5)
    for value, expected, column in zip(result.rows[0], truth, report.columns, strict=True):
        assert abs(value - expected) <= tolerance(column)
    assert abs(result.rows[0][0] - 550) > tolerance(report.columns[0])  # not unbounded
    # Neighbours differ in 3 rows: the sampled L1 sensitivity of (COUNT, SUM) is at most
    # 3 + 3 * 100, and well above what one row (1 + 100) could change.
    assert 101 < rdp.sensitivity <= 303
    assert any("at most 3 rows per uid" in n for n in report.notes)
    if contribution == "auto":
        assert any("uses the policy's limit" in n for n in report.notes)


def test_unit_table_end_to_end_with_blocks(backend_url: str,
                                           make_engine: Callable[..., Engine]) -> None:
    """The demo trips (rider_id, k = 10, daily blocks): a grouped median of two days."""
    engine = make_engine(backend_url, extra="""
[tables.trips.sampling]
rows = 4000
columns.pickup_time = { distribution = "choice", values = ["2026-03-30 08:00:00",
                                                            "2026-03-31 20:00:00"] }
""")
    sql = ("SELECT city, MEDIAN(fare) AS med FROM trips WHERE pickup_time >= '2026-03-30' "
           "GROUP BY city")
    if engine.dialect != "duckdb":
        sql = sql.replace("MEDIAN(fare)",
                          "PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY fare)")
    result = engine.execute(sql, analyst="alice", epsilon=20.0, **SAMPLED)
    report = result.report
    assert report.random_dp is not None and report.stability == 10
    assert report.blocks == ("trips/2026-03-30", "trips/2026-03-31")
    assert _spent(engine) == {b: pytest.approx(20.0) for b in report.blocks}
    exact = engine.backend.run(
        "SELECT city, PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY fare), "
        "(SELECT MAX(c) FROM (SELECT COUNT(*) AS c FROM trips "
        " WHERE pickup_time >= '2026-03-30' GROUP BY rider_id) AS u) "
        "FROM trips WHERE pickup_time >= '2026-03-30' GROUP BY city").rows
    assert max(r[2] for r in exact) <= 10  # no rider loses a row to bounding: exact truth
    truth = {city: float(med) for city, med, _ in exact}
    for city, med in result.rows:
        assert abs(med - truth.get(city, 0.0)) <= tolerance(report.columns[1])


# -- the sampled sensitivity against the analytic k * max(|l|, |u|) -----------------------------

def _fares(k: int, distribution: dict[str, Any]) -> Any:
    return parse_policy({
        "backend": {"url": "duckdb:///:memory:"}, "privacy": {"epsilon_per_block": 10.0},
        "tables": {"t": {
            "privacy_unit": "uid", "max_rows_per_unit": k,
            "columns": {"uid": {"type": "int", "private_id": True},
                        "fare": {"type": "float", "lower": 0, "upper": 200}},
            "sampling": {"rows": 100, "columns": {"fare": distribution}}}}})


CLIPPED = "SELECT SUM(LEAST(GREATEST(fare, 0), 200)) FROM t"


def test_clipped_sum_reaches_the_analytic_bound(duckdb_data: str,
                                                make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(duckdb_data, k=2)  # the samples live in DuckDB: one backend is enough
    analytic = engine.explain("SELECT SUM(fare) FROM trips", analyst="alice").measurements[0]
    assert analytic.sensitivity == 2 * 200  # k * max(|l|, |u|)
    # Fares 0 or 200: replacing a unit's 2 rows changes the sum by 200 |X - Y|, X, Y ~
    # Binomial(2, 1/2); |X - Y| = 2 with probability 2 / 16 = 0.125 > gamma = 0.05, so the
    # order statistic (level k/m ~ 0.96) is exactly the analytic 400.
    policy = _fares(2, {"distribution": "choice", "values": [0, 200]})
    query = analyze_sampled(CLIPPED, policy, "duckdb")
    params = sampler_parameters(0.05, 2000)
    diffs = sampled_differences(query, policy.tables["t"], 100, params.m, swap=2, seed=0.5)
    assert set(diffs.tolist()) <= {0.0, 200.0, 400.0}
    assert order_statistic(diffs, params.k) == analytic.sensitivity


def test_clipped_sum_quantile_converges() -> None:
    """Uniform fares: G = 200 |IH(4) - 2| (IH: Irwin-Hall, the sum of 4 uniforms), whose tail
    is P(G > 200 t) = 2 (2 - t)^4 / 24 for t in [1, 2]; the k-th of m sampled G approaches the
    level-k/m quantile 200 (2 - (12 (1 - k/m))^(1/4)), below the analytic 400."""
    policy = _fares(2, {"distribution": "uniform", "lower": 0, "upper": 200})
    query = analyze_sampled(CLIPPED, policy, "duckdb")
    errors = []
    for m, seed in ((2000, 0.1), (20000, 0.3)):  # levels k/m = 0.9915, 0.964
        params = sampler_parameters(0.05, m)
        diffs = sampled_differences(query, policy.tables["t"], 100, m, swap=2, seed=seed)
        sampled = order_statistic(diffs, params.k)
        assert sampled <= 400
        expected = 200 * (2 - (12 * (1 - params.k / params.m)) ** 0.25)
        assert sampled == pytest.approx(expected, rel=0.05)
        errors.append(abs(sampled - 200 * (2 - (12 * 0.05) ** 0.25)))  # the 0.95 quantile 224
    assert errors[-1] < errors[0] and errors[-1] / 224 < 0.1


@settings(max_examples=8, deadline=None)
@given(k=st.integers(1, 6), upper=st.floats(1.0, 1e4), seed=st.floats(-1.0, 1.0))
def test_sampled_never_exceeds_k_times_the_bound(k: int, upper: float, seed: float) -> None:
    policy = parse_policy({
        "backend": {"url": "duckdb:///:memory:"}, "privacy": {"epsilon_per_block": 10.0},
        "tables": {"t": {
            "privacy_unit": "uid", "max_rows_per_unit": k,
            "columns": {"uid": {"type": "int", "private_id": True}, "x": {"type": "float"}},
            "sampling": {"rows": 20, "columns": {
                "x": {"distribution": "normal", "mean": 0, "sd": upper}}}}}})
    query = analyze_sampled(f"SELECT SUM(LEAST(GREATEST(x, 0), {upper!r})) FROM t", policy,
                            "duckdb")
    diffs = sampled_differences(query, policy.tables["t"], 20, 200, swap=k, seed=seed)
    assert diffs.max() <= k * upper * (1 + 1e-9)


# -- refusals ------------------------------------------------------------------------------

_SHARED = {
    "privacy_unit": ["rider_id", "driver_id"], "row_id": "ride_id", "max_rows_per_unit": 3,
    "columns": {"ride_id": {"type": "int"}, "rider_id": {"type": "int", "private_id": True},
                "driver_id": {"type": "int", "private_id": True}, "fare": {"type": "float"}},
    "sampling": {"rows": 100, "columns": {"fare": {"distribution": "uniform", "lower": 0,
                                                   "upper": 50}}}}
_PAPERS = {
    "privacy_unit": {"table": "authors", "row_id": "paper_id", "unit_id": "author_id"},
    "max_rows_per_unit": 3,
    "columns": {"paper_id": {"type": "int"}, "cites": {"type": "float"}},
    "sampling": {"rows": 100, "columns": {"cites": {"distribution": "exponential",
                                                    "mean": 10}}}}


@pytest.mark.parametrize(("table", "sql", "needle"), [
    (_SHARED, "SELECT MEDIAN(fare) FROM t", "rows belong to several privacy units"),
    (_PAPERS, "SELECT SUM(LN(1 + cites)) FROM t", "rows belong to several privacy units"),
])
def test_multi_attribution_is_refused(table: dict[str, Any], sql: str, needle: str) -> None:
    policy = parse_policy({"backend": {"url": "duckdb:///:memory:"},
                           "privacy": {"epsilon_per_block": 10.0}, "tables": {"t": table}})
    with pytest.raises(NotSupportedError, match=needle) as info:
        analyze_sampled(sql, policy, "duckdb")
    assert "analytic sensitivity" in (info.value.hint or "")


@pytest.mark.parametrize(("sql", "rows", "needle"), [
    # The unit column (here not private_id) is never read: samples draw rows independently.
    ("SELECT COUNT(*) FROM rdp_units WHERE uid < 10", 1000, "privacy unit column uid"),
    ("SELECT SUM(v + uid) FROM rdp_units", 1000, "privacy unit column uid"),
    # n must exceed the k rows neighbours differ in.
    ("SELECT SUM(v) FROM rdp_units", 3, "not more than the 3 row"),
])
def test_unit_refusals_cost_nothing(scratch: Callable[..., Engine], sql: str, rows: int,
                                    needle: str) -> None:
    policy = (UNITS_POLICY % ("fixed", "per-query")).replace(
        "private_id = true", "private_id = false").replace("rows = 1000", f"rows = {rows}")
    engine = scratch("rdp_units", UNITS_SQL, policy)
    for call in (engine.execute, engine.explain):
        with pytest.raises((QueryRefused, NotSupportedError), match=needle):
            call(sql, **SAMPLED)
    assert nothing_spent(engine)
