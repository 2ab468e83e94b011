"""Thresholded keys with g groups per unit read the ranked copy
(``rewriters.contribution.ranked_group_contribution`` / ``ranked_group_branches``).

The copy must change nothing but speed: each unit keeps rows in at most g of its groups and at
most k rows, every unit with at most g rows (and every unit the bounds do not bind) keeps all
its filtered rows, and the kept rows are distributed as the base table's ``group_bound`` then
``contribution`` keep them.  Tested on small skewed tables on both backends (DuckDB reads
``light UNION ALL heavy``, Postgres aggregates the branches apart), on random small tables
(hypothesis, in-memory DuckDB), and against the outgoing verifier's near misses.
"""

from __future__ import annotations

import collections
import contextlib
import re
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlglot import parse_one

from analyses.query import AggregateQuery
from chorus_py.backends import SCHEMA
from chorus_py.engine import Engine
from chorus_py.errors import InternalError
from chorus_py.policy import load_policy
from rewriters.contribution import (
    contribution,
    group_bound,
    ranked_group_contribution,
    ranked_table,
)
from rewriters.pipeline import pipeline
from tests.conftest import table_with_rows

G, K = 2, 4
#: Rows per unit: light units (<= G rows) and heavier ones, rows spread over GROUPS groups.
SIZES = {1: 1, 2: 2, 3: 3, 4: 5, 5: 8, 6: 40, 7: 12}
GROUPS = 5

POLICY = """
[backend]
url = "{url}"

[privacy]
epsilon_per_block = 1e9
max_epsilon_per_query = 1e8
max_delta_per_query = 1e-4
noise = "proxy"

[tables.{table}]
privacy_unit = "person"
max_rows_per_unit = 50
contribution = "auto"
ranked_copy = true

[tables.{table}.columns]
id = {{ type = "int" }}
person = {{ type = "int" }}
grp = {{ type = "int" }}
v = {{ type = "float", lower = 0, upper = 100 }}

[analysts.alice]
"""


def _rows() -> list[tuple[int, int, int, float]]:
    """(id, person, grp, v): the i-th row of a unit is in group i % GROUPS and has v = i."""
    out, next_id = [], 1
    for person, n in SIZES.items():
        for i in range(n):
            out.append((next_id, person, i % GROUPS, float(i)))
            next_id += 1
    return out


@contextlib.contextmanager
def groups_engine(request: pytest.FixtureRequest, tmp_path: Path, prefix: str,
                  rows: list[tuple[int, int, int | None, float]]
                  ) -> Iterator[tuple[Engine, str]]:
    """An engine over a table of (id, person, grp, v) ``rows`` on the backend of
    ``request.param``, with its ranked copy built, and the table's name."""
    columns = "id BIGINT, person BIGINT, grp BIGINT, v DOUBLE PRECISION"
    with table_with_rows(request, tmp_path, prefix, columns, rows) as (url, table):
        path = tmp_path / "policy.toml"
        path.write_text(POLICY.format(url=url, table=table))
        made = Engine(load_policy(path))
        made.warm_up(wait=True)
        try:
            yield made, table
        finally:
            made.close()


@pytest.fixture(params=["duckdb", pytest.param("postgres", marks=pytest.mark.postgres)])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Engine, str]]:
    """An engine with a built ranked copy of the skewed table, and the table's name."""
    with groups_engine(request, tmp_path, "groups", _rows()) as made:
        yield made


def _query(engine: Engine, sql: str, g: int = G, k: int = K) -> AggregateQuery:
    query = engine._analyse(sql)
    assert isinstance(query, AggregateQuery)
    return query.with_cap(k).with_groups(g)


def _measure(engine: Engine, sql: str, ranked: bool, g: int = G, k: int = K) -> str:
    """The exact measurements statement (never released) bounded to g groups and k rows per
    unit, from the ranked copy or the base table; verified as the proxy would."""
    query = _query(engine, sql, g, k)
    plan = engine.single._noise_plan(query, 1.0, 1e-6)
    copy = engine.single.services.samples.ranked(query.table, query.table_policy)
    assert copy is not None
    text = pipeline(query, plan, None, engine.dialect,
                    ranked=(SCHEMA, copy) if ranked else None).measure_sql()
    assert ("__ranked_" in text) == ranked
    engine.single.services.statements.verify_outgoing(text, "noised_by_proxy", [query.table],
                                                      groups=g if g < k else None)
    return text


def _run(engine: Engine, text: str) -> list[tuple[object, ...]]:
    return sorted(engine.backend.run(text).rows, key=lambda r: tuple(map(str, r)))


