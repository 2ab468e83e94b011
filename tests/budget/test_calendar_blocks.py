"""Calendar blocks: months, years and weeks on a chosen day, charged and named by the calendar.

Block boundaries computed by hand (leap days, month and year ends, ISO weeks that straddle a
year), a real engine on DuckDB and Postgres charging exactly the months and weeks a query reads,
a property test that every instant lies in exactly one block and that the SQL restriction the
rewriter adds selects, on both databases, exactly the rows whose block Python says was charged,
and the ledger refusing a policy that cuts a table's blocks another way.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlglot import exp

from analyses.blocks import BlockWindows, read_windows
from budget.ledger import Ledger, LedgerMismatch
from budget.store import MemoryStore, PostgresStore, SQLiteStore, Store
from chorus_py.blockgrid import WEEKDAYS, FixedGrid, MonthGrid, grid_for
from chorus_py.engine import Engine
from chorus_py.policy import block_schemes, parse_policy
from chorus_py.stores.schedules import scheduled_windows
from rewriters.blocks import blocks as restrict

US = timedelta(microseconds=1)


def _block(size: str, start: str, end: str | None = None, column_type: str = "timestamp",
           **extra: Any) -> Any:
    return parse_policy({
        "backend": {"url": "duckdb:///:memory:"},
        "privacy": {"epsilon_per_block": 1.0},
        "tables": {"t": {"columns": {"ts": {"type": column_type}},
                         "block": {"column": "ts", "size": size, "start": start,
                                   **({"end": end} if end else {}), **extra}}}}).tables["t"].block


def _block_of(grid: Any, moment: datetime) -> tuple[str, datetime, datetime]:
    n = grid.index(moment)
    return grid.label(n), grid.boundary(n), grid.boundary(n + 1)


# -- boundaries by hand ---------------------------------------------------------------------
@pytest.mark.parametrize(("size", "week_start", "moment", "expected"), [
    # Months: a leap February, the last microsecond of a month, a year's end, before 1970.
    ("1 month", None, datetime(2024, 2, 29, 23, 59, 59, 999999),
     ("2024-02", datetime(2024, 2, 1), datetime(2024, 3, 1))),
    ("1 month", None, datetime(2024, 3, 1),
     ("2024-03", datetime(2024, 3, 1), datetime(2024, 4, 1))),
    ("1 month", None, datetime(2023, 2, 28, 12), ("2023-02", datetime(2023, 2, 1),
                                                 datetime(2023, 3, 1))),
    ("1 month", None, datetime(2025, 12, 31, 23, 59, 59, 999999),
     ("2025-12", datetime(2025, 12, 1), datetime(2026, 1, 1))),
    ("1 month", None, datetime(1969, 12, 31, 23), ("1969-12", datetime(1969, 12, 1),
                                                  datetime(1970, 1, 1))),
    # Quarters from January; years (2100 is not a leap year, 2000 was).
    ("3 months", None, datetime(2026, 5, 15), ("2026-04", datetime(2026, 4, 1),
                                              datetime(2026, 7, 1))),
    ("3 months", None, datetime(2026, 12, 31, 23, 59), ("2026-10", datetime(2026, 10, 1),
                                                       datetime(2027, 1, 1))),
    ("1 year", None, datetime(2024, 2, 29), ("2024", datetime(2024, 1, 1), datetime(2025, 1, 1))),
    # Days across leap days.
    ("1 day", None, datetime(2024, 2, 29, 23, 59, 59, 999999),
     ("2024-02-29", datetime(2024, 2, 29), datetime(2024, 3, 1))),
    ("1 day", None, datetime(2100, 2, 28, 12), ("2100-02-28", datetime(2100, 2, 28),
                                               datetime(2100, 3, 1))),
    ("1 day", None, datetime(2000, 2, 29), ("2000-02-29", datetime(2000, 2, 29),
                                           datetime(2000, 3, 1))),
    # ISO weeks: 2026-01-01 (a Thursday) is in 2026-W01, which began on Monday 2025-12-29;
    # 2027-01-01 (a Friday) is in 2026-W53 (2026 has 53 ISO weeks); 2024-12-30 begins 2025-W01.
    ("1 week", None, datetime(2026, 1, 1), ("2026-W01", datetime(2025, 12, 29),
                                           datetime(2026, 1, 5))),
    ("1 week", None, datetime(2027, 1, 1), ("2026-W53", datetime(2026, 12, 28),
                                           datetime(2027, 1, 4))),
    ("1 week", None, datetime(2024, 12, 31), ("2025-W01", datetime(2024, 12, 30),
                                             datetime(2025, 1, 6))),
    ("1 week", None, datetime(2026, 1, 4, 23, 59, 59, 999999),
     ("2026-W01", datetime(2025, 12, 29), datetime(2026, 1, 5))),
    # Other start days: named by their first day.
    ("1 week", "sunday", datetime(2026, 1, 4), ("2026-01-04", datetime(2026, 1, 4),
                                               datetime(2026, 1, 11))),
    ("1 week", "sunday", datetime(2026, 1, 3, 23, 59), ("2025-12-28", datetime(2025, 12, 28),
                                                       datetime(2026, 1, 4))),
    ("1 week", "thursday", datetime(2026, 1, 7), ("2026-01-01", datetime(2026, 1, 1),
                                                 datetime(2026, 1, 8))),
    # Fortnights from Monday 1970-01-05: 2026-01-05 is 20454 = 14 * 1461 days later.
    ("2 weeks", "monday", datetime(2026, 1, 14), ("2026-01-05", datetime(2026, 1, 5),
                                                 datetime(2026, 1, 19))),
])
def test_boundaries_by_hand(size: str, week_start: str | None, moment: datetime,
                            expected: tuple[str, datetime, datetime]) -> None:
    grid = grid_for(size, week_start or "monday")
    assert _block_of(grid, moment) == expected
    assert grid.index_of_label(expected[0]) == grid.index(moment)


def test_thursday_weeks_are_the_old_epoch_weeks() -> None:
    """week_start = "thursday" cuts and names weeks exactly as '1 week' did before weeks had a
    start day (7-day windows from 1970-01-01, named by their first day)."""
    old = BlockWindows("t", datetime(2026, 1, 1), timedelta(weeks=1), 10)
    block = _block("1 week", "2026-01-01", "2026-03-12", week_start="thursday")
    new = scheduled_windows("t", block, datetime(2027, 1, 1))
    assert new.ids() == old.ids() and new.end == old.end == datetime(2026, 3, 12)
    assert new.ids()[:2] == ("t/2026-01-01", "t/2026-01-08")


def test_month_schedule_counts_and_ids() -> None:
    block = _block("1 month", "2024-01-01", "2025-02-01")
    assert block.count_at(datetime(2023, 12, 31, 23, 59)) == 0
    assert block.count_at(datetime(2024, 2, 29, 23, 59, 59, 999999)) == 2
    assert block.count_at(datetime(2024, 3, 1)) == 3  # March begins: its block appears
    assert block.count_at(datetime(2030, 1, 1)) == 13  # end is exclusive
    windows = scheduled_windows("t", block, datetime(2030, 1, 1))
    assert windows.ids()[0] == "t/2024-01" and windows.ids()[-1] == "t/2025-01"
    assert [windows.bound(i) for i in (1, 2, 12, 13)] == [
        datetime(2024, 2, 1), datetime(2024, 3, 1), datetime(2025, 1, 1), datetime(2025, 2, 1)]
    # A read of [2024-02-10, 2024-03-01): February only ("<" a boundary stops before it).
    reads = read_windows([(datetime(2024, 2, 10), True, datetime(2024, 3, 1), False)], windows)
    assert reads.ids == ("t/2024-02",)
    assert (reads.start, reads.end) == (datetime(2024, 2, 1), datetime(2024, 3, 1))
    reads = read_windows([(None, False, datetime(2024, 3, 1), True)], windows)
    assert reads.ids == ("t/2024-01", "t/2024-02", "t/2024-03")
    # Two separate months: one window each in the restriction.
    reads = read_windows([(datetime(2024, 1, 5), True, datetime(2024, 1, 5), True),
                          (datetime(2024, 6, 30, 23), True, datetime(2024, 7, 1), False)],
                         windows)
    assert reads.ids == ("t/2024-01", "t/2024-06")
    assert reads.separate_runs == ((datetime(2024, 1, 1), datetime(2024, 2, 1)),
                                   (datetime(2024, 6, 1), datetime(2024, 7, 1)))


@pytest.mark.parametrize(("block", "scheme"), [
    ({"size": "1 month", "start": "2024-01-01"}, "ts: 1 calendar month from 1970-01 (UTC)"),
    ({"size": "1 year", "start": "2024-01-01"}, "ts: 12 calendar months from 1970-01 (UTC)"),
    ({"size": "1 week", "start": "2026-01-05"}, "ts: 1 week from Monday 00:00 UTC"),
    ({"size": "1 week", "start": "2026-01-01", "week_start": "thursday"},
     "ts: 1 week from Thursday 00:00 UTC"),
    ({"size": "7 days", "start": "2026-01-01"}, "ts: 1 week from Thursday 00:00 UTC"),
    ({"size": "1 day", "start": "2026-01-01"}, "ts: 1 day from 1970-01-01 00:00 UTC"),
])
def test_schemes_name_the_cut(block: dict[str, Any], scheme: str) -> None:
    config = _block(block.pop("size"), block.pop("start"), **block)
    assert config.scheme == scheme


# -- property: one block per instant, and the SQL restriction agrees with Python ------------
SIZES = ["1 hour", "6 hours", "1 day", "2 days", "1 week", "2 weeks", "1 month", "2 months",
         "3 months", "1 year"]
INSTANTS = st.datetimes(min_value=datetime(1901, 1, 1), max_value=datetime(2199, 12, 31))


@st.composite
def grids(draw: st.DrawFn) -> Any:
    size = draw(st.sampled_from(SIZES))
    return grid_for(size, draw(st.sampled_from(WEEKDAYS)) if "week" in size else "monday")


@settings(max_examples=500, deadline=None)
@given(grid=grids(), moment=INSTANTS)
def test_every_instant_lies_in_exactly_one_block(grid: Any, moment: datetime) -> None:
    n = grid.index(moment)
    assert grid.boundary(n) <= moment < grid.boundary(n + 1)
    # Boundaries increase, so no other block holds it; the id names that block alone.
    assert grid.boundary(n - 1) < grid.boundary(n)
    assert grid.index_of_label(grid.label(n)) == n
    assert grid.label(n - 1) != grid.label(n) != grid.label(n + 1)
    if isinstance(grid, MonthGrid):
        assert grid.boundary(n).day == 1 and grid.boundary(n).time() == datetime.min.time()
    elif grid.step >= timedelta(weeks=1):
        assert grid.boundary(n).weekday() == grid.origin.weekday()


@pytest.fixture(scope="module")
def databases(request: pytest.FixtureRequest) -> Iterator[dict[str, Callable[[str], list[int]]]]:
    """Run a query on DuckDB and on Postgres (both real), returning the first column."""
    import duckdb
    import psycopg

    pg = psycopg.connect(request.getfixturevalue("postgres_url"), autocommit=True)
    duck = duckdb.connect()
    yield {"duckdb": lambda sql: [r[0] for r in duck.execute(sql).fetchall()],
           "postgres": lambda sql: [r[0] for r in pg.execute(sql).fetchall()]}
    pg.close()
    duck.close()


@pytest.mark.postgres
@settings(max_examples=120, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(grid=grids(), origin=INSTANTS, count=st.integers(1, 40), bounds=st.lists(
    st.tuples(st.integers(-5, 45), st.booleans(), st.integers(0, 8), st.booleans()),
    min_size=1, max_size=3), rows=st.lists(INSTANTS, max_size=6), dates=st.booleans())
def test_the_sql_restriction_is_the_python_assignment(
        databases: dict[str, Callable[[str], list[int]]], grid: Any, origin: datetime,
        count: int, bounds: list[tuple[int, bool, int, bool]], rows: list[datetime],
        dates: bool) -> None:
    """For a schedule on any grid and a WHERE of one to three intervals: the blocks charged
    cover every instant the WHERE admits inside the schedule, and the restriction, run on
    DuckDB and Postgres over rows on and around every boundary, selects a row exactly when
    Python puts it in a charged block."""
    whole_days = isinstance(grid, MonthGrid) or grid.step % timedelta(days=1) == timedelta(0)
    column_type = "date" if dates and whole_days else "timestamp"
    first = grid.index(origin)
    windows = (BlockWindows("t", grid.boundary(first), grid, count)
               if not isinstance(grid, FixedGrid) or grid.iso_weeks
               else BlockWindows("t", grid.boundary(first), grid.step, count))
    intervals = []
    for low, low_incl, span, high_incl in bounds:
        lo = grid.boundary(first + low) + (US if not low_incl else timedelta(0))
        hi = grid.boundary(first + low + span)
        intervals.append((lo, low_incl, hi, high_incl))
    reads = read_windows(intervals, windows)
    ids = windows.ids()

    def assigned(moment: datetime) -> str | None:
        i = windows.index(moment)
        return ids[i] if 0 <= i < count else None

    points = list(rows)
    for i in range(-1, count + 2):
        edge = grid.boundary(first + i)
        points += [edge - US, edge, edge + US]
    if column_type == "date":
        points = [datetime(p.year, p.month, p.day) for p in points]
    points = [p for p in points if datetime(1900, 1, 1) <= p <= datetime(2200, 12, 31)]
    for p in points:  # the charge covers what the WHERE admits
        admitted = any((lo < p or (lo == p and li)) and (p < hi or (p == hi and hi_i))
                       for lo, li, hi, hi_i in intervals)
        if admitted and assigned(p) is not None:
            assert assigned(p) in reads.ids, p
    if not reads.ids:
        return
    where = restrict(None, exp.column("ts"), reads.start, reads.end, column_type,
                     reads.separate_runs)
    kind = "DATE" if column_type == "date" else "TIMESTAMP"
    values = ", ".join(f"({i}, {kind} '{p.isoformat(sep=' ')[:10 if kind == 'DATE' else 26]}')"
                       for i, p in enumerate(points))
    expected = sorted(i for i, p in enumerate(points) if assigned(p) in reads.ids)
    for name, run in databases.items():
        sql = f"SELECT i FROM (VALUES {values}) AS v(i, ts) WHERE {where.sql(name)} ORDER BY i"
        assert run(sql) == expected, (name, sql)


# -- a real engine, charged by the calendar -------------------------------------------------
EDGE_ROWS = [
    (1, "2024-01-31 23:59:59.999999"), (2, "2024-02-01 00:00:00"), (3, "2024-02-29 12:00:00"),
    (4, "2024-02-29 23:59:59.999999"), (5, "2024-03-01 00:00:00"), (6, "2024-12-31 23:59:59"),
    (7, "2025-01-01 00:00:00"), (8, "2025-02-01 00:00:00"),  # the last is after the schedule
]

MONTHS_POLICY = """
[backend]
url = "{url}"
[privacy]
epsilon_per_block = 1e9
delta_per_block = 1e-3
max_epsilon_per_query = 1e7
ledger = "memory"
[tables.cal]
privacy_unit = "uid"
max_rows_per_unit = 10
contribution = "fixed"
block = {{ column = "ts", size = "1 month", start = "2024-01-01", end = "2025-02-01" }}
[tables.cal.columns]
uid = {{ type = "int", private_id = true }}
ts = {{ type = "timestamp" }}
"""


@pytest.mark.parametrize(("where", "months", "count"), [
    ("ts >= '2024-02-01' AND ts < '2024-03-01'", ["2024-02"], 3),
    ("ts < '2024-03-01'", ["2024-01", "2024-02"], 4),
    ("ts <= '2024-03-01'", ["2024-01", "2024-02", "2024-03"], 5),
    ("ts::date = '2024-02-29'", ["2024-02"], 2),
    ("ts BETWEEN '2024-12-31' AND '2025-01-01'", ["2024-12", "2025-01"], 2),
    ("ts IN ('2024-01-31 23:59:59.999999', '2025-01-01')", ["2024-01", "2025-01"], 2),
    ("ts >= '2025-01-01'", ["2025-01"], 1),  # the row of 2025-02 lies outside the schedule
])
def test_engine_charges_calendar_months(scratch: Callable[..., Engine], where: str,
                                        months: list[str], count: int) -> None:
    engine = scratch("cal", [
        "CREATE TABLE cal (uid BIGINT, ts TIMESTAMP)",
        "INSERT INTO cal VALUES " + ", ".join(f"({u}, TIMESTAMP '{t}')" for u, t in EDGE_ROWS)],
        MONTHS_POLICY)
    result = engine.execute(f"SELECT COUNT(*) FROM cal WHERE {where}", epsilon=1e6)
    assert list(result.report.blocks) == [f"cal/{m}" for m in months]
    assert result.rows[0][0] == pytest.approx(count, abs=0.5)
    charged = {b.block_id for b in engine.ledger.blocks() if b.epsilon_consumed > 0}
    assert charged == {f"cal/{m}" for m in months}


def test_engine_without_where_reads_only_the_schedule(scratch: Callable[..., Engine]) -> None:
    engine = scratch("cal", [
        "CREATE TABLE cal (uid BIGINT, ts TIMESTAMP)",
        "INSERT INTO cal VALUES " + ", ".join(f"({u}, TIMESTAMP '{t}')" for u, t in EDGE_ROWS)],
        MONTHS_POLICY)
    result = engine.execute("SELECT COUNT(*) FROM cal", epsilon=1e6)
    assert len(result.report.blocks) == 13  # 2024-01 .. 2025-01
    assert result.rows[0][0] == pytest.approx(7, abs=0.5)


WEEKS_POLICY = """
[backend]
url = "{url}"
[privacy]
epsilon_per_block = 1e9
delta_per_block = 1e-3
max_epsilon_per_query = 1e7
ledger = "memory"
[tables.wk]
privacy_unit = "uid"
max_rows_per_unit = 10
contribution = "fixed"
block = {{ column = "d", size = "1 week", start = "START", end = "END"EXTRA }}
[tables.wk.columns]
uid = {{ type = "int", private_id = true }}
d = {{ type = "date" }}
"""

# Sunday 2026-01-04, Monday 01-05, Sunday 01-11, Monday 01-12, Saturday 01-31.
WEEK_ROWS = [(1, "2026-01-04"), (2, "2026-01-05"), (3, "2026-01-11"), (4, "2026-01-12"),
             (5, "2026-01-31")]


@pytest.mark.parametrize(("start", "extra", "where", "weeks", "count"), [
    ("2025-12-29", "", "d >= '2026-01-05' AND d < '2026-01-12'", ["2026-W02"], 2),
    ("2025-12-29", "", "d <= '2026-01-05'", ["2026-W01", "2026-W02"], 2),
    ("2025-12-29", "", "d >= '2026-01-26'", ["2026-W05"], 1),
    ("2025-12-28", ', week_start = "sunday"', "d >= '2026-01-04' AND d < '2026-01-11'",
     ["2026-01-04"], 2),
    ("2025-12-28", ', week_start = "sunday"', "d = '2026-01-11'", ["2026-01-11"], 1),
])
def test_engine_charges_weeks_on_a_date_column(scratch: Callable[..., Engine], start: str,
                                               extra: str, where: str, weeks: list[str],
                                               count: int) -> None:
    engine = scratch("wk", [
        "CREATE TABLE wk (uid BIGINT, d DATE)",
        "INSERT INTO wk VALUES " + ", ".join(f"({u}, DATE '{d}')" for u, d in WEEK_ROWS)],
        WEEKS_POLICY.replace("START", start).replace("EXTRA", extra)
        .replace("END", "2026-02-01" if extra else "2026-02-02"))  # a Sunday, a Monday
    result = engine.execute(f"SELECT COUNT(*) FROM wk WHERE {where}", epsilon=1e6)
    assert list(result.report.blocks) == [f"wk/{w}" for w in weeks]
    assert result.rows[0][0] == pytest.approx(count, abs=0.5)


# -- the ledger keeps the cut it was made with ----------------------------------------------
def _policy(block: dict[str, Any] | None) -> Any:
    table: dict[str, Any] = {"columns": {"ts": {"type": "timestamp"}}}
    if block is not None:
        table["block"] = {"column": "ts", **block}
    return parse_policy({"backend": {"url": "duckdb:///:memory:"},
                         "privacy": {"epsilon_per_block": 1.0}, "tables": {"t": table}})


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], Store]:
    if request.param == "sqlite":
        path = tmp_path / "ledger.sqlite3"
        return lambda: SQLiteStore(path)
    url = request.getfixturevalue("pg_ledger_url")
    return lambda: PostgresStore(url)


THURSDAY_WEEKS = {"size": "1 week", "start": "2026-01-01", "week_start": "thursday"}
MONDAY_WEEKS = {"size": "1 week", "start": "2025-12-29"}


def test_a_ledger_of_old_thursday_weeks(open_store: Callable[[], Store]) -> None:
    """A ledger written before cuts were recorded, holding Thursday weeks: refused under ISO
    weeks with a message naming its blocks and week_start; kept with week_start = thursday,
    which is then recorded, so a later switch to Mondays is refused too."""
    old = Ledger(1.0, 0.0, store=open_store())
    old.ensure_blocks(["t/2026-01-01", "t/2026-01-08", "other/2026-01-01"])
    old.close()
    ledger = Ledger(1.0, 0.0, store=open_store())
    with pytest.raises(LedgerMismatch, match=r"blocks of table t that the policy's cut \('ts: "
                       r"1 week from Monday 00:00 UTC'\) does not make: t/2026-01-01, "
                       r"t/2026-01-08") as err:
        ledger.check_block_schemes(block_schemes(_policy(MONDAY_WEEKS)))
    assert 'week_start = "thursday"' in (err.value.hint or "")
    ledger.check_block_schemes(block_schemes(_policy(THURSDAY_WEEKS)))  # recorded now
    ledger.close()
    ledger = Ledger(1.0, 0.0, store=open_store())
    assert ledger.store.meta()["blocks:t"] == "ts: 1 week from Thursday 00:00 UTC"
    with pytest.raises(LedgerMismatch, match=r"cut as 'ts: 1 week from Thursday 00:00 UTC', "
                       r"but the policy now cuts them as 'ts: 1 calendar month"):
        ledger.check_block_schemes(block_schemes(_policy({"size": "1 month",
                                                          "start": "2026-01-01"})))
    ledger.check_block_schemes(block_schemes(_policy(THURSDAY_WEEKS)))  # the same cut: fine
    ledger.close()


@pytest.mark.parametrize(("before", "after"), [
    ({"size": "1 day", "start": "2026-01-01"}, {"size": "1 week", "start": "2025-12-29"}),
    ({"size": "1 day", "start": "2026-01-01"}, {"size": "1 month", "start": "2026-01-01"}),
    ({"size": "1 month", "start": "2026-01-01"}, {"size": "3 months", "start": "2026-01-01"}),
    (MONDAY_WEEKS, {**MONDAY_WEEKS, "week_start": "sunday", "start": "2025-12-28"}),
    (None, {"size": "1 day", "start": "2026-01-01"}),  # the whole table, then blocks
])
def test_a_recorded_cut_may_not_change(open_store: Callable[[], Store],
                                       before: dict[str, Any] | None,
                                       after: dict[str, Any]) -> None:
    ledger = Ledger(1.0, 0.0, store=open_store())
    ledger.check_block_schemes(block_schemes(_policy(before)))
    ledger.close()
    ledger = Ledger(1.0, 0.0, store=open_store())
    with pytest.raises(LedgerMismatch, match="overlap, so the same rows would be charged"):
        ledger.check_block_schemes(block_schemes(_policy(after)))
    # start and end may move: the same cut.
    if before is not None:
        end = "2027-01-04" if before["size"] == "1 week" else "2027-01-01"  # a Monday
        ledger.check_block_schemes(block_schemes(_policy({**before, "end": end})))
    ledger.close()


def test_engine_start_refuses_a_changed_cut(tmp_path: Path) -> None:
    import duckdb

    data = tmp_path / "d.duckdb"
    con = duckdb.connect(str(data))
    con.execute("CREATE TABLE t (uid BIGINT, ts TIMESTAMP)")
    con.close()
    text = """
