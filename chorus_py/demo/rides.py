"""The demo data set behind ``chorus demo``: a synthetic ride-sharing database and its policy.

:func:`generate_demo` builds these tables (and the papers of :mod:`chorus_py.demo.papers`)
and writes ``DIR/policy.toml`` describing them:

``trips`` (private; one row per ride, the privacy unit is the rider)
    ``trip_id BIGINT`` 1..N in pickup order, ``rider_id BIGINT``, ``driver_id BIGINT``,
    ``city TEXT``, ``pickup_time TIMESTAMP`` (without time zone), ``fare DOUBLE``,
    ``distance_km DOUBLE``.
``cities`` (public)
    ``city TEXT``, ``state TEXT``, ``population BIGINT`` for the five cities.
``riders`` and ``drivers`` (private; one row per rider / driver of the trips)
    derived from the trips by :mod:`chorus_py.demo.people` (consistent foreign keys).

Distributions (all drawn from one ``numpy.random.Generator`` seeded with ``seed``, so a given
``(seed, rows)`` always yields the same rows):

- trips per rider: ``round(exp(ln 5 + 1.1 Z))`` clipped to 1..200 (median 5, mean about 9, a long
  tail: a few riders hit the cap of 200); riders are drawn until their trips reach N, the last
  rider's count is cut to fit, so the number of riders follows from N (about N / 9).
- city: each rider has a home city (SF 28%, NYC 34%, LA 20%, CHI 11%, SEA 7%); 95% of a rider's
  trips are in the home city, the rest anywhere with the same weights.
- drivers: about N / 200, split among the cities by the same weights, ids shuffled; a driver's
  share of its city's trips is lognormal (sigma 0.7), so a few drivers are very busy.
- pickup_time: whole seconds in [2026-01-01 00:00:00, 2026-04-01 00:00:00), i.e. exactly 90 days;
  every day has trips (when N >= 90); Fridays and Saturdays are busier, traffic grows about 10%
  over the quarter, the time of day mixes a morning peak (8:30), an evening peak (18:00) and a
  flat background.
- distance_km: lognormal around a per-city median (NYC 3.5 km .. LA 7 km, sigma 0.75), clipped to
  0.1..100, rounded to 10 m.
- fare: ``(booking fee + base + per_km * distance) * surge * lognormal noise`` (surge 1.2..2.5 on
  15% of trips), at least the city's minimum fare, rounded to cents; 0.1% of trips carry an extra
  fee of 150..350 (cleaning, tolls, long waits) so that clipping at the policy bound of 200
  matters. Every stored fare is <= 500.

Rows are generated as numpy arrays and handed to DuckDB as a dict of arrays (no pandas, no
pyarrow). For Postgres the rows go through an in-memory DuckDB, out to a temporary CSV file and
into Postgres with ``COPY ... FROM STDIN``.
"""

from __future__ import annotations

import json
import math
import pathlib
import tempfile
import time
from collections.abc import Callable

import duckdb
import numpy as np

from chorus_py.demo.papers import (
    demo_paper_count,
    generate_papers,
    load_papers_duckdb,
    load_papers_postgres,
)
from chorus_py.demo.people import generate_people, load_people_duckdb, load_people_postgres
from chorus_py.errors import InvalidParameter, OperationalError

__all__ = ["CITIES", "DEFAULT_ROWS", "DEFAULT_SEED", "generate_demo", "generate_trips"]

DEFAULT_ROWS = 1_000_000
DEFAULT_SEED = 20261130

#: (city, state, population (US Census 2023 estimates, rounded), share of riders)
CITIES: tuple[tuple[str, str, int, float], ...] = (
    ("SF", "CA", 808_000, 0.28),
    ("NYC", "NY", 8_258_000, 0.34),
    ("LA", "CA", 3_821_000, 0.20),
    ("CHI", "IL", 2_664_000, 0.11),
    ("SEA", "WA", 755_000, 0.07),
)
CITY_NAMES = tuple(c[0] for c in CITIES)
_CITY_WEIGHTS = np.array([c[3] for c in CITIES])
# per city: median trip distance (km), base fare, price per km, minimum fare (USD)
_MEDIAN_KM = np.array([4.0, 3.5, 7.0, 5.0, 5.5])
_BASE_FARE = np.array([3.0, 3.5, 2.5, 2.5, 2.8])
_PER_KM = np.array([2.2, 2.6, 1.8, 1.9, 2.0])
_MIN_FARE = np.array([8.0, 9.0, 7.0, 7.0, 7.5])
_BOOKING_FEE = 2.5

