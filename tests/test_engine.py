"""End-to-end behaviour of the engine on DuckDB and Postgres (same tests, both backends).

Accuracy checks use a large epsilon and compare with the exact answer computed on the backend
directly; the tolerance is 5 times the reported 95% error bound, so a false failure has
probability below 0.05^5 (Laplace tails) per check.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from chorus_py.engine import Engine
from chorus_py.errors import BudgetExhausted
from chorus_py.stores.samples import SAMPLE
from tests.conftest import nothing_spent, tolerance

ALICE = {"analyst": "alice"}


def exact(engine: Engine, sql: str) -> list[tuple]:
    """The true answer, straight from the backend (tests only: analysts cannot do this)."""
    return engine.backend.run(sql).rows


@pytest.fixture
def wide(backend_url: str, make_engine: Callable[..., Engine]) -> Engine:
    """k = 200: every trip of every rider is kept, so answers are unbiased."""
    return make_engine(backend_url, k=200, epsilon_per_block=1e6, max_epsilon=1e5)


def test_count_matches_truth_within_bound(wide: Engine) -> None:
    result = wide.execute("SELECT COUNT(*) AS n FROM trips", epsilon=100.0, **ALICE)
    (true,) = exact(wide, "SELECT COUNT(*) FROM trips")[0]
    assert result.columns == ("n",)
    assert result.types == ("integer",)
    (noisy,) = result.rows[0]
    assert isinstance(noisy, int)
    assert abs(noisy - true) <= tolerance(result.report.columns[0])


def test_sum_avg_variance_stddev_near_truth(wide: Engine) -> None:
    sql = ("SELECT SUM(fare) AS s, AVG(fare) AS a, VARIANCE(distance_km) AS v, "
           "STDDEV(distance_km) AS sd, VAR_POP(fare) AS vp FROM trips")
    result = wide.execute(sql, epsilon=50000.0, **ALICE)
    s, a, v, sd, vp = result.rows[0]
    ts, ta, tv, tsd, tvp = exact(wide, "SELECT SUM(LEAST(fare, 200)), AVG(LEAST(fare, 200)), "
                                 "VAR_SAMP(distance_km), STDDEV_SAMP(distance_km), "
                                 "VAR_POP(LEAST(fare, 200)) FROM trips")[0]
    assert abs(s - ts) <= tolerance(result.report.columns[0])
    assert a == pytest.approx(float(ta), rel=0.02)
    assert v == pytest.approx(float(tv), rel=0.05)
    assert sd == pytest.approx(float(tsd), rel=0.03)
    assert sd == pytest.approx(math.sqrt(v), rel=0.05)
    assert vp == pytest.approx(float(tvp), rel=0.05)


def test_snapped_sum_is_a_multiple_of_its_step(engine: Engine) -> None:
    result = engine.execute("SELECT SUM(fare) FROM trips", epsilon=1.0, **ALICE)
    (value,) = result.rows[0]
    step = result.report.measurements[0].mechanism["Lambda"]
    assert value / step == pytest.approx(round(value / step), abs=1e-6)


def test_answers_are_noisy(engine: Engine) -> None:
    answers = {engine.execute("SELECT COUNT(*) FROM trips", epsilon=0.1, **ALICE).rows[0][0]
               for _ in range(6)}
    assert len(answers) > 1  # b = 100: six equal draws have probability < 1e-10


def test_contribution_bound_keeps_k_rows_per_unit(backend_url: str,
                                                  make_engine: Callable[..., Engine]) -> None:
    # k = 1: each rider keeps one trip, so COUNT(*) estimates the number of riders.
    engine = make_engine(backend_url, k=1)
    result = engine.execute("SELECT COUNT(*) FROM trips", epsilon=100.0, **ALICE)
    riders, trips = exact(engine, "SELECT COUNT(DISTINCT rider_id), COUNT(*) FROM trips")[0]
    assert riders < trips
    assert abs(result.rows[0][0] - riders) <= tolerance(result.report.columns[0])


def test_public_group_keys_are_exactly_the_declared_values(wide: Engine) -> None:
    result = wide.execute("SELECT city, COUNT(*) AS n FROM trips GROUP BY city",
                          epsilon=100.0, **ALICE)
    assert sorted(r[0] for r in result.rows) == sorted(["SF", "NYC", "LA", "CHI", "SEA"])
    truth = dict(exact(wide, "SELECT city, COUNT(*) FROM trips GROUP BY city"))
    bound = tolerance(result.report.columns[1])
    for city, n in result.rows:
        assert abs(n - truth.get(city, 0)) <= bound
    assert result.report.key_release.method == "public_values"


def test_filtered_public_keys_only_return_the_filtered_values(wide: Engine) -> None:
    result = wide.execute("SELECT city, COUNT(*) FROM trips WHERE city IN ('SF', 'LA') "
                          "GROUP BY city", epsilon=10.0, **ALICE)
    assert sorted(r[0] for r in result.rows) == ["LA", "SF"]


def test_having_order_limit_apply_to_noisy_values(wide: Engine) -> None:
    result = wide.execute(
        "SELECT city, COUNT(*) AS n FROM trips GROUP BY city HAVING COUNT(*) > 100 "
        "ORDER BY n DESC LIMIT 2", epsilon=100.0, **ALICE)
    counts = [n for _, n in result.rows]
    assert len(result.rows) <= 2
    assert counts == sorted(counts, reverse=True)
    assert all(n > 100 for n in counts)
    top = max(exact(wide, "SELECT city, COUNT(*) FROM trips GROUP BY city"), key=lambda r: r[1])
    assert result.rows[0][0] == top[0]


def test_thresholded_keys_released_only_above_tau(engine: Engine) -> None:
    # Pages have 500/300/200 visits; at eps 100, b = 0.01 and tau = 1 + 0.01 ln(1e5) ~ 1.1.
    result = engine.execute("SELECT page, COUNT(*) FROM visits GROUP BY page", epsilon=100.0,
                            delta=1e-5, **ALICE)
    assert dict(result.rows) == pytest.approx({"home": 500, "about": 300, "blog": 200}, abs=1)
    # Every visit_id is its own group of count 1; tau = 1 + ln(1e8) ~ 19.4 at eps 1, b = 1:
    # P(any of 1000 keys released) < 1000 e^-18.4 ~ 1e-5.
    unique = engine.execute("SELECT visit_id, COUNT(*) FROM visits GROUP BY visit_id",
                            epsilon=1.0, delta=1e-8, **ALICE)
    assert unique.rows == []


def test_cte_and_subquery_filters_are_answered(wide: Engine) -> None:
    sql = ("WITH long AS (SELECT fare, city FROM trips WHERE distance_km > 10) "
           "SELECT COUNT(*) FROM (SELECT * FROM long WHERE city = 'SF') AS s")
    result = wide.execute(sql, epsilon=100.0, **ALICE)
    (true,) = exact(wide, "SELECT COUNT(*) FROM trips WHERE distance_km > 10 AND city = 'SF'")[0]
    assert abs(result.rows[0][0] - true) <= tolerance(result.report.columns[0])


def test_arithmetic_on_aggregates(wide: Engine) -> None:
    result = wide.execute("SELECT SUM(fare) / COUNT(*) AS per_trip, COUNT(*) * 2 + 1 AS odd, "
                          "ROUND(AVG(distance_km), 1) AS km FROM trips", epsilon=30000.0,
                          **ALICE)
    per_trip, odd, km = result.rows[0]
    (avg_fare, avg_km) = exact(wide, "SELECT AVG(LEAST(fare, 200)), AVG(distance_km) "
                               "FROM trips")[0]
    assert per_trip == pytest.approx(float(avg_fare), rel=0.03)
    assert odd % 2 == 1
    assert km == pytest.approx(float(avg_km), abs=0.3)
    assert [c.role for c in result.report.columns] == ["derived", "derived", "derived"]


def test_budget_is_charged_on_the_blocks_read(engine: Engine) -> None:
    result = engine.execute("SELECT COUNT(*) FROM trips WHERE pickup_time >= DATE '2026-03-01'",
                            epsilon=2.0, **ALICE)
    assert result.report.charged
    assert len(result.report.blocks) == 31  # March 2026
    assert result.report.blocks[0] == "trips/2026-03-01"
    spent = {b.block_id: b.epsilon_consumed for b in engine.ledger.blocks()}
    assert spent == {block: 2.0 for block in result.report.blocks}


def test_report_without_remaining_charges_the_same(engine: Engine) -> None:
    """``remaining=False`` (the wire protocol, whose NOTICE does not list blocks) leaves only
    the per-block list out: the charge and everything else in the report are unchanged."""
    sql = "SELECT COUNT(*) FROM trips WHERE pickup_time >= DATE '2026-03-30'"
    full = engine.execute(sql, epsilon=0.5, **ALICE)
    bare = engine.execute(sql.replace("COUNT(*)", "COUNT(*) AS n"), epsilon=0.5,
                          remaining=False, **ALICE)
    assert [b.block for b in full.report.remaining] == ["trips/2026-03-30", "trips/2026-03-31"]
    assert bare.report.remaining == () and bare.report.charged
    assert bare.report.blocks == full.report.blocks
    spent = {b.block_id: b.epsilon_consumed for b in engine.ledger.blocks()}
    assert spent == {"trips/2026-03-30": 1.0, "trips/2026-03-31": 1.0}  # 0.5 + 0.5 each
    left = {b.block: b.epsilon_left for b in engine.execute(sql, epsilon=0.5,
                                                              **ALICE).report.remaining}
    assert left == {b: pytest.approx(engine.policy.privacy.epsilon_per_block - 1.5)
                    for b in full.report.blocks}


def test_block_restriction_is_enforced_in_sql(engine: Engine) -> None:
    report = engine.explain("SELECT COUNT(*) FROM trips WHERE pickup_time >= '2026-03-30'",
                            epsilon=1.0, **ALICE)
    assert report.blocks == ("trips/2026-03-30", "trips/2026-03-31")
    assert "2026-03-30 00:00:00" in report.rewritten_sql
    assert "2026-04-01 00:00:00" in report.rewritten_sql


def test_budget_exhaustion_refuses_and_spends_nothing(backend_url: str,
                                                      make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(backend_url, epsilon_per_block=1.0, max_epsilon=1.0)
    engine.execute("SELECT COUNT(*) FROM visits", epsilon=0.6, **ALICE)
    with pytest.raises(BudgetExhausted, match="visits"):
        engine.execute("SELECT COUNT(*) FROM visits", epsilon=0.6, **ALICE)
    (block,) = engine.ledger.blocks()
    assert block.epsilon_consumed == pytest.approx(0.6)
    assert block.epsilon_allocated == 0
    engine.execute("SELECT COUNT(*) FROM visits", epsilon=0.4, **ALICE)
    assert engine.ledger.blocks()[0].epsilon_remaining == pytest.approx(0.0, abs=1e-9)


def test_explain_charges_nothing(engine: Engine) -> None:
    report = engine.explain("SELECT city, AVG(fare) FROM trips GROUP BY city", **ALICE)
    assert not report.charged
    assert nothing_spent(engine)
    import json

    assert json.loads(json.dumps(report.to_dict()))["epsilon"] == 1.0


def test_public_tables_are_free_and_exact(engine: Engine) -> None:
    result = engine.execute("SELECT city, population FROM cities ORDER BY city", **ALICE)
    assert len(result.rows) == 5
    assert result.report.epsilon == 0 and not result.report.charged
    assert nothing_spent(engine)


def test_proxy_noise_mode(backend_url: str, make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(backend_url, noise="proxy", k=200, epsilon_per_block=1e6,
                         max_epsilon=1e5)
    result = engine.execute("SELECT city, COUNT(*) AS n, AVG(fare) AS f FROM trips "
                            "GROUP BY city ORDER BY n DESC", epsilon=20000.0, **ALICE)
    assert result.report.noise == "proxy"
    truth = {c: (n, float(f)) for c, n, f in exact(
        engine, "SELECT city, COUNT(*), AVG(LEAST(fare, 200)) FROM trips GROUP BY city")}
    assert len(result.rows) == 5
    for city, n, f in result.rows:
        assert isinstance(n, int)
        assert abs(n - truth[city][0]) <= tolerance(result.report.columns[1])
        assert f == pytest.approx(truth[city][1], rel=0.1)
    assert "ln(" not in result.report.rewritten_sql.lower()  # no noise drawn in the database
    assert engine.ledger.blocks()[0].epsilon_consumed == 20000.0


def test_proxy_noise_from_many_threads_keeps_each_answer_apart(
        backend_url: str, make_engine: Callable[..., Engine]) -> None:
    # Proxy noise finishes each answer in a TEMP table of its own cursor of one in-memory
    # DuckDB: concurrent queries with different groups must never see each other's rows.
    from concurrent.futures import ThreadPoolExecutor

    engine = make_engine(backend_url, noise="proxy", k=200, epsilon_per_block=1e6,
                         max_epsilon=1e5)
    queries = {"city": "SELECT city, COUNT(*) FROM trips GROUP BY city",
               "none": "SELECT COUNT(*) FROM trips"}
    truth = {name: exact(engine, sql) for name, sql in queries.items()}

    def ask(name: str) -> tuple[str, list[tuple[object, ...]]]:
        return name, engine.execute(queries[name], epsilon=20000.0, **ALICE).rows

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, ["city", "none"] * 12))
    for name, rows in answers:
        assert len(rows) == len(truth[name])
        assert sorted(r[:-1] for r in rows) == sorted(r[:-1] for r in truth[name])
    assert engine.statements._scratch is not None  # one in-memory database, opened once
    engine.close()
    assert engine.statements._scratch is None


def test_proxy_noise_mode_thresholds_keys(backend_url: str,
                                          make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(backend_url, noise="proxy")
    result = engine.execute("SELECT page, COUNT(*) FROM visits GROUP BY page", epsilon=100.0,
                            delta=1e-5, **ALICE)
    assert sorted(r[0] for r in result.rows) == ["about", "blog", "home"]
    unique = engine.execute("SELECT visit_id, COUNT(*) FROM visits GROUP BY visit_id",
                            epsilon=1.0, delta=1e-8, **ALICE)
    assert unique.rows == []


def test_analysis_is_cached_but_noise_is_not(engine: Engine) -> None:
    sql = "SELECT COUNT(*) FROM trips"
    first = engine.execute(sql, epsilon=0.1, **ALICE)
    assert sql in engine._analyses
    second = engine.execute(sql, epsilon=0.1, **ALICE)
    assert first.report.blocks == second.report.blocks
    spent = engine.ledger.blocks()[0].epsilon_consumed
    assert spent == pytest.approx(0.2)


RIDES_POLICY = """
[backend]
url = "{url}"

