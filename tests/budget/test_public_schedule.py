"""Wall 7: blocks come from the policy's public schedule and the clock, never from the data.

Blocks used to run from MIN to MAX of the block column, so one person alone on the first or last
day added a block: the blocks a query was charged on (and whether a query over that day was
charged at all) told, with certainty, whether that person was in the database.  Here two tables
differ in one person's rows on an edge day (the first or last day of the schedule, a day nobody
else has, a day before or after the schedule, far in the future; for id-range blocks an id alone
in the last range or outside the declared range); every query of a corpus (no WHERE, filtered to
that day, ranges around it, grouped, a join, sensitivity sampling) must get the same report and
the same ledger charges on both, on DuckDB and Postgres, and must never read a row outside the
schedule (checked with an epsilon so large that the noise is far below one).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlglot import exp

from chorus_py.backends import open_backend
from chorus_py.engine import Engine
from chorus_py.errors import PolicyError
from chorus_py.policy import load_policy, parse_policy
from chorus_py.stores.schedules import BlockCatalog, scheduled_windows

BASE, EDGE, SHOPS = "ps_base", "ps_edge", "ps_shops"
START, END = "2026-01-01", "2026-01-11"  # ten daily blocks
PERSON = 999

# 40 people, each with one row at noon on days 2..8 of January 2026 except the 5th.
BASE_ROWS = [(uid, datetime(2026, 1, day, 12) + timedelta(minutes=uid), uid % 10,
              "ab"[uid % 2]) for uid in range(1, 41) for day in (2, 3, 4, 6, 7, 8)]

TIME_EDGES = {
    "first day": [datetime(2026, 1, 1, 0, 0)],
    "last day": [datetime(2026, 1, 10, 23, 59, 59)],
    "a day alone": [datetime(2026, 1, 5, 8, 0)],
    "before the schedule": [datetime(2025, 12, 31, 23, 59, 59)],
    "after the end": [datetime(2026, 1, 11, 0, 0), datetime(2026, 2, 1, 0, 0)],
    "far future": [datetime(2099, 6, 1, 0, 0)],
    "first and last days": [datetime(2026, 1, 1, 5, 0), datetime(2026, 1, 10, 5, 0)],
}

TIME_QUERIES = [
    "SELECT COUNT(*) FROM {t}",
    "SELECT COUNT(*) FROM {t} WHERE ts >= '2026-01-01' AND ts < '2026-01-02'",
    "SELECT COUNT(*) FROM {t} WHERE CAST(ts AS DATE) = '2026-01-10'",
    "SELECT COUNT(*) FROM {t} WHERE ts::date = '2026-01-05'",
    "SELECT COUNT(*) FROM {t} WHERE ts BETWEEN '2025-12-25' AND '2026-01-03'",
    "SELECT COUNT(*) FROM {t} WHERE ts > '2026-01-09 12:00:00'",
    "SELECT COUNT(*) FROM {t} WHERE ts < '2026-01-01'",
    "SELECT COUNT(*) FROM {t} WHERE ts >= '2026-01-11'",
    "SELECT COUNT(*) FROM {t} WHERE ts >= '2099-01-01'",
    "SELECT COUNT(*) FROM {t} WHERE ts IN ('2026-01-05 08:00:00', '2026-01-01 00:00:00')",
    "SELECT COUNT(*) FROM {t} WHERE ts < '2026-01-02' OR ts >= '2026-01-10'",
    "SELECT SUM(v) AS s, COUNT(*) AS n FROM {t} WHERE ts >= '2026-01-09'",
    "SELECT g, COUNT(*) AS n FROM {t} GROUP BY g",
    "SELECT g, SUM(v) AS s FROM {t} WHERE ts < '2026-01-02' GROUP BY g",
    "SELECT COUNT(*) FROM {t} e JOIN ps_shops s ON e.g = s.g WHERE e.ts < '2026-01-02'",
    "SELECT e.g, COUNT(*) AS n FROM {t} e JOIN ps_shops s ON e.g = s.g GROUP BY e.g",
]

POLICY = """
[backend]
url = "{url}"
[privacy]
epsilon_per_block = 1e9
delta_per_block = 1e-3
max_epsilon_per_query = 1e7
max_delta_per_query = 1e-4
default_delta = 1e-8
ledger = "memory"
{tables}
[tables.ps_shops]
public = true
"""

TABLE = """
[tables.{t}]
privacy_unit = "uid"
max_rows_per_unit = 10
contribution = "fixed"
bounding = "{bounding}"
block = {{ column = "{column}", size = "{size}", start = {start}{end} }}
[tables.{t}.columns]
uid = {{ type = "int", private_id = true }}
ts = {{ type = "timestamp" }}
v = {{ type = "float", lower = 0, upper = 10 }}
g = {{ type = "text", public_values = ["a", "b"] }}
"""


# Event level, with a sampling distribution P for sensitivity sampling (chorus_py.kinds.sampled).
SAMPLED_TABLE = """
[tables.{t}]
block = {{ column = "{column}", size = "{size}", start = {start}{end} }}
[tables.{t}.columns]
uid = {{ type = "int" }}
ts = {{ type = "timestamp" }}
v = {{ type = "float", lower = 0, upper = 10 }}
g = {{ type = "text", public_values = ["a", "b"] }}
[tables.{t}.sampling]
rows = 400
columns.v = {{ distribution = "uniform", lower = 0, upper = 10 }}
columns.g = {{ distribution = "choice", values = ["a", "b"] }}
columns.ts = {{ distribution = "choice", values = ["2025-12-31 12:00:00", "2026-01-01 12:00:00",
              "2026-01-05 12:00:00", "2026-01-10 12:00:00", "2026-01-11 12:00:00"] }}