[backend]
url = "duckdb:///{data}"
[privacy]
epsilon_per_block = 1.0
ledger = "sqlite:///ledger.sqlite3"
[tables.t]
privacy_unit = "uid"
max_rows_per_unit = 1
block = {{ column = "ts", size = "{size}", start = "2026-01-01" }}
[tables.t.columns]
uid = {{ type = "int", private_id = true }}
ts = {{ type = "timestamp" }}
"""
    path = tmp_path / "policy.toml"
    path.write_text(text.format(data=data, size="1 day"))
    Engine.from_policy(path).close()
    path.write_text(text.format(data=data, size="1 month"))
    with pytest.raises(LedgerMismatch, match="blocks of table t cut as 'ts: 1 day from 1970-01-01"):
        Engine.from_policy(path)


def test_labels_round_trip_on_date_boundaries() -> None:
    """index_of_label refuses ids the grid cannot make (a day id under months, an ISO week that
    does not exist)."""
    months, weeks = grid_for("1 month"), grid_for("1 week")
    assert months.index_of_label("2026-01-01") is None and months.index_of_label("2026-13") is None
    assert weeks.index_of_label("2026-W54") is None and weeks.index_of_label("2026-01-05") is None
    assert weeks.index_of_label("2026-W53") == weeks.index(datetime(2026, 12, 28))
    assert grid_for("1 week", "thursday").index_of_label("2026-01-02") is None  # a Friday
    assert date(2026, 1, 1).weekday() == 3


def test_the_dashboard_shows_months_in_calendar_order(scratch: Callable[..., Engine]) -> None:
    """The owner's dashboard lists every month of the schedule by its calendar id, in order,
    the month a query read with its charge."""
    from server.dashboard.data import build_dashboard
    from server.metrics import BudgetHistory, Metrics

    engine = scratch("cal", [
        "CREATE TABLE cal (uid BIGINT, ts TIMESTAMP)",
        "INSERT INTO cal VALUES " + ", ".join(f"({u}, TIMESTAMP '{t}')" for u, t in EDGE_ROWS)],
        MONTHS_POLICY)
    engine.execute("SELECT COUNT(*) FROM cal WHERE ts >= '2024-02-01' AND ts < '2024-03-01'",
                   epsilon=2.0)
    bars = build_dashboard(engine, BudgetHistory(), Metrics(engine))["blocks"]
    assert [b["block"] for b in bars] == [f"cal/2024-{m:02d}" for m in range(1, 13)] + [
        "cal/2025-01"]
    assert {b["block"]: b["consumed"] for b in bars if b["consumed"]} == {"cal/2024-02": 2.0}


@settings(max_examples=100, deadline=None)
@given(moves=st.lists(st.datetimes(min_value=datetime(2023, 12, 1),
                                   max_value=datetime(2025, 3, 1)), min_size=1, max_size=12))
def test_the_catalog_follows_the_clock_across_months(moves: list[datetime]) -> None:
    """One catalog (which keeps a table's windows until the next block begins) whose clock
    jumps back and forth answers what the month schedule says at that time, also on the last
    microsecond of a month and at the first of the next."""
    from chorus_py.stores.schedules import BlockCatalog

    block = _block("1 month", "2024-01-01", "2025-02-01")
    grid = block.grid
    now = [moves[0]]
    catalog = BlockCatalog(clock=lambda: now[0])
    for moment in moves:
        following = grid.boundary(grid.index(moment) + 1)
        for at in (moment, following - US, following):
            now[0] = at
            assert catalog.windows("t", block) == scheduled_windows("t", block, at), at


@pytest.mark.parametrize(("held", "table"), [
    (["t/2026-01-01", "t/2026-03-31"], {"columns": {"ts": {"type": "timestamp"}}, "block": {
        "column": "ts", "size": "1 day", "start": "2026-01-01"}}),
    (["t/2026-01-01T06:00"], {"columns": {"ts": {"type": "timestamp"}}, "block": {
        "column": "ts", "size": "6 hours", "start": "2026-01-01"}}),
    (["t/uid:0-999", "t/uid:-1000--1"], {
        "privacy_unit": "uid", "max_rows_per_unit": 1, "columns": {"uid": {"type": "int"}},
        "block": {"column": "uid", "size": "1000 ids", "start": -1000, "end": 5000}}),
    (["t"], {"columns": {"ts": {"type": "timestamp"}}}),
])
def test_old_ledgers_of_unchanged_cuts_keep_working(open_store: Callable[[], Store],
                                                    held: list[str],
                                                    table: dict[str, Any]) -> None:
    """Days, shorter windows, id ranges and whole tables are cut as before: a ledger made before
    cuts were recorded starts, and the cut is recorded; a block of another cut is refused."""
    policy = parse_policy({"backend": {"url": "duckdb:///:memory:"},
                           "privacy": {"epsilon_per_block": 1.0}, "tables": {"t": table}})
    old = Ledger(1.0, 0.0, store=open_store())
    old.ensure_blocks(held)
    old.close()
    ledger = Ledger(1.0, 0.0, store=open_store())
    ledger.check_block_schemes(block_schemes(policy))
    assert "blocks:t" in ledger.store.meta()
    ledger.close()
    # The same ledger with one block of another cut, had nothing been recorded: refused.
    wrong = {"t": "t/2026-W01", "t/2026-01-01": "t", "t/2026-01-01T06:00": "t/2026-01-01T07:00",
             "t/uid:0-999": "t/uid:0-499"}[held[0]]
    fresh = Ledger(1.0, 0.0, store=MemoryStore())
    fresh.ensure_blocks([*held, wrong])
    with pytest.raises(LedgerMismatch, match=f"does not make: {re.escape(wrong)};"):
        fresh.check_block_schemes(block_schemes(policy))
