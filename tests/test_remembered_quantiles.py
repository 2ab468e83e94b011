"""A quantile's exact histograms over the ranked copy are remembered by their text (issue 23).

A histogram statement that reads only the ranked copy and its twins (``kinds.selection.
remembers``) computes a function of relations that never change under their names: the
proxy keeps its exact cells (``Statements.run_remembered``) and draws every later answer
afresh from them, as the selection's histograms already were.  Checked on both backends: a
repeated quantile sends no histogram again, yet every answer is a fresh draw and pays its whole
charge; what reads the table itself (the units gate, a query before its copy exists) or
depends on the moment (CURRENT_DATE) or a draw (RANDOM()) is run every time; the remembered
cells are read only and counted as rows read; the cache is bounded by bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlglot import parse_one

from chorus_py.backends import SCHEMA
from chorus_py.caches import WeightedLRU
from chorus_py.engine import Engine
from chorus_py.kinds.quantile import QuantileDetail, _GatedRows
from chorus_py.kinds.selection import remembers
from chorus_py.policy import load_policy
from chorus_py.statements import QueryRun
from mechanisms.joint_quantiles import JointQuantiles
from rewriters.bins import BINS

ALICE = {"analyst": "alice"}
COPY = (SCHEMA, "trips__ranked_0123abcd")


class _Sent:
    """The statements the engine sends to its backend (a pass-through spy)."""

    def __init__(self, engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
        self.texts: list[str] = []
        backend = engine.backend
        for name in ("run", "run_integers"):
            real = getattr(backend, name)

            def spy(sql: str, *args: object, _real: Callable[..., object] = real,
                    **kwargs: object) -> object:
                self.texts.append(sql)
                return _real(sql, *args, **kwargs)

            monkeypatch.setattr(backend, name, spy)

    def histograms(self) -> list[str]:
        """The quantile histograms sent (they group by the bins, read from the copy)."""
        return [t for t in self.texts if "__ranked_" in t and not t.startswith("EXPLAIN")]


def _detail(engine: Engine, sql: str) -> QuantileDetail:
    _, prepared = engine.prepare(sql, "alice", epsilon=1.0)
    detail = prepared.detail
    assert isinstance(detail, QuantileDetail)
    return detail


def _consumed(engine: Engine) -> float:
    return sum(b.epsilon_consumed for b in engine.ledger.blocks())


QUERIES = [
    "SELECT MEDIAN(fare) FROM trips",
    "SELECT MAX(distance_km) FROM trips WHERE city = 'LA'",
    "SELECT city, PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY fare) AS p90 FROM trips "
    "GROUP BY city",
    "SELECT MIN(fare), MAX(fare) FROM trips WHERE fare > 5",
]


@pytest.mark.parametrize("sql", QUERIES)
def test_a_repeated_quantile_draws_afresh_from_remembered_histograms(
        make_engine: Callable[..., Engine], backend_url: str, sql: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    engine = make_engine(backend_url, k=5)
    detail = _detail(engine, sql)
    # Every histogram reads the ranked copy only: remembered, and its text names the copy (a
    # new version of the table is a new copy, so a new text: never a stale result).
    assert detail.remembered == {s for _, s in detail.histograms}
    assert all("__ranked_" in s for s in detail.remembered)
    first = engine.execute(sql, epsilon=1.0, **ALICE)
    sent = _Sent(engine, monkeypatch)
    answers, charged = [], []
    for _ in range(6):
        before = _consumed(engine)
        result = engine.execute(sql, epsilon=1.0, **ALICE)
        charged.append(_consumed(engine) - before)
        answers.append(result.rows)
    assert sent.histograms() == []  # nothing sent again: the cells came from memory
    # Each answer is its own draw (a value uniform in a drawn bin: never twice the same)...
    assert len({repr(rows) for rows in [first.rows, *answers]}) == 7
    # ...and each pays the whole charge on every block it reads.
    assert all(c == pytest.approx(charged[0]) and c > 0 for c in charged)
    assert len(first.rows) == len(answers[0])


def test_remembered_draws_follow_the_same_distribution(make_engine: Callable[..., Engine],
                                                      backend_url: str) -> None:
    """The remembered cells are the exact cells: drawn from many times, the median lands
    where the data's is (the test trips' fares), as fresh histograms' draws do."""
    engine = make_engine(backend_url, k=5)
    sql = "SELECT MEDIAN(fare) FROM trips"
    truth = engine.backend.run(
        "SELECT PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY fare) FROM trips").rows[0][0]
    draws = [engine.execute(sql, epsilon=5.0, **ALICE).rows[0][0] for _ in range(30)]
    assert len(set(draws)) == 30
    assert abs(float(np.median(draws)) - float(truth)) < 0.1 * float(truth) + 1


