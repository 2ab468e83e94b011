"""DP quantiles read the ranked copy (``rewriters.quantiles``, issue 23).

The copy must change nothing but speed: the exact histogram the quantile kind runs counts, per
unit, min(c_u, k) of its c_u filtered rows with a non-NULL value, chosen uniformly among them,
like ranking the filtered rows per query.  Small skewed data on both backends: units of 1 to
40 rows, NULL values in light and heavy units, a declared key and an undeclared one.  Each
row's value names its unit and its index in it (v = unit + index / 100, one bin per row), so
the kept rows of every unit can be read off the histogram.
"""

from __future__ import annotations

import bisect
import collections
import math
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import pytest

from chorus_py.engine import Engine
from chorus_py.kinds import quantile as quantile_kind
from chorus_py.kinds.quantile import BINS, QuantileDetail
from chorus_py.kinds.selection import CELLS, Choices
from mechanisms.caps import cap_bins
from rewriters.contribution import ranked_table
from tests.conftest import table_with_rows

#: Rows per unit: light units up to the cap and heavier ones.
SIZES = {1: 1, 2: 2, 3: 3, 4: 5, 5: 8, 6: 40}
K = 3
UPPER = 100.0  # v in [0, UPPER], BINS bins: a bin is 0.01 wide

POLICY = """
[backend]
url = "{url}"

[privacy]
epsilon_per_block = 1000.0
max_epsilon_per_query = 500.0
delta_per_block = 1e-3
max_delta_per_query = 1e-4
noise = "proxy"

[tables.{table}]
privacy_unit = "person"
max_rows_per_unit = {k}
contribution = "{contribution}"
ranked_copy = {ranked}

[tables.{table}.columns]
id = {{ type = "int" }}
person = {{ type = "int" }}
i = {{ type = "int" }}
g = {{ type = "text", public_values = ["a", "b"] }}
v = {{ type = "float", lower = 0, upper = {upper} }}
h = {{ type = "int" }}

[analysts.alice]
"""

Row = tuple[int, int, int, str, float | None, int]


def _rows() -> list[Row]:
    """(id, person, i, g, v, h): i the row's index in its unit, g alternating a/b with every
    fifth row 'z' (not declared), v = person + i / 100 but NULL on every fourth row (unit 2's
    second row: a light unit with a NULL; the heavy unit 6 has ten), h = i % 2 (a key
    without public values: at most 2 groups per unit)."""
    out, next_id = [], 1
    for person, n in SIZES.items():
        for i in range(n):
            g = "z" if i % 5 == 4 else "ab"[i % 2]
            v = None if i % 4 == 1 and person in (2, 6) else person + i / 100
            out.append((next_id, person, i, g, v, i % 2))
            next_id += 1
    return out


def _bin(v: float) -> int:
    """The histogram's bin of v as the statement computes it (rewriters.quantiles._binned:
    FLOOR((v - 0) * scale) in doubles, v <= 0 first, v >= upper last)."""
    scale = BINS / UPPER
    return 0 if v <= 0 else BINS - 1 if v >= UPPER else min(math.floor((v - 0) * scale),
                                                              BINS - 1)


def _unit(b: int) -> int:
    """The unit of a row's bin: v = unit + i / 100 with i < 40, 100 bins per unit."""
    return b // 100


