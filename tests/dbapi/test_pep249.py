"""PEP 249 compliance of ``chorus_py.connect``: in-process (DuckDB, Postgres) and remote (REST)."""

from __future__ import annotations

import datetime as dt
import threading
from decimal import Decimal

import pytest

import chorus_py
from chorus_py.clients import dbapi
from chorus_py.errors import BudgetExhausted, QueryRefused, QuerySyntaxError, UndefinedTable
from chorus_py.report import PrivacyReport
from tests.conftest import free_port

COUNT_STATES = "SELECT state, COUNT(*) AS n FROM cities GROUP BY state ORDER BY state"
STATES = [("CA", 2), ("IL", 1), ("NY", 1), ("WA", 1)]


def spent(engine) -> float:
    return sum(b.epsilon_consumed + b.epsilon_allocated for b in engine.ledger.blocks())


# -- module interface ---------------------------------------------------------------------------

def test_module_globals() -> None:
    assert dbapi.apilevel == "2.0"
    assert dbapi.threadsafety in (0, 1, 2, 3)
    assert dbapi.paramstyle == "named"
    assert chorus_py.connect is dbapi.connect


def test_exception_hierarchy() -> None:
    assert issubclass(dbapi.Warning, Exception)
    assert issubclass(dbapi.Error, Exception)
    assert issubclass(dbapi.InterfaceError, dbapi.Error)
    assert issubclass(dbapi.DatabaseError, dbapi.Error)
    for name in ("DataError", "OperationalError", "IntegrityError", "InternalError",
                 "ProgrammingError", "NotSupportedError"):
        assert issubclass(getattr(dbapi, name), dbapi.DatabaseError), name
        assert getattr(dbapi.Connection, name) is getattr(dbapi, name)
    # the proxy's own errors are PEP 249 errors
    assert issubclass(QueryRefused, dbapi.ProgrammingError)
    assert issubclass(BudgetExhausted, dbapi.OperationalError)
    assert issubclass(dbapi.InvalidAuthorization, dbapi.OperationalError)


def test_type_objects_and_constructors() -> None:
    assert dbapi.STRING == "text" and dbapi.STRING != "integer"
    assert dbapi.NUMBER == "integer" and dbapi.NUMBER == "float"
    assert dbapi.DATETIME == "timestamp" and dbapi.DATETIME == "date"
    assert dbapi.BINARY == "blob" and dbapi.ROWID == "rowid"
    assert dbapi.STRING != "integer" and dbapi.NUMBER != "text" and dbapi.BINARY != "text"
    assert dbapi.Date(2026, 1, 2) == dt.date(2026, 1, 2)
    assert dbapi.Time(8, 30, 0) == dt.time(8, 30)
    assert dbapi.Timestamp(2026, 1, 2, 8, 30, 0) == dt.datetime(2026, 1, 2, 8, 30)
    assert isinstance(dbapi.DateFromTicks(0), dt.date)
    assert isinstance(dbapi.TimeFromTicks(0), dt.time)
    assert isinstance(dbapi.TimestampFromTicks(0), dt.datetime)
    assert dbapi.Binary(b"ab") == b"ab"


# -- connection ---------------------------------------------------------------------------------

def test_connection_methods(connect) -> None:
    conn = connect()
    assert conn.analyst == "alice" and conn.dialect in ("duckdb", "postgres")
    conn.commit()
    conn.rollback()
    cur = conn.cursor()
    assert isinstance(cur, dbapi.Cursor) and cur.connection is conn
    conn.close()
    conn.close()  # a second close is harmless
    assert conn.closed
    for call in (conn.cursor, conn.commit, conn.rollback):
        with pytest.raises(dbapi.InterfaceError):
            call()
    with pytest.raises(dbapi.InterfaceError):
        cur.execute(COUNT_STATES)


def test_connection_context_manager_closes(connect) -> None:
    with connect() as conn:
        conn.cursor().execute(COUNT_STATES)
    assert conn.closed


# -- cursor -------------------------------------------------------------------------------------

