"""Join queries end to end on DuckDB and Postgres: answers, reports, blocks, metrics, leaks."""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from chorus_py.backends import open_backend
from chorus_py.engine import Engine
from chorus_py.errors import InvalidParameter, NotSupportedError
from chorus_py.policy import load_policy
from server.pgwire.session import explain_lines
from tests.conftest import nothing_spent, tolerance

# orders: 1..600, customer i % 20 except that customer 7 also has 91 extra orders (mf 121: a
# value that appears nowhere else); 3 days.  recs: customer i % 50 for i in 1..300 (mf 6).
# shops (public): 1..4, two in SF.  riders (1 row per rider), rides (<= 4 per rider, cap 3).
TABLES = ("j_orders", "j_recs", "j_shops", "j_riders", "j_rides")
SETUP = [
    "CREATE TABLE j_orders (order_id BIGINT, customer_id BIGINT, shop_id BIGINT, "
    "day TIMESTAMP, amount DOUBLE PRECISION)",
    "INSERT INTO j_orders SELECT i, i % 20, i % 4 + 1, TIMESTAMP '2026-01-01' + (i % 3) * "
    "INTERVAL '1 day', CAST(i % 50 AS DOUBLE PRECISION) FROM generate_series(1, 600) AS s(i)",
    "INSERT INTO j_orders SELECT 1000 + i, 7, 1, TIMESTAMP '2026-01-01', 10.0 "
    "FROM generate_series(1, 91) AS s(i)",
    "CREATE TABLE j_recs (rec_id BIGINT, customer_id BIGINT)",
    "INSERT INTO j_recs SELECT i, i % 50 FROM generate_series(1, 300) AS s(i)",
    "CREATE TABLE j_shops (shop_id BIGINT, city TEXT)",
    "INSERT INTO j_shops VALUES (1, 'SF'), (2, 'SF'), (3, 'LA'), (4, 'NYC')",
    "CREATE TABLE j_riders (rider_id BIGINT, city TEXT)",
    "INSERT INTO j_riders SELECT i, CASE WHEN i % 2 = 0 THEN 'SF' ELSE 'LA' END "
    "FROM generate_series(1, 200) AS s(i)",
    "CREATE TABLE j_rides (ride_id BIGINT, rider_id BIGINT, shop_id BIGINT, fare DOUBLE PRECISION)",
    "INSERT INTO j_rides SELECT i, i % 200 + 1, i % 4 + 1, CAST(i % 30 AS DOUBLE PRECISION) "
    "FROM generate_series(1, 700) AS s(i)",
]
HIDDEN_MF = 121

POLICY = """
[backend]
url = "{url}"

[privacy]
epsilon_per_block = 1000
delta_per_block = 1e-3
default_epsilon = 1.0
default_delta = 1e-8
max_epsilon_per_query = 500
max_delta_per_query = 1e-4
noise = "{noise}"

[tables.j_orders]
block = {{ column = "day", size = "1 day", start = "2026-01-01", end = "2026-01-04" }}
[tables.j_orders.columns]
order_id = {{ type = "int" }}
customer_id = {{ type = "int" }}
shop_id = {{ type = "int" }}
day = {{ type = "timestamp" }}
amount = {{ type = "float", lower = 0, upper = 100 }}

[tables.j_recs.columns]
rec_id = {{ type = "int", max_frequency = 1 }}
customer_id = {{ type = "int", max_frequency = 6 }}

[tables.j_shops]
public = true

[tables.j_riders]
privacy_unit = "rider_id"
max_rows_per_unit = 1
contribution = "fixed"
[tables.j_riders.columns]
rider_id = {{ type = "int", private_id = true }}
city = {{ type = "text", public_values = ["SF", "LA"] }}

[tables.j_rides]
privacy_unit = "rider_id"
max_rows_per_unit = 3
[tables.j_rides.columns]
ride_id = {{ type = "int" }}
rider_id = {{ type = "int", private_id = true }}
shop_id = {{ type = "int" }}
fare = {{ type = "float", lower = 0, upper = 30 }}
"""

JOIN = "SELECT COUNT(*) FROM j_orders o JOIN j_recs r ON o.customer_id = r.customer_id"