START = np.datetime64("2026-01-01T00:00:00", "s")
DAYS = 90
MAX_TRIPS_PER_RIDER = 200
MAX_FARE = 500.0

Progress = Callable[[str, float], None]


def _no_progress(message: str, fraction: float) -> None:
    return None


# ---------------------------------------------------------------------------------------------
# generation


def _trips_per_rider(rng: np.random.Generator, rows: int) -> np.ndarray:
    """Trips per rider: a discretised lognormal (median 5) clipped to 1..200, summing to rows."""
    chunks: list[np.ndarray] = []
    total = 0
    while total < rows:
        # the clipped mean is about 9; ask for a little more than needed, then cut.
        size = max(64, math.ceil((rows - total) / 8))
        draw = np.rint(np.exp(math.log(5.0) + 1.1 * rng.standard_normal(size)))
        draw = np.clip(draw, 1, MAX_TRIPS_PER_RIDER).astype(np.int64)
        chunks.append(draw)
        total += int(draw.sum())
    counts = np.concatenate(chunks)
    cum = np.cumsum(counts)
    last = int(np.searchsorted(cum, rows))  # first rider whose cumulative count reaches rows
    counts = counts[: last + 1].copy()
    counts[-1] -= int(cum[last]) - rows  # >= 1 because cum[last - 1] < rows
    return counts


def generate_trips(rows: int = DEFAULT_ROWS, seed: int = DEFAULT_SEED) -> dict[str, np.ndarray]:
    """The ``trips`` rows as numpy arrays, sorted by pickup time (``trip_id`` 1..rows).

    ``city`` is a ``uint8`` index into :data:`CITY_NAMES` and ``pickup_time`` is
    ``datetime64[s]``; the loaders turn them into TEXT and TIMESTAMP.
    """
    if rows < 1:
        raise InvalidParameter(f"rows must be at least 1, got {rows}")
    rng = np.random.default_rng(seed)
    n_cities = len(CITIES)

    # riders and their trips
    counts = _trips_per_rider(rng, rows)
    n_riders = len(counts)
    rider_id = np.repeat(np.arange(1, n_riders + 1, dtype=np.int64), counts)

    # city: the rider's home city 95% of the time
    home = rng.choice(n_cities, size=n_riders, p=_CITY_WEIGHTS).astype(np.uint8)
    city = home[rider_id - 1]
    away = rng.random(rows) < 0.05
    city[away] = rng.choice(n_cities, size=int(away.sum()), p=_CITY_WEIGHTS).astype(np.uint8)

    # drivers: about rows / 200, per city, with skewed activity; ids shuffled across cities
    n_drivers = max(1, round(rows / 200))
    per_city = np.maximum(1, np.rint(n_drivers * _CITY_WEIGHTS)).astype(np.int64)
    id_of_slot = rng.permutation(int(per_city.sum())).astype(np.int64) + 1
    activity = rng.lognormal(0.0, 0.7, size=int(per_city.sum()))
    driver_id = np.empty(rows, dtype=np.int64)
    first_slot = np.concatenate(([0], np.cumsum(per_city)))
    for c in range(n_cities):
        in_city = np.flatnonzero(city == c)
        lo, hi = int(first_slot[c]), int(first_slot[c + 1])
        w = activity[lo:hi] / activity[lo:hi].sum()
        driver_id[in_city] = id_of_slot[lo + rng.choice(hi - lo, size=len(in_city), p=w)]

    # pickup day: weekday pattern (2026-01-01 is a Thursday) and slow growth; every day used
    day = np.arange(DAYS)
    weekday = (day + 3) % 7  # 0 = Monday
    day_w = np.where(weekday == 4, 1.3, np.where(weekday == 5, 1.35, 1.0))
    day_w = np.where(weekday == 6, 1.1, day_w) * (1.0 + 0.1 * day / (DAYS - 1))
    days = rng.choice(DAYS, size=rows, p=day_w / day_w.sum())
    days[: min(rows, DAYS)] = np.arange(min(rows, DAYS))
    # time of day: morning peak, evening peak, flat background (in seconds, wrapped to a day)
    kind = rng.choice(3, size=rows, p=[0.3, 0.4, 0.3])
    tod = np.where(
        kind == 0,
        rng.normal(8.5 * 3600, 1.2 * 3600, rows),
        np.where(kind == 1, rng.normal(18 * 3600, 2.0 * 3600, rows), rng.uniform(0, 86400, rows)),
    )
    seconds = days.astype(np.int64) * 86400 + np.floor(tod).astype(np.int64) % 86400

    # distance and fare
    distance = rng.lognormal(np.log(_MEDIAN_KM[city]), 0.75)
    distance = np.round(np.clip(distance, 0.1, 100.0), 2)
    surge = np.where(rng.random(rows) < 0.15, rng.uniform(1.2, 2.5, rows), 1.0)
    fare = (_BOOKING_FEE + _BASE_FARE[city] + _PER_KM[city] * distance) * surge
    fare *= rng.lognormal(0.0, 0.08, rows)
    fare = np.maximum(fare, _MIN_FARE[city])
    extra = rng.random(rows) < 0.001
    fare[extra] += rng.uniform(150.0, 350.0, int(extra.sum()))
    fare = np.round(np.minimum(fare, MAX_FARE), 2)

    order = np.argsort(seconds, kind="stable")
    return {
        "trip_id": np.arange(1, rows + 1, dtype=np.int64),
        "rider_id": rider_id[order],
        "driver_id": driver_id[order],
        "city": city[order],
        "pickup_time": START + seconds[order],
        "fare": fare[order],
        "distance_km": distance[order],
    }