def test_description_rowcount_and_fetching(connect) -> None:
    cur = connect().cursor()
    assert cur.description is None and cur.rowcount == -1 and cur.arraysize == 1
    with pytest.raises(dbapi.ProgrammingError):
        cur.fetchone()
    assert cur.execute(COUNT_STATES) is cur
    assert [d[0] for d in cur.description] == ["state", "n"]
    assert all(len(d) == 7 for d in cur.description)
    assert cur.description[0][1] == dbapi.STRING and cur.description[1][1] == dbapi.NUMBER
    assert cur.rowcount == 4
    assert cur.fetchone() == STATES[0]
    assert cur.fetchmany() == STATES[1:2]  # arraysize rows
    cur.arraysize = 5
    assert cur.fetchmany() == STATES[2:]
    assert cur.fetchmany(3) == [] and cur.fetchone() is None and cur.fetchall() == []
    cur.execute(COUNT_STATES)
    assert cur.fetchall() == STATES
    cur.execute(COUNT_STATES)
    assert list(cur) == STATES
    assert cur.nextset() is None
    cur.setinputsizes([None])
    cur.setoutputsize(10)
    cur.close()
    assert cur.closed
    with pytest.raises(dbapi.InterfaceError):
        cur.fetchall()
    with pytest.raises(dbapi.InterfaceError):
        cur.execute(COUNT_STATES)


def test_cursor_context_manager(connect) -> None:
    with connect().cursor() as cur:
        cur.execute(COUNT_STATES)
    assert cur.closed


def test_private_query_report_and_epsilon(connect) -> None:
    conn = connect(epsilon=0.3)
    cur = conn.cursor()
    cur.execute("SELECT city, COUNT(*) AS trips, AVG(fare) AS fare FROM trips GROUP BY city "
                "ORDER BY city")
    assert [r[0] for r in cur.fetchall()] == sorted(["SF", "NYC", "LA", "CHI", "SEA"])
    report = cur.privacy_report
    assert isinstance(report, PrivacyReport)
    assert report.charged and report.analyst == "alice"
    assert report.epsilon == pytest.approx(0.3) and len(report.blocks) == 90
    assert report.columns[1].role == "aggregate" and report.measurements
    cur.execute("SELECT COUNT(*) FROM trips", epsilon=0.2)
    assert cur.privacy_report.epsilon == pytest.approx(0.2)
    assert isinstance(cur.fetchone()[0], int)
    conn.epsilon = None  # back to the policy's default (1.0)
    cur.execute("SELECT COUNT(*) FROM trips")
    assert cur.privacy_report.epsilon == pytest.approx(1.0)
    cur.execute(COUNT_STATES)
    assert cur.privacy_report.charged is False and cur.privacy_report.epsilon == 0


def test_explain_charges_nothing(connect) -> None:
    cur = connect().cursor()
    before = spent(connect.engine())
    report = cur.explain("SELECT AVG(fare) FROM trips WHERE city = :c", {"c": "SF"},
                         epsilon=0.25)
    assert report.charged is False and report.epsilon == pytest.approx(0.25)
    assert spent(connect.engine()) == before


def test_named_parameters_are_bound_as_literals(connect) -> None:
    cur = connect().cursor()
    cur.execute("SELECT COUNT(*) FROM cities WHERE state = :state", {"state": "CA"})
    assert cur.fetchall() == [(2,)]
    # an injection attempt stays one string literal
    cur.execute("SELECT COUNT(*) FROM cities WHERE state = :state",
                {"state": "CA' OR '1'='1"})
    assert cur.fetchall() == [(0,)]
    cur.execute("SELECT COUNT(*) FROM cities WHERE population > :p AND state <> :s "
                "AND city <> ':s'", {"p": Decimal("1000000"), "s": "NY"})
    assert cur.fetchall() == [(2,)]  # LA, CHI
    cur.execute("SELECT COUNT(*) FROM cities WHERE (population > :p) = :flag",
                {"p": 1_000_000.5, "flag": True, "unused": None})
    assert cur.fetchall() == [(3,)]
    cur.execute("SELECT COUNT(*) FROM trips WHERE pickup_time >= :t",
                {"t": dt.datetime(2026, 3, 30)}, epsilon=0.1)
    assert cur.privacy_report.blocks == ("trips/2026-03-30", "trips/2026-03-31")
    cur.execute("SELECT COUNT(*) FROM trips WHERE pickup_time >= :d",
                {"d": dt.date(2026, 3, 31)}, epsilon=0.1)
    assert cur.privacy_report.blocks == ("trips/2026-03-31",)