@pytest.fixture
def joins(backend_url: str, tmp_path: Path) -> Iterator[Callable[..., Engine]]:
    """Engines over the join tables (created once per test, dropped afterwards)."""
    admin = open_backend(backend_url)
    setup = [s.replace("DOUBLE PRECISION", "DOUBLE") for s in SETUP] \
        if backend_url.startswith("duckdb") else SETUP
    if backend_url.startswith("duckdb"):
        setup = [s.replace("(i % 3) * INTERVAL '1 day'", "to_days(CAST(i % 3 AS INTEGER))")
                 for s in setup]
    admin.run_owned([*(f"DROP TABLE IF EXISTS {t}" for t in TABLES), *setup])
    engines: list[Engine] = []

    def make(noise: str = "sql") -> Engine:
        path = tmp_path / f"joins-{uuid.uuid4().hex[:6]}.toml"
        path.write_text(POLICY.format(url=backend_url, noise=noise))
        engine = Engine(load_policy(path), block_ttl_seconds=0)
        engines.append(engine)
        return engine

    make.admin = admin  # type: ignore[attr-defined]
    yield make
    for engine in engines:
        engine.close()
    admin.run_owned([f"DROP TABLE IF EXISTS {t}" for t in TABLES])
    admin.close()


def _truth(make: Callable[..., Engine], sql: str) -> float:
    return float(make.admin.run(sql).rows[0][0])  # type: ignore[attr-defined]


def test_count_and_sum_near_truth(joins: Callable[..., Engine]) -> None:
    engine = joins()
    true_count = _truth(joins, "SELECT COUNT(*) FROM j_orders o JOIN j_recs r "
                        "ON o.customer_id = r.customer_id")
    result = engine.execute(JOIN, epsilon=200, delta=1e-6)
    (count,) = result.rows[0]
    assert isinstance(count, int)
    # The scale is hidden from the report; recompute it here from the known mf (121, pinned 6).
    from analyses.elastic import smooth_bound, smoothing_beta
    query = engine._analyse(JOIN)
    assert query.join is not None
    bound = smooth_bound(query.join.stability, {"j_orders.customer_id": HIDDEN_MF,
                                                "j_recs.customer_id": 6},
                         smoothing_beta(200, 1e-6))
    assert abs(count - true_count) <= bound.scale(200) * 25 + 1
    assert result.report.charged and result.report.delta == 1e-6


def test_sum_avg_grouped_join_to_public(joins: Callable[..., Engine]) -> None:
    engine = joins()
    sql = ("SELECT s.city, COUNT(*) AS n, SUM(r.fare) AS total FROM j_rides r JOIN j_shops s "
           "ON r.shop_id = s.shop_id WHERE s.city IN ('SF', 'LA') GROUP BY s.city")
    # shops is public: its cities are the keys (analyses.keys), narrowed by the filter on
    # shops alone, with no threshold.
    assert engine.explain(sql, epsilon=100, delta=1e-6).key_release.method == "public_values"
    assert sorted(r[0] for r in engine.execute(sql, epsilon=100, delta=1e-6).rows) == \
        ["LA", "SF"]
    sql = ("SELECT ri.city, COUNT(*) AS n, AVG(r.fare) AS fare FROM j_rides r JOIN j_riders ri "
           "ON r.rider_id = ri.rider_id GROUP BY ri.city ORDER BY ri.city")
    report = engine.explain(sql, epsilon=100, delta=1e-6)
    assert report.elastic is not None and not report.elastic.data_dependent
    # Joined on the unit: a rider's <= 3 rides pair only with its 1 rider row: S = 3 * 1 = 3
    # at every k, so S* = 3.
    assert report.elastic.at_zero == 3 and report.elastic.smooth_bound == 3
    result = engine.execute(sql, epsilon=100, delta=1e-6)
    assert [r[0] for r in result.rows] == ["LA", "SF"]
    counts = {r[0]: r[1] for r in result.rows}
    scale = next(c.scale for c in result.report.columns if c.name == "n")
    assert scale == pytest.approx(2 * 3 / (100 / 3))
    # Each rider has 3 or 4 rides and keeps 3: 600 rides after bounding, 300 per city.
    for city in ("LA", "SF"):
        assert abs(counts[city] - 300) <= tolerance(type("c", (), {"scale": scale})())
    fares = {r[0]: r[2] for r in result.rows}
    assert all(0 <= v <= 30 for v in fares.values())


