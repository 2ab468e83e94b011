"""Public keys without listing them (issue 24 part 2), on DuckDB and Postgres: calendar buckets
of the block column and columns of joined public tables come back as every key of their grid,
with no threshold, at any epsilon; sensitivities are derived by hand below; a private column
still needs the threshold; grids beyond 10,000 keys are refused."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta

import duckdb
import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyses.keys import FIELDS, TRUNC_UNITS, CalendarKeys, calendar_values
from analyses.outgoing import Refused, rules_from_policy, verify
from chorus_py.backends import SCHEMA, open_backend
from chorus_py.engine import Engine
from chorus_py.errors import NotSupportedError, QueryRefused
from chorus_py.report import QueryResult
from tests.conftest import nothing_spent

# Rides of a small skewed table: rider 1 has 50 rides, riders 2..21 one each; every ride is in
# January or February (days 0..49 of 2026, hour i % 24), none in March although the public
# schedule runs to April: March must come back as a noisy 0, never be omitted.
OTHER = ("pk_members", "pk_fleet", "pk_zones")
SETUP = [
    *(f"DROP TABLE IF EXISTS {t}" for t in OTHER),
    "CREATE TABLE pk_rides (ride_id BIGINT, rider_id BIGINT, driver_id BIGINT, city TEXT, "
    "ts TIMESTAMP, fare DOUBLE PRECISION)",
    "INSERT INTO pk_rides SELECT i, CASE WHEN i <= 50 THEN 1 ELSE i - 49 END, i % 6 + 1, "
    "CASE i % 3 WHEN 0 THEN 'SF' WHEN 1 THEN 'LA' ELSE 'NYC' END, TIMESTAMP '2026-01-01 "
    "00:00:00' + (i % 50) * INTERVAL '1 day' + (i % 24) * INTERVAL '1 hour', "
    "CAST(i % 40 AS DOUBLE PRECISION) FROM generate_series(1, 70) AS s(i)",
    # Public: one row per rider (and rider 99, signed up in 2019, who never rode).
    "CREATE TABLE pk_members (rider_id BIGINT, signup_year BIGINT)",
    "INSERT INTO pk_members SELECT i, 2020 + i % 3 FROM generate_series(1, 21) AS s(i)",
    "INSERT INTO pk_members VALUES (99, 2019)",
    # Public: one row per driver (and an ev driver with no ride).
    "CREATE TABLE pk_fleet (driver_id BIGINT, vehicle TEXT)",
    "INSERT INTO pk_fleet VALUES (1, 'sedan'), (2, 'sedan'), (3, 'sedan'), (4, 'suv'), "
    "(5, 'suv'), (6, 'van'), (7, 'ev')",
    # Public, not unique on city: SF has two zones (mf(pk_zones.city) = 2), CHI and SEA no
    # rides, SEA's zone is NULL.
    "CREATE TABLE pk_zones (city TEXT, zone TEXT)",
    "INSERT INTO pk_zones VALUES ('SF', 'north'), ('SF', 'south'), ('LA', 'west'), "
    "('NYC', 'east'), ('CHI', 'lake'), ('SEA', NULL)",
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

[tables.pk_rides]
privacy_unit = "rider_id"
max_rows_per_unit = %d
contribution = "fixed"
block = {{ column = "ts", size = "1 day", start = "2026-01-01", end = "2026-04-01" }}
[tables.pk_rides.columns]
ride_id   = {{ type = "int" }}
rider_id  = {{ type = "int", private_id = true }}
driver_id = {{ type = "int" }}
city      = {{ type = "text" }}
ts        = {{ type = "timestamp" }}
fare      = {{ type = "float", lower = 0, upper = 100 }}

[tables.pk_members]
public = true
[tables.pk_fleet]
public = true
[tables.pk_zones]
public = true

[analysts.alice]
"""


@pytest.fixture(params=["sql", "proxy"])
def rides(request: pytest.FixtureRequest, scratch: Callable[..., Engine],
          backend_url: str) -> Iterator[Engine]:
    """An engine over the skewed rides and the three public tables, per noise mode."""
    yield scratch("pk_rides", SETUP, POLICY % (request.param, K))
    open_backend(backend_url).run_owned([f"DROP TABLE IF EXISTS {t}" for t in OTHER])


def _ask(engine: Engine, sql: str, epsilon: float = 0.05) -> QueryResult:
    return engine.execute(sql, analyst="alice", epsilon=epsilon, delta=1e-8)