def _filtered(passing: object = lambda person, grp, v: True) -> list[tuple[int, int, float]]:
    return [(p, g, v) for _, p, g, v in _rows() if passing(p, g, v)]  # type: ignore[operator]


def test_light_middle_and_heavy_parts_by_backend(engine: tuple[Engine, str]) -> None:
    made, table = engine
    text = _measure(made, f"SELECT grp, COUNT(*) FROM {table} GROUP BY grp", True)
    # The light units by a plain scan; the middle ones (g < n_u <= k) bounded to g groups
    # scored by their stored ranks, no row cap; the heavy ones to g groups scored by fresh
    # draws, then k rows in the stored order.  Postgres aggregates the parts apart
    # (chorus_parts).
    assert f"__chorus_unit_rows <= {G}" in text and f"__chorus_unit_rows > {G}" in text
    assert f"__chorus_unit_rows <= {K}" in text and f"__chorus_unit_rows > {K}" in text
    assert text.count(f"__chorus_grank <= {G}") == 2 and text.count(f"__chorus_krank <= {K}") == 1
    assert text.count("RANDOM()") == 1 and text.count("__chorus_rank AS __chorus_grand") == 1
    assert re.search(r"ORDER BY \w+\.__chorus_rank\)", text)
    assert ("chorus_parts" in text) == (made.dialect == "postgres")


@pytest.mark.parametrize("where, passing", [
    ("v < 2", lambda p, g, v: v < 2),           # <= 2 rows in <= 2 groups: nothing binds
    ("grp = 3", lambda p, g, v: g == 3),         # one group: only the row cap binds
    ("person <= 2", lambda p, g, v: p <= 2),     # light units only
])
def test_exact_counts_match_hand_counts(engine: tuple[Engine, str], where: str,
                                        passing: object) -> None:
    made, table = engine
    rows = _filtered(passing)
    per_unit_group: collections.Counter[tuple[int, int]] = collections.Counter(
        (p, g) for p, g, _ in rows)
    assert all(len({g for p2, g, _ in rows if p2 == p}) <= G for p, _, _ in rows)
    # Hand counts: every filtered row is kept, but a unit's rows of one group cap at K.
    counts: collections.Counter[int] = collections.Counter()
    units: collections.Counter[int] = collections.Counter()
    for (_, grp), c in per_unit_group.items():
        counts[grp] += min(c, K)
        units[grp] += 1
    sql = (f"SELECT grp, COUNT(*), COUNT(DISTINCT person) FROM {table} WHERE {where} "
           "GROUP BY grp")
    expected = sorted((grp, counts[grp], units[grp]) for grp in counts)
    for ranked in (True, False):
        got = [tuple(r[:3]) for r in _run(made, _measure(made, sql, ranked))]
        assert got == expected, (ranked, got)


def test_ranked_and_base_paths_agree_when_nothing_binds(engine: tuple[Engine, str]) -> None:
    """Every unit's filtered rows lie in <= G groups and number <= K: both paths keep them
    all, so every measurement (sums too) is the same, group by group."""
    made, table = engine
    sql = (f"SELECT grp, COUNT(*), COUNT(DISTINCT person), SUM(v), AVG(v) FROM {table} "
           "WHERE v < 2 OR v = 5 GROUP BY grp")
    assert _run(made, _measure(made, sql, True)) == _run(made, _measure(made, sql, False))


def test_a_distinct_count_of_another_column_is_one_aggregate(
        engine: tuple[Engine, str]) -> None:
    """COUNT(DISTINCT v) does not add up over the branches (v = 0 and 1 occur in light and
    heavy units alike): one aggregate over both on Postgres too, and the hand count."""
    made, table = engine
    sql = f"SELECT grp, COUNT(DISTINCT v) FROM {table} WHERE v < 2 GROUP BY grp"
    text = _measure(made, sql, True)
    assert "chorus_parts" not in text
    assert [tuple(r[:2]) for r in _run(made, text)] == [(0, 1), (1, 1)]


