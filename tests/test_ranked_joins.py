"""Join queries read the ranked copies of their private tables (issue 23, ``rewriters.joins``).

Each occurrence of a table bounded per query keeps min(c_u, cap) of its c_u filtered rows,
chosen uniformly among them, whether it ranks its rows itself or reads the copy: the stored
ranks <= cap by a plain scan when nothing filters it, the light units whole and the heavy ones
ranked after the filter otherwise.  Tested on small, skewed data (units of 1 to 40 rows) on
both backends, against hand counts and the per-query path (``ranked_copy = false``), with the
outgoing verifier's near misses of the shapes inside a join.
"""

from __future__ import annotations

import collections
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from analyses.outgoing import Refused, verify
from chorus_py.engine import Engine
from chorus_py.stores.samples import BoundedSamples
from tests.conftest import tables_with_rows

#: Rows per unit of the event table: light units of each size up to the cap and heavier ones.
SIZES = {1: 1, 2: 2, 3: 3, 4: 5, 5: 8, 6: 40}
K = 3
DAY1, DAY2 = "2026-01-01 12:00:00", "2026-01-02 12:00:00"

POLICY = """
[backend]
url = "{url}"

[privacy]
epsilon_per_block = 100000.0
delta_per_block = 1e-3
max_epsilon_per_query = 5000.0
max_delta_per_query = 1e-4
default_delta = 1e-8
noise = "{noise}"

[tables.{ev}]
privacy_unit = "person"
max_rows_per_unit = {k}
contribution = "fixed"
ranked_copy = {ranked}
block = {{ column = "t", size = "1 day", start = "2026-01-01", end = "2026-01-03" }}

[tables.{ev}.columns]
id = {{ type = "int" }}
person = {{ type = "int" }}
v = {{ type = "float", lower = 0, upper = 100 }}
t = {{ type = "timestamp" }}

[tables.{pp}]
privacy_unit = "person"
max_rows_per_unit = 1
contribution = "fixed"
ranked_copy = {ranked}
bounding = "{bounding}"

[tables.{pp}.columns]
person = {{ type = "int", private_id = true }}
age = {{ type = "int" }}

[tables.{kinds}]
public = true

[analysts.alice]
"""


def _events() -> list[tuple[int, int, float, str]]:
    """(id, person, v, t): v = the row's index within its unit (filters cut units unevenly);
    even indexes on day 1, odd ones on day 2."""
    out, next_id = [], 1
    for person, n in SIZES.items():
        for i in range(n):
            out.append((next_id, person, float(i), DAY1 if i % 2 == 0 else DAY2))
            next_id += 1
    return out


def _people() -> list[tuple[int, int]]:
    """(person, age): one row per person, 1..7 (person 7 has no events), age 10 * person."""
    return [(p, 10 * p) for p in range(1, 8)]


Tables = tuple[str, str, str, str]  # URL, events, people, kinds

_TABLES = {  # prefix: (columns in Postgres types, rows)
    "ev": ("id BIGINT, person BIGINT, v DOUBLE PRECISION, t TIMESTAMP", _events),
    "pp": ("person BIGINT, age BIGINT", _people),
    "kinds": ("v DOUBLE PRECISION, big BIGINT",
              lambda: [(float(v), int(v >= 2)) for v in range(40)]),
}


@pytest.fixture(params=["duckdb", pytest.param("postgres", marks=pytest.mark.postgres)])
def tables(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Tables]:
    """(URL, events, people, kinds) in one database of each backend."""
    made = {prefix: (columns, rows()) for prefix, (columns, rows) in _TABLES.items()}
    with tables_with_rows(request, tmp_path, "joins", made) as (url, names):
        yield url, names["ev"], names["pp"], names["kinds"]


@pytest.fixture
def engines(tables: Tables, policy_engine: Callable[[str], Engine]) -> Callable[..., Engine]:
    def make(ranked: bool = True, bounding: str = "per-query", noise: str = "proxy") -> Engine:
        url, ev, pp, kinds = tables
        return policy_engine(POLICY.format(url=url, ev=ev, pp=pp, kinds=kinds, k=K, noise=noise,
                                           ranked="true" if ranked else "false",
                                           bounding=bounding))

    return make


def _prepared_sql(engine: Engine, sql: str, delta: float | None = None) -> str:
    _, prepared = engine.prepare(sql, "alice", epsilon=1.0, delta=delta)
    return prepared.detail.sql


