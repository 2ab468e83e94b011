"""The demo's people tables: ``riders`` and ``drivers``, one row per id the trips refer to.

:func:`generate_people` derives them from the generated trips, so every ``trips.rider_id`` and
``trips.driver_id`` is a row of ``riders`` / ``drivers`` (consistent foreign keys) and no rider or
driver exists without a trip:

``riders`` (private; privacy unit ``rider_id``, one row per rider)
    ``rider_id BIGINT`` 1..R (every rider of the trips), ``signup_date DATE``, ``home_city TEXT``,
    ``membership TEXT``.
``drivers`` (private at event level: one row per driver, so protecting a row protects a driver)
    ``driver_id BIGINT`` (the ids the trips use), ``city TEXT``, ``vehicle TEXT``,
    ``rating DOUBLE``.

Values (one ``numpy.random.Generator`` seeded with ``(seed, 1)``: independent of the trips' draws,
and the same for a given ``(seed, rows)``):

- home_city: the city of most of the rider's trips (ties: the first in :data:`CITY_NAMES`); the
  trips put 95% of a rider's trips in the home city, so this is the city the generator chose for
  nearly every rider;
- signup_date: 0 to about 3 years before the rider's first trip (exponential, mean 300 days),
  never before 2020-01-01;
- membership: "plus" for 20% of riders, "standard" otherwise;
- city of a driver: the city of its trips (the generator gives each driver trips in one city);
- vehicle: sedan 55%, suv 20%, ev 20%, van 5%; rating: normal around 4.75 (sd 0.15), clipped to
  3.5..5.0, rounded to 0.01.
"""

from __future__ import annotations

import io

import duckdb
import numpy as np

MEMBERSHIPS: tuple[str, ...] = ("standard", "plus")
VEHICLES: tuple[str, ...] = ("sedan", "suv", "ev", "van")
_VEHICLE_WEIGHTS = np.array([0.55, 0.20, 0.20, 0.05])
_FIRST_SIGNUP = np.datetime64("2020-01-01", "D")

#: Join questions ``chorus demo`` answers after its one-table examples (question, SQL).
JOIN_QUERIES: tuple[tuple[str, str], ...] = (
    ("Trips per rider membership (trips JOIN riders: the same privacy unit)",
     "SELECT r.membership, COUNT(*) AS trips FROM trips t JOIN riders r "
     "ON t.rider_id = r.rider_id GROUP BY r.membership ORDER BY r.membership"),
    ("Drivers per vehicle in cities over a million people (drivers JOIN cities: public)",
     "SELECT d.vehicle, COUNT(*) AS drivers FROM drivers d JOIN cities c ON d.city = c.city "
     "WHERE c.population > 1000000 GROUP BY d.vehicle ORDER BY d.vehicle"),
)


