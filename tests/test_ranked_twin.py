"""The ranked copy's twin in unit order (``rewriters.contribution.unit_ordered``,
``chorus_py.stores.samples``): the copy's rows sorted by the unit's row count, unit, stored
rank, which the heavy branch of a filtered query over much of the schedule reads
(``kinds.single.twin_pays``).

It must change nothing but speed: for the same copy (the same stored ranks) the twin's heavy
branch keeps the very rows the copy's keeps, each unit min(c_u, k) of its c_u filtered rows,
and the outgoing verifier counts the twin as its copy (a light branch of one copy never pairs
with the heavy branch of another's twin).  Both backends, on the skewed table of
``tests.test_ranked_copy`` (units of 1 to 40 rows).
"""

from __future__ import annotations

import collections
import re
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from sqlglot import parse_one

from analyses.outgoing import Refused, verify
from chorus_py.backends import SCHEMA
from chorus_py.engine import Engine
from chorus_py.kinds.single import twin_pays
from chorus_py.policy import load_policy
from rewriters.contribution import ranked_contribution, unit_ordered
from tests.conftest import BACKENDS, ranked_copy_name, table_with_rows
from tests.test_ranked_copy import COLUMNS, POLICY, K, _exact, _rows, ranked_engine

FILTERS = [("v >= 2", lambda v: v >= 2), ("v < 1 OR v > 6", lambda v: v < 1 or v > 6),
           ("v >= 0", lambda v: v >= 0)]


