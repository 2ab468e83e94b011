"""The heavy branch numbered by a running count (``rewriters.contribution.kept_rank``,
``counted_pays``): ``COUNT(*) OVER (PARTITION BY unit ORDER BY __chorus_rank ROWS BETWEEN
UNBOUNDED PRECEDING AND CURRENT ROW)`` in place of ``ROW_NUMBER()``, a shape DuckDB's top-N
window optimizer does not rewrite.

It must change nothing but speed: the very same rows kept (ids and data), each unit min(c_u, k)
of its c_u filtered rows, over the copy and over its twin, on both backends, with values tied
in everything but the stored rank, NULLs and units of up to 60 rows; and the outgoing verifier
accepts the count only as that exact bound.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlglot import parse_one

from analyses.outgoing import Refused, verify
from chorus_py.backends import SCHEMA
from chorus_py.engine import Engine
from rewriters.contribution import counted_pays, ranked_contribution, unit_ordered
from tests.conftest import BACKENDS, ranked_copy_name, table_with_rows
from tests.test_ranked_copy import COLUMNS, ranked_engine

K = 4
#: Units of 1 to 60 rows; v ties across and within units (three values) and is NULL on every
#: fourth row.
SIZES = {1: 1, 2: 2, 3: 3, 4: 4, 5: 7, 6: 12, 7: 25, 8: 60, 9: 5, 10: 33}
FILTERS = [("v >= 1", lambda v: v is not None and v >= 1),
           ("v IS NULL", lambda v: v is None),
           ("v IS NULL OR v = 0", lambda v: v is None or v == 0),
           ("id > 0", lambda v: True)]
CAPS = [1, 2, 3, K, 5, 40]


def _rows() -> list[tuple[int, int, float | None]]:
    out, next_id = [], 1
    for person, n in SIZES.items():
        for i in range(n):
            out.append((next_id, person, None if i % 4 == 3 else float(i % 3)))
            next_id += 1
    return out


@pytest.fixture(params=BACKENDS)
def tied(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(backend URL, table name) of the tied table on each backend."""
    with table_with_rows(request, tmp_path, "counted", COLUMNS, _rows()) as made:
        yield made


@pytest.fixture
def engine(tied: tuple[str, str], policy_engine: Callable[[str], Engine]) -> Engine:
    """An engine over the tied table with its ranked copy (and twin) built."""
    return ranked_engine(policy_engine, tied, K)


def _kept(engine: Engine, copy: str, where: str, k: int, twin: bool, counted: bool
          ) -> list[tuple[object, ...]]:
    """(id, person, v, stored rank, kept rank) of the rows ``ranked_contribution`` keeps."""
    rows = parse_one(f'SELECT c.* FROM {SCHEMA}."{copy}" AS c WHERE {where}')
    kept = ranked_contribution(rows, "c", "person", k, twin, counted).sql(engine.dialect)
    return sorted(engine.backend.run(
        f"SELECT b.id, b.person, b.v, b.__chorus_rank, b.__chorus_krank FROM ({kept}) AS b"
    ).rows)


@pytest.mark.parametrize("k", CAPS)
@pytest.mark.parametrize("where, passing", FILTERS)
def test_the_count_keeps_the_rows_row_number_keeps(
        tied: tuple[str, str], engine: Engine, where: str,
        passing: Callable[[float | None], bool], k: int) -> None:
    """Copy or twin, ROW_NUMBER or the running count: the very same rows and kept ranks, each
    unit min(c_u, k) of its filtered rows (by hand), its first ones in stored-rank order."""
    _, table = tied
    copy = ranked_copy_name(engine, table)
    kept = {(twin, counted): _kept(engine, copy, where, k, twin, counted)
            for twin in (False, True) for counted in (False, True)}
    reference = kept[False, False]
    assert all(rows == reference for rows in kept.values())
    filtered = collections.Counter(p for _, p, v in _rows() if passing(v))
    per_unit = collections.Counter(r[1] for r in reference)
    assert per_unit == {p: min(c, k) for p, c in filtered.items()}
    # The heavy units' kept rows are their first k filtered rows by stored rank.
    ranks = engine.backend.run(
        f'SELECT person, __chorus_rank, id, v FROM {SCHEMA}."{copy}"').rows
    for person in filtered:
        if SIZES[person] <= k:
            continue
        first = sorted((r, i) for p, r, i, v in ranks if p == person and passing(v))[:k]
        assert sorted(i for i, p, *_ in reference if p == person) == sorted(i for _, i in first)


def test_the_rule_picks_the_count_on_duckdb_only_over_the_copy_at_caps_4_to_20() -> None:
    caps = (1, 2, 3, 4, 9, 20, 21, 81, 200)
    assert [k for k in caps if counted_pays("duckdb", k, False)] == [4, 9, 20]
    assert not any(counted_pays("duckdb", k, True) for k in caps)
    assert not any(counted_pays(d, k, t) for d in ("postgres", "spark")
                   for k in caps for t in (False, True))