def generate_people(trips: dict[str, np.ndarray], cities: int, seed: int
                    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """``(riders, drivers)`` as dicts of numpy arrays, from the trips of ``generate_trips``.

    ``cities`` is the number of cities (``city`` holds indexes into the city names, as in the
    trips); ``home_city`` and ``city`` are such indexes too, turned into TEXT by the loaders.
    """
    rng = np.random.default_rng([seed, 1])
    rider_id, city = trips["rider_id"], trips["city"].astype(np.int64)
    n_riders = int(rider_id.max())
    per_city = np.bincount(rider_id * cities + city, minlength=(n_riders + 1) * cities)
    home = per_city.reshape(n_riders + 1, cities)[1:].argmax(axis=1).astype(np.uint8)
    first_day = np.full(n_riders + 1, np.iinfo(np.int64).max)
    day = trips["pickup_time"].astype("datetime64[D]").astype(np.int64)
    np.minimum.at(first_day, rider_id, day)
    first = first_day[1:].astype("datetime64[D]")
    before = np.minimum(np.rint(rng.exponential(300.0, n_riders)), 1100).astype(np.int64)
    signup = np.maximum(first - before.astype("timedelta64[D]"), _FIRST_SIGNUP)
    riders = {
        "rider_id": np.arange(1, n_riders + 1, dtype=np.int64),
        "signup_date": signup.astype("datetime64[s]"),
        "home_city": home,
        "membership": (rng.random(n_riders) < 0.2).astype(np.uint8),
    }

    driver_id = np.unique(trips["driver_id"])
    city_of = np.zeros(int(driver_id.max()) + 1, dtype=np.uint8)
    city_of[trips["driver_id"]] = trips["city"]  # one city per driver
    n_drivers = len(driver_id)
    rating = np.round(np.clip(rng.normal(4.75, 0.15, n_drivers), 3.5, 5.0), 2)
    drivers = {
        "driver_id": driver_id.astype(np.int64),
        "city": city_of[driver_id],
        "vehicle": rng.choice(len(VEHICLES), size=n_drivers, p=_VEHICLE_WEIGHTS).astype(np.uint8),
        "rating": rating,
    }
    return riders, drivers


def _list_sql(names: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{n}'" for n in names) + "]"


def _selects(city_names: tuple[str, ...]) -> tuple[str, str]:
    cities = _list_sql(city_names)
    riders = (f"SELECT rider_id, CAST(signup_date AS DATE) AS signup_date, "
              f"({cities})[home_city + 1] AS home_city, "
              f"({_list_sql(MEMBERSHIPS)})[membership + 1] AS membership FROM _chorus_demo_riders")
    drivers = (f"SELECT driver_id, ({cities})[city + 1] AS city, "
               f"({_list_sql(VEHICLES)})[vehicle + 1] AS vehicle, rating "
               "FROM _chorus_demo_drivers")
    return riders, drivers


def load_people_duckdb(con: duckdb.DuckDBPyConnection, riders: dict[str, np.ndarray],
                       drivers: dict[str, np.ndarray], city_names: tuple[str, ...]) -> None:
    """Create (or replace) ``riders`` and ``drivers`` in an open DuckDB connection."""
    riders_sql, drivers_sql = _selects(city_names)
    con.register("_chorus_demo_riders", riders)
    con.register("_chorus_demo_drivers", drivers)
    try:
        con.execute("CREATE OR REPLACE TABLE riders (rider_id BIGINT, signup_date DATE, "
                    "home_city VARCHAR, membership VARCHAR)")
        con.execute(f"INSERT INTO riders {riders_sql}")
        con.execute("CREATE OR REPLACE TABLE drivers (driver_id BIGINT, city VARCHAR, "
                    "vehicle VARCHAR, rating DOUBLE)")
        con.execute(f"INSERT INTO drivers {drivers_sql}")
    finally:
        con.unregister("_chorus_demo_riders")
        con.unregister("_chorus_demo_drivers")


def load_people_postgres(url: str, riders: dict[str, np.ndarray], drivers: dict[str, np.ndarray],
                         city_names: tuple[str, ...]) -> None:
    """Replace ``riders`` and ``drivers`` in the Postgres database at ``url`` (COPY, keys)."""
    import psycopg  # imported here: the DuckDB demo must not need a Postgres driver at runtime

    mem = duckdb.connect()
    try:  # the same SQL turns the arrays into rows as for DuckDB, then CSV text for COPY
        load_people_duckdb(mem, riders, drivers, city_names)
        texts = []
        for table in ("riders", "drivers"):
            out = io.StringIO()
            for row in mem.execute(f"SELECT * FROM {table}").fetchall():
                out.write(",".join(str(v) for v in row) + "\n")
            texts.append(out.getvalue())
    finally:
        mem.close()
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS riders; DROP TABLE IF EXISTS drivers; "
                    "CREATE TABLE riders (rider_id BIGINT PRIMARY KEY, signup_date DATE NOT NULL, "
                    "home_city TEXT NOT NULL, membership TEXT NOT NULL); "
                    "CREATE TABLE drivers (driver_id BIGINT PRIMARY KEY, city TEXT NOT NULL, "
                    "vehicle TEXT NOT NULL, rating DOUBLE PRECISION NOT NULL)")
        for table, text in zip(("riders", "drivers"), texts, strict=True):
            with cur.copy(f"COPY {table} FROM STDIN (FORMAT csv)") as copy:
                copy.write(text)
        cur.execute("ANALYZE riders")
        cur.execute("ANALYZE drivers")
