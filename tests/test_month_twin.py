"""The ranked copy's month twin (``rewriters.contribution.month_ordered``): the copy's rows
by calendar month, then in unit order, which the heavy branch of a query over one month reads
(that month's rows only, ``__chorus_month = m``) instead of every month's rows of the twin.

What must hold: the month the proxy assigns a claim (``BlockRestriction.month``) contains every
instant of the claim, and the month the database stores for a row (``month_sql``) is the one
the proxy computes, on DuckDB and Postgres, for timestamps and dates; the heavy branch over the
month twin keeps the very rows the copy's window keeps (random tables, NULL units; through the
DuckDB engine, timestamp and date block columns), so the answers do not change; queries over
several months or a few days of one do not read it; Postgres builds none and answers as
before; a month twin out of order fails the statement (fail closed); and the outgoing
verifier refuses a read of a month twin that does not pin one month.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from datetime import date, datetime, timedelta
from pathlib import Path

import duckdb
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlglot import exp, parse_one

from analyses.outgoing import Refused, verify
from chorus_py.backends import SCHEMA
from chorus_py.engine import Engine
from chorus_py.errors import BackendError
from chorus_py.stores.owned import serialised
from chorus_py.stores.samples import month_twin_statements, partitioned_month_twin_statements
from rewriters.blocks import BlockRestriction, month_number, month_sql, month_start
from rewriters.contribution import (
    MONTH,
    POSITION,
    month_ordered,
    ranked_branches,
    ranked_table,
    unit_ordered,
)
from tests.conftest import ranked_copy_name, table_with_rows
from tests.test_ranked_copy import POLICY as UNBLOCKED_POLICY

K = 3
#: Rows per person: light units and heavier ones, over January to March 2026.
SIZES = {1: 1, 2: 2, 3: 3, 4: 5, 5: 8, 6: 40, 7: 200, None: 30}

POLICY = """
[backend]
url = "{url}"

[privacy]
epsilon_per_block = 100000.0
max_epsilon_per_query = 5000.0
noise = "proxy"

[tables.{table}]
privacy_unit = "person"
max_rows_per_unit = {k}
contribution = "fixed"
block = {{ column = "t", size = "1 day", start = "2026-01-01", end = "2026-04-01" }}

[tables.{table}.columns]
id = {{ type = "int" }}
person = {{ type = "int" }}
v = {{ type = "float", lower = 0, upper = 100 }}
t = {{ type = "{kind}" }}

