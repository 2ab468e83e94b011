"""Per-person questions (issue 24 part 3): analysis, answers on both backends, refusals, the
outgoing verifier's per-person barrier and its near misses, and a property test of the
sensitivity on small skewed data."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analyses.outgoing import Refused, rules_from_policy, verify
from analyses.per_person import PerPersonQuery
from chorus_py.backends import SCHEMA
from chorus_py.engine import Engine
from chorus_py.errors import ChorusError, InternalError, NotSupportedError, QueryRefused
from chorus_py.policy import load_policy
from tests.conftest import nothing_spent, tolerance

ALICE = {"analyst": "alice"}
SPEND = "WITH per AS (SELECT rider_id, SUM(fare) AS spend FROM trips GROUP BY rider_id) "
COUNTS = "WITH per AS (SELECT rider_id, COUNT(*) AS n FROM trips GROUP BY rider_id) "


def _analysed(engine: Engine, sql: str) -> PerPersonQuery:
    found = engine._analyse(sql)
    assert isinstance(found, PerPersonQuery)
    return found


def _sensitivities(engine: Engine, sql: str) -> dict[str, float]:
    return {f"{m.kind}({m.argument.sql() if m.argument is not None else '*'})": m.sensitivity
            for m in _analysed(engine, sql).outer.measurements}


# -- hand-derived sensitivities (test policy: k = 10 trips per rider, fare in [0, 200]) --------
def test_sensitivities_by_hand(engine: Engine) -> None:
    # No bound in the query: a rider's spend is clipped to [0, k * 200] = [0, 2000] (policy).
    q = _analysed(engine, SPEND + "SELECT SUM(spend) FROM per")
    assert [(v.name, v.lower, v.upper) for v in q.values] == [("spend", 0.0, 2000.0)]
    assert "policy" in q.values[0].origin
    # One row per rider: SUM(spend) moves by at most max|v| = 2000.
    assert list(_sensitivities(engine, SPEND + "SELECT SUM(spend) FROM per").values()) == [2000]
    # AVG: SUM(v - c), c = 1000, moves by <= 1000; COUNT(v) by <= 1.
    assert sorted(_sensitivities(engine, SPEND + "SELECT AVG(spend) FROM per").values()) == \
        [1.0, 1000.0]
    # The query's own bound: LEAST(SUM(fare), 500) lies in [0, 500]: Delta = 500.
    clipped = ("WITH per AS (SELECT rider_id, LEAST(SUM(fare), 500) AS spend FROM trips "
               "GROUP BY rider_id) SELECT SUM(spend) FROM per")
    q = _analysed(engine, clipped)
    assert (q.values[0].lower, q.values[0].upper) == (0.0, 500.0)
    assert "query" in q.values[0].origin
    assert list(_sensitivities(engine, clipped).values()) == [500]
    # AVG(fare) per rider lies in [0, 200] whatever the number of trips.
    mean = ("SELECT AVG(m) FROM (SELECT rider_id, AVG(fare) AS m FROM trips GROUP BY rider_id) "
            "AS per")
    assert sorted(_sensitivities(engine, mean).values()) == [1.0, 100.0]
    # Riders with more than five trips: a filter on one person's row, COUNT moves by 1.
    assert list(_sensitivities(engine, COUNTS + "SELECT COUNT(*) FROM per WHERE n > 5")
                .values()) == [1]


def test_histogram_keys_are_public(engine: Engine) -> None:
    # n clipped to [0, 10] is an integer: keys 0..10 are public, no threshold; the vector of
    # per-bin counts moves by 1 in L1 (a person is one row, in one bin).
    q = _analysed(engine, COUNTS + "SELECT n, COUNT(*) FROM per GROUP BY n")
    assert q.values[0].integral
    assert q.outer.keys[0].public_values == tuple(range(11))
    assert not q.outer.thresholded
    assert [m.sensitivity for m in q.outer.measurements] == [1]


# -- answers on DuckDB and Postgres, against the truth ----------------------------------------
def _truth(engine: Engine, sql: str) -> list[tuple[object, ...]]:
    return [tuple(r) for r in engine.backend.run(sql).rows]


def test_average_spend_near_truth(engine: Engine) -> None:
    result = engine.execute(SPEND + "SELECT SUM(spend) AS total, COUNT(*) AS riders FROM per",
                            epsilon=200, **ALICE)
    total, riders = result.rows[0]
    (true_total, true_riders), = _truth(
        engine, "SELECT SUM(LEAST(s, 2000)), COUNT(*) FROM (SELECT SUM(fare) AS s FROM trips "
        "GROUP BY rider_id) AS p")
    assert abs(total - float(true_total)) <= tolerance(result.report.columns[0])
    assert abs(riders - true_riders) <= tolerance(result.report.columns[1])
    assert result.report.tables == ("trips",) and result.report.privacy_unit == "rider_id"
    assert any("one row per rider_id" in n for n in result.report.notes)


def test_filtered_inner_and_riders_above_five(engine: Engine) -> None:
    sql = ("WITH per AS (SELECT rider_id, COUNT(*) AS n FROM trips WHERE city = 'SF' "
           "GROUP BY rider_id) SELECT COUNT(*) FROM per WHERE n > 5")
    result = engine.execute(sql, epsilon=200, **ALICE)
    (true,), = _truth(engine, "SELECT COUNT(*) FROM (SELECT COUNT(*) AS n FROM trips "
                      "WHERE city = 'SF' GROUP BY rider_id) AS p WHERE n > 5")
    assert abs(result.rows[0][0] - true) <= tolerance(result.report.columns[0])


def test_histogram_of_trips_per_rider(engine: Engine) -> None:
    result = engine.execute(COUNTS + "SELECT n, COUNT(*) AS riders FROM per GROUP BY n "
                            "ORDER BY n", epsilon=200, **ALICE)
    truth = dict(_truth(engine, "SELECT LEAST(n, 10), COUNT(*) FROM (SELECT COUNT(*) AS n "
                        "FROM trips GROUP BY rider_id) AS p GROUP BY 1"))
    assert [r[0] for r in result.rows] == list(range(11))  # every public key, empty ones too
    for n, riders in result.rows:
        assert abs(riders - truth.get(n, 0)) <= tolerance(result.report.columns[1])


def test_subquery_form_and_proxy_noise(backend_url: str,
                                       make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(backend_url, noise="proxy")
    sql = ("SELECT AVG(m) AS mean FROM (SELECT rider_id, AVG(fare) AS m FROM trips "
           "GROUP BY rider_id) AS per")
    result = engine.execute(sql, epsilon=200, **ALICE)
    (true,), = _truth(engine, "SELECT AVG(m) FROM (SELECT AVG(fare) AS m FROM trips "
                      "GROUP BY rider_id) AS p")
    assert abs(result.rows[0][0] - float(true)) < 1.0


def test_distinct_units_over_a_self_join(engine: Engine) -> None:
    # Riders with a trip in SF and one in NYC: COUNT(DISTINCT a.rider_id) over a self-join on
    # the unit is the number of people with a joined row: one row per person, Delta = 1.
    sql = ("SELECT COUNT(DISTINCT a.rider_id) AS riders FROM trips a JOIN trips b "
           "ON a.rider_id = b.rider_id WHERE a.city = 'SF' AND b.city = 'NYC'")
    assert [m.sensitivity for m in _analysed(engine, sql).outer.measurements] == [1]
    result = engine.execute(sql, epsilon=200, **ALICE)
    (true,), = _truth(engine, sql)
    assert result.rows[0][0] is not None
    assert abs(result.rows[0][0] - true) <= tolerance(result.report.columns[0])
    assert result.report.columns[0].name == "riders"


@pytest.mark.parametrize("where", ["fare > 30", "city = 'SF' AND distance_km < 5",
                                   "pickup_time >= '2026-03-15'"])
def test_filtered_distinct_units_of_one_table_are_a_per_person_count(engine: Engine,
                                                                    where: str) -> None:
    """``COUNT(DISTINCT rider_id) FROM trips WHERE ...``: the riders with a filtered row, one
    row per rider by GROUP BY (no window ranking every filtered row), Delta = 1, the whole
    epsilon on the count (no choice of a cap), near the true distinct count."""
    sql = f"SELECT COUNT(DISTINCT rider_id) AS riders FROM trips WHERE {where}"
    assert [m.sensitivity for m in _analysed(engine, sql).outer.measurements] == [1]
    result = engine.execute(sql, epsilon=200, **ALICE)
    rewritten = result.report.rewritten_sql
    assert "GROUP BY" in rewritten and "ROW_NUMBER" not in rewritten
    assert result.report.epsilon == 200
    assert [m.mechanism["epsilon"] for m in result.report.measurements] == [200]
    (true,), = _truth(engine, sql)
    assert abs(result.rows[0][0] - true) <= tolerance(result.report.columns[0])
    assert result.report.columns[0].name == "riders"


def test_unfiltered_or_grouped_distinct_units_keep_their_reading(engine: Engine) -> None:
    """Without a filter the ranked copy's first row per rider is cheaper (``rank <= 1``);
    grouped, a rider counts in each group it reaches (bounded by the ordinary reading)."""
    for sql in ("SELECT COUNT(DISTINCT rider_id) FROM trips",
                "SELECT city, COUNT(DISTINCT rider_id) FROM trips WHERE fare > 30 GROUP BY city",
                "SELECT COUNT(DISTINCT rider_id), COUNT(*) FROM trips WHERE fare > 30"):
        assert not isinstance(engine._analyse(sql), PerPersonQuery), sql


def test_filtered_distinct_units_skip_rows_without_a_unit(
        scratch: Callable[..., Engine]) -> None:
    """Rows whose unit is NULL belong to nobody: the per-person count leaves them out (as
    COUNT(DISTINCT) does), though GROUP BY would make them one group."""
    engine = scratch("nulls", [
        "CREATE TABLE nulls (unit_id BIGINT, v INTEGER)",
        "INSERT INTO nulls VALUES (1, 5), (1, 6), (2, 7), (NULL, 8), (NULL, 9), (3, 1)"],
        NULL_UNITS_POLICY)
    sql = "SELECT COUNT(DISTINCT unit_id) FROM nulls WHERE v > 4"
    assert isinstance(engine._analyse(sql), PerPersonQuery)
    result = engine.execute(sql, epsilon=10_000, **ALICE)
    assert "IS NULL" in result.report.rewritten_sql
    # Discrete Laplace noise of scale 1e-4: 0 but with probability ~2 exp(-10^4).
    assert result.rows[0][0] == 2


NULL_UNITS_POLICY = """
[backend]
url = "{url}"

