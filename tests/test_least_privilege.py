"""Wall 5, least privilege: public-only queries run on a connection that cannot read private
tables, and the start-up checks refuse or warn about roles with more than they need.

The restricted runner is called with raw SQL here (``backend.run_public``): these tests hold the
wall on its own, with the analyser out of the way.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import duckdb
import psycopg
import pytest

from chorus_py.backends import StatementFailed, duckdb_path
from chorus_py.engine import Engine
from chorus_py.errors import OperationalError, PolicyError
from chorus_py.policy import load_policy
from tests.conftest import free_port

PUBLIC_ROWS = "SELECT city, state, population FROM cities ORDER BY city"


def _engine(write_policy: Callable[..., Path], url: str, backend: str = "",
            ttl: float = 60.0) -> Engine:
    """An engine on the test policy, ``backend`` lines added to its [backend] section."""
    path = write_policy(url)
    path.write_text(path.read_text().replace(f'url = "{url}"', f'url = "{url}"\n{backend}', 1))
    return Engine(load_policy(path), block_ttl_seconds=ttl)


def _as(url: str, role: str) -> str:
    """``url`` with another user name."""
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{role}@{host}"))


@pytest.fixture
def roles(postgres_data: str) -> Iterator[Callable[..., str]]:
    """``roles(*statements)``: a new login role (``{role}`` in the statements names it) set up
    by ``statements`` in the test database; returns its name.  Dropped afterwards."""
    made: list[str] = []

    def make(*statements: str, options: str = "LOGIN") -> str:
        role = f"chorus_test_{uuid.uuid4().hex[:8]}"
        made.append(role)
        with psycopg.connect(postgres_data, autocommit=True) as admin:
            admin.execute(f"CREATE ROLE {role} {options}")
            for statement in statements:
                admin.execute(statement.format(role=role))
        return role

    yield make
    with psycopg.connect(postgres_data, autocommit=True) as admin:
        for role in reversed(made):
            admin.execute(f"DROP OWNED BY {role}")
            admin.execute(f"DROP ROLE {role}")


@pytest.fixture(params=["duckdb", pytest.param("postgres", marks=pytest.mark.postgres)])
def restricted(request: pytest.FixtureRequest,
               write_policy: Callable[..., Path]) -> Iterator[tuple[str, Engine]]:
    """(backend, engine) with the restricted connection set up as the owner guide says."""
    url = request.getfixturevalue(f"{request.param}_data")
    backend = ""
    if request.param == "postgres":
        reader = request.getfixturevalue("roles")("GRANT SELECT ON cities TO {role}")
        backend = f'public_url = "{_as(url, reader)}"'
    engine = _engine(write_policy, url, backend)
    try:
        yield request.param, engine
    finally:
        engine.close()


def test_a_public_query_runs_on_the_restricted_connection(
        restricted: tuple[str, Engine]) -> None:
    kind, engine = restricted
    if kind == "postgres":
        user = engine.backend.run_public("SELECT current_user::text").rows[0][0]
        assert user != engine.backend.run("SELECT current_user::text").rows[0][0]
        assert user.startswith("chorus_test_")
    else:  # an in-memory database of its own: the file is not attached there
        names = engine.backend.run_public("SELECT database_name FROM duckdb_databases() "
                                          "WHERE NOT internal").rows
        assert names == [("memory",)]
    answer = engine.execute(PUBLIC_ROWS, analyst="alice")
    assert answer.rows == [tuple(r) for r in engine.backend.run(PUBLIC_ROWS).rows]
    assert len(answer.rows) == 5 and not answer.report.charged


_DUCKDB_ATTACKS = [
    "SELECT COUNT(*) FROM trips",
    "SELECT rider_id FROM main.trips",
    "SELECT c.city FROM cities c JOIN visits v ON v.page = c.city",
    "SELECT * FROM cities WHERE city IN (SELECT city FROM trips)",
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM '{file}'",
    "ATTACH '{file}' AS leak (READ_ONLY)",
    "ATTACH '{file}.copy' AS leak",
    "SET enable_external_access = true",
    "SET python_enable_replacements = true",
    "INSTALL httpfs",
    "CREATE TABLE leak AS SELECT 1 AS a",
    "DROP TABLE cities",
]
_POSTGRES_ATTACKS = [
    "SELECT COUNT(*) FROM trips",
    "SELECT rider_id FROM public.trips",
    "SELECT c.city FROM cities c JOIN visits v ON v.page = c.city",
    "SELECT * FROM cities WHERE city IN (SELECT city FROM trips)",
    "SELECT pg_read_file('/etc/passwd')",
    "SET ROLE postgres",
    "SELECT set_config('role', 'postgres', false)",
    "CREATE TABLE leak (a int)",
    "DELETE FROM cities",
]


def test_the_restricted_connection_cannot_read_private_tables(
        restricted: tuple[str, Engine]) -> None:
    kind, engine = restricted
    attacks = _POSTGRES_ATTACKS if kind == "postgres" else _DUCKDB_ATTACKS
    file = duckdb_path(engine.policy.backend.url)
    for sql in attacks:
        with pytest.raises(StatementFailed):
            engine.backend.run_public(sql.format(file=file))
    # The same statements run on the main connection (reads), so the wall is what stopped them.
    assert engine.backend.run("SELECT COUNT(*) FROM trips").rows[0][0] > 0
    # Nothing was poisoned: the restricted connection still answers.
    assert len(engine.execute(PUBLIC_ROWS, analyst="alice").rows) == 5


def test_duckdb_public_copies_follow_the_file(tmp_path: Path) -> None:
    """The in-memory copies are refreshed on the catalog TTL (here 0: every query)."""
    path = tmp_path / "small.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE secret (id BIGINT, v DOUBLE)")
        con.execute("INSERT INTO secret VALUES (1, 2.5)")
        con.execute("CREATE TABLE pub (k VARCHAR, n DECIMAL(10, 2), d DATE)")
        con.execute("INSERT INTO pub VALUES ('a', 1.25, DATE '2024-01-02')")
    policy = tmp_path / "policy.toml"
    policy.write_text(f"""