[analysts.alice]
"""


def _rows(kind: str) -> list[tuple[int, int | None, float, datetime | date]]:
    """(id, person, v, t): each person's rows spread over the quarter's days, v uneven."""
    out, next_id = [], 1
    for person, n in SIZES.items():
        for i in range(n):
            moment = datetime(2026, 1, 1, 7) + timedelta(days=(i * 37 + next_id) % 90,
                                                         minutes=i * 13)
            out.append((next_id, person, float((i * 7) % 13),
                        moment if kind == "timestamp" else moment.date()))
            next_id += 1
    return out


# -- the month of a claim and of a row -------------------------------------------------------
moments = st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(2199, 12, 1))


@settings(max_examples=300, deadline=None)
@given(start=moments, length=st.timedeltas(min_value=timedelta(microseconds=1),
                                           max_value=timedelta(days=70)))
def test_a_claims_month_holds_every_instant_of_it(start: datetime, length: timedelta) -> None:
    """A month is given only when [start, end) lies in it, and is given whenever it does."""
    end = start + length
    month = BlockRestriction("t", "timestamp", start, end).month()
    inside = end <= month_start(month_number(start) + 1)
    assert (month is not None) == inside
    if month is not None:
        assert month_start(month) <= start and end <= month_start(month + 1)
    days = BlockRestriction("d", "date", start.date(), start.date() + timedelta(days=length.days
                                                                                  + 1))
    day_month = days.month()
    last = days.end - timedelta(days=1)  # type: ignore[operator]
    assert (day_month is not None) == (month_number(days.start) == month_number(last))  # type: ignore[arg-type]
    assert BlockRestriction("i", "int", 0, 10).month() is None


_EDGES = [datetime(2026, 2, 28, 23, 59, 59, 999999), datetime(2026, 3, 1),
          datetime(2024, 2, 29, 12), datetime(1970, 1, 1), datetime(1999, 12, 31, 23, 59, 59),
          datetime(2000, 1, 1), datetime(2199, 11, 30, 23)]


@pytest.mark.parametrize("backend", ["duckdb", pytest.param("postgres",
                                                            marks=pytest.mark.postgres)])
def test_the_database_stores_the_month_the_proxy_computes(
        backend: str, request: pytest.FixtureRequest) -> None:
    """``month_sql`` over timestamps and dates (month ends, leap days, centuries) is
    ``month_number``, on each backend."""
    points = _EDGES + [datetime(1970, 1, 1) + timedelta(hours=h * 977) for h in range(2000)]
    stamp = month_sql(exp.column("ts")).sql(backend)
    day = month_sql(exp.column("d")).sql(backend)
    values = ", ".join(f"(TIMESTAMP '{p.isoformat(sep=' ')}', DATE '{p.date()}')"
                       for p in points)
    query = f"SELECT {stamp}, {day} FROM (VALUES {values}) AS x(ts, d)"
    if backend == "duckdb":
        got = duckdb.connect().execute(query).fetchall()
    else:
        with psycopg.connect(request.getfixturevalue("postgres_url")) as con:
            got = con.execute(query).fetchall()
    assert got == [(month_number(p), month_number(p.date())) for p in points]


# -- the same rows as the copy's window ------------------------------------------------------
def _copies(con: duckdb.DuckDBPyConnection,
            rows: list[tuple[int, int | None, float, datetime]]) -> None:
    """The ranked copy ``chorus_private.c`` of (id, unit, v, ts) rows, with positions and
    months as the store builds it, and its month twin ``c_m`` built by the store's SQL."""
    con.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
    con.execute("CREATE OR REPLACE TABLE t (id BIGINT, unit BIGINT, v DOUBLE, ts TIMESTAMP)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", rows)
    copy = ranked_table("t", "unit", positions=True,
                        month=month_sql(exp.column("ts", table="t"))).sql("duckdb")
    con.execute(f'CREATE OR REPLACE TABLE {SCHEMA}."c" AS {copy}')
    con.execute(f'DROP TABLE IF EXISTS {SCHEMA}."c_m"')
    for statement in month_twin_statements("c", "c_m", "unit"):
        con.execute(statement)


def _kept(con: duckdb.DuckDBPyConnection, k: int, where: str, month: int | None) -> list[int]:
    """Ids the heavy branch keeps: streamed over the month twin (``month``) or numbered by
    ROW_NUMBER over the copy itself."""
    rows = parse_one(f'SELECT c.* FROM {SCHEMA}."c" AS c WHERE {where}')
    if month is None:
        _, heavy = ranked_branches(rows, "c", "unit", k)
    else:
        _, heavy = ranked_branches(rows, "c", "unit", k, twin=True, streamed=True,
                                   month=month)
    return sorted(r[0] for r in con.execute(
        f"SELECT b.id FROM ({heavy.sql('duckdb')}) AS b").fetchall())


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(table=st.lists(st.tuples(st.one_of(st.none(), st.integers(0, 9)), st.integers(0, 2),
                                st.integers(0, 27), st.sampled_from([0.0, 1.0, 2.0, 5.0])),
                      min_size=1, max_size=150),
       k=st.integers(1, 6), threshold=st.integers(-1, 4), month=st.integers(0, 2))