def test_each_unit_in_at_most_g_groups_and_k_rows_when_they_bind(
        engine: tuple[Engine, str]) -> None:
    """Grouped by (person, grp), the measurements show each unit's kept rows per group: at
    most G groups and K rows per unit, at least min(K, its G smallest groups' rows); the
    light units (<= G rows) whole."""
    made, table = engine
    sizes = {p: sorted(collections.Counter(g for p2, g, _ in _filtered() if p2 == p).values())
             for p in SIZES}
    sql = f"SELECT person, grp, COUNT(*) FROM {table} GROUP BY person, grp"
    for _ in range(3):  # fresh draws each time
        kept = _run(made, _measure(made, sql, True))
        groups: collections.Counter[int] = collections.Counter()
        rows: collections.Counter[int] = collections.Counter()
        for person, _, n, *_ in kept:
            groups[person] += 1
            rows[person] += n
        for person, size in SIZES.items():
            assert groups[person] <= G and rows[person] <= K
            assert rows[person] >= min(K, sum(sizes[person][:G]))
            if size <= G:
                assert rows[person] == size
        assert rows[6] == K  # 40 rows: the row cap binds within the 2 groups of 8


def test_kept_rows_have_the_base_tables_distribution() -> None:
    """20000 units of rows a | b1 b2 b3 b4 | c | d (groups A, B, C, D), g = 2, k = 3.  The base
    table's bounding keeps a with probability 4/15 and b1 with 18/35 (the groups chosen by
    their rows' smallest draw, the rows uniform among the chosen groups' rows; by enumeration
    of the 7! orders).  Were the stored rank also the group score, a would be kept with 12/35.
    Units of at most g rows (light) are kept whole."""
    con = duckdb.connect()
    con.execute("CREATE TABLE t (person BIGINT, grp TEXT, name TEXT)")
    con.execute("INSERT INTO t SELECT u, x.grp, x.name FROM range(20000) AS r(u), (VALUES "
                "('A', 'a'), ('B', 'b1'), ('B', 'b2'), ('B', 'b3'), ('B', 'b4'), ('C', 'c'), "
                "('D', 'd')) AS x(grp, name)")
    con.execute("INSERT INTO t SELECT 100000 + u, x.grp, 'light' FROM range(50) AS r(u), "
                "(VALUES ('A'), ('B')) AS x(grp)")
    con.execute("CREATE TABLE copy AS " + ranked_table("t", "person").sql("duckdb"))
    rows = parse_one("SELECT c.* FROM copy AS c")
    kept = ranked_group_contribution(rows, "c", "person", [parse_one("c.grp")], 2, 3)
    counts = dict(con.execute(f"SELECT name, COUNT(*) FROM ({kept.sql('duckdb')}) "
                              "GROUP BY name").fetchall())
    assert counts["light"] == 100
    n = 20000
    for name, p in (("a", 4 / 15), ("c", 4 / 15), ("d", 4 / 15), ("b1", 18 / 35)):
        sd = (n * p * (1 - p)) ** 0.5
        assert abs(counts[name] - n * p) < 5 * sd, counts
    assert abs(counts["a"] - n * 12 / 35) > 10 * (n * 4 / 15 * 11 / 15) ** 0.5


def test_middle_units_have_the_base_tables_distribution() -> None:
    """20000 units of rows a | b1 b2 | c (groups A, B, C), g = 2, k = 4: n_u = 4 <= k, the
    middle part (groups scored by the stored ranks, no row cap).  The base table's
    group_bound keeps the groups of the two first appearances in a uniformly random order of
    the 4 rows: A is last (dropped) in 10 of the 24 orders (a 4th: 6; a 3rd with a b 4th: 4),
    B in 4 (both b's last), so a and c are kept with probability 7/12 and b1 with 5/6; a
    choice uniform over the groups would keep a with 2/3."""
    con = duckdb.connect()
    con.execute("CREATE TABLE t (person BIGINT, grp TEXT, name TEXT)")
    con.execute("INSERT INTO t SELECT u, x.grp, x.name FROM range(20000) AS r(u), (VALUES "
                "('A', 'a'), ('B', 'b1'), ('B', 'b2'), ('C', 'c')) AS x(grp, name)")
    con.execute("CREATE TABLE copy AS " + ranked_table("t", "person").sql("duckdb"))
    kept = ranked_group_contribution(parse_one("SELECT c.* FROM copy AS c"), "c", "person",
                                     [parse_one("c.grp")], 2, 4)
    text = kept.sql("duckdb")
    assert "RANDOM()" in text and "c.__chorus_rank AS __chorus_grand" in text
    counts = dict(con.execute(f"SELECT name, COUNT(*) FROM ({text}) GROUP BY name").fetchall())
    per_unit = con.execute(f"SELECT MAX(n), MAX(g) FROM (SELECT person, COUNT(*) AS n, "
                           f"COUNT(DISTINCT grp) AS g FROM ({text}) GROUP BY person)").fetchone()
    assert per_unit == (3, 2)  # at most k rows (here 3: two groups), exactly g groups
    n = 20000
    for name, p in (("a", 7 / 12), ("c", 7 / 12), ("b1", 5 / 6), ("b2", 5 / 6)):
        sd = (n * p * (1 - p)) ** 0.5
        assert abs(counts[name] - n * p) < 5 * sd, counts
    assert abs(counts["a"] - n * 2 / 3) > 10 * (n * 7 / 12 * 5 / 12) ** 0.5


