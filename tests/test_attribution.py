"""Multi-attribution tables end to end, on DuckDB and Postgres: policy, stored S, queries, CLI."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from chorus_py.cli import main
from chorus_py.engine import Engine
from chorus_py.errors import (
    NotSupportedError,
    OperationalError,
    PolicyError,
    ProgrammingError,
    QueryRefused,
)
from chorus_py.policy import parse_policy
from chorus_py.stores.attribution import AttributionStore
from tests.conftest import nothing_spent, tolerance

K = 3
# 400 rides: 37 riders (about 11 rides each), 101 drivers (about 4 each), ids in one space but
# disjoint ranges; every 50th ride has no driver (NULL).
RIDES_SQL = [
    "CREATE TABLE shared_rides AS SELECT i AS ride_id, i % 37 AS rider_id, "
    "CASE WHEN i % 50 = 0 THEN NULL ELSE 1000 + (i * 7) % 101 END AS driver_id, "
    "CASE WHEN i % 3 = 0 THEN 'SF' ELSE 'LA' END AS city, "
    "CAST(i % 60 AS DOUBLE PRECISION) AS fare FROM generate_series(1, 400) AS s(i)",
]
RIDES_POLICY = """
[backend]
url = "{url}"

[privacy]
epsilon_per_block = 1e6
max_epsilon_per_query = 1e5
max_delta_per_query = 1e-3

[tables.shared_rides]
privacy_unit = ["rider_id", "driver_id"]
row_id = "ride_id"
max_rows_per_unit = %d
attribution_method = "%s"

[tables.shared_rides.columns]
ride_id   = {{ type = "int" }}
rider_id  = {{ type = "int", private_id = true }}
driver_id = {{ type = "int", private_id = true }}
city      = {{ type = "text", public_values = ["SF", "LA"] }}
fare      = {{ type = "float", lower = 0, upper = 50 }}
"""
# 120 papers with 1..4 authors among 30; the attribution table has one row per pair (and one
# duplicate pair, and a pair for a paper that does not exist).
PAPERS_SQL = [
    "DROP TABLE IF EXISTS t_authors",
    "CREATE TABLE t_papers AS SELECT i AS paper_id, CAST(i % 40 AS DOUBLE PRECISION) AS cites "
    "FROM generate_series(1, 120) AS s(i)",
    "CREATE TABLE t_authors AS SELECT p.i AS paper_id, (p.i * 13 + j.j * 7) % 30 AS author_id "
    "FROM generate_series(1, 120) AS p(i), generate_series(0, 3) AS j(j) WHERE j.j <= p.i % 4",
    "INSERT INTO t_authors VALUES (1, 13), (999, 1)",
]
PAPERS_POLICY = """
[backend]
url = "{url}"

[privacy]
epsilon_per_block = 1e6
max_epsilon_per_query = 1e5

[tables.t_papers]
privacy_unit = {{ table = "t_authors", row_id = "paper_id", unit_id = "author_id" }}
max_rows_per_unit = %d
attribution_method = "%s"

[tables.t_papers.columns]
paper_id = {{ type = "int" }}
cites    = {{ type = "float", lower = 0, upper = 40 }}
"""

RIDE_UNITS = ("SELECT u, COUNT(*) AS c FROM (SELECT rider_id AS u, ride_id FROM {s} UNION "
              "SELECT driver_id, ride_id FROM {s} WHERE driver_id IS NOT NULL) AS p GROUP BY u")
PAPER_UNITS = ("SELECT a.author_id AS u, COUNT(DISTINCT a.paper_id) AS c FROM t_authors AS a "
               "WHERE a.paper_id IN (SELECT paper_id FROM {s}) GROUP BY a.author_id")


def rides(scratch: Callable[..., Engine], method: str = "greedy", k: int = K) -> Engine:
    return scratch("shared_rides", RIDES_SQL, RIDES_POLICY % (k, method))


def papers(scratch: Callable[..., Engine], method: str = "greedy", k: int = K) -> Engine:
    return scratch("t_papers", PAPERS_SQL, PAPERS_POLICY % (k, method))


def stored(engine: Engine, table: str) -> str:
    """chorus_private."<name>" of the table's current S (tests only: analysts cannot)."""
    name = engine.attribution.relation(table, engine.policy.tables[table])
    return f'chorus_private."{name}"'


def worst_unit(engine: Engine, units_sql: str, source: str) -> int:
    """The most rows of one unit in ``source``, counted in SQL independently of the store."""
    return engine.backend.run(f"SELECT MAX(c) FROM ({units_sql.format(s=source)}) AS w").rows[0][0]