[privacy]
epsilon_per_block = 1e6
max_epsilon_per_query = 1e5

[tables.rides]
privacy_unit = "rider_id"
max_rows_per_unit = {k}
bounding = "materialized"
block = {{ column = "pickup_time", size = "1 day", start = "2026-01-01", end = "2026-04-01" }}

[tables.rides.columns]
rider_id    = {{ type = "int" }}
pickup_time = {{ type = "timestamp" }}
fare        = {{ type = "float", lower = 0, upper = 200 }}
"""


@pytest.fixture
def rides(scratch: Callable[..., Engine]) -> Callable[[int], Engine]:
    """A fresh table `rides` (copied from trips) under a materialized-bounding policy."""

    def make(k: int) -> Engine:
        return scratch("rides", ["CREATE TABLE rides AS SELECT rider_id, pickup_time, fare "
                                 "FROM trips"], RIDES_POLICY.replace("{k}", str(k)))

    return make


SAMPLES = ("SELECT table_name FROM information_schema.tables WHERE table_schema = "
           "'chorus_private' AND table_name LIKE 'rides__bounded%'")


def test_materialized_bounding_keeps_k_rows_per_unit(rides: Callable[[int], Engine]) -> None:
    engine = rides(3)
    result = engine.execute("SELECT COUNT(*) FROM rides", epsilon=1000.0)
    assert "chorus_private" in result.report.rewritten_sql
    assert "ROW_NUMBER" not in result.report.rewritten_sql  # read from the stored sample
    (name,) = [r[0] for r in exact(engine, SAMPLES)]
    (worst,) = exact(engine, "SELECT MAX(c) FROM (SELECT COUNT(*) AS c FROM "
                             f'chorus_private."{name}" GROUP BY rider_id) AS s')[0]
    assert worst <= 3
    (expected,) = exact(engine, "SELECT SUM(LEAST(c, 3)) FROM (SELECT COUNT(*) AS c FROM rides "
                                "GROUP BY rider_id) AS s")[0]
    assert abs(result.rows[0][0] - expected) <= tolerance(result.report.columns[0])


def test_materialized_sample_is_rebuilt_when_the_table_changes(
    rides: Callable[[int], Engine], monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = rides(200)
    first = engine.execute("SELECT COUNT(*) FROM rides", epsilon=1000.0)
    old = engine.samples._fingerprint("rides", engine.policy.tables["rides"], SAMPLE)
    engine.backend.run_owned([
        "INSERT INTO rides SELECT rider_id + 1000000, pickup_time, fare FROM rides"])
    if engine.dialect == "postgres":  # the statistics collector publishes counters lazily
        import time

        deadline = time.monotonic() + 10
        while engine.samples._fingerprint("rides", engine.policy.tables["rides"],
                                          SAMPLE) == old:
            assert time.monotonic() < deadline, "pg_stat_user_tables never changed"
            time.sleep(0.2)
    second = engine.execute("SELECT COUNT(*) FROM rides", epsilon=1000.0)
    assert second.rows[0][0] == pytest.approx(2 * first.rows[0][0], rel=0.01)
    tables = [r[0] for r in exact(engine, SAMPLES)]
    # The stale sample is kept for a grace period (another proxy sharing the database may
    # read it until its TTL expires), marked replaced, and dropped by a later build after it.
    assert len(tables) == 2
    (stale,) = [r[0] for r in exact(engine, "SELECT name FROM chorus_private.chorus_replaced")
                if r[0].startswith("rides__bounded_")]  # (other tests' tables share the list)
    assert stale in tables
    monkeypatch.setattr(engine.samples, "_grace", lambda: -1.0)
    engine.samples._retire([stale])
    assert [r[0] for r in exact(engine, SAMPLES)] == [t for t in tables if t != stale]


def test_new_days_of_data_add_no_block(rides: Callable[[int], Engine]) -> None:
    """Blocks come from the policy's public schedule, never from the data (wall 7): rows after
    its end add no block, are never read (not even by the stored sample) and charge nothing.
    (Blocks used to run from MIN to MAX of the column: such rows added blocks.)"""
    engine = rides(200)
    sql = "SELECT COUNT(*) FROM rides WHERE pickup_time >= '2026-03-30'"
    first = engine.execute(sql, epsilon=1.0)
    assert first.report.blocks == ("rides/2026-03-30", "rides/2026-03-31")
    engine.backend.run_owned([
        "INSERT INTO rides SELECT rider_id, pickup_time + INTERVAL '2 days', fare FROM rides "
        "WHERE pickup_time >= '2026-03-31'"])
    again = engine.execute(sql, epsilon=1.0)
    assert again.report.blocks == first.report.blocks
    assert [b.epsilon_consumed for b in engine.ledger.blocks()
            if b.epsilon_consumed] == [2.0, 2.0]
    # The sample was rebuilt (the table changed) from the scheduled rows only (the one it
    # replaced is kept for a grace period, marked replaced).
    registry = exact(engine, "SELECT table_name FROM information_schema.tables WHERE "
                             "table_schema = 'chorus_private' AND table_name = 'chorus_replaced'")
    replaced = {r[0] for r in exact(engine, "SELECT name FROM chorus_private.chorus_replaced")
                } if registry else set()
    (name,) = [r[0] for r in exact(engine, SAMPLES) if r[0] not in replaced]
    stored = exact(engine, f'SELECT COUNT(*) FROM chorus_private."{name}" '
                           "WHERE pickup_time >= '2026-04-01'")
    assert stored == [(0,)]
    assert exact(engine, "SELECT COUNT(*) FROM rides WHERE pickup_time >= '2026-04-01'")[0][0]


def test_materialized_sample_is_stored_in_block_order(rides: Callable[[int], Engine]) -> None:
    """Queries filter on their blocks' windows: the sample is written in block-column order
    (DuckDB skips row groups by their min/max) and, on Postgres, indexed on that column."""
    engine = rides(3)
    engine.execute("SELECT COUNT(*) FROM rides", epsilon=1.0)
    (name,) = [r[0] for r in exact(engine, SAMPLES)]
    times = [r[0] for r in exact(engine, f'SELECT pickup_time FROM chorus_private."{name}"')]
    assert len(times) > 100 and times == sorted(times)
    if engine.dialect == "postgres":
        (index,) = exact(engine, "SELECT indexdef FROM pg_indexes WHERE schemaname = "
                                 f"'chorus_private' AND tablename = '{name}'")
        assert "(pickup_time)" in index[0]


def test_analysts_cannot_read_the_private_schema(rides: Callable[[int], Engine]) -> None:
    from chorus_py.errors import QueryRefused

    engine = rides(3)
    engine.execute("SELECT COUNT(*) FROM rides", epsilon=1.0)
    (name,) = [r[0] for r in exact(engine, SAMPLES)]
    for sql in (f'SELECT COUNT(*) FROM chorus_private."{name}"',
                f'SELECT * FROM chorus_private."{name}"'):
        with pytest.raises(QueryRefused):
            engine.execute(sql, epsilon=1.0)


def test_having_sees_the_released_draw(engine: Engine) -> None:
    # The noisy values live in a MATERIALIZED CTE: HAVING must filter the very values that are
    # released. With the cut at the true count and b = 100, about half the runs release a row;
    # if HAVING used a second draw, released values at or below the cut would show up.
    (true,) = exact(engine, "SELECT COUNT(*) FROM visits")[0]
    released = []
    for _ in range(40):
        rows = engine.execute(f"SELECT COUNT(*) AS n FROM visits HAVING COUNT(*) > {true}",
                              epsilon=0.01, **ALICE).rows
        released += [n for (n,) in rows]
    assert released, "some runs must pass the cut"
    assert all(n > true for n in released)


def test_sample_name_reveals_no_data_derived_number(rides: Callable[[int], Engine]) -> None:
    # The rewritten SQL shown to analysts names the stored sample; its fingerprint comes from
    # exact counters (row counts, pg_stat insert counts).  The name is an HMAC under a key in the
    # proxy's private schema: proxies sharing the database agree on it, and neither the
    # fingerprint nor its unkeyed digest appears.
    import hashlib

    first, second = rides(3), rides(3)
    sqls = [e.explain("SELECT COUNT(*) FROM rides", epsilon=1.0).rewritten_sql
            for e in (first, second)]
    assert sqls[0] == sqls[1]
    fingerprint = first.samples._fingerprint("rides", first.policy.tables["rides"], SAMPLE)
    assert hashlib.sha256(fingerprint.encode()).hexdigest()[:12] not in sqls[0]
    assert hashlib.sha256(fingerprint.encode()).hexdigest()[:16] not in sqls[0]
    assert fingerprint not in sqls[0]