# ---------------------------------------------------------------------------------------------
# loading

_CITY_LIST_SQL = "[" + ", ".join(f"'{c}'" for c in CITY_NAMES) + "]"
_TRIPS_SELECT = f"""
    SELECT trip_id, rider_id, driver_id, ({_CITY_LIST_SQL})[city + 1] AS city,
           CAST(pickup_time AS TIMESTAMP) AS pickup_time, fare, distance_km
    FROM _chorus_demo_trips
"""
_CITIES_VALUES = ", ".join(f"('{c}', '{s}', {p})" for c, s, p, _ in CITIES)


def _load_duckdb(con: duckdb.DuckDBPyConnection, trips: dict[str, np.ndarray]) -> None:
    """Create (or replace) ``trips`` and ``cities`` in an open DuckDB connection."""
    con.register("_chorus_demo_trips", trips)
    try:
        con.execute(
            """CREATE OR REPLACE TABLE trips (
                 trip_id BIGINT, rider_id BIGINT, driver_id BIGINT, city VARCHAR,
                 pickup_time TIMESTAMP, fare DOUBLE, distance_km DOUBLE)"""
        )
        con.execute(f"INSERT INTO trips {_TRIPS_SELECT}")
    finally:
        con.unregister("_chorus_demo_trips")
    con.execute("CREATE OR REPLACE TABLE cities (city VARCHAR, state VARCHAR, population BIGINT)")
    con.execute(f"INSERT INTO cities VALUES {_CITIES_VALUES}")


_PG_DDL = """
DROP TABLE IF EXISTS trips;
DROP TABLE IF EXISTS cities;
CREATE TABLE trips (
    trip_id     BIGINT NOT NULL,
    rider_id    BIGINT NOT NULL,
    driver_id   BIGINT NOT NULL,
    city        TEXT NOT NULL,
    pickup_time TIMESTAMP WITHOUT TIME ZONE NOT NULL,
    fare        DOUBLE PRECISION NOT NULL,
    distance_km DOUBLE PRECISION NOT NULL
);
CREATE TABLE cities (city TEXT PRIMARY KEY, state TEXT NOT NULL, population BIGINT NOT NULL);
"""


def _load_postgres(url: str, trips: dict[str, np.ndarray], progress: Progress) -> None:
    """Replace ``trips`` and ``cities`` in the Postgres database at ``url`` (COPY, then indexes)."""
    import psycopg  # imported here: the DuckDB demo must not need a Postgres driver at runtime

    with tempfile.TemporaryDirectory(prefix="chorus-demo-") as tmp:
        csv_path = pathlib.Path(tmp) / "trips.csv"
        mem = duckdb.connect()
        try:
            _load_duckdb(mem, trips)
            mem.execute(f"COPY trips TO '{csv_path.as_posix()}' (FORMAT csv, HEADER false)")
        finally:
            mem.close()
        progress("loading trips into Postgres", 0.5)

        try:
            conn = psycopg.connect(url, autocommit=False)
        except psycopg.Error as e:
            raise OperationalError(
                f"cannot connect to the demo backend: {e}".strip(),
                hint="check the --backend URL; the database must already exist",
            ) from e
        with conn:
            with conn.cursor() as cur:
                cur.execute(_PG_DDL)
                with (
                    cur.copy("COPY trips FROM STDIN (FORMAT csv)") as copy,
                    csv_path.open("rb") as f,
                ):
                    while chunk := f.read(1 << 20):
                        copy.write(chunk)
                cur.execute(f"INSERT INTO cities VALUES {_CITIES_VALUES}")
                progress("indexing trips", 0.8)
                cur.execute("ALTER TABLE trips ADD PRIMARY KEY (trip_id)")
                # min/max(pickup_time) and block (time-window) filters use this index
                cur.execute("CREATE INDEX trips_pickup_time_idx ON trips (pickup_time)")
            conn.commit()
            # VACUUM sets the visibility map (index-only scans) and ANALYZE the planner statistics
            conn.autocommit = True
            conn.execute("VACUUM (ANALYZE) trips")
            conn.execute("ANALYZE cities")