def _exact(engine: Engine, sql: str, delta: float | None = None) -> list[tuple[object, ...]]:
    """The exact measurements the proxy would noise (noise = "proxy"): never released."""
    return engine.backend.run(_prepared_sql(engine, sql, delta)).rows


def _kept(per_unit: collections.Counter[int], cap: int) -> int:
    """Rows kept: sum over units of min(c_u, cap)."""
    return sum(min(c, cap) for c in per_unit.values())


def _events_of(passing: Callable[[int, float, str], bool]) -> collections.Counter[int]:
    return collections.Counter(p for _, p, v, t in _events() if passing(p, v, t))


AGES = dict(_people())

# (query over {ev} e, {pp} p, {kinds} k; hand count; whether each private side reads its
# copy whole: events, people)
CASES = [
    ("SELECT COUNT(*) FROM {ev} e JOIN {pp} p ON e.person = p.person",
     _kept(_events_of(lambda p, v, t: True), K), (True, True)),
    ("SELECT COUNT(*) FROM {ev} e JOIN {pp} p ON e.person = p.person WHERE e.v >= 2",
     _kept(_events_of(lambda p, v, t: v >= 2), K), (False, True)),
    ("SELECT COUNT(*) FROM {ev} e JOIN {pp} p ON e.person = p.person WHERE p.age < 35",
     _kept(_events_of(lambda p, v, t: AGES[p] < 35), K), (True, False)),
    # The claimed blocks are the only filter: day 2 alone does not cover the copy.
    ("SELECT COUNT(*) FROM {ev} e JOIN {pp} p ON e.person = p.person "
     "WHERE e.t >= TIMESTAMP '2026-01-02 00:00:00'",
     _kept(_events_of(lambda p, v, t: t == DAY2), K), (False, True)),
    # A filtered public table reaches the events as a semi-join: their filter too.
    ("SELECT COUNT(*) FROM {ev} e JOIN {kinds} k ON e.v = k.v WHERE k.big = 1",
     _kept(_events_of(lambda p, v, t: v >= 2), K), (False, None)),
]


@pytest.mark.parametrize(("query", "expected", "whole"), CASES)
def test_join_counts_are_the_hand_counts(tables: Tables, engines: Callable[..., Engine],
                                         query: str, expected: int,
                                         whole: tuple[bool | None, bool | None]) -> None:
    _, ev, pp, kinds = tables
    sql = query.format(ev=ev, pp=pp, kinds=kinds)
    ranked, per_query = engines(True), engines(False)
    text = _prepared_sql(ranked, sql)
    for table, reads_whole in zip((ev, pp), whole, strict=True):
        if reads_whole is None:
            assert table not in text
            continue
        copy = re.search(rf'"{table}__ranked_\w+" AS (\w+)', text)
        assert copy is not None, text
        alias = copy.group(1)
        # Whole: its stored ranks <= cap by a plain scan; filtered: light UNION ALL heavy.
        assert (f"{alias}.__chorus_unit_rows <=" in text) is not reads_whole
        assert (f"{alias}.__chorus_rank <=" in text) is reads_whole
    assert "__ranked_" not in _prepared_sql(per_query, sql)
    assert _exact(ranked, sql)[0][0] == expected
    assert _exact(per_query, sql)[0][0] == expected
    # The noisy answer and its report are those of per-query bounding.
    result, other = ranked.execute(sql, "alice", epsilon=2000.0), \
        per_query.execute(sql, "alice", epsilon=2000.0)
    assert abs(result.rows[0][0] - expected) < 5
    assert result.report.elastic == other.report.elastic
    assert result.report.notes == other.report.notes


def test_sums_and_groups_equal_the_per_query_path_when_caps_do_not_bind(
        tables: Tables, engines: Callable[..., Engine]) -> None:
    """v < 3 leaves each unit at most 3 = cap rows: every path keeps all of them, so even the
    sums of values agree exactly."""
    _, ev, pp, _ = tables
    sql = (f"SELECT p.age, COUNT(*), SUM(e.v) FROM {ev} e JOIN {pp} p "
           "ON e.person = p.person WHERE e.v < 3 GROUP BY p.age")
    # Thresholded keys (age has no public values): delta for the gate.
    ranked = sorted(_exact(engines(True), sql, 1e-6), key=str)
    per_query = sorted(_exact(engines(False), sql, 1e-6), key=str)
    assert ranked == per_query
    counts = _events_of(lambda p, v, t: v < 3)
    assert {r[0]: r[1] for r in ranked} == {AGES[p]: c for p, c in counts.items()}