@pytest.fixture(params=["duckdb", pytest.param("postgres", marks=pytest.mark.postgres)])
def skewed(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    columns = "id BIGINT, person BIGINT, i BIGINT, g TEXT, v DOUBLE PRECISION, h BIGINT"
    with table_with_rows(request, tmp_path, "qskew", columns, _rows()) as made:
        yield made


@pytest.fixture
def engines(skewed: tuple[str, str], policy_engine: Callable[[str], Engine]
            ) -> Callable[..., Engine]:
    def make(ranked: bool, k: int = K, contribution: str = "fixed") -> Engine:
        url, table = skewed
        engine = policy_engine(POLICY.format(url=url, table=table, k=k, upper=UPPER,
                                             contribution=contribution,
                                             ranked="true" if ranked else "false"))
        engine.warm_up(wait=True)
        return engine

    return make


def _statements(engine: Engine, sql: str) -> list[str]:
    """The quantile histogram statements the kind runs (of a mixed query: its quantile
    part's)."""
    _, prepared = engine.prepare(sql, "alice", epsilon=1.0)
    detail = prepared.detail
    if not isinstance(detail, QuantileDetail):  # a mixed query (kinds.mixed)
        detail = detail.quantile.detail
    return [s for _, s in detail.histograms]


def _histogram(engine: Engine, sql: str) -> dict[tuple[object, ...], int]:
    """The exact histogram (never released): (keys..., bin) -> rows."""
    (statement,) = _statements(engine, sql)
    out: dict[tuple[object, ...], int] = collections.Counter()
    for row in engine.backend.run(statement).rows:
        out[tuple(row[:-1])] += int(row[-1])
    return dict(out)


def _expected(passing: Callable[[Row], bool], grouped: bool
              ) -> dict[tuple[object, ...], int]:
    """By hand, every filtered row with a value (nothing binds): (g index?, bin) -> rows."""
    out: dict[tuple[object, ...], int] = collections.Counter()
    for row in _rows():
        _, _, _, g, v, _ = row
        if v is None or not passing(row) or (grouped and g == "z"):
            continue
        out[(("a", "b").index(g), _bin(v)) if grouped else (_bin(v),)] += 1
    return dict(out)


CASES = [
    ("SELECT MEDIAN(v) FROM {t}", lambda r: True, False),
    ("SELECT PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY v) FROM {t} WHERE i >= 2",
     lambda r: r[2] >= 2, False),
    ("SELECT MIN(v), MAX(v) FROM {t} WHERE g = 'a'", lambda r: r[3] == "a", False),
    ("SELECT g, MEDIAN(v) FROM {t} GROUP BY g", lambda r: True, True),
    ("SELECT g, MEDIAN(v), COUNT(*) FROM {t} WHERE i < 1 OR i > 6 GROUP BY g",
     lambda r: r[2] < 1 or r[2] > 6, True),
]


@pytest.mark.parametrize("split", [False, True], ids=["union", "split"])
@pytest.mark.parametrize("query, passing, grouped", CASES)
def test_the_histogram_counts_every_kept_row_when_nothing_binds(
        skewed: tuple[str, str], engines: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch,
        query: str, passing: Callable[[Row], bool], grouped: bool, split: bool) -> None:
    """k = 40, every unit's size: the hand-made histogram of the filtered non-NULL rows, and
    the one of per-query bounding; each shape (the branches in one count, or apart)."""
    monkeypatch.setattr(quantile_kind, "SPLIT_DIALECTS", frozenset({"duckdb", "postgres"}
                                                                   if split else ()))
    sql = query.format(t=skewed[1])
    ranked, per_query = engines(True, 40), engines(False, 40)
    (statement,) = _statements(ranked, sql)
    assert "__ranked_" in statement and "__chorus_unit_rows <= 40" in statement
    assert ("chorus_parts" in statement) == split
    assert "__ranked_" not in _statements(per_query, sql)[0]
    expected = _expected(passing, grouped)
    assert _histogram(ranked, sql) == expected
    assert _histogram(per_query, sql) == expected


@pytest.mark.parametrize("split", [False, True], ids=["union", "split"])
@pytest.mark.parametrize("query, passing, grouped", CASES)
def test_each_unit_keeps_min_of_its_counted_rows_and_k(
        skewed: tuple[str, str], engines: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch,
        query: str, passing: Callable[[Row], bool], grouped: bool, split: bool) -> None:
    """k = 3 binds the heavy units: each unit keeps exactly min(c_u, k) of its c_u filtered
    rows with a value (NULL values dropped before the cap, never counted), only such rows,
    as per-query bounding does."""
    monkeypatch.setattr(quantile_kind, "SPLIT_DIALECTS", frozenset({"duckdb", "postgres"}
                                                                   if split else ()))
    sql = query.format(t=skewed[1])
    counted = _expected(passing, grouped)
    c_u = collections.Counter()
    for cell, n in counted.items():
        c_u[_unit(cell[-1])] += n
    for engine in (engines(True), engines(False)):
        histogram = _histogram(engine, sql)
        assert set(histogram) <= set(counted)  # only counted rows, each at most once
        assert all(n <= counted[cell] for cell, n in histogram.items())
        kept = collections.Counter()
        for cell, n in histogram.items():
            kept[_unit(cell[-1])] += n
        assert kept == {u: min(c, K) for u, c in c_u.items()}
        assert max(kept.values()) <= K


def _grouped_statement(engine: Engine, sql: str, cap: int, groups: int) -> str:
    """The histogram statement at a chosen cap and groups per unit (keys released by a
    threshold, contribution = "auto"): the selection's final plan."""
    _, prepared = engine.prepare(sql, "alice", epsilon=1.0, delta=1e-6)
    assert prepared.selection is not None
    final = prepared.selection.apply(Choices(cap=cap, bounds=(), groups=groups))
    (statement,) = [s for _, s in final.detail.histograms]
    return statement


@pytest.mark.parametrize("split", [False, True], ids=["union", "split"])
def test_groups_per_unit_are_bounded_over_the_copy(
        skewed: tuple[str, str], engines: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch,
        split: bool) -> None:
    """Keys released by a threshold (i % 2: at most 2 groups per unit), g < k chosen: the
    copy's light units (n_u <= g) by a plain scan, the others by g groups drawn afresh then
    k rows in stored order (``ranked_group_branches``).  With g = 2, k = 40 nothing binds:
    the hand count, as per-query bounding's; with g = 1, k = 3 each unit keeps
    min(c_ug, 3) rows of one of its groups."""
    monkeypatch.setattr(quantile_kind, "SPLIT_DIALECTS", frozenset({"duckdb", "postgres"}
                                                                   if split else ()))
    sql = f"SELECT h, MEDIAN(v) FROM {skewed[1]} WHERE i < 30 GROUP BY h"
    counted: dict[tuple[object, ...], int] = collections.Counter()
    per_group: dict[tuple[int, int], int] = collections.Counter()
    for _, person, i, _, v, _ in _rows():
        if v is not None and i < 30:
            counted[(i % 2, _bin(v))] += 1
            per_group[(person, i % 2)] += 1
    ranked, per_query = engines(True, 40, "auto"), engines(False, 40, "auto")
    statement = _grouped_statement(ranked, sql, 40, 2)
    assert "__ranked_" in statement and "__chorus_unit_rows <= 2" in statement
    assert "__chorus_grank" in statement and ("chorus_parts" in statement) == split
    for engine, text in ((ranked, statement), (per_query, _grouped_statement(per_query, sql,
                                                                              40, 2))):
        rows = engine.backend.run(text).rows
        assert {(int(g), int(b)): int(n) for g, b, n in rows} == counted
    bound = _grouped_statement(ranked, sql, K, 1)
    for _ in range(5):  # fresh group draws each run
        kept: dict[tuple[int, int], int] = collections.Counter()
        for g, b, n in ranked.backend.run(bound).rows:
            assert counted[(int(g), int(b))] >= int(n)
            kept[(_unit(int(b)), int(g))] += int(n)
        units = collections.Counter(u for u, _ in kept)
        assert all(c == 1 for c in units.values())  # one group per unit
        assert set(units) == {u for u, _ in per_group}  # every unit keeps rows
        for (u, g), n in kept.items():
            assert n == min(per_group[(u, g)], K)


def test_the_answer_and_report_are_those_of_per_query_bounding(
        skewed: tuple[str, str], engines: Callable[..., Engine]) -> None:
    sql = f"SELECT g, MEDIAN(v), COUNT(*) FROM {skewed[1]} GROUP BY g"
    ranked, per_query = engines(True), engines(False)
    a = ranked.execute(sql, "alice", epsilon=1.0)
    b = per_query.execute(sql, "alice", epsilon=1.0)
    assert a.report.stability == b.report.stability == K
    assert a.report.epsilon == b.report.epsilon
    assert [m.sensitivity for m in a.report.measurements] \
        == [m.sensitivity for m in b.report.measurements]
    assert [r[0] for r in a.rows] == [r[0] for r in b.rows] == ["a", "b"]


def test_a_replaced_copy_is_never_read(skewed: tuple[str, str],
                                       engines: Callable[..., Engine]) -> None:
    """The copy's name is in the quantile kind's cache key: after the table changes, the
    statement reads the new copy (built in the query here), never the old one."""
    url, table = skewed
    engine = engines(True)
    sql = f"SELECT MEDIAN(v) FROM {table}"
    (first,) = _statements(engine, sql)
    if url.startswith("duckdb"):
        engine.backend.run_owned([f"INSERT INTO {table} VALUES (1000, 7, 0, 'a', 7.0, 0)"])
    else:
        import psycopg

        with psycopg.connect(url, autocommit=True) as con:
            con.execute(f"INSERT INTO {table} VALUES (1000, 7, 0, 'a', 7.0, 0)")
            con.execute("SELECT pg_stat_force_next_flush()")
    for _ in range(50):  # the statistics collector may lag a little on Postgres
        (second,) = _statements(engine, sql)
        if second != first:
            break
    assert second != first and "__ranked_" in second
    assert _histogram(engine, sql)[(_bin(7.0),)] == 1


def test_kept_rows_are_uniform_among_the_counted_rows() -> None:
    """A unit of 6 rows, 2 of them NULL, k = 2: over fresh copies each of its 4 counted rows is
    in the histogram with probability 2/4 (a NULL among the stored ranks <= 2 takes no place),
    the light unit whole."""
    from sqlglot import parse_one

    from analyses.query import AggregateQuery
    from chorus_py.policy import TablePolicy
    from rewriters.quantiles import quantile_histogram

    con = duckdb.connect()
    con.execute("CREATE TABLE t (person BIGINT, v DOUBLE)")
    con.execute("INSERT INTO t SELECT 1, CASE WHEN i < 2 THEN NULL ELSE i END FROM range(6) r(i)")
    con.execute("INSERT INTO t VALUES (2, 8), (2, 9)")
    tp = TablePolicy(privacy_unit="person", max_rows_per_unit=2,
                     columns={"person": {"type": "int"}, "v": {"type": "float"}})
    q = AggregateQuery("t", "t", tp, None, (), (), (), None, (), None, None, 2, False, None)
    statement = quantile_histogram(q, parse_one("t.v"), 0, 10, 10, None, None,
                                   ("main", "copy")).sql("duckdb")
    counts: collections.Counter[int] = collections.Counter()
    runs = 600
    for _ in range(runs):
        con.execute("CREATE OR REPLACE TABLE copy AS " + ranked_table("t", "person").sql("duckdb"))
        histogram = dict(con.execute(statement).fetchall())
        assert sum(histogram.values()) == 4 and histogram[8] == histogram[9] == 1
        counts.update(histogram)
    for b in range(2, 6):  # Binomial(600, 1/2): sd 12.2; 5 sd either side
        assert abs(counts[b] - runs / 2) < 62, counts
    assert counts[0] == counts[1] == 0


def test_the_cap_selection_reads_the_stored_row_counts(
        skewed: tuple[str, str], engines: Callable[..., Engine]) -> None:
    """contribution = "auto" with no filter: the cap histogram reads the copy's stored row
    counts n_u on each unit's rank-1 row (one plain scan, ``kinds.selection.stored_counts``),
    the same exact counts as counting each unit's rows on the table (hand count; NULL values
    count as rows there too); with a filter it counts the filtered rows per unit as before."""
    table = skewed[1]
    ranked, per_query = engines(True, 40, "auto"), engines(False, 40, "auto")
    starts = cap_bins(40)
    by_hand = collections.Counter(bisect.bisect_right(starts, min(n, 40)) - 1
                                  for n in SIZES.values())
    sql = f"SELECT MEDIAN(v) FROM {table}"
    _, prepared = ranked.prepare(sql, "alice", epsilon=1.0)
    assert prepared.selection is not None
    ((what, _, stored),) = prepared.selection.histograms
    assert what == CELLS and "__ranked_" in stored and "__chorus_rank = 1" in stored
    marks = collections.Counter()
    for k, wc in ranked.backend.run(stored).rows:  # (min(n_u, limit), units marked)
        marks[bisect.bisect_right(starts, int(k)) - 1] += int(wc)
    assert +marks == by_hand
    _, prepared = per_query.prepare(sql, "alice", epsilon=1.0)
    ((what, _, counted),) = prepared.selection.histograms
    assert what == ("cap",) and "__ranked_" not in counted
    assert {int(b): int(n) for b, n in per_query.backend.run(counted).rows} == by_hand
    _, prepared = ranked.prepare(f"SELECT MEDIAN(v) FROM {table} WHERE i >= 2", "alice",
                                 epsilon=1.0)
    ((what, _, counted),) = prepared.selection.histograms
    assert what == ("cap",) and "__ranked_" not in counted
    # The answer runs: the selection reads the stored cells, then the quantile is drawn.
    result = ranked.execute(sql, "alice", epsilon=1.0)
    assert result.report.epsilon == 1.0 and len(result.rows) == 1