def test_what_draws_or_reads_the_table_is_run_every_time(make_engine: Callable[..., Engine],
                                                         backend_url: str,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """Keys without public values under an automatic cap: the units gate's statement (when
    the groups per unit are bounded below the cap) ranks the table's own rows, and the heavy
    units' groups are chosen by RANDOM(): such statements are never remembered and run again
    on every query; the others are read from memory."""
    engine = make_engine(backend_url, k=20, contribution="auto")
    sql = "SELECT driver_id, MEDIAN(fare) FROM trips GROUP BY driver_id"
    # Epsilon 20: histograms far above their noise, so the first run's choices are reused
    # (at epsilon 1 a choice dominated by noise was made again by the second run, whose
    # statements then differed from the prepared ones: a failure once in a while).
    engine.execute(sql, epsilon=20.0, delta=1e-6, **ALICE)
    _, prepared = engine.prepare(sql, "alice", epsilon=20.0, delta=1e-6)  # the choices reused
    detail = prepared.detail
    assert isinstance(detail, QuantileDetail)
    assert detail.gate_sql is None or detail.gate_sql not in detail.remembered
    assert not any("RANDOM()" in s for s in detail.remembered)
    statements = [s for _, s in detail.histograms] + [detail.gate_sql or ""]
    again = {s for s in statements if s and s not in detail.remembered}
    sent = _Sent(engine, monkeypatch)
    engine.execute(sql, epsilon=20.0, delta=1e-6, **ALICE)
    assert {s for s in sent.texts if s in statements} == again


def test_a_filter_of_the_moment_is_run_every_time(make_engine: Callable[..., Engine],
                                                  backend_url: str) -> None:
    """CURRENT_DATE keeps other rows tomorrow: such a histogram is never remembered."""
    engine = make_engine(backend_url, k=5)
    detail = _detail(engine, "SELECT MEDIAN(fare) FROM trips "
                             "WHERE pickup_time < CURRENT_DATE")
    assert detail.histograms and detail.remembered == frozenset()


def test_without_the_ranked_copy_nothing_is_remembered(write_policy: Callable[..., Path],
                                                       backend_url: str) -> None:
    """Materialized bounding reads its bounded sample, not the ranked copy: its histograms
    run every time."""
    path = write_policy(backend_url, k=5)
    path.write_text(path.read_text().replace("ranked_copy = true",
                                             'bounding = "materialized"'))
    engine = Engine(load_policy(path))
    try:
        engine.warm_up(wait=True)
        detail = _detail(engine, "SELECT MEDIAN(fare) FROM trips")
        assert detail.histograms and detail.remembered == frozenset()
    finally:
        engine.close()


@pytest.mark.parametrize("statement, kept", [
    (f'SELECT b, COUNT(*) FROM {COPY[0]}."{COPY[1]}" AS t GROUP BY b', True),
    (f'SELECT b, COUNT(*) FROM {COPY[0]}."{COPY[1]}_u" AS t GROUP BY b', True),
    (f'WITH w AS (SELECT * FROM {COPY[0]}."{COPY[1]}") SELECT COUNT(*) FROM w', True),
    (f'SELECT COUNT(*) FROM {COPY[0]}."{COPY[1]}" AS a JOIN {COPY[0]}."{COPY[1]}_u" AS b '
     "ON a.x = b.x", True),
    ("SELECT b, COUNT(*) FROM trips GROUP BY b", False),
    (f'SELECT COUNT(*) FROM {COPY[0]}."{COPY[1]}" AS a JOIN cities AS c ON a.x = c.x', False),
    (f'SELECT COUNT(*) FROM {COPY[0]}."trips__ranked_ffffffff"', False),
    (f'SELECT COUNT(*) FROM other."{COPY[1]}"', False),
    (f'SELECT COUNT(*) FROM {COPY[0]}."{COPY[1]}" WHERE t < CURRENT_DATE', False),
    (f'SELECT COUNT(*) FROM {COPY[0]}."{COPY[1]}" WHERE t < CURRENT_TIMESTAMP', False),
    (f'SELECT SUM(RANDOM()) FROM {COPY[0]}."{COPY[1]}"', False),
    (f'SELECT COUNT(*) FROM {COPY[0]}."{COPY[1]}" WHERE x IN (SELECT x FROM trips)', False),
    ("SELECT COUNT(*) FROM range(10)", False),
])
def test_remembered_only_over_the_copy_and_its_twins(statement: str, kept: bool) -> None:
    assert remembers(parse_one(statement, read="duckdb"), COPY) is kept
    assert remembers(parse_one(statement, read="duckdb"), None) is False


def test_a_remembered_result_counts_as_rows_read(make_engine: Callable[..., Engine],
                                                 backend_url: str) -> None:
    """Read from memory, a histogram still counts as rows read: no later failure of the
    query refunds it (Wall 6), as with the selection's remembered histograms."""
    engine = make_engine(backend_url, k=5)
    detail = _detail(engine, "SELECT MEDIAN(fare) FROM trips")
    ((_, sql),) = detail.histograms
    runs = [QueryRun(None), QueryRun(None)]

    def derive(columns: tuple[np.ndarray, ...]) -> int:
        return int(columns[-1].sum())

    first = engine.statements.run_remembered(sql, runs[0], "n", derive, integers=True)
    again = engine.statements.run_remembered(sql, runs[1], "n", derive, integers=True)
    assert first == again > 0 and all(r.touched for r in runs)


def test_remembered_cells_are_read_only(make_engine: Callable[..., Engine],
                                        backend_url: str, monkeypatch: pytest.MonkeyPatch
                                        ) -> None:
    engine = make_engine(backend_url, k=5)
    sql = "SELECT city, MEDIAN(fare) FROM trips GROUP BY city"
    kept: list[object] = []
    real = engine.statements.run_remembered

    def spy(*args: object, **kwargs: object) -> object:
        value = real(*args, **kwargs)  # type: ignore[arg-type]
        kept.append(value)
        return value

    monkeypatch.setattr(engine.statements, "run_remembered", spy)
    engine.execute(sql, epsilon=1.0, **ALICE)
    engine.execute(sql, epsilon=1.0, **ALICE)
    assert len(kept) == 2 and kept[0] is kept[1]
    cells = kept[0]
    assert isinstance(cells, np.ndarray) and cells.shape[0] == 5
    with pytest.raises(ValueError):
        cells[0, 0] = 1.0


def test_weighted_lru_keeps_at_most_its_limit() -> None:
    cache: WeightedLRU[str, str] = WeightedLRU(100)
    cache.put("a", "A", 40)
    cache.put("b", "B", 40)
    assert cache.get("a") == "A"  # a is now the most recently used
    cache.put("c", "C", 40)  # 120 > 100: the least recently used (b) goes
    assert cache.get("b") is None and cache.get("a") == "A" and cache.get("c") == "C"
    assert cache.weight == 80 and len(cache) == 2
    cache.put("a", "A2", 10)  # replacing a value replaces its weight
    assert cache.weight == 50 and cache.get("a") == "A2"
    cache.put("huge", "H", 101)  # heavier than the limit alone: not kept, nothing dropped
    assert cache.get("huge") is None and cache.weight == 50 and len(cache) == 2
    cache.put("d", "D", 100)  # fills it: everything else goes
    assert len(cache) == 1 and cache.weight == 100 and cache.get("d") == "D"


def test_joint_tables_of_a_remembered_histogram_are_computed_once(
        make_engine: Callable[..., Engine], backend_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """MIN and MAX of one column are drawn jointly; the joint mechanism's tables are a function
    of the counts alone, so over a remembered histogram they are computed once per group and
    every later query draws afresh from them: the same tables a fresh computation gives."""
    engine = make_engine(backend_url, k=5)
    computed: list[tuple[JointQuantiles, np.ndarray]] = []
    real = JointQuantiles.tables

    def counting(self: JointQuantiles, counts: np.ndarray) -> tuple[object, ...]:
        computed.append((self, np.array(counts)))
        return real(self, counts)

    monkeypatch.setattr(JointQuantiles, "tables", counting)
    sql = "SELECT city, MIN(fare), MAX(fare) FROM trips GROUP BY city"
    answers = [engine.execute(sql, epsilon=1.0, **ALICE).rows for _ in range(4)]
    assert len(computed) == 5  # one per city, on the first run only
    assert len({repr(a) for a in answers}) == 4  # fresh draws every time
    mechanism, counts = computed[0]
    kept = engine.quantile._tables
    assert len(kept) == 5
    # The tables kept for the first city are those a fresh computation gives.
    first = [k for k in kept._items if k[0] == mechanism and k[2] == 0]
    hit = kept.get(first[0])
    assert hit is not None
    c, g, forward = hit[1]
    c2, g2, forward2 = real(mechanism, counts)
    assert np.array_equal(c, c2) and np.array_equal(g, g2)
    assert all(np.array_equal(a, b) for a, b in zip(forward, forward2, strict=True))
    with pytest.raises(ValueError):  # shared by later draws: read only
        forward[0][0] = 0.0


def test_joint_sample_with_given_tables_is_the_same_mechanism() -> None:
    """``JointQuantiles.sample(counts, tables)`` draws from the tables it is given, which are
    ``tables(counts)``: the probabilities of every cut pair are the same either way."""
    mechanism = JointQuantiles(1.0, 2, (0.01, 0.99), 20)
    counts = np.array([0, 3, 5, 1, 0, 0, 7, 2, 2, 9, 0, 1, 4, 4, 0, 0, 2, 1, 0, 5], float)
    tables = mechanism.tables(counts)
    draws = [mechanism.sample(counts, tables) for _ in range(300)]
    assert all(0 <= a <= b <= 20 for a, b in draws)
    # The most likely pair under log_probability (which recomputes the tables) is drawn often.
    pairs = [(a, b) for a in range(21) for b in range(a, 21)]
    best = max(pairs, key=lambda p: mechanism.log_probability(counts, p))
    expected = np.exp(mechanism.log_probability(counts, best))
    assert abs(draws.count(best) / 300 - expected) < 5 * np.sqrt(expected / 300) + 0.02


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.tuples(st.one_of(st.none(), st.integers(0, 4)),
                               st.one_of(st.none(), st.sampled_from(["a", "b"])),
                               st.integers(0, BINS - 1), st.integers(1, 50)), max_size=60))