[backend]
url = "duckdb:///{path}"
[privacy]
epsilon_per_block = 10
delta_per_block = 1e-6
[tables.secret]
[tables.secret.columns]
id = {{ type = "int" }}
v = {{ type = "float", lower = 0, upper = 10 }}
[tables.pub]
public = true
""")
    with Engine(load_policy(policy), block_ttl_seconds=0) as engine:
        assert engine.execute("SELECT COUNT(*) FROM pub").rows == [(1,)]
        engine.backend.run_owned(["INSERT INTO pub VALUES ('b', 2.5, NULL)"])
        rows = engine.execute("SELECT k, n, d FROM pub ORDER BY k").rows
        assert len(rows) == 2 and rows[1][0] == "b" and float(rows[1][1]) == 2.5
        assert engine.backend.run_public("SELECT data_type FROM information_schema.columns "
                                         "WHERE column_name = 'n'").rows == [("DECIMAL(10,2)",)]
        with pytest.raises(StatementFailed):
            engine.backend.run_public("SELECT * FROM secret")


@pytest.mark.postgres
@pytest.mark.parametrize("grants, named", [
    (["GRANT SELECT ON cities, trips TO {role}"], "public.trips"),
    (["GRANT SELECT ON cities TO {role}", "GRANT SELECT (city) ON trips TO {role}"],
     "public.trips"),
    (["GRANT SELECT ON cities TO {role}", "GRANT SELECT ON visits TO PUBLIC"], "public.visits"),
], ids=["table", "one column", "granted to PUBLIC"])
def test_start_up_refuses_a_public_role_that_reads_a_private_table(
        postgres_data: str, write_policy: Callable[..., Path], roles: Callable[..., str],
        grants: list[str], named: str) -> None:
    reader = roles(*grants)
    try:
        with pytest.raises(OperationalError, match=named.replace(".", r"\.")) as info:
            _engine(write_policy, postgres_data, f'public_url = "{_as(postgres_data, reader)}"')
        assert f"REVOKE SELECT ON {named} FROM {reader}" in (info.value.hint or "")
    finally:
        with psycopg.connect(postgres_data, autocommit=True) as admin:
            admin.execute("REVOKE SELECT ON visits FROM PUBLIC")


@pytest.mark.postgres
def test_start_up_refuses_a_public_role_that_can_set_role_to_a_reader(
        postgres_data: str, write_policy: Callable[..., Path], roles: Callable[..., str]) -> None:
    """A NOINHERIT member does not hold its roles' privileges, but can SET ROLE to them."""
    parent = roles("GRANT SELECT ON visits TO {role}", options="NOLOGIN")
    reader = roles("GRANT SELECT ON cities TO {role}", f"GRANT {parent} TO {{role}}",
                   options="LOGIN NOINHERIT")
    with pytest.raises(OperationalError, match=r"public\.visits"):
        _engine(write_policy, postgres_data, f'public_url = "{_as(postgres_data, reader)}"')