@pytest.mark.parametrize("method", ["greedy", "greedy-sparse", "sql-rank", "greedy-balanced",
                                    "ilp"])
def test_every_method_keeps_at_most_k_rows_per_unit(scratch: Callable[..., Engine],
                                                    method: str) -> None:
    for engine, units, table in ((rides(scratch, method), RIDE_UNITS, "shared_rides"),
                                 (papers(scratch, method), PAPER_UNITS, "t_papers")):
        source = stored(engine, table)
        assert worst_unit(engine, units, table) > K  # the table itself breaks the bound
        assert worst_unit(engine, units, source) <= K
        (kept,) = engine.backend.run(f"SELECT COUNT(*) FROM {source}").rows[0]
        assert kept > 0


def test_owner_summary_and_ilp_at_least_greedy(scratch: Callable[..., Engine]) -> None:
    engine = rides(scratch)
    tp = engine.policy.tables["shared_rides"]
    summaries = {m: engine.attribution.bound("shared_rides", tp, m, seed=7)
                 for m in ("greedy", "greedy-sparse", "sql-rank", "greedy-balanced", "ilp")}
    assert summaries["ilp"].kept == max(s.kept for s in summaries.values())
    assert summaries["ilp"].optimal
    for s in summaries.values():
        assert s.rows == 400 and s.max_rows_per_unit <= K
        assert 1.0 <= s.mean_units_per_kept_row <= 2.0
    # Only the policy's method is stored; the others are dry runs.
    assert summaries["greedy"].stored_as is not None
    assert summaries["ilp"].stored_as is None
    (kept,) = engine.backend.run(f"SELECT COUNT(*) FROM {summaries['greedy'].stored_as}").rows[0]
    assert kept == summaries["greedy"].kept


def test_selection_is_deterministic_given_a_seed(scratch: Callable[..., Engine]) -> None:
    engine = papers(scratch)
    tp = engine.policy.tables["t_papers"]
    for method in ("greedy", "sql-rank"):
        runs = [engine.attribution.bound("t_papers", tp, method, seed=s) for s in (5, 5, 6)]
        assert runs[0].kept == runs[1].kept
        assert runs[0].mean_units_per_kept_row == runs[1].mean_units_per_kept_row


def test_queries_read_s_with_sensitivity_k(scratch: Callable[..., Engine]) -> None:
    engine = rides(scratch)
    result = engine.execute("SELECT city, COUNT(*) AS n, SUM(fare) AS total, "
                            "COUNT(DISTINCT driver_id) AS drivers FROM shared_rides "
                            "GROUP BY city", epsilon=3000.0)
    report = result.report
    sql = report.rewritten_sql or ""
    source = stored(engine, "shared_rides")
    assert source.split(".")[1] in sql and "FROM shared_rides" not in sql
    # A neighbour adds or removes one unit's <= k rows of S: COUNT k, SUM k * 50, and the
    # distinct count of a unit column k (each such row carries one driver), not 1.
    by_kind = {m.aggregate: m.sensitivity for m in report.measurements}
    assert by_kind == {"COUNT(*)": K, "SUM(shared_rides.fare)": K * 50.0,
                       "COUNT(DISTINCT shared_rides.driver_id)": K}
    assert report.stability == K
    assert report.contribution is not None and report.contribution.method == "greedy"
    assert "shown only to the data owner" in report.contribution.note
    truth = {city: (n, total, drivers) for city, n, total, drivers in engine.backend.run(
        f"SELECT city, COUNT(*), SUM(LEAST(GREATEST(fare, 0), 50)), COUNT(DISTINCT driver_id) "
        f"FROM {source} GROUP BY city").rows}
    for city, n, total, drivers in result.rows:
        assert abs(n - truth[city][0]) <= tolerance(report.columns[1])
        assert abs(total - truth[city][1]) <= tolerance(report.columns[2])
        assert abs(drivers - truth[city][2]) <= tolerance(report.columns[3])


def test_attribution_table_queries(scratch: Callable[..., Engine]) -> None:
    engine = papers(scratch)
    result = engine.execute("SELECT COUNT(*), AVG(cites) FROM t_papers WHERE cites > 5",
                            epsilon=2000.0)
    assert [m.sensitivity for m in result.report.measurements if m.aggregate.startswith(
        "COUNT")] == [K, K]
    (n,) = engine.backend.run(f"SELECT COUNT(*) FROM {stored(engine, 't_papers')} "
                              "WHERE cites > 5").rows[0]
    assert abs(result.rows[0][0] - n) <= tolerance(result.report.columns[0])


