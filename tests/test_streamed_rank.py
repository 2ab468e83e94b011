"""The streamed heavy branch on DuckDB (``rewriters.contribution.streamed_rank``): each unit's
first k filtered rows in the twin's stored order, kept by ``LAG(run, k, 0) OVER () <> run``
(the copy's stored number of each unit's run) instead of a window partitioned by the unit,
the statement failing unless the rows arrive in the order of the copy's stored positions.

What must hold: the very rows ``ROW_NUMBER() OVER (PARTITION BY unit ORDER BY rank) <= k``
keeps (property test over random tables, NULL units and ties in every other column included,
and a table of several row groups read by several threads); a statement that meets the rows in
any other order fails instead of keeping more (fail closed, in SQL and through the engine);
the outgoing verifier passes the exact shape and refuses every weaker one; and a verdict never
carries over to a statement whose LAG reaches further back than its cap.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlglot import parse_one

from analyses.outgoing import Refused, literal_shape, tokens, verify
from chorus_py.backends import SCHEMA
from chorus_py.engine import Engine
from chorus_py.errors import BackendError
from rewriters.contribution import (
    POSITION,
    STREAM_ORDER_ERROR,
    ranked_branches,
    ranked_table,
    unit_ordered,
)
from tests.conftest import ranked_copy_name, table_with_rows
from tests.test_ranked_copy import COLUMNS, K, _rows, ranked_engine


def _copy_and_twin(con: duckdb.DuckDBPyConnection,
                   rows: list[tuple[int, int | None, float]] | str) -> None:
    """``p.c`` (a ranked copy with positions, built as the store builds it) and its twin
    ``p.c_u`` in position order, from (id, unit, v) rows or a SELECT of them."""
    con.execute("CREATE SCHEMA IF NOT EXISTS p")
    if isinstance(rows, str):
        con.execute(f"CREATE OR REPLACE TABLE t AS {rows}")
    else:
        con.execute("CREATE OR REPLACE TABLE t (id BIGINT, unit BIGINT, v DOUBLE)")
        con.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)
    copy = ranked_table("t", "unit", positions=True).sql("duckdb")
    con.execute(f"CREATE OR REPLACE TABLE p.c AS {copy}")
    con.execute(f"CREATE OR REPLACE TABLE p.c_u AS SELECT * FROM p.c ORDER BY {POSITION}")


def _heavy(k: int, where: str, streamed: bool) -> str:
    """The heavy branch over ``p.c``'s twin: streamed, or numbered by ROW_NUMBER."""
    rows = parse_one(f"SELECT c.* FROM p.c AS c WHERE {where}")
    _, heavy = ranked_branches(rows, "c", "unit", k, twin=True, streamed=streamed)
    return heavy.sql("duckdb")


def _kept(con: duckdb.DuckDBPyConnection, k: int, where: str, streamed: bool) -> list[int]:
    return sorted(r[0] for r in con.execute(
        f"SELECT b.id FROM ({_heavy(k, where, streamed)}) AS b").fetchall())


units = st.one_of(st.none(), st.integers(0, 12))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(units=st.lists(units, min_size=1, max_size=160), values=st.data(),
       k=st.integers(1, 8), threshold=st.integers(-1, 6))
def test_streamed_keeps_the_rows_row_number_keeps(units: list[int | None], values: st.DataObject,
                                                  k: int, threshold: int) -> None:
    """Any table (NULL units, one unit or many, ties in v), any filter, any cap: the same
    rows, at most k per unit, each unit's first k filtered rows in stored-rank order."""
    vs = values.draw(st.lists(st.sampled_from([0.0, 1.0, 2.0, 5.0]), min_size=len(units),
                              max_size=len(units)))
    rows = [(i, u, v) for i, (u, v) in enumerate(zip(units, vs, strict=True))]
    con = duckdb.connect()
    _copy_and_twin(con, rows)
    where = f"c.v > {threshold} AND c.__chorus_unit_rows > {k}"
    streamed = _kept(con, k, where, True)
    assert streamed == _kept(con, k, where, False)
    per_unit: dict[int | None, int] = {}
    for (_, unit, _v) in (rows[i] for i in streamed):
        per_unit[unit] = per_unit.get(unit, 0) + 1
    assert all(n <= k for n in per_unit.values())
    # Each unit's run number is the position of its first row in the twin: one per unit.
    assert con.execute("SELECT COUNT(*) FROM (SELECT unit, MIN(__chorus_pos) AS f, "
                       "MIN(__chorus_run) AS lo, MAX(__chorus_run) AS hi FROM p.c GROUP BY unit) "
                       "WHERE lo <> f OR hi <> f").fetchone() == (0,)