@pytest.fixture(params=BACKENDS)
def skewed(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(backend URL, table name) of the skewed table on each backend."""
    with table_with_rows(request, tmp_path, "twin", COLUMNS, _rows()) as made:
        yield made


@pytest.fixture
def engine(skewed: tuple[str, str], policy_engine: Callable[[str], Engine]) -> Engine:
    """An engine over the skewed table with its ranked copy and twin built."""
    return ranked_engine(policy_engine, skewed)


def _kept(engine: Engine, copy: str, where: str, twin: bool, light_twin: bool = False,
          presorted: bool = False, streamed: bool = False) -> list[tuple[int, int]]:
    """(id, person) of the rows ``ranked_contribution`` keeps of the copy's filtered rows."""
    rows = parse_one(f'SELECT c.* FROM {SCHEMA}."{copy}" AS c WHERE {where}')
    kept = ranked_contribution(rows, "c", "person", K, twin, light_twin=light_twin,
                               presorted=presorted, streamed=streamed).sql(engine.dialect)
    return sorted(engine.backend.run(f"SELECT b.id, b.person FROM ({kept}) AS b").rows)


def test_the_twin_holds_the_copys_rows_in_unit_order(skewed: tuple[str, str],
                                                     engine: Engine) -> None:
    _, table = skewed
    copy = ranked_copy_name(engine, table)
    assert unit_ordered(copy) in engine.backend.owned_tables()
    columns = "id, person, v, __chorus_rank, __chorus_unit_rows"

    def read(name: str, order: str) -> list[tuple[object, ...]]:
        return engine.backend.run(f'SELECT {columns} FROM {SCHEMA}."{name}" {order}').rows

    assert read(unit_ordered(copy), "ORDER BY id") == read(copy, "ORDER BY id")
    assert len(read(copy, "")) == len(_rows())
    if engine.dialect == "duckdb":  # stored (and scanned) by unit rows, unit, stored rank
        stored = [(r[4], r[1], r[3]) for r in read(unit_ordered(copy), "")]
        assert stored == sorted(stored)
    else:  # indexed in its own order: a heavy branch over few units reads few, presorted;
        # the index covers every other column (samples.covering_index): no heap page read
        (definition,) = engine.backend.run(
            "SELECT indexdef FROM pg_indexes WHERE schemaname = 'chorus_private' "
            f"AND tablename = '{unit_ordered(copy)}'").rows[0]
        others = [c for (c,) in engine.backend.run(
            "SELECT column_name::text FROM information_schema.columns WHERE table_schema = "
            f"'chorus_private' AND table_name = '{unit_ordered(copy)}' ORDER BY "
            "ordinal_position").rows if c not in ("__chorus_unit_rows", "person",
                                                  "__chorus_rank")]
        assert "id" in others and "v" in others
        assert definition.endswith(f"(__chorus_unit_rows, person, __chorus_rank) INCLUDE "
                                   f"({', '.join(others)})")


@pytest.mark.parametrize("where, passing", FILTERS)
def test_the_twin_keeps_the_rows_the_copy_keeps(
        skewed: tuple[str, str], engine: Engine, where: str,
        passing: Callable[[float], bool]) -> None:
    """The same stored ranks: the same kept rows, min(c_u, k) of each unit's c_u filtered
    rows (by hand from the table's rows), with the twin as without."""
    _, table = skewed
    copy = ranked_copy_name(engine, table)
    from_copy, from_twin = (_kept(engine, copy, where, twin) for twin in (False, True))
    assert from_twin == from_copy
    # Both branches from the twin (kinds.single.light_twin_pays): the same rows again; and
    # with the heavy window partitioned by (unit rows, unit) (presorted_pays): the same.
    assert _kept(engine, copy, where, True, light_twin=True) == from_copy
    assert _kept(engine, copy, where, True, presorted=True) == from_copy
    if engine.dialect == "duckdb":  # its copies store positions: the streamed heavy branch
        assert _kept(engine, copy, where, True, streamed=True) == from_copy
    filtered = collections.Counter(p for _, p, v in _rows() if passing(v))
    kept = collections.Counter(p for _, p in from_twin)
    assert kept == {p: min(c, K) for p, c in filtered.items()}
    assert max(kept.values()) <= K


@pytest.mark.parametrize("where, passing", FILTERS)
def test_a_query_reads_the_twin_and_measures_what_the_copy_does(
        skewed: tuple[str, str], engine: Engine, where: str,
        passing: Callable[[float], bool]) -> None:
    _, table = skewed
    twin = unit_ordered(ranked_copy_name(engine, table))
    sql = f"SELECT COUNT(*), SUM(v) FROM {table} WHERE {where}"
    _, prepared = engine.prepare(sql, "alice", epsilon=1.0)
    assert twin in prepared.detail.sql and "__chorus_unit_rows <= " in prepared.detail.sql
    with_twin = _exact(engine, sql)
    engine.samples.read_twins = False  # the copy's own heavy branch, as before the twin
    _, prepared = engine.prepare(sql, "alice", epsilon=1.0)
    assert "__ranked_" in prepared.detail.sql and twin not in prepared.detail.sql
    assert _exact(engine, sql) == with_twin
    filtered = collections.Counter(p for _, p, v in _rows() if passing(v))
    assert with_twin[0][0] == sum(min(c, K) for c in filtered.values())  # sum_u min(c_u, k)


def _branches(engine: Engine, table: str) -> tuple[str, str, str, str]:
    """(copy, twin, light, heavy): the engine's statement for a whole-schedule filtered query
    cut at its UNION ALL (the light branch, or its aggregate, first)."""
    copy = ranked_copy_name(engine, table)
    _, prepared = engine.prepare(f"SELECT COUNT(*), SUM(v) FROM {table} WHERE v >= 2", "alice",
                                 epsilon=1.0)
    light, heavy = prepared.detail.sql.rsplit(" UNION ALL ", 1)
    return copy, unit_ordered(copy), light, heavy


def _other(twin: str) -> str:
    """The twin of another copy of the table (another digest of 16 hex digits, as every copy's:
    other names are no relation of a copy at all)."""
    digest = re.search(r"__ranked_([0-9a-f]{16})", twin).group(1)  # type: ignore[union-attr]
    other = "0123456789abcdef" if digest != "0123456789abcdef" else "fedcba9876543210"
    return twin.replace(digest, other)


def _check(engine: Engine, table: str, text: str) -> None:
    verify(text, engine.dialect, engine.statements.outgoing, "noised_by_proxy",
           frozenset({table}))


def test_the_verifier_pairs_a_twin_only_with_its_own_copy(skewed: tuple[str, str],
                                                         engine: Engine) -> None:
    """The engine's statement passes; its heavy branch read from another copy's twin (a
    light unit of one copy could be a heavy one of the other: 2k rows), or with its row cap
    dropped, is refused."""
    _, table = skewed
    _, twin, light, heavy = _branches(engine, table)
    assert heavy.count(twin) == 1
    # A query over the whole schedule reads its light rows from the twin too (both backends,
    # ``kinds.single.light_twin_pays``).
    assert twin in light
    _check(engine, table, f"{light} UNION ALL {heavy}")
    with pytest.raises(Refused, match="ranked copy"):
        _check(engine, table, f"{light} UNION ALL {heavy.replace(twin, _other(twin))}")
    uncapped = heavy.replace(f"__chorus_krank <= {K}", "__chorus_krank >= 1")
    if engine.dialect == "duckdb":  # streamed: the rows it flags (rewriters.contribution)
        uncapped = heavy.replace("WHERE b.__chorus_krank", "WHERE NOT b.__chorus_krank")
    assert uncapped != heavy
    with pytest.raises(Refused, match="contribution bounding"):
        _check(engine, table, f"{light} UNION ALL {uncapped}")


def test_the_light_branch_reads_the_copy_or_its_twin_but_no_other(
        skewed: tuple[str, str], engine: Engine) -> None:
    """The light branch from the copy or from its twin passes the verifier (the twin is the
    copy); from another copy's twin it is refused (its units are not this copy's)."""
    _, table = skewed
    copy, twin, light, heavy = _branches(engine, table)
    from_copy = re.sub(rf'"{copy}(_u)?"', f'"{copy}"', light)
    from_twin = re.sub(rf'"{copy}(_u)?"', f'"{twin}"', light)
    assert from_copy != from_twin
    for branch in (from_copy, from_twin):
        _check(engine, table, f"{branch} UNION ALL {heavy}")
    with pytest.raises(Refused, match="ranked copy"):
        _check(engine, table, f"{re.sub(rf'{copy}(_u)?', _other(twin), light)} UNION ALL "
                              f"{heavy}")


def test_the_heavy_window_partitioned_by_the_copys_unit_rows_passes_and_nothing_else(
        skewed: tuple[str, str], engine: Engine) -> None:
    """Postgres's heavy branch numbers its rows partitioned by (the copy's own
    ``__chorus_unit_rows``, the unit), the order of the twin's index: one count per unit, so
    the same partitions as by the unit, and the verifier passes it (on both backends).  A
    partition by another column and the unit, by a count of another relation, by three
    columns or in the other order is refused, and so is the same partition over the table
    itself (no stored count there)."""
    _, table = skewed
    copy, twin, _, heavy = _branches(engine, table)
    # What the engine sends: presorted on Postgres only (DuckDB's window gains nothing).
    sent = f"PARTITION BY {table}.__chorus_unit_rows, {table}.person ORDER BY"
    assert (sent in heavy) == (engine.dialect == "postgres")
    # DuckDB's heavy branch keeps each unit's first rows in the twin's order, no window
    # partitioned by the unit (streamed_pays: tests/test_streamed_rank.py).
    assert (f"PARTITION BY {table}.person ORDER BY" in heavy) is False
    assert ("LAG(" in heavy) == (engine.dialect == "duckdb")
    rows = parse_one(f'SELECT c.* FROM {SCHEMA}."{copy}" AS c WHERE c.v >= 2')
    kept = ranked_contribution(rows, "c", "person", K, True, presorted=True).sql(
        engine.dialect)
    presorted = "PARTITION BY c.__chorus_unit_rows, c.person ORDER BY c.__chorus_rank"
    assert presorted in kept

    def check(text: str) -> None:
        _check(engine, table, f"SELECT COUNT(*) AS n FROM ({text}) AS b")

    check(kept)
    for other in ("PARTITION BY c.v, c.person ORDER BY c.__chorus_rank",
                  "PARTITION BY x.__chorus_unit_rows, c.person ORDER BY c.__chorus_rank",
                  "PARTITION BY c.__chorus_unit_rows, c.person, c.id ORDER BY c.__chorus_rank",
                  "PARTITION BY c.person, c.__chorus_unit_rows ORDER BY c.__chorus_rank"):
        with pytest.raises(Refused, match="contribution bounding"):
            check(kept.replace(presorted, other))
    base = kept.replace(f'{SCHEMA}."{twin}"', table).replace(f'{SCHEMA}."{copy}"', table)
    assert twin not in base and copy not in base
    with pytest.raises(Refused):
        check(base)


def test_a_copy_without_its_twin_gets_one_and_one_shot_engines_read_it(
        skewed: tuple[str, str], engine: Engine, tmp_path: Path) -> None:
    """A copy an older proxy built (no twin) gets its twin when a server starts; a one-shot
    engine, which never builds, reads the twin it finds (and the copy alone without one)."""
    url, table = skewed
    copy = ranked_copy_name(engine, table)
    engine.backend.run_owned([f'DROP TABLE {SCHEMA}."{unit_ordered(copy)}"'])
    path = tmp_path / "twin.toml"
    path.write_text(POLICY.format(url=url, table=table, k=K, ranked="true"))
    sql = f"SELECT COUNT(*) FROM {table} WHERE v >= 2"
    with Engine(load_policy(path), build_ranked_copies=False) as once:
        _, prepared = once.prepare(sql, "alice", epsilon=1.0)
        assert copy in prepared.detail.sql and unit_ordered(copy) not in prepared.detail.sql
    with Engine(load_policy(path)) as server:
        server.warm_up(wait=True)
    assert unit_ordered(copy) in engine.backend.owned_tables()
    with Engine(load_policy(path), build_ranked_copies=False) as once:
        _, prepared = once.prepare(sql, "alice", epsilon=1.0)
        assert unit_ordered(copy) in prepared.detail.sql


@pytest.fixture(params=[pytest.param("postgres", marks=pytest.mark.postgres)])
def long_named(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A Postgres table of a 37-byte name: its copy's name has 62 bytes, its twin's would
    have 64 (Postgres truncates names to 63 bytes: the twin would overwrite the copy)."""
    with table_with_rows(request, tmp_path, "t" * 28, COLUMNS, _rows()) as made:
        yield made


def test_no_twin_when_postgres_would_truncate_its_name(
        long_named: tuple[str, str], policy_engine: Callable[[str], Engine]) -> None:
    _, table = long_named
    engine = ranked_engine(policy_engine, long_named)
    copy = ranked_copy_name(engine, table)
    assert len(copy) == 62 and len(unit_ordered(copy)) == 64
    assert unit_ordered(copy)[:63] not in engine.backend.owned_tables()
    sql = f"SELECT COUNT(*) FROM {table} WHERE v >= 2"
    _, prepared = engine.prepare(sql, "alice", epsilon=1.0)
    assert copy in prepared.detail.sql and "_u\"" not in prepared.detail.sql
    filtered = collections.Counter(p for _, p, v in _rows() if v >= 2)
    assert _exact(engine, sql)[0][0] == sum(min(c, K) for c in filtered.values())


@pytest.mark.parametrize("read, blocks, cap, limit, duckdb, postgres", [
    (90, 90, 200, 200, True, True),    # the whole schedule, even at the limit
    (45, 90, 200, 200, True, True),    # half of it
    (44, 90, 2, 200, True, False),     # under half, over a quarter, cap <= limit / 8
    (44, 90, 25, 200, True, False),    # cap = limit / 8 exactly
    (44, 90, 26, 200, False, False),   # cap above limit / 8
    (23, 90, 2, 200, True, False),     # a quarter and more (4 * 23 >= 90)
    (22, 90, 2, 200, False, False),    # under a quarter: the copy's skipped blocks win
    (1, 1, 1, 1, True, True),          # no block column: the whole table
    (0, 0, 1, 1, False, False),        # no block at all
])
def test_the_twin_is_read_when_the_query_reads_much_of_the_schedule(
        read: int, blocks: int, cap: int, limit: int, duckdb: bool, postgres: bool) -> None:
    assert twin_pays(read, blocks, cap, limit, "duckdb") is duckdb
    assert twin_pays(read, blocks, cap, limit, "postgres") is postgres


@pytest.mark.parametrize("read, blocks, cap, reads", [
    (90, 90, 200, True), (6, 90, 200, True),  # a sixteenth of the schedule and more, any cap
    (6, 90, 2, True), (5, 90, 2, False),       # under it: the copy's skipped blocks win
    (1, 1, 1, True), (0, 0, 1, False),         # no block column; no block at all
])
def test_a_streamed_heavy_branch_reads_the_twin_from_a_sixteenth_of_the_schedule(
        read: int, blocks: int, cap: int, reads: bool) -> None:
    """DuckDB's streamed heavy branch (one pass over the twin's heavy rows, whatever the share)
    beats the window over the copy from about a sixteenth of the blocks on."""
    assert twin_pays(read, blocks, cap, 200, "duckdb", streamed=True) is reads


@pytest.fixture(params=[pytest.param("postgres", marks=pytest.mark.postgres)])
def pg_skewed(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """The skewed table on Postgres alone."""
    with table_with_rows(request, tmp_path, "twin", COLUMNS, _rows()) as made:
        yield made


def _twin_scans(engine: Engine, sql: str, twin: str) -> list[dict[str, object]]:
    """The plan nodes reading ``twin`` when Postgres runs the engine's statement for ``sql``
    with index paths preferred (the test table is small enough for a sequential scan)."""
    _, prepared = engine.prepare(sql, "alice", epsilon=1.0)
    with psycopg.connect(engine.policy.backend.url) as con:
        con.execute("SET LOCAL enable_seqscan = off")
        con.execute("SET LOCAL enable_bitmapscan = off")
        (plan,), = con.execute(
            f"EXPLAIN (ANALYZE, FORMAT JSON) {prepared.detail.sql}").fetchall()

    def nodes(node: dict[str, object]) -> Iterator[dict[str, object]]:
        yield node
        for child in node.get("Plans", []):  # type: ignore[attr-defined]
            yield from nodes(child)

    return [n for n in nodes(plan[0]["Plan"]) if n.get("Relation Name") == twin]


def test_the_postgres_twin_is_read_by_an_index_only_scan_with_no_heap_page(
        pg_skewed: tuple[str, str], policy_engine: Callable[[str], Engine]) -> None:
    """Both branches of a whole-schedule filtered query read the twin through its covering
    index, and the twin was vacuumed once built (``Backend.settle_owned``): no heap page."""
    _, table = pg_skewed
    engine = ranked_engine(policy_engine, pg_skewed)
    twin = unit_ordered(ranked_copy_name(engine, table))
    scans = _twin_scans(engine, f"SELECT COUNT(*), SUM(v) FROM {table} WHERE v >= 2", twin)
    assert len(scans) == 2  # the light and the heavy branch
    assert {n["Node Type"] for n in scans} == {"Index Only Scan"}
    assert [n["Heap Fetches"] for n in scans] == [0, 0]


@pytest.fixture(params=[pytest.param("postgres", marks=pytest.mark.postgres)])
def wide_row(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A Postgres table one of whose rows holds a text too long for a B-tree entry (8,000
    random hex digits, which compression cannot bring under Postgres's ~2.7 kB)."""
    rows = [(i, p, v, secrets.token_hex(4000) if i == 1 else "short") for i, p, v in _rows()]
    with table_with_rows(request, tmp_path, "wide", f"{COLUMNS}, note TEXT", rows) as made:
        yield made


def test_a_twin_too_wide_to_cover_keeps_the_index_on_its_order(
        wide_row: tuple[str, str], policy_engine: Callable[[str], Engine]) -> None:
    """Its copy and twin are built all the same, the twin indexed on its order alone, and a
    filtered query keeps min(c_u, k) rows of each unit as ever."""
    _, table = wide_row
    engine = ranked_engine(policy_engine, wide_row)
    twin = unit_ordered(ranked_copy_name(engine, table))
    indexes = [d for (d,) in engine.backend.run(
        f"SELECT indexdef FROM pg_indexes WHERE tablename = '{twin}'").rows]
    assert len(indexes) == 1
    assert f"{twin}_order" in indexes[0] and "INCLUDE" not in indexes[0]
    assert indexes[0].endswith("(__chorus_unit_rows, person, __chorus_rank)")
    sql = f"SELECT COUNT(*) FROM {table} WHERE v >= 2"
    _, prepared = engine.prepare(sql, "alice", epsilon=1.0)
    assert twin in prepared.detail.sql
    filtered = collections.Counter(p for _, p, v in _rows() if v >= 2)
    assert _exact(engine, sql)[0][0] == sum(min(c, K) for c in filtered.values())
