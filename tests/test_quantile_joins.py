"""DP quantiles over joins (``analyses.quantile_joins``, ``chorus_py.kinds.quantile``) on DuckDB
and Postgres: the exponential mechanism's Delta = S max(p, 1 - p) with S the join rows one
person changes, derived by hand per join; the charge; refusals that cost nothing."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import pytest

from chorus_py.backends import open_backend
from chorus_py.engine import Engine
from chorus_py.errors import NotSupportedError, QueryRefused
from tests.conftest import nothing_spent

# Rider 1 has 40 rides (an outlier: the cap of 3 keeps 3), riders 2..61 have 1 to 3 rides
# (i % 3 + 1).  v = (ride id)^2 / 100 mod 100: skewed.  Every rider has one qj_members row (tier
# gold for even ids, a signup year 2020 + id % 4).  qj_cities is public, city_id unique (city 4,
# in CA, has no ride);
# qj_zones is public with two rows per city_id (mf = 2).
OTHER = ("qj_members", "qj_cities", "qj_zones", "qj_events")
SETUP = [
    *(f"DROP TABLE IF EXISTS {t}" for t in OTHER),
    "CREATE TABLE qj_rides AS SELECT CAST(n AS BIGINT) AS ride_id, CAST(u AS BIGINT) AS "
    "rider_id, CAST(n % 3 + 1 AS BIGINT) AS city_id, CAST((n * n) % 10000 AS DOUBLE PRECISION) "
    "/ 100 AS v FROM (SELECT u * 100 + r AS n, u FROM generate_series(1, 61) AS a(u), "
    "generate_series(1, 40) AS b(r) WHERE u = 1 OR r <= u % 3 + 1) AS s",
    "CREATE TABLE qj_members AS SELECT CAST(u AS BIGINT) AS rider_id, CASE WHEN u % 2 = 0 "
    "THEN 'gold' ELSE 'basic' END AS tier, CAST(2020 + u % 4 AS BIGINT) AS year "
    "FROM generate_series(1, 61) AS a(u)",
    "CREATE TABLE qj_cities (city_id BIGINT, country TEXT)",
    "INSERT INTO qj_cities VALUES (1, 'US'), (2, 'US'), (3, 'MX'), (4, 'CA')",
    "CREATE TABLE qj_zones (city_id BIGINT, zone TEXT)",
    "INSERT INTO qj_zones VALUES (1, 'n'), (1, 's'), (2, 'n'), (2, 's'), (3, 'n'), (3, 's')",
    "CREATE TABLE qj_events AS SELECT CAST(n % 3 + 1 AS BIGINT) AS city_id, "
    "CAST(n AS DOUBLE PRECISION) AS w FROM generate_series(1, 99) AS s(n)",
]
POLICY = """
[backend]
url = "{url}"

[privacy]
epsilon_per_block = 100000
delta_per_block = 1e-3
default_delta = 1e-8
max_epsilon_per_query = 1000
max_delta_per_query = 1e-4

[tables.qj_rides]
privacy_unit = "rider_id"
max_rows_per_unit = 3
contribution = "fixed"
[tables.qj_rides.columns]
ride_id  = {{ type = "int" }}
rider_id = {{ type = "int", private_id = true }}
city_id  = {{ type = "int" }}
v        = {{ type = "float", lower = 0, upper = 100 }}

[tables.qj_members]
privacy_unit = "rider_id"
max_rows_per_unit = 1
contribution = "fixed"
[tables.qj_members.columns]
rider_id = {{ type = "int", private_id = true }}
tier     = {{ type = "text", public_values = ["gold", "basic", "none"] }}
year     = {{ type = "int" }}

[tables.qj_events]
[tables.qj_events.columns]
city_id = {{ type = "int" }}
w       = {{ type = "float", lower = 0, upper = 100 }}

[tables.qj_cities]
public = true
[tables.qj_zones]
public = true

