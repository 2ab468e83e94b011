"""The read-only walls on Spark (chorus_py.backends.spark): only SELECT is ever sent, the
session's catalog holds only the declared tables, files cannot be named, and the analyst attacks
of tests/test_refusals.py are refused (or answered safely) as on DuckDB and Postgres."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chorus_py.backends import StatementFailed
from chorus_py.backends.spark import spark_statement_check
from chorus_py.engine import Engine
from chorus_py.errors import ChorusError, QueryRefused
from chorus_py.policy import load_policy
from tests.conftest import POLICY_TEMPLATE, nothing_spent
from tests.spark.conftest import SPARK_URL, TABLES, spark_block
from tests.test_refusals import (  # noqa: F401  (collected here with the Spark fixtures)
    ALICE,
    ATTACKS,
    REFUSALS,
    _check_message,
    _refused_or_answered,
    case,
    test_cte_named_like_a_public_table_is_still_private,
    test_cte_named_like_another_private_table_uses_the_real_bounds,
    test_quoted_table_is_the_private_table,
)


@pytest.fixture(scope="module")
def shared(spark_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """One engine for the refusals, which charge nothing (each test checks that)."""
    path = tmp_path_factory.mktemp("walls") / "policy.toml"
    path.write_text(POLICY_TEMPLATE.format(
        url=SPARK_URL, noise="proxy", k=10, epsilon_per_block=1000.0, max_epsilon=500.0,
        contribution="fixed") + spark_block(spark_data, TABLES))
    engine = Engine(load_policy(path))
    yield engine
    engine.close()


# In Spark SQL `^` is a bitwise XOR, not a power: refused under that name.
SPARK_REFUSALS = [p for p in REFUSALS if p.id != "power-in-where"] + [
    case("SELECT COUNT(*) FROM trips WHERE fare ^ 2 > 1", QueryRefused, "BitwiseXor",
         id="caret-is-xor-on-spark")]


@pytest.mark.parametrize(("sql", "kwargs", "error", "needles"), SPARK_REFUSALS)
def test_refused_on_spark(shared: Engine, sql: str, kwargs: dict[str, Any],
                          error: type[ChorusError], needles: tuple[str, ...]) -> None:
    args = {**ALICE, **kwargs}
    with pytest.raises(error) as executed:
        shared.execute(sql, **args)
    _check_message(executed.value, needles)
    assert nothing_spent(shared)


# Attacks aimed at Spark itself: its file readers, its JVM, its settings, other catalogs.
SPARK_ATTACKS = [
    "SELECT COUNT(*) FROM parquet.`/etc/passwd`",
    "SELECT COUNT(*) FROM `parquet`.`/tmp`",
    "SELECT COUNT(*) FROM read_parquet('/tmp/x.parquet')",
    "SELECT COUNT(*) FROM read_files('/tmp')",
    "SELECT COUNT(*) FROM range(10)",
    "SELECT COUNT(*) FROM default.trips",
    "SELECT COUNT(*) FROM global_temp.trips",
    "SELECT COUNT(*) FROM session.trips",
    "SELECT COUNT(*) FROM spark_catalog.default.trips",
    "SELECT COUNT(*) FROM chorus_private.chorus_key",
    "SELECT COUNT(*) FROM riders",  # in the warehouse, not declared by this policy
    "SELECT COUNT(*) FROM trips WHERE reflect('java.lang.System', 'exit', '0') = 'x'",
    "SELECT COUNT(*) FROM trips WHERE java_method('java.lang.Math', 'random') > 0.5",
    "SELECT COUNT(*) FROM trips WHERE input_file_name() LIKE '%trips%'",
    "SELECT COUNT(*) FROM trips WHERE rand() < 0.5",
    "SELECT COUNT(*) FROM trips WHERE raise_error('x') IS NULL",
    "SELECT COUNT(*) FROM trips WHERE spark_partition_id() = 0",
    "SET spark.sql.runSQLOnFiles = true",
    "RESET",
    "CREATE TABLE x AS SELECT * FROM trips",
    "CREATE TEMPORARY VIEW cities AS SELECT city AS name FROM trips",
    "INSERT INTO cities SELECT * FROM cities",
    "CACHE TABLE trips",
    "ADD JAR /tmp/x.jar",
    "DROP VIEW trips",
    "SELECT COUNT(*) FROM trips; DROP VIEW trips",
    "WITH trips AS (SELECT * FROM visits) SELECT COUNT(*) FROM trips",
]


@pytest.mark.parametrize("sql", SPARK_ATTACKS)
def test_spark_attacks_refused_or_answered_safely(shared: Engine, sql: str) -> None:
    errors = _refused_or_answered(shared, sql)
    if not errors:  # answered: only through the bounding and noise of a declared table
        report = shared.explain(sql, **ALICE)
        assert report.epsilon > 0 and set(report.tables) <= {"trips", "visits"}
    assert shared.execute("SELECT COUNT(*) FROM cities", **ALICE).rows == [(5,)]


@pytest.mark.parametrize("sql", ATTACKS)
def test_attack_refused_or_answered_on_spark(shared: Engine, sql: str) -> None:
    _refused_or_answered(shared, sql)


# -- the backend's own walls, behind the analyser ---------------------------------------------
STATEMENTS_NEVER_SENT = [
    "SET spark.sql.runSQLOnFiles = true",
    "CREATE TABLE x AS SELECT 1",
    "CREATE OR REPLACE TEMPORARY VIEW trips AS SELECT 1",
    "INSERT INTO trips SELECT * FROM trips",
    "DROP TABLE chorus_private.x",
    "CACHE TABLE trips",
    "ADD JAR /tmp/x.jar",
    "EXPLAIN CREATE TABLE x AS SELECT 1",
    "SELECT 1; SELECT 2",
    "SELECT COUNT(*) FROM parquet.`/tmp/x`",
    "SELECT COUNT(*) FROM range(10)",
    "SELECT * FROM read_files('/tmp')",
    "SELECT COUNT(*) FROM spark_catalog.default.t",
    "SELECT COUNT(*) FROM global_temp.t",
    "SELECT reflect('java.lang.System', 'getenv', 'HOME')",
    "SELECT java_method('java.lang.System', 'getenv', 'HOME')",
    "SELECT input_file_name() FROM session.trips",
    "SELECT RAND() FROM session.trips",
    "SELECT RANDN(1)",
    "SELECT UUID()",
    "SELECT current_user()",
]


@pytest.mark.parametrize("sql", STATEMENTS_NEVER_SENT)
def test_statement_check_refuses(sql: str) -> None:
    with pytest.raises(ValueError):
        spark_statement_check(sql)


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM session.trips",
    'SELECT COUNT(*), SUM(hash("rider_id") % 1000000007) FROM "trips"',
    "EXPLAIN SELECT XXHASH64(:chorus_key, t.*) FROM session.trips AS t",
    "SELECT COUNT(*) FROM chorus_private.`trips__bounded_0123`",
    "WITH c AS (SELECT 1 AS x) SELECT x FROM c",
])
def test_statement_check_lets_queries_through(sql: str) -> None:
    spark_statement_check(sql)


def test_backend_refuses_what_the_check_refuses(shared: Engine) -> None:
    for sql in ("SET spark.sql.runSQLOnFiles = true", "DROP VIEW trips",
                "SELECT COUNT(*) FROM parquet.`/tmp`"):
        with pytest.raises(StatementFailed) as failed:
            shared.backend.run(sql)
        assert not failed.value.touched_data
    assert shared.backend.run("SELECT COUNT(*) FROM session.trips").rows[0][0] > 0


def test_files_cannot_be_named_even_past_the_check(shared: Engine, spark_data: Path) -> None:
    """Wall behind the check: the session itself has SQL on files turned off."""
    session = shared.backend._session  # type: ignore[attr-defined]
    with pytest.raises(Exception, match=r"TABLE_OR_VIEW_NOT_FOUND|runSQLOnFiles|UNSUPPORTED"):
        session.sql(f"SELECT COUNT(*) FROM parquet.`{spark_data / 'trips.parquet'}`").collect()


def test_catalog_holds_only_the_declared_tables(shared: Engine) -> None:
    session = shared.backend._session  # type: ignore[attr-defined]
    views = {r[1] for r in session.sql("SHOW TABLES").collect() if r[2]}
    assert views == {"trips", "visits", "cities"}  # riders, papers...: in the warehouse only
    assert set(shared.backend.table_columns()) == {"trips", "visits", "cities"}


def test_public_session_cannot_read_private_tables(shared: Engine) -> None:
    assert shared.backend.run_public("SELECT COUNT(*) FROM session.cities").rows == [(5,)]
    for table in ("trips", "visits"):
        with pytest.raises(StatementFailed):
            shared.backend.run_public(f"SELECT COUNT(*) FROM session.{table}")