def test_refusals_cost_nothing(scratch: Callable[..., Engine]) -> None:
    engine = rides(scratch)
    for sql, error in [
        ("SELECT COUNT(DISTINCT fare) FROM shared_rides", NotSupportedError),
        ("SELECT fare, COUNT(*) FROM shared_rides GROUP BY fare", NotSupportedError),
        ("SELECT driver_id, COUNT(*) FROM shared_rides GROUP BY driver_id", QueryRefused),
        ("SELECT COUNT(*) FROM chorus_private.shared_rides__attr_0", QueryRefused),
    ]:
        with pytest.raises(error):
            engine.execute(sql, epsilon=1.0, delta=1e-6)
    assert nothing_spent(engine)
    paper_engine = papers(scratch)
    with pytest.raises(ProgrammingError, match="t_authors"):  # the structure is not queryable
        paper_engine.execute("SELECT COUNT(*) FROM t_authors", epsilon=1.0)
    assert nothing_spent(paper_engine)


def test_s_is_rebuilt_when_rows_arrive(scratch: Callable[..., Engine]) -> None:
    engine = rides(scratch)
    tp = engine.policy.tables["shared_rides"]
    first = stored(engine, "shared_rides")
    old = engine.attribution._fingerprint("shared_rides", tp)
    # New rides of new riders and drivers: S must grow.
    engine.backend.run_owned(["INSERT INTO shared_rides SELECT ride_id + 1000, rider_id + 5000, "
                              "driver_id + 5000, city, fare FROM shared_rides"])
    if engine.dialect == "postgres":  # the statistics collector publishes counters lazily
        import time

        deadline = time.monotonic() + 10
        while engine.attribution._fingerprint("shared_rides", tp) == old:
            assert time.monotonic() < deadline, "pg_stat_user_tables never changed"
            time.sleep(0.2)
    second = stored(engine, "shared_rides")
    assert second != first
    sizes = [engine.backend.run(f"SELECT COUNT(*) FROM {s}").rows[0][0] for s in (second,)]
    assert worst_unit(engine, RIDE_UNITS, second) <= K and sizes[0] > 0
    left = engine.backend.run("SELECT table_name FROM information_schema.tables WHERE "
                              "table_schema = 'chorus_private' AND table_name LIKE "
                              "'shared_rides__attr%'").rows
    assert [r[0] for r in left] == [second.split('"')[1]]  # the stale S was dropped


def test_a_broken_s_is_dropped_and_refused(scratch: Callable[..., Engine]) -> None:
    engine = rides(scratch)
    tp = engine.policy.tables["shared_rides"]
    engine.backend.run_owned(["CREATE SCHEMA IF NOT EXISTS chorus_private",
                              'CREATE TABLE chorus_private."shared_rides__attr_bad" AS '
                              "SELECT * FROM shared_rides"])
    store = AttributionStore(engine.backend, engine.samples.naming_key)
    with pytest.raises(OperationalError, match="could not be verified"):
        store._verify("shared_rides", tp, "shared_rides__attr_bad")
    assert not store._exists("shared_rides__attr_bad")


def test_a_row_id_that_is_not_unique_is_refused(scratch: Callable[..., Engine]) -> None:
    engine = scratch("shared_rides", [*RIDES_SQL, "INSERT INTO shared_rides VALUES "
                                      "(1, 1, 1001, 'SF', 3)"], RIDES_POLICY % (K, "greedy"))
    with pytest.raises(OperationalError, match="not available") as refused:
        engine.execute("SELECT COUNT(*) FROM shared_rides", epsilon=1.0)
    assert "unique" not in str(refused.value)  # the reason is for the owner only
    assert nothing_spent(engine)
    with pytest.raises(PolicyError, match="not unique"):
        engine.attribution.bound("shared_rides", engine.policy.tables["shared_rides"])


def test_cli_bound_reports_to_the_owner(scratch: Callable[..., Engine], tmp_path: Path,
                                        backend_url: str) -> None:
    rides(scratch)
    policy = tmp_path / "bound.toml"
    policy.write_text((RIDES_POLICY % (K, "greedy")).format(url=backend_url))
    # In-process: the session's DuckDB file is open in this process already.
    runner = CliRunner()
    out = runner.invoke(main, ["bound", "--policy", str(policy), "--table", "shared_rides",
                               "--seed", "1"])
    assert out.exit_code == 0, out.output
    assert "|S| = " in out.stdout and "of 400 rows" in out.stdout and "stored as" in out.stdout
    assert "units per row" in out.stdout
    dry = runner.invoke(main, ["bound", "--policy", str(policy), "--table", "shared_rides",
                               "--method", "ilp", "--json"])
    summary = json.loads(dry.stdout)
    assert summary["method"] == "ilp" and summary["stored_as"] is None
    assert summary["max_rows_per_unit"] <= K
    wrong = runner.invoke(main, ["bound", "--policy", str(policy), "--table", "nope"])
    assert wrong.exit_code != 0 and "several units per row" in wrong.output