def test_gated_rows_read_column_wise_are_the_rows_counted_by_hand(
        rows: list[tuple[int | None, str | None, int, int]]) -> None:
    """A thresholded histogram's rows (two keys, bin, count) read column-wise: the groups in
    order of first appearance, a NULL key no group, each group's total and dense cells those
    of a loop over the rows; read only."""
    gated = _GatedRows.of(rows, 2)
    expected: dict[tuple[object, ...], np.ndarray] = {}
    for a, b, cell, n in rows:
        if a is None or b is None:
            continue
        expected.setdefault((a, b), np.zeros(BINS))[cell] += n
    assert list(gated.groups) == list(expected)
    assert np.array_equal(gated.totals(), [v.sum() for v in expected.values()])
    for group, dense in expected.items():
        assert np.array_equal(gated.dense(group), dense)
    assert not gated.dense((9, "z")).any()  # a group without rows here: zeros
    with pytest.raises(ValueError):
        gated.counts[:1] = 0.0


def test_remembered_values_are_weighed_by_what_they_hold() -> None:
    """The remembered values are bounded by their bytes: arrays by theirs, mappings,
    sequences and dataclasses (a thresholded histogram's rows) by what they hold."""
    from chorus_py.statements import _footprint

    cells = np.zeros((5, BINS))
    assert _footprint(cells) >= cells.nbytes
    rows = [(d, b, 1) for d in range(1000) for b in range(50)]
    gated = _GatedRows.of(rows, 1)
    assert _footprint(gated) >= gated.bins.nbytes + gated.counts.nbytes + 1000 * 8
    assert _footprint({"cap": cells}) >= cells.nbytes


def test_joint_tables_of_a_histogram_run_for_one_query_are_not_kept(
        make_engine: Callable[..., Engine], backend_url: str) -> None:
    """A histogram that is not remembered (a filter on CURRENT_DATE) gets its joint tables
    afresh every query: none are kept for an array the next query will not see."""
    engine = make_engine(backend_url, k=5)
    sql = "SELECT MIN(fare), MAX(fare) FROM trips WHERE pickup_time < CURRENT_DATE"
    for _ in range(2):
        engine.execute(sql, epsilon=1.0, **ALICE)
    assert len(engine.quantile._tables) == 0
