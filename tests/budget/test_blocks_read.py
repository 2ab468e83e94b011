"""analyses.blocks: which blocks a WHERE clause reaches (IN, OR, NOT, casts, time zones, ids)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
import sqlglot

from analyses.blocks import BlockWindows, interval_set, read_windows

DAYS = BlockWindows("t", datetime(2026, 1, 1), timedelta(days=1), 31)  # January 2026
HOURS = BlockWindows("t", datetime(2026, 1, 1), timedelta(hours=1), 72)
IDS = BlockWindows("t", 0, 1000, 10, "uid")  # ids 0..9999 in blocks of 1000


def days(where: str, column_type: str = "timestamp", dialect: str = "postgres") -> list[int]:
    """The January days (1..31) a WHERE clause on column d reads."""
    tree = sqlglot.parse_one(f"SELECT 1 FROM t WHERE {where}", read=dialect)
    reads = read_windows(interval_set(tree.args["where"].this, "d", column_type), DAYS)
    return [int(i.rsplit("-", 1)[1]) for i in reads.ids]


R = list(range(1, 32))


@pytest.mark.parametrize(("where", "expected"), [
    ("d >= '2026-01-30'", [30, 31]),
    ("d > '2026-01-30'", [30, 31]),                    # 30th after midnight is still the 30th
    ("d < '2026-01-03'", [1, 2]),                      # "<" a block start stops before it
    ("d <= '2026-01-03'", [1, 2, 3]),                  # midnight of the 3rd is in the 3rd
    ("d < '2026-01-03 00:00:01'", [1, 2, 3]),
    ("d = '2026-01-05 13:00'", [5]),
    ("'2026-01-29' <= d", [29, 30, 31]),               # literal on the left
    ("d BETWEEN '2026-01-10' AND '2026-01-12'", [10, 11, 12]),
    ("d BETWEEN '2026-01-10' AND '2026-01-11 23:59:59'", [10, 11]),
    ("d >= '2026-01-10' AND d < '2026-01-12' AND x > 3", [10, 11]),
    ("d IN ('2026-01-02', '2026-01-20')", [2, 20]),
    ("d = '2026-01-02' OR d = '2026-01-04'", [2, 4]),
    ("(d < '2026-01-03' OR d >= '2026-01-30') AND x = 1", [1, 2, 30, 31]),
    ("d < '2026-01-03' OR x = 1", R),                  # the OR can be true in any block
    ("NOT (d < '2026-01-30')", [30, 31]),
    ("NOT (d >= '2026-01-03' AND x = 1)", R),
    ("NOT (d >= '2026-01-03' OR d < '2026-01-01')", [1, 2]),
    ("d NOT BETWEEN '2026-01-02' AND '2026-01-30'", [1, 30, 31]),  # after 30th midnight
    ("d NOT IN ('2026-01-02')", R),
    ("d <> '2026-01-02'", R),
    ("d IS NULL", []),
    ("NOT d IS NULL AND d < '2026-01-02'", [1]),
    ("d IS NOT NULL AND d < '2026-01-02'", [1]),
    ("d > '2026-01-20' AND d < '2026-01-10'", []),     # contradiction: reads nothing
    ("d = DATE '2026-01-07'", [7]),
    ("d < TIMESTAMP '2026-01-03 00:00:00'", [1, 2]),
    ("d = CAST('2026-01-07' AS DATE)", [7]),
    ("d >= '2026-01-30'::date", [30, 31]),
    ("CAST(d AS DATE) = '2026-01-07'", [7]),
    ("d::date < '2026-01-03'", [1, 2]),
    ("d::date <= '2026-01-03'", [1, 2, 3]),
    ("d::date > '2026-01-29'", [30, 31]),
    ("d::date >= '2026-01-29 10:00'", [30, 31]),       # trunc(d) >= Jan 29 10:00: from the 30th
    ("DATE(d) = '2026-01-07'", [7]),
    ("EXTRACT(day FROM d) = 7", R),                    # a function of the column: all blocks
    ("d > CURRENT_DATE", R),
    ("d > '2026-01-30' + INTERVAL '1 day'", R),
    ("TRUE", R),
    ("FALSE", []),
])
def test_blocks_of_a_where_clause(where: str, expected: list[int]) -> None:
    assert days(where) == expected


def test_runs_are_contiguous_windows() -> None:
    tree = sqlglot.parse_one("SELECT 1 FROM t WHERE d IN ('2026-01-02', '2026-01-03', "
                             "'2026-01-20') OR d >= '2026-01-30'")
    reads = read_windows(interval_set(tree.args["where"].this, "d", "timestamp"), DAYS)
    assert reads.runs == ((datetime(2026, 1, 2), datetime(2026, 1, 4)),
                          (datetime(2026, 1, 20), datetime(2026, 1, 21)),
                          (datetime(2026, 1, 30), datetime(2026, 2, 1)))
    assert (reads.start, reads.end) == (datetime(2026, 1, 2), datetime(2026, 2, 1))
    assert len(reads.ids) == 5


@pytest.mark.parametrize(("where", "expected"), [
    # Postgres reads '...+02' as midnight (drops the offset); DuckDB as 22:00 on Jan 1 (UTC):
    # both readings are covered.
    ("d >= '2026-01-02 00:00+02'", list(range(1, 32))),
    ("d = '2026-01-02 00:00+02:00'", [1, 2]),
    ("d = '2026-01-02 12:00Z'", [2]),
    # TIMESTAMPTZ compares in the session time zone: +-14 h around the instant.
    ("d = TIMESTAMPTZ '2026-01-05 12:00+00'", [4, 5, 6]),
    ("d < TIMESTAMPTZ '2026-01-03 00:00+00'", [1, 2, 3]),
])
def test_time_zones_are_covered_every_way(where: str, expected: list[int]) -> None:
    assert days(where) == expected


def test_date_column_with_a_time_literal_covers_the_day_and_the_instant() -> None:
    assert days("d = '2026-01-05 13:00'", "date") == [5]
    assert days("d > '2026-01-05 13:00'", "date") == list(range(5, 32))
    assert days("d < '2026-01-05 13:00'", "date") == [1, 2, 3, 4, 5]


def test_sub_day_windows() -> None:
    tree = sqlglot.parse_one("SELECT 1 FROM t WHERE d >= '2026-01-02 22:30' AND "
                             "d < '2026-01-03 01:00'")
    reads = read_windows(interval_set(tree.args["where"].this, "d", "timestamp"), HOURS)
    assert reads.ids == ("t/2026-01-02T22:00", "t/2026-01-02T23:00", "t/2026-01-03T00:00")


@pytest.mark.parametrize(("where", "expected"), [
    ("uid < 1000", ["t/uid:0-999"]),
    ("uid <= 1000", ["t/uid:0-999", "t/uid:1000-1999"]),
    ("uid BETWEEN 2500 AND 3100", ["t/uid:2000-2999", "t/uid:3000-3999"]),
    ("uid IN (5, 9999)", ["t/uid:0-999", "t/uid:9000-9999"]),
    ("uid = '4001'", ["t/uid:4000-4999"]),
    ("uid > 8999.5", ["t/uid:8000-8999", "t/uid:9000-9999"]),
    ("uid >= -5 AND uid < 10", ["t/uid:0-999"]),
    ("uid > 20000", []),
])
def test_id_range_blocks(where: str, expected: list[str]) -> None:
    tree = sqlglot.parse_one(f"SELECT 1 FROM t WHERE {where}")
    reads = read_windows(interval_set(tree.args["where"].this, "uid", "int"), IDS)
    assert list(reads.ids) == expected


def test_no_windows_reads_nothing() -> None:
    empty = BlockWindows("t", datetime(1970, 1, 1), timedelta(days=1), 0)
    reads = read_windows(interval_set(None, "d", "timestamp"), empty)
    assert reads.ids == () and reads.runs == ()
