"""The ranked copy's grouped twin (``rewriters.grouped_copy``): thresholded keys with g groups
per unit over the whole copy read their light and middle units by a plain scan of stored
group ranks, and count each group's units by stored marks.

It must change nothing but speed: the kept rows are exactly the three parts' (light and middle
units: the middle part's groups scored by the stored ranks, which the twin stores), checked
against hand counts computed from the copy's stored ranks on a skewed table with NULL keys,
both backends; with heavy units, each unit keeps at most g groups and k rows.  The outgoing
verifier accepts the twin only with its stored group rank bounded by g and the GROUP BY on its
stored key columns, paired with the heavy part of the same copy.
"""

from __future__ import annotations

import collections
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlglot import exp, parse_one

from analyses.outgoing import Refused, verify
from analyses.query import AggregateQuery
from chorus_py.backends import SCHEMA
from chorus_py.engine import Engine
from chorus_py.kinds.selection import Choices, histogram
from chorus_py.stores.samples import MAX_GROUPED_TWINS
from mechanisms.caps import cap_bins
from rewriters.contribution import stored_rank_contribution
from rewriters.grouped_copy import first_kept_of_group, grouped_name, grouped_table
from rewriters.pipeline import pipeline
from tests.test_ranked_groups import SIZES, groups_engine

G, K = 2, 4
LIMIT = 50  # the policy's max_rows_per_unit: above every unit's rows (no heavy unit)
GROUPS = 5


def _rows() -> list[tuple[int, int, int | None, float]]:
    """(id, person, grp, v): the i-th row of a unit is in group i % GROUPS, NULL for 4."""
    out, next_id = [], 1
    for person, n in SIZES.items():
        for i in range(n):
            out.append((next_id, person, None if i % GROUPS == 4 else i % GROUPS, float(i)))
            next_id += 1
    return out


@pytest.fixture(params=["duckdb", pytest.param("postgres", marks=pytest.mark.postgres)])
def made(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Engine, str]]:
    """An engine over the skewed table (ranked copy built), and the table's name."""
    with groups_engine(request, tmp_path, "gtwin", _rows()) as engine:
        yield engine


def _copy(engine: Engine, table: str) -> str:
    copy = engine.single.services.samples.ranked(table, engine.policy.tables[table])
    assert copy is not None
    return copy


def _measure(engine: Engine, table: str, sql: str, g: int, k: int, twin: bool) -> str:
    """The exact measurements at g groups and k rows per unit over the whole copy, through
    the grouped twin or the three parts; verified as the proxy would."""
    query = engine._analyse(sql)
    assert isinstance(query, AggregateQuery)
    query = query.with_cap(k).with_groups(g)
    plan = engine.single._noise_plan(query, 1.0, 1e-6)
    copy = _copy(engine, table)
    grouped = None
    if twin:
        name = engine.single._grouped_twin(query, (SCHEMA, copy))
        assert name == (SCHEMA, grouped_name(copy, [k.expr.name for k in query.keys]))
        grouped = name
    text = pipeline(query, plan, None, engine.dialect, ranked=(SCHEMA, copy), whole=True,
                    grouped=grouped).measure_sql()
    assert ("_g" in text.split("__ranked_")[1][:20]) == twin
    engine.single.services.statements.verify_outgoing(text, "noised_by_proxy", [table],
                                                      groups=g, cap=k)
    return text


def _run(engine: Engine, text: str) -> list[tuple[object, ...]]:
    return sorted(engine.backend.run(text).rows, key=lambda r: tuple(map(str, r)))


def _kept_by_hand(engine: Engine, table: str, g: int) -> list[tuple[int, int | None, float]]:
    """(person, grp, v) of the rows the light and middle parts keep, from the copy's stored
    ranks: each unit's groups scored by their smallest stored rank, the g best (score, key)
    kept whole (``rewriters.contribution.ranked_group_parts``)."""
    stored = engine.backend.run(f'SELECT person, grp, v, __chorus_rank FROM {SCHEMA}.'
                                f'"{_copy(engine, table)}"').rows
    score: dict[tuple[int, int | None], int] = {}
    for person, grp, _, rank in stored:
        score[(person, grp)] = min(rank, score.get((person, grp), rank))
    kept_groups = set()
    for person in SIZES:
        # NULL sorts last in ascending order on both backends (ties never happen: the
        # scores of one unit's groups are distinct ranks).
        mine = sorted((s, grp is None, grp or 0, grp) for (p, grp), s in score.items()
                      if p == person)
        kept_groups |= {(person, entry[3]) for entry in mine[:g]}
    return [(p, grp, v) for p, grp, v, _ in stored if (p, grp) in kept_groups]