def test_several_row_groups_and_threads_keep_the_same_rows() -> None:
    """A twin of four row groups (DuckDB's 122,880 rows each) read with two threads: the rows
    still arrive in stored order (no error) and the same rows are kept."""
    con = duckdb.connect(config={"threads": 2})
    _copy_and_twin(con, "SELECT range AS id, hash(range) % 60000 AS unit, "
                        "CAST(hash(range * 7) % 10 AS DOUBLE) AS v FROM range(400000)")
    assert con.execute("SELECT COUNT(DISTINCT row_group_id) FROM pragma_storage_info('p.c_u')"
                       ).fetchone()[0] >= 4
    for k, where in ((1, "c.v >= 3"), (4, "c.v < 2 OR c.v > 7"), (9, "c.v >= 0")):
        where = f"({where}) AND c.__chorus_unit_rows > {k}"
        assert _kept(con, k, where, True) == _kept(con, k, where, False)


def test_rows_out_of_the_twins_order_fail_the_statement() -> None:
    """Rows met in another order than the positions (a shuffled twin, a twin in reverse, the
    copy in block order): the statement fails instead of keeping more than k per unit."""
    rows = [(i, i % 7, float(i % 5)) for i in range(500)]
    con = duckdb.connect()
    _copy_and_twin(con, rows)
    heavy = _heavy(2, "c.v >= 1 AND c.__chorus_unit_rows > 2", True)
    assert con.execute(f"SELECT COUNT(*) FROM ({heavy}) AS b").fetchone() == (14,)
    for order in ("random()", f"{POSITION} DESC", "id"):
        con.execute(f"CREATE OR REPLACE TABLE p.c_u AS SELECT * FROM p.c ORDER BY {order}")
        with pytest.raises(duckdb.Error, match=STREAM_ORDER_ERROR):
            con.execute(f"SELECT COUNT(*) FROM ({heavy}) AS b").fetchall()