def test_join_sum_is_reported_in_the_columns_units(joins: Callable[..., Engine]) -> None:
    """A join's SUM is measured in integer grid steps, but the analyst reads fares: the
    report's sensitivity, scale and error bound are in fares.  S = 3 (rides JOIN riders on the
    unit), fare in [0, 30]: Delta = S * 30 = 90, scale 2 * 90 / epsilon = 18 at epsilon 10."""
    engine = joins()
    sql = ("SELECT SUM(r.fare) AS total FROM j_rides r JOIN j_riders ri "
           "ON r.rider_id = ri.rider_id")
    report = engine.explain(sql, epsilon=10, delta=1e-6)
    (m,) = report.measurements
    assert m.mechanism["scale"] == pytest.approx(18.0)
    assert m.mechanism["scale_in_grid_steps"] == pytest.approx(18.0 / m.mechanism["grid_step"])
    assert m.sensitivity == pytest.approx(180.0)  # 2 S* max|v|: the scale times epsilon
    # Laplace-type noise of scale b exceeds b ln(20) with probability 5%.
    assert m.error_bound_95 == pytest.approx(18.0 * math.log(20), rel=0.02)


def test_blocks_of_every_table_charged(joins: Callable[..., Engine]) -> None:
    engine = joins()
    sql = ("SELECT COUNT(*) FROM j_orders o JOIN j_recs r ON o.customer_id = r.customer_id "
           "WHERE o.day < '2026-01-02'")
    result = engine.execute(sql, epsilon=1, delta=1e-8)
    assert result.report.blocks == ("j_orders/2026-01-01", "j_recs")
    charged = {b.block_id for b in engine.ledger.blocks() if b.epsilon_consumed > 0}
    assert charged == {"j_orders/2026-01-01", "j_recs"}


def test_self_join_restricts_each_side_to_its_blocks(joins: Callable[..., Engine]) -> None:
    engine = joins()
    sql = ("SELECT COUNT(*) FROM j_orders a JOIN j_orders b ON a.order_id = b.order_id "
           "WHERE a.day < '2026-01-02' AND b.day >= '2026-01-03'")
    report = engine.explain(sql, epsilon=1, delta=1e-8)
    assert report.blocks == ("j_orders/2026-01-01", "j_orders/2026-01-03")


def test_delta_required_and_refusals_free(joins: Callable[..., Engine]) -> None:
    engine = joins()
    with pytest.raises(InvalidParameter, match="delta > 0"):
        engine.execute(JOIN, epsilon=1, delta=0)
    with pytest.raises(NotSupportedError, match="OUTER"):
        engine.execute("SELECT COUNT(*) FROM j_orders o LEFT JOIN j_recs r "
                       "ON o.customer_id = r.customer_id")
    assert nothing_spent(engine)


def _all_text(engine: Engine, sql: str, **kw: float) -> str:
    report = engine.explain(sql, **kw)
    return json.dumps(report.to_dict()) + "\n".join(explain_lines(report))


def test_no_data_derived_value_leaks(joins: Callable[..., Engine]) -> None:
    engine = joins()
    from analyses.elastic import smooth_bound, smoothing_beta
    query = engine._analyse(JOIN)
    assert query.join is not None
    bound = smooth_bound(query.join.stability, {"j_orders.customer_id": HIDDEN_MF,
                                                "j_recs.customer_id": 6},
                         smoothing_beta(1.0, 1e-8))
    secrets = {str(HIDDEN_MF), f"{bound.value:g}", f"{bound.scale(1.0):g}",
               repr(bound.value), repr(bound.scale(1.0)), f"{bound.scale(1.0):.4g}"}
    text = _all_text(engine, JOIN, epsilon=1.0, delta=1e-8)
    result = engine.execute(JOIN, epsilon=1.0, delta=1e-8)
    text += json.dumps(result.to_dict(), default=str)
    # No error bar either: its width would show the data-dependent scale.
    assert result.intervals() == ((None,) * len(result.columns),) * len(result.rows)
    for secret in secrets:
        assert secret not in text, secret
    report = result.report
    assert report.rewritten_sql is None
    assert report.elastic is not None and report.elastic.data_dependent
    assert {f.name: f.value for f in report.elastic.frequencies} == {
        "j_orders.customer_id": None, "j_recs.customer_id": 6}
    assert all(m.sensitivity is None and m.error_bound_95 is None for m in report.measurements)
    assert any("data-dependent" in n for n in report.notes)
    # Proxy noise: the measure SQL holds no scale and may be shown.
    proxy = joins(noise="proxy")
    shown = proxy.explain(JOIN, epsilon=1.0, delta=1e-8)
    assert shown.rewritten_sql is not None and "RANDOM" not in shown.rewritten_sql.upper()
    proxy_text = _all_text(proxy, JOIN, epsilon=1.0, delta=1e-8)
    for secret in secrets:
        assert secret not in proxy_text, secret
    (count,) = proxy.execute(JOIN, epsilon=1.0, delta=1e-8).rows[0]
    assert isinstance(count, int)