def test_the_twin_keeps_the_middle_parts_rows(made: tuple[Engine, str]) -> None:
    """No heavy unit (k = the limit): the twin's answer and the three parts' are the same,
    group by group, and both are the hand counts (NULL keys a group of their own)."""
    engine, table = made
    sql = f"SELECT grp, COUNT(*), COUNT(DISTINCT person), SUM(v) FROM {table} GROUP BY grp"
    kept = _kept_by_hand(engine, table, G)
    counts = collections.Counter(grp for _, grp, _ in kept)
    units = {grp: len({p for p, g2, _ in kept if g2 == grp}) for grp in counts}
    sums = {grp: sum(v for _, g2, v in kept if g2 == grp) for grp in counts}
    expected = sorted(((grp, counts[grp], units[grp], sums[grp]) for grp in counts),
                      key=lambda r: tuple(map(str, r)))
    twin = _run(engine, _measure(engine, table, sql, G, LIMIT, True))
    parts = _run(engine, _measure(engine, table, sql, G, LIMIT, False))
    assert [tuple(r[:3]) for r in twin] == [tuple(r[:3]) for r in expected]
    assert [r[3] for r in twin] == pytest.approx([r[3] for r in expected])
    assert twin == parts


def test_each_unit_keeps_at_most_g_groups_and_k_rows(made: tuple[Engine, str]) -> None:
    """With heavy units (n_u > k: their groups drawn afresh, then k rows): per unit at most
    G groups and K rows; the light and middle units exactly their hand-kept rows."""
    engine, table = made
    sql = f"SELECT person, grp, COUNT(*) FROM {table} GROUP BY person, grp"
    by_hand = collections.Counter((p, grp) for p, grp, _ in _kept_by_hand(engine, table, G)
                                  if SIZES[p] <= K)
    for _ in range(3):  # fresh draws for the heavy units each time
        kept = _run(engine, _measure(engine, table, sql, G, K, True))
        groups: collections.Counter[int] = collections.Counter()
        rows: collections.Counter[int] = collections.Counter()
        for person, _, n, *_ in kept:
            groups[person] += 1
            rows[person] += n
        assert all(groups[p] <= G and rows[p] <= K for p in groups)
        assert {(p, grp): n for p, grp, n, *_ in kept if SIZES[p] <= K} == dict(by_hand)
        assert {p for p in SIZES if SIZES[p] > K} <= set(groups)


def test_the_engine_reads_the_twin_at_the_chosen_groups(made: tuple[Engine, str]) -> None:
    """A top-k query's final statement, once g and k are chosen, reads the twin (the same
    copy's heavy part beside it), passes the verifier (in ``apply``) and runs."""
    engine, table = made
    sql = f"SELECT grp, COUNT(*) AS n FROM {table} GROUP BY grp ORDER BY n DESC LIMIT 3"
    _, prepared = engine.prepare(sql, "alice", 1.0, 1e-6)
    assert prepared.selection is not None
    final = prepared.selection.apply(Choices(cap=K, bounds=(), groups=G))
    name = grouped_name(_copy(engine, table), ["grp"])
    assert name in final.statements[0] and "__chorus_gfirst" in final.statements[0]
    # Proxy noise: the statement is the exact measurements (the policy has no delta to spend).
    assert {r[0] for r in engine.backend.run(final.statements[0]).rows} <= {0, 1, 2, 3, None}


def _twin_statement(engine: Engine, table: str) -> str:
    return _measure(engine, table, f"SELECT grp, COUNT(*) FROM {table} GROUP BY grp", G, K,
                    True)