@pytest.mark.parametrize(("params", "error"), [
    ({}, dbapi.ProgrammingError),                       # :state has no value (engine refuses)
    ({"other": 1}, dbapi.ProgrammingError),             # :state has no value
    (("CA",), dbapi.ProgrammingError),                  # positional with paramstyle named
    ({"state": float("nan")}, dbapi.DataError),
    ({"state": b"CA"}, dbapi.NotSupportedError),
    ({"state": ["CA", "NY"]}, dbapi.ProgrammingError),
    ({"state": "C\x00A"}, dbapi.DataError),
])
def test_bad_parameters_cost_nothing(connect, params, error) -> None:
    cur = connect().cursor()
    before = spent(connect.engine())
    with pytest.raises(error):
        cur.execute("SELECT COUNT(*) FROM trips WHERE city = :state", params)
    assert spent(connect.engine()) == before


def test_errors_map_onto_the_hierarchy(connect) -> None:
    cur = connect().cursor()
    before = spent(connect.engine())
    with pytest.raises(QueryRefused) as refused:
        cur.execute("SELECT * FROM trips")
    assert refused.value.sqlstate == "42501" and refused.value.hint
    with pytest.raises(QuerySyntaxError):
        cur.execute("SELECT COUNT(* FROM trips")
    with pytest.raises(UndefinedTable):
        cur.execute("SELECT COUNT(*) FROM secrets")
    with pytest.raises(dbapi.ProgrammingError):
        cur.execute("SELECT COUNT(*) FROM trips", epsilon=-1.0)
    with pytest.raises(dbapi.ProgrammingError):
        cur.execute(42)  # type: ignore[arg-type]
    assert cur.description is None and cur.privacy_report is None
    assert spent(connect.engine()) == before


def test_executemany_refuses_writes_and_costs_nothing(connect) -> None:
    cur = connect().cursor()
    before = spent(connect.engine())
    for sql in ("INSERT INTO trips (trip_id) VALUES (:id)", "SELECT COUNT(*) FROM trips"):
        with pytest.raises(dbapi.NotSupportedError):
            cur.executemany(sql, [{"id": 1}, {"id": 2}])
    with pytest.raises(dbapi.NotSupportedError):
        cur.callproc("pg_sleep", [1])
    with pytest.raises(QueryRefused):
        cur.execute("DELETE FROM trips WHERE trip_id = :id", {"id": 1})
    assert spent(connect.engine()) == before


def test_connections_share_one_budget(connect) -> None:
    engine = connect.engine()
    before = spent(engine)
    with connect() as first, connect() as second:
        first.cursor().execute("SELECT COUNT(*) FROM visits", epsilon=0.5)
        second.cursor().execute("SELECT COUNT(*) FROM visits", epsilon=0.5)
    assert spent(engine) == pytest.approx(before + 1.0)


def test_threads_share_a_connection(connect) -> None:
    conn = connect()
    results: list[list[tuple]] = []

    def run() -> None:
        with conn.cursor() as cur:
            cur.execute(COUNT_STATES)
            results.append(cur.fetchall())

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == [STATES] * 4


def test_dates_come_back_as_dates(connect) -> None:
    cur = connect().cursor()
    cur.execute("SELECT DATE '2026-01-02' AS d, COUNT(*) AS n FROM cities")
    (day, n), = cur.fetchall()
    assert day == dt.date(2026, 1, 2) and n == 5
    assert cur.description[0][1] == dbapi.DATETIME