def _keys(result: QueryResult) -> list[object]:
    return [row[0] for row in result.rows]


# -- calendar buckets of the block column ----------------------------------------------------
def test_a_monthly_series_at_small_epsilon_returns_every_month(rides: Engine) -> None:
    result = _ask(rides, "SELECT DATE_TRUNC('month', ts) AS month, COUNT(*) AS n FROM pk_rides "
                         "GROUP BY 1 ORDER BY 1", epsilon=0.01)
    assert _keys(result) == [datetime(2026, m, 1) for m in (1, 2, 3)]  # March: no ride
    report = result.report
    assert report.key_release.method == "public_values"
    assert "every month of the blocks read" in report.key_release.note
    # COUNT over <= k = 5 rows per rider: Delta = 5, whatever the keys.
    assert [m.sensitivity for m in report.measurements] == [5.0]


def test_an_hour_of_day_series_returns_all_24_hours(rides: Engine) -> None:
    result = _ask(rides, "SELECT EXTRACT(hour FROM ts) AS h, COUNT(*) AS n FROM pk_rides "
                         "GROUP BY 1 ORDER BY 1", epsilon=0.01)
    assert [int(h) for h in _keys(result)] == list(range(24))
    assert all(n >= 0 for _, n in result.rows)


def test_other_spellings_of_extract_are_calendar_keys(rides: Engine) -> None:
    # DuckDB's HOUR(ts) and DATE_PART('hour', ts) (Postgres parses date_part as EXTRACT) are
    # written as EXTRACT before the allowlists, so they are calendar keys too.
    for sql in ("SELECT HOUR(ts), COUNT(*) FROM pk_rides GROUP BY 1 ORDER BY 1",
                "SELECT DATE_PART('hour', ts), COUNT(*) FROM pk_rides GROUP BY 1 ORDER BY 1"):
        assert [int(h) for h in _keys(_ask(rides, sql))] == list(range(24))
    years = _ask(rides, "SELECT YEAR(ts), MONTH(ts), COUNT(*) FROM pk_rides GROUP BY 1, 2 "
                        "ORDER BY 1, 2")
    assert [(int(y), int(m)) for y, m, _ in years.rows] == [(2026, 1), (2026, 2), (2026, 3)]


def test_date_part_with_a_field_outside_the_list_stays_refused() -> None:
    from analyses.validate import parse_statement

    with pytest.raises(QueryRefused, match="DATE_PART"):
        parse_statement("SELECT COUNT(*) FROM t GROUP BY DATE_PART('hour FROM ts) --', ts)",
                        "duckdb", frozenset({"t"}))


def test_distinct_riders_per_bucket_have_sensitivity_min_k_g(rides: Engine) -> None:
    # COUNT(DISTINCT rider_id): a rider's <= 5 rows reach <= min(5, G) groups, each count
    # moving by 1: by month G = 3 -> Delta 3; by day of week G = 7 -> Delta 5.
    by_month = _ask(rides, "SELECT DATE_TRUNC('month', ts), COUNT(DISTINCT rider_id) "
                           "FROM pk_rides GROUP BY 1")
    assert [m.sensitivity for m in by_month.report.measurements] == [3.0]
    by_dow = _ask(rides, "SELECT EXTRACT(dow FROM ts), COUNT(DISTINCT rider_id) FROM pk_rides "
                         "GROUP BY 1")
    assert [m.sensitivity for m in by_dow.report.measurements] == [5.0]
    assert sorted(int(v) for v in _keys(by_dow)) == list(range(7))


def test_the_grid_follows_the_blocks_the_query_reads(rides: Engine) -> None:
    after = _ask(rides, "SELECT DATE_TRUNC('month', ts), COUNT(*) FROM pk_rides "
                        "WHERE ts >= '2026-02-01' GROUP BY 1 ORDER BY 1")
    assert _keys(after) == [datetime(2026, 2, 1), datetime(2026, 3, 1)]
    # Two separate runs of blocks: their months only.
    runs = _ask(rides, "SELECT DATE_TRUNC('month', ts), COUNT(*) FROM pk_rides WHERE "
                       "CAST(ts AS DATE) IN ('2026-01-05', '2026-03-10') GROUP BY 1 ORDER BY 1")
    assert _keys(runs) == [datetime(2026, 1, 1), datetime(2026, 3, 1)]
    days = _ask(rides, "SELECT CAST(ts AS DATE) AS d, COUNT(*) FROM pk_rides "
                       "WHERE ts < '2026-01-08' GROUP BY 1 ORDER BY 1")
    assert [str(d) for d in _keys(days)] == [f"2026-01-0{d}" for d in range(1, 8)]