# ---------------------------------------------------------------------------------------------
# policy

_POLICY = """\
# Chorus policy for the demo ride-sharing data (written by `chorus demo`).
#
# This file tells the Chorus proxy where the data lives, how much privacy budget may be spent,
# and what it may assume about every table and column. Analysts never see it; they send plain SQL
# and get back noisy aggregates. Edit it with care: the bounds below are promises the proxy
# relies on to calibrate noise.

[backend]
# The database the proxy forwards rewritten queries to: "duckdb:///demo.duckdb" for an embedded
# DuckDB file next to this policy (four slashes, "duckdb:////abs/path.duckdb", for an absolute
# path), or "postgresql://user@host:port/db" for Postgres.{backend_note}
url = {url}
# Queries running longer are cancelled (and charged: the data was read).
statement_timeout_seconds = 300
# Postgres only: where queries that read only public tables run, as a role that can read the
# public tables and nothing else (checked at start: docs/owner-guide.md, "Least privilege").
# Unset: they run on the main connection, with a warning at start.
#   public_url = "postgresql://chorus_public_reader@db.example:5432/rides"
# Or url = "spark://local": an in-process Apache Spark (pip install 'chorus-py[spark]', Java 17)
# reading Parquet files, with a [backend.spark] table (docs/owner-guide.md, "When one machine is
# not enough"); the proxy then adds the noise (privacy.noise = "proxy", the only choice there).
#   [backend.spark]
#   tables = {{ trips = "parquet/trips.parquet" }}  # table -> Parquet file or directory
#   warehouse = "parquet"                         # or: every <name>.parquet in a directory
#   private_dir = "spark-private"                 # stored samples (owner-only; default:
#                                                 # <policy file name>.spark-private)
#   cores = 0                                     # local[N]; 0: every core
#   shuffle_partitions = 4                        # spark.sql.shuffle.partitions

[privacy]
# Budget of every private block (here: one day of trips). Every query that reads a day is
# charged against that day; once a day has spent epsilon_per_block, queries over it are refused.
# delta_per_block is the matching budget of delta (the small chance the epsilon guarantee fails).
epsilon_per_block = 10.0
delta_per_block = 1e-6
# How charges add up: "basic" (epsilons simply add) or "renyi" (Rényi-DP curves add up, so many
# small queries cost less; needs delta_per_block > 0).
accounting = "basic"
# With "renyi": the share of delta_per_block that pays for the queries' own deltas (group keys
# released by thresholding); the rest converts the Rényi guarantee back to (epsilon, delta).
renyi_delta_share = 0.5
# How queries (claims on blocks) are granted:
#   "fcfs"  at once, when every block the query reads has budget left;
#   "dpf-n" Dominant Private block Fairness: a new block starts locked and each query that reads
#           it unlocks 1/n of its budget, so the first n queries each get a fair share; waiting
#           queries are granted smallest dominant share first.  Example:
#           scheduler = {{ policy = "dpf-n", n = 100, wait_seconds = 5 }}
#   "dpf-t" DPF over time: every tick, each block unlocks epsilon_per_block * tick / lifetime.
#           Example: scheduler = {{ policy = "dpf-t", lifetime = "30d", tick = "1h" }}
# wait_seconds: how long a query that does not fit yet waits for budget (0: refuse at once); a
# query may ask for its own wait, up to max_wait_seconds.
scheduler = {{ policy = "fcfs", wait_seconds = 0, max_wait_seconds = 60 }}
# The budget ledger: a SQLite file next to this policy (every charge survives restarts and is
# journaled; `chorus budget --policy FILE` shows it), "memory" (lost on exit), or
# "postgresql://user@host/db" for one ledger shared by several proxies.
ledger = "sqlite:///budget.sqlite3"
# Seconds during which an identical query (same SQL, epsilon, delta and blocks) gets the same
# noisy answer again for free (dashboards that refresh); 0 turns this off. Within that time a
# changed row in an old block is not reflected.
answer_cache_seconds = 0
# What one query costs when the analyst does not ask for a specific epsilon / delta.
default_epsilon = 0.5
default_delta = 1e-8
# The most a single query may ask for; larger requests are refused before anything is spent.
max_epsilon_per_query = 2.0
# The least a single query may ask for (default 0.001): probing with tiny queries is never
# nearly free. An analyst's own max_epsilon_per_query must not be below it.
min_epsilon_per_query = 0.001
max_delta_per_query = 1e-6
{noise}
# Share of a query's epsilon spent on the noisy count that decides which group keys without
# public_values may be released (unless the query itself counts distinct riders per group).
threshold_epsilon_share = 0.2
# Share of a query's epsilon spent choosing its own cap of trips per rider (contribution = "auto")
# and the clipping bounds of its sums and averages (clipping = "auto"), split equally among the
# noisy histograms it runs; the report lists each part, and the parts add up to the epsilon charged.
cap_epsilon_share = 0.1
# Seconds during which those choices are reused by identical queries (same SQL, epsilon, delta
# and blocks; dashboards that refresh): they are noisy outputs already paid for, so the next run
# spends all of its epsilon on the answer and runs no histogram. 0: choose again every time.
choice_reuse_seconds = 600
# Sensitivity sampling (random DP): a query whose sensitivity cannot be derived (a MEDIAN, a sum
# of LN(1 + x), a column without bounds) may opt in per query (`SET chorus.sensitivity =
# 'sampled'`, `--sensitivity sampled`); "sampled" here makes it every analyst's default. Its
# answer is (epsilon, delta, gamma)-random DP: gamma is the chance the guarantee fails over
# databases drawn from the table's sampling distribution P; analysts may ask for at most
# max_gamma. sampling_m databases are drawn (more when gamma needs it). A table can be sampled
# when its P is named (with one privacy_unit column: neighbours differ in one unit's
# max_rows_per_unit rows; rows of several units are refused), e.g. for an event-level table:
#   [tables.visits.sampling]
#   rows = 100000                        # n, the size of the drawn databases (public)
#   reference = "visits_reference"       # a public table of similar rows; or, per column:
#   columns.seconds = {{ distribution = "lognormal", mean = 4, sd = 1 }}
#   columns.page = {{ distribution = "choice", values = ["home", "blog"], weights = [3, 1] }}
# (distributions: uniform lower/upper, normal and lognormal mean/sd, exponential mean, choice
# values/weights; columns not listed are drawn uniformly from their lower/upper or public_values).
sensitivity = "analytic"
default_gamma = 0.05
max_gamma = 0.05
sampling_m = 2000

[tables.trips]
# The individual being protected: adding or removing all trips of one rider changes any answer
# by at most the noise-calibrated amount.
privacy_unit = "rider_id"
# Contribution bound: the most trips of one rider any query may see (demo riders have 1 to 200).
max_rows_per_unit = 200
# "auto": each query chooses its own cap k <= 200 from a noisy histogram of trips per rider,
# trading dropped trips (bias) against noise, with cap_epsilon_share of its epsilon. A GROUP BY
# on keys without public_values also keeps each rider's trips in at most g groups (g from a
# noisy histogram of groups per rider), so its key-release threshold grows with g, not k.
# "fixed": every query uses max_rows_per_unit (a cap that is too small biases every COUNT down).
contribution = "auto"
# "auto": each SUM/AVG/VARIANCE/STDDEV clips values to bounds it chooses inside the declared
# [lower, upper] from a noisy histogram of their magnitudes (most fares are far below 200, so a
# narrower bound means less noise); "fixed": the declared bounds. Unset: "auto" when
# contribution = "auto" on a table with a privacy_unit, else "fixed".
clipping = "auto"
# "per-query": the k trips are drawn among those that pass each query's filter (most accurate).
# "materialized": one random ranking of each rider's trips is stored in the proxy's schema and
# reused by every query (much faster on large tables; filtered answers keep fewer trips of heavy
# riders). It is rebuilt when the table changes.
bounding = "per-query"
# With "per-query": the proxy keeps a copy of the trips in its schema, each with its random rank
# among its rider's trips and the rider's count, so riders with at most k trips are kept whole
# without sorting (same answers, several times faster; costs the table's size, rebuilt in the
# background when the table changes). false: every query ranks its filtered trips itself.
ranked_copy = true
# Private blocks: the table is cut into one-day windows of pickup_time, each with its own budget,
# on a public schedule: the demo's quarter, [start, end) in UTC (without end: up to today).
# Blocks never come from the data; trips outside the schedule belong to no block, never read.
# Other sizes: "1 hour", "1 week" (weeks begin on week_start, "monday" by default: ISO weeks,
# ids like 2026-W03), "1 month" (calendar months, ids like 2026-01), "3 months", "1 year".
# The ledger keeps the cut it was made with: changing size or week_start later needs a new ledger.
block = {{ column = "pickup_time", size = "1 day", start = "{block_start}", end = "{block_end}" }}

[tables.trips.columns]
# Every column an analyst may use. "lower"/"upper" clip values before summing or averaging (they
# bound how much one row can move a SUM); "public_values" lists the only group-by keys released
# without thresholding; "private_id" marks an identifier of individuals: it may be filtered on
# or counted with COUNT(DISTINCT ...), never grouped by or released. For joins, "max_frequency"
# pins an upper bound on the rows sharing one value of a column (otherwise read from the data).
trip_id     = {{ type = "int" }}
rider_id    = {{ type = "int", private_id = true }}
driver_id   = {{ type = "int" }}
city        = {{ type = "text", public_values = ["SF", "NYC", "LA", "CHI", "SEA"] }}
pickup_time = {{ type = "timestamp" }}
fare        = {{ type = "float", lower = 0, upper = 200 }}   # about 0.1% of fares exceed 200
distance_km = {{ type = "float", lower = 0, upper = 100 }}

[tables.riders]
# One row per rider (every trips.rider_id has one). The same privacy unit as trips, so trips
# JOIN riders ON rider_id is allowed: one rider's trips and row change together, and the join's
# sensitivity follows from both limits (elastic sensitivity, see the analyst guide). A table
# without a block is charged as one block named after it.
privacy_unit = "rider_id"
max_rows_per_unit = 1
contribution = "fixed"

[tables.riders.columns]
rider_id    = {{ type = "int", private_id = true }}
signup_date = {{ type = "date" }}
home_city   = {{ type = "text", public_values = ["SF", "NYC", "LA", "CHI", "SEA"] }}
membership  = {{ type = "text", public_values = ["standard", "plus"] }}

[tables.drivers]
# One row per driver, private at event level (no privacy_unit): a neighbouring database adds or
# removes one row, i.e. one driver. It joins public tables (cities) but not trips: a join of
# tables protected at different levels (riders there, single rows here) is refused.
[tables.drivers.columns]
# max_frequency: the data owner guarantees one row per driver_id (a primary key), so a join on
# it needs no read of the data and its sensitivity can be shown.
driver_id = {{ type = "int", private_id = true, max_frequency = 1 }}
city      = {{ type = "text", public_values = ["SF", "NYC", "LA", "CHI", "SEA"] }}
vehicle   = {{ type = "text", public_values = ["sedan", "suv", "ev", "van"] }}
rating    = {{ type = "float", lower = 1, upper = 5 }}

[tables.papers]
# A paper belongs to all its authors (the co-authorship data of chorus_py/demo/papers.py): the
# privacy unit is an attribution table of (paper, author) pairs, which analysts cannot read.
privacy_unit = {{ table = "paper_authors", row_id = "paper_id", unit_id = "author_id" }}
# At most 3 papers of any author reach a query. With several units per row the proxy stores one
# set S of kept papers (every author <= 3 of them), chosen from the authorship alone, never from
# the papers' contents; queries read S (contribution is "fixed", bounding "materialized").
# `chorus bound --policy policy.toml --table papers` shows the data owner how many papers S keeps.
max_rows_per_unit = 3
# How S is chosen: "greedy" (random order, keep a paper while all its authors are below 3),
# "greedy-sparse" (the same, papers of rarely seen authors first: close to the largest S, more
# biased towards papers with few authors), "sql-rank" (inside the database: keep a paper ranked
# <= 3 by every author; fewer papers), "greedy-balanced" (alternate c1 papers with <= u authors
# and c2 with more: less bias, e.g. attribution_balance = {{ u = 3, c1 = 1, c2 = 2 }}), "ilp"
# (the exact optimum, small tables). The other form lists unit columns of the table itself, with
# a unique int row_id: privacy_unit = ["rider_id", "driver_id"] and row_id = "trip_id" protect
# both people of a trip (a value names the same unit in either column).
attribution_method = "greedy"

[tables.papers.columns]
paper_id  = {{ type = "int" }}
field     = {{ type = "text", public_values = ["cs", "physics", "math", "bio", "econ"] }}
year      = {{ type = "int" }}
citations = {{ type = "float", lower = 0, upper = 500 }}

[tables.cities]
# A public table: not about individuals, readable and joinable without spending budget.
public = true

[analysts.demo]
# Each analyst is charged separately in the report. An analyst may have a lower per-query limit:
max_epsilon_per_query = 2.0
# ... and a limit on their total spending on any one block (unset here: only the block's own
# budget limits them), e.g. max_epsilon_per_block = 5.0
# The analyst's REST bearer token, stored only as its SHA-256 (the demo token is "demo-token").
# Make a real one with `chorus token add --policy policy.toml demo`, which prints it once and
# writes its SHA-256 here.  A list of digests (token_sha256 = ["...", "..."]) accepts any of
# them: a token is rotated by adding the new one, then `chorus token revoke ... --oldest`.
token_sha256 = "7c43ef5ae21d43ce2743f770c68e24def1a43ee2f416d2438410c8af7af2ff2c"
# The analyst's wire-protocol password, stored only as a SCRAM-SHA-256 verifier (the demo
# password is "demo": `psql postgresql://demo:demo@127.0.0.1:6432/demo` after `chorus serve`).
# Make one with `chorus passwd`; the proxy never stores or sees the password itself.
password = "{demo_verifier}"

[server]
# SHA-256 of the data owner's token (the demo token is "demo-owner-token"). It opens the budget
# dashboard (/dashboard), Prometheus metrics (/metrics) and every analyst's budget over REST;
# without it they stay closed.
owner_token_sha256 = "4debe29c288e310c69d6a70c402c670b3127466f4d4b53b870e27eaebfe86ed2"
# Postgres wire protocol (`chorus serve`). TLS is offered when both a PEM certificate and its
# key are given (paths relative to this file), e.g.
#   tls_cert = "server.crt"
#   tls_key = "server.key"
# tls = "require" refuses every client that did not start TLS (sslmode=require or stronger);
# "optional" (the default) lets the client choose. "require" needs tls_cert and tls_key.
#   tls = "require"
# Connections beyond max_connections are refused; a client must log in within
# login_timeout_seconds and is disconnected after idle_timeout_seconds without a query.
max_connections = 100
login_timeout_seconds = 30
idle_timeout_seconds = 3600
# Statements running longer are cancelled (and charged once the database started reading).
# Unset: backend.statement_timeout_seconds.
#   statement_timeout_seconds = 300

# Bounded cost (wall 8): how large a query may be and how much work it may ask per row, so that
# no CASE branch one person's row takes can be made much slower than another.  Each refusal names
# its key.  The defaults suit most uses.
[limits]
max_sql_chars = 100000         # characters of SQL text in one query
max_literal_chars = 1024       # characters of one string or number literal
max_expression_nodes = 2000    # syntax nodes of one statement
max_expression_depth = 64      # how deeply they may nest
max_row_cost = 100000          # work units per row of one row-level expression (every branch)
text_column_chars = 256        # characters a text column counts for in that cost
"""