def test_the_month_twin_keeps_the_rows_the_copys_window_keeps(
        table: list[tuple[int | None, int, int, float]], k: int, threshold: int,
        month: int) -> None:
    """Any table (NULL units, units spread over months), any filter, any cap, any month of
    it: the same rows, at most k per unit."""
    rows = [(i, unit, v, datetime(2026, 1 + m, 1 + day, i % 24))
            for i, (unit, m, day, v) in enumerate(table)]
    con = duckdb.connect()
    _copies(con, rows)
    first = month_start(month_number(datetime(2026, 1 + month, 1)))
    claim = (f"c.ts >= TIMESTAMP '{first}' AND c.ts < TIMESTAMP "
             f"'{month_start(month_number(first) + 1)}'")
    where = f"({claim}) AND c.v > {threshold} AND c.__chorus_unit_rows > {k}"
    kept = _kept(con, k, where, month_number(first))
    assert kept == _kept(con, k, where, None)
    per_unit: dict[int | None, int] = {}
    for i in kept:
        per_unit[rows[i][1]] = per_unit.get(rows[i][1], 0) + 1
    assert all(n <= k for n in per_unit.values())


def test_a_month_twin_out_of_order_fails_the_statement() -> None:
    """Rows met in another order than the month twin's positions: the statement fails."""
    rows = [(i, i % 7, float(i % 5), datetime(2026, 1 + i % 3, 1 + i % 28)) for i in range(600)]
    con = duckdb.connect()
    _copies(con, rows)
    where = ("c.ts >= TIMESTAMP '2026-02-01' AND c.ts < TIMESTAMP '2026-03-01' AND c.v >= 1 "
             "AND c.__chorus_unit_rows > 2")
    assert len(_kept(con, 2, where, 673)) == 14
    for order in ("random()", f"{POSITION} DESC", "id"):
        con.execute(f'CREATE OR REPLACE TABLE {SCHEMA}."c_m" AS SELECT * FROM {SCHEMA}."c_m" '
                    f"ORDER BY {order}")
        with pytest.raises(duckdb.Error, match="rows out of unit order"):
            _kept(con, 2, where, 673)


# -- through the engine, both backends -------------------------------------------------------
#: (backend, block column type) pairs, Postgres's marked.
_MONTHS = [pytest.param((backend, kind), id=f"{backend}-{kind}",
                        marks=[pytest.mark.postgres] if backend == "postgres" else [])
           for backend in ("duckdb", "postgres") for kind in ("timestamp", "date")]


@pytest.fixture(params=_MONTHS)
def months(request: pytest.FixtureRequest, tmp_path: Path,
           policy_engine: Callable[[str], Engine]) -> Iterator[tuple[Engine, str]]:
    """An engine over a table whose blocks are days of a ``timestamp`` or ``date`` column."""
    backend, kind = request.param
    request.param = backend  # what table_with_rows reads
    columns = f"id BIGINT, person BIGINT, v DOUBLE PRECISION, t {kind.upper()}"
    with table_with_rows(request, tmp_path, "months", columns, _rows(kind)) as (url, table):
        engine = policy_engine(POLICY.format(url=url, table=table, k=K, kind=kind))
        engine.warm_up(wait=True)
        yield engine, table


def _statement(engine: Engine, sql: str, month_twin: bool) -> str:
    engine.samples.read_month_twins = month_twin
    try:
        _, prepared = engine.prepare(sql, "alice", epsilon=1.0)
    finally:
        engine.samples.read_month_twins = True
    return prepared.detail.sql


def _same(a: list[tuple[object, ...]], b: list[tuple[object, ...]]) -> bool:
    """The same rows, sums of doubles to 1e-9 relative (added in another order)."""
    return len(a) == len(b) and all(
        math.isclose(u, v, rel_tol=1e-9, abs_tol=1e-9) if isinstance(u, float) else u == v
        for x, y in zip(sorted(a, key=repr), sorted(b, key=repr), strict=True)
        for u, v in zip(x, y, strict=True))


#: (query filter, the month whose twin it reads, or None: it reads none).
FILTERS: list[tuple[str, int | None]] = [
    ("t >= '2026-03-01'", 674),
    ("t >= '2026-01-01' AND t < '2026-02-01' AND v > 4", 672),
    ("t BETWEEN '2026-02-01' AND '2026-02-28' AND v <= 6", 673),
    ("t >= '2026-03-20'", 674),  # 12 of March's 31 days: a fifth (DuckDB), a third (Postgres)
    ("t >= '2026-03-29'", None),              # 3 days: the copy's window is cheaper
    ("t >= '2026-02-15' AND t < '2026-03-10'", None),  # two months
    ("v > 2", None),                          # the whole quarter
]


