"""Quantile histograms read column-wise (issue 23): ``Backend.run_integers`` on DuckDB
(``fetchnumpy``) and Postgres (the rows, transposed), and ``chorus_py.kinds.quantile.
_index_cells``, which must give exactly the cells the row-wise ``_cells`` gives: the exact
histogram the exponential mechanism draws from, so any difference would change the noise."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlglot import parse_one

from analyses.query import AggregateQuery, GroupKey
from chorus_py.backends import Backend, StatementFailed, open_backend, portable_type
from chorus_py.kinds.finish import finish_rows, noisy_table
from chorus_py.kinds.quantile import (
    BINS,
    _cells,
    _index_cells,
    _public_groups,
)
from chorus_py.policy import TablePolicy

_POLICY = TablePolicy(privacy_unit="u", max_rows_per_unit=2,
                      columns={"u": {"type": "int"}, "x": {"type": "float"}})


def _query(values: list[int]) -> AggregateQuery:
    """A query with one key per entry of ``values``, that many declared values each."""
    keys = tuple(GroupKey(f"k{i}", parse_one(f"t.c{i}"), tuple(f"v{j}" for j in range(n)))
                 for i, n in enumerate(values))
    return AggregateQuery("t", "t", _POLICY, None, keys, (), (), None, (), None, None, 2,
                          False, None)


@st.composite
def _histograms(draw: st.DrawFn) -> tuple[AggregateQuery, list[tuple[int | None, ...]]]:
    """A query with 0 to 3 keys of 1 to 4 declared values and histogram rows over them:
    indexes, now and then NULL (a value the policy does not declare), bins, counts."""
    sizes = draw(st.lists(st.integers(1, 4), max_size=3))
    key = [st.one_of(st.integers(0, n - 1), st.none()) for n in sizes]
    rows = draw(st.lists(st.tuples(*key, st.integers(0, BINS - 1), st.integers(1, 10 ** 6)),
                         max_size=60))
    return _query(sizes), rows


@settings(max_examples=200, deadline=None)
@given(_histograms())
def test_index_cells_are_the_row_wise_cells(
        histogram: tuple[AggregateQuery, list[tuple[int | None, ...]]]) -> None:
    query, rows = histogram
    groups, lookup = _public_groups(query, None)
    n_groups = len(groups) if query.keys else 1
    columns = tuple(np.asarray([-1 if v is None else v for v in column], dtype=np.int64)
                    for column in (zip(*rows, strict=True) if rows
                                   else [()] * (len(query.keys) + 2)))
    expected = _cells(rows, query, lookup, n_groups)
    assert np.array_equal(_index_cells(columns, lookup, n_groups), expected)


def test_index_cells_by_hand() -> None:
    """Two keys of 2 and 3 values: group (1, 2) is the last of 6; a NULL key is dropped; two
    rows of one cell add up."""
    query = _query([2, 3])
    groups, lookup = _public_groups(query, None)
    assert groups[5] == ("v1", "v2")
    columns = (np.array([1, 1, -1, 0]), np.array([2, 2, 0, 0]), np.array([7, 7, 3, 9]),
               np.array([4, 5, 100, 1]))
    cells = _index_cells(columns, lookup, len(groups))
    assert cells[5, 7] == 9 and cells[0, 9] == 1 and cells.sum() == 10


def test_a_bin_outside_the_histogram_is_refused() -> None:
    _, lookup = _public_groups(_query([]), None)
    with pytest.raises(ValueError, match="outside the bins"):
        _index_cells((np.array([BINS]), np.array([1])), lookup, 1)


@pytest.fixture(params=["duckdb", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "duckdb":
        import duckdb

        path = tmp_path / "ints.duckdb"
        duckdb.connect(str(path)).close()
        url = f"duckdb:///{path}"
    else:
        url = request.getfixturevalue("postgres_url")
    made = open_backend(url)
    yield made
    made.close()


def test_run_integers_gives_int64_columns_with_null_as_minus_one(backend: Backend) -> None:
    sql = ("SELECT CASE WHEN i % 3 = 0 THEN NULL ELSE i END AS g0, CAST(i * 2 AS INTEGER) AS "
           "b, COUNT(*) AS n FROM (SELECT CAST(x AS BIGINT) AS i FROM "
           "generate_series(1, 5) AS s(x)) AS t GROUP BY 1, 2 ORDER BY 2")
    g0, b, n = backend.run_integers(sql)
    assert all(c.dtype == np.int64 for c in (g0, b, n))
    assert g0.tolist() == [1, 2, -1, 4, 5] and b.tolist() == [2, 4, 6, 8, 10]
    assert n.tolist() == [1] * 5
    # The same values as the rows, NULL aside.
    rows = backend.run(sql).rows
    assert [tuple(-1 if v is None else v for v in r) for r in rows] == list(
        zip(g0.tolist(), b.tolist(), n.tolist(), strict=True))
    empty = backend.run_integers(sql.replace("ORDER BY 2", "HAVING COUNT(*) > 1 ORDER BY 2"))
    assert [len(c) for c in empty] == [0, 0, 0]


def test_run_integers_refuses_a_column_that_is_not_integral_on_duckdb(tmp_path: Path) -> None:
    import duckdb

    path = tmp_path / "ints.duckdb"
    duckdb.connect(str(path)).close()
    backend = open_backend(f"duckdb:///{path}")
    try:
        with pytest.raises(StatementFailed) as raised:
            backend.run_integers("SELECT 1 AS a, 0.5 AS b")
        assert raised.value.touched_data
        # Two columns of one name stay two columns, in order.
        assert [c.tolist() for c in backend.run_integers("SELECT 1 AS a, 2 AS a")] == [[1], [2]]
        # Nothing is left open: the next statement runs.
        assert [c.tolist() for c in backend.run_integers("SELECT 3 AS a")] == [[3]]
    finally:
        backend.close()


def test_every_cell_of_a_small_grid_is_where_the_rows_put_it() -> None:
    """Every (index, index) pair of two keys of 3 values, one row each at bin i * 3 + j."""
    query = _query([3, 3])
    groups, lookup = _public_groups(query, None)
    pairs = list(itertools.product(range(3), range(3)))
    columns = (np.array([i for i, _ in pairs]), np.array([j for _, j in pairs]),
               np.array([i * 3 + j for i, j in pairs]), np.ones(len(pairs), dtype=np.int64))
    cells = _index_cells(columns, lookup, len(groups))
    for i, j in pairs:
        g = groups.index((f"v{i}", f"v{j}"))
        assert cells[g, i * 3 + j] == 1
    assert cells.sum() == len(pairs)


@pytest.mark.parametrize("with_clause", [False, True])
@pytest.mark.parametrize("n", [0, 1, 5, 8, 9, 500, 1201])
def test_finish_rows_inserts_what_one_insert_per_row_would(n: int, with_clause: bool) -> None:
    """The finish over the released values, whether sent as one statement (up to 8 rows: a
    VALUES list of cast parameters in a WITH; not when the finish has a WITH of its own) or
    over the table filled by multi-row INSERTs (500 rows each), reads what one INSERT per row
    gave: each value cast to its column's type (an int into VARCHAR, a date, NULLs,
    non-finite doubles), the same result types."""
    import datetime

    import duckdb

    columns = [("k0", "VARCHAR"), ("k1", "DATE"), ("q0", "DOUBLE"), ("q1", "BIGINT"),
               ("i", "BIGINT")]
    specials = [float("inf"), -1e308, 0.5]
    rows = [(i if i % 3 else f"s{i}", None if i % 7 == 0 else datetime.date(2026, 1, 1 + i % 28),
             specials[i % 3], None if i % 5 == 0 else i * 2, i) for i in range(n)]
    finish = "SELECT * FROM chorus_noisy ORDER BY i"
    if with_clause:
        finish = "WITH w AS (SELECT 1 AS one) SELECT n.* FROM chorus_noisy AS n, w ORDER BY i"
    base = duckdb.connect(":memory:")
    try:
        found = finish_rows(base.cursor, columns, finish, rows)
        reference = base.cursor()
        reference.execute(noisy_table(columns))
        if rows:
            reference.executemany("INSERT INTO chorus_noisy VALUES (?, ?, ?, ?, ?)", rows)
        expected = reference.execute(finish)
        assert found.types == tuple(portable_type(str(d[1])) for d in expected.description)
        assert found.rows == expected.fetchall()
        assert len(found.rows) == n
        reference.close()
    finally:
        base.close()