@pytest.mark.parametrize("tamper", [
    # The stored group rank's bound dropped, or above g.
    lambda sql: re.sub(r" AND \w+\.__chorus_grank <= 2\b(?!\) AS gk)", "", sql, count=1),
    lambda sql: re.sub(r"(\w+\.__chorus_grank <= )2\b", r"\g<1>3", sql, count=1),
    # Grouped by another column than the stored key the ranks bound (the twin's part, the
    # first part, groups by the key column its name digests).
    lambda sql: re.sub(r"(\"?\w+\"?)\.\"?grp\"?", r"\1.v", sql, count=2),
], ids=["no grank bound", "grank above g", "keys not the stored ones"])
def test_near_misses_of_the_twin_are_refused(made: tuple[Engine, str],
                                             tamper: Callable[[str], str]) -> None:
    engine, table = made
    sql = _twin_statement(engine, table)
    tampered = tamper(sql)
    assert tampered != sql
    with pytest.raises(Refused):
        verify(tampered, engine.dialect, engine.statements.outgoing, "noised_by_proxy",
               frozenset({table}), groups=G, cap=K)


def test_the_twin_pairs_only_with_its_own_copys_heavy_part(made: tuple[Engine, str]) -> None:
    """The twin's part with another copy's heavy part (or the twin's light units' bound
    moved so that the parts overlap) is refused: the parts' units must be disjoint."""
    engine, table = made
    sql = _twin_statement(engine, table)
    copy = _copy(engine, table)
    other = copy[:-1] + ("0" if copy[-1] != "0" else "1")
    heavy_elsewhere = sql.replace(f'"{copy}" AS', f'"{other}" AS')
    assert heavy_elsewhere != sql
    overlapping = sql.replace(f"__chorus_unit_rows <= {K}", f"__chorus_unit_rows <= {K + 1}")
    assert overlapping != sql
    for tampered in (heavy_elsewhere, overlapping):
        with pytest.raises(Refused):
            verify(tampered, engine.dialect, engine.statements.outgoing, "noised_by_proxy",
                   frozenset({table}), groups=G, cap=LIMIT)


