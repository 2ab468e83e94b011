"""The selection's cap and clipping histograms from ONE statement (issue 23, part 1).

``rewriters.selection.choice_histogram`` computes both histograms of a SUM/AVG query's private
choices in one pass: windows over one partition (the unit) when the query filters its rows, or
the ranked copy's stored row counts when it filters nothing but its claimed blocks.  Checked on
both backends against hand-computed histograms, against today's separate statements
(``cap_histogram``, ``value_histogram``), for the L1 sensitivity 1 of what is noised, and for
the outgoing verifier's view of the new shapes (they pass; tampered ones are refused).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
import pytest
import sqlglot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlglot import exp

from analyses.outgoing import Refused, verify
from chorus_py.backends.base import SCHEMA
from chorus_py.engine import Engine
from chorus_py.kinds.selection import (
    CELLS,
    COPIED,
    STORED,
    WINDOWED,
    cells,
    histogram_builders,
    parts,
)
from chorus_py.stores.samples import BoundedSamples
from mechanisms.caps import cap_bins
from mechanisms.clip_bounds import STEPS, magnitude_edges
from rewriters.contribution import UNIT_ORDER
from rewriters.dialect import dialect

LIMIT = 10
UPPER = 100.0
#: Rows per unit: units of 1 to 40 rows (40 > the limit: the last cap bin).
SIZES = {1: 1, 2: 2, 3: 3, 4: 5, 5: 8, 6: 40}
#: Unit 5's rows of odd index hold NULL (4 of its 8 values).
NULLS = 5

POLICY = """
[backend]
url = "{url}"

[privacy]
epsilon_per_block = 1000000.0
max_epsilon_per_query = 100000.0

[tables.choice_t]
privacy_unit = "person"
max_rows_per_unit = 10
contribution = "auto"
clipping = "auto"
ranked_copy = true

[tables.choice_t.columns]
id = {{ type = "int" }}
person = {{ type = "int" }}
v = {{ type = "float", lower = 0, upper = 100 }}
w = {{ type = "float", lower = -50, upper = 50 }}

[analysts.alice]
"""  # LIMIT and UPPER


@pytest.fixture(autouse=True)
def _cells_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cells statement whole: on Postgres the engine sends it over the twin as two halves
    side by side (``BoundedSamples.middle``), whose shapes tests/test_cells_parts.py checks."""
    monkeypatch.setattr(BoundedSamples, "middle", lambda self, copy: None)


def _value(person: int, i: int) -> float | None:
    """Spread over the magnitude bins: 0.07 to about 60, some on a bin edge (50 = UPPER / 2)."""
    if person == NULLS and i % 2 == 1:
        return None
    return [50.0, 3.0, 0.07, 17.5, 60.25, 1.0, 8.0][(person + i) % 7]


def _rows(sizes: dict[int, int]) -> list[tuple[int, int, float | None, float]]:
    out, next_id = [], 1
    for person, n in sizes.items():
        for i in range(n):
            out.append((next_id, person, _value(person, i), float(i % 5) * 7 - 20))
            next_id += 1
    return out


def _engine(scratch: Callable[..., Engine], sizes: dict[int, int] = SIZES) -> Engine:
    values = ", ".join(
        f"({i}, {p}, {'NULL' if v is None else repr(v)}, {w!r})" for i, p, v, w in _rows(sizes))
    return scratch("choice_t", [
        "CREATE TABLE choice_t (id BIGINT, person BIGINT, v DOUBLE PRECISION, "
        "w DOUBLE PRECISION)", f"INSERT INTO choice_t VALUES {values}"], POLICY)


def _bin(magnitude: float, edges: tuple[float, ...]) -> int:
    return next((j for j, e in enumerate(edges) if magnitude >= e), len(edges))


Row = tuple[int, int, "float | None", float]


