"""The Spark backend over Spark Connect (``url = "sc://host:port"``), against a real Connect
server of this machine (``connect_url``): a representative subset of the local Spark tests
(the demo queries against DuckDB, refusals and attacks, the noise distribution, a materialized
sample) and what differs under Connect (sessions of the server, cancellation by session tag,
the private database and the naming key on the cluster's side)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from chorus_py.backends import StatementFailed
from chorus_py.backends.base import SCHEMA
from chorus_py.backends.spark import _SESSION_CONF, SparkBackend
from chorus_py.engine import Engine
from chorus_py.errors import ChorusError, OperationalError
from chorus_py.policy import SparkConfig, load_policy, parse_policy
from tests.conftest import POLICY_TEMPLATE, free_port, nothing_spent, tolerance
from tests.spark.conftest import TABLES, spark_block
from tests.spark.test_backend_spark import (  # noqa: F401  (collected here with Connect)
    _policy,
    demo_queries_match_duckdb,
    test_count_noise_has_its_distribution,
)
from tests.spark.test_walls_spark import SPARK_ATTACKS, SPARK_REFUSALS
from tests.test_refusals import ALICE, _check_message, _refused_or_answered


@pytest.fixture
def backend_url(connect_url: str) -> str:
    """The tests written for ``backend_url`` run on the Spark Connect server here."""
    return connect_url


@pytest.fixture(scope="module")
def shared(connect_url: str, spark_data: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """One engine on Spark Connect for the refusals, which charge nothing."""
    path = tmp_path_factory.mktemp("connect-walls") / "policy.toml"
    path.write_text(POLICY_TEMPLATE.format(
        url=connect_url, noise="proxy", k=10, epsilon_per_block=1000.0, max_epsilon=500.0,
        contribution="fixed") + spark_block(spark_data, TABLES))
    engine = Engine(load_policy(path))
    yield engine
    engine.close()


def test_a_connect_policy_keeps_the_cluster_paths() -> None:
    policy = parse_policy(_policy("sc://spark.internal:15002", spark=(
        'tables = { t = "s3a://lake/t" }\nprivate_dir = "/private/chorus"')))
    assert policy.backend.dialect == "spark" and policy.privacy.noise == "proxy"
    assert policy.backend.spark is not None
    assert policy.backend.spark.tables == {"t": "s3a://lake/t"}


def test_demo_queries_over_connect_match_duckdb(duckdb_data: str, spark_data: Path,
                                                connect_url: str, tmp_path: Path) -> None:
    from chorus_py.demo.rides import DEMO_TABLES

    def adapt(text: str) -> str:
        listed = ", ".join(f'{t} = "{tmp_path / "parquet" / t}.parquet"' for t in DEMO_TABLES)
        return (text.replace('url = "spark://local"', f'url = "{connect_url}"')
                .replace('warehouse = "parquet"', f"tables = {{ {listed} }}")
                .replace('private_dir = "spark-private"',
                         f'private_dir = "{spark_data / "private"}"'))

    demo_queries_match_duckdb(duckdb_data, tmp_path, adapt)


@pytest.mark.parametrize(("sql", "kwargs", "error", "needles"), SPARK_REFUSALS[::4])
def test_refused_over_connect(shared: Engine, sql: str, kwargs: dict[str, Any],
                              error: type[ChorusError], needles: tuple[str, ...]) -> None:
    with pytest.raises(error) as executed:
        shared.execute(sql, **{**ALICE, **kwargs})
    _check_message(executed.value, needles)
    assert nothing_spent(shared)


def test_spark_attacks_refused_or_answered_safely_over_connect(shared: Engine) -> None:
    for sql in SPARK_ATTACKS:
        if not _refused_or_answered(shared, sql):
            report = shared.explain(sql, **ALICE)
            assert report.epsilon > 0 and set(report.tables) <= {"trips", "visits"}, sql
    assert shared.execute("SELECT COUNT(*) FROM cities", **ALICE).rows == [(5,)]


def test_the_walls_hold_on_the_servers_sessions(shared: Engine, spark_data: Path) -> None:
    """Each session is the server's own: the declared views only, SQL on files off (read back
    from the server), the public session without the private tables, nothing but a query
    sent."""
    backend: Any = shared.backend
    session = backend._session
    assert {r[1] for r in session.sql("SHOW TABLES").collect() if r[2]} == {
        "trips", "visits", "cities"}
    assert session.conf.get("spark.sql.runSQLOnFiles") == "false"
    with pytest.raises(Exception, match=r"TABLE_OR_VIEW_NOT_FOUND|runSQLOnFiles|UNSUPPORTED"):
        session.sql(f"SELECT COUNT(*) FROM parquet.`{spark_data / 'trips.parquet'}`").collect()
    assert backend._public.session_id != session.session_id
    assert backend.run_public("SELECT COUNT(*) FROM session.cities").rows == [(5,)]
    with pytest.raises(StatementFailed):
        backend.run_public("SELECT COUNT(*) FROM session.trips")
    for sql in ("SET spark.sql.runSQLOnFiles = true", "DROP VIEW trips"):
        with pytest.raises(StatementFailed) as failed:
            backend.run(sql)
        assert not failed.value.touched_data
    assert backend.run("SELECT COUNT(*) FROM session.trips").rows[0][0] > 0


def test_a_statement_is_cancelled_by_its_session_tag(shared: Engine) -> None:
    """A cancel (here from another thread, as the front doors do) interrupts the statement's
    tag on the server: the statement fails as cancelled, the session answers the next one."""
    backend: Any = shared.backend
    failures: list[StatementFailed] = []
    runner_id: list[int] = []

    def run() -> None:
        runner_id.append(threading.get_ident())
        try:
            backend.run("SELECT COUNT(*) FROM session.trips AS a CROSS JOIN session.trips AS b "
                        "CROSS JOIN session.trips AS c")
        except StatementFailed as err:
            failures.append(err)

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(3)
    started = time.monotonic()
    assert backend.interrupt(runner_id[0])
    thread.join(60)
    assert not thread.is_alive() and time.monotonic() - started < 30
    assert failures and failures[0].cancelled is not None and failures[0].touched_data
    assert backend.run("SELECT COUNT(*) FROM session.cities").rows == [(5,)]


def test_materialized_sample_lives_in_the_private_directory_over_connect(
        scratch: Callable[..., Engine], spark_data: Path) -> None:
    """The stored sample is a table of ``chorus_private``, which the server keeps under the
    policy's private_dir; the naming key is a table there too (never in a statement)."""
    from tests.test_engine import RIDES_POLICY

    engine = scratch("rides", ["CREATE TABLE rides AS SELECT rider_id, pickup_time, fare "
                               "FROM trips"], RIDES_POLICY.replace("{k}", "3"))
    result = engine.execute("SELECT COUNT(*) FROM rides", epsilon=1000.0)
    sql = result.report.rewritten_sql or ""
    assert "chorus_private" in sql and "ROW_NUMBER" not in sql
    (name,) = [t for t in engine.backend.owned_tables() if t.startswith("rides__bounded_")]
    found = engine.backend._session.sql(  # type: ignore[attr-defined]
        f"DESCRIBE DATABASE {SCHEMA}").collect()
    location = next(str(r[1]) for r in found if str(r[0]) == "Location")
    directory = Path(location.removeprefix("file:"))
    assert directory.parent == spark_data / "private" and (directory / name).is_dir()
    assert "chorus_key" in engine.backend.owned_tables()
    (worst,) = engine.backend.run(f"SELECT MAX(c) FROM (SELECT COUNT(*) AS c FROM "
                                  f"chorus_private.`{name}` GROUP BY rider_id) AS s").rows[0]
    assert worst <= 3
    (expected,) = engine.backend.run("SELECT SUM(LEAST(c, 3)) FROM (SELECT COUNT(*) AS c FROM "
                                     "rides GROUP BY rider_id) AS s").rows[0]
    assert abs(result.rows[0][0] - expected) <= tolerance(result.report.columns[0])


