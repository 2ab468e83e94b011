"""Group keys of a join released by a noisy threshold, and COUNT(DISTINCT unit) over a join on
the unit (``analyses.join_groups``), on both backends and both noise modes, against
hand-derived sensitivities, thresholds and charges."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import pytest

from chorus_py.backends import open_backend
from chorus_py.engine import Engine
from chorus_py.errors import NotSupportedError
from chorus_py.report import QueryResult
from tests.conftest import nothing_spent, tolerance

# Rider 1 has 50 rides, riders 2..21 one each (cities SF/LA/NYC by ride id); every rider has one
# row of jk_members (private, the same unit: signup year 2020 + id % 3, country by id % 2).
OTHER = ("jk_members", "jk_fleet")
SETUP = [
    *(f"DROP TABLE IF EXISTS {t}" for t in OTHER),
    "CREATE TABLE jk_rides (ride_id BIGINT, rider_id BIGINT, driver_id BIGINT, city TEXT, "
    "ts TIMESTAMP, fare DOUBLE PRECISION)",
    "INSERT INTO jk_rides SELECT i, CASE WHEN i <= 50 THEN 1 ELSE i - 49 END, i % 6 + 1, "
    "CASE i % 3 WHEN 0 THEN 'SF' WHEN 1 THEN 'LA' ELSE 'NYC' END, TIMESTAMP '2026-01-01 "
    "00:00:00' + (i % 50) * INTERVAL '1 day', CAST(i % 40 AS DOUBLE PRECISION) "
    "FROM generate_series(1, 70) AS s(i)",
    "CREATE TABLE jk_members (rider_id BIGINT, signup_year BIGINT, country TEXT)",
    "INSERT INTO jk_members SELECT i, 2020 + i % 3, CASE i % 2 WHEN 0 THEN 'US' ELSE 'MX' END "
    "FROM generate_series(1, 21) AS s(i)",
    "CREATE TABLE jk_fleet (driver_id BIGINT, vehicle TEXT)",
    "INSERT INTO jk_fleet VALUES (1, 'sedan'), (2, 'sedan'), (3, 'sedan'), (4, 'suv'), "
    "(5, 'suv'), (6, 'van')",
]
K = 5
POLICY = """
[backend]
url = "{url}"

[privacy]
epsilon_per_block = 100000
delta_per_block = 1e-3
default_delta = 1e-8
max_epsilon_per_query = 1000
max_delta_per_query = 1e-4
noise = "%s"

[tables.jk_rides]
privacy_unit = "rider_id"
max_rows_per_unit = %d
contribution = "fixed"
block = {{ column = "ts", size = "1 day", start = "2026-01-01", end = "2026-04-01" }}
[tables.jk_rides.columns]
ride_id   = {{ type = "int" }}
rider_id  = {{ type = "int", private_id = true }}
driver_id = {{ type = "int" }}
city      = {{ type = "text" }}
ts        = {{ type = "timestamp" }}
fare      = {{ type = "float", lower = 0, upper = 100 }}

[tables.jk_members]
privacy_unit = "rider_id"
max_rows_per_unit = 1
contribution = "fixed"
[tables.jk_members.columns]
rider_id    = {{ type = "int", private_id = true }}
signup_year = {{ type = "int" }}
country     = {{ type = "text" }}

[tables.jk_fleet]
public = true

