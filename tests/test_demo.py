"""The demo data generator (`chorus demo`): tables, value ranges, determinism, policy file."""

from __future__ import annotations

import datetime as dt
import math
import os
import pathlib
import secrets
import tomllib
import urllib.parse

import duckdb
import numpy as np
import pytest

from chorus_py.demo import CITY_NAMES, generate_demo, generate_trips, render_policy
from chorus_py.errors import InvalidParameter
from server.pgwire.scram import verify_password

ROWS = 5000
PG_URL = os.environ.get("CHORUS_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
DEMO_VERIFIER = ("SCRAM-SHA-256$4096:ld6T5EzDBylR7FPnbM4SLw==$vCZ/Clp1G7Wy3wwKHmJYt3vaM/2TPMy4561"
                 "gLb2Xb1o=:4fTptsr6G6GLpmL6sQMRS9CA9yG7PwhxGOLwJ4ZpR00=")

EXPECTED_TYPES = {
    "trip_id": "bigint",
    "rider_id": "bigint",
    "driver_id": "bigint",
    "city": "text",
    "pickup_time": "timestamp",
    "fare": "double",
    "distance_km": "double",
}
# DuckDB and Postgres spell the types differently
_TYPE_ALIASES = {
    "varchar": "text",
    "double precision": "double",
    "timestamp without time zone": "timestamp",
}

# The same SQL on both backends; exact (integer) aggregates, so runs and backends compare equal.
CHECKSUM_SQL = """
SELECT count(*), sum(trip_id), sum(rider_id), sum(driver_id),
       sum(CAST(round(fare * 100) AS BIGINT)), sum(CAST(round(distance_km * 100) AS BIGINT)),
       sum(CAST(extract(epoch FROM pickup_time) AS BIGINT) % 1000003),
       sum(length(city) * rider_id)
FROM trips
"""
RANGES_SQL = """
SELECT min(trip_id), max(trip_id), count(DISTINCT trip_id), min(pickup_time), max(pickup_time),
       count(DISTINCT CAST(pickup_time AS DATE)), min(fare), max(fare), min(distance_km),
       max(distance_km), count(DISTINCT driver_id)
FROM trips
"""
PER_RIDER_SQL = """
SELECT min(n), max(n), percentile_disc(0.5) WITHIN GROUP (ORDER BY n), count(*)
FROM (SELECT rider_id, count(*) AS n FROM trips GROUP BY rider_id) AS r
"""


def _normalise(rows: list[tuple]) -> list[tuple]:
    return [tuple(int(v) if isinstance(v, int | np.integer) else v for v in row) for row in rows]


def _check_tables(fetch) -> tuple:
    """Assertions shared by both backends; ``fetch(sql)`` returns all rows. Returns the checksum."""
    types = dict(
        fetch(
            "SELECT column_name, lower(data_type) FROM information_schema.columns "
            "WHERE table_name = 'trips' ORDER BY ordinal_position"
        )
    )
    assert {k: _TYPE_ALIASES.get(v, v) for k, v in types.items()} == EXPECTED_TYPES

    (lo_id, hi_id, n_ids, t_min, t_max, n_days, f_min, f_max, d_min, d_max, n_drv) = fetch(
        RANGES_SQL
    )[0]
    assert (lo_id, hi_id, n_ids) == (1, ROWS, ROWS)
    start = dt.datetime(2026, 1, 1)
    assert start <= t_min < start + dt.timedelta(days=1)
    assert start + dt.timedelta(days=89) <= t_max < start + dt.timedelta(days=90)
    assert n_days == 90
    assert f_min > 0 and f_max <= 500
    assert d_min >= 0.1 and d_max <= 100
    assert 0.5 * ROWS / 200 <= n_drv <= 1.5 * ROWS / 200

    lo_n, hi_n, median_n, n_riders = fetch(PER_RIDER_SQL)[0]
    assert lo_n >= 1 and hi_n <= 200
    assert median_n == 5
    assert ROWS / 20 < n_riders < ROWS / 4

    cities = fetch("SELECT DISTINCT city FROM trips")
    assert {c for (c,) in cities} == set(CITY_NAMES)
    assert sorted(fetch("SELECT city, state FROM cities")) == sorted(
        [("SF", "CA"), ("NYC", "NY"), ("LA", "CA"), ("CHI", "IL"), ("SEA", "WA")]
    )
    return _normalise(fetch(CHECKSUM_SQL))[0]


def _check_policy(path: pathlib.Path, url: str) -> dict:
    policy = tomllib.loads(path.read_text(encoding="utf-8"))
    assert policy["backend"] == {"url": url, "statement_timeout_seconds": 300}
    assert policy["privacy"] == {
        "epsilon_per_block": 10.0,
        "delta_per_block": 1e-6,
        "accounting": "basic",
        "renyi_delta_share": 0.5,
        "scheduler": {"policy": "fcfs", "wait_seconds": 0, "max_wait_seconds": 60},
        "ledger": "sqlite:///budget.sqlite3",
        "answer_cache_seconds": 0,
        "default_epsilon": 0.5,
        "default_delta": 1e-8,
        "max_epsilon_per_query": 2.0,
        "min_epsilon_per_query": 0.001,
        "max_delta_per_query": 1e-6,
        # The proxy draws the noise of an embedded DuckDB; Postgres draws its own.
        "noise": "proxy" if url.startswith("duckdb") else "sql",
        "threshold_epsilon_share": 0.2,
        "cap_epsilon_share": 0.1,
        "choice_reuse_seconds": 600,
        "sensitivity": "analytic",
        "default_gamma": 0.05,
        "max_gamma": 0.05,
        "sampling_m": 2000,
    }
    trips = policy["tables"]["trips"]
    assert trips["privacy_unit"] == "rider_id"
    assert trips["max_rows_per_unit"] == 200
    assert trips["contribution"] == "auto"
    assert trips["bounding"] == "per-query"
    assert trips["block"] == {"column": "pickup_time", "size": "1 day", "start": "2026-01-01",
                              "end": "2026-04-01"}
    assert trips["columns"] == {
        "trip_id": {"type": "int"},
        "rider_id": {"type": "int", "private_id": True},
        "driver_id": {"type": "int"},
        "city": {"type": "text", "public_values": ["SF", "NYC", "LA", "CHI", "SEA"]},
        "pickup_time": {"type": "timestamp"},
        "fare": {"type": "float", "lower": 0, "upper": 200},
        "distance_km": {"type": "float", "lower": 0, "upper": 100},
    }
    assert policy["tables"]["cities"] == {"public": True}
    assert policy["analysts"] == {"demo": {
        "max_epsilon_per_query": 2.0,
        # sha256("demo-token"): the demo analyst's REST token
        "token_sha256": "7c43ef5ae21d43ce2743f770c68e24def1a43ee2f416d2438410c8af7af2ff2c",
        # SCRAM-SHA-256 verifier of "demo": the demo analyst's wire-protocol password
        "password": DEMO_VERIFIER,
    }}
    assert verify_password(policy["analysts"]["demo"]["password"], "demo")
    assert not verify_password(policy["analysts"]["demo"]["password"], "Demo")
    # sha256("demo-owner-token"): the data owner's token (dashboard, metrics)
    assert policy["server"] == {
        "owner_token_sha256": "4debe29c288e310c69d6a70c402c670b3127466f4d4b53b870e27eaebfe86ed2",
        "max_connections": 100, "login_timeout_seconds": 30, "idle_timeout_seconds": 3600}
    return policy


@pytest.fixture(scope="module")
def duckdb_run(tmp_path_factory):
    directory = tmp_path_factory.mktemp("demo")
    calls: list[tuple[str, float]] = []
    policy = generate_demo(directory, rows=ROWS, progress=lambda m, f: calls.append((m, f)))
    return directory, policy, calls


def _duckdb_checksum(directory: pathlib.Path) -> tuple:
    con = duckdb.connect(str(directory / "demo.duckdb"), read_only=True)
    try:
        return _check_tables(lambda sql: con.execute(sql).fetchall())
    finally:
        con.close()


def test_duckdb_tables(duckdb_run):
    directory, _, _ = duckdb_run
    _duckdb_checksum(directory)


def test_duckdb_policy(duckdb_run):
    directory, policy, _ = duckdb_run
    assert policy == directory.resolve() / "policy.toml"
    assert (directory / "demo.duckdb").is_file()
    _check_policy(policy, "duckdb:///demo.duckdb")


def test_progress_reported(duckdb_run):
    _, _, calls = duckdb_run
    fractions = [f for _, f in calls]
    assert fractions[0] == 0.0 and fractions[-1] == 1.0
    assert fractions == sorted(fractions)
    assert all(isinstance(m, str) and m for m, _ in calls)


def test_deterministic_and_replaces(duckdb_run, tmp_path):
    directory, _, _ = duckdb_run
    first = _duckdb_checksum(directory)
    # a second run elsewhere gives the same rows
    generate_demo(tmp_path, rows=ROWS)
    assert _duckdb_checksum(tmp_path) == first
    # a run over an existing database replaces the tables
    generate_demo(tmp_path, rows=100, seed=1)
    con = duckdb.connect(str(tmp_path / "demo.duckdb"), read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM trips").fetchone() == (100,)
        assert con.execute("SELECT count(*) FROM cities").fetchone() == (5,)
    finally:
        con.close()


def test_generate_trips_arrays():
    a, b = generate_trips(2000, seed=7), generate_trips(2000, seed=7)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["fare"], generate_trips(2000, seed=8)["fare"])
    assert np.all(np.diff(a["pickup_time"].astype(np.int64)) >= 0)  # trip_id in pickup order
    tiny = generate_trips(1)
    assert len(tiny["trip_id"]) == 1 and tiny["rider_id"][0] == 1


def test_bad_arguments(tmp_path):
    with pytest.raises(InvalidParameter):
        generate_demo(tmp_path, rows=0)
    with pytest.raises(InvalidParameter):
        generate_demo(tmp_path, backend_url="mysql://localhost/x", rows=10)
    assert not (tmp_path / "policy.toml").exists()


def test_example_policy_matches_generated():
    text = (EXAMPLES / "policy.toml").read_text(encoding="utf-8")
    _check_policy(EXAMPLES / "policy.toml", "duckdb:///demo.duckdb")
    # the example is the generated policy with a placeholder URL: keep them in step
    generated = render_policy("duckdb:///demo.duckdb")
    assert [ln for ln in text.splitlines() if "Placeholder" not in ln] == generated.splitlines()
    assert (EXAMPLES / "README.md").is_file()


@pytest.fixture
def pg_database():
    psycopg = pytest.importorskip("psycopg")
    name = f"chorus_test_demo_{secrets.token_hex(4)}"
    try:
        admin = psycopg.connect(PG_URL, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as e:
        pytest.skip(f"Postgres not reachable at {PG_URL}: {e}")
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield urllib.parse.urlsplit(PG_URL)._replace(path=f"/{name}").geturl()
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.postgres
def test_postgres(pg_database, duckdb_run, tmp_path):
    import psycopg

    policy = generate_demo(tmp_path, backend_url=pg_database, rows=ROWS)
    _check_policy(policy, pg_database)
    assert not (tmp_path / "demo.duckdb").exists()
    with psycopg.connect(pg_database) as conn:
        checksum = _check_tables(lambda sql: conn.execute(sql).fetchall())
        indexes = {
            r[0]
            for r in conn.execute(
                "SELECT indexdef FROM pg_indexes WHERE tablename = 'trips'"
            ).fetchall()
        }
        assert any("(pickup_time)" in ix for ix in indexes)
    # same rows as the DuckDB run
    assert checksum == _duckdb_checksum(duckdb_run[0])
    # running again replaces the tables (DROP TABLE IF EXISTS)
    generate_demo(tmp_path, backend_url=pg_database, rows=50)
    with psycopg.connect(pg_database) as conn:
        assert conn.execute("SELECT count(*) FROM trips").fetchone() == (50,)


# -- riders and drivers, and the demo's join queries --------------------------------------------

# Foreign keys and derived columns, the same SQL on both backends: each count must be 0.
FK_VIOLATIONS_SQL = {
    "trip of an unknown rider": "SELECT count(*) FROM trips t WHERE NOT EXISTS "
    "(SELECT 1 FROM riders r WHERE r.rider_id = t.rider_id)",
    "trip of an unknown driver": "SELECT count(*) FROM trips t WHERE NOT EXISTS "
    "(SELECT 1 FROM drivers d WHERE d.driver_id = t.driver_id)",
    "rider without a trip": "SELECT count(*) FROM riders r WHERE NOT EXISTS "
    "(SELECT 1 FROM trips t WHERE t.rider_id = r.rider_id)",
    "driver without a trip": "SELECT count(*) FROM drivers d WHERE NOT EXISTS "
    "(SELECT 1 FROM trips t WHERE t.driver_id = d.driver_id)",
    "duplicate rider_id": "SELECT count(*) - count(DISTINCT rider_id) FROM riders",
    "duplicate driver_id": "SELECT count(*) - count(DISTINCT driver_id) FROM drivers",
    "trip outside its driver's city": "SELECT count(*) FROM trips t JOIN drivers d "
    "ON t.driver_id = d.driver_id WHERE t.city <> d.city",
    "home city without a trip there": "SELECT count(*) FROM riders r WHERE NOT EXISTS "
    "(SELECT 1 FROM trips t WHERE t.rider_id = r.rider_id AND t.city = r.home_city)",
    "signup after the first trip": "SELECT count(*) FROM riders r JOIN (SELECT rider_id, "
    "min(pickup_time) AS first FROM trips GROUP BY rider_id) f ON f.rider_id = r.rider_id "
    "WHERE r.signup_date > CAST(f.first AS DATE) OR r.signup_date < DATE '2020-01-01'",
    "bad membership, vehicle or rating": "SELECT (SELECT count(*) FROM riders WHERE membership "
    "NOT IN ('standard', 'plus')) + (SELECT count(*) FROM drivers WHERE vehicle NOT IN "
    "('sedan', 'suv', 'ev', 'van') OR rating < 3.5 OR rating > 5)",
}
PEOPLE_CHECKSUM_SQL = (
    "SELECT (SELECT count(*) FROM riders), (SELECT count(*) FROM drivers), "
    "(SELECT sum(rider_id * length(home_city || membership)) FROM riders), "
    "(SELECT sum(CAST(signup_date - DATE '2020-01-01' AS BIGINT)) FROM riders), "
    "(SELECT sum(driver_id * length(city || vehicle)) FROM drivers), "
    "(SELECT sum(CAST(round(rating * 100) AS BIGINT)) FROM drivers)")


def _check_people(fetch) -> tuple:
    """Foreign keys and value rules of riders and drivers; returns a checksum of their rows."""
    for what, sql in FK_VIOLATIONS_SQL.items():
        assert fetch(sql)[0][0] == 0, what
    (n_riders,), = fetch("SELECT count(DISTINCT rider_id) FROM trips")
    (n_drivers,), = fetch("SELECT count(DISTINCT driver_id) FROM trips")
    checksum = _normalise(fetch(PEOPLE_CHECKSUM_SQL))[0]
    assert checksum[:2] == (n_riders, n_drivers)
    # home_city is the city of most of the rider's trips: nearly always the generator's choice
    (agree,), = fetch("SELECT avg(CASE WHEN t.city = r.home_city THEN 1.0 ELSE 0.0 END) "
                      "FROM trips t JOIN riders r ON t.rider_id = r.rider_id")
    assert agree > 0.9
    return checksum


def _check_join_answers(policy_path: pathlib.Path) -> None:
    """The demo's join questions through the engine, with hand-derived sensitivities."""
    from chorus_py.demo.people import JOIN_QUERIES
    from chorus_py.engine import Engine
    from chorus_py.errors import QueryRefused
    from tests.conftest import tolerance

    with Engine.from_policy(policy_path) as engine:
        true = {sql: engine.backend.run(sql).rows for _, sql in JOIN_QUERIES}
        (_, members_sql), (_, vehicles_sql) = JOIN_QUERIES
        # trips JOIN riders, both with privacy unit rider_id (<= 200 trips, 1 rider row): the
        # join keys are the unit columns, so a rider's trips pair only with its own row:
        # S(k) = 200 * 1 = 200 at any k, S* = 200, scale 2 * 200 / 0.5 = 800.
        result = engine.execute(members_sql, epsilon=0.5, delta=1e-8)
        elastic = result.report.elastic
        assert (elastic.at_zero, elastic.peak_k, elastic.smooth_bound) == (200, 0, 200)
        assert not elastic.data_dependent
        assert result.report.columns[1].scale == pytest.approx(800)
        assert [k for k, _ in result.rows] == ["plus", "standard"]
        assert result.report.charged and "riders" in result.report.blocks
        for (key, noisy), (_, exact) in zip(result.rows, sorted(true[members_sql]), strict=True):
            assert abs(noisy - exact) <= tolerance(result.report.columns[1]), key
        # drivers JOIN cities (public): S(k) = max(mf_k(d.city) * 0, mf(cities.city) * 1) = 1,
        # so the scale is 2 * 1 / 0.5 = 4 (the report may hide it while mf(drivers.city), read
        # from private data, is among the query's metrics), so the tolerance is computed here.
        result = engine.execute(vehicles_sql, epsilon=0.5, delta=1e-8)
        assert result.report.columns[1].scale in (None, pytest.approx(4))
        exact = dict(true[vehicles_sql])
        assert {k for k, _ in result.rows} == {"sedan", "suv", "ev", "van"}
        for key, noisy in result.rows:
            assert abs(noisy - exact.get(key, 0)) <= 4 * (math.log(2e9) + 1) + 1, key
        assert result.report.blocks == ("drivers",)
        # trips (rider level) JOIN drivers (event level): refused, nothing charged
        spent = [(b.block_id, b.epsilon_consumed) for b in engine.ledger.blocks()]
        with pytest.raises(QueryRefused, match="different levels"):
            engine.execute("SELECT COUNT(*) FROM trips t JOIN drivers d "
                           "ON t.driver_id = d.driver_id")
        assert [(b.block_id, b.epsilon_consumed) for b in engine.ledger.blocks()] == spent


@pytest.fixture(scope="module")
def people_checksum(duckdb_run) -> tuple:
    con = duckdb.connect(str(duckdb_run[0] / "demo.duckdb"), read_only=True)
    try:
        return _check_people(lambda sql: con.execute(sql).fetchall())
    finally:
        con.close()


def test_people_tables_duckdb(people_checksum):
    assert people_checksum[0] > 0 and people_checksum[1] > 0


def test_join_answers_duckdb(tmp_path):
    _check_join_answers(generate_demo(tmp_path, rows=ROWS))


@pytest.mark.postgres
def test_people_and_join_answers_postgres(pg_database, people_checksum, tmp_path):
    import psycopg

    policy = generate_demo(tmp_path, backend_url=pg_database, rows=ROWS)
    with psycopg.connect(pg_database) as conn:
        assert _check_people(lambda sql: conn.execute(sql).fetchall()) == people_checksum
        keys = {r[0] for r in conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE tablename IN ('riders', 'drivers')")}
        assert any("(rider_id)" in k for k in keys) and any("(driver_id)" in k for k in keys)
    _check_join_answers(policy)
