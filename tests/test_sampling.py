"""Sensitivity sampling end to end (chorus_py.kinds.sampled): answers, labels, costs and refusals.

The ``visits`` table of conftest is event-level: 1000 rows, seconds = visit_id % 700, pages
'home' (500), 'about' (300), 'blog' (200).  Its sampling distribution P (added per test) draws
seconds uniformly from [0, 700] and pages uniformly from a declared list.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import Any

import pytest

from analyses.sampling import analyze_sampled
from chorus_py.engine import Engine
from chorus_py.errors import (
    ChorusError,
    InvalidParameter,
    NotSupportedError,
    PolicyError,
    QueryRefused,
)
from chorus_py.kinds.sampled import sampled_differences
from chorus_py.policy import parse_policy
from mechanisms.sampling import order_statistic, sampler_parameters
from tests.conftest import nothing_spent, tolerance

# The start of every scratch policy here: a memory ledger with room for every test's queries.
SCRATCH_HEAD = """
[backend]
url = "{url}"
[privacy]
epsilon_per_block = 100
ledger = "memory"
max_epsilon_per_query = 10
"""
P_VISITS = """
[tables.visits.sampling]
rows = 1000
columns.seconds = { distribution = "uniform", lower = 0, upper = 700 }
columns.page = { distribution = "choice", values = ["home", "about", "blog"] }
columns.visit_id = { distribution = "uniform", lower = 1, upper = 1000 }
"""
SECONDS = [i % 700 for i in range(1, 1001)]
PAGES = ["home" if i % 10 < 5 else "about" if i % 10 < 8 else "blog" for i in range(1, 1001)]
SAMPLED: dict[str, Any] = {"analyst": "alice", "epsilon": 5.0, "sensitivity": "sampled",
                           "gamma": 0.05}


@pytest.fixture
def sampled_engine(backend_url: str, make_engine: Callable[..., Engine]) -> Engine:
    return make_engine(backend_url, extra=P_VISITS)


def _spent(engine: Engine, block: str) -> float:
    return sum(b.epsilon_spent for b in engine.ledger.remaining((block,)))


def test_median_and_nonlinear_sum_end_to_end(sampled_engine: Engine) -> None:
    result = sampled_engine.execute(
        "SELECT MEDIAN(seconds) AS med, SUM(LN(1 + seconds)) AS logs FROM visits", **SAMPLED)
    report = result.report
    rdp = report.random_dp
    assert rdp is not None and rdp.label == "random differential privacy"
    assert (rdp.gamma, rdp.m, rdp.n) == (0.05, 2000, 1000)
    params = sampler_parameters(0.05, 2000)
    assert (rdp.k, rdp.rho) == (params.k, params.rho)
    # Exactly the query's epsilon, no delta (pure-DP mechanisms), on the table's one block.
    assert (report.epsilon, report.delta, report.charged) == (5.0, 0.0, True)
    assert _spent(sampled_engine, "visits") == pytest.approx(5.0)
    truth = (statistics.median(SECONDS), sum(math.log1p(s) for s in SECONDS))
    for value, expected, column in zip(result.rows[0], truth, report.columns, strict=True):
        assert column.mechanism == "snapping"
        assert abs(value - expected) <= tolerance(column)
    # Every output gets an equal share of epsilon, calibrated to the sampled L1 sensitivity.
    for m in report.measurements:
        assert m.sensitivity == pytest.approx(rdp.sensitivity)
        assert m.mechanism["epsilon"] == pytest.approx(2.5)


def test_grouped_ratio_and_count(scratch: Callable[..., Engine]) -> None:
    engine = scratch("rdp_pages", [
        "CREATE TABLE rdp_pages (page TEXT, seconds DOUBLE PRECISION)",
        "INSERT INTO rdp_pages SELECT CASE WHEN i % 10 < 5 THEN 'home' WHEN i % 10 < 8 THEN "
        "'about' ELSE 'blog' END, CAST(i % 700 AS DOUBLE PRECISION) "
        "FROM generate_series(1, 1000) AS s(i)",
    ], SCRATCH_HEAD + """