[analysts.alice]
"""
MEMBERS = "FROM qj_rides r JOIN qj_members m ON r.rider_id = m.rider_id "


@pytest.fixture
def rides(scratch: Callable[..., Engine], backend_url: str) -> Iterator[Engine]:
    yield scratch("qj_rides", SETUP, POLICY)
    open_backend(backend_url).run_owned([f"DROP TABLE IF EXISTS {t}" for t in OTHER])


def _bounded(engine: Engine, where: str = "", per: int = 1) -> list[float]:
    """The values the histogram counts: each rider's rides, at most 3 (all of them but rider
    1's), ``per`` join rows each.  Rider 1's kept rides are random: the tests allow for them."""
    rows = engine.backend.run(f"SELECT r.v FROM qj_rides r {where}").rows
    return sorted(float(v) for (v,) in rows for _ in range(per))


def _rank(values: list[float], x: float) -> int:
    return sum(1 for v in values if v < x)


def _near(values: list[float], x: float, p: float, rank_error: float) -> None:
    # Rider 1's 40 rides, of which 3 are kept: the truth over all rows is off by <= 37 ranks.
    assert abs(_rank(values, x) - p * len(values)) <= 4 * rank_error + 37 + 1


def test_median_over_a_join_on_the_unit(rides: Engine) -> None:
    """qj_rides (c = 3) JOIN qj_members (c = 1) on rider_id: S = 3 * 1 = 3 join rows per
    rider, so the median's Delta = S max(0.5, 0.5) = 1.5, as on qj_rides alone."""
    result = rides.execute("SELECT MEDIAN(r.v) " + MEMBERS, analyst="alice", epsilon=10.0)
    (q0,) = result.report.measurements
    assert (q0.sensitivity, q0.mechanism["epsilon"]) == (1.5, 10.0)
    assert result.report.stability == 3
    assert set(result.report.tables) == {"qj_rides", "qj_members"}
    assert "S = 3 join rows" in " ".join(result.report.notes)
    _near(_bounded(rides), result.rows[0][0], 0.5, q0.mechanism["rank_error_95"])
    (claim,) = rides.ledger.claims()
    assert claim.epsilon == pytest.approx(10.0)
    assert sum(b.epsilon_consumed for b in rides.ledger.blocks()) == pytest.approx(
        10.0 * len(rides.ledger.blocks()))


def test_grouped_by_public_values_of_the_joined_table(rides: Engine) -> None:
    """Keys with public values on the joined private table: every declared tier ('none' has
    no row, its median is drawn from an empty histogram, i.e. uniformly)."""
    result = rides.execute("SELECT m.tier, PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY r.v) "
                           "AS p90 " + MEMBERS + "GROUP BY m.tier ORDER BY m.tier",
                           analyst="alice", epsilon=10.0)
    assert [r[0] for r in result.rows] == ["basic", "gold", "none"]
    (q0,) = result.report.measurements
    assert q0.sensitivity == pytest.approx(3 * 0.9)  # S max(p, 1 - p) = 3 * 0.9
    for tier, p90 in result.rows[:2]:
        parity = 0 if tier == "gold" else 1
        truth = _bounded(rides, f"WHERE r.rider_id % 2 = {parity}")
        _near(truth, p90, 0.9, q0.mechanism["rank_error_95"])


def test_join_with_a_public_table_on_a_key(rides: Engine) -> None:
    """qj_rides JOIN qj_cities ON city_id: cities.city_id is unique (mf = 1, read from the
    public table), so S = mf * c = 1 * 3 = 3; the filter on the public table applies."""
    result = rides.execute("SELECT MEDIAN(r.v) FROM qj_rides r JOIN qj_cities c "
                           "ON r.city_id = c.city_id WHERE c.country = 'US'",
                           analyst="alice", epsilon=10.0)
    (q0,) = result.report.measurements
    assert q0.sensitivity == 1.5 and result.report.stability == 3
    _near(_bounded(rides, "WHERE r.city_id IN (1, 2)"), result.rows[0][0], 0.5,
          q0.mechanism["rank_error_95"])