@pytest.mark.postgres
def test_start_up_refuses_a_superuser_or_a_role_missing_the_public_tables(
        postgres_data: str, write_policy: Callable[..., Path], roles: Callable[..., str]) -> None:
    with pytest.raises(OperationalError, match="superuser"):
        _engine(write_policy, postgres_data, f'public_url = "{postgres_data}"')
    file_reader = roles("GRANT SELECT ON cities TO {role}",
                        "GRANT pg_read_server_files TO {role}")
    with pytest.raises(OperationalError, match="pg_read_server_files"):
        _engine(write_policy, postgres_data, f'public_url = "{_as(postgres_data, file_reader)}"')
    nothing = roles()
    with pytest.raises(OperationalError, match="cannot read the public tables cities") as info:
        _engine(write_policy, postgres_data, f'public_url = "{_as(postgres_data, nothing)}"')
    assert f"GRANT SELECT ON public.cities TO {nothing}" in (info.value.hint or "")



@pytest.mark.postgres
def test_a_grant_after_the_start_stops_public_queries(
        postgres_data: str, write_policy: Callable[..., Path], roles: Callable[..., str]) -> None:
    """The role is checked again once per catalog TTL (0 here: every public query)."""
    reader = roles("GRANT SELECT ON cities TO {role}")
    engine = _engine(write_policy, postgres_data, f'public_url = "{_as(postgres_data, reader)}"',
                     ttl=0)
    with engine, psycopg.connect(postgres_data, autocommit=True) as admin:
        assert len(engine.execute(PUBLIC_ROWS, analyst="alice").rows) == 5
        admin.execute(f"GRANT SELECT (fare) ON trips TO {reader}")
        with pytest.raises(OperationalError, match=r"public queries are refused.*public\.trips"):
            engine.execute(PUBLIC_ROWS, analyst="alice")
        admin.execute(f"REVOKE SELECT (fare) ON trips FROM {reader}")
        assert len(engine.execute(PUBLIC_ROWS, analyst="alice").rows) == 5


@pytest.mark.postgres
def test_the_write_warning(postgres_data: str, write_policy: Callable[..., Path],
                           roles: Callable[..., str], caplog: pytest.LogCaptureFixture) -> None:
    # The tests connect as a superuser: warned at start, in the log and on the backend.
    with caplog.at_level(logging.WARNING, logger="chorus.backends"):
        engine = _engine(write_policy, postgres_data)
    with engine:
        assert any("superuser" in w for w in engine.backend.warnings)
        assert any("public_url" in w for w in engine.backend.warnings)
    assert any("superuser" in r.getMessage() for r in caplog.records)
    # The least-privilege setup of the owner guide: no warning at all.
    reader = roles("GRANT SELECT ON cities TO {role}")
    main = roles("GRANT SELECT ON trips, visits, cities TO {role}")
    backend = f'public_url = "{_as(postgres_data, reader)}"'
    with _engine(write_policy, _as(postgres_data, main), backend) as engine:
        assert engine.backend.warnings == ()
        answer = engine.execute("SELECT COUNT(*) FROM trips", analyst="alice", epsilon=1.0)
        assert answer.rows[0][0] > 0 and answer.report.charged
    # A main role that can write a declared table is named.
    writer = roles("GRANT SELECT, INSERT ON trips, visits, cities TO {role}")
    with _engine(write_policy, _as(postgres_data, writer), backend) as engine:
        assert [w for w in engine.backend.warnings if "can write the tables cities, trips, "
                "visits" in w]


def test_duckdb_has_no_public_url(duckdb_data: str, write_policy: Callable[..., Path]) -> None:
    with pytest.raises(PolicyError, match="public_url"):
        _engine(write_policy, duckdb_data, 'public_url = "postgresql://reader@localhost/db"')
    with _engine(write_policy, duckdb_data) as engine:
        assert engine.backend.warnings == ()



@pytest.mark.postgres
def test_chorus_serve_prints_the_warnings(postgres_data: str,
                                          write_policy: Callable[..., Path]) -> None:
    """The data owner sees them where the server starts, not only in a log."""
    import subprocess
    import sys
    import time

    port = free_port()
    chorus = Path(sys.executable).parent / "chorus"
    proc = subprocess.Popen([str(chorus), "serve", "--policy", str(write_policy(postgres_data)),
                             "--listen", f"127.0.0.1:{port}", "--rest", ""],
                            stderr=subprocess.PIPE, text=True)
    try:
        lines: list[str] = []
        deadline = time.monotonic() + 60
        assert proc.stderr is not None
        while time.monotonic() < deadline and proc.poll() is None:
            line = proc.stderr.readline()
            lines.append(line)
            if "Postgres wire protocol on" in line:
                break
        out = "".join(lines)
        assert "WARNING the proxy connects to Postgres as postgres, a superuser" in out
        assert "WARNING public queries run on the main connection" in out
    finally:
        proc.terminate()
        proc.wait(20)


# The Postgres setup of docs/owner-guide.md ("Least privilege"), {proxy} and {reader} filled in.
GUIDE_SETUP = """
REVOKE ALL ON items, pub FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO {proxy};
GRANT SELECT ON items, pub TO {proxy};
CREATE SCHEMA chorus_private AUTHORIZATION {proxy};
GRANT USAGE ON SCHEMA public TO {reader};
GRANT SELECT ON pub TO {reader};
"""


