"""Per-query bounding over a ranked copy (``chorus_py.stores.samples``, ``ranked_copy``).

The copy must change nothing but speed: each unit keeps min(c_u, k) of its c_u filtered rows,
chosen uniformly among them, like ranking the filtered rows per query.  Tested on small,
skewed data (units of 1 to 40 rows) on both backends, with the copy's life cycle (built in the
background, rebuilt when the table changes, queries never reading a stale copy) and the
fallback when it cannot be built.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import psycopg
import pytest
from sqlglot import parse_one

from chorus_py.engine import Engine
from chorus_py.policy import load_policy
from chorus_py.stores.samples import BoundedSamples
from rewriters.contribution import ranked_contribution, ranked_table
from tests.conftest import BACKENDS, table_with_rows

#: Rows per unit: one light unit of each size up to the cap and heavier ones.
SIZES = {1: 1, 2: 2, 3: 3, 4: 5, 5: 8, 6: 40}
K = 3

POLICY = """
[backend]
url = "{url}"

[privacy]
epsilon_per_block = 1000.0
max_epsilon_per_query = 500.0
noise = "proxy"

[tables.{table}]
privacy_unit = "person"
max_rows_per_unit = {k}
contribution = "fixed"
ranked_copy = {ranked}

[tables.{table}.columns]
id = {{ type = "int" }}
person = {{ type = "int" }}
v = {{ type = "float", lower = 0, upper = 100 }}

[analysts.alice]
"""


def _rows() -> list[tuple[int, int, float]]:
    """(id, person, v): v = the row's index within its unit, so filters cut units unevenly."""
    out, next_id = [], 1
    for person, n in SIZES.items():
        for i in range(n):
            out.append((next_id, person, float(i)))
            next_id += 1
    return out


#: The columns of the skewed tables here and in tests/test_ranked_twin.py and
#: tests/test_ranked_counted.py.
COLUMNS = "id BIGINT, person BIGINT, v DOUBLE PRECISION"


def ranked_engine(policy_engine: Callable[[str], Engine], made: tuple[str, str], k: int = K
                  ) -> Engine:
    """An engine on :data:`POLICY` over the table ``made`` (backend URL, name) with the cap
    ``k``, its ranked copy (and twin) built."""
    url, table = made
    engine = policy_engine(POLICY.format(url=url, table=table, k=k, ranked="true"))
    engine.warm_up(wait=True)
    return engine