def test_grouped_by_a_column_of_the_joined_public_table(rides: Engine) -> None:
    """GROUP BY c.country: the groups are every country of qj_cities (public: read from it,
    no threshold), CA too, with no ride (a value drawn from an empty histogram).  Next to a
    key with public values: their product."""
    result = rides.execute("SELECT c.country, m.tier, MEDIAN(r.v) AS med FROM qj_rides r "
                           "JOIN qj_cities c ON r.city_id = c.city_id JOIN qj_members m "
                           "ON r.rider_id = m.rider_id GROUP BY c.country, m.tier "
                           "ORDER BY 1, 2", analyst="alice", epsilon=10.0)
    assert [r[:2] for r in result.rows] == [(c, t) for c in ("CA", "MX", "US")
                                            for t in ("basic", "gold", "none")]
    assert result.types == ("text", "text", "float")
    (q0,) = result.report.measurements
    # S = mf(cities.city_id) * 3 * 1 = 3 (qj_members joined on the unit): Delta = 1.5.
    assert q0.sensitivity == 1.5 and result.report.stability == 3
    assert result.report.key_release is None or result.report.key_release.method != "threshold"
    mx_gold = next(r[2] for r in result.rows if r[:2] == ("MX", "gold"))
    truth = _bounded(rides, "WHERE r.city_id = 3 AND r.rider_id % 2 = 0")
    _near(truth, mx_gold, 0.5, q0.mechanism["rank_error_95"])


def test_a_public_table_with_repeated_keys_multiplies_s(rides: Engine) -> None:
    """qj_zones holds two rows per city_id (mf = 2): each ride joins 2 rows, S = 2 * 3 = 6;
    MIN and MAX (p = 0.01, 0.99) are drawn jointly at Delta = 2 S = 12."""
    result = rides.execute("SELECT MIN(r.v), MAX(r.v) FROM qj_rides r JOIN qj_zones z "
                           "ON r.city_id = z.city_id", analyst="alice", epsilon=10.0)
    q0, q1 = result.report.measurements
    assert result.report.stability == 6
    assert (q0.sensitivity, q1.sensitivity) == (12.0, 12.0)
    assert q0.mechanism["epsilon"] == 10.0
    values = _bounded(rides, per=2)
    lo, hi = result.rows[0]
    assert lo <= hi
    _near(values, lo, 0.01, 2 * q0.mechanism["rank_error_95"])
    _near(values, hi, 0.99, 2 * q1.mechanism["rank_error_95"])


def test_a_self_join_on_the_unit(rides: Engine) -> None:
    """qj_rides a JOIN qj_rides b ON rider_id: a rider's <= 3 rides pair with each other, S =
    3 * 3 = 9 join rows; the median's Delta = 9 * 0.5 = 4.5."""
    result = rides.execute("SELECT MEDIAN(a.v) FROM qj_rides a JOIN qj_rides b "
                           "ON a.rider_id = b.rider_id", analyst="alice", epsilon=10.0)
    (q0,) = result.report.measurements
    assert q0.sensitivity == 4.5 and result.report.stability == 9


def test_grouped_by_a_private_column_without_public_values(rides: Engine) -> None:
    """GROUP BY m.year (no public values): released by a noisy row count.  S = 3; a rider has
    one members row, so one year: D = 1.  At epsilon 50, delta 1e-6: the gate gets 0.2 * 50 =
    10, b = S / 10 = 0.3, tau = S + b ln(D / delta) = 3 + 0.3 ln(1e6); the median gets 40 at
    Delta = 1.5.  Every year holds >= 15 riders: all four are released."""
    result = rides.execute("SELECT m.year, MEDIAN(r.v) AS med " + MEMBERS
                           + "GROUP BY m.year ORDER BY 1", analyst="alice", epsilon=50.0,
                           delta=1e-6)
    q0, t0 = result.report.measurements
    assert (q0.sensitivity, q0.mechanism["epsilon"]) == (1.5, 40.0)
    assert (t0.sensitivity, t0.mechanism["epsilon"]) == (3.0, 10.0)
    assert result.report.key_release.threshold == pytest.approx(3 + 0.3 * math.log(1e6))
    assert [r[0] for r in result.rows] == [2020, 2021, 2022, 2023]
    assert result.types == ("integer", "float")
    (claim,) = rides.ledger.claims()
    assert (claim.epsilon, claim.delta) == (pytest.approx(50.0), pytest.approx(1e-6))