@pytest.mark.parametrize("where, month", FILTERS)
def test_a_query_over_one_month_reads_its_rows_from_the_month_twin(
        months: tuple[Engine, str], where: str, month: int | None) -> None:
    """The heavy branch (and on Postgres the light one) reads the month twin, pinned to the
    month, exactly when the claim lies in one month (and covers enough of it), and measures
    what it measured before."""
    engine, table = months
    sql = f"SELECT COUNT(*), SUM(v), AVG(v) FROM {table} WHERE {where}"
    twin = month_ordered(ranked_copy_name(engine, table))
    assert twin in engine.backend.owned_tables()
    statement = _statement(engine, sql, True)
    before = _statement(engine, sql, False)
    assert twin not in before
    if month is None:
        assert twin not in statement and statement == before
    else:
        reads = 2 if engine.dialect == "postgres" else 1  # the light branch too
        assert statement.count(f'"{twin}"') == reads
        assert statement.count(f"{MONTH} = {month}") == reads
    assert _same(engine.backend.run(statement).rows, engine.backend.run(before).rows)
    # And end to end: an answer, charged once.
    assert engine.execute(sql, analyst="alice", epsilon=1.0, remaining=False).rows


_DUCKDB = [p for p in _MONTHS if p.id.startswith("duckdb")]


@pytest.mark.parametrize("months", _DUCKDB, indirect=True)
def test_the_month_twin_holds_the_copys_rows_by_month(months: tuple[Engine, str]) -> None:
    engine, table = months
    copy = ranked_copy_name(engine, table)
    owned = engine.backend.owned_tables()
    assert unit_ordered(copy) in owned and month_ordered(copy) in owned
    columns = f"id, person, v, t, __chorus_rank, __chorus_unit_rows, {MONTH}"

    def read(name: str, order: str) -> list[tuple[object, ...]]:
        return engine.backend.run(f'SELECT {columns} FROM {SCHEMA}."{name}" {order}').rows

    assert read(month_ordered(copy), "ORDER BY id") == read(copy, "ORDER BY id")
    assert all(r[6] == month_number(r[3]) for r in read(copy, ""))  # type: ignore[arg-type]
    # Stored by month, unit rows, unit, rank; numbered so; each unit keeps its run number.
    stored = engine.backend.run(
        f'SELECT {MONTH}, __chorus_unit_rows, person IS NULL, person, __chorus_rank, '
        f'{POSITION}, __chorus_run FROM {SCHEMA}."{month_ordered(copy)}"').rows
    assert [r[:5] for r in stored] == sorted((r[:5] for r in stored),
                                             key=lambda r: (r[0], r[1], r[2], r[3] or 0, r[4]))
    assert [r[5] for r in stored] == list(range(1, len(stored) + 1))
    runs = {(r[2], r[3]): r[6] for r in stored}
    assert len(set(runs.values())) == len(runs)
    assert all(runs[(r[2], r[3])] == r[6] for r in stored)


@pytest.mark.parametrize("months", [p for p in _MONTHS if p.id.startswith("postgres")],
                         indirect=True)