[tables.rdp_pages.columns]
page = {{ type = "text", public_values = ["home", "about", "blog", "shop"] }}
seconds = {{ type = "float" }}
[tables.rdp_pages.sampling]
rows = 1000
columns.seconds = {{ distribution = "uniform", lower = 0, upper = 700 }}
""")
    result = engine.execute(
        "SELECT page, COUNT(*) AS n, SUM(seconds) / COUNT(*) AS mean FROM rdp_pages "
        "WHERE seconds >= 100 GROUP BY page", epsilon=5.0, sensitivity="sampled")
    # Every declared value is released, the absent 'shop' too (its count is noise around 0).
    assert [r[0] for r in result.rows] == ["home", "about", "blog", "shop"]
    assert result.types == ("text", "integer", "float")
    rdp = result.report.random_dp
    assert rdp is not None
    count_column = result.report.columns[1]
    assert count_column.mechanism == "discrete_laplace"
    assert result.report.measurements[0].sensitivity == math.ceil(rdp.sensitivity)
    for page, n, mean in result.rows:
        kept = [s for s, p in zip(SECONDS, PAGES, strict=True) if p == page and s >= 100]
        assert isinstance(n, int)
        assert abs(n - len(kept)) <= tolerance(count_column)
        truth = sum(kept) / len(kept) if kept else 0.0  # an empty ratio counts as 0
        assert abs(mean - truth) <= tolerance(result.report.columns[2])


def test_integer_arithmetic_and_rounding(sampled_engine: Engine) -> None:
    """Integer columns keep integer modulo (Postgres has no double modulo); FLOOR of a ratio."""
    result = sampled_engine.execute(
        "SELECT SUM(visit_id % 3) AS s, AVG(FLOOR(seconds / 7)) AS a FROM visits "
        "WHERE page <> 'blog'", **SAMPLED)
    kept = [(i, s) for i, s, p in zip(range(1, 1001), SECONDS, PAGES, strict=True)
            if p != "blog"]
    truth = (sum(i % 3 for i, _ in kept), sum(s // 7 for _, s in kept) / len(kept))
    for value, expected, column in zip(result.rows[0], truth, result.report.columns,
                                       strict=True):
        assert abs(value - expected) <= tolerance(column)


def test_column_without_a_distribution_is_refused(backend_url: str,
                                                  make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(backend_url, extra="""
[tables.visits.sampling]
rows = 1000
columns.seconds = { distribution = "exponential", mean = 300 }
""")
    # page has no distribution, no bounds and no public_values: P says nothing about it.
    with pytest.raises(QueryRefused, match="says nothing about column 'page'"):
        engine.execute("SELECT AVG(seconds) FROM visits WHERE page = 'home'", analyst="alice",
                       sensitivity="sampled")
    assert nothing_spent(engine)


def test_explain_shows_parameters_free_and_caches(sampled_engine: Engine) -> None:
    sql = "SELECT QUANTILE_CONT(seconds, 0.9) FROM visits" \
        if sampled_engine.dialect == "duckdb" else \
        "SELECT PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY seconds) FROM visits"
    first = sampled_engine.explain(sql, **SAMPLED)
    again = sampled_engine.explain(sql, **SAMPLED)
    assert first.random_dp is not None and again.random_dp is not None
    assert first.random_dp.sensitivity == again.random_dp.sensitivity  # cached, not resampled
    assert len(sampled_engine.sampled._sensitivities) == 1
    assert first.random_dp.k <= first.random_dp.m and 0 < first.random_dp.rho < 0.05
    assert nothing_spent(sampled_engine)
    # 90th percentile of uniform [0, 700] rows: one swapped row moves it by ~ 700 / n.
    assert 0 < first.random_dp.sensitivity < 70


def test_edge_values_never_raise(scratch: Callable[..., Engine]) -> None:
    """Values that would make LN, SQRT, EXP, x * x or 1 / x fail in Postgres are answered."""
    engine = scratch("rdp_edge", [
        "CREATE TABLE rdp_edge (x DOUBLE PRECISION)",
        "INSERT INTO rdp_edge VALUES (-1), (0), (1e300), (-1e300), (1e-300), ('NaN'), "
        "('Infinity'), ('-Infinity'), (NULL), (2)",
    ], SCRATCH_HEAD + """