def _reference(sizes: dict[int, int], passing: Callable[[Row], bool],
               stored: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The histograms computed by hand: units per bin of their passing rows c_u, and each
    passing non-NULL v weighing 1 / (its unit's passing non-NULL values) in the bin of
    min(v, UPPER) (``stored``: 1 / n_u, the unit's rows in the table)."""
    starts = cap_bins(LIMIT)
    edges = magnitude_edges(UPPER)
    cap, values = np.zeros(len(starts)), np.zeros(STEPS + 2)
    for person, n in sizes.items():
        kept = [r for r in _rows(sizes) if r[1] == person and passing(r)]
        if not kept:
            continue
        cap[max(i for i, s in enumerate(starts) if len(kept) >= s)] += 1
        present = [r[2] for r in kept if r[2] is not None]
        for v in present:
            values[_bin(min(abs(v), UPPER), edges)] += 1 / (n if stored else len(present))
    return cap, values


def _statement(engine: Engine, sql: str) -> tuple[int, str, tuple[object, ...]]:
    _, prepared = engine.prepare(sql, "alice", epsilon=10.0)
    assert prepared.selection is not None
    histograms = prepared.selection.histograms
    assert [what for what, _, _ in histograms] == [CELLS]  # one statement for all of them
    (_, shape, statement), = histograms
    return shape, statement, parts(prepared.selection.query)[1]


def _cells(engine: Engine, sql: str) -> tuple[int, dict[tuple[str, ...], np.ndarray]]:
    shape, statement, clipped = _statement(engine, sql)
    return shape, cells(engine.statements, None, statement, LIMIT, clipped,
                        stored=shape == STORED)


def _clip(exact: dict[tuple[str, ...], np.ndarray], column: str) -> np.ndarray:
    (vector,) = [v for (what, *key), v in exact.items() if what == "clip" and column in key[0]]
    return vector


def _reading(engine: Engine, twin: bool) -> Engine:
    """``engine`` once its ranked copy and twins are built, reading the twins or not."""
    engine.warm_up(wait=True)
    engine.samples.read_twins = twin
    return engine


@pytest.mark.parametrize("twin", [False, True])
@pytest.mark.parametrize("where, passing, shape", [
    ("", lambda r: True, STORED),
    ("WHERE v >= 2", lambda r: r[2] is not None and r[2] >= 2, COPIED),
    # By row id: cuts units unevenly, NULLs included.
    ("WHERE id % 3 <> 0", lambda r: r[0] % 3 != 0, COPIED),
])
def test_one_statement_gives_the_hand_computed_histograms(
        scratch: Callable[..., Engine], where: str, passing: Callable[[Row], bool],
        shape: int, twin: bool) -> None:
    """Over the stored counts, the copy's filtered rows, or those of its twin in unit order
    (``twin``: its windows partitioned by the stored unit row count then the unit)."""
    engine = _reading(_engine(scratch), twin)
    _, statement, _ = _statement(engine, f"SELECT SUM(v) FROM choice_t {where}")
    assert (f"{UNIT_ORDER}\"" in statement) == (twin and shape == COPIED)
    # v's magnitude digit as the copy stored it (a plain column at its declared bounds).
    assert "__chorus_mag" in statement and "ABS(" not in statement
    got_shape, exact = _cells(engine, f"SELECT SUM(v) FROM choice_t {where}")
    cap, values = _reference(SIZES, passing, stored=shape == STORED)
    assert got_shape == shape
    assert exact[("cap",)].tolist() == cap.tolist()
    np.testing.assert_allclose(_clip(exact, '"v"'), values, rtol=1e-12, atol=1e-12)


def test_hand_computed_values_of_the_small_table() -> None:
    """The reference itself, by hand: no filter, units of 1, 2, 3, 5, 8 and 40 rows."""
    cap, values = _reference(SIZES, lambda r: True)
    # cap_bins(10) = (1, 2, 3, 4, 5, 6, 7, 8, 10): c_u 1, 2, 3, 5, 8 and 40 (>= 10, the last).
    assert cap.tolist() == [1, 1, 1, 0, 1, 0, 0, 1, 1]
    assert values.sum() == pytest.approx(6.0)  # six units, each weighing 1 in all
    # Over stored counts unit 5 (4 NULLs of 8) weighs 4 / 8: 5.5 in all.
    assert _reference(SIZES, lambda r: True, stored=True)[1].sum() == pytest.approx(5.5)


@pytest.mark.parametrize("where", ["", "WHERE v >= 2 OR v IS NULL", "WHERE person <> 3"])
def test_same_histograms_as_the_separate_statements(scratch: Callable[..., Engine],
                                                     where: str) -> None:
    """Today's statements (a GROUP BY unit, a window per clipped column) against the one
    statement, two clipped columns (v with NULLs, w signed): equal, except the documented
    difference of the stored path for a unit with NULL values (1 / n_u weights)."""
    engine = _engine(scratch)
    sql = f"SELECT SUM(v), AVG(w) FROM choice_t {where}"
    shape, exact = _cells(engine, sql)
    _, prepared = engine.prepare(sql, "alice", epsilon=10.0)
    detail = prepared.detail
    separate = {}
    for what, size, build in histogram_builders(detail.query, detail.restriction, None):
        statement = dialect(build(), engine.dialect).sql(engine.dialect)
        vector = np.zeros(size)
        for b, value in engine.backend.run(statement).rows:
            vector[int(b)] = float(value)
        separate[what] = vector
    assert set(separate) == set(exact)
    assert exact[("cap",)].tolist() == separate[("cap",)].tolist()
    np.testing.assert_allclose(_clip(exact, '"w"'), _clip(separate, '"w"'), rtol=1e-12)
    if shape == STORED:  # unit 5's NULLs: its 4 values weigh 1/8 each, not 1/4
        assert sum(_clip(exact, '"v"')) == pytest.approx(sum(_clip(separate, '"v"')) - 0.5)
    else:
        np.testing.assert_allclose(_clip(exact, '"v"'), _clip(separate, '"v"'), rtol=1e-12)
    assert shape == (STORED if not where else COPIED)


@pytest.mark.parametrize("where", ["", "WHERE v >= 2"])
def test_one_more_unit_moves_each_histogram_by_at_most_one(
        scratch: Callable[..., Engine], where: str) -> None:
    """Neighbouring tables (one more unit, of 12 rows): each noised vector moves by at most 1
    in L1 (the sensitivity the noise is calibrated to), on both paths."""
    sql = f"SELECT SUM(v), SUM(w) FROM choice_t {where}"
    _, before = _cells(_engine(scratch), sql)
    _, after = _cells(_engine(scratch, {**SIZES, 7: 12}), sql)
    for what in before:
        assert np.abs(after[what] - before[what]).sum() <= 1 + 1e-9, what
    assert np.abs(after[("cap",)] - before[("cap",)]).sum() == 1


def test_a_sum_runs_one_selection_statement(scratch: Callable[..., Engine],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end: the cap and the bounds chosen from one statement, the answer from another,
    the selection's share charged as before (the report's parts add up to the charge)."""
    engine = _engine(scratch)
    ran: list[str] = []
    run = engine.statements.run

    def spy(sql: str, *args: object, **kwargs: object) -> object:
        if not sql.startswith("EXPLAIN "):
            ran.append(sql)
        return run(sql, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(engine.statements, "run", spy)
    result = engine.execute("SELECT SUM(v), AVG(w) FROM choice_t WHERE v > 1", analyst="alice",
                            epsilon=10.0)
    assert len(ran) == 2  # the selection's one statement, then the answer
    report = result.report
    contribution = report.contribution
    assert contribution.epsilon == pytest.approx(10.0 * 0.1)  # cap_epsilon_share 0.1
    assert [s.kind for s in contribution.steps] == ["cap", "bounds", "bounds"]
    assert all(s.epsilon == pytest.approx(10.0 * 0.1 / 3) for s in contribution.steps)
    spent = sum(m.mechanism["epsilon"] for m in report.measurements)
    assert spent + contribution.epsilon == pytest.approx(report.epsilon)
    (block,) = engine.ledger.blocks()
    assert block.epsilon_consumed == pytest.approx(report.epsilon)


def test_more_clipped_columns_than_the_cells_take_keep_separate_statements(
        scratch: Callable[..., Engine]) -> None:
    engine = _engine(scratch)
    _, prepared = engine.prepare("SELECT SUM(v), SUM(w), SUM(v * 2 + w) FROM choice_t",
                                 "alice", epsilon=10.0)
    assert prepared.selection is not None
    whats = [what[0] for what, _, _ in prepared.selection.histograms]
    assert whats == ["clip", "clip", "clip", "cap"]


@pytest.mark.parametrize("where, whats", [("", [CELLS]), ("WHERE v > 1", [("cap",)])])
def test_a_cap_histogram_alone(scratch: Callable[..., Engine], where: str,
                               whats: list[tuple[str, ...]]) -> None:
    """A COUNT's cap alone: read from the stored counts without a filter (a plain scan), a
    GROUP BY unit with one (cheaper than weighing every row by a window)."""
    engine = _engine(scratch)
    sql = f"SELECT COUNT(*) FROM choice_t {where}"
    _, prepared = engine.prepare(sql, "alice", epsilon=1000.0)
    assert prepared.selection is not None
    assert [what for what, _, _ in prepared.selection.histograms] == whats
    if not where:
        (_, shape, statement), = prepared.selection.histograms
        exact = cells(engine.statements, None, statement, LIMIT, (), stored=shape == STORED)
        assert shape == STORED
        assert exact[("cap",)].tolist() == _reference(SIZES, lambda r: True)[0].tolist()


@pytest.mark.parametrize("where, shape", [
    ("", STORED), ("WHERE v > 1", COPIED),
    ("WHERE v > 1 AND CURRENT_DATE > DATE '2000-01-01'", WINDOWED)])
def test_the_cap_histogram_is_counted_in_whole_units(scratch: Callable[..., Engine], where: str,
                                                     shape: int) -> None:
    """The cap weights are marks (1 on one row per unit, 0 on the others): the database sums
    integers, so every cap cell comes back as a whole number, not a float to be rounded."""
    engine = _engine(scratch)
    got, statement, _ = _statement(engine, f"SELECT SUM(v) FROM choice_t {where}")
    assert got == shape
    rows = engine.backend.run(statement).rows
    assert rows
    for row in rows:
        assert not isinstance(row[1], float) and int(row[1]) == row[1], row


# -- a filtered query's cells over the ranked copy (COPIED) ----------------------------------
def _both_sources(engine: Engine, sql: str
                  ) -> list[dict[tuple[str, ...], np.ndarray]]:
    """The exact histograms of ``sql``'s cells statement over the copy's filtered rows (its
    magnitude digits computed, then read as the copy stored them), over its twin's in unit
    order, then over the table's."""
    engine.warm_up(wait=True)  # the copy and its twin
    _, prepared = engine.prepare(sql, "alice", epsilon=10.0)
    assert prepared.selection is not None
    detail, clipped = prepared.detail, parts(prepared.selection.query)[1]
    copy, = [t for t in engine.backend.owned_tables()  # the copy, not its twin in unit order
             if t.startswith("choice_t__ranked_") and not t.endswith(UNIT_ORDER)]
    out = []
    for source, digits in (((SCHEMA, copy), False), ((SCHEMA, copy), True),
                           ((SCHEMA, copy + UNIT_ORDER), True), (None, True)):
        (what, shape, build), = histogram_builders(detail.query, detail.restriction, None,
                                                   one_statement=True, copy=source,
                                                   digits=digits)
        assert what == CELLS and shape == (COPIED if source else WINDOWED)
        statement = dialect(build(), engine.dialect).sql(engine.dialect)
        assert ("__ranked_" in statement) == (source is not None)
        assert ("MIN(" in statement) == (source is not None)  # else ROW_NUMBER's mark
        # v's and w's magnitude digits as the copy stored them, or computed per row.
        assert statement.count("__chorus_mag") == (2 if source and digits else 0)
        verify(statement, engine.dialect, engine.statements.outgoing, "noised_by_proxy",
               frozenset({"choice_t"}))
        out.append(cells(engine.statements, None, statement, LIMIT, clipped, stored=False))
    return out


@pytest.mark.parametrize("where", ["WHERE v >= 2 OR v IS NULL", "WHERE person <> 3",
                                   "WHERE id % 3 <> 0 AND w > -20"])
def test_the_copy_gives_the_histograms_of_the_table(scratch: Callable[..., Engine],
                                                    where: str) -> None:
    """The same histograms: the copy's filtered rows (and its twin's) are the table's (every
    scheduled row, more columns), so the marks add up to the same integers and the weights to
    the same sums.  (A single cell may differ: which row of a unit bears its mark is arbitrary, and
    the mark lands in that row's bins; only its count of rows reaches the cap marginal.)"""
    engine = _engine(scratch)
    *over_copies, over_table = _both_sources(
        engine, f"SELECT SUM(v), AVG(w) FROM choice_t {where}")
    for over in over_copies:
        assert set(over) == set(over_table)
        assert over[("cap",)].tolist() == over_table[("cap",)].tolist()
        for what in over:
            np.testing.assert_allclose(over[what], over_table[what], rtol=1e-12, atol=1e-12)


def _spied(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    ran: list[str] = []
    run = engine.backend.run

    def spy(sql: str, *args: object, **kwargs: object) -> object:
        ran.append(sql)
        return run(sql, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(engine.backend, "run", spy)
    return ran


def test_a_filtered_querys_cells_run_once(scratch: Callable[..., Engine],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Choices never reused (choice_reuse_seconds = 0, the default): every run chooses again
    from freshly noised histograms, but the copy's cells run on the database once, for this
    text and for another with the same filter and summed column; each run pays its choice."""
    engine = _engine(scratch)
    ran = _spied(engine, monkeypatch)
    charged, answers = [], set()
    for sql in ["SELECT SUM(v) FROM choice_t WHERE v > 1"] * 3 \
            + ["SELECT AVG(v) FROM choice_t WHERE v > 1"]:
        report = engine.execute(sql, analyst="alice", epsilon=10.0).report
        assert report.contribution.steps[0].mechanism == "discrete_laplace"  # chosen again
        charged.append(report.contribution.epsilon)
        answers.add(len(ran) - 1)  # a run's last statement is its answer (noised in SQL or not)
    # Not the twin's middle, read with the copy this test's first query builds.
    cells_run = [s for i, s in enumerate(ran) if "__ranked_" in s and i not in answers
                 and not s.startswith(("EXPLAIN", "SELECT __chorus_unit_rows FROM"))]
    assert len(cells_run) == 1, cells_run
    assert charged == [pytest.approx(1.0)] * 4


def test_a_filter_on_the_current_date_reads_the_table_every_time(
        scratch: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch) -> None:
    """CURRENT_DATE keeps other rows another day: the cells are not remembered (WINDOWED,
    over the table), so they run again for every choice."""
    engine = _engine(scratch)
    sql = "SELECT SUM(v) FROM choice_t WHERE v > 1 AND CURRENT_DATE > DATE '2000-01-01'"
    assert _statement(engine, sql)[0] == WINDOWED
    ran = _spied(engine, monkeypatch)
    for _ in range(2):
        engine.execute(sql, analyst="alice", epsilon=10.0)
    windowed = [s for s in ran if "OVER (PARTITION BY" in s and "__ranked_" not in s
                and "chorus_noisy" not in s and not s.startswith("EXPLAIN")]
    assert len(windowed) == 2, windowed


# -- brute force: small skewed tables, both shapes, both backends -----------------------------
#: Values around the bin edges and the bounds (v: [0, 100], w: [-50, 50]), beyond them too.
V_VALUES = [None, 0.0, 0.07, 1.0, 3.0, 12.5, 50.0, 60.25, 100.0, 250.0, -4.0]
W_VALUES = [None, -75.0, -50.0, -17.5, -0.3, 0.0, 2.0, 25.0, 49.9, 50.0, 80.0]
#: (SQL filter, the same in Python over (id, person, v, w)); "" keeps every row (the stored
#: shape), the others cut units unevenly or drop whole units (person % 3 = 1).
FILTERS: list[tuple[str, Callable[[Row], bool]]] = [
    ("", lambda r: True),
    ("WHERE w > -20", lambda r: r[3] is not None and r[3] > -20),
    ("WHERE person % 3 <> 1", lambda r: r[1] % 3 != 1),
    ("WHERE id % 4 <> 0 AND (v IS NULL OR v < 55)",
     lambda r: r[0] % 4 != 0 and (r[2] is None or r[2] < 55)),
]
_tables = iter(range(1_000_000))


def random_table(scratch: Callable[..., Engine], units: list[tuple[int, int]], table: str
                 ) -> tuple[Engine, str, list[tuple[int, int, float | None, float | None]]]:
    """An engine on ``table``: for each unit of ``units`` (rows, seed), its rows of (id,
    person, v, w) with values of ``V_VALUES`` and ``W_VALUES`` picked by the seed; and those
    rows."""
    rows, next_id = [], 1
    for person, (size, seed) in enumerate(units, 1):
        for i in range(size):
            rows.append((next_id, person, V_VALUES[(seed + i) % len(V_VALUES)],
                         W_VALUES[(seed * 7 + i * 3) % len(W_VALUES)]))
            next_id += 1

    def text(x: float | None) -> str:
        return "NULL" if x is None else repr(x)

    values = ", ".join(f"({i}, {p}, {text(v)}, {text(w)})" for i, p, v, w in rows)
    engine = scratch(table, [
        f"CREATE TABLE {table} (id BIGINT, person BIGINT, v DOUBLE PRECISION, "
        f"w DOUBLE PRECISION)", f"INSERT INTO {table} VALUES {values}"],
        POLICY.replace("choice_t", table))
    return engine, table, rows


def _brute_force(rows: list[tuple[int, int, float | None, float | None]],
                 passing: Callable[[Row], bool], stored: bool
                 ) -> tuple[list[int], dict[str, np.ndarray]]:
    """By hand: units per cap bin of their passing rows c_u, and per column each passing
    non-NULL value weighing 1 / (its unit's passing non-NULL values of the column) in the bin
    of |clip(value)| (``stored``, every row passing: 1 / n_u)."""
    starts = cap_bins(LIMIT)
    cap = [0] * len(starts)
    clip = {"v": (0.0, 100.0, 2), "w": (-50.0, 50.0, 3)}
    vectors = {c: np.zeros(STEPS + 2) for c in clip}
    for person in sorted({r[1] for r in rows}):
        kept = [r for r in rows if r[1] == person and passing(r)]
        if not kept:
            continue
        cap[max(i for i, s in enumerate(starts) if len(kept) >= s)] += 1
        for column, (lower, upper, at) in clip.items():
            edges = magnitude_edges(max(abs(lower), abs(upper)))
            present = [r[at] for r in kept if r[at] is not None]
            for value in present:
                weight = 1 / (len(kept) if stored else len(present))
                vectors[column][_bin(abs(min(max(value, lower), upper)), edges)] += weight
    return cap, vectors


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(units=st.lists(st.tuples(st.integers(1, 40), st.integers(0, 10_000)), min_size=1,
                      max_size=7),
       which=st.integers(0, len(FILTERS) - 1), twin=st.booleans())
def test_the_histograms_equal_a_brute_force_count(scratch: Callable[..., Engine],
                                                  units: list[tuple[int, int]],
                                                  which: int, twin: bool) -> None:
    """Units of 1 to 40 rows (the limit is 10), NULLs, signed values beyond the bounds and
    filters that drop whole units: the statement's cells, summed by ``cells``, give exactly
    the hand count of units per cap bin and, up to floating point, the hand weights."""
    engine, table, rows = random_table(scratch, units, f"choice_h{next(_tables)}")
    _reading(engine, twin)  # a filtered query's cells over the copy, or over its twin
    where, passing = FILTERS[which]
    _, prepared = engine.prepare(f"SELECT SUM(v), AVG(w) FROM {table} {where}", "alice",
                                 epsilon=10.0)
    assert prepared.selection is not None
    (_, shape, statement), = prepared.selection.histograms
    assert shape == (STORED if not where else COPIED)
    assert (f"{UNIT_ORDER}\"" in statement) == (twin and bool(where))
    assert statement.count("__chorus_mag") == 2  # v's and w's digits, as the copy stored them
    exact = cells(engine.statements, None, statement, LIMIT,
                  parts(prepared.selection.query)[1], stored=shape == STORED)
    cap, vectors = _brute_force(rows, passing, stored=shape == STORED)
    assert exact[("cap",)].tolist() == cap
    for column, vector in vectors.items():
        np.testing.assert_allclose(_clip(exact, f'"{column}"'), vector, rtol=1e-12,
                                   atol=1e-12)


# -- the outgoing verifier (wall 4) over the new shapes -------------------------------------------
SUM_ALL = "SELECT SUM(fare) FROM trips"
SUM_FILTERED = "SELECT city, SUM(fare) FROM trips WHERE fare > 30 GROUP BY city"
#: A filter that keeps other rows another day: its cells read the table (``copy_cells``).
SUM_TODAY = ("SELECT city, SUM(fare) FROM trips WHERE fare > 30 "
             "AND pickup_time < CURRENT_TIMESTAMP GROUP BY city")


@pytest.fixture
def trips(request: pytest.FixtureRequest, backend_url: str,
          make_engine: Callable[..., Engine]) -> Engine:
    """The demo trips with automatic caps; a filtered query's cells read the copy's twin in
    unit order (built: ``make_engine`` waits for it), or, parametrized indirectly with False
    (``BOTH_READS``), the copy itself."""
    engine = make_engine(backend_url, contribution="auto")
    engine.samples.read_twins = getattr(request, "param", True)
    return engine


#: The tests that see both statements over filtered rows: over the twin, over the copy.
BOTH_READS = pytest.mark.parametrize("trips", [True, False], ids=["twin", "copy"],
                                     indirect=True)


def _selection_sql(engine: Engine, query: str) -> tuple[int, str]:
    shape, statement, _ = _statement(engine, query)
    return shape, statement


def _refused(engine: Engine, sql: str, match: str) -> None:
    with pytest.raises(Refused, match=match):
        verify(sql, engine.dialect, engine.statements.outgoing, "noised_by_proxy",
               frozenset({"trips"}))


@BOTH_READS
@pytest.mark.parametrize("query, shape", [(SUM_ALL, STORED), (SUM_FILTERED, COPIED),
                                          (SUM_TODAY, WINDOWED)])
def test_real_selection_statements_pass(trips: Engine, query: str, shape: int) -> None:
    got, sql = _selection_sql(trips, query)
    assert got == shape
    verify(sql, trips.dialect, trips.statements.outgoing, "noised_by_proxy",
           frozenset({"trips"}))


def test_stored_weights_with_another_numerator_are_refused(trips: Engine) -> None:
    _, sql = _selection_sql(trips, SUM_ALL)
    tampered = re.sub(r"CAST\(1 AS (DOUBLE|DOUBLE PRECISION)\) / trips\.__chorus_unit_rows",
                      r"CAST(2 AS \1) / trips.__chorus_unit_rows", sql)
    assert tampered != sql
    _refused(trips, tampered, "without contribution bounding")


def test_window_weights_with_another_numerator_are_refused(trips: Engine) -> None:
    _, sql = _selection_sql(trips, SUM_FILTERED)
    tampered = re.sub(r"CAST\(1 AS (DOUBLE|DOUBLE PRECISION)\) / COUNT",
                      r"CAST(3 AS \1) / COUNT", sql)
    assert tampered != sql
    _refused(trips, tampered, "without contribution bounding")


def test_stored_weights_over_the_base_table_are_refused(trips: Engine) -> None:
    """The stored count is a ranked copy's column: read from the table itself it bounds
    nothing (the verifier does not trust a column's name outside the proxy's copies)."""
    _, sql = _selection_sql(trips, SUM_ALL)
    table = '"main".trips' if trips.dialect == "duckdb" else '"public".trips'
    tampered = re.sub(r'chorus_private\."trips__ranked_\w+"', table, sql)
    assert tampered != sql
    _refused(trips, tampered, "without contribution bounding")


def test_a_row_count_next_to_stored_weights_is_refused(trips: Engine) -> None:
    """Only SUMs of the weights at the barrier: a COUNT there would count rows, unbounded."""
    _, sql = _selection_sql(trips, SUM_ALL)
    tree = sqlglot.parse_one(sql, read=trips.dialect)
    assert isinstance(tree, exp.Select)
    tree.select(exp.alias_(exp.Count(this=exp.Star()), "rows"), copy=False)
    _refused(trips, tree.sql(trips.dialect), "without contribution bounding")


@pytest.mark.parametrize("query", [SUM_ALL, SUM_FILTERED])
@pytest.mark.parametrize("summed", ["k", "n", "m0"])
def test_a_sum_of_anything_but_the_weights_is_refused(trips: Engine, query: str,
                                                      summed: str) -> None:
    """Weights bound what the barrier sums only if it sums them: a SUM of the cell key, of the
    unit's row count or of a clipped magnitude beside them is refused (traced down the
    chain of subqueries to where each summed column is defined)."""
    _, sql = _selection_sql(trips, query)
    tree = sqlglot.parse_one(sql, read=trips.dialect)
    assert isinstance(tree, exp.Select)
    if summed != "k":  # pass the column up to the barrier's source first
        cells = next(s for s in tree.find_all(exp.Select)
                     if any(e.alias_or_name == "wc" for e in s.expressions) and s is not tree
                     and any(e.alias_or_name == "k" for e in s.expressions))
        cells.select(exp.column(summed, table="r"), copy=False)
    tree.select(exp.alias_(exp.Sum(this=exp.column(summed, table="c")), "leak"), copy=False)
    _refused(trips, tree.sql(trips.dialect), "without contribution bounding")


def test_stored_weights_of_another_relation_are_refused(trips: Engine) -> None:
    """The weight must divide by the copy's own count, read by the same SELECT."""
    _, sql = _selection_sql(trips, SUM_ALL)
    tampered = sql.replace("/ trips.__chorus_unit_rows", "/ other.__chorus_unit_rows")
    assert tampered != sql
    _refused(trips, tampered, "without contribution bounding")


@BOTH_READS
@pytest.mark.parametrize("query", [SUM_FILTERED, "SELECT COUNT(*) FROM trips WHERE fare > 3"])
def test_a_window_partitioned_by_more_than_the_unit_is_refused(trips: Engine,
                                                               query: str) -> None:
    """PARTITION BY unit, trip_id ranks (or weighs) each unit's rows per trip: k rows, or a
    weight of 1, per trip, unbounded per unit.  Refused for the selection's weights and for
    the answer's row cap alike (on Postgres the answer's heavy window is partitioned by the
    copy's unit row count and the unit: the trip is added after them; on DuckDB the answer's
    heavy branch is streamed, and its LAG of the run number gets the partition instead)."""
    if query == SUM_FILTERED:
        _, sql = _selection_sql(trips, query)
        release = "noised_by_proxy"
    else:
        sql = trips.explain(query, analyst="alice", epsilon=1.0).rewritten_sql or ""
        release = "noised_in_sql"
    tampered = re.sub(r"PARTITION BY (\w+)\.((?:__chorus_unit_rows, \w+\.)?)rider_id",
                      r"PARTITION BY \1.\2rider_id, \1.trip_id", sql)
    if trips.dialect == "duckdb" and query != SUM_FILTERED and trips.samples.read_twins:
        # rewriters.contribution.streamed_rank over the twin
        assert tampered == sql
        tampered = re.sub(r"LAG\((\w+)\.__chorus_run, (\d+), 0\) OVER \(\)",
                          r"LAG(\1.__chorus_run, \2, 0) OVER (PARTITION BY \1.rider_id, "
                          r"\1.trip_id)", sql)
    assert tampered != sql
    verify(sql, trips.dialect, trips.statements.outgoing, release, frozenset({"trips"}))
    with pytest.raises(Refused, match="without contribution bounding"):
        verify(tampered, trips.dialect, trips.statements.outgoing, release,
               frozenset({"trips"}))


#: Tampered marks (the cap weight, one row per unit), each refused: (query, pattern,
#: replacement), over the windowed mark (ROW_NUMBER, a filter that keeps other rows another
#: day), the least stored rank among a unit's filtered rows (a filtered query over the copy or
#: its twin) or the stored rank 1 (a query without a filter), or all three.
ALL_THREE = (SUM_ALL, SUM_FILTERED, SUM_TODAY)
LEAST = r"(\w+)\.__chorus_rank = MIN\((\w+)\.__chorus_rank\) OVER \(PARTITION BY ([^)]*)\)"
MARK_MUTATIONS = {
    "partitioned by more than the unit": ((SUM_TODAY,),
        r"ROW_NUMBER\(\) OVER \(PARTITION BY (\w+)\.rider_id\)",
        r"ROW_NUMBER() OVER (PARTITION BY \1.rider_id, \1.trip_id)"),
    "least partitioned by more than the unit": ((SUM_FILTERED,), LEAST,
        r"\1.__chorus_rank = MIN(\2.__chorus_rank) OVER (PARTITION BY \3, \1.trip_id)"),
    "least partitioned by another column": ((SUM_FILTERED,), LEAST,
        r"\1.__chorus_rank = MIN(\2.__chorus_rank) OVER (PARTITION BY \1.city)"),
    "a running least": ((SUM_FILTERED,), LEAST,
        r"\1.__chorus_rank = MIN(\2.__chorus_rank) OVER (PARTITION BY \3 ORDER BY \1.fare)"),
    "the least of a column that ties": ((SUM_FILTERED,), LEAST,
        r"\1.fare = MIN(\2.fare) OVER (PARTITION BY \3)"),
    "the least of a column not the rank": ((SUM_FILTERED,), LEAST,
        r"\1.trip_id = MIN(\2.trip_id) OVER (PARTITION BY \3)"),
    "the least rank of another relation": ((SUM_FILTERED,), LEAST,
        r"other.__chorus_rank = MIN(other.__chorus_rank) OVER (PARTITION BY \3)"),
    "the most, not the least, next to the rank": ((SUM_FILTERED,), LEAST,
        r"\1.__chorus_rank = MIN(\2.__chorus_rank) OVER (PARTITION BY \3) + 1"),
    "least of two ranks apart": ((SUM_FILTERED,), LEAST,
        r"\1.__chorus_rank <= MIN(\2.__chorus_rank) OVER (PARTITION BY \3) + 1"),
    "every row marked": (ALL_THREE, r"THEN 1 ELSE 0 END AS wc", r"THEN 1 ELSE 1 END AS wc"),
    "marked twice": ((SUM_ALL, SUM_TODAY), r"= 1 THEN 1 ELSE 0 END AS wc",
                     r"<= 2 THEN 1 ELSE 0 END AS wc"),
    "weighs more than 1": (ALL_THREE, r"THEN 1 ELSE 0 END AS wc", r"THEN 3 ELSE 0 END AS wc"),
    "mark dropped": (ALL_THREE, r"CASE WHEN (?:(?!CASE).)*? THEN 1 ELSE 0 END AS wc", r"1 AS wc"),
    "a number that is not a rank": ((SUM_ALL,), r"CASE WHEN (\w+)\.__chorus_rank = 1",
                                    r"CASE WHEN \1.__chorus_unit_rows = 1"),
    "the rank of another relation": ((SUM_ALL,), r"CASE WHEN (\w+)\.__chorus_rank = 1",
                                     r"CASE WHEN other.__chorus_rank = 1"),
}


@BOTH_READS
@pytest.mark.parametrize("mutation, query", [(name, query)
                                              for name, (queries, *_) in MARK_MUTATIONS.items()
                                              for query in queries])
def test_tampered_marks_are_refused(trips: Engine, mutation: str, query: str) -> None:
    """The cap weight passes only as a mark of one row per unit: a ROW_NUMBER partitioned by
    the unit alone, the copy's own stored rank equal to 1, or equal to its least over the
    unit's whole partition (by the unit, or the copy's own row count then the unit), worth 1,
    else 0."""
    _, pattern, replacement = MARK_MUTATIONS[mutation]
    _, sql = _selection_sql(trips, query)
    tampered = re.sub(pattern, replacement, sql)
    assert tampered != sql
    _refused(trips, tampered, "without contribution bounding")


@BOTH_READS
def test_the_mark_shares_the_unit_counts_window(trips: Engine) -> None:
    """Over filtered rows every window of the choice statement is the same one, partitioned by
    the unit alone, or over the twin by its stored unit row count then the unit (the mark is
    the unit's least stored rank, a MIN over that window, or, over the table, an unordered
    ROW_NUMBER: one WindowAgg on Postgres, not two); Spark gets the ROW_NUMBER ordered by the
    unit (rewriters.dialect), as it refuses ROW_NUMBER without ORDER BY."""
    _, sql = _selection_sql(trips, SUM_FILTERED)
    windows = set(re.findall(r"OVER \(([^)]*)\)", sql))
    twin = trips.samples.read_twins  # presorted: by the stored row count, then the unit
    assert windows == {"PARTITION BY trips.__chorus_unit_rows, trips.rider_id" if twin
                       else "PARTITION BY trips.rider_id"}, windows
    assert len(re.findall(r"MIN\(", sql)) == 1 and "ROW_NUMBER" not in sql
    _, sql = _selection_sql(trips, SUM_TODAY)  # the table's rows: ROW_NUMBER marks
    assert set(re.findall(r"OVER \(([^)]*)\)", sql)) == {"PARTITION BY trips.rider_id"}
    spark = dialect(sqlglot.parse_one(sql, read=trips.dialect), "spark").sql("spark")
    assert "ROW_NUMBER() OVER (PARTITION BY trips.rider_id ORDER BY trips.rider_id)" in spark


def test_marginals_of_remembered_cells_are_derived_once_and_read_only(trips: Engine) -> None:
    """Over the ranked copy the exact cells are remembered by their text, and so are their
    marginals (``Statements.run_stored_as``): derived once per remembered result, shared
    read-only, and every call still counts as rows read (no refund after it)."""
    from chorus_py.statements import QueryRun

    calls = []

    def derive(result: object) -> np.ndarray:
        calls.append(result)
        out = np.arange(3.0)
        out.flags.writeable = False
        return out

    sql = "SELECT COUNT(*) AS n FROM trips"
    runs = [QueryRun(None), QueryRun(None)]
    first = trips.statements.run_stored_as(sql, runs[0], "n", derive)
    again = trips.statements.run_stored_as(sql, runs[1], "n", derive)
    assert first is again and len(calls) == 1 and all(r.touched for r in runs)
    assert trips.statements.run_stored_as(sql, None, "other", derive) is not first
    assert len(calls) == 2  # another derivation of the same result: its own value
    with pytest.raises(ValueError):
        first[0] = 1.0