def test_calendar_key_next_to_declared_and_answers_near_truth(rides: Engine) -> None:
    # At a large epsilon the monthly counts are close to the truth at the cap: rider 1 keeps 5
    # of 50 rides, the 20 others their one ride (days 50..69 % 50 = 0..19: all in January).
    result = _ask(rides, "SELECT DATE_TRUNC('month', ts) AS m, COUNT(*) AS n FROM pk_rides "
                         "GROUP BY 1 ORDER BY 1", epsilon=500)
    counts = [n for _, n in result.rows]
    assert abs(sum(counts) - 25) <= 2 and counts[2] <= 1
    assert counts[0] >= 20


def test_quantiles_per_calendar_bucket_return_every_bucket(rides: Engine) -> None:
    # The quantile kind lists calendar keys over the blocks read too (its grid was empty
    # before: it reads listed values only).
    result = _ask(rides, "SELECT DATE_TRUNC('month', ts) AS m, MEDIAN(fare) FROM pk_rides "
                         "GROUP BY 1 ORDER BY 1", epsilon=1)
    assert _keys(result) == [datetime(2026, m, 1) for m in (1, 2, 3)]
    assert all(0 <= v <= 100 for _, v in result.rows)


def test_a_private_column_still_needs_the_threshold(rides: Engine) -> None:
    result = _ask(rides, "SELECT city, COUNT(*) FROM pk_rides GROUP BY city")
    assert result.report.key_release.method == "threshold"
    mixed = _ask(rides, "SELECT city, DATE_TRUNC('month', ts), COUNT(*) FROM pk_rides "
                        "GROUP BY 1, 2")
    assert mixed.report.key_release.method == "threshold"


# -- keys the query spells out -----------------------------------------------------------------
def test_a_case_of_literals_returns_every_band_without_a_threshold(rides: Engine) -> None:
    # fare = i % 40 over i = 1..70 is at most 39: 'top' holds no ride and must come back as a
    # noisy 0, never be omitted.
    sql = ("SELECT CASE WHEN fare > 45 THEN 'top' WHEN fare > 30 THEN 'high' ELSE 'low' END "
           "AS band, COUNT(*) AS n FROM pk_rides GROUP BY 1")
    result = _ask(rides, sql, epsilon=0.01)
    assert sorted(_keys(result)) == ["high", "low", "top"]
    report = result.report
    assert report.key_release.method == "public_values" and report.delta == 0
    assert "every value the query spells out ('top', 'high', 'low')" in report.key_release.note
    assert [m.sensitivity for m in report.measurements] == [float(K)]  # one group per row
    big = _ask(rides, sql, epsilon=1000.0)  # noise scale 0.005: the exact counts
    got = {k: round(n) for k, n in big.rows}
    # Every kept ride in exactly one band: 70 rides, rider 1's 50 capped at K = 5.
    assert got["top"] == 0 and got["high"] + got["low"] == 70 - (50 - K)


def test_a_condition_and_a_case_without_else_are_listed_keys(rides: Engine) -> None:
    cond = _ask(rides, "SELECT fare > 30 AS high, COUNT(*) FROM pk_rides GROUP BY 1")
    assert sorted(_keys(cond)) == [False, True]
    assert cond.report.key_release.method == "public_values"
    # No ELSE: the rows outside every WHEN have a NULL key, which is not listed: left out.
    some = _ask(rides, "SELECT CASE WHEN city = 'SF' THEN 1 END AS sf, COUNT(*) "
                       "FROM pk_rides GROUP BY 1", epsilon=1000.0)
    assert _keys(some) == [1] and some.report.key_release.method == "public_values"


def test_a_case_reading_a_column_still_needs_the_threshold(rides: Engine) -> None:
    for sql in ("SELECT CASE WHEN fare > 30 THEN city ELSE 'low' END, COUNT(*) FROM pk_rides "
                "GROUP BY 1",
                "SELECT CASE WHEN fare > 30 THEN 1 ELSE 'low' END, COUNT(*) FROM pk_rides "
                "GROUP BY 1"):
        try:
            result = _ask(rides, sql)
        except (QueryRefused, NotSupportedError):
            continue  # mixed result types: refused before anything is charged
        assert result.report.key_release.method == "threshold"