[privacy]
epsilon_per_block = 1e6
max_epsilon_per_query = 1e4

[tables.nulls]
privacy_unit = "unit_id"
max_rows_per_unit = 5
contribution = "auto"

[tables.nulls.columns]
unit_id = {{ type = "int" }}
v       = {{ type = "int", lower = 0, upper = 10 }}

[analysts.alice]
"""


def test_per_person_over_a_join_with_a_public_table(engine: Engine) -> None:
    sql = ("WITH per AS (SELECT t.rider_id, LEAST(SUM(t.fare), 500) AS spend FROM trips t "
           "JOIN cities c ON t.city = c.city WHERE c.city <> 'LA' GROUP BY t.rider_id) "
           "SELECT SUM(spend) AS total FROM per")
    result = engine.execute(sql, epsilon=200, **ALICE)
    (true,), = _truth(engine, "SELECT SUM(LEAST(s, 500)) FROM (SELECT SUM(t.fare) AS s FROM "
                      "trips t JOIN cities c ON t.city = c.city WHERE c.city <> 'LA' "
                      "GROUP BY t.rider_id) AS p")
    assert abs(result.rows[0][0] - float(true)) <= tolerance(result.report.columns[0])
    assert result.report.measurements[0].sensitivity == 500
    assert set(result.report.tables) == {"trips", "cities"}


# -- refusals: named, free ----------------------------------------------------------------------
@pytest.mark.parametrize(("sql", "error", "words"), [
    ("WITH per AS (SELECT city, COUNT(*) AS n FROM trips GROUP BY city) "
     "SELECT AVG(n) FROM per", QueryRefused, "GROUP BY its privacy unit"),
    ("WITH per AS (SELECT rider_id, city, COUNT(*) AS n FROM trips GROUP BY rider_id, city) "
     "SELECT AVG(n) FROM per", QueryRefused, "GROUP BY its privacy unit"),
    ("WITH per AS (SELECT rider_id, COUNT(*) AS n FROM trips GROUP BY rider_id "
     "HAVING COUNT(*) > 5) SELECT COUNT(*) FROM per", QueryRefused, "outer WHERE"),
    ("WITH per AS (SELECT rider_id, COUNT(*) AS n FROM trips GROUP BY rider_id LIMIT 10) "
     "SELECT SUM(n) FROM per", QueryRefused, "LIMIT"),
    ("WITH per AS (SELECT t.rider_id, COUNT(*) AS n FROM trips t JOIN trips u "
     "ON t.city = u.city GROUP BY t.rider_id) SELECT SUM(n) FROM per", QueryRefused,
     "other than on the privacy unit"),
    ("WITH per AS (SELECT t.rider_id, COUNT(*) AS n FROM trips t JOIN trips u "
     "ON t.rider_id = u.driver_id GROUP BY t.rider_id) SELECT SUM(n) FROM per", QueryRefused,
     "other than on the privacy unit"),
    ("WITH per AS (SELECT t.rider_id, COUNT(*) AS n FROM trips t LEFT JOIN trips u "
     "ON t.rider_id = u.rider_id GROUP BY t.rider_id) SELECT SUM(n) FROM per",
     NotSupportedError, "INNER JOIN"),
    ("WITH per AS (SELECT u.rider_id, COUNT(*) AS n FROM trips t JOIN trips u "
     "ON t.rider_id = u.rider_id GROUP BY u.rider_id) SELECT SUM(n) FROM per", QueryRefused,
     "first table"),
    (COUNTS + "SELECT rider_id, COUNT(*) FROM per GROUP BY rider_id", QueryRefused,
     "privacy unit"),
    ("WITH per AS (SELECT rider_id, SUM(trip_id) AS s FROM trips GROUP BY rider_id) "
     "SELECT SUM(s) FROM per", QueryRefused, "bounds"),
    ("WITH per AS (SELECT rider_id, SUM(fare) FROM trips GROUP BY rider_id) "
     "SELECT COUNT(*) FROM per", QueryRefused, "name the per-person value"),
    ("WITH per AS (SELECT rider_id, fare AS f FROM trips GROUP BY rider_id) "
     "SELECT COUNT(*) FROM per", QueryRefused, "neither the unit nor an aggregate"),
    ("WITH per AS (SELECT rider_id, SUM(fare) / COUNT(*) AS m FROM trips GROUP BY rider_id) "
     "SELECT AVG(m) FROM per", NotSupportedError, "DIV"),
    ("WITH per AS (SELECT page, COUNT(*) AS n FROM visits GROUP BY page) "
     "SELECT AVG(n) FROM per", NotSupportedError, "privacy unit"),
])
def test_refusals_name_the_problem(engine: Engine, sql: str, error: type[ChorusError],
                                   words: str) -> None:
    with pytest.raises(error) as info:
        engine.execute(sql, epsilon=1, **ALICE)
    assert words in str(info.value)
    assert info.value.hint
    assert nothing_spent(engine)


# -- the outgoing verifier: the shape it accepts, and near misses -------------------------------
BLOCK = ("CAST('2026-01-01 00:00:00' AS TIMESTAMP) <= t.pickup_time "
         "AND t.pickup_time < CAST('2026-04-01 00:00:00' AS TIMESTAMP)")
CLIP = "LEAST(GREATEST(SUM(t.fare), 0), 2000)"
GOOD = (f"SELECT SUM(per.spend) AS m0 FROM (SELECT {CLIP} AS spend FROM main.trips AS t "
        f"WHERE {BLOCK} GROUP BY t.rider_id) AS per")


def _verify(engine: Engine, sql: str, release: str = "noised_by_proxy") -> None:
    rules = rules_from_policy(engine.policy, "main", SCHEMA)
    verify(sql, "duckdb", rules, release, frozenset({"trips"}))  # type: ignore[arg-type]


def test_verifier_accepts_the_per_person_shape(backend_url: str,
                                                make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(backend_url)
    _verify(engine, GOOD)
    _verify(engine, GOOD.replace(CLIP, f"CASE WHEN SUM(t.fare) IS NULL THEN NULL ELSE {CLIP} "
                                 "END"))
    _verify(engine, GOOD.replace(CLIP, f"CAST({CLIP.replace('SUM(t.fare)', 'COUNT(*)')} "
                                 "AS BIGINT)"))
    # A self-join on the unit (each occurrence restricted to its blocks) and a public table.
    joined = GOOD.replace("FROM main.trips AS t WHERE", "FROM main.trips AS t JOIN main.trips "
                          "AS u ON t.rider_id = u.rider_id JOIN main.cities AS c ON t.city = "
                          "c.city WHERE " + BLOCK.replace("t.", "u.") + " AND")
    _verify(engine, joined)
    # The statement the engine generates, noised in SQL, passes (it ran in the tests above).
    sql = engine.explain(SPEND + "SELECT AVG(spend) FROM per", epsilon=1, **ALICE).rewritten_sql
    rules = rules_from_policy(engine.policy, engine.schema, SCHEMA)
    verify(sql, engine.dialect, rules, "noised_in_sql", frozenset({"trips"}))


@pytest.mark.parametrize("bad", [
    GOOD.replace("GROUP BY t.rider_id", "GROUP BY t.city"),                 # not the unit
    GOOD.replace("GROUP BY t.rider_id", "GROUP BY t.rider_id, t.city"),     # unit and more
    GOOD.replace(CLIP, "SUM(t.fare)"),                                       # unclipped
    GOOD.replace(CLIP, "GREATEST(SUM(t.fare), 0)"),                          # no upper bound
    GOOD.replace(CLIP, "LEAST(GREATEST(SUM(t.fare), 0), MAX(t.fare) * 1e9)"),  # bound not literal
    GOOD.replace(CLIP, "LEAST(GREATEST(SUM(t.fare), 0), 1e999)"),            # infinite bound
    GOOD.replace("GROUP BY t.rider_id", "GROUP BY t.rider_id LIMIT 5"),      # inner LIMIT
    GOOD.replace("GROUP BY t.rider_id", "GROUP BY t.rider_id HAVING COUNT(*) > 1"),  # HAVING
    GOOD.replace("FROM main.trips AS t WHERE",                               # join: others' rows
                 "FROM main.trips AS t JOIN main.trips AS u ON t.city = u.city WHERE"),
    GOOD.replace(") AS per", ") AS per JOIN main.cities AS c ON TRUE"),     # outer join
    GOOD.replace("FROM main.trips AS t WHERE", "FROM main.trips AS t JOIN main.trips AS u "
                 "ON t.rider_id = u.driver_id WHERE " + BLOCK.replace("t.", "u.") + " AND"),
    GOOD.replace("FROM main.trips AS t WHERE", "FROM main.trips AS t LEFT JOIN main.trips "
                 "AS u ON t.rider_id = u.rider_id WHERE " + BLOCK.replace("t.", "u.") + " AND"),
    GOOD.replace("FROM main.trips AS t WHERE", "FROM main.trips AS t JOIN main.trips AS u "
                 "ON t.rider_id = u.rider_id OR t.city = u.city WHERE "
                 + BLOCK.replace("t.", "u.") + " AND"),                    # OR: not the unit
    GOOD.replace("FROM main.trips AS t WHERE", "FROM main.trips AS t JOIN main.trips AS u "
                 "ON t.rider_id = u.rider_id WHERE"),                      # u without blocks
    GOOD.replace(f"WHERE {BLOCK} ", ""),                                     # no blocks
    GOOD.replace(f"SELECT {CLIP} AS spend", f"SELECT t.rider_id AS r, {CLIP} AS spend")
        .replace("SUM(per.spend) AS m0", "per.r, SUM(per.spend) AS m0") + " GROUP BY per.r",
    GOOD.replace("FROM (SELECT", "FROM (SELECT * FROM (SELECT").replace(
        ") AS per", ") AS p LIMIT 5) AS per"),                                # LIMIT between
    GOOD.replace("FROM (SELECT", "FROM (SELECT p.spend * ROW_NUMBER() OVER () AS spend "
                 "FROM (SELECT").replace(") AS per", ") AS p) AS per"),    # window between
    GOOD.replace("SUM(per.spend) AS m0", "SUM(per.spend) AS m0, (SELECT COUNT(*) FROM "
                 "main.trips AS x) AS n"),                                   # stray read
])
def test_verifier_refuses_near_misses(engine: Engine, bad: str) -> None:
    with pytest.raises(Refused):
        _verify(engine, bad)


def test_verifier_still_refuses_through_the_engine(engine: Engine) -> None:
    # The statement check runs on every prepared statement: a broken rewrite cannot run.
    statements = engine.statements
    with pytest.raises(InternalError):
        statements.verify_outgoing(GOOD.replace(CLIP, "SUM(t.fare)"), "noised_by_proxy",
                                   ("trips",))


# -- property: removing one person moves each measurement by at most its sensitivity -----------
_PROPERTY_SQL = {
    "sum": SPEND + "SELECT SUM(spend) FROM per",
    "avg": SPEND + "SELECT AVG(spend) FROM per",
    "above": COUNTS + "SELECT COUNT(*) FROM per WHERE n > 2",
    "histogram": COUNTS + "SELECT n, COUNT(*) FROM per GROUP BY n",
    "least": ("WITH per AS (SELECT rider_id, LEAST(SUM(fare), 300) - COUNT(*) AS v FROM trips "
              "WHERE fare > 20 GROUP BY rider_id) SELECT SUM(v), COUNT(v) FROM per"),
    "distinct": ("SELECT COUNT(DISTINCT a.rider_id) FROM trips a JOIN trips b "
                 "ON a.rider_id = b.rider_id WHERE a.fare > 50 AND b.fare < 100"),
    "pairs": ("WITH per AS (SELECT a.rider_id, COUNT(*) AS pairs FROM trips a JOIN trips b "
              "ON a.rider_id = b.rider_id GROUP BY a.rider_id) SELECT SUM(pairs) FROM per"),
}


@pytest.fixture(scope="module")
def measures(duckdb_data: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[
        str, tuple[float, ...]]]:
    """The exact measurement statement (proxy noise mode) of each query, and the
    sensitivities of its measurements."""
    from tests.conftest import POLICY_TEMPLATE

    path = tmp_path_factory.mktemp("pp") / "policy.toml"
    path.write_text(POLICY_TEMPLATE.format(url=duckdb_data, noise="proxy", k=10,
                                           epsilon_per_block=1000.0, max_epsilon=500.0,
                                           contribution="fixed"))
    engine = Engine(load_policy(path))
    try:
        out = {}
        for name, sql in _PROPERTY_SQL.items():
            report = engine.explain(sql, epsilon=1, **ALICE)
            out[name] = (report.rewritten_sql, tuple(m.sensitivity for m in report.measurements))
        return out
    finally:
        engine.close()


_RIDERS = st.lists(st.tuples(st.integers(1, 6), st.lists(st.floats(0, 200), min_size=1,
                                                          max_size=30)),
                   min_size=1, max_size=8)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(riders=_RIDERS, which=st.sampled_from(sorted(_PROPERTY_SQL)), gone=st.integers(0, 7))
def test_removing_one_person_moves_each_measurement_by_at_most_its_sensitivity(
        measures: dict[str, tuple[str, tuple[float, ...]]],
        riders: list[tuple[int, list[float]]], which: str, gone: int) -> None:
    sql, sensitivities = measures[which]
    # Skewed: a rider may have up to 30 trips (3 x the policy's k), rider ids may repeat
    # (merged into one person).
    rows = [(rid, fare) for rid, fares in riders for fare in fares]
    person = riders[gone % len(riders)][0]
    with_all = _measure(sql, rows)
    without = _measure(sql, [r for r in rows if r[0] != person])
    keys = set(with_all) | set(without)
    for i, sens in enumerate(sensitivities):
        moved = sum(abs(with_all.get(k, _zeros(sensitivities))[i]
                        - without.get(k, _zeros(sensitivities))[i]) for k in keys)
        assert moved <= sens + 1e-6, (which, i, moved, sens)


def _zeros(sensitivities: tuple[float, ...]) -> tuple[float, ...]:
    return tuple(0.0 for _ in sensitivities)


def _measure(sql: str, rows: list[tuple[int, float]]) -> dict[tuple[object, ...],
                                                               tuple[float, ...]]:
    """The exact measurements (m0, m1, ...) per group key (k0, ...) on a fresh in-memory
    trips table."""
    con = duckdb.connect()
    try:
        con.execute("CREATE TABLE trips (trip_id BIGINT, rider_id BIGINT, driver_id BIGINT, "
                    "city VARCHAR, pickup_time TIMESTAMP, fare DOUBLE, distance_km DOUBLE)")
        if rows:
            con.executemany("INSERT INTO trips VALUES (?, ?, 1, 'SF', TIMESTAMP "
                            "'2026-02-01 10:00:00', ?, 1.0)",
                            [(i, rid, fare) for i, (rid, fare) in enumerate(rows)])
        cur = con.execute(sql)
        names = [d[0] for d in cur.description or []]
        found = cur.fetchall()
    finally:
        con.close()
    keys = [i for i, n in enumerate(names) if n.startswith("k")]
    measured = [i for i, n in enumerate(names) if n.startswith("m")]
    return {tuple(r[i] for i in keys): tuple(0.0 if r[i] is None else float(r[i])
                                             for i in measured) for r in found}


def test_the_bound_is_reached(measures: dict[str, tuple[str, tuple[float, ...]]]) -> None:
    # The property above can fail: a rider with 30 trips of fare 200 (spend 6000, clipped to
    # 2000) moves SUM(spend) by exactly its sensitivity 2000, and the count above 2 by 1.
    heavy = [(1, 200.0)] * 30 + [(2, 10.0)] * 3
    for name, index, expected in (("sum", 0, 2000.0), ("above", 0, 1.0)):
        sql, sensitivities = measures[name]
        moved = abs(_measure(sql, heavy)[()][index]
                    - _measure(sql, [r for r in heavy if r[0] != 1])[()][index])
        assert moved == sensitivities[index] == expected


def test_automatic_bounds_narrow_the_policy_bounds(backend_url: str,
                                                   write_policy: Callable[..., Path]) -> None:
    # Automatic clipping (here the default with contribution = "auto"): the bound [0, 10 x 200]
    # from the policy is narrowed from a noisy histogram of the per-rider spends, with 10% of
    # epsilon.
    path = write_policy(backend_url, contribution="auto")
    engine = Engine(load_policy(path))
    try:
        sql = SPEND + "SELECT SUM(spend) AS total FROM per"
        result = engine.execute(sql, epsilon=50, **ALICE)
        contribution = result.report.contribution
        assert contribution is not None and result.report.epsilon == 50
        step, = contribution.steps
        assert step.kind == "bounds" and step.declared == "[0, 2000]"
        assert step.epsilon == pytest.approx(5.0)
        lo, hi = (float(v) for v in step.chosen.strip("[]").split(","))
        m, = result.report.measurements
        assert m.sensitivity == hi and lo == 0 and hi <= 2000
        (true,), = _truth(engine, f"SELECT SUM(LEAST(s, {hi})) FROM (SELECT SUM(fare) AS s "
                          "FROM trips GROUP BY rider_id) AS p")
        assert abs(result.rows[0][0] - float(true)) <= tolerance(result.report.columns[0])
        # A bound the query gives itself is kept: nothing to choose.
        own = engine.execute("WITH per AS (SELECT rider_id, LEAST(SUM(fare), 300) AS spend "
                             "FROM trips GROUP BY rider_id) SELECT SUM(spend) FROM per",
                             epsilon=50, **ALICE)
        assert own.report.contribution is None
        assert own.report.measurements[0].sensitivity == 300
    finally:
        engine.close()


def test_fixed_clipping_keeps_the_policy_bounds(backend_url: str,
                                                write_policy: Callable[..., Path]) -> None:
    # clipping = "fixed" keeps the policy's bound for per-person values.
    path = write_policy(backend_url, contribution="auto")
    path.write_text(path.read_text().replace('contribution = "auto"',
                                             'contribution = "auto"\nclipping = "fixed"'))
    engine = Engine(load_policy(path))
    result = engine.execute(SPEND + "SELECT SUM(spend) FROM per", epsilon=5, **ALICE)
    assert result.report.contribution is None
    assert result.report.measurements[0].sensitivity == 2000
    engine.close()


def test_casts_of_unbounded_values(engine: Engine) -> None:
    # CAST(COUNT(*) AS INT) has no bound of its own (no overflow in the interval arithmetic):
    # the policy's [0, k] applies.  A CASE over a count is bounded by its branches.
    q = _analysed(engine, "WITH per AS (SELECT rider_id, CAST(COUNT(*) AS INT) AS n FROM trips "
                          "GROUP BY rider_id) SELECT AVG(n) FROM per")
    assert (q.values[0].lower, q.values[0].upper) == (0, 10) and "policy" in q.values[0].origin
    q = _analysed(engine, "WITH per AS (SELECT rider_id, CASE WHEN COUNT(*) > 3 THEN 1 ELSE 0 "
                          "END AS heavy FROM trips GROUP BY rider_id) SELECT SUM(heavy) FROM per")
    assert (q.values[0].lower, q.values[0].upper) == (0, 1) and "query" in q.values[0].origin
    assert [m.sensitivity for m in q.outer.measurements] == [1]
    # The verifier's intervals: an integer cast of an unbounded value stays unbounded.
    _verify(engine, GOOD.replace(CLIP, f"CAST({CLIP} AS INT)"))
    with pytest.raises(Refused):
        _verify(engine, GOOD.replace(CLIP, "CAST(SUM(t.fare) AS INT)"))