def test_budget_exhausted_is_an_operational_error(connect, tmp_path) -> None:
    from chorus_py.engine import Engine
    from tests.rest.harness import ALICE_TOKEN, policy_with_tokens, serve_engine

    path = tmp_path / "small.toml"
    path.write_text(policy_with_tokens(connect.engine().policy.backend.url,
                                       epsilon_per_block=1.0, max_epsilon=1.0))

    def exhaust(conn: dbapi.Connection) -> BudgetExhausted:
        cur = conn.cursor()
        cur.execute("SELECT COUNT(*) FROM visits", epsilon=0.75)
        with pytest.raises(BudgetExhausted) as err:
            cur.execute("SELECT COUNT(*) FROM visits", epsilon=0.75)
        return err.value

    if connect.kind == "remote-duckdb":
        with Engine.from_policy(path) as engine, serve_engine(engine) as server, \
                chorus_py.connect(server.url, token=ALICE_TOKEN) as conn:
            error = exhaust(conn)
    else:
        with chorus_py.connect(policy=path, analyst="alice") as conn:
            error = exhaust(conn)
    assert isinstance(error, dbapi.OperationalError) and error.sqlstate == "53400"
    assert "visits" in error.message and error.hint


# -- connecting ---------------------------------------------------------------------------------

def test_remote_connection_errors(remote) -> None:
    from tests.rest.harness import BOB_TOKEN, OWNER_TOKEN

    with pytest.raises(dbapi.InvalidAuthorization) as err:
        chorus_py.connect(remote.url, token="not-a-token")
    assert isinstance(err.value, dbapi.OperationalError) and err.value.sqlstate == "28000"
    with pytest.raises(dbapi.InterfaceError, match="analyst"):
        chorus_py.connect(remote.url, token=OWNER_TOKEN)
    with pytest.raises(dbapi.InterfaceError, match="bob"):
        chorus_py.connect(remote.url, token=BOB_TOKEN, analyst="alice")
    with chorus_py.connect(remote.url, token=BOB_TOKEN, analyst="bob") as conn:
        assert conn.analyst == "bob"
    port = free_port()  # nothing listens on it
    with pytest.raises(dbapi.OperationalError, match="cannot reach"):
        chorus_py.connect(f"http://127.0.0.1:{port}", token="x", timeout=5)


def test_connect_arguments(duckdb_policy, monkeypatch) -> None:
    with pytest.raises(dbapi.InterfaceError):
        chorus_py.connect()
    with pytest.raises(dbapi.InterfaceError, match="token"):
        monkeypatch.delenv("CHORUS_TOKEN", raising=False)
        chorus_py.connect("http://127.0.0.1:1")
    with pytest.raises(dbapi.InterfaceError):
        chorus_py.connect("http://127.0.0.1:1", token="t", policy=duckdb_policy)
    with pytest.raises(dbapi.InterfaceError):
        chorus_py.connect(policy=duckdb_policy, token="t")
    with pytest.raises(dbapi.InterfaceError):
        chorus_py.connect(str(duckdb_policy), policy=duckdb_policy)
    with pytest.raises(dbapi.ProgrammingError, match="unknown analyst"):
        chorus_py.connect(policy=duckdb_policy, analyst="mallory")
    with pytest.raises(dbapi.ProgrammingError, match="no analyst"):
        chorus_py.connect(policy=duckdb_policy)  # two analysts: name one
    with pytest.raises(dbapi.Error):
        chorus_py.connect(policy=duckdb_policy.parent / "missing.toml", analyst="alice")
    with chorus_py.connect(str(duckdb_policy), analyst="bob") as conn:  # the policy as dsn
        assert conn.analyst == "bob"
    engine = dbapi._shared_engine(duckdb_policy)
    with chorus_py.connect(engine=engine, analyst="alice") as conn:
        conn.cursor().execute(COUNT_STATES)
    engine.execute(COUNT_STATES, analyst="alice")  # an engine you pass stays open


def test_cursor_intervals_give_each_noisy_cell_its_error_bar(connect) -> None:
    """Error bars (issue 19) through the driver, in-process and over REST alike."""
    with connect() as conn:
        cur = conn.cursor()
        assert cur.intervals is None  # before any execute
        cur.execute("SELECT city, COUNT(*) AS n, AVG(fare) AS a FROM trips GROUP BY city",
                    epsilon=2.0)
        rows, intervals = cur.fetchall(), cur.intervals
        assert intervals is not None and len(intervals) == len(rows) == 5
        for row, (key, n, a) in zip(rows, intervals, strict=True):
            assert key is None
            assert n["lower"] <= row[1] <= n["upper"] and n["text"].endswith("(noise)")
            assert a["method"] == "simulation" and a["lower"] <= row[2] <= a["upper"]
