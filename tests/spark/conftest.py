"""The Spark backend's fixtures: the test data as Parquet, and engines on ONE local Spark.

pyspark runs one Spark per process: the first engine starts it (seconds), every later engine
opens a session of its own on it (temporary views of the policy's tables), so the Spark tests
share it.  The Spark Connect tests likewise share one server (:func:`connect_url`), started
from pyspark's own ``spark-submit`` on a free port of this machine.  When pyspark or Java is
missing the tests are skipped, unless ``CHORUS_REQUIRE_SPARK=1`` (set by ``.ci/run``), which
turns that into a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import pytest

from chorus_py.backends.duckdb import duckdb_path
from chorus_py.engine import Engine
from chorus_py.policy import load_policy
from tests.conftest import _CREATED, free_port

SPARK_URL = "spark://local"
# Every table of the test DuckDB file that the Spark tests read.
TABLES = ("trips", "visits", "cities", "riders", "drivers", "papers", "paper_authors")


def spark_missing() -> str | None:
    """Why the Spark tests cannot run here, or None."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return "pyspark is not installed (pip install -e '.[spark]')"
    if shutil.which("java") is None:
        return "Java is not installed (Spark 4 needs Java 17)"
    return None


@pytest.fixture(scope="session")
def spark_data(duckdb_data: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The DuckDB test data as DIR/<table>.parquet, and DIR/private for the proxy's stores (the
    process's Spark keeps ``chorus_private`` in one directory for all its sessions)."""
    missing = spark_missing()
    if missing is not None:
        if os.environ.get("CHORUS_REQUIRE_SPARK") == "1":
            pytest.fail(f"Spark is required but unavailable: {missing}")
        pytest.skip(f"Spark backend: {missing}")
    directory = tmp_path_factory.mktemp("spark")
    # A copy of the file: other tests of this process may hold it open with another
    # configuration, which DuckDB refuses to mix.  The tables were checkpointed into the file
    # when the fixture that wrote them closed it.
    copied = tmp_path_factory.mktemp("spark-source") / "source.duckdb"
    shutil.copyfile(duckdb_path(duckdb_data), copied)
    con = duckdb.connect(str(copied), read_only=True)
    try:
        for table in TABLES:
            con.execute(f"COPY \"{table}\" TO '{directory / table}.parquet' (FORMAT parquet)")
    finally:
        con.close()
    return directory


def spark_block(data: Path, tables: tuple[str, ...] = ("trips", "visits", "cities")) -> str:
    """The ``[backend.spark]`` of a test policy over ``tables`` of :func:`spark_data`."""
    listed = ", ".join(f'{t} = "{data / t}.parquet"' for t in tables)
    return (f"\n[backend.spark]\ntables = {{ {listed} }}\n"
            f'private_dir = "{data / "private"}"\nshuffle_partitions = 2\n')


@pytest.fixture(scope="session")
def connect_url(spark_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``sc://127.0.0.1:PORT``: a Spark Connect server (local[2], its catalog in memory) for
    every Spark Connect test of the session, stopped at the end."""
    import pyspark

    home = Path(pyspark.__file__).parent
    port = free_port()  # the server binds it a moment later
    directory = tmp_path_factory.mktemp("connect-server")
    log = directory / "server.log"
    command = [str(home / "bin" / "spark-submit"),
               "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
               "--master", "local[2]",
               "--conf", f"spark.connect.grpc.binding.port={port}",
               "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
               "--conf", "spark.ui.enabled=false",
               "--conf", "spark.sql.catalogImplementation=in-memory",
               "--conf", f"spark.sql.warehouse.dir={directory / 'warehouse'}",
               "--conf", "spark.driver.memory=1g",
               "spark-internal"]
    with log.open("w") as out:
        # spark-submit execs the JVM: this pid is the server's.
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                  env={**os.environ, "SPARK_HOME": str(home)})
    try:
        deadline = time.monotonic() + 180
        while "Spark Connect server started" not in log.read_text(errors="replace"):
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the Spark Connect server did not start:\n"
                            f"{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.5)
        yield f"sc://127.0.0.1:{port}"
    finally:
        server.terminate()
        try:
            server.wait(5)  # Spark's shutdown hooks may take longer: its data is scratch
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.fixture
def backend_url(spark_data: Path) -> str:
    """Tests written for ``backend_url`` (DuckDB and Postgres) run here on the local Spark."""
    return SPARK_URL


@pytest.fixture
def write_policy(write_policy: Callable[..., Path], spark_data: Path) -> Callable[..., Path]:
    """The suite's test policy on Spark: its ``[backend.spark]`` (every table of
    :data:`TABLES`; those the policy does not declare are dropped at start) and proxy noise,
    the only noise Spark allows."""

    def write(url: str, *, noise: str = "proxy", extra: str = "", **overrides: object) -> Path:
        if url == SPARK_URL or url.startswith("sc://"):
            extra = spark_block(spark_data, TABLES) + extra
        return write_policy(url, noise=noise, extra=extra, **overrides)

    return write


@pytest.fixture
def make_spark(make_engine: Callable[..., Engine]) -> Callable[..., Engine]:
    """Engines on the shared local Spark: ``make_spark(**overrides of write_policy)``."""

    def make(**overrides: object) -> Engine:
        return make_engine(SPARK_URL, **overrides)

    return make


@pytest.fixture
def engine(make_spark: Callable[..., Engine]) -> Engine:
    """The default test policy on Spark (tests imported from the DuckDB/Postgres suites run
    with it)."""
    return make_spark()


@pytest.fixture
def scratch(duckdb_data: str, spark_data: Path, tmp_path: Path, backend_url: str
            ) -> Iterator[Callable[..., Engine]]:
    """The suite's ``scratch(table, statements, policy_text)`` on Spark: the statements (DuckDB
    SQL; the test data's tables are readable) make tables in a DuckDB of the test's own, each
    is written to Parquet, and the policy reads them through ``[backend.spark]``."""
    con = duckdb.connect(":memory:")
    # A copy: another test of the process may hold the file open (DuckDB refuses a second
    # handle on it).
    source = tmp_path / "src.duckdb"
    shutil.copyfile(duckdb_path(duckdb_data), source)
    con.execute(f"ATTACH '{source}' AS src (READ_ONLY)")
    con.execute("SET search_path = 'memory.main,src.main'")
    engines: list[Engine] = []

    def make(table: str, statements: list[str], policy_text: str) -> Engine:
        # The statements' unqualified names must reach the test's own tables: a table of the
        # same name in the copy (left in the session's file by another test) would take an
        # unqualified DROP to the read-only copy.  Dropped from the copy, attached again.
        ours = {table, *(m.group(1) for s in statements for m in _CREATED.finditer(s))}
        con.execute("DETACH src")
        with duckdb.connect(str(source)) as writable:
            for name in ours:
                writable.execute(f"DROP TABLE IF EXISTS {name}")
        con.execute(f"ATTACH '{source}' AS src (READ_ONLY)")
        con.execute(f"DROP TABLE IF EXISTS memory.main.{table}")
        for statement in statements:
            con.execute(statement)
        directory = tmp_path / f"parquet-{uuid.uuid4().hex[:6]}"
        directory.mkdir()
        made = [r[0] for r in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = 'memory'").fetchall()]
        for name in made:
            con.execute(f"COPY memory.main.{name} TO '{directory / name}.parquet' "
                        "(FORMAT parquet)")
        text = policy_text.format(url=backend_url).replace('noise = "sql"', 'noise = "proxy"')
        listed = ", ".join(f'{t} = "{directory / t}.parquet"' for t in made)
        text += (f"\n[backend.spark]\ntables = {{ {listed} }}\n"
                 f'private_dir = "{spark_data / "private"}"\nshuffle_partitions = 2\n')
        path = tmp_path / f"scratch-{uuid.uuid4().hex[:6]}.toml"
        path.write_text(text)
        engine = Engine(load_policy(path), block_ttl_seconds=0)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()
    con.close()