def test_grids_beyond_10000_keys_are_refused_for_free(rides: Engine) -> None:
    # 90 days * 24 hours = 2,160 hours, times 7 days of the week: 15,120 combinations.
    with pytest.raises(QueryRefused, match="15,120 combinations") as err:
        _ask(rides, "SELECT DATE_TRUNC('hour', ts), EXTRACT(dow FROM ts), COUNT(*) "
                    "FROM pk_rides GROUP BY 1, 2")
    assert "coarser" in (err.value.hint or "") and nothing_spent(rides)
    hours = _ask(rides, "SELECT DATE_TRUNC('hour', ts), COUNT(*) FROM pk_rides GROUP BY 1")
    assert len(hours.rows) == 2160


# -- columns of a joined public table --------------------------------------------------------
def test_group_by_a_public_tables_column_over_a_join_on_the_unit(rides: Engine) -> None:
    result = _ask(rides, "SELECT m.signup_year, COUNT(*) AS n FROM pk_rides r JOIN pk_members m "
                         "ON r.rider_id = m.rider_id GROUP BY m.signup_year ORDER BY 1")
    # Every signup year of the public table, 2019 (no rider rode) included.
    assert _keys(result) == [2019, 2020, 2021, 2022]
    report = result.report
    assert report.key_release.method == "public_values"
    assert "public table pk_members" in report.key_release.note
    # pk_rides (<= 5 rows per rider: S = 5) JOIN pk_members (public, S = 0, mf(rider_id) = 1):
    # S(k) = max(mf_k(r.rider_id) * 0, mf(m.rider_id) * 5) = 5 at every k, so S* = 5 and the
    # count's sensitivity is 2 S* = 10.
    assert report.elastic.at_zero == 5 and report.elastic.smooth_bound == 5
    assert [m.sensitivity for m in report.measurements] == [10.0]


def test_group_by_vehicle_of_a_public_fleet(rides: Engine) -> None:
    result = _ask(rides, "SELECT f.vehicle, COUNT(*) AS n, AVG(r.fare) AS fare FROM pk_rides r "
                         "JOIN pk_fleet f ON r.driver_id = f.driver_id GROUP BY f.vehicle "
                         "ORDER BY 1", epsilon=0.01)
    assert _keys(result) == ["ev", "sedan", "suv", "van"]


def test_a_join_on_a_non_key_repeats_rows_and_the_sensitivity_says_so(rides: Engine) -> None:
    result = _ask(rides, "SELECT z.zone, COUNT(*) AS n FROM pk_rides r JOIN pk_zones z "
                         "ON r.city = z.city GROUP BY z.zone", epsilon=400)
    keys = _keys(result)
    assert sorted(k for k in keys if k is not None) == ["east", "lake", "north", "south", "west"]
    assert None in keys  # SEA's NULL zone is a key of the public table too
    report = result.report
    # SF has two zones: each SF ride joins twice (mf(z.city) = 2), one in each group.  A rider's
    # <= 5 rides make <= 10 join rows: S(k) = max(mf_k(r.city) * 0, 2 * 5) = 10, the L1 change
    # of the zone counts; 2 S* = 20.
    assert report.elastic.at_zero == 10 and report.elastic.smooth_bound == 10
    assert [m.sensitivity for m in report.measurements] == [20.0]
    counts = dict(result.rows)
    assert counts["north"] == pytest.approx(counts["south"], abs=2)  # the same SF rides
    assert counts["lake"] <= 1


def test_a_public_filter_narrows_the_grid(rides: Engine) -> None:
    result = _ask(rides, "SELECT z.zone, COUNT(*) FROM pk_rides r JOIN pk_zones z "
                         "ON r.city = z.city WHERE z.city = 'SF' GROUP BY 1 ORDER BY 1")
    assert _keys(result) == ["north", "south"]


def test_a_private_key_over_a_join_with_a_public_table_is_thresholded(rides: Engine) -> None:
    result = _ask(rides, "SELECT r.city, COUNT(*) FROM pk_rides r JOIN pk_fleet f "
                         "ON r.driver_id = f.driver_id GROUP BY r.city", epsilon=400)
    # A rider's <= 5 rides reach <= 5 cities (D = 5: analyses.join_groups); tests/
    # test_join_keys.py derives the threshold.
    assert result.report.key_release.method == "threshold"
    assert "D = 5 groups per unit" in result.report.key_release.note