@st.composite
def _tables(draw: st.DrawFn) -> list[tuple[int, int, int]]:
    """(person, grp, v) rows: up to 8 units of up to 12 rows in up to 5 groups."""
    out = []
    for person in range(draw(st.integers(1, 8))):
        n = draw(st.integers(1, 12))
        out += [(person, draw(st.integers(0, 4)), draw(st.integers(0, 9))) for _ in range(n)]
    return out


@given(table=_tables(), g=st.integers(1, 4), extra=st.integers(1, 4),
       cut=st.integers(0, 10))
@settings(max_examples=60, deadline=None)
def test_bounds_on_random_tables(table: list[tuple[int, int, int]], g: int, extra: int,
                                 cut: int) -> None:
    """On any small table and filter ``v < cut``: kept rows are filtered rows, each unit in
    at most g groups and k rows, with at least min(k, its g smallest groups' rows); a unit
    whose filtered rows lie in <= g groups and number <= k (all units of <= g rows among
    them) keeps them all, as the base table's bounding does."""
    k = g + extra
    con = duckdb.connect()
    con.execute("CREATE TABLE t (id BIGINT, person BIGINT, grp BIGINT, v BIGINT)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?)",
                    [(i, *row) for i, row in enumerate(table)])
    con.execute("CREATE TABLE copy AS " + ranked_table("t", "person").sql("duckdb"))
    ranked = ranked_group_contribution(parse_one(f"SELECT c.* FROM copy AS c WHERE c.v < {cut}"),
                                       "c", "person", [parse_one("c.grp")], g, k)
    base = contribution(group_bound(parse_one(f"SELECT c.* FROM t AS c WHERE c.v < {cut}"),
                                    "person", [parse_one("c.grp")], g), "person", k)
    filtered = {i: row for i, row in enumerate(table) if row[2] < cut}
    for statement in (ranked, base):
        ids = [r[0] for r in con.execute(f"SELECT id FROM ({statement.sql('duckdb')})")
               .fetchall()]
        assert len(ids) == len(set(ids)) and set(ids) <= set(filtered)
        for person in {p for p, _, _ in filtered.values()}:
            mine = [i for i, row in filtered.items() if row[0] == person]
            sizes = sorted(collections.Counter(filtered[i][1] for i in mine).values())
            kept = [i for i in ids if filtered[i][0] == person]
            assert len({filtered[i][1] for i in kept}) <= g and len(kept) <= k
            assert len(kept) >= min(k, sum(sizes[:g]))
            if len(sizes) <= g and len(mine) <= k:
                assert sorted(kept) == sorted(mine)


# -- the outgoing verifier: the new shape passes, its near misses do not -----------------------
def _noised(made: Engine, table: str) -> str:
    sql = f"SELECT grp, COUNT(*) FROM {table} GROUP BY grp"
    query = _query(made, sql)
    plan = made.single._noise_plan(query, 1.0, 1e-6)
    copy = made.single.services.samples.ranked(query.table, query.table_policy)
    return pipeline(query, plan, None, made.dialect, ranked=(SCHEMA, copy)).sql_with_noise(plan)