"""


def _policy(url: str, column: str = "ts", size: str = "1 day", start: str = f'"{START}"',
            end: str | None = f'"{END}"', bounding: str = "per-query",
            table: str = TABLE) -> str:
    """Both tables under one schedule (``end`` None: open, up to the clock)."""
    bound = "" if end is None else f", end = {end}"
    tables = "".join(table.format(t=t, column=column, size=size, start=start, end=bound,
                                  bounding=bounding) for t in (BASE, EDGE))
    return POLICY.format(url=url, tables=tables)


def _literal(value: object) -> str:
    if isinstance(value, datetime):
        return f"TIMESTAMP '{value.isoformat(sep=' ')}'"
    return f"'{value}'" if isinstance(value, str) else str(value)


def _create(table: str, rows: list[tuple[Any, ...]]) -> list[str]:
    values = ", ".join("(" + ", ".join(_literal(v) for v in row) + ")" for row in rows)
    return [f"DROP TABLE IF EXISTS {table}",
            f"CREATE TABLE {table} (uid BIGINT, ts TIMESTAMP, v DOUBLE PRECISION, g TEXT)",
            f"INSERT INTO {table} VALUES {values}"]


@pytest.fixture
def twins(backend_url: str, tmp_path: Path) -> Iterator[Callable[..., Engine]]:
    """``twins(edge_rows, **policy)``: tables ps_base (everyone) and ps_edge (everyone and the
    edge rows) on the backend, and an engine whose policy declares both with one schedule."""
    admin = open_backend(backend_url)
    engines: list[Engine] = []

    def make(edge_rows: list[tuple[Any, ...]], **policy: Any) -> Engine:
        admin.run_owned([
            *_create(BASE, BASE_ROWS), *_create(EDGE, BASE_ROWS + edge_rows),
            f"DROP TABLE IF EXISTS {SHOPS}",
            f"CREATE TABLE {SHOPS} (g TEXT, city TEXT)",
            f"INSERT INTO {SHOPS} VALUES ('a', 'SF'), ('b', 'LA')",
            "DROP SCHEMA IF EXISTS chorus_private CASCADE"])
        path = tmp_path / f"schedule-{uuid.uuid4().hex[:6]}.toml"
        path.write_text(_policy(backend_url, **policy))
        engine = Engine(load_policy(path), block_ttl_seconds=0)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()
    admin.run_owned([f"DROP TABLE IF EXISTS {t}" for t in (BASE, EDGE, SHOPS)]
                    + ["DROP SCHEMA IF EXISTS chorus_private CASCADE"])
    admin.close()


def _strip(ids: tuple[str, ...] | list[str], table: str) -> tuple[str, ...]:
    out = []
    for block_id in ids:
        assert block_id.startswith(f"{table}/"), block_id
        out.append(block_id[len(table) + 1:])
    return tuple(out)


def _view(report: Any, table: str) -> tuple[Any, ...]:
    """What an analyst learns of a report besides the noisy answer, the table's name removed."""
    return (report.verdict, report.charged, report.epsilon, report.delta, report.noise,
            _strip(report.blocks, table))