@pytest.fixture(params=BACKENDS)
def skewed(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(backend URL, table name) of the skewed table on each backend."""
    with table_with_rows(request, tmp_path, "skew", COLUMNS, _rows()) as made:
        yield made


@pytest.fixture
def engines(skewed: tuple[str, str], policy_engine: Callable[[str], Engine]
            ) -> Callable[[bool], Engine]:
    def make(ranked: bool) -> Engine:
        url, table = skewed
        return policy_engine(POLICY.format(url=url, table=table, k=K,
                                           ranked="true" if ranked else "false"))

    return make


def _exact(engine: Engine, sql: str) -> list[tuple[object, ...]]:
    """The exact measurements the proxy would noise (noise = "proxy"): never released."""
    _, prepared = engine.prepare(sql, "alice", epsilon=1.0)
    return engine.backend.run(prepared.detail.sql).rows


def _change(engine: Engine, url: str, statement: str) -> None:
    """Run ``statement`` on the skewed table as its owner would (not through the proxy)."""
    if url.startswith("duckdb"):
        engine.backend.run_owned([statement])
        return
    with psycopg.connect(url, autocommit=True) as con:
        con.execute(statement)
        # pg_stat_user_tables (the version) is updated asynchronously
        con.execute("SELECT pg_stat_force_next_flush()")


@pytest.mark.parametrize("where, passing", [
    ("", lambda v: True),
    ("WHERE v >= 2", lambda v: v >= 2),
    ("WHERE v < 1 OR v > 6", lambda v: v < 1 or v > 6),
])
def test_each_unit_keeps_min_of_its_filtered_rows_and_k(
        skewed: tuple[str, str], engines: Callable[[bool], Engine], where: str,
        passing: Callable[[float], bool]) -> None:
    _, table = skewed
    filtered = collections.Counter(p for _, p, v in _rows() if passing(v))
    expected = sum(min(c, K) for c in filtered.values())  # hand count: sum_u min(c_u, k)
    ranked, per_query = engines(True), engines(False)
    ranked.warm_up(wait=True)
    sql = f"SELECT COUNT(*) FROM {table} {where}"
    _, prepared = ranked.prepare(sql, "alice", epsilon=1.0)
    # Filtered: light UNION ALL heavy; unfiltered: the stored ranks <= k, by a plain scan.
    shape = "__chorus_unit_rows" if where else "__chorus_rank <= "
    assert "__ranked_" in prepared.detail.sql and shape in prepared.detail.sql
    assert ("UNION ALL" in prepared.detail.sql) == bool(where)
    _, prepared = per_query.prepare(sql, "alice", epsilon=1.0)
    assert "__ranked_" not in prepared.detail.sql
    assert _exact(ranked, sql)[0][0] == expected
    assert _exact(per_query, sql)[0][0] == expected
    # The noisy answer and its report are those of per-query bounding.
    result = ranked.execute(sql, "alice", epsilon=50.0)
    assert result.report.stability == K
    assert abs(result.rows[0][0] - expected) < 5


def test_kept_rows_are_uniform_among_the_filtered_rows() -> None:
    """A unit of 6 rows, 4 of them passing the filter, k = 2: over fresh copies each passing
    row is kept with probability 2/4, and no other row ever is."""
    con = duckdb.connect()
    con.execute("CREATE TABLE t (id BIGINT, person BIGINT, v DOUBLE)")
    con.execute("INSERT INTO t SELECT i, 1, i FROM range(6) AS r(i)")
    con.execute("INSERT INTO t SELECT 10 + i, 2, i FROM range(2) AS r(i)")  # a light unit
    rows = parse_one("SELECT c.* FROM copy AS c WHERE c.v < 4")
    kept = ranked_contribution(rows, "c", "person", 2).sql("duckdb")
    counts: collections.Counter[int] = collections.Counter()
    runs = 600
    for _ in range(runs):
        con.execute("CREATE OR REPLACE TEMP TABLE copy AS "
                    + ranked_table("t", "person").sql("duckdb"))
        ids = [r[0] for r in con.execute(f"SELECT id FROM ({kept})").fetchall()]
        assert len(ids) == 4 and {10, 11} <= set(ids)  # 2 of unit 1, the light unit whole
        counts.update(ids)
    for i in range(4):  # Binomial(600, 1/2): sd 12.2; 5 sd either side
        assert abs(counts[i] - runs / 2) < 62, counts
    assert counts[4] == counts[5] == 0


def test_a_changed_table_is_never_read_through_its_old_copy(
        skewed: tuple[str, str], engines: Callable[[bool], Engine],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(BoundedSamples, "build_in_background", True)  # as `chorus serve`
    url, table = skewed
    engine = engines(True)
    sql = f"SELECT COUNT(*) FROM {table}"
    _, prepared = engine.prepare(sql, "alice", epsilon=1.0)
    engine.samples.wait()
    _, prepared = engine.prepare(sql, "alice", epsilon=1.0)
    first = prepared.detail.sql
    assert "__ranked_" in first
    _change(engine, url, f"INSERT INTO {table} VALUES (1000, 7, 1.0)")
    expected = sum(min(c, K) for c in SIZES.values()) + 1
    for _ in range(50):  # the statistics collector may lag a little on Postgres
        _, prepared = engine.prepare(sql, "alice", epsilon=1.0)
        if prepared.detail.sql != first:
            break
        time.sleep(0.1)
    # Until the new copy is built, the query ranks its rows itself (no copy at all).
    assert prepared.detail.sql != first
    assert _exact(engine, sql)[0][0] == expected
    engine.samples.wait()
    _, prepared = engine.prepare(sql, "alice", epsilon=1.0)
    assert "__ranked_" in prepared.detail.sql and prepared.detail.sql != first
    assert _exact(engine, sql)[0][0] == expected


def test_without_a_copy_queries_rank_their_rows_and_the_owner_is_told(
        engines: Callable[[bool], Engine], skewed: tuple[str, str],
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    _, table = skewed
    engine = engines(True)
    real = engine.backend.run_owned

    def refuse(statements: list[str]) -> None:
        if any("__ranked_" in s and s.startswith("CREATE TABLE") for s in statements):
            raise PermissionError("permission denied for schema chorus_private")
        real(statements)

    monkeypatch.setattr(engine.backend, "run_owned", refuse)
    with caplog.at_level(logging.WARNING, logger="chorus.materialize"):
        engine.warm_up(wait=True)
    assert any("no ranked copy" in r.getMessage() and "ranked_copy = false" in r.getMessage()
               for r in caplog.records)
    sql = f"SELECT COUNT(*) FROM {table} WHERE v >= 2"
    _, prepared = engine.prepare(sql, "alice", epsilon=1.0)
    assert "__ranked_" not in prepared.detail.sql
    filtered = collections.Counter(p for _, p, v in _rows() if v >= 2)
    assert _exact(engine, sql)[0][0] == sum(min(c, K) for c in filtered.values())



def test_a_one_shot_engine_reads_a_built_copy_and_never_builds_one(
        skewed: tuple[str, str], tmp_path: Path) -> None:
    url, table = skewed
    path = tmp_path / "one-shot.toml"
    path.write_text(POLICY.format(url=url, table=table, k=K, ranked="true"))
    sql = f"SELECT COUNT(*) FROM {table}"
    with Engine(load_policy(path), build_ranked_copies=False) as once:
        once.warm_up(wait=True)
        _, prepared = once.prepare(sql, "alice", epsilon=1.0)
        assert "__ranked_" not in prepared.detail.sql  # none built, none started
    with Engine(load_policy(path)) as server:
        server.warm_up(wait=True)
    with Engine(load_policy(path), build_ranked_copies=False) as once:
        _, prepared = once.prepare(sql, "alice", epsilon=1.0)
        assert "__ranked_" in prepared.detail.sql  # the server's copy


def test_an_update_of_a_value_column_is_a_new_version(
        skewed: tuple[str, str], engines: Callable[[bool], Engine]) -> None:
    """The copy carries the values: changing only a value (not a unit) must rebuild it."""
    url, table = skewed
    engine = engines(True)
    sql = f"SELECT COUNT(*) FROM {table} WHERE v >= 1000"
    assert _exact(engine, sql)[0][0] == 0
    _change(engine, url, f"UPDATE {table} SET v = 5000 WHERE person = 1")
    for _ in range(50):  # the statistics collector may lag a little on Postgres
        if _exact(engine, sql)[0][0] == 1:
            break
        time.sleep(0.1)
    assert _exact(engine, sql)[0][0] == 1


def test_a_table_created_again_with_as_many_rows_is_a_new_version(
        skewed: tuple[str, str], engines: Callable[[bool], Engine]) -> None:
    """Dropped and created again with the same row count (Postgres's change counters of the
    new relation then equal the old ones): the old relation's copy must not be read."""
    url, table = skewed
    engine = engines(True)
    sql = f"SELECT COUNT(*) FROM {table} WHERE v >= 1000"
    assert _exact(engine, sql)[0][0] == 0
    rows = ", ".join(f"({i}, {p}, {v + 5000})" for i, p, v in _rows())
    double = "DOUBLE" if url.startswith("duckdb") else "DOUBLE PRECISION"
    _change(engine, url, f"DROP TABLE {table}")
    _change(engine, url, f"CREATE TABLE {table} (id BIGINT, person BIGINT, v {double})")
    _change(engine, url, f"INSERT INTO {table} VALUES {rows}")
    expected = sum(min(c, K) for c in SIZES.values())
    for _ in range(50):  # the statistics collector may lag a little on Postgres
        if _exact(engine, sql)[0][0] == expected:
            break
        time.sleep(0.1)
    assert _exact(engine, sql)[0][0] == expected


def test_stored_ranks_keep_the_rows_the_branches_keep(
        skewed: tuple[str, str], engines: Callable[[bool], Engine]) -> None:
    """Unfiltered, the copy is read by its stored ranks <= k; a filter every row passes reads
    it as light UNION ALL heavy: the very same rows, so the same exact sum."""
    _, table = skewed
    engine = engines(True)
    engine.warm_up(wait=True)
    whole, branches = (f"SELECT SUM(v) FROM {table}",
                       f"SELECT SUM(v) FROM {table} WHERE v >= 0 OR v < 0")
    _, prepared = engine.prepare(whole, "alice", epsilon=1.0)
    assert "UNION ALL" not in prepared.detail.sql
    _, prepared = engine.prepare(branches, "alice", epsilon=1.0)
    assert "UNION ALL" in prepared.detail.sql
    assert _exact(engine, whole) == _exact(engine, branches)