# SCRAM-SHA-256 verifier of the demo analyst's password "demo" (`chorus passwd`).
_DEMO_VERIFIER = ("SCRAM-SHA-256$4096:ld6T5EzDBylR7FPnbM4SLw==$vCZ/Clp1G7Wy3wwKHmJYt3vaM/2TPMy4"
                  "561gLb2Xb1o=:4fTptsr6G6GLpmL6sQMRS9CA9yG7PwhxGOLwJ4ZpR00=")


def _toml_string(value: str) -> str:
    # A JSON string is a valid TOML basic string (same escapes), and json.dumps escapes
    # every character TOML requires escaped.
    return json.dumps(value)


# Where the noise is drawn ("sql": by the database; "proxy": by the proxy, from os.urandom).
_NOISE_POSTGRES = ('noise = "sql"            # "sql": the database adds the noise; '
                   '"proxy": Python adds it')
_NOISE_DUCKDB = (
    '# "proxy": Python adds the noise (from os.urandom), "sql": the database does. DuckDB runs\n'
    "# inside the proxy's process, so its exact aggregates are in the proxy's memory either way;\n"
    "# the proxy draws noise from a cryptographic source and spares DuckDB its noise expressions.\n"
    'noise = "proxy"')


def render_policy(url: str, backend_note: str = "") -> str:
    """The demo policy text for a backend URL."""
    note = f"\n# {backend_note}" if backend_note else ""
    end = START + np.timedelta64(DAYS, "D")
    return _POLICY.format(url=_toml_string(url), backend_note=note,
                          noise=_NOISE_POSTGRES if url.startswith("postgres") else _NOISE_DUCKDB,
                          demo_verifier=_DEMO_VERIFIER,
                          block_start=str(START.astype("datetime64[D]")),
                          block_end=str(end.astype("datetime64[D]")))