def _charges(engine: Engine, table: str) -> dict[str, tuple[float, float]]:
    return {b.block_id[len(table) + 1:]: (b.epsilon_consumed, b.delta_consumed)
            for b in engine.ledger.blocks() if b.block_id.startswith(f"{table}/")}


def _same_everywhere(engine: Engine, queries: list[str], epsilon: float = 1e4,
                     **options: Any) -> list[tuple[Any, Any]]:
    """Run every query on both tables; the reports and charges must be identical. Returns the
    (base, edge) results."""
    results = []
    for sql in queries:
        base_plan = engine.explain(sql.format(t=BASE), epsilon=epsilon, **options)
        edge_plan = engine.explain(sql.format(t=EDGE), epsilon=epsilon, **options)
        assert _view(base_plan, BASE) == _view(edge_plan, EDGE), sql
        base = engine.execute(sql.format(t=BASE), epsilon=epsilon, **options)
        edge = engine.execute(sql.format(t=EDGE), epsilon=epsilon, **options)
        assert _view(base.report, BASE) == _view(edge.report, EDGE), sql
        assert _view(base.report, BASE)[2:] == _view(base_plan, BASE)[2:], sql  # explain: free
        if base.report.charged:
            assert base.report.noise != "none", sql  # an answer of private rows is noisy
        results.append((base, edge))
    assert _charges(engine, BASE) == _charges(engine, EDGE)
    return results


@pytest.mark.parametrize("edge", sorted(TIME_EDGES))
def test_one_persons_edge_rows_change_no_block_or_charge(
        twins: Callable[..., Engine], edge: str) -> None:
    times = TIME_EDGES[edge]
    engine = twins([(PERSON, ts, 7, "a") for ts in times])
    results = _same_everywhere(engine, TIME_QUERIES)
    every = engine.explain(f"SELECT COUNT(*) FROM {EDGE}", epsilon=1.0)
    assert _strip(every.blocks, EDGE) == tuple(f"2026-01-{d:02d}" for d in range(1, 11))
    # Rows outside the schedule are never read: with this epsilon the noise of a COUNT (k = 10)
    # is far below 1, so the edge table's count exceeds the base's by the person's rows in the
    # schedule that the filter keeps, and by nothing else.
    inside = sum(datetime(2026, 1, 1) <= ts < datetime(2026, 1, 11) for ts in times)
    (base, edge_result) = results[0]
    assert edge_result.rows[0][0] - base.rows[0][0] == pytest.approx(inside, abs=0.5)
    outside_filters = (6, 7, 8)  # ts < start, ts >= end, ts >= 2099: no block, nothing read
    for i in outside_filters:
        base, edge_result = results[i]
        assert not base.report.charged and base.report.blocks == ()
        assert edge_result.rows == base.rows == [(0,)]


