"""Real Postgres clients against a running proxy over a real socket, on DuckDB and Postgres.

psql (including ``\\d`` and ``\\dt``), psycopg 3 (simple, client-side and server-side
parameters, binary results), asyncpg, pg8000, SQLAlchemy with pandas, and pgjdbc from Java.
Each answer must be a noisy aggregate whose privacy report arrives as a NOTICE, charged to the
connection's analyst; catalog queries are answered from the proxy's fake catalog.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from pathlib import Path

import psycopg
import pytest

from tests.server.conftest import PASSWORDS, Wire

COUNT = "SELECT COUNT(*) FROM trips"
TEST_ROWS = 4000


def consumed(wire: Wire) -> float:
    return sum(b.epsilon_consumed for b in wire.engine.ledger.blocks())


def roughly_rows(value: float) -> bool:
    """A noisy COUNT(*) of the 4000 test trips (k = 10 per rider, epsilon 1: noise ~ 10)."""
    return 0.5 * TEST_ROWS < value < 1.5 * TEST_ROWS


# -- psql -------------------------------------------------------------------------------------


def psql(wire: Wire, *commands: str, user: str = "alice") -> subprocess.CompletedProcess:
    args = ["psql", "-X", "-v", "ON_ERROR_STOP=0", "-v", "VERBOSITY=verbose",
            f"postgresql://{user}@{wire.host}:{wire.port}/chorus?sslmode=disable"]
    for c in commands:
        args += ["-c", c]
    env = {**os.environ, "PGPASSWORD": PASSWORDS.get(user, "wrong"), "PGCONNECT_TIMEOUT": "10"}
    return subprocess.run(args, capture_output=True, text=True, timeout=60, env=env, check=False)


@pytest.mark.skipif(shutil.which("psql") is None, reason="psql is not installed")
def test_psql(wire: Wire) -> None:
    before = consumed(wire)
    out = psql(wire, "\\dt", "\\d trips", "\\d", "SELECT COUNT(*) AS n FROM trips",
               "SELECT city, AVG(fare) FROM trips GROUP BY city ORDER BY city",
               "SELECT * FROM trips", "SET chorus.epsilon = 0.25", "SHOW chorus.epsilon",
               "SELECT version()")
    assert out.returncode == 0, out.stderr
    # \dt and \d list the policy's tables only; \d trips shows the declared columns and types
    assert "public | trips  | table" in out.stdout and "public | visits | table" in out.stdout
    assert "public | cities | table" in out.stdout
    assert 'Table "public.trips"' in out.stdout
    assert "pickup_time | timestamp without time zone" in out.stdout
    assert "fare        | double precision" in out.stdout
    # the answers, and their privacy reports as NOTICEs on stderr
    assert "(1 row)" in out.stdout and "(5 rows)" in out.stdout
    assert "NOTICE:  00000: chorus: charged epsilon=1 delta=0 to analyst alice" in out.stderr
    assert "ERROR:  42501: SELECT * would release raw rows" in out.stderr
    assert " 0.25\n" in out.stdout
    assert "PostgreSQL 15.0 (chorus-py" in out.stdout
    assert consumed(wire) > before


# -- psycopg 3 ----------------------------------------------------------------------------------


def test_psycopg(wire: Wire) -> None:
    notices: list[tuple[str, str]] = []
    with psycopg.connect(wire.url(), autocommit=True) as con:
        con.add_notice_handler(lambda d: notices.append((d.message_primary or "",
                                                         d.message_detail or "")))
        (n,) = con.execute(COUNT).fetchone()
        assert isinstance(n, int) and roughly_rows(n)
        assert notices and "charged epsilon=1" in notices[-1][0]
        assert "analyst alice" in notices[-1][0]
        assert "discrete_laplace" in notices[-1][1]
        # client-side binding (psycopg's default) and server-side binding (prepare=True)
        for prepare in (False, True):
            rows = con.execute("SELECT city, COUNT(*) AS n, AVG(fare) AS f FROM trips "
                               "WHERE fare > %s AND city IN (%s, %s) GROUP BY city "
                               "ORDER BY city", (5.5, "SF", "LA"), prepare=prepare).fetchall()
            assert [r[0] for r in rows] == ["LA", "SF"]
            assert all(isinstance(r[1], int) and isinstance(r[2], float) for r in rows)
        # timestamps as parameters and as group keys (released by a noisy threshold: a large
        # epsilon makes sure they are), text and binary results
        con.execute("SET chorus.epsilon = 400")
        con.execute("SET chorus.delta TO 1e-5")
        for binary in (False, True):
            cur = con.cursor(binary=binary)
            rows = cur.execute(
                "SELECT DATE_TRUNC('month', pickup_time) AS m, COUNT(*) FROM trips "
                "WHERE pickup_time >= %s GROUP BY 1 ORDER BY 1",
                (__import__("datetime").datetime(2026, 2, 1),)).fetchall()
            assert len(rows) == 2 and rows[0][0].month == 2
        con.execute("RESET chorus.epsilon")
        con.execute("SET chorus.delta = DEFAULT")
        # a parameter value can never change the query's shape
        rows = con.execute("SELECT COUNT(*) FROM trips WHERE city = %s",
                           ("SF' OR 1=1 --",), prepare=True).fetchall()
        assert len(rows) == 1


def test_error_bars_over_the_wire(wire: Wire) -> None:
    """SHOW chorus.intervals: the 95% interval of every noisy cell of the session's last
    answer, as rows any client (and BI tool) can read; the NOTICE says where to find them."""
    notices: list[str] = []
    with psycopg.connect(wire.url(), autocommit=True) as con:
        con.add_notice_handler(lambda d: notices.append(d.message_detail or ""))
        assert con.execute("SHOW chorus.intervals").fetchall() == []  # no answer yet
        before = consumed(wire)
        answer = con.execute("SELECT city, COUNT(*) AS n, AVG(fare) AS f FROM trips "
                             "WHERE city IN ('SF', 'LA') GROUP BY city ORDER BY city").fetchall()
        assert "SHOW chorus.intervals" in notices[-1]
        spent = consumed(wire)
        for prepare in (False, True):
            cur = con.execute("SHOW chorus.intervals", prepare=prepare)
            assert [d.name for d in cur.description] == [
                "row", "column", "value", "lower", "upper", "noise_lower", "noise_upper",
                "interval"]
            rows = cur.fetchall()
            # one row per noisy cell: two groups x (n, f); the keys have no interval
            assert [(r[0], r[1]) for r in rows] == [(1, "n"), (1, "f"), (2, "n"), (2, "f")]
            for number, column, value, lower, upper, noise_lower, noise_upper, text in rows:
                cell = answer[number - 1][1 if column == "n" else 2]
                assert value == pytest.approx(cell)
                assert lower <= noise_lower <= value <= noise_upper <= upper
                assert "(noise)" in text
        assert consumed(wire) == spent > before  # reading the error bars is free


def test_psycopg_errors(wire: Wire) -> None:
    with psycopg.connect(wire.url(), autocommit=True) as con:
        cases = [("SELEC COUNT(*) FROM trips", psycopg.errors.SyntaxError),
                 ("SELECT COUNT(*) FROM nope", psycopg.errors.UndefinedTable),
                 ("SELECT COUNT(nope) FROM trips", psycopg.errors.UndefinedColumn),
                 ("SELECT rider_id FROM trips", psycopg.errors.InsufficientPrivilege),
                 ("DELETE FROM trips", psycopg.errors.InsufficientPrivilege)]
        before = consumed(wire)
        for sql, error in cases:
            for prepare in (False, True):
                with pytest.raises(error):
                    con.execute(sql, prepare=prepare)
        assert consumed(wire) == before  # refusals cost nothing
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            con.execute("SET chorus.epsilon = -1")
        con.execute("SET chorus.epsilon = 1000")
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="above the per-query"):
            con.execute(COUNT)
        assert con.execute("SELECT 1").fetchone() == (1,)  # the connection is still usable


def test_psycopg_transactions(wire: Wire) -> None:
    # psycopg's default (no autocommit) wraps everything in BEGIN ... COMMIT / ROLLBACK
    with psycopg.connect(wire.url()) as con:
        assert roughly_rows(con.execute(COUNT).fetchone()[0])
        assert con.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            con.execute("SELECT * FROM trips")
        assert con.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            con.execute(COUNT)
        con.rollback()
        assert roughly_rows(con.execute(COUNT).fetchone()[0])
        con.commit()


# -- asyncpg, pg8000 ------------------------------------------------------------------------


def test_asyncpg(wire: Wire) -> None:
    asyncpg = pytest.importorskip("asyncpg")

    async def main() -> None:
        con = await asyncpg.connect(host=wire.host, port=wire.port, user="alice",
                                    password=PASSWORDS["alice"], database="chorus", ssl=False)
        logs: list[str] = []
        con.add_log_listener(lambda _c, msg: logs.append(str(msg)))
        try:
            n = await con.fetchval("SELECT COUNT(*) FROM trips WHERE fare > $1", 2.0)
            assert isinstance(n, int) and roughly_rows(n)
            stmt = await con.prepare("SELECT city, COUNT(*) AS n, AVG(distance_km) AS d "
                                     "FROM trips WHERE city = $1 GROUP BY city")
            assert [a.name for a in stmt.get_attributes()] == ["city", "n", "d"]
            for city in ("SF", "NYC"):
                rows = await stmt.fetch(city)
                assert rows[0]["city"] == city and isinstance(rows[0]["d"], float)
            import datetime as dt
            n = await con.fetchval("SELECT COUNT(*) FROM trips WHERE pickup_time < $1",
                                   dt.datetime(2026, 2, 1))
            assert isinstance(n, int)
            with pytest.raises(asyncpg.exceptions.InsufficientPrivilegeError):
                await con.fetch("SELECT fare FROM trips")
            await asyncio.sleep(0.05)
            assert any("charged epsilon" in m for m in logs)
        finally:
            await con.close()

    asyncio.run(main())


def test_pg8000(wire: Wire) -> None:
    pg8000 = pytest.importorskip("pg8000.dbapi")
    con = pg8000.connect(user="alice", password=PASSWORDS["alice"], host=wire.host,
                         port=wire.port, database="chorus")
    try:
        cur = con.cursor()
        cur.execute("SELECT city, COUNT(*) FROM trips WHERE city = %s GROUP BY city", ("LA",))
        ((city, n),) = cur.fetchall()
        assert city == "LA" and isinstance(n, int)
        cur.execute("SELECT SUM(seconds) FROM visits WHERE page = %s", ("home",))
        assert isinstance(cur.fetchone()[0], float)
        con.commit()
    finally:
        con.close()


# -- SQLAlchemy and pandas --------------------------------------------------------------------


def test_sqlalchemy_pandas(wire: Wire) -> None:
    sa = pytest.importorskip("sqlalchemy")
    pd = pytest.importorskip("pandas")
    engine = sa.create_engine(f"postgresql+psycopg://alice:{PASSWORDS['alice']}@{wire.host}:"
                              f"{wire.port}/chorus?sslmode=disable")
    try:
        inspector = sa.inspect(engine)
        assert sorted(inspector.get_table_names()) == ["cities", "trips", "visits"]
        columns = {c["name"]: str(c["type"]) for c in inspector.get_columns("trips")}
        assert columns["fare"] == "DOUBLE PRECISION" and columns["city"] == "TEXT"
        assert columns["pickup_time"] == "TIMESTAMP"
        with engine.connect() as con:
            frame = pd.read_sql("SELECT city, COUNT(*) AS n FROM trips GROUP BY city "
                                "ORDER BY city", con)
            assert list(frame.columns) == ["city", "n"] and len(frame) == 5
            frame = pd.read_sql(sa.text("SELECT AVG(fare) AS f FROM trips WHERE fare > :lo"),
                                con, params={"lo": 1.5})
            assert frame["f"].dtype == float
            frame = pd.read_sql("SELECT city, population FROM cities ORDER BY city", con)
            assert frame["city"].tolist() == ["CHI", "LA", "NYC", "SEA", "SF"]  # public: exact
    finally:
        engine.dispose()


# -- pgjdbc -------------------------------------------------------------------------------------

JDBC_JAR = Path("/usr/share/java/postgresql.jar")
JAVA_PROGRAM = r"""
import java.sql.*;
public class ChorusJdbc {
  public static void main(String[] a) throws Exception {
    try (Connection c = DriverManager.getConnection(a[0], a[1], a[2])) {
      DatabaseMetaData md = c.getMetaData();
      System.out.println("version " + md.getDatabaseProductVersion());
      try (ResultSet rs = md.getTables(null, null, "%", new String[]{"TABLE"})) {
        while (rs.next()) System.out.println("table " + rs.getString("TABLE_NAME"));
      }
      try (ResultSet rs = md.getColumns(null, null, "trips", "%")) {
        while (rs.next()) System.out.println("column " + rs.getString("COLUMN_NAME") + " "
            + rs.getString("TYPE_NAME"));
      }
      try (Statement s = c.createStatement();
           ResultSet rs = s.executeQuery("SELECT city, COUNT(*) AS n FROM trips GROUP BY city")) {
        while (rs.next()) System.out.println("row " + rs.getString(1) + " " + rs.getLong(2));
      }
      try (PreparedStatement p = c.prepareStatement(
             "SELECT COUNT(*) FROM trips WHERE city = ? AND fare > ?")) {
        for (int i = 0; i < 6; i++) {  // the sixth run uses a server-side prepared statement
          p.setString(1, "SF"); p.setDouble(2, 1.5 + i);
          try (ResultSet rs = p.executeQuery()) {
            rs.next(); System.out.println("prep " + rs.getLong(1));
          }
        }
      }
      try (Statement s = c.createStatement()) {
        s.executeQuery("SELECT * FROM trips");
      } catch (SQLException e) { System.out.println("refused " + e.getSQLState()); }
      System.out.println("valid " + c.isValid(5));
    }
  }
}
"""


@pytest.fixture(scope="module")
def java_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    missing = None
    if shutil.which("javac") is None or shutil.which("java") is None:
        missing = "no Java toolchain (javac, java)"
    elif not JDBC_JAR.exists():
        missing = f"pgjdbc not installed at {JDBC_JAR} (apt-get install libpostgresql-jdbc-java)"
    if missing:
        if os.environ.get("CHORUS_REQUIRE_JDBC") == "1":  # set by .ci/run, which installs it
            pytest.fail(missing)
        pytest.skip(missing)
    directory = tmp_path_factory.mktemp("jdbc")
    (directory / "ChorusJdbc.java").write_text(JAVA_PROGRAM)
    subprocess.run(["javac", "ChorusJdbc.java"], cwd=directory, check=True, timeout=120)
    return directory


def test_jdbc(wire: Wire, java_program: Path) -> None:
    url = f"jdbc:postgresql://{wire.host}:{wire.port}/chorus?sslmode=disable"
    out = subprocess.run(["java", "-cp", f"{JDBC_JAR}:{java_program}", "ChorusJdbc", url,
                          "alice", PASSWORDS["alice"]], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "version 15.0 (chorus-py differential-privacy proxy)" in lines
    assert {ln for ln in lines if ln.startswith("table ")} == {
        "table cities", "table trips", "table visits"}
    assert "column fare float8" in lines and "column pickup_time timestamp" in lines
    assert len([ln for ln in lines if ln.startswith("row ")]) == 5
    assert len([ln for ln in lines if ln.startswith("prep ")]) == 6
    assert "refused 42501" in lines and "valid true" in lines


def test_quantiles_next_to_aggregates_over_the_wire(wire: Wire) -> None:
    """A query answered in two parts (chorus_py.kinds.mixed) keeps its columns' types: the
    described types (asyncpg prepares first) and the binary encoding (psycopg) match what the
    merged rows hold."""
    sql = ("SELECT city, MEDIAN(fare) AS med, COUNT(*) AS n, AVG(fare) AS f FROM trips "
           "GROUP BY city ORDER BY city")
    with psycopg.connect(wire.url(), autocommit=True) as con:
        for binary in (False, True):
            cur = con.cursor(binary=binary)
            rows = cur.execute(sql).fetchall()
            assert [d.name for d in cur.description] == ["city", "med", "n", "f"]
            assert [r[0] for r in rows] == sorted(["SF", "NYC", "LA", "CHI", "SEA"])
            assert all(isinstance(r[1], float) and isinstance(r[2], int)
                       and isinstance(r[3], float) for r in rows)
    asyncpg = pytest.importorskip("asyncpg")

    async def main() -> None:
        con = await asyncpg.connect(host=wire.host, port=wire.port, user="alice",
                                    password=PASSWORDS["alice"], database="chorus", ssl=False)
        try:
            stmt = await con.prepare(sql)
            assert [(a.name, a.type.name) for a in stmt.get_attributes()] == [
                ("city", "text"), ("med", "float8"), ("n", "int8"), ("f", "float8")]
            rows = await stmt.fetch()
            assert isinstance(rows[0]["n"], int) and isinstance(rows[0]["med"], float)
        finally:
            await con.close()

    asyncio.run(main())