def test_the_postgres_month_twin_is_a_partition_per_month_in_twin_order(
        months: tuple[Engine, str]) -> None:
    """On Postgres the copy stores no months; the month twin has a partition per month of the
    schedule, each the copy's rows of that month (its month stored with them), stored in the
    twin's order (unit row count, unit, stored rank) and indexed so."""
    engine, table = months
    copy = ranked_copy_name(engine, table)
    assert MONTH not in engine.backend.run(f'SELECT * FROM {SCHEMA}."{copy}" LIMIT 1').columns
    twin = month_ordered(copy)
    parts = engine.backend.run(
        "SELECT c.relname::text, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
        "JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent "
        f"WHERE p.relname = '{twin}' ORDER BY 1").rows
    assert parts == [(f"{twin}_{m}", f"FOR VALUES IN ({m})") for m in (672, 673, 674)]
    columns = "id, person, v, t, __chorus_rank, __chorus_unit_rows"
    every = engine.backend.run(f'SELECT {columns}, {MONTH} FROM {SCHEMA}."{twin}"').rows
    assert sorted(r[:6] for r in every) == sorted(
        engine.backend.run(f'SELECT {columns} FROM {SCHEMA}."{copy}"').rows)
    assert all(r[6] == month_number(r[3]) for r in every)  # type: ignore[arg-type]
    for name, _ in parts:  # a fresh table's seq scan reads it in the order it was written
        stored = engine.backend.run(
            f'SELECT __chorus_unit_rows, person IS NULL, person, __chorus_rank FROM '
            f'{SCHEMA}."{name}"').rows
        assert stored and stored == sorted(stored, key=lambda r: (r[0], r[1], r[2] or 0, r[3]))
    indexes = engine.backend.run(
        f"SELECT indexdef FROM pg_indexes WHERE tablename = '{twin}_674'").rows
    assert [i for (i,) in indexes if "(__chorus_unit_rows, person, __chorus_rank)" in i]


@pytest.mark.parametrize("months", [p for p in _MONTHS if p.id.startswith("postgres")],
                         indirect=True)
def test_a_second_build_of_the_postgres_month_twin_adds_nothing(
        months: tuple[Engine, str]) -> None:
    """Another proxy sharing the database runs the same build statements after this one (both
    found no month twin): every partition stays attached once, with the rows it had."""
    engine, table = months
    copy = ranked_copy_name(engine, table)
    twin = month_ordered(copy)
    policy = engine.policy.tables[table]
    span = engine.samples._span(table, policy)
    assert span is not None
    count = f'SELECT COUNT(*), SUM(id) FROM {SCHEMA}."{twin}"'
    before = engine.backend.run(count).rows
    engine.backend.run_owned(serialised("postgres", partitioned_month_twin_statements(
        copy, twin, "person", "t", policy.columns["t"].type, span)))
    assert engine.backend.run(count).rows == before
    assert engine.backend.run(
        "SELECT COUNT(*) FROM pg_inherits WHERE inhparent = "
        f"'{SCHEMA}.\"{twin}\"'::regclass").rows == [(3,)]


def test_no_month_twin_without_time_blocks(tmp_path: Path,
                                           policy_engine: Callable[[str], Engine]) -> None:
    """A table without time blocks has no months: its copy stores none, and has no month
    twin."""
    path = tmp_path / "plain.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE plain AS SELECT range AS id, range % 5 AS person, "
                "CAST(range % 7 AS DOUBLE) AS v FROM range(200)")
    con.close()
    engine = policy_engine(UNBLOCKED_POLICY.format(url=f"duckdb:///{path}", table="plain", k=K,
                                                   ranked="true"))
    engine.warm_up(wait=True)
    copy = ranked_copy_name(engine, "plain")
    assert month_ordered(copy) not in engine.backend.owned_tables()
    assert MONTH not in engine.backend.run(f'SELECT * FROM {SCHEMA}."{copy}" LIMIT 1').columns


@pytest.mark.parametrize("months", _DUCKDB, indirect=True)
def test_the_engine_fails_closed_on_a_month_twin_out_of_order(
        months: tuple[Engine, str]) -> None:
    engine, table = months
    sql = f"SELECT COUNT(*), SUM(v) FROM {table} WHERE t >= '2026-03-01'"
    assert engine.execute(sql, analyst="alice", epsilon=1.0, remaining=False).rows
    twin = month_ordered(ranked_copy_name(engine, table))
    engine.backend.run_owned([
        f'CREATE OR REPLACE TABLE {SCHEMA}."{twin}" AS SELECT * FROM {SCHEMA}."{twin}" '
        f"ORDER BY {POSITION} DESC"])
    with pytest.raises(BackendError) as raised:
        engine.execute(sql, analyst="alice", epsilon=1.0, remaining=False)
    assert "unit order" not in str(raised.value)


