"""The quantile bins, magnitude digits and clipped values a ranked copy stores
(``rewriters.bins``, ``rewriters.selection.stored_digit_columns``,
``rewriters.clipping.stored_clip_columns``, issue 23).

A histogram over the ranked copy groups the copy's stored bin of a plain column at its
declared bounds instead of computing each row's bin.  It must be the very bin the histogram
would compute: checked row by row against the per-row CASE (done by hand here) on both
backends, with negative bounds, an integer column, values at, between and beyond the bounds,
the infinities, NaN, the largest doubles and NULL; and the histogram statement that reads it
against the cells counted by hand.  Which columns are stored, when a histogram may read one,
and that other declared bounds make another copy (never a stale bin) are checked too.  The
magnitude digit of the choices' cells (the bin of |clip(v)| over the declared bounds' edges,
or the NULL digit) likewise, against a hand computation and against the database computing
the cells' own expression over the same rows.  The clipped value an answer sums (DuckDB's
copies only) likewise, row by row, and an answer's exact sums read from it against the same
statement clipping per row.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlglot import exp, parse_one

from chorus_py.backends import SCHEMA
from chorus_py.engine import Engine
from chorus_py.errors import ChorusError
from chorus_py.kinds.quantile import QuantileDetail
from chorus_py.policy import TablePolicy
from mechanisms.clip_bounds import magnitude_edges
from rewriters.bins import BINS, stored_bin, stored_bins
from rewriters.clipping import clipping, stored_clip
from rewriters.dialect import dialect
from rewriters.selection import magnitude_digit, stored_digit
from tests.conftest import table_with_rows

POLICY = """
[backend]
url = "{url}"

[privacy]
epsilon_per_block = 1000.0
max_epsilon_per_query = 500.0
noise = "proxy"

[tables.{table}]
privacy_unit = "person"
max_rows_per_unit = 100
contribution = "fixed"
bounding = "{bounding}"

[tables.{table}.columns]
person = {{ type = "int" }}
v = {{ type = "float", lower = {lower}, upper = 50 }}
n = {{ type = "int", lower = 0, upper = 20 }}
w = {{ type = "float" }}
s = {{ type = "text" }}