def test_each_unit_keeps_at_most_the_cap_per_side(tables: Tables,
                                                  engines: Callable[..., Engine]) -> None:
    """Grouped by the unit: every person's count is min(c_u, cap) (the people side keeps its
    one row), never more."""
    _, ev, pp, _ = tables
    sql = (f"SELECT e.person, COUNT(*) FROM {ev} e JOIN {pp} p ON e.person = p.person "
           "WHERE e.v >= 1 GROUP BY e.person")
    for engine in (engines(True), engines(False)):
        rows = _exact(engine, sql, 1e-6)
        per_person = {r[0]: r[1] for r in rows if r[1]}
        filtered = _events_of(lambda p, v, t: v >= 1)
        assert per_person == {p: min(c, K) for p, c in filtered.items()}


def test_a_self_join_reads_the_copy_once_per_occurrence(tables: Tables,
                                                        engines: Callable[..., Engine]) -> None:
    """Two occurrences of the table, each bounded to the cap: sum over units of
    min(c_u^a, cap) * min(c_u^b, cap), one side filtered (branches), the other whole."""
    _, ev, _, _ = tables
    sql = f"SELECT COUNT(*) FROM {ev} a JOIN {ev} b ON a.person = b.person WHERE a.v >= 2"
    ranked = engines(True)
    text = _prepared_sql(ranked, sql)
    assert text.count("__ranked_") == 3  # a's light and heavy branches, b's stored ranks
    filtered, every = _events_of(lambda p, v, t: v >= 2), _events_of(lambda p, v, t: True)
    expected = sum(min(c, K) * min(every[p], K) for p, c in filtered.items())
    assert _exact(ranked, sql)[0][0] == expected
    assert _exact(engines(False), sql)[0][0] == expected


def test_a_materialized_side_joins_a_ranked_side(tables: Tables,
                                                 engines: Callable[..., Engine]) -> None:
    _, ev, pp, _ = tables
    sql = (f"SELECT COUNT(*) FROM {ev} e JOIN {pp} p ON e.person = p.person "
           "WHERE e.v >= 2 AND p.age > 15")
    engine = engines(True, bounding="materialized")
    text = _prepared_sql(engine, sql)
    assert f"{pp}__bounded_" in text and f"{ev}__ranked_" in text
    assert _exact(engine, sql)[0][0] == _kept(
        _events_of(lambda p, v, t: v >= 2 and AGES[p] > 15), K)