def test_a_plan_made_before_the_twin_is_made_again_once_it_is_built(
        made: tuple[Engine, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """As ``chorus serve`` builds it: in the background, the first query taking the path
    without it; the same query once it is built reads it (no stale cached plan)."""
    engine, table = made
    monkeypatch.setattr(engine.samples, "build_in_background", True)
    # The build waits until the first plan is made (the statement at the limit cap already
    # asks for the twin, so a quick build could otherwise be there before it).
    built = threading.Event()
    build = engine.samples._build_grouped

    def held(*args: object) -> None:
        built.wait(60)
        build(*args)

    monkeypatch.setattr(engine.samples, "_build_grouped", held)
    sql = f"SELECT grp, COUNT(*) AS n FROM {table} GROUP BY grp ORDER BY n DESC LIMIT 3"
    name = grouped_name(_copy(engine, table), ["grp"])
    _, prepared = engine.prepare(sql, "alice", 1.0, 1e-6)
    assert prepared.selection is not None
    first = prepared.selection.apply(Choices(cap=K, bounds=(), groups=G))
    built.set()
    engine.samples.wait()
    _, prepared = engine.prepare(sql, "alice", 1.0, 1e-6)
    assert prepared.selection is not None
    again = prepared.selection.apply(Choices(cap=K, bounds=(), groups=G))
    assert name not in first.statements[0] and name in again.statements[0]
    assert name in engine.backend.owned_tables()


def test_at_most_a_few_grouped_twins_per_copy(made: tuple[Engine, str]) -> None:
    """Analysts' queries start the builds: past MAX_GROUPED_TWINS sets of key columns, a new
    set gets none (its queries rank their groups themselves), the built ones stay readable."""
    engine, table = made
    copy = _copy(engine, table)
    sets = [("grp",), ("person",), ("grp", "person"), ("person", "grp"), ("v",)]
    got = [engine.samples.grouped(copy, "person", columns, None) for columns in sets]
    assert got[:MAX_GROUPED_TWINS] == [grouped_name(copy, c) for c in sets[:MAX_GROUPED_TWINS]]
    assert got[MAX_GROUPED_TWINS:] == [None] * (len(sets) - MAX_GROUPED_TWINS)
    assert engine.samples.grouped(copy, "person", sets[0], None) == got[0]


def test_the_groups_histogram_reads_the_twin(made: tuple[Engine, str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Over every row of the copy, the histogram of distinct groups per unit (the choice of
    g) sums each unit's marks in the twin: the hand histogram (a NULL key one group), kept in
    memory as a stored result, noised afresh by each query's selection."""
    engine, table = made
    sql = f"SELECT grp, COUNT(*) AS n FROM {table} GROUP BY grp ORDER BY n DESC LIMIT 3"
    _, prepared = engine.prepare(sql, "alice", 1.0, 1e-6)
    selection = prepared.selection
    assert selection is not None and selection.stored == {("groups",)}
    ((size, text),) = [(n, s) for what, n, s in selection.histograms if what == ("groups",)]
    assert grouped_name(_copy(engine, table), ["grp"]) in text
    starts = cap_bins(LIMIT)
    expected = [0] * len(starts)
    for person in SIZES:
        found = len({grp for _, p, grp, _ in _rows() if p == person})
        expected[max(i for i, start in enumerate(starts) if found >= start)] += 1
    assert list(histogram(engine.statements, None, size, text, stored=True)) == expected

    def unreachable(*args: object, **kwargs: object) -> None:
        raise AssertionError("the stored result was not kept")

    monkeypatch.setattr(engine.backend, "run", unreachable)
    assert list(histogram(engine.statements, None, size, text, stored=True)) == expected


# -- no groups per unit: the twin's marks count each group's units ---------------------------
def _kept_by_rank(engine: Engine, table: str, k: int) -> list[tuple[object, ...]]:
    """(grp, rows, distinct persons, SUM(v)) per group of the copy's rows of stored rank <=
    k, computed here from the stored ranks."""
    stored = engine.backend.run(f'SELECT person, grp, v, __chorus_rank FROM {SCHEMA}.'
                                f'"{_copy(engine, table)}"').rows
    kept = [(p, grp, v) for p, grp, v, rank in stored if rank <= k]
    groups = {grp for _, grp, _ in kept}
    return sorted(((grp, sum(1 for _, g2, _ in kept if g2 == grp),
                    len({p for p, g2, _ in kept if g2 == grp}),
                    sum(v for _, g2, v in kept if g2 == grp)) for grp in groups),
                  key=lambda r: tuple(map(str, r)))


@pytest.mark.parametrize("k", [1, 2, K, LIMIT])
def test_without_groups_per_unit_the_twin_counts_units_by_marks(made: tuple[Engine, str],
                                                               k: int) -> None:
    """Keys released by a threshold with only the row cap bounding them (no g): the twin's
    rows of stored rank <= k, each group's distinct units (the gate and the analyst's
    COUNT(DISTINCT person)) counted by the first row of each (unit, group): the hand counts
    (NULL keys a group of their own), and what the copy's COUNT(DISTINCT) gives."""
    engine, table = made
    sql = f"SELECT grp, COUNT(*), COUNT(DISTINCT person), SUM(v) FROM {table} GROUP BY grp"
    marked = _measure(engine, table, sql, None, k, True)
    assert "DISTINCT" not in marked.upper() and "__chorus_gscore" in marked
    assert f"__chorus_rank <= {k}" in marked and "__chorus_unit_rows" not in marked
    twin = _run(engine, marked)
    copy = _run(engine, _measure(engine, table, sql, None, k, False))
    expected = _kept_by_rank(engine, table, k)
    # (grp, COUNT(*), COUNT(DISTINCT person), SUM(v)[, the gate when it is a count of its
    # own, persons too]).
    assert [r[:3] for r in twin] == [r[:3] for r in expected] == [r[:3] for r in copy]
    assert [r[3] for r in twin] == pytest.approx([r[3] for r in expected])
    assert [r[4:] for r in twin] == [r[4:] for r in copy]
    assert all(gate == e[2] for r, e in zip(twin, expected, strict=True) for gate in r[4:])


def test_the_engine_counts_units_by_marks_at_a_chosen_cap(made: tuple[Engine, str]) -> None:
    """A top-k query whose groups per unit come out at k or more (no group bound): its final
    statement reads the twin's rows of rank <= k with the marks, passes the verifier (in
    ``apply``) and runs."""
    engine, table = made
    sql = f"SELECT grp, COUNT(*) AS n FROM {table} GROUP BY grp ORDER BY n DESC LIMIT 3"
    _, prepared = engine.prepare(sql, "alice", 1.0, 1e-6)
    assert prepared.selection is not None
    final = prepared.selection.apply(Choices(cap=K, bounds=(), groups=K))
    statement = final.statements[0]
    assert grouped_name(_copy(engine, table), ["grp"]) in statement
    assert "__chorus_gscore" in statement and "DISTINCT" not in statement.upper()
    assert {r[0] for r in engine.backend.run(statement).rows} <= {0, 1, 2, 3, None}


@pytest.mark.parametrize("tamper", [
    lambda sql: re.sub(r"\w+\.__chorus_rank <= 4\b", "TRUE", sql, count=1),
    lambda sql: re.sub(r"(\w+\.__chorus_rank <= )4\b", r"\g<1>5", sql, count=1),
], ids=["no rank bound", "rank above k"])
def test_near_misses_of_the_marked_twin_are_refused(made: tuple[Engine, str],
                                                    tamper: Callable[[str], str]) -> None:
    """The twin read without its stored rank bounded by the cap keeps more than k rows per
    unit: refused, as a read of the copy would be."""
    engine, table = made
    sql = _measure(engine, table, f"SELECT grp, COUNT(*) FROM {table} GROUP BY grp", None, K,
                   True)
    tampered = tamper(sql)
    assert tampered != sql
    with pytest.raises(Refused):
        verify(tampered, engine.dialect, engine.statements.outgoing, "noised_by_proxy",
               frozenset({table}), cap=K)


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.tuples(st.one_of(st.none(), st.integers(0, 5)),
                               st.one_of(st.none(), st.integers(0, 3))), min_size=1,
                     max_size=60),
       k=st.integers(1, 6))
def test_marks_count_the_distinct_units_of_the_kept_rows(
        rows: list[tuple[int | None, int | None]], k: int) -> None:
    """For any table (NULL units and keys included) and cap: the twin built by
    ``grouped_table`` from a copy's stored ranks, its rows of rank <= k, counted by
    ``first_kept_of_group``, give each group's COUNT(DISTINCT unit) of the copy's rows of rank
    <= k (DuckDB)."""
    con = duckdb.connect(":memory:")
    con.execute("CREATE SCHEMA p")
    con.execute("CREATE TABLE raw (id INTEGER, u INTEGER, g INTEGER)")
    con.executemany("INSERT INTO raw VALUES (?, ?, ?)",
                    [(i, u, g) for i, (u, g) in enumerate(rows)])
    # A copy's stored ranks: each unit's rows numbered 1..n_u (NULL units one unit).
    con.execute("CREATE TABLE p.c AS SELECT *, ROW_NUMBER() OVER (PARTITION BY u ORDER BY "
                "hash(id)) AS __chorus_rank FROM raw")
    con.execute("CREATE TABLE p.c_g AS " + grouped_table("p", "c", "u", ["g"]).sql("duckdb"))
    marked = exp.select(exp.column("g", table="t"), first_kept_of_group("t", "u")).from_(
        stored_rank_contribution(parse_one("SELECT t.* FROM p.c_g AS t"), "t", k).subquery(
            "t")).group_by(exp.column("g", table="t"))
    distinct = (f"SELECT g, COUNT(DISTINCT u) FROM p.c WHERE __chorus_rank <= {k} "
                "GROUP BY g")
    key = lambda r: tuple(map(str, r))  # noqa: E731
    assert sorted(con.execute(marked.sql("duckdb")).fetchall(), key=key) == \
        sorted(con.execute(distinct).fetchall(), key=key)