def _connect_config(spark_data: Path) -> SparkConfig:
    return SparkConfig(tables={"cities": str(spark_data / "cities.parquet")},
                       private_dir=str(spark_data / "private"))


def test_a_server_that_is_not_there_is_told_at_start(spark_data: Path) -> None:
    port = free_port()  # nothing listens on it
    started = time.monotonic()
    with pytest.raises(OperationalError, match="cannot connect to Spark"):
        SparkBackend(_connect_config(spark_data), remote=f"sc://127.0.0.1:{port}")
    assert time.monotonic() - started < 15


def test_a_server_that_refuses_a_wall_is_refused(connect_url: str, spark_data: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A setting the server will not take (here a static one) stops the backend at start: it
    would otherwise run without that wall."""
    monkeypatch.setitem(_SESSION_CONF, "spark.sql.warehouse.dir", str(spark_data / "elsewhere"))
    with pytest.raises(OperationalError, match=r"warehouse\.dir|refuses a setting"):
        SparkBackend(_connect_config(spark_data), remote=connect_url)


def test_the_one_shot_query_command_returns(connect_url: str, spark_data: Path,
                                            tmp_path: Path) -> None:
    """``chorus query`` over Spark Connect, as a process of its own (the client only: no
    Spark starts in it): it prints the answer and exits.  Before it closed its engine, the
    Connect sessions left to the interpreter's shutdown waited on release threads that no
    longer ran, and the command never returned."""
    path = tmp_path / "policy.toml"
    path.write_text(POLICY_TEMPLATE.format(
        url=connect_url, noise="proxy", k=10, epsilon_per_block=1000.0, max_epsilon=500.0,
        contribution="fixed") + spark_block(spark_data, TABLES))
    done = subprocess.run([str(Path(sys.executable).parent / "chorus"), "query", "--policy",
                           str(path), "--analyst", "alice", "SELECT COUNT(*) FROM visits"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "noise in proxy" in done.stdout
