"""The ranked copy's light and heavy branches aggregated apart and added (Postgres's shape,
``rewriters.pipeline.combine_branches``) against one aggregate over ``light UNION ALL heavy``.

Both shapes read the same copy, so they keep the same rows: every exact measurement must be
the same, group by group (counts exactly, sums up to the order of floating-point additions),
with groups present in one branch only, NULL sums and no keys at all.  Checked on both
backends (the split forced on DuckDB too), over generated queries.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chorus_py.engine import Engine
from chorus_py.policy import load_policy
from rewriters import pipeline
from tests.conftest import table_with_rows

K = 3
#: Rows per unit: light units of 1..K rows and heavier ones (> K).
SIZES = {1: 1, 2: 2, 3: 3, 4: 5, 5: 8, 6: 40}

POLICY = """
[backend]
url = "{url}"

[privacy]
epsilon_per_block = 1e9
max_epsilon_per_query = 1e8
noise = "proxy"

[tables.{table}]
privacy_unit = "person"
max_rows_per_unit = {k}
contribution = "fixed"
ranked_copy = true

[tables.{table}.columns]
id = {{ type = "int" }}
person = {{ type = "int" }}
g = {{ type = "text", public_values = ["a", "b", "c"] }}
v = {{ type = "float", lower = 0, upper = 100 }}

[analysts.alice]
"""


def _rows() -> list[tuple[int, int, str, float | None]]:
    """(id, person, g, v): v = the row's index in its unit, NULL on every 4th row; g = 'c'
    only in heavy units (a group of the heavy branch alone), else 'a' or 'b'."""
    out, next_id = [], 1
    for person, n in SIZES.items():
        for i in range(n):
            g = "c" if n > K and i % 3 == 0 else "ab"[i % 2]
            out.append((next_id, person, g, None if i % 4 == 3 else float(i)))
            next_id += 1
    return out


@pytest.fixture(params=["duckdb", pytest.param("postgres", marks=pytest.mark.postgres)])
def source(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(backend URL, table name) of the skewed table on each backend."""
    columns = "id BIGINT, person BIGINT, g TEXT, v DOUBLE PRECISION"
    with table_with_rows(request, tmp_path, "split", columns, _rows()) as made:
        yield made


@pytest.fixture
def pair(source: tuple[str, str], tmp_path: Path) -> Iterator[tuple[Engine, Engine, str]]:
    """Two engines on one ranked copy (the first builds it, the second only reads it), and
    the table's name."""
    url, table = source
    path = tmp_path / "policy.toml"
    path.write_text(POLICY.format(url=url, table=table, k=K))
    builder = Engine(load_policy(path))
    builder.warm_up(wait=True)
    reader = Engine(load_policy(path), build_ranked_copies=False)
    yield builder, reader, table
    reader.close()
    builder.close()


def _measure(engine: Engine, sql: str, split: bool, monkeypatch: pytest.MonkeyPatch
             ) -> tuple[str, list[tuple[object, ...]]]:
    """The exact measurements statement (noise = "proxy": never released) and its rows,
    with the branches aggregated apart or not."""
    monkeypatch.setattr(pipeline, "SPLIT_DIALECTS",
                        frozenset({engine.dialect}) if split else frozenset())
    _, prepared = engine.prepare(sql, "alice", epsilon=1.0)
    text = prepared.detail.sql
    return text, sorted(engine.backend.run(text).rows, key=lambda r: tuple(map(str, r)))


def _same(left: list[tuple[object, ...]], right: list[tuple[object, ...]]) -> None:
    assert len(left) == len(right)
    for a, b in zip(left, right, strict=True):
        for x, y in zip(a, b, strict=True):
            if isinstance(x, float) or isinstance(y, float):
                assert x is not None and y is not None, (a, b)
                assert math.isclose(float(x), float(y), rel_tol=1e-12, abs_tol=1e-9), (a, b)
            else:
                assert x == y, (a, b)