@pytest.mark.postgres
def test_the_owner_guide_setup_runs_without_warnings(postgres_url: str, tmp_path: Path) -> None:
    """The guide's roles: the proxy reads the declared tables and writes only its own schema
    (a stored sample here), public queries run as the reader; no warning at start."""
    tag = uuid.uuid4().hex[:8]
    database, proxy, reader = f"chorus_lp_{tag}", f"chorus_proxy_{tag}", f"chorus_reader_{tag}"
    url = postgres_url.rsplit("/", 1)[0] + f"/{database}"
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{database}"')
        admin.execute(f"CREATE ROLE {proxy} LOGIN")
        admin.execute(f"CREATE ROLE {reader} LOGIN")
    try:
        with psycopg.connect(url, autocommit=True) as owner:
            owner.execute("CREATE TABLE items (uid BIGINT, v DOUBLE PRECISION)")
            owner.execute("INSERT INTO items SELECT i % 50, i % 10 FROM generate_series(1, 500) i")
            owner.execute("CREATE TABLE pub (k TEXT)")
            owner.execute("INSERT INTO pub VALUES ('a'), ('b')")
            for statement in GUIDE_SETUP.format(proxy=proxy, reader=reader).split(";"):
                if statement.strip():
                    owner.execute(statement)
        policy = tmp_path / "policy.toml"
        policy.write_text(f"""
[backend]
url = "{_as(url, proxy)}"
public_url = "{_as(url, reader)}"
[privacy]
epsilon_per_block = 100
delta_per_block = 1e-6
default_epsilon = 1.0
[tables.items]
privacy_unit = "uid"
max_rows_per_unit = 2
bounding = "materialized"
[tables.items.columns]
uid = {{ type = "int", private_id = true }}
v = {{ type = "float", lower = 0, upper = 10 }}
[tables.pub]
public = true
""")
        with Engine(load_policy(policy)) as engine:
            assert engine.backend.warnings == ()
            answer = engine.execute("SELECT COUNT(*) FROM items")
            assert answer.report.charged and "chorus_private" in str(answer.report.to_dict())
            assert engine.execute("SELECT k FROM pub ORDER BY k").rows == [("a",), ("b",)]
            with pytest.raises(StatementFailed, match="permission denied"):
                engine.backend.run_public("SELECT COUNT(*) FROM chorus_private.chorus_key")
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
            admin.execute(f"DROP ROLE IF EXISTS {proxy}")
            admin.execute(f"DROP ROLE IF EXISTS {reader}")


# Shapes of statements (``{t}``: a table reference, ``{c}``: one of its columns); the private
# table is read directly, in a subquery, a CTE, a join, a set operation or a lateral function.
_SHAPES = [
    "SELECT COUNT(*) FROM {t}",
    "SELECT {c} FROM {t} LIMIT 1",
    "SELECT city FROM cities WHERE EXISTS (SELECT 1 FROM {t})",
    "WITH x AS (SELECT {c} FROM {t}) SELECT COUNT(*) FROM x",
    "SELECT COUNT(p.{c}) FROM cities JOIN {t} AS p ON TRUE",
    "SELECT CAST(city AS TEXT) FROM cities UNION ALL SELECT CAST({c} AS TEXT) FROM {t}",
    "SELECT (SELECT MAX({c}) FROM {t}) FROM cities",
]
_PRIVATE = {"trips": ["rider_id", "fare", "city"], "visits": ["page", "seconds"]}


def test_no_statement_shape_reads_a_private_table_on_the_restricted_connection(
        restricted: tuple[str, Engine]) -> None:
    """Every shape over a private table fails there; the same shape over the public table
    answers exactly what the main connection answers (the wall costs no correctness)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    kind, engine = restricted
    schema = "public." if kind == "postgres" else "main."

    @settings(max_examples=40, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(shape=st.sampled_from(_SHAPES), table=st.sampled_from(sorted(_PRIVATE)),
           qualified=st.booleans(), data=st.data())
    def check(shape: str, table: str, qualified: bool, data: st.DataObject) -> None:
        column = data.draw(st.sampled_from(_PRIVATE[table]))
        ref = (schema if qualified else "") + table
        with pytest.raises(StatementFailed):
            engine.backend.run_public(shape.format(t=ref, c=column))
        public = shape.format(t="cities", c=data.draw(st.sampled_from(["city", "population"])))
        assert sorted(map(tuple, engine.backend.run_public(public).rows), key=repr) == \
            sorted(map(tuple, engine.backend.run(public).rows), key=repr)

    check()
