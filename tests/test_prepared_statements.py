"""A query text run again is prepared (DuckDB: on its thread's cursor, the second time it is seen;
Postgres: by psycopg after its prepare threshold): the noise is still drawn at each run, a
replaced table is read as it is now, and an error leaves nothing prepared behind."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from chorus_py.backends import StatementFailed
from chorus_py.backends.duckdb import DuckDBBackend
from chorus_py.backends.duckdb_cursors import PREPARED_PER_THREAD
from chorus_py.engine import Engine

# A count with Laplace-like noise drawn by the database, as the rewrites draw it.
NOISY = "SELECT COUNT(*) + FLOOR(1000 * -LN(1 - RANDOM())) AS n FROM trips"


def test_noise_is_drawn_at_every_run_of_a_repeated_text(engine: Engine) -> None:
    """Both backends: past the point where the text is prepared (DuckDB: the second run;
    Postgres: psycopg's 5th), each run draws its own noise."""
    values = [engine.backend.run(NOISY).rows[0][0] for _ in range(12)]
    assert len(set(values[2:])) > 5  # equal draws of FLOOR(1000 * Exp(1)): a few in 1000


def test_a_warm_dp_query_is_prepared_and_draws_fresh_noise(engine: Engine) -> None:
    """The same DP query again: the same answer statement, run prepared on DuckDB, and the
    noisy answers still differ (the answer is never reused with its noise)."""
    sql = "SELECT COUNT(*) FROM trips"
    seen: list[str] = []
    run = engine.backend.run

    def spy(statement: str) -> object:
        seen.append(statement)
        return run(statement)

    engine.backend.run = spy  # type: ignore[method-assign]
    answers = []
    for _ in range(8):
        seen.clear()
        answers.append(engine.execute(sql, "alice", remaining=False).rows[0][0])
    assert len(set(answers)) > 3
    if isinstance(engine.backend, DuckDBBackend):
        mine = engine.backend._cursors.get()
        assert seen[-1] in mine._prepared  # the answer statement, executed by name


@pytest.fixture
def scratch_duckdb(tmp_path: Path) -> Iterator[DuckDBBackend]:
    path = tmp_path / "scratch.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE t (v INTEGER)")
    con.execute("INSERT INTO t VALUES (1), (2)")
    con.close()
    backend = DuckDBBackend(str(path), statement_timeout_s=5.0)
    yield backend
    backend.close()


def test_duckdb_prepares_a_text_the_second_time(scratch_duckdb: DuckDBBackend) -> None:
    sql = "SELECT v FROM t ORDER BY v"
    mine = scratch_duckdb._cursors.get()
    assert scratch_duckdb.run(sql).rows == [(1,), (2,)]
    assert mine.prepared == 0  # seen once: a one-off text is not prepared
    for _ in range(3):
        result = scratch_duckdb.run(sql)
        assert result.rows == [(1,), (2,)] and result.columns == ("v",)
        assert result.types == ("integer",)
    assert mine.prepared == 1
    # Neither EXPLAIN nor what is refused is ever prepared.
    for _ in range(2):
        scratch_duckdb.run("EXPLAIN " + sql)
        with pytest.raises(StatementFailed):
            scratch_duckdb.run("DELETE FROM t")
    assert scratch_duckdb._cursors.get().prepared == 0  # the refusal dropped the cursor


def test_duckdb_prepared_text_reads_a_replaced_table(scratch_duckdb: DuckDBBackend) -> None:
    """A table replaced by the owner's connection (a ranked copy rebuilt, a stored sample),
    even with another column type: the prepared statement is bound again and reads it."""
    sql = "SELECT v FROM t ORDER BY v"
    for _ in range(3):
        scratch_duckdb.run(sql)
    assert scratch_duckdb._cursors.get().prepared == 1
    scratch_duckdb.run_owned(["CREATE OR REPLACE TABLE t (v VARCHAR)",
                              "INSERT INTO t VALUES ('a')"])
    result = scratch_duckdb.run(sql)
    assert result.rows == [("a",)] and result.types == ("text",)
    scratch_duckdb.run_owned(["INSERT INTO t VALUES ('b')"])
    assert scratch_duckdb.run(sql).rows == [("a",), ("b",)]


def test_duckdb_keeps_a_bounded_number_of_prepared_texts(
        scratch_duckdb: DuckDBBackend) -> None:
    for i in range(PREPARED_PER_THREAD + 5):
        for _ in range(2):
            assert scratch_duckdb.run(f"SELECT v + {i} FROM t ORDER BY 1").rows[0][0] == 1 + i
    assert scratch_duckdb._cursors.get().prepared == PREPARED_PER_THREAD
    # The oldest was deallocated: run again, it is prepared afresh under a new name.
    for _ in range(2):
        assert scratch_duckdb.run("SELECT v + 0 FROM t ORDER BY 1").rows[0][0] == 1


def test_duckdb_error_drops_the_threads_cursor(scratch_duckdb: DuckDBBackend) -> None:
    sql = "SELECT v FROM t ORDER BY v"
    for _ in range(2):
        scratch_duckdb.run(sql)
    before = scratch_duckdb._cursors.get()
    assert before.prepared == 1
    with pytest.raises(StatementFailed) as info:
        scratch_duckdb.run("SELECT CAST('x' || v AS INTEGER) FROM t")
    assert info.value.touched_data
    after = scratch_duckdb._cursors.get()
    assert after is not before and after.prepared == 0
    assert scratch_duckdb.run(sql).rows == [(1,), (2,)]


def test_duckdb_timeout_of_a_prepared_statement(tmp_path: Path) -> None:
    """A prepared statement is interrupted at the timeout like any other, and the thread's
    next statement runs on a fresh cursor."""
    path = tmp_path / "slow.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE t AS SELECT * FROM range(2) r(v)")
    con.close()
    backend = DuckDBBackend(str(path), statement_timeout_s=0.3)
    slow = "SELECT COUNT(*) FROM t a, t b, t c, t d WHERE (a.v + b.v * c.v - d.v) % 7 = 3"
    try:
        for _ in range(2):
            backend.run(slow)  # fast on 2 rows; prepared on the second run
        mine = backend._cursors.get()
        assert mine.prepared == 1
        backend.run_owned(["INSERT INTO t SELECT * FROM range(2, 3000)"])  # 8e13 rows now
        with pytest.raises(StatementFailed) as info:
            backend.run(slow)
        assert info.value.cancelled == "statement timeout"
        assert backend._cursors.get() is not mine
        assert backend.run("SELECT 42").rows == [(42,)]
    finally:
        backend.close()


def test_duckdb_one_cursor_per_thread(scratch_duckdb: DuckDBBackend) -> None:
    """Each thread runs on its own cursor (prepared statements belong to one connection);
    the cursor of a thread that ended is closed when another thread makes its own."""
    sql = "SELECT SUM(v) FROM t"
    cursors = []

    def work() -> None:
        for _ in range(3):
            assert scratch_duckdb.run(sql).rows == [(3,)]
        cursors.append(scratch_duckdb._cursors.get())

    for _ in range(2):
        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
    first, second = cursors
    assert first is not second and second.prepared == 1
    with pytest.raises(duckdb.ConnectionException):
        first.cursor.execute("SELECT 1")  # closed: its thread ended
    assert scratch_duckdb.run(sql).rows == [(3,)]