BASE = {"backend": {"url": "duckdb:///:memory:"}, "privacy": {"epsilon_per_block": 10}}
COLUMNS = {"ride_id": {"type": "int"}, "rider_id": {"type": "int"},
           "driver_id": {"type": "int"}, "name": {"type": "text"}}


@pytest.mark.parametrize(("table", "message"), [
    ({"privacy_unit": ["rider_id", "driver_id"], "max_rows_per_unit": 2}, "needs row_id"),
    ({"privacy_unit": ["rider_id", "driver_id"], "max_rows_per_unit": 2, "row_id": "ride_id",
      "contribution": "auto"}, "contribution = \"fixed\""),
    ({"privacy_unit": ["rider_id", "driver_id"], "max_rows_per_unit": 2, "row_id": "ride_id",
      "bounding": "per-query"}, "bounding = \"materialized\""),
    ({"privacy_unit": ["rider_id", "name"], "max_rows_per_unit": 2, "row_id": "ride_id"},
     "share one type"),
    ({"privacy_unit": ["rider_id", "rider_id"], "max_rows_per_unit": 2, "row_id": "ride_id"},
     "two different columns"),
    ({"privacy_unit": ["rider_id", "driver_id"], "row_id": "ride_id"}, "needs max_rows_per_unit"),
    ({"privacy_unit": ["rider_id", "driver_id"], "max_rows_per_unit": 2, "row_id": "name"},
     "must be a declared int column"),
    ({"privacy_unit": "rider_id", "max_rows_per_unit": 2, "attribution_method": "greedy"},
     "apply only to"),
    ({"privacy_unit": ["rider_id", "driver_id"], "max_rows_per_unit": 2, "row_id": "ride_id",
      "attribution_balance": {"u": 2}}, "only to attribution_method"),
    ({"privacy_unit": ["rider_id", "driver_id"], "max_rows_per_unit": 2, "row_id": "ride_id",
      "attribution_method": "best"}, "attribution_method"),
])
def test_bad_policies_are_refused(table: dict, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        parse_policy({**BASE, "tables": {"rides": {"columns": COLUMNS, **table}}})


def test_good_policies_default_to_a_stored_fixed_selection() -> None:
    policy = parse_policy({**BASE, "tables": {"rides": {
        "columns": COLUMNS, "privacy_unit": ["rider_id", "driver_id"], "row_id": "ride_id",
        "max_rows_per_unit": 2, "attribution_method": "greedy-balanced",
        "attribution_balance": {"u": 1, "c1": 2, "c2": 3}}}})
    tp = policy.tables["rides"]
    assert tp.multi_attribution and tp.contribution == "fixed" and tp.bounding == "materialized"
    assert tp.unit_columns == ("rider_id", "driver_id")
    table = parse_policy({**BASE, "tables": {"rides": {
        "columns": COLUMNS, "max_rows_per_unit": 2,
        "privacy_unit": {"table": "a", "row_id": "ride_id", "unit_id": "u"}}}}).tables["rides"]
    assert table.multi_attribution and table.unit_columns == ()
    with pytest.raises(PolicyError, match="attribution table 'a'"):
        policy = parse_policy({**BASE, "tables": {"rides": table.model_dump()}})
        policy.check_against({"rides": {c: "integer" for c in COLUMNS}})


def test_text_unit_ids(scratch: Callable[..., Engine]) -> None:
    sql = [RIDES_SQL[0].replace("i % 37 AS rider_id", "CAST(i % 37 AS VARCHAR) AS rider_id")
           .replace("ELSE 1000 + (i * 7) % 101 END", "ELSE CAST(1000 + (i * 7) % 101 AS VARCHAR) "
                    "END")]
    policy = (RIDES_POLICY % (K, "greedy")).replace(
        'rider_id  = {{ type = "int", private_id = true }}',
        'rider_id  = {{ type = "text", private_id = true }}').replace(
        'driver_id = {{ type = "int", private_id = true }}',
        'driver_id = {{ type = "text", private_id = true }}')
    engine = scratch("shared_rides", sql, policy)
    result = engine.execute("SELECT COUNT(*) FROM shared_rides", epsilon=1000.0)
    source = stored(engine, "shared_rides")
    assert worst_unit(engine, RIDE_UNITS, source) <= K
    (n,) = engine.backend.run(f"SELECT COUNT(*) FROM {source}").rows[0]
    assert n > 0 and abs(result.rows[0][0] - n) <= tolerance(result.report.columns[0])