[analysts.alice]
"""

VALUES = [-60.0, -50.0, -49.995, -49.99, -0.004, 0.0, 0.01, 12.345, 49.99, 49.9999, 50.0,
          60.0, math.inf, -math.inf, math.nan, 1.7976931348623157e308, -1.7976931348623157e308,
          None]
Row = tuple[int, float | None, int | None, float | None, str]


def _rows() -> list[Row]:
    """(person, v, n, w, s): every value of VALUES, n from -3 to 24 and NULL, 5 units."""
    ints: list[int | None] = [*range(-3, 25), None]
    return [(i % 5, v, ints[i % len(ints)], 1.0, "x")
            for i, v in enumerate(VALUES * 3)]


def _bin(v: float, lower: float, upper: float) -> int:
    """The histogram's per-row CASE (``rewriters.bins.bin_of``) by hand: v <= lower first,
    v >= upper (NaN is above every number on both databases) last, else FLOOR((v - lower) *
    scale), at most BINS - 1; the scale is the literal the statement carries."""
    if v <= lower:
        return 0
    if math.isnan(v) or v >= upper:
        return BINS - 1
    scale = float(repr(float(BINS / (upper - lower))))
    return min(math.floor((v - lower) * scale), BINS - 1)


@pytest.fixture(params=["duckdb", pytest.param("postgres", marks=pytest.mark.postgres)])
def table(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    columns = "person BIGINT, v DOUBLE PRECISION, n BIGINT, w DOUBLE PRECISION, s TEXT"
    with table_with_rows(request, tmp_path, "sbins", columns, _rows()) as made:
        yield made


def _policy(lower: float = -50) -> TablePolicy:
    return TablePolicy(privacy_unit="person", max_rows_per_unit=10, columns={
        "person": {"type": "int"}, "v": {"type": "float", "lower": lower, "upper": 50},
        "n": {"type": "int", "lower": 0, "upper": 20}, "w": {"type": "float"},
        "s": {"type": "text"}, "z": {"type": "float", "lower": 3, "upper": 3}})


def test_the_bounded_numeric_columns_are_stored_by_name() -> None:
    # w has no bounds, s is text, z's range is empty: none of them has bins.
    assert stored_bins(_policy()) == (("n", 0.0, 20.0), ("v", -50.0, 50.0))


def test_a_histogram_reads_a_stored_bin_only_where_it_is_the_same_bin() -> None:
    policy = _policy()
    v = parse_one("t.v")
    assert stored_bin(policy, v, "t", -50, 50, BINS) == "__chorus_bin1"
    assert stored_bin(policy, parse_one("t.n"), "t", 0, 20, BINS) == "__chorus_bin0"
    assert stored_bin(policy, v, "t", -50, 40, BINS) is None  # other bounds
    assert stored_bin(policy, v, "t", -50, 50, 100) is None  # other bins
    assert stored_bin(policy, v, "u", -50, 50, BINS) is None  # another table's column
    assert stored_bin(policy, parse_one("t.v * 2"), "t", -100, 100, BINS) is None
    assert stored_bin(policy, parse_one("t.w"), "t", 0, 1, BINS) is None  # not stored


def _engine(table: tuple[str, str], make: Callable[[str], Engine], lower: float = -50,
            bounding: str = "per-query") -> Engine:
    url, name = table
    engine = make(POLICY.format(url=url, table=name, lower=lower, bounding=bounding))
    engine.warm_up(wait=True)
    return engine


def test_the_copy_stores_the_bin_the_histogram_computes(
        table: tuple[str, str], policy_engine: Callable[[str], Engine]) -> None:
    engine = _engine(table, policy_engine)
    name = table[1]
    copy = engine.samples.ranked(name, engine.policy.tables[name])
    assert copy is not None
    rows = engine.backend.run(f'SELECT v, "__chorus_bin1", n, "__chorus_bin0" FROM '
                              f'{SCHEMA}."{copy}"').rows
    assert len(rows) == len(_rows())
    for v, v_bin, n, n_bin in rows:
        assert v_bin == (None if v is None else _bin(v, -50, 50)), v
        assert n_bin == (None if n is None else _bin(float(n), 0, 20)), n


def test_the_histogram_of_the_stored_bin_counts_each_row_in_its_cell(
        table: tuple[str, str], policy_engine: Callable[[str], Engine]) -> None:
    engine = _engine(table, policy_engine)
    _, prepared = engine.prepare(f"SELECT MIN(v), MAX(v) FROM {table[1]}", "alice",
                                 epsilon=1.0)
    detail = prepared.detail
    assert isinstance(detail, QuantileDetail)
    ((_, statement),) = detail.histograms
    assert "__chorus_bin1" in statement and "FLOOR" not in statement
    expected = collections.Counter(_bin(v, -50, 50) for _, v, *_ in _rows() if v is not None)
    assert {int(b): int(n) for b, n in engine.backend.run(statement).rows} == expected
    # And the query is answered (the outgoing verifier passes the statement).
    assert engine.execute(f"SELECT MIN(v), MAX(v) FROM {table[1]}", "alice",
                          epsilon=1.0).rows


def test_other_declared_bounds_make_another_copy(
        table: tuple[str, str], policy_engine: Callable[[str], Engine]) -> None:
    name = table[1]
    first = _engine(table, policy_engine)
    before = first.samples.ranked(name, first.policy.tables[name])
    first.close()
    second = _engine(table, policy_engine, lower=-40)
    after = second.samples.ranked(name, second.policy.tables[name])
    assert before is not None and after is not None and before != after
    v, stored = second.backend.run(f'SELECT v, "__chorus_bin1" FROM {SCHEMA}."{after}" '
                                   "WHERE v = 12.345").rows[0]
    assert stored == _bin(v, -40, 50) != _bin(v, -50, 50)


def _digit(x: float | None, lower: float, upper: float) -> int:
    """The cells' magnitude digit by hand: NULL is len(edges) + 1; else |clip(x)| (NaN clips
    to upper, as both databases order it above every number) in the first bin j with
    magnitude >= edges[j], or len(edges) below the last edge."""
    edges = magnitude_edges(max(abs(lower), abs(upper)))
    if x is None:
        return len(edges) + 1
    magnitude = abs(upper if math.isnan(x) else min(max(x, lower), upper))
    return next((j for j, e in enumerate(edges) if magnitude >= e), len(edges))


def _stored_beside_computed(engine: Engine, copy: str, stored: str,
                            expression: Callable[[exp.Column, float, float], exp.Expr]
                            ) -> list[tuple[Any, ...]]:
    """(v, stored of v, computed of v, n, stored of n, computed of n) for every row of the
    copy: its stored columns ``<stored>1`` (v) and ``<stored>0`` (n) beside ``expression``
    of the column and its declared bounds, computed by the database over the same row."""
    def computed(column: str, lower: float, upper: float) -> str:
        tree = expression(exp.column(column, table="c"), lower, upper)
        return dialect(tree, engine.dialect).sql(engine.dialect)

    rows = engine.backend.run(
        f'SELECT v, "{stored}1", {computed("v", -50, 50)}, n, "{stored}0", '
        f'{computed("n", 0, 20)} FROM {SCHEMA}."{copy}" AS c').rows
    assert len(rows) == len(_rows())
    return rows


def test_a_cells_statement_reads_a_stored_digit_only_where_it_is_the_same_digit() -> None:
    policy = _policy()
    v = parse_one("t.v")
    assert stored_digit(policy, v, "t", -50, 50) == "__chorus_mag1"
    assert stored_digit(policy, parse_one("t.n"), "t", 0, 20) == "__chorus_mag0"
    assert stored_digit(policy, v, "t", -50, 40) is None  # other bounds
    assert stored_digit(policy, v, "u", -50, 50) is None  # another table's column
    assert stored_digit(policy, parse_one("t.v * 2"), "t", -100, 100) is None
    assert stored_digit(policy, parse_one("t.w"), "t", 0, 1) is None  # not stored


def test_the_copy_stores_the_digit_the_cells_compute(
        table: tuple[str, str], policy_engine: Callable[[str], Engine]) -> None:
    """Each row's stored digit is the hand one and the one the database computes with the
    cells' own expression over the same row (``magnitude_digit`` of |clip(v)|, as
    ``choice_histogram`` writes it for a column it finds no digit of)."""
    engine = _engine(table, policy_engine)
    name = table[1]
    copy = engine.samples.ranked(name, engine.policy.tables[name])
    assert copy is not None

    def digit(column: exp.Column, lower: float, upper: float) -> exp.Expr:
        return magnitude_digit(lambda: exp.Abs(this=clipping(
            column.copy(), lower, upper, consume=True)),
            magnitude_edges(max(abs(lower), abs(upper))))

    rows = _stored_beside_computed(engine, copy, "__chorus_mag", digit)
    for v, v_digit, v_computed, n, n_digit, n_computed in rows:
        assert v_digit == v_computed == _digit(v, -50, 50), v
        assert n_digit == n_computed == _digit(None if n is None else float(n), 0, 20), n


def test_an_answer_reads_a_stored_clip_only_where_it_is_the_same_value() -> None:
    policy = _policy()
    v = parse_one("t.v")
    assert stored_clip(policy, v, "t", -50, 50) == exp.column("__chorus_clip1", table="t")
    assert stored_clip(policy, parse_one("t.n"), "t", 0, 20) == exp.column("__chorus_clip0",
                                                                           table="t")
    assert stored_clip(policy, v, "t", -50, 40) is None  # other bounds
    assert stored_clip(policy, v, "t", 0, 50) is None
    assert stored_clip(policy, v, "u", -50, 50) is None  # another table's column
    assert stored_clip(policy, parse_one("t.v * 2"), "t", -100, 100) is None
    assert stored_clip(policy, parse_one("t.w"), "t", 0, 1) is None  # not stored


def _clipped(x: float | None, lower: float, upper: float) -> float | None:
    """A clip by hand: NULL stays NULL, NaN is above every number on both databases."""
    if x is None:
        return None
    return upper if math.isnan(x) else min(max(x, lower), upper)


def test_the_copy_stores_the_clip_the_answer_computes(
        table: tuple[str, str], policy_engine: Callable[[str], Engine]) -> None:
    """DuckDB: each row's stored clipped value is the hand one and the one the database
    computes with the answer's own expression (``clipping``) over the same row.  Postgres
    stores none (``rewriters.clipping.clips_stored``)."""
    engine = _engine(table, policy_engine)
    name = table[1]
    copy = engine.samples.ranked(name, engine.policy.tables[name])
    assert copy is not None
    columns = [c for c in engine.backend.run(f'SELECT * FROM {SCHEMA}."{copy}" LIMIT 0').columns
               if c.startswith("__chorus_clip")]
    if engine.dialect != "duckdb":
        assert columns == []
        return
    assert columns == ["__chorus_clip0", "__chorus_clip1"]
    rows = _stored_beside_computed(
        engine, copy, "__chorus_clip",
        lambda column, lower, upper: clipping(column, lower, upper, consume=True))
    for v, v_clip, v_computed, n, n_clip, n_computed in rows:
        expected = _clipped(v, -50, 50)
        assert v_clip == v_computed == expected, v
        assert n_clip == n_computed == _clipped(None if n is None else float(n), 0, 20), n


@pytest.mark.parametrize("bounding", ["per-query", "materialized"])
def test_an_answer_at_the_declared_bounds_sums_the_stored_clip(
        table: tuple[str, str], policy_engine: Callable[[str], Engine], bounding: str) -> None:
    """The answer's exact sums read from the stored clipped values (DuckDB's ranked copy, or
    its bounded sample) are those of the same statement clipping each row, and the hand sums
    (every row kept: at most 100 a unit); the query is answered (the outgoing verifier passes
    it)."""
    engine = _engine(table, policy_engine, bounding=bounding)
    name = table[1]
    sql = f"SELECT SUM(v) AS s, AVG(n) AS a, SUM(v * 2) AS d FROM {name}"
    _, prepared = engine.prepare(sql, "alice", epsilon=1.0)
    (statement,) = prepared.statements
    stored = f"{name}.__chorus_clip"
    if engine.dialect != "duckdb":
        assert "__chorus_clip" not in statement
    else:
        # v and n at their declared bounds read the stored values; v * 2 is clipped per row.
        assert f"SUM({stored}1)" in statement and stored + "0" in statement
        assert "LEAST(GREATEST(" in statement
        per_row = statement.replace(f"{stored}1", computed_clip(name, "v", -50, 50)).replace(
            f"{stored}0", computed_clip(name, "n", 0, 20))
        assert "__chorus_clip" not in per_row
        assert engine.backend.run(statement).rows == engine.backend.run(per_row).rows
    values = [v for _, v, *_ in _rows()]
    by_hand = sum(c for c in (_clipped(v, -50, 50) for v in values) if c is not None)
    (exact,) = engine.backend.run(statement).rows
    assert math.isclose(exact[0], by_hand, rel_tol=1e-12)  # m0, SUM(v): up to its order
    assert engine.execute(sql, "alice", epsilon=1.0).rows


def computed_clip(alias: str, column: str, lower: float, upper: float) -> str:
    """The answer's per-row clip of ``alias.column`` as DuckDB SQL."""
    return clipping(exp.column(column, table=alias, quoted=True), lower, upper).sql("duckdb")