def test_an_event_level_table_joined_with_a_public_table(rides: Engine) -> None:
    """qj_events at event level (a neighbour changes one row) JOIN qj_zones (mf 2): S = 2,
    the 0.25-quantile's Delta = 2 * 0.75 = 1.5.  w = 1..99, each row twice: the truth is ~25."""
    result = rides.execute("SELECT PERCENTILE_DISC(0.25) WITHIN GROUP (ORDER BY e.w) FROM "
                           "qj_events e JOIN qj_zones z ON e.city_id = z.city_id",
                           analyst="alice", epsilon=10.0)
    (q0,) = result.report.measurements
    assert result.report.stability == 2 and q0.sensitivity == 1.5
    values = sorted(float(w) for w in range(1, 100) for _ in range(2))
    rank = sum(1 for v in values if v < result.rows[0][0])
    assert abs(rank - 0.25 * len(values)) <= 4 * q0.mechanism["rank_error_95"] + 2


def test_next_to_other_aggregates_with_having(rides: Engine) -> None:
    """A median and a count over the join, one charge of 20: 10 to the median (Delta = S / 2 =
    1.5), 10 to the join's count (the join kind: S(k) = 3 constant, so S* = 3 and Delta =
    2 S* = 6).  HAVING keeps the tiers whose noisy count exceeds 10: basic and gold (about 60
    join rows each), not none (no row; noise scale 6 / 10)."""
    result = rides.execute("SELECT m.tier, MEDIAN(r.v) AS med, COUNT(*) AS n " + MEMBERS
                           + "GROUP BY m.tier HAVING COUNT(*) > 10 ORDER BY 1",
                           analyst="alice", epsilon=20.0, delta=1e-6)
    q0, m0 = result.report.measurements
    assert (q0.sensitivity, q0.mechanism["epsilon"]) == (1.5, 10.0)
    assert m0.sensitivity == 6.0 and m0.mechanism["epsilon"] == 10.0
    assert result.report.elastic.at_zero == 3
    assert [r[0] for r in result.rows] == ["basic", "gold"]
    assert all(n > 10 for _, _, n in result.rows)
    (claim,) = rides.ledger.claims()
    assert claim.epsilon == pytest.approx(20.0)


@pytest.mark.parametrize(("sql", "words"), [
    # A self-join on a non-unit column: S(k) grows with k and reads private frequencies.
    ("SELECT MEDIAN(a.v) FROM qj_rides a JOIN qj_rides b ON a.city_id = b.city_id",
     ("private data", "COUNT/SUM/AVG over this join", "sampled")),
    # Two private tables of one unit joined on another column: the same.
    ("SELECT MEDIAN(r.v) FROM qj_rides r JOIN qj_members m ON r.city_id = m.year",
     ("private data", "max_frequency")),
    # A key of a joined public table next to one released by a threshold.
    ("SELECT c.country, m.year, MEDIAN(r.v) FROM qj_rides r JOIN qj_cities c "
     "ON r.city_id = c.city_id JOIN qj_members m ON r.rider_id = m.rider_id GROUP BY 1, 2",
     ("joined public table", "without public values")),
    # Quantiles next to other aggregates over a join whose S reads private data.
    ("SELECT MEDIAN(a.v), COUNT(*) FROM qj_rides a JOIN qj_rides b ON a.city_id = b.city_id",
     ("private data",)),
    # An event-level table joined to a table of riders: no common neighbour notion.
    ("SELECT MEDIAN(e.w) FROM qj_events e JOIN qj_rides r ON e.city_id = r.city_id",
     ("different levels",)),
])
def test_refusals_cost_nothing(rides: Engine, sql: str, words: tuple[str, ...]) -> None:
    with pytest.raises((NotSupportedError, QueryRefused)) as raised:
        rides.execute(sql, analyst="alice", epsilon=1.0, delta=1e-6)
    text = str(raised.value) + " " + (raised.value.hint or "")
    for word in words:
        assert word in text, text
    assert nothing_spent(rides)