def test_a_changed_table_is_never_read_through_its_old_copy(
        tables: Tables, engines: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(BoundedSamples, "build_in_background", True)  # as `chorus serve`
    url, ev, pp, _ = tables
    engine = engines(True)
    sql = f"SELECT COUNT(*) FROM {ev} e JOIN {pp} p ON e.person = p.person"
    engine.prepare(sql, "alice", epsilon=1.0)
    engine.samples.wait()
    first = _prepared_sql(engine, sql)
    assert f"{ev}__ranked_" in first
    statement = f"INSERT INTO {ev} VALUES (1000, 7, 1.0, TIMESTAMP '{DAY1}')"
    if url.startswith("duckdb"):
        engine.backend.run_owned([statement])
    else:
        with psycopg.connect(url, autocommit=True) as con:
            con.execute(statement)
            con.execute("SELECT pg_stat_force_next_flush()")  # the version's counters
    expected = _kept(_events_of(lambda p, v, t: True), K) + 1  # person 7's one event
    for _ in range(50):  # the statistics collector may lag a little on Postgres
        text = _prepared_sql(engine, sql)
        if text != first:
            break
        time.sleep(0.1)
    # Until the new copy is built, the events are ranked per query (the people's copy stays).
    assert text != first and f"{ev}__ranked_" not in text
    assert _exact(engine, sql)[0][0] == expected
    engine.samples.wait()
    text = _prepared_sql(engine, sql)
    assert f"{ev}__ranked_" in text and text != first
    assert _exact(engine, sql)[0][0] == expected


def test_sql_noise_reads_the_copies_and_passes_the_verifier(
        tables: Tables, engines: Callable[..., Engine]) -> None:
    """The database's noise (the statement released by the database, rule 5) over a join
    of a filtered and a whole copy."""
    _, ev, pp, _ = tables
    engine = engines(True, noise="sql")
    sql = (f"SELECT COUNT(*) FROM {ev} e JOIN {pp} p ON e.person = p.person "
           "WHERE e.v >= 2")
    result = engine.execute(sql, "alice", epsilon=2000.0)
    assert abs(result.rows[0][0] - _kept(_events_of(lambda p, v, t: v >= 2), K)) < 5
    assert f"{ev}__ranked_" in (result.report.rewritten_sql or f"{ev}__ranked_")


# -- the outgoing verifier: the shapes inside a join, and their near misses ------------------
def _check(engine: Engine, sql: str, tables: frozenset[str]) -> None:
    verify(sql, engine.dialect, engine.statements.outgoing, "noised_by_proxy", tables)


def _no_bound(sql: str) -> str:
    """The heavy branch's rank filter and the stored-rank filter gone: unbounded reads."""
    out = re.sub(r" WHERE b\.__chorus_krank <= \d+", "", sql)
    out = re.sub(r" AND (\w+\.__chorus_rank <= \d+)", r" AND (\1 OR TRUE)", out)
    assert out != sql
    return out


def _heavy_threshold_moved(sql: str) -> str:
    """``> K2`` in the heavy branch, K2 != K of the light one's ``<= K``: a unit in between
    has its rows in both branches."""
    out = re.sub(r"__chorus_unit_rows > (\d+)",
                 lambda m: f"__chorus_unit_rows > {int(m.group(1)) + 2}", sql)
    assert out != sql
    return out


def _light_alone(sql: str) -> str:
    """The light branch without its heavy branch (the UNION ALL's right side dropped)."""
    out = re.sub(r" UNION ALL SELECT \* FROM \(SELECT (\w+)\.\*, ROW_NUMBER\(\).*?\) AS b "
                 r"WHERE b\.__chorus_krank <= \d+\)", ")", sql)
    assert out != sql and "UNION ALL" not in out
    return out


def _whole_read_twice(sql: str) -> str:
    """A whole read of the copy UNION ALL itself: a unit's cap rows twice in one occurrence."""
    found = re.search(r"\((SELECT (\w+)\.\* FROM chorus_private\.\"\w+\" AS \2 WHERE "
                      r"(?:.*? AND )?\2\.__chorus_rank <= \d+)\) AS \2", sql)
    assert found is not None, sql
    read = found.group(1)
    return sql.replace(f"({read})", f"({read} UNION ALL {read})", 1)


def _copy_in_its_own_filter(sql: str) -> str:
    """The copy read again in a filter of one occurrence (bounded, but the same source)."""
    found = re.search(r"(FROM (chorus_private\.\"\w+\") AS (\w+) WHERE )((?:.*? AND )?\3\."
                      r"__chorus_rank <= \d+)", sql)
    assert found is not None, sql
    prefix, copy, alias = found.group(1), found.group(2), found.group(3)
    semi = (f"{alias}.person IN (SELECT z.person FROM {copy} AS z WHERE z.__chorus_rank <= 1) "
            "AND ")
    return sql.replace(prefix, prefix + semi, 1)


NEAR_MISSES = [
    (_no_bound, "contribution bounding"),
    (_heavy_threshold_moved, "not disjoint"),
    (_light_alone, "without its heavy branch"),
    (_whole_read_twice, "not disjoint"),
    (_copy_in_its_own_filter, "not as distinct sources of one join"),
]


@pytest.mark.parametrize(("mutation", "reason"), NEAR_MISSES,
                         ids=[m.__name__ for m, _ in NEAR_MISSES])
def test_near_misses_of_ranked_reads_in_a_join_are_refused(
        tables: Tables, engines: Callable[..., Engine], mutation: Callable[[str], str],
        reason: str) -> None:
    _, ev, pp, _ = tables
    engine = engines(True)
    read = frozenset({ev, pp})
    sql = _prepared_sql(engine, f"SELECT COUNT(*) FROM {ev} e JOIN {pp} p "
                                "ON e.person = p.person WHERE e.v >= 2")
    assert "UNION ALL" in sql and "__chorus_rank <=" in sql
    _check(engine, sql, read)
    with pytest.raises(Refused, match=reason):
        _check(engine, mutation(sql), read)


def test_a_self_join_passes_and_its_occurrences_must_be_distinct_sources(
        tables: Tables, engines: Callable[..., Engine]) -> None:
    _, ev, _, _ = tables
    engine = engines(True)
    read = frozenset({ev})
    sql = _prepared_sql(engine, f"SELECT COUNT(*) FROM {ev} a JOIN {ev} b "
                                "ON a.person = b.person WHERE a.v >= 2")
    _check(engine, sql, read)
    for mutation, reason in NEAR_MISSES[1:4]:
        with pytest.raises(Refused, match=reason):
            _check(engine, mutation(sql), read)