# -- the outgoing verifier -------------------------------------------------------------------
def _check(engine: Engine, table: str, text: str) -> None:
    verify(text, engine.dialect, engine.statements.outgoing, "noised_by_proxy",
           frozenset({table}), cap=K)


#: A change to the engine's month statement (old text as a regex, new text), each refused.
_UNPINNED = [
    pytest.param(r" AND TABLE\.__chorus_month = 674", "", id="no-month"),
    pytest.param(r"TABLE\.__chorus_month = 674", "TABLE.__chorus_month >= 674",
                 id="from-a-month-on"),
    pytest.param(r"TABLE\.__chorus_month = 674", "(TABLE.__chorus_month = 674 OR TABLE.v > 0)",
                 id="or-another-test"),
    pytest.param(r"TABLE\.__chorus_month = 674", "TABLE.__chorus_month = TABLE.__chorus_month",
                 id="a-column-not-a-month"),
    pytest.param(r"TABLE\.__chorus_month = 674", "TABLE.__chorus_month IN (673, 674)",
                 id="two-months"),
    pytest.param(r"TABLE\.__chorus_month = 674", "TABLE.v = 674", id="another-column"),
]


@pytest.mark.parametrize("old, new", _UNPINNED)
def test_the_verifier_refuses_a_month_twin_read_over_several_months(
        months: tuple[Engine, str], old: str, new: str) -> None:
    """Each read of the month twin (the heavy branch; on Postgres the light one too), its pin
    weakened alone: refused."""
    engine, table = months
    statement = _statement(engine, f"SELECT COUNT(*), SUM(v) FROM {table} "
                                   "WHERE t >= '2026-03-01'", True)
    _check(engine, table, statement)
    pattern = old.replace("TABLE", re.escape(table))
    found = list(re.finditer(pattern, statement))
    assert len(found) == (2 if engine.dialect == "postgres" else 1)
    for match in found:
        weakened = statement[:match.start()] + match.expand(new.replace("TABLE", table)) \
            + statement[match.end():]
        with pytest.raises(Refused):
            _check(engine, table, weakened)


@pytest.mark.parametrize("months", _DUCKDB, indirect=True)
def test_the_verifier_refuses_a_light_branch_from_the_month_twin(
        months: tuple[Engine, str]) -> None:
    """The light branch read from the month twin without a month: refused (and a month
    twin is the copy's rows: with the copy's light branch it pairs as one occurrence)."""
    engine, table = months
    statement = _statement(engine, f"SELECT COUNT(*), SUM(v) FROM {table} "
                                   "WHERE t >= '2026-03-01'", True)
    copy = ranked_copy_name(engine, table)
    light = f'{SCHEMA}."{copy}" AS {table}'
    assert statement.count(light) == 1
    with pytest.raises(Refused, match="month twin"):
        _check(engine, table, statement.replace(
            light, f'{SCHEMA}."{month_ordered(copy)}" AS {table}'))


@pytest.mark.parametrize("suffix", ["_m_674", "_m_673", "_x", "_uu", "_g1234"])
def test_the_verifier_refuses_a_relation_of_the_copy_it_does_not_know(
        months: tuple[Engine, str], suffix: str) -> None:
    """A month twin's partition (Postgres: ``<copy>_m_<month>``, one month of its rows) or
    any other name beside the copy's own relations, read by name in place of the month twin:
    refused, as an unknown relation of the private schema."""
    engine, table = months
    statement = _statement(engine, f"SELECT COUNT(*), SUM(v) FROM {table} "
                                   "WHERE t >= '2026-03-01'", True)
    _check(engine, table, statement)
    twin = f'"{month_ordered(ranked_copy_name(engine, table))}"'
    assert twin in statement
    with pytest.raises(Refused, match="unknown relation of the private schema"):
        _check(engine, table, statement.replace(twin, twin[:-1] + suffix + '"'))