@pytest.fixture
def auto_rides(scratch: Callable[..., Engine], backend_url: str) -> Iterator[Engine]:
    """The same tables with contribution = "auto": one-table quantiles choose their cap."""
    yield scratch("qj_rides", SETUP,
                  POLICY.replace('contribution = "fixed"', 'contribution = "auto"'))
    open_backend(backend_url).run_owned([f"DROP TABLE IF EXISTS {t}" for t in OTHER])


def test_a_join_keeps_s_with_automatic_caps(auto_rides: Engine) -> None:
    """contribution = "auto" chooses a cap for qj_rides alone (a cap step, its share 0.1 of
    epsilon 10 = 1 charged apart), never for a join: S is a public constant, 3 * 1 = 3 over
    qj_members, so no selection, no cap step, Delta = S max(0.5, 0.5) = 1.5 and all of
    epsilon 10 to the median; next to a count over the join (epsilon 20, 10 each part), the
    join kind's Delta 2 S* = 6, no step either, and the parts add up to the claim."""
    alone = auto_rides.execute("SELECT MEDIAN(r.v) FROM qj_rides r", analyst="alice",
                               epsilon=10.0)
    contribution = alone.report.contribution
    assert contribution is not None and [s.kind for s in contribution.steps] == ["cap"]
    assert contribution.epsilon == pytest.approx(1.0)

    _, prepared = auto_rides.prepare("SELECT MEDIAN(r.v) " + MEMBERS, analyst="alice",
                                     epsilon=10.0)
    assert prepared.selection is None
    result = auto_rides.execute("SELECT MEDIAN(r.v) " + MEMBERS, analyst="alice", epsilon=10.0)
    report = result.report
    assert report.contribution is None and report.stability == 3
    (q0,) = report.measurements
    assert (q0.sensitivity, q0.mechanism["epsilon"]) == (1.5, 10.0) and report.epsilon == 10.0
    assert "chosen per query" not in " ".join(report.notes)

    mixed = auto_rides.execute("SELECT m.tier, MEDIAN(r.v) AS med, COUNT(*) AS n " + MEMBERS
                               + "GROUP BY m.tier", analyst="alice", epsilon=20.0, delta=1e-6)
    assert mixed.report.contribution is None
    q0, m0 = mixed.report.measurements
    assert (q0.sensitivity, q0.mechanism["epsilon"]) == (1.5, 10.0)
    assert (m0.sensitivity, m0.mechanism["epsilon"]) == (6.0, 10.0)
    assert q0.mechanism["epsilon"] + m0.mechanism["epsilon"] == pytest.approx(
        mixed.report.epsilon) == pytest.approx(20.0)
    assert [c.epsilon for c in auto_rides.ledger.claims()] == [
        pytest.approx(10.0), pytest.approx(10.0), pytest.approx(20.0)]


def test_the_join_histogram_reads_the_ranked_copies(rides: Engine) -> None:
    """Both private tables are bounded per query: the histogram reads their ranked copies
    (``rewriters.joins.join_rows``), qj_rides ranked after the NULL test on r.v (light units
    whole, heavy ones in stored order), qj_members (the test reads none of its columns) by its
    stored ranks <= 1.  Each rider weighs min(c_u, 3) join rows: 40 rides of rider 1 keep 3."""
    sql = "SELECT MEDIAN(r.v) " + MEMBERS
    _, prepared = rides.prepare(sql, "alice", epsilon=1.0)
    ((_, statement),) = prepared.detail.histograms
    assert "qj_rides__ranked_" in statement and "qj_members__ranked_" in statement
    assert "r.__chorus_unit_rows <=" in statement and "m.__chorus_rank <= 1" in statement
    assert "RANDOM()" not in statement.upper()
    per_rider = rides.backend.run("SELECT rider_id, COUNT(*) FROM qj_rides GROUP BY rider_id")
    kept = sum(min(int(n), 3) for _, n in per_rider.rows)
    assert sum(int(row[-1]) for row in rides.backend.run(statement).rows) == kept