# ---------------------------------------------------------------------------------------------
# entry point


def generate_demo(
    directory: pathlib.Path,
    backend_url: str | None = None,
    rows: int = DEFAULT_ROWS,
    seed: int = DEFAULT_SEED,
    progress: Callable[[str, float], None] | None = None,
) -> pathlib.Path:
    """Create the demo data and write DIR/policy.toml; return the policy path.

    With ``backend_url`` None the tables go into ``DIR/demo.duckdb`` (existing ``trips`` and
    ``cities`` tables are replaced, other tables are kept). With a ``postgresql://`` (or
    ``postgres://``) URL they are created in that existing database, replacing any tables of the
    same names. ``progress(message, fraction)`` is called as the work advances (fraction 0..1).
    The data depends only on ``rows`` and ``seed``.
    """
    report: Progress = progress or _no_progress
    if rows < 1:
        raise InvalidParameter(f"--rows must be at least 1, got {rows}")
    if backend_url is not None and not backend_url.startswith(("postgresql://", "postgres://")):
        raise InvalidParameter(
            f"unsupported demo backend URL {backend_url!r}",
            hint="give a postgresql://user@host:port/db URL, or no --backend for DuckDB",
        )
    directory = pathlib.Path(directory).expanduser().resolve()
    directory.mkdir(parents=True, exist_ok=True)

    started = time.perf_counter()
    report(f"generating {rows:,} trips (seed {seed})", 0.0)
    trips = generate_trips(rows, seed)
    papers, paper_authors = generate_papers(demo_paper_count(rows), seed)
    riders, drivers = generate_people(trips, len(CITY_NAMES), seed)
    n_riders = int(trips["rider_id"].max())

    if backend_url is None:
        db_path = directory / "demo.duckdb"
        report(f"loading into {db_path}", 0.4)
        con = duckdb.connect(str(db_path))
        try:
            _load_duckdb(con, trips)
            load_papers_duckdb(con, papers, paper_authors)
            load_people_duckdb(con, riders, drivers, CITY_NAMES)
            con.execute("CHECKPOINT")
        finally:
            con.close()
        url = "duckdb:///demo.duckdb"  # relative to the policy file next to it
        note = ""
    else:
        report("loading into Postgres", 0.4)
        _load_postgres(backend_url, trips, report)
        load_papers_postgres(backend_url, papers, paper_authors)
        load_people_postgres(backend_url, riders, drivers, CITY_NAMES)
        url = backend_url
        note = "A password may also come from the environment (PGPASSWORD, ~/.pgpass)."

    policy_path = directory / "policy.toml"
    policy_path.write_text(render_policy(url, note), encoding="utf-8")
    # New data, new budget: a ledger left by an earlier run describes data that is gone.
    for stale in ("budget.sqlite3", "budget.sqlite3-wal", "budget.sqlite3-shm"):
        (directory / stale).unlink(missing_ok=True)
    elapsed = time.perf_counter() - started
    report(
        f"done: {rows:,} trips of {n_riders:,} riders in {elapsed:.1f} s; policy at {policy_path}",
        1.0,
    )
    return policy_path