def test_materialized_sample_holds_only_scheduled_rows(twins: Callable[..., Engine]) -> None:
    """The stored bounded sample ranks each person's rows among the scheduled ones only: rows
    outside the schedule neither appear in it nor take a rank from a scheduled row."""
    times = [datetime(2025, 12, 31, 12)] * 12 + [datetime(2026, 1, 1, 12)]
    engine = twins([(PERSON, ts, 7, "a") for ts in times], bounding="materialized")
    queries = [q for q in TIME_QUERIES if "JOIN" not in q]
    results = _same_everywhere(engine, queries)
    samples = engine.backend.run(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = "
        f"'chorus_private' AND table_name LIKE '{EDGE}__bounded_%'").rows
    (name,) = [r[0] for r in samples]
    stored = engine.backend.run(f'SELECT ts FROM chorus_private."{name}" WHERE uid = {PERSON}')
    # The person's one scheduled row is always kept (k = 10), the twelve others never stored.
    assert [r[0] for r in stored.rows] == [datetime(2026, 1, 1, 12)]
    base, edge = results[1]  # the first day alone
    assert edge.rows[0][0] - base.rows[0][0] == pytest.approx(1, abs=0.5)


SAMPLED_QUERIES = [
    "SELECT SUM(v) AS s, COUNT(*) AS n FROM {t}",
    "SELECT SUM(v) AS s FROM {t} WHERE ts < '2026-01-02'",
    "SELECT COUNT(*) AS n FROM {t} WHERE ts >= '2026-01-10'",
    "SELECT COUNT(*) AS n FROM {t} WHERE ts >= '2026-01-11'",
    "SELECT g, COUNT(*) AS n FROM {t} WHERE ts < '2026-01-02' GROUP BY g",
]


@pytest.mark.parametrize("edge", ["first and last days", "before the schedule", "after the end"])
def test_sampled_sensitivity_queries_too(twins: Callable[..., Engine], edge: str) -> None:
    """Sensitivity sampling (random DP) charges the same blocks on both tables."""
    engine = twins([(PERSON, ts, 7, "a") for ts in TIME_EDGES[edge]], table=SAMPLED_TABLE)
    results = _same_everywhere(engine, SAMPLED_QUERIES, epsilon=5.0, sensitivity="sampled",
                               gamma=0.05)
    assert _strip(results[0][0].report.blocks, BASE) == tuple(
        f"2026-01-{d:02d}" for d in range(1, 11))
    base, edge_result = results[3]  # after the schedule: no block, no row, no charge
    assert not base.report.charged and edge_result.rows == base.rows


ID_EDGES = {"alone in the last range": [99], "above the range": [150, 1000],
            "below the range": [-5], "first range": [0]}
ID_QUERIES = [
    "SELECT COUNT(*) FROM {t}",
    "SELECT COUNT(*) FROM {t} WHERE uid >= 90",
    "SELECT COUNT(*) FROM {t} WHERE uid = 150",
    "SELECT COUNT(*) FROM {t} WHERE uid < 0",
    "SELECT COUNT(*) FROM {t} WHERE uid BETWEEN 85 AND 120",
    "SELECT g, COUNT(*) AS n FROM {t} WHERE uid > 95 GROUP BY g",
    "SELECT COUNT(*) FROM {t} e JOIN ps_shops s ON e.g = s.g WHERE e.uid >= 90",
]


@pytest.mark.parametrize("edge", sorted(ID_EDGES))
def test_id_range_blocks_are_the_declared_range(twins: Callable[..., Engine], edge: str) -> None:
    uids = ID_EDGES[edge]
    engine = twins([(uid, datetime(2026, 1, 3), 7, "b") for uid in uids], column="uid",
                   size="10 ids", start="0", end="100")
    results = _same_everywhere(engine, ID_QUERIES)
    every = engine.explain(f"SELECT COUNT(*) FROM {EDGE}", epsilon=1.0)
    assert _strip(every.blocks, EDGE) == tuple(f"uid:{lo}-{lo + 9}" for lo in range(0, 100, 10))
    base, edge_result = results[0]
    inside = sum(0 <= uid < 100 for uid in uids)
    assert edge_result.rows[0][0] - base.rows[0][0] == pytest.approx(inside, abs=0.5)
    for i in (2, 3):  # ids outside the range: no block, nothing read, nothing charged
        base, edge_result = results[i]
        assert not base.report.charged and edge_result.rows == base.rows == [(0,)]