@pytest.mark.parametrize("sql", [
    "SELECT SUM(__chorus_clip1) FROM {t}",
    "SELECT COUNT(*) FROM {t} WHERE __chorus_clip0 > 3",
    "SELECT SUM(__chorus_mag1) FROM {t}",
    "SELECT COUNT(*) FROM {t} WHERE __chorus_mag0 > 3",
    "SELECT SUM(__chorus_bin1) FROM {t}",
    "SELECT MAX(__chorus_bin0) FROM {t}",
    "SELECT COUNT(*) FROM {t} WHERE __chorus_bin1 > 5000",
    "SELECT COUNT(*) FROM {t} GROUP BY __chorus_bin1",
])
def test_an_analyst_cannot_name_a_stored_bin(
        table: tuple[str, str], policy_engine: Callable[[str], Engine], sql: str) -> None:
    """The stored bins are the copy's columns, not the table's: a query naming one is refused
    as naming an unknown column, whatever the data, and nothing is charged."""
    engine = _engine(table, policy_engine)
    with pytest.raises(ChorusError, match="unknown column"):
        engine.execute(sql.format(t=table[1]), "alice", epsilon=1.0)
    report = engine.execute(f"SELECT COUNT(*) FROM {table[1]}", "alice", epsilon=1.0).report
    # Spent on the table: the COUNT's 1.0 alone, none for the refused queries.
    assert report.remaining and all(b.epsilon_spent == 1.0 for b in report.remaining)