def test_explain_pinned_shows_numbers(joins: Callable[..., Engine]) -> None:
    engine = joins()
    sql = "SELECT COUNT(*) FROM j_recs a JOIN j_recs b ON a.customer_id = b.customer_id"
    report = engine.explain(sql, epsilon=0.1, delta=1e-8)
    elastic = report.elastic
    assert elastic is not None and not elastic.data_dependent
    assert elastic.stability == "mf_k(j_recs.customer_id) + mf_k(j_recs.customer_id) + 1"
    # S(k) = 13 + 2k; beta = 0.0026159: peak at k = 1/beta - 6.5 = 375.77 -> 376.
    assert elastic.at_zero == 13 and elastic.peak_k == 376
    assert report.columns[0].scale == pytest.approx(2 * elastic.smooth_bound / 0.1)
    lines = "\n".join(explain_lines(report))
    assert "S(k) = mf_k(j_recs.customer_id)" in lines and "peak" in lines
    assert report.rewritten_sql is not None


def test_metrics_cached_and_refreshed(joins: Callable[..., Engine]) -> None:
    engine = joins()
    query = engine._analyse(JOIN)
    assert query.join is not None
    metrics = query.join.metrics
    assert engine.frequencies.values(metrics)["j_orders.customer_id"] == HIDDEN_MF
    reads = engine.frequencies.reads
    engine.frequencies.values(metrics)
    assert engine.frequencies.reads == reads  # unchanged table: cached
    joins.admin.run_owned([  # type: ignore[attr-defined]
        "INSERT INTO j_orders SELECT 5000 + i, 7, 1, TIMESTAMP '2026-01-01', 1.0 "
        "FROM generate_series(1, 9) AS s(i)"])
    deadline = time.monotonic() + 5  # Postgres publishes its counters within about a second
    while engine.frequencies.values(metrics)["j_orders.customer_id"] != HIDDEN_MF + 9:
        assert time.monotonic() < deadline, "the metric was not refreshed"
        time.sleep(0.2)
    assert engine.frequencies.reads == reads + 1


SPREAD_POLICY = """
[backend]
url = "{url}"

[privacy]
epsilon_per_block = 1e6
delta_per_block = 1e-3
max_epsilon_per_query = 1e5

[tables.s_shops]
public = true

[tables.s_rides]
privacy_unit = "rider_id"
max_rows_per_unit = 3
contribution = "fixed"
[tables.s_rides.columns]
rider_id = {{ type = "int" }}
shop_id = {{ type = "int" }}

[analysts.alice]
"""


def test_a_filter_on_a_joined_public_table_is_applied_before_the_cap(
        scratch: Callable[..., Engine]) -> None:
    """100 riders with 10 rides each, over shops 1, 2, 3, 4, 1, 2, 3, 4, 1, 2 (shops 1 and 2 in
    SF): 6 SF rides per rider.  With a cap of 3 spent before the join's filter, a rider kept 3
    random rides of 10, 1.8 of them in SF on average (about 180 in all); spent on the rows the
    join keeps (the filter on the public table reaches the rides as a semi-join), every rider
    keeps 3 SF rides: 300.  The stability is unchanged (S = 3 * mf(s_shops.shop_id) = 3)."""
    engine = scratch("s_rides", [
        "DROP TABLE IF EXISTS s_shops",
        "CREATE TABLE s_shops AS SELECT CAST(i AS BIGINT) AS shop_id, CASE WHEN i <= 2 THEN "
        "'SF' WHEN i = 3 THEN 'LA' ELSE 'NYC' END AS city FROM generate_series(1, 4) AS a(i)",
        "CREATE TABLE s_rides AS SELECT CAST(u AS BIGINT) AS rider_id, CAST(j % 4 + 1 AS BIGINT) "
        "AS shop_id FROM generate_series(1, 100) AS a(u), generate_series(0, 9) AS b(j)"],
        SPREAD_POLICY)
    sql = ("SELECT COUNT(*) FROM s_rides r JOIN s_shops s ON r.shop_id = s.shop_id "
           "WHERE s.city = 'SF'")
    result = engine.execute(sql, epsilon=1000.0, delta=1e-6, analyst="alice")
    assert result.report.elastic is not None and result.report.elastic.smooth_bound == 3
    assert result.rows[0][0] == pytest.approx(300, abs=3)
    assert "IN (SELECT" in (result.report.rewritten_sql or "")
    engine.backend.run_owned(["DROP TABLE IF EXISTS s_shops"])