[tables.rdp_edge.columns]
x = {{ type = "float" }}
[tables.rdp_edge.sampling]
rows = 50
columns.x = {{ distribution = "normal", mean = 0, sd = 10 }}
""")
    sql = ("SELECT SUM(LN(x)), SUM(SQRT(x)), SUM(EXP(x)), SUM(x * x), SUM(1 / x), "
           "AVG(LOG(x)), MEDIAN(x) FROM rdp_edge")
    result = engine.execute(sql, epsilon=1.0, sensitivity="sampled")
    assert all(math.isfinite(v) for v in result.rows[0])


REFUSALS = [
    # (Without the opt-in a median is answered by the exponential mechanism, grouped by a key
    # without public values too: keys released by a noisy threshold, tests/test_quantiles.py.)
    ("SELECT MEDIAN(seconds) FROM visits", {"gamma": 0.05}, InvalidParameter,
     "gamma applies only"),
    ("SELECT MEDIAN(seconds) FROM visits", {"sensitivity": "exact"}, InvalidParameter,
     "'analytic' or 'sampled'"),
    ("SELECT MEDIAN(seconds) FROM visits", {"sensitivity": "sampled", "gamma": 0.2},
     InvalidParameter, "above the policy maximum"),
    # trips has a privacy unit (tests/test_sampling_units.py) but no P in this policy.
    ("SELECT MEDIAN(fare) FROM trips", {"sensitivity": "sampled"}, QueryRefused,
     "no sampling distribution P for table 'trips'"),
    ("SELECT seconds FROM visits", {"sensitivity": "sampled"}, QueryRefused, "raw values"),
    ("SELECT SUM(POWER(seconds, 2)) FROM visits", {"sensitivity": "sampled"}, QueryRefused,
     "POWER"),
    ("SELECT SUM(EXP(seconds) * EXP(seconds) * EXP(seconds)) FROM visits",
     {"sensitivity": "sampled"}, QueryRefused, "overflow"),
    # EXP's argument is clamped at 230, so this is exp(230) on every sample: never noise-free.
    ("SELECT EXP(SUM(EXP(seconds))) FROM visits", {"sensitivity": "sampled"}, QueryRefused,
     "sampled sensitivity is 0"),
    ("SELECT MEDIAN(seconds) FROM pg_catalog.pg_class", {"sensitivity": "sampled"},
     QueryRefused, "catalog"),
    ("SELECT SUM(setseed(0.5)) FROM visits", {"sensitivity": "sampled"}, QueryRefused,
     "SETSEED"),
    ("SELECT page, MEDIAN(seconds) FROM visits GROUP BY page ORDER BY 2",
     {"sensitivity": "sampled"}, NotSupportedError, "ORDER"),
    ("SELECT visit_id, COUNT(*) FROM visits GROUP BY visit_id", {"sensitivity": "sampled"},
     NotSupportedError, "public_values"),
    ("SELECT MEDIAN(seconds) FROM visits WHERE seconds IN (SELECT 1)",
     {"sensitivity": "sampled"}, NotSupportedError, "subquery inside WHERE"),
]


@pytest.mark.parametrize(("sql", "kwargs", "error", "needle"), REFUSALS,
                         ids=[f"{i}" for i in range(len(REFUSALS))])
def test_refusals_cost_nothing(sampled_engine: Engine, sql: str, kwargs: dict[str, Any],
                               error: type[ChorusError], needle: str) -> None:
    for call in (sampled_engine.execute, sampled_engine.explain):
        with pytest.raises(error) as info:
            call(sql, analyst="alice", **kwargs)
        assert needle.lower() in str(info.value).lower()
    assert nothing_spent(sampled_engine)


def test_no_sampling_distribution_is_refused(engine: Engine) -> None:
    with pytest.raises(QueryRefused, match="name a reference table or declare column domains"):
        engine.execute("SELECT MEDIAN(seconds) FROM visits", analyst="alice",
                       sensitivity="sampled")
    assert nothing_spent(engine)


def test_reference_table_as_p(scratch: Callable[..., Engine], backend_url: str) -> None:
    engine = scratch("visits_ref", [
        "CREATE TABLE visits_ref (seconds DOUBLE PRECISION, page TEXT)",
        "INSERT INTO visits_ref VALUES (10, 'home'), (200, 'about'), (650, 'blog'), "
        "(333, 'home'), (90, 'home')",
    ], SCRATCH_HEAD + """