@pytest.fixture(params=["duckdb"])  # Postgres's copies store no positions
def skewed(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    with table_with_rows(request, tmp_path, "streamed", COLUMNS, _rows()) as made:
        yield made


@pytest.fixture
def engine(skewed: tuple[str, str], policy_engine: Callable[[str], Engine]) -> Engine:
    return ranked_engine(policy_engine, skewed)


def _statement(engine: Engine, table: str) -> str:
    """The engine's statement of a whole-schedule filtered query (it reads the twin)."""
    _, prepared = engine.prepare(f"SELECT COUNT(*), SUM(v) FROM {table} WHERE v >= 2",
                                 "alice", epsilon=1.0)
    assert "LAG(" in prepared.detail.sql
    return prepared.detail.sql


def test_the_engine_fails_closed_on_a_twin_out_of_order(
        skewed: tuple[str, str], engine: Engine, caplog: pytest.LogCaptureFixture) -> None:
    """The twin's rows rewritten in another order (as a future DuckDB reading them otherwise
    would meet them): the query fails with no detail, nothing is released, and the operator's
    log names the cause."""
    _, table = skewed
    sql = f"SELECT COUNT(*), SUM(v) FROM {table} WHERE v >= 2"
    assert engine.execute(sql, analyst="alice", epsilon=1.0, remaining=False).rows
    twin = unit_ordered(ranked_copy_name(engine, table))
    engine.backend.run_owned([
        f'CREATE OR REPLACE TABLE {SCHEMA}."{twin}" AS SELECT * FROM {SCHEMA}."{twin}" '
        f"ORDER BY {POSITION} DESC"])
    with caplog.at_level(logging.ERROR), pytest.raises(BackendError) as raised:
        engine.execute(sql, analyst="alice", epsilon=1.0, remaining=False)
    assert STREAM_ORDER_ERROR not in str(raised.value)
    assert "out of the twin's order" in caplog.text


def _check(engine: Engine, table: str, text: str) -> None:
    verify(text, engine.dialect, engine.statements.outgoing, "noised_by_proxy",
           frozenset({table}), cap=K)


# A weaker form of the engine's streamed flag (old text, new text), each refused.
_RUN_BACK = f"LAG(TABLE.__chorus_run, {K}, 0) OVER ()"
_WEAKER = [
    pytest.param(_RUN_BACK, f"LAG(TABLE.__chorus_run, {K + 1}, 0) OVER ()",
                 id="back-further-than-the-cap"),
    pytest.param("LAG(TABLE.__chorus_pos, 1, 0)", "LAG(TABLE.__chorus_pos, 2, 0)",
                 id="order-checked-every-other-row"),
    pytest.param("TABLE.__chorus_pos <= LAG(TABLE.__chorus_pos, 1, 0)",
                 "TABLE.v <= LAG(TABLE.v, 1, 0)", id="order-of-another-column"),
    pytest.param("TABLE.__chorus_pos <= LAG(", "TABLE.__chorus_pos < LAG(",
                 id="repeated-positions-pass"),
    pytest.param("THEN ERROR('chorus: rows out of unit order')", "THEN FALSE",
                 id="no-failure-out-of-order"),
    pytest.param(f"{_RUN_BACK} <> TABLE.__chorus_run", f"{_RUN_BACK} = TABLE.__chorus_run",
                 id="later-rows-kept"),
    pytest.param(f"{_RUN_BACK} <> TABLE.__chorus_run", "TRUE", id="every-row-kept"),
    pytest.param(f"{_RUN_BACK} <> TABLE.__chorus_run", f"LAG(TABLE.v, {K}, 0) OVER () <> TABLE.v",
                 id="runs-of-another-column"),
    pytest.param(f"{_RUN_BACK} <> TABLE.__chorus_run", f"{_RUN_BACK} <> TABLE.__chorus_pos",
                 id="run-against-a-position"),
    pytest.param(_RUN_BACK, f"LAG(TABLE.__chorus_run, {K}, 0) OVER (ORDER BY TABLE.v)",
                 id="another-sequence"),
    pytest.param("LAG(TABLE.__chorus_pos, 1, 0) OVER ()",
                 "LAG(TABLE.__chorus_pos, 1, 0) OVER (PARTITION BY TABLE.v)",
                 id="order-checked-per-partition"),
    pytest.param(_RUN_BACK, f"LAG(TABLE.__chorus_run, {K} - 1, 0) OVER ()",
                 id="offset-not-a-literal"),
    pytest.param(_RUN_BACK, f"LAG(TABLE.__chorus_run, {K}, TABLE.v) OVER ()",
                 id="default-not-a-literal"),
    pytest.param("END AS __chorus_krank",
                 "END AS __chorus_krank, ROW_NUMBER() OVER (ORDER BY TABLE.v) AS z",
                 id="another-window-beside"),
    pytest.param("WHERE b.__chorus_krank", "WHERE NOT b.__chorus_krank",
                 id="the-flagged-rows-dropped"),
]


@pytest.mark.parametrize("old, new", _WEAKER)
def test_the_verifier_passes_the_streamed_numbering_and_no_weaker_form(
        skewed: tuple[str, str], engine: Engine, old: str, new: str) -> None:
    _, table = skewed
    statement = _statement(engine, table)
    _check(engine, table, statement)
    old, new = old.replace("TABLE", table), new.replace("TABLE", table)
    assert statement.count(old) == 1, old
    with pytest.raises(Refused, match="contribution bounding"):
        _check(engine, table, statement.replace(old, new))
    # Read from the table itself (no stored positions, no copy): refused too.
    copy = ranked_copy_name(engine, table)
    with pytest.raises(Refused):
        _check(engine, table, statement.replace(f'{SCHEMA}."{unit_ordered(copy)}"', table))


def test_a_verdict_never_carries_over_to_a_lag_past_the_cap(
        skewed: tuple[str, str], engine: Engine) -> None:
    """The LAG's offset is read like a row cap: statements that differ only in it have one
    literal shape while both offsets are within the cap, another once one is past it."""
    _, table = skewed
    statement = _statement(engine, table)
    caps = (K, 100)

    def shape(offset: int) -> bytes:
        text = statement.replace(f"LAG({table}.__chorus_run, {K}, 0)",
                                 f"LAG({table}.__chorus_run, {offset}, 0)")
        cut = tokens(text, "duckdb")
        assert cut is not None
        return literal_shape(cut, caps=caps)

    assert shape(K) == shape(K - 1)
    assert shape(K) != shape(K + 1)