def test_a_private_key_over_a_join_off_the_unit_is_refused_naming_the_public_ones(
        rides: Engine) -> None:
    with pytest.raises(NotSupportedError) as err:
        _ask(rides, "SELECT a.city, COUNT(*) FROM pk_rides a JOIN pk_rides b "
                    "ON a.driver_id = b.driver_id GROUP BY a.city")
    assert "public table" in (err.value.hint or "") and nothing_spent(rides)


def test_the_outgoing_check_refuses_a_grid_reading_a_private_table(
        rides: Engine, backend_url: str) -> None:
    result = _ask(rides, "SELECT m.signup_year, COUNT(*) FROM pk_rides r JOIN pk_members m "
                         "ON r.rider_id = m.rider_id GROUP BY 1")
    sql = result.report.rewritten_sql
    if rides.policy.privacy.noise != "sql":
        return  # proxy noise: the statement has no grid-and-noise structure to check
    rules = rules_from_policy(rides.policy, rides.schema, SCHEMA)
    dialect = "postgres" if backend_url.startswith("postgresql") else "duckdb"
    verify(sql, dialect, rules, "noised_in_sql", frozenset({"pk_rides"}))
    grid = re.compile(r'(DISTINCT "?m"?\."?signup_year"? AS k0 FROM \S+\.)pk_members')
    assert grid.search(sql)
    with pytest.raises(Refused):
        verify(grid.sub(r"\1pk_rides", sql), dialect, rules, "noised_in_sql",
                frozenset({"pk_rides"}))


# -- the calendar grid against the databases -------------------------------------------------
_EXPRESSIONS = [*(f"DATE_TRUNC('{u}', ts)" for u in TRUNC_UNITS),
                *(f"EXTRACT({f} FROM ts)" for f in FIELDS), "CAST(ts AS DATE)"]


def _domain(expression: str) -> CalendarKeys:
    if expression.startswith("DATE_TRUNC"):
        return CalendarKeys("t", "ts", "trunc", expression.split("'")[1])
    if expression.startswith("EXTRACT"):
        return CalendarKeys("t", "ts", "field", expression[8:].split()[0])
    return CalendarKeys("t", "ts", "date", "day")


def _normal(value: object) -> object:
    if isinstance(value, datetime):
        return value.replace(tzinfo=None)
    return int(value) if isinstance(value, float | int) or hasattr(value, "as_integer_ratio") \
        else value


_HOURS = st.integers(min_value=0, max_value=24 * 365 * 3)


@settings(max_examples=60, deadline=None)
@given(start=_HOURS, hours=st.integers(min_value=1, max_value=24 * 60),
       expression=st.sampled_from(_EXPRESSIONS))
def test_calendar_values_are_what_duckdb_computes(start: int, hours: int,
                                                  expression: str) -> None:
    """Every hour of [start, end) through the database: the same set of buckets (block
    windows lie on hour boundaries or coarser, so an hourly walk meets every bucket)."""
    begin = datetime(2024, 1, 1) + timedelta(hours=start)
    end = begin + timedelta(hours=hours)
    con = duckdb.connect()
    found = {_normal(v) for (v,) in con.execute(
        f"SELECT DISTINCT {expression} FROM generate_series(?::TIMESTAMP, ?::TIMESTAMP - "
        "INTERVAL 1 HOUR, INTERVAL 1 HOUR) AS s(ts)", [begin, end]).fetchall()}
    listed = {_normal(v) for v in calendar_values(_domain(expression), [(begin, end)])}
    assert found == listed


@pytest.mark.postgres
def test_calendar_values_are_what_postgres_computes(postgres_url: str) -> None:
    with psycopg.connect(postgres_url) as con:
        for begin, hours in [(datetime(2025, 12, 27, 5), 24 * 40), (datetime(2026, 2, 27), 50),
                             (datetime(2024, 12, 30), 24 * 400), (datetime(2026, 3, 1, 23), 2)]:
            end = begin + timedelta(hours=hours)
            for expression in _EXPRESSIONS:
                rows = con.execute(
                    f"SELECT DISTINCT {expression} FROM generate_series(%s::timestamp, "
                    "%s::timestamp - interval '1 hour', interval '1 hour') AS s(ts)",
                    (begin, end)).fetchall()
                found = {_normal(v) for (v,) in rows}
                listed = {_normal(v) for v in calendar_values(_domain(expression),
                                                              [(begin, end)])}
                assert found == listed, expression