[tables.visits.columns]
visit_id = {{ type = "int" }}
page = {{ type = "text" }}
seconds = {{ type = "float" }}
[tables.visits.sampling]
reference = "visits_ref"
[tables.visits_ref]
public = true
""")
    report = engine.explain("SELECT AVG(seconds) FROM visits WHERE page = 'home'",
                            sensitivity="sampled")
    assert report.random_dp is not None
    assert report.random_dp.n == 5 and "visits_ref" in report.random_dp.n_source
    assert report.random_dp.sensitivity <= 650  # an average of values within [10, 650]
    result = engine.execute("SELECT AVG(seconds) FROM visits WHERE page = 'home'",
                            epsilon=1.0, sensitivity="sampled")
    assert result.report.charged and math.isfinite(result.rows[0][0])


# -- the sampled sensitivity against the analytic one (paper, Section 7.1) ---------------------

_POLICY = {
    "backend": {"url": "duckdb:///:memory:"}, "privacy": {"epsilon_per_block": 10.0},
    "tables": {"visits": {
        "columns": {"seconds": {"type": "float", "lower": 0, "upper": 600}},
        "sampling": {"rows": 100, "columns": {
            "seconds": {"distribution": "uniform", "lower": 0, "upper": 600}}},
    }},
}


def test_sampled_never_exceeds_analytic_and_converges(
        duckdb_data: str, make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(duckdb_data)  # the samples live in DuckDB: one backend is enough
    policy = parse_policy(_POLICY)
    # The analytic sensitivity of the same clipped SUM, from the analytic engine: 600.
    analytic = engine.explain("SELECT SUM(seconds) FROM visits",
                              analyst="alice").measurements[0].sensitivity
    assert analytic == 600
    query = analyze_sampled("SELECT SUM(LEAST(GREATEST(seconds, 0), 600)) FROM visits",
                            policy, "duckdb")
    tp = policy.tables["visits"]
    # G = 600 |U1 - U2| with U uniform on [0, 1]: P(G <= t) = 1 - (1 - t / 600)^2, so the
    # level-q quantile is 600 (1 - sqrt(1 - q)); at q = 1 - gamma = 0.95 it is 465.84, the
    # "analytic high-probability sensitivity" the sampler approaches as m grows.
    errors = []
    for m, seed in ((1305, 0.1), (4000, 0.2), (20000, 0.3)):
        params = sampler_parameters(0.05, m)
        diffs = sampled_differences(query, tp, 100, m, seed=seed)
        sampled = order_statistic(diffs, params.k)
        assert sampled <= analytic
        level = params.k / params.m
        assert sampled == pytest.approx(600 * (1 - math.sqrt(1 - level)), rel=0.08)
        errors.append(sampled - 600 * (1 - math.sqrt(0.05)))
    assert errors[-1] < errors[0] and abs(errors[-1]) / 465.84 < 0.08

    count = analyze_sampled("SELECT COUNT(*) FROM visits WHERE seconds > 300", policy, "duckdb")
    count_analytic = engine.explain("SELECT COUNT(*) FROM visits WHERE seconds > 300",
                                    analyst="alice").measurements[0].sensitivity
    for m in (1305, 20000):
        params = sampler_parameters(0.05, m)
        diffs = sampled_differences(count, tp, 100, m, seed=0.4)
        # One swapped row changes the count by 0 or 1 (each with probability 1/2).
        assert set(diffs.tolist()) <= {0.0, 1.0}
        assert order_statistic(diffs, params.k) == count_analytic == 1


def test_policy_validation() -> None:
    def policy(sampling: dict[str, Any], privacy: dict[str, Any] | None = None,
               extra: dict[str, Any] | None = None) -> Any:
        tables = {"visits": {"columns": {"seconds": {"type": "float"}}, "sampling": sampling},
                  **(extra or {})}
        return parse_policy({"backend": {"url": "duckdb:///:memory:"},
                             "privacy": {"epsilon_per_block": 1.0, **(privacy or {})},
                             "tables": tables})

    with pytest.raises(PolicyError, match="rows"):
        policy({"columns": {"seconds": {"distribution": "uniform", "lower": 0, "upper": 1}}})
    with pytest.raises(PolicyError, match="must be a public table"):
        policy({"reference": "other"}, extra={"other": {"columns": {"a": {"type": "int"}}}})
    with pytest.raises(PolicyError, match="takes mean and sd"):
        policy({"rows": 10, "columns": {"seconds": {"distribution": "normal", "mean": 1}}})
    with pytest.raises(PolicyError, match="not declared"):
        policy({"rows": 10, "columns": {"nope": {"distribution": "exponential", "mean": 1}}})
    with pytest.raises(PolicyError, match="default_gamma"):
        policy({"rows": 10}, privacy={"default_gamma": 0.1, "max_gamma": 0.05})
    ok = policy({"rows": 10, "columns": {"seconds": {"distribution": "choice",
                                                      "values": [1, 2], "weights": [1, 3]}}})
    assert ok.tables["visits"].sampling is not None