def test_open_schedule_grows_with_the_clock_not_the_data(
        twins: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch) -> None:
    """Without end, blocks run up to the one holding the current UTC time: a new day's block
    appears when the day begins, whatever the data holds; rows after now are not read."""
    import chorus_py.stores.schedules as statistics

    now = [datetime(2026, 1, 6, 23, 59)]
    monkeypatch.setattr(statistics, "utc_now", lambda: now[0])
    engine = twins([(PERSON, datetime(2026, 1, 7, 9), 7, "a")], end=None)
    queries = ["SELECT COUNT(*) FROM {t}", "SELECT COUNT(*) FROM {t} WHERE ts >= '2026-01-06'"]
    first = _same_everywhere(engine, queries)
    assert _strip(first[0][1].report.blocks, EDGE)[-1] == "2026-01-06"
    assert first[0][1].rows[0][0] - first[0][0].rows[0][0] == pytest.approx(0, abs=0.5)
    now[0] = datetime(2026, 1, 7, 0, 0)  # the 7th begins: its block appears, on both tables
    second = _same_everywhere(engine, queries)
    assert _strip(second[0][1].report.blocks, EDGE)[-1] == "2026-01-07"
    assert second[0][1].rows[0][0] - second[0][0].rows[0][0] == pytest.approx(1, abs=0.5)


# -- property: random schedules, random edge rows -------------------------------------------
SIZES = {"1 hour": 3600, "6 hours": 6 * 3600, "1 day": 86400, "2 days": 2 * 86400,
         "1 week": 7 * 86400}


@st.composite
def schedules(draw: st.DrawFn) -> tuple[str, datetime, datetime | None, datetime]:
    size = draw(st.sampled_from(sorted(SIZES)))
    width = timedelta(seconds=SIZES[size])
    # Fixed sizes count from 1970-01-01 00:00 UTC; weeks from the first Monday (ISO weeks).
    epoch = datetime(1970, 1, 5) if size == "1 week" else datetime(1970, 1, 1)
    start = epoch + width * ((datetime(2026, 1, 1) - epoch) // width
                             + draw(st.integers(-20, 20)))
    count = draw(st.integers(1, 30))
    end = start + width * count if draw(st.booleans()) else None
    now = start + draw(st.integers(-3, 40)) * width + timedelta(
        seconds=draw(st.integers(0, SIZES[size] - 1)))
    return size, start, end, now


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedule=schedules(), rows=st.lists(st.integers(-60 * 86400, 60 * 86400), max_size=5),
       low=st.integers(-60, 60), span=st.integers(0, 40))