[analysts.alice]
"""
JOINED = "FROM jk_rides r JOIN jk_members m ON r.rider_id = m.rider_id "
SHARE = 0.2  # privacy.threshold_epsilon_share (the default)


@pytest.fixture(params=["sql", "proxy"])
def rides(request: pytest.FixtureRequest, scratch: Callable[..., Engine],
          backend_url: str) -> Iterator[Engine]:
    """An engine over the rides, the private members and the public fleet, per noise mode."""
    yield scratch("jk_rides", SETUP, POLICY % (request.param, K))
    open_backend(backend_url).run_owned([f"DROP TABLE IF EXISTS {t}" for t in OTHER])


def _ask(engine: Engine, sql: str, epsilon: float = 400.0,
         delta: float = 1e-8) -> QueryResult:
    return engine.execute(sql, analyst="alice", epsilon=epsilon, delta=delta)


def _gate(result: QueryResult, groups: int, epsilon: float, delta: float = 1e-8) -> None:
    """The key release is a separate distinct-rider count of sensitivity D at epsilon_t =
    share * epsilon, with tau = 1 + b ln(D / (delta / 2))."""
    release = result.report.key_release
    assert release.method == "threshold" and release.gate == "t0"
    b = groups / (SHARE * epsilon)
    assert release.delta == pytest.approx(delta / 2)
    assert release.threshold == pytest.approx(1 + b * math.log(groups / (delta / 2)))
    assert f"D = {groups} groups per unit" in release.note


def test_group_by_a_column_of_a_same_person_private_table(rides: Engine) -> None:
    result = _ask(rides, "SELECT m.signup_year, COUNT(*) AS n " + JOINED
                  + "GROUP BY m.signup_year ORDER BY 1")
    # Riders 1..21: signup years 2020 (ids 3, 6, ..., 21), 2021 (1, 4, ...), 2022 (2, 5, ...);
    # rider 1 keeps K = 5 of its 50 rides.  Every year has >= 6 riders: released at epsilon 400.
    assert [row[0] for row in result.rows] == [2020, 2021, 2022]
    # trips (<= 5 rows per rider) JOIN members (1 row) on the unit: S = 5 * 1 = 5, constant, so
    # S* = 5 and the count's sensitivity is 2 S* = 10.  Each rider has one members row, so one
    # signup year: D = 1.
    assert result.report.elastic.at_zero == 5 and result.report.elastic.smooth_bound == 5
    assert [m.sensitivity for m in result.report.measurements] == [10.0]
    _gate(result, 1, 400.0)
    truth = {2020: 7, 2021: 7 - 1 + K, 2022: 7}
    for year, n in result.rows:
        assert abs(n - truth[year]) <= tolerance(result.report.columns[1])


def test_group_by_a_trips_column_over_the_join_reaches_k_groups(rides: Engine) -> None:
    result = _ask(rides, "SELECT r.city, m.country, COUNT(*) AS n, "
                  "COUNT(DISTINCT r.rider_id) AS riders " + JOINED + "GROUP BY 1, 2")
    # A rider's <= 5 rides take <= 5 cities and one country: D = 5 * 1 = 5.  COUNT(DISTINCT
    # rider) moves by 1 in each of them: Delta = 5; COUNT(*) keeps 2 S* = 10.
    _gate(result, 5, 400.0)
    assert sorted(m.sensitivity for m in result.report.measurements) == [5.0, 10.0]
    assert len(result.rows) == 6  # 3 cities x 2 countries, each with >= 3 riders


def test_a_self_join_on_the_unit_reaches_k_squared_groups(rides: Engine) -> None:
    result = _ask(rides, "SELECT a.city, b.city, COUNT(DISTINCT a.rider_id) AS riders "
                  "FROM jk_rides a JOIN jk_rides b ON a.rider_id = b.rider_id GROUP BY 1, 2",
                  epsilon=800.0)
    # Each occurrence keeps <= 5 rides per rider: <= 25 pairs, in <= 5 * 5 = 25 city pairs.
    _gate(result, 25, 800.0)
    assert [m.sensitivity for m in result.report.measurements] == [25.0]
    # Riders 2..21 have one ride: only (c, c) pairs have more than one rider.
    assert {(a, b) for a, b, _ in result.rows} >= {("SF", "SF"), ("LA", "LA"), ("NYC", "NYC")}


def test_a_key_of_a_public_table_next_to_a_private_one(rides: Engine) -> None:
    result = _ask(rides, "SELECT f.vehicle, r.city, COUNT(*) AS n FROM jk_rides r "
                  "JOIN jk_fleet f ON r.driver_id = f.driver_id GROUP BY 1, 2")
    # The fleet is public, one row per driver (mf(jk_fleet.driver_id) = 1): S = 1 * 5 = 5 join
    # rows per rider at every k, so D = 5 (the key reads the public table: the bound of the
    # rows, not of the private caps alone).
    _gate(result, 5, 400.0)
    assert [m.sensitivity for m in result.report.measurements] == [10.0]


def test_the_charge_is_the_epsilon_and_delta_asked(rides: Engine) -> None:
    _ask(rides, "SELECT m.country, COUNT(*) " + JOINED + "GROUP BY 1", epsilon=10.0,
         delta=1e-6)
    block = max(rides.ledger.blocks(), key=lambda b: b.epsilon_consumed)
    assert block.epsilon_consumed == pytest.approx(10.0)
    assert block.delta_consumed == pytest.approx(1e-6)


def test_distinct_riders_per_public_value_key_is_min_g_d(scratch: Callable[..., Engine],
                                                          backend_url: str) -> None:
    policy = (POLICY % ("sql", K)).replace('city      = {{ type = "text" }}',
                                           'city = {{ type = "text", public_values = '
                                           '["SF", "LA"] }}')
    engine = scratch("jk_rides", SETUP, policy)
    try:
        result = _ask(engine, "SELECT r.city, COUNT(DISTINCT r.rider_id) " + JOINED
                      + "GROUP BY 1 ORDER BY 1")
        # Two public cities (G = 2), a rider's rides reach <= 5 (D = 5): Delta = min(2, 5).
        assert [row[0] for row in result.rows] == ["LA", "SF"]
        assert result.report.key_release.method == "public_values"
        assert [m.sensitivity for m in result.report.measurements] == [2.0]
    finally:
        open_backend(backend_url).run_owned([f"DROP TABLE IF EXISTS {t}" for t in OTHER])


@pytest.mark.parametrize(("sql", "words", "hint"), [
    # A self-join on a city: one rider's rides pair with other riders' rides.
    ("SELECT a.driver_id, COUNT(*) FROM jk_rides a JOIN jk_rides b ON a.city = b.city "
     "GROUP BY 1", "not all joined on their privacy unit", "join private tables of one"),
    ("SELECT COUNT(DISTINCT a.rider_id) FROM jk_rides a JOIN jk_rides b ON a.city = b.city "
     "GROUP BY a.driver_id", "not all joined on their privacy unit", "public_values"),
    # Distinct values of another column: no bounded sensitivity; the per-person form is named.
    ("SELECT COUNT(DISTINCT a.city) FROM jk_rides a JOIN jk_rides b "
     "ON a.rider_id = b.rider_id", "only for the privacy unit", "GROUP BY rider_id"),
])
def test_refusals_name_what_would_answer(rides: Engine, sql: str, words: str,
                                         hint: str) -> None:
    with pytest.raises(NotSupportedError) as err:
        _ask(rides, sql)
    assert words in err.value.message and hint in (err.value.hint or "")
    assert nothing_spent(rides)


def test_riders_in_two_cities_by_a_self_join_or_per_person(rides: Engine) -> None:
    # Riders with rides in two different cities (only rider 1 has more than one ride).
    joined = _ask(rides, "SELECT COUNT(DISTINCT a.rider_id) AS riders FROM jk_rides a "
                  "JOIN jk_rides b ON a.rider_id = b.rider_id WHERE a.city <> b.city")
    per = _ask(rides, "WITH per AS (SELECT rider_id, COUNT(DISTINCT city) AS n FROM jk_rides "
               "GROUP BY rider_id) SELECT COUNT(*) AS riders FROM per WHERE n >= 2")
    for result in (joined, per):
        # One row per person (per-person reading): Delta = 1.  Rider 1 is counted unless the
        # <= 5 rides kept of its 50 all fall in one city (probability about 1.4%).
        assert [m.sensitivity for m in result.report.measurements] == [1.0]
        assert min(abs(result.rows[0][0] - t) for t in (0, 1)) \
            <= tolerance(result.report.columns[0])


def test_an_empty_answer_says_why(rides: Engine) -> None:
    # At epsilon 0.01, b = 5 / 0.002 = 2500 and tau = 1 + 2500 ln(5 / 5e-9), about 51,800: far
    # above the <= 21 riders of any city.
    sql = "SELECT r.city, COUNT(*) " + JOINED + "GROUP BY 1"
    explained = rides.explain(sql, analyst="alice", epsilon=0.01, delta=1e-8)
    assert any("will mostly be hidden" in w for w in explained.warnings), explained.warnings
    result = _ask(rides, sql, epsilon=0.01)
    assert result.rows == []
    assert any("No group was released" in w and "D = 5" in w
               for w in result.report.warnings), result.report.warnings