def _compare(pair: tuple[Engine, Engine, str], sql: str,
             monkeypatch: pytest.MonkeyPatch) -> list[tuple[object, ...]]:
    split_engine, union_engine, _ = pair
    split_sql, split_rows = _measure(split_engine, sql, True, monkeypatch)
    union_sql, union_rows = _measure(union_engine, sql, False, monkeypatch)
    assert "chorus_parts" in split_sql and "chorus_parts" not in union_sql
    copies = {re.search(r"__ranked_\w+", t).group(0) for t in (split_sql, union_sql)}
    assert len(copies) == 1, "both shapes must read the same copy"
    _same(split_rows, union_rows)
    return split_rows


def test_hand_computed_groups_and_null_sums(pair: tuple[Engine, Engine, str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """WHERE v IS NULL: every SUM(v) is NULL in both branches, COUNT(*) counts the NULL rows
    (sum_u min(c_u, K) over the units' NULL rows: units of 5, 8, 40 rows hold 1, 2, 10;
    kept 1 + 2 + 3 = 6); group 'c' lives in heavy units only."""
    *_, table = pair
    (row,) = _compare(pair, f"SELECT COUNT(*), SUM(v) FROM {table} WHERE v IS NULL",
                      monkeypatch)
    assert row == (6, None)
    rows = _compare(pair, f"SELECT g, COUNT(*) FROM {table} WHERE v >= 0 GROUP BY g",
                    monkeypatch)
    assert {r[0] for r in rows} == {"a", "b", "c"}


def test_a_distinct_count_of_another_column_is_one_aggregate_over_both_branches(
        pair: tuple[Engine, Engine, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """COUNT(DISTINCT g) does not add up over the branches: 'a' and 'b' occur in light and
    heavy units alike, so the sum of the branches' counts would be 4.  With the split asked
    for, the query is still one aggregate over light UNION ALL heavy, and its exact value is
    the hand count, 2 (without 'c', every unit keeps all its rows but unit 6: 26 of its 40 rows
    pass, it keeps K = 3 of them, whose g may be 'a' or 'b' only).  Its sensitivity is K, a
    row count's: each kept row may bring a value of its own."""
    engine, _, table = pair
    sql = f"SELECT COUNT(DISTINCT g), COUNT(*) FROM {table} WHERE g <> 'c'"
    text, rows = _measure(engine, sql, True, monkeypatch)
    assert "chorus_parts" not in text and "UNION ALL" in text
    distinct, count = rows[0]
    assert distinct == 2
    filtered = {p: sum(1 for _, q, g, _ in _rows() if q == p and g != "c") for p in SIZES}
    assert count == sum(min(n, K) for n in filtered.values())
    report = engine.explain(sql, "alice", epsilon=1.0)
    assert [m.sensitivity for m in report.measurements] == [K, K]


AGGREGATES = ["COUNT(*)", "COUNT(v)", "SUM(v)", "AVG(v)", "VARIANCE(v)",
              "COUNT(DISTINCT person)"]
FILTERS = st.one_of(
    st.integers(0, 40).map(lambda a: f"v >= {a}"),
    st.tuples(st.integers(0, 20), st.integers(0, 40)).map(
        lambda ab: f"v < {ab[0]} OR v > {ab[1]}"),
    st.just("v IS NULL"),
    st.sampled_from(["a", "b", "c"]).map(lambda g: f"g = '{g}'"),
    st.just("v > 1000"),  # nothing left
)


@given(aggregates=st.lists(st.sampled_from(AGGREGATES), min_size=1, max_size=3, unique=True),
       where=FILTERS, grouped=st.booleans())
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_the_split_measures_what_the_union_measures(
        pair: tuple[Engine, Engine, str], monkeypatch: pytest.MonkeyPatch,
        aggregates: list[str], where: str, grouped: bool) -> None:
    *_, table = pair
    if aggregates == ["COUNT(DISTINCT person)"]:
        # Alone it is a per-person count (one row per unit, tests/test_per_person.py), which
        # reads no ranked copy: a row aggregate beside it keeps the query on the split.
        aggregates = [*aggregates, "COUNT(*)"]
    columns = ", ".join(aggregates)
    sql = (f"SELECT g, {columns} FROM {table} WHERE {where} GROUP BY g" if grouped
           else f"SELECT {columns} FROM {table} WHERE {where}")
    _compare(pair, sql, monkeypatch)