def test_windows_and_reads_are_functions_of_the_schedule_alone(
        schedule: tuple[str, datetime, datetime | None, datetime], rows: list[int], low: int,
        span: int) -> None:
    """For any schedule, clock and edge rows: the windows come from the policy and the clock,
    cover exactly the blocks begun by now (and before end), and a row is read by a query
    restricted to its claimed windows exactly when it lies in one of them."""
    import duckdb

    from analyses.blocks import read_windows
    from rewriters.blocks import blocks as restrict

    size, start, end, now = schedule
    block = parse_policy({
        "backend": {"url": "duckdb:///:memory:"},
        "tables": {"t": {"columns": {"ts": {"type": "timestamp"}},
                         "block": {"column": "ts", "size": size, "start": start.isoformat(),
                                   **({"end": end.isoformat()} if end else {})}}},
        "privacy": {"epsilon_per_block": 1.0}}).tables["t"].block
    assert block is not None
    windows = BlockCatalog(clock=lambda: now).windows("t", block)
    assert windows == scheduled_windows("t", block, now)
    width = block.width
    begun = [start + width * i for i in range(200) if start + width * i <= now
             and (end is None or start + width * i < end)]
    assert windows.count == len(begun)
    assert windows.ids() == BlockCatalog(clock=lambda: now).windows("t", block).ids()
    # A query over [lo, lo + span widths): charged on the scheduled windows it reaches.
    lo = start + width * low
    reads = read_windows([(lo, True, lo + width * span, False)], windows)
    where = restrict(None, exp.column("ts"), reads.start, reads.end, "timestamp",
                     reads.separate_runs)
    con = duckdb.connect()
    con.execute("CREATE TABLE t (ts TIMESTAMP)")
    points = [datetime(2026, 1, 1) + timedelta(seconds=s) for s in rows]
    for point in points:
        con.execute("INSERT INTO t VALUES (?)", [point])
    got = con.execute(f"SELECT COUNT(*) FROM t WHERE {where.sql('duckdb')}").fetchone()[0]
    labels = [f"t/{_label(start + width * i, width, size)}" for i in range(windows.count)]
    assert list(windows.ids()) == labels
    charged = {(start + width * i) for i in range(windows.count) if labels[i] in reads.ids}
    assert got == sum(any(b <= p < b + width for b in charged) for p in points)
    assert all(start <= b and b <= now and (end is None or b < end) for b in charged)


@settings(max_examples=100, deadline=None)
@given(schedule=schedules(), moves=st.lists(st.integers(-5 * 86400, 50 * 7 * 86400),
                                            min_size=1, max_size=12))
