"""Shared fixtures: the same tests run on an embedded DuckDB and on a real Postgres.

Postgres is at ``CHORUS_TEST_PG`` (default postgresql://postgres@127.0.0.1:5432/test); each test
session creates its own database there and drops it at the end.  When the server is unreachable
the Postgres tests are skipped, unless ``CHORUS_REQUIRE_POSTGRES=1`` (set by ``.ci/run``), which
turns that into a failure.
"""

from __future__ import annotations

import math
import os
import re
import socket
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from chorus_py.demo import generate_demo
from chorus_py.engine import Engine
from chorus_py.policy import load_policy
from chorus_py.stores.samples import BoundedSamples

PG_ADMIN_URL = os.environ.get("CHORUS_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
TEST_ROWS = 4000

# A policy for tests: the demo's trips (user level, a fixed cap k = 10 unless a test asks for
# contribution = "auto"), an event-level table, a public table.
# Budgets are large so tests can use a large epsilon and check answers against the truth.
POLICY_TEMPLATE = """
[backend]
url = "{url}"

[privacy]
epsilon_per_block = {epsilon_per_block}
delta_per_block = 1e-3
default_epsilon = 1.0
default_delta = 1e-8
max_epsilon_per_query = {max_epsilon}
max_delta_per_query = 1e-4
noise = "{noise}"

[tables.trips]
privacy_unit = "rider_id"
max_rows_per_unit = {k}
contribution = "{contribution}"
ranked_copy = true
block = {{ column = "pickup_time", size = "1 day", start = "2026-01-01", end = "2026-04-01" }}

[tables.trips.columns]
trip_id     = {{ type = "int" }}
rider_id    = {{ type = "int", private_id = true }}
driver_id   = {{ type = "int" }}
city        = {{ type = "text", public_values = ["SF", "NYC", "LA", "CHI", "SEA"] }}
pickup_time = {{ type = "timestamp" }}
fare        = {{ type = "float", lower = 0, upper = 200 }}
distance_km = {{ type = "float", lower = 0, upper = 100 }}

[tables.visits]
[tables.visits.columns]
visit_id = {{ type = "int" }}
page     = {{ type = "text" }}
seconds  = {{ type = "float", lower = 0, upper = 600 }}

[tables.cities]
public = true

[analysts.alice]
[analysts.bob]
max_epsilon_per_query = 0.5
"""

_VISITS_SQL = [
    "DROP TABLE IF EXISTS visits",
    "CREATE TABLE visits (visit_id BIGINT, page TEXT, seconds DOUBLE PRECISION)",
    # 1000 visits: pages 'home' (500), 'about' (300), 'blog' (200); seconds = visit_id % 700
    "INSERT INTO visits SELECT i, CASE WHEN i % 10 < 5 THEN 'home' WHEN i % 10 < 8 THEN 'about' "
    "ELSE 'blog' END, CAST(i % 700 AS DOUBLE PRECISION) FROM generate_series(1, 1000) AS s(i)",
]


#: Ports handed out by :func:`free_port` in this process (never twice).
_PORTS_GIVEN: set[int] = set()


def free_port() -> int:
    """A port on 127.0.0.1 for a server a test starts (or for nothing to listen on).

    Not the OS's pick (``bind(("127.0.0.1", 0))``): that comes from the ephemeral range, where
    another test worker's probe, or any client connection, may be handed the same port between
    the probe and the server's bind (seen under pytest-xdist: a test read another worker's
    server).  Each worker takes ports from its own thousand below the ephemeral range (20000 +
    1000 x its number), each once, and only one it can bind now."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    base = 20_000 + 1000 * (int(worker) if worker.isdigit() else 0)
    for port in range(base, base + 1000):
        if port in _PORTS_GIVEN:
            continue
        _PORTS_GIVEN.add(port)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port left in {base}-{base + 999}")


def _postgres_available() -> bool:
    try:
        with psycopg.connect(PG_ADMIN_URL, connect_timeout=3):
            return True
    except psycopg.Error:
        return False


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A fresh Postgres database for this session (dropped at the end)."""
    if not _postgres_available():
        if os.environ.get("CHORUS_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"Postgres is required but unreachable at {PG_ADMIN_URL}")
        pytest.skip(f"Postgres unreachable at {PG_ADMIN_URL}")
    name = f"chorus_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as con:
        con.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    yield f"{base}/{name}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as con:
        con.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def duckdb_data(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The demo trips, the visits table and the public cities in a DuckDB file."""
    import duckdb

    directory = tmp_path_factory.mktemp("duckdb")
    generate_demo(directory, rows=TEST_ROWS)
    path = directory / "demo.duckdb"
    con = duckdb.connect(str(path))
    for stmt in _VISITS_SQL:
        con.execute(stmt.replace("DOUBLE PRECISION", "DOUBLE"))
    con.close()
    return f"duckdb:///{path}"


@pytest.fixture(scope="session")
def postgres_data(postgres_url: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The same data in the session's Postgres database."""
    generate_demo(tmp_path_factory.mktemp("pg"), backend_url=postgres_url, rows=TEST_ROWS)
    with psycopg.connect(postgres_url, autocommit=True) as con:
        for stmt in _VISITS_SQL:
            con.execute(stmt)
    return postgres_url


@pytest.fixture(params=["duckdb", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend_url(request: pytest.FixtureRequest) -> str:
    """Each test using it runs once per backend."""
    return request.getfixturevalue(f"{request.param}_data")


@pytest.fixture
def write_policy(tmp_path: Path) -> Callable[..., Path]:
    """Write a test policy for a backend URL; keyword arguments override the template."""

    def write(url: str, *, noise: str = "sql", k: int = 10, epsilon_per_block: float = 1000.0,
              max_epsilon: float = 500.0, contribution: str = "fixed", extra: str = "") -> Path:
        path = tmp_path / f"policy-{uuid.uuid4().hex[:6]}.toml"
        path.write_text(POLICY_TEMPLATE.format(
            url=url, noise=noise, k=k, epsilon_per_block=epsilon_per_block,
            max_epsilon=max_epsilon, contribution=contribution) + extra)
        return path

    return write


@pytest.fixture(autouse=True)
def _ranked_copies_built_in_the_query(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ranked copy is built by the query that first needs it (``chorus serve`` builds it in
    the background, and queries rank their own rows until it is there): the statements a test
    sees do not depend on a build's timing.  tests/test_ranked_copy.py tests the background."""
    monkeypatch.setattr(BoundedSamples, "build_in_background", False)


@pytest.fixture
def make_engine(write_policy: Callable[..., Path]) -> Iterator[Callable[..., Engine]]:
    """Build engines on a backend URL (closed after the test)."""
    engines: list[Engine] = []

    def make(url: str, **overrides: object) -> Engine:
        engine = Engine(load_policy(write_policy(url, **overrides)))
        engines.append(engine)
        # As `chorus serve` does, but waiting: queries read the ranked copies from the start.
        engine.warm_up(wait=True)
        return engine

    yield make
    for engine in engines:
        engine.close()


@pytest.fixture
def engine(backend_url: str, make_engine: Callable[..., Engine]) -> Engine:
    """An engine with the default test policy, on each backend."""
    return make_engine(backend_url)


_CREATED = re.compile(r"CREATE\s+(?:OR\s+REPLACE\s+)?TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?"
                      r"(\w+)(?![\w.])", re.I)


@pytest.fixture
def scratch(backend_url: str, tmp_path: Path) -> Iterator[Callable[..., Engine]]:
    """Engines on a table a test creates: ``scratch(table, statements, policy_text)``.

    Runs ``statements`` on the backend (after dropping ``table``), writes ``policy_text`` (its
    ``{url}`` filled in) and returns an engine that re-reads block windows and stored samples on
    every query.  The table and the proxy's schema are dropped afterwards.
    """
    from chorus_py.backends import open_backend

    admin = open_backend(backend_url)
    engines: list[Engine] = []
    tables: set[str] = set()

    def make(table: str, statements: list[str], policy_text: str) -> Engine:
        # Every table the statements make is dropped too: the session's DuckDB file is shared
        # by the tests of a worker, and a table left there would be another test's (the Spark
        # suite copies the file, and its own statements' DROP would reach the copy).
        tables.update([table, *(m.group(1) for s in statements
                                for m in _CREATED.finditer(s))])
        admin.run_owned([f"DROP TABLE IF EXISTS {table}", *statements])
        path = tmp_path / f"scratch-{uuid.uuid4().hex[:6]}.toml"
        path.write_text(policy_text.format(url=backend_url))
        engine = Engine(load_policy(path), block_ttl_seconds=0)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()
    admin.run_owned([*(f"DROP TABLE IF EXISTS {t}" for t in tables),
                     "DROP SCHEMA IF EXISTS chorus_private CASCADE"])
    admin.close()


def nothing_spent(engine: Engine) -> bool:
    """True when no block has any allocated or consumed budget."""
    return all(b.epsilon_allocated == 0 and b.epsilon_consumed == 0 and b.delta_consumed == 0
               for b in engine.ledger.blocks()) and not engine.ledger.claims()


def tolerance(column: Any) -> float:
    """How far a noisy answer may stray from the truth in a test: P(exceeded) < 1e-9.

    Laplace-type noise of scale b exceeds t with probability exp(-t/b) (discrete Laplace: less),
    so t = b ln(2e9) covers both tails; snapping rounds to a step of at most 2b (+ b), and 1 more
    absorbs integer rounding.  Tests never depend on a 95% bound that may be 0 for tiny scales.
    """
    scale = float(column.scale)
    return scale * (math.log(2e9) + 1.0) + 1.0


@pytest.fixture
def policy_engine(tmp_path: Path) -> Iterator[Callable[[str], Engine]]:
    """``make(policy_text)``: an engine on that policy (written under ``tmp_path``) that
    re-reads block windows on every query; every engine made is closed afterwards."""
    made: list[Engine] = []

    def make(text: str) -> Engine:
        path = tmp_path / f"policy-{uuid.uuid4().hex[:6]}.toml"
        path.write_text(text)
        engine = Engine(load_policy(path), block_ttl_seconds=0)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.close()


#: The params of a fixture that makes its data on each backend (``request.param`` of
#: :func:`table_with_rows`); Postgres carries the ``postgres`` mark.
BACKENDS = ["duckdb", pytest.param("postgres", marks=pytest.mark.postgres)]


def ranked_copy_name(engine: Engine, table: str) -> str:
    """The name of ``table``'s ranked copy in the proxy's schema (built; not its twin)."""
    (copy,) = [t for t in engine.backend.owned_tables()
               if re.fullmatch(rf"{re.escape(table)}__ranked_[0-9a-f]{{16}}", t)]
    return copy


@contextmanager
def table_with_rows(request: pytest.FixtureRequest, tmp_path: Path, prefix: str, columns: str,
                    rows: Sequence[tuple[Any, ...]]) -> Iterator[tuple[str, str]]:
    """(backend URL, table name) of a fresh table ``prefix_<hex>`` (``columns`` in Postgres
    types) holding ``rows``, on the backend ``request.param`` names ("duckdb": a file of its
    own under ``tmp_path``; "postgres": the session's database, the table dropped after)."""
    with tables_with_rows(request, tmp_path, prefix, {prefix: (columns, rows)}) as (url, names):
        yield url, names[prefix]


@contextmanager
def tables_with_rows(request: pytest.FixtureRequest, tmp_path: Path, file: str,
                     tables: Mapping[str, tuple[str, Sequence[tuple[Any, ...]]]]
                     ) -> Iterator[tuple[str, dict[str, str]]]:
    """(backend URL, {prefix: table name}) of fresh tables ``prefix_<hex>``, one per entry of
    ``tables`` (prefix: (columns in Postgres types, rows)), in one database of the backend
    ``request.param`` names ("duckdb": the file ``file.duckdb`` under ``tmp_path``;
    "postgres": the session's database, the tables dropped after)."""
    names = {prefix: f"{prefix}_{uuid.uuid4().hex[:8]}" for prefix in tables}
    if request.param == "duckdb":
        import duckdb

        path = tmp_path / f"{file}.duckdb"
        con = duckdb.connect(str(path))
        for prefix, (columns, rows) in tables.items():
            con.execute(f"CREATE TABLE {names[prefix]} ({columns})".replace(
                "DOUBLE PRECISION", "DOUBLE"))
            con.executemany(f"INSERT INTO {names[prefix]} VALUES "
                            f"({', '.join('?' * len(rows[0]))})", rows)
        con.close()
        yield f"duckdb:///{path}", names
        return
    url = request.getfixturevalue("postgres_url")
    with psycopg.connect(url, autocommit=True) as con:
        for prefix, (columns, rows) in tables.items():
            con.execute(f"CREATE TABLE {names[prefix]} ({columns})")
            with con.cursor() as cur:
                cur.executemany(f"INSERT INTO {names[prefix]} VALUES "
                                f"({', '.join(['%s'] * len(rows[0]))})", rows)
    try:
        yield url, names
    finally:
        with psycopg.connect(url, autocommit=True) as con:
            for name in names.values():
                con.execute(f"DROP TABLE IF EXISTS {name}")