@pytest.mark.parametrize("where, passing", FILTERS)
def test_a_query_over_the_copy_counts_on_duckdb_and_measures_the_same(
        tied: tuple[str, str], engine: Engine, where: str,
        passing: Callable[[float | None], bool]) -> None:
    """The engine's statement (the copy, not its twin) numbers the heavy rows by the count on
    DuckDB, by ROW_NUMBER on Postgres; its exact measures are sum_u min(c_u, k) rows."""
    _, table = tied
    engine.samples.read_twins = False
    sql = f"SELECT COUNT(*) FROM {table} WHERE {where}"
    _, prepared = engine.prepare(sql, "alice", epsilon=1.0)
    statement = prepared.detail.sql
    assert unit_ordered(ranked_copy_name(engine, table)) not in statement
    counted = "COUNT(*) OVER (PARTITION BY" in statement
    assert counted == (engine.dialect == "duckdb")
    assert ("ROW_NUMBER()" in statement) != counted
    filtered = collections.Counter(p for _, p, v in _rows() if passing(v))
    assert engine.backend.run(statement).rows[0][0] == sum(min(c, K) for c in filtered.values())


FRAME = "ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW"


@pytest.mark.parametrize("wrong, refusal", [
    ("COUNT(*) OVER (PARTITION BY {a}.person ORDER BY {a}.__chorus_rank "
     "RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)", "contribution bounding"),
    ("COUNT(*) OVER (PARTITION BY {a}.person ORDER BY {a}.__chorus_rank "
     "ROWS BETWEEN 2 PRECEDING AND CURRENT ROW)", "contribution bounding"),
    (f"COUNT(*) OVER (PARTITION BY {{a}}.person ORDER BY {{a}}.__chorus_rank {FRAME} "
     "EXCLUDE CURRENT ROW)", "contribution bounding"),
    (f"COUNT({{a}}.v) OVER (PARTITION BY {{a}}.person ORDER BY {{a}}.__chorus_rank {FRAME})",
     "contribution bounding"),
    (f"COUNT(*) OVER (PARTITION BY {{a}}.person, {{a}}.id ORDER BY {{a}}.__chorus_rank "
     f"{FRAME})", "contribution bounding"),
    (f"COUNT(*) OVER (PARTITION BY {{a}}.id ORDER BY {{a}}.__chorus_rank {FRAME})",
     "contribution bounding"),
    (f"COUNT(*) OVER (PARTITION BY {{a}}.person ORDER BY {{a}}.v {FRAME})",
     "contribution bounding"),
    ("COUNT(*) OVER (PARTITION BY {a}.person ORDER BY {a}.__chorus_rank)",
     "contribution bounding"),
])
def test_the_verifier_takes_the_count_only_as_the_exact_bound(
        tied: tuple[str, str], engine: Engine, wrong: str, refusal: str) -> None:
    """The engine's statement with the count passes (on Postgres: its ROW_NUMBER replaced by
    the count, as DuckDB's reads); a count over another frame, partition, order or argument,
    or without its ``<= k`` filter, is refused."""
    _, table = tied
    engine.samples.read_twins = False
    sql = f"SELECT COUNT(*), SUM(v) FROM {table} WHERE v >= 1"
    _, prepared = engine.prepare(sql, "alice", epsilon=1.0)
    statement, alias = prepared.detail.sql, table
    right = (f"COUNT(*) OVER (PARTITION BY {alias}.person ORDER BY {alias}.__chorus_rank "
             f"{FRAME})")
    row_number = f"ROW_NUMBER() OVER (PARTITION BY {alias}.person ORDER BY {alias}.__chorus_rank)"
    if engine.dialect == "postgres":
        assert statement.count(row_number) == 1
        statement = statement.replace(row_number, right)
    assert statement.count(right) == 1

    def check(text: str) -> None:
        verify(text, engine.dialect, engine.statements.outgoing, "noised_by_proxy",
               frozenset({table}))

    check(statement)
    with pytest.raises(Refused, match=refusal):
        check(statement.replace(right, wrong.format(a=alias)))
    uncapped = statement.replace(f"__chorus_krank <= {K}", "__chorus_krank >= 1")
    assert uncapped != statement
    with pytest.raises(Refused, match="contribution bounding"):
        check(uncapped)


def test_a_quantile_reads_the_twin_or_counts_over_the_copy_and_keeps_the_same_rows(
        tied: tuple[str, str], engine: Engine) -> None:
    """A quantile's histogram in one count (DuckDB): its heavy rows from the twin by
    ROW_NUMBER, or, the twins not read, from the copy by the running count (k = 4); on
    Postgres its branches apart, by ROW_NUMBER, the heavy rows from the twin or the copy; the
    same cells either way, sum_u min(c_u, k) rows in all over the non-NULL values (by hand)."""
    _, table = tied
    twin = unit_ordered(ranked_copy_name(engine, table))
    sql = f"SELECT PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY v) FROM {table} WHERE v >= 0"
    cells = {}
    for read in (True, False):
        engine.samples.read_twins = read
        _, prepared = engine.prepare(sql, "alice", epsilon=1.0)
        ((_, statement),) = prepared.detail.histograms
        if engine.dialect == "duckdb":
            assert (twin in statement) == read
            assert ("COUNT(*) OVER (PARTITION BY" in statement) == (not read)
        else:  # Postgres counts its branches apart, by ROW_NUMBER, the heavy one's rows
            # from the twin's indexed tail when twins are read
            assert (twin in statement) == read
            assert "COUNT(*) OVER (PARTITION BY" not in statement
        cells[read] = sorted(engine.backend.run(statement).rows)
    assert cells[True] == cells[False]
    filtered = collections.Counter(p for _, p, v in _rows() if v is not None)
    assert sum(r[-1] for r in cells[True]) == sum(min(c, K) for c in filtered.values())