@pytest.mark.parametrize("release", ["noised_in_sql", "noised_by_proxy"])
def test_verifier_refuses_near_misses(engine: tuple[Engine, str], release: str) -> None:
    made, table = engine
    statements = made.single.services.statements
    text = (_noised(made, table) if release == "noised_in_sql" else
            _measure(made, f"SELECT grp, COUNT(*) FROM {table} GROUP BY grp", True))
    statements.verify_outgoing(text, release, [table], groups=G)  # the real shape passes
    light, middle = f"__chorus_unit_rows <= {G}", f"__chorus_unit_rows > {G}"
    upper, heavy = f"__chorus_unit_rows <= {K}", f"__chorus_unit_rows > {K}"
    cap = f"__chorus_krank <= {K}"
    assert text.count(light) == text.count(middle) == text.count(upper) == 1
    assert text.count(heavy) == text.count(cap) == 1
    misses = {
        # the light part's bound is not the middle one's: units of G+1 rows in both
        "light bound above the middle one's": text.replace(light, f"__chorus_unit_rows <= {G + 1}"),
        # the middle part's upper bound above the heavy one's: units of K+1 rows in both
        "middle bound above the heavy one's": text.replace(upper, f"__chorus_unit_rows <= {K + 1}"),
        # no lower bound on the middle part: every unit in it and in another part
        "middle without its lower bound": text.replace(middle, "1 = 1"),
        # the heavy part without its row cap (only the group bound: DENSE_RANK <= g)
        "heavy without ROW_NUMBER <= k": re.sub(r" WHERE b\.__chorus_krank <= \d+", "", text),
        # a row cap that is no ROW_NUMBER
        "heavy capped by RANK": text.replace("ROW_NUMBER() OVER (PARTITION BY gk.",
                                             "RANK() OVER (PARTITION BY gk."),
    }
    for why, miss in misses.items():
        assert miss != text, why
        with pytest.raises(InternalError):
            statements.verify_outgoing(miss, release, [table], groups=G)


def _group_misses(text: str) -> dict[str, str]:
    """A statement's near misses of the g-groups bound (rule 4'' of analyses.outgoing)."""
    bound = re.compile(rf"(\w+)\.__chorus_grank <= {G}\b")
    assert bound.search(text)
    return {
        # the group bound dropped (every part that has one): the gap this rule closes
        "without DENSE_RANK <= g": bound.sub("1 = 1", text),
        # a larger g than the noise and the threshold assume
        "a larger g": bound.sub(rf"\1.__chorus_grank <= {G + 1}", text),
        # DENSE_RANK by the score alone: two groups of one score share a rank
        "ranked without the keys": text.replace(", s.__chorus_gk0)", ")"),
        # partitioned by something other than the unit
        "ranked per group, not per unit": re.sub(
            r"DENSE_RANK\(\) OVER \(PARTITION BY s\.person\b",
            "DENSE_RANK() OVER (PARTITION BY s.grp", text),
        # a ROW_NUMBER is no group rank
        "ROW_NUMBER as the group rank": text.replace("DENSE_RANK()", "ROW_NUMBER()"),
        # the rank ordered by another column than the key (v, one value per row)
        "ranked by another column": re.sub(r'"?grp"? AS __chorus_gk0', "v AS __chorus_gk0",
                                           text),
    }


@pytest.mark.parametrize("ranked", [True, False], ids=["ranked copy", "base table"])
@pytest.mark.parametrize("release", ["noised_in_sql", "noised_by_proxy"])
def test_verifier_requires_the_groups_bound(engine: tuple[Engine, str], release: str,
                                            ranked: bool) -> None:
    """With g < k groups per unit, every read must keep each unit's rows in at most g groups
    (``__chorus_unit_rows <= K`` with K <= g, or ``DENSE_RANK() OVER (PARTITION BY unit ORDER
    BY ..., keys) <= G`` with G <= g): the statement passes at g and above, and is refused at
    any smaller g, and with the bound removed, loosened or made per group instead of per unit,
    on both paths (the ranked copy's parts and the base table's group_bound)."""
    made, table = engine
    statements = made.single.services.statements
    sql = f"SELECT grp, COUNT(*) FROM {table} GROUP BY grp"
    query = _query(made, sql)
    plan = made.single._noise_plan(query, 1.0, 1e-6)
    copy = made.single.services.samples.ranked(query.table, query.table_policy)
    rewritten = pipeline(query, plan, None, made.dialect,
                         ranked=(SCHEMA, copy) if ranked else None)
    text = rewritten.sql_with_noise(plan) if release == "noised_in_sql" \
        else rewritten.measure_sql()
    for groups in (G, G + 1, None):
        statements.verify_outgoing(text, release, [table], groups=groups)
    # Its verdict kept by its literal shape: a statement that differs only in numbers the rule
    # reads (G above g) is checked again, not passed by its tokens.
    statements.verify_outgoing(text, release, [table], variants=True, groups=G)
    with pytest.raises(InternalError, match="groups per person"):
        statements.verify_outgoing(text, release, [table], groups=G - 1)
    for why, miss in _group_misses(text).items():
        assert miss != text, why
        with pytest.raises(InternalError):
            statements.verify_outgoing(miss, release, [table], groups=G)
        with pytest.raises(InternalError):  # by its literal shape too (variants)
            statements.verify_outgoing(miss, release, [table], variants=True, groups=G)