def test_the_catalog_follows_the_clock(
        schedule: tuple[str, datetime, datetime | None, datetime], moves: list[int]) -> None:
    """One catalog whose clock jumps back and forth (the cache keeps a table's windows while
    no block begins or ends) always answers what the schedule says at that time."""
    size, start, end, _ = schedule
    block = parse_policy({
        "backend": {"url": "duckdb:///:memory:"},
        "tables": {"t": {"columns": {"ts": {"type": "timestamp"}},
                         "block": {"column": "ts", "size": size, "start": start.isoformat(),
                                   **({"end": end.isoformat()} if end else {})}}},
        "privacy": {"epsilon_per_block": 1.0}}).tables["t"].block
    assert block is not None
    now = [start]
    catalog = BlockCatalog(clock=lambda: now[0])
    for seconds in moves:
        now[0] = start + timedelta(seconds=seconds)
        assert catalog.windows("t", block) == scheduled_windows("t", block, now[0])
        # Just before and at the next boundary too.
        boundary = start + block.width * max(0, (now[0] - start) // block.width + 1)
        for moment in (boundary - timedelta(microseconds=1), boundary):
            now[0] = moment
            assert catalog.windows("t", block) == scheduled_windows("t", block, moment)


def _label(point: datetime, width: timedelta, size: str) -> str:
    if size == "1 week":  # ISO weeks
        return f"{point.isocalendar()[0]}-W{point.isocalendar()[1]:02d}"
    daily = width % timedelta(days=1) == timedelta(0)
    return point.date().isoformat() if daily else point.isoformat(timespec="minutes")


# -- policy validation -----------------------------------------------------------------------
def _table_block(block: dict[str, Any], column_type: str = "timestamp") -> Any:
    return parse_policy({
        "backend": {"url": "duckdb:///:memory:"},
        "privacy": {"epsilon_per_block": 1.0},
        "tables": {"t": {"privacy_unit": "uid", "max_rows_per_unit": 1,
                         "columns": {"uid": {"type": "int"}, "ts": {"type": column_type}},
                         "block": block}}}).tables["t"].block


@pytest.mark.parametrize(("block", "message"), [
    ({"column": "ts", "size": "1 day"}, r"need the public start .* add start"),
    ({"column": "uid", "size": "100 ids"}, r"declared range of ids.*add start and end"),
    ({"column": "uid", "size": "100 ids", "start": 0}, r"declared range of ids"),
    ({"column": "uid", "size": "100 ids", "start": 50, "end": 1000},
     r"start = 50 is not a multiple of the block size 100: use 0 or 100"),
    ({"column": "uid", "size": "100 ids", "start": 100, "end": 100}, "greater than start"),
    ({"column": "ts", "size": "1 day", "start": "2026-01-01T06:00:00"},
     r"not on a boundary of '1 day' blocks .* use 2026-01-01T00:00:00 or 2026-01-02T00:00:00"),
    ({"column": "ts", "size": "1 week", "start": "2026-01-01"},
     r"weeks begin on Monday.* use 2025-12-29T00:00:00 or 2026-01-05T00:00:00; or keep .* "
     r"week_start = \"thursday\""),
    ({"column": "ts", "size": "1 week", "start": "2026-01-05", "week_start": "sunday"},
     r"weeks begin on Sunday.* use 2026-01-04T00:00:00 or 2026-01-11T00:00:00$"),
    ({"column": "ts", "size": "1 day", "start": "2026-01-05", "week_start": "monday"},
     "week_start applies to blocks of whole weeks"),
    ({"column": "ts", "size": "1 week", "start": "2026-01-05", "week_start": "mon"},
     "Input should be 'monday'"),
    ({"column": "ts", "size": "1 month", "start": "2024-02-29"},
     r"the first of a month.* use 2024-02-01T00:00:00 or 2024-03-01T00:00:00"),
    ({"column": "ts", "size": "3 months", "start": "2026-02-01"},
     r"use 2026-01-01T00:00:00 or 2026-04-01T00:00:00"),
    ({"column": "ts", "size": "1 day", "start": "2026-01-02", "end": "2026-01-01"},
     "later than start"),
    ({"column": "ts", "size": "1 day", "start": 0}, "are dates or timestamps"),
    ({"column": "ts", "size": "1 day", "start": "yesterday"}, "expected a date or timestamp"),
    ({"column": "ts", "size": "1 second", "start": "2020-01-01"}, "more than 100000"),
    ({"column": "ts", "size": "0 days", "start": "2026-01-01"}, "expected a window"),
])
def test_block_schedule_validation(block: dict[str, Any], message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        _table_block(block)


def test_block_schedule_forms() -> None:
    import tomllib

    # TOML dates and offset datetimes, ISO strings (UTC unless an offset is given).
    text = ('block = { column = "ts", size = "1 hour", start = 2026-01-01T02:00:00+02:00, '
            'end = 2026-01-02 }')
    block = _table_block(tomllib.loads(text)["block"])
    assert (block.start, block.end) == (datetime(2026, 1, 1), datetime(2026, 1, 2))
    assert block.count_at(datetime(2030, 1, 1)) == 24
    assert block.count_at(datetime(2026, 1, 1, 5, 30)) == 6
    assert block.count_at(datetime(2025, 12, 31, 23, 59)) == 0
    assert _table_block({"column": "ts", "size": "1 week", "start": "2026-01-05"}) is not None
    # Weeks before they had a start day: Thursdays, as 1970-01-01.
    assert _table_block({"column": "ts", "size": "1 week", "start": "2026-01-01",
                         "week_start": "Thursday"}) is not None
    with pytest.raises(PolicyError, match="date column must be whole days"):
        _table_block({"column": "ts", "size": "6 hours", "start": "2026-01-01"}, "date")
    ids = _table_block({"column": "uid", "size": "100 ids", "start": -200, "end": 300})
    assert ids.count_at(datetime(1970, 1, 1)) == 5