# The tables generate_demo writes (replacing them): the trips and cities, the papers and their
# authors, the riders and drivers.
DEMO_TABLES = ("trips", "cities", "papers", "paper_authors", "riders", "drivers")


def demo_loaded(directory: pathlib.Path, backend_url: str | None = None) -> bool:
    """True when every demo table exists and holds rows (``chorus demo --if-empty`` then loads
    nothing): in the Postgres database of ``backend_url``, else in ``DIR/demo.duckdb``.  A load
    cut short leaves a table missing or empty, so it is loaded again in full."""
    if backend_url is None:
        path = pathlib.Path(directory).expanduser() / "demo.duckdb"
        if not path.is_file():
            return False
        con = duckdb.connect(str(path), read_only=True)
        try:
            present = {r[0] for r in con.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = current_schema()").fetchall()}
            return all(t in present and con.execute(
                f"SELECT EXISTS (SELECT 1 FROM {t})").fetchone() == (True,)
                for t in DEMO_TABLES)
        finally:
            con.close()
    import psycopg

    try:
        with psycopg.connect(backend_url, connect_timeout=10) as con:
            for table in DEMO_TABLES:
                if con.execute("SELECT to_regclass(%s) IS NOT NULL",
                               [table]).fetchone() != (True,):
                    return False
                if con.execute(f"SELECT EXISTS (SELECT 1 FROM {table})").fetchone() != (True,):
                    return False
    except psycopg.Error as err:
        raise OperationalError(f"cannot read the demo tables at {backend_url}: {err}") from None
    return True
