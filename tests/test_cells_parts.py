"""The choices' cells statement cut in two parts that run side by side (issue 23, first runs).

``rewriters.selection.choice_histogram``'s ``part`` keeps the units of the ranked copy with at
most K stored rows, or the others; Postgres runs the two parts at once
(``PostgresBackend.run_side_by_side``), a window being one process's work there.  Checked: the
parts' cells add up to the whole statement's (hand-made skewed tables, random K, both
backends, copy and twin), the outgoing verifier passes the parts and still refuses a light
branch read alone or a part that sums anything but weights, the engine sends the parts instead
of the whole on Postgres (and remembers their marginals under the whole's text), and the side
by side runner's failures and cancels reach every part (a real Postgres, real threads).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analyses.outgoing import Refused, verify
from chorus_py.backends.base import SCHEMA, StatementFailed
from chorus_py.backends.cancel import interrupt
from chorus_py.backends.postgres import PostgresBackend
from chorus_py.engine import Engine
from chorus_py.kinds.selection import CELLS, COPIED, cells, histogram_builders, parts
from rewriters.contribution import UNIT_ORDER
from rewriters.dialect import dialect
from tests.test_choice_histogram import LIMIT, random_table

_tables = iter(range(1_000_000))


def _table(scratch: Callable[..., Engine], sizes: list[tuple[int, int]]) -> tuple[Engine, str]:
    """A table of units of the given (rows, seed), its ranked copy and twin built."""
    engine, table, _ = random_table(scratch, sizes, f"parts_t{next(_tables)}")
    engine.warm_up(wait=True)
    return engine, table


def _texts(engine: Engine, sql: str, source: tuple[str, str], middle: int
           ) -> tuple[str, tuple[str, str], tuple[object, ...]]:
    """The whole cells statement of ``sql`` over ``source`` and its two parts at ``middle``."""
    _, prepared = engine.prepare(sql, "alice", epsilon=10.0)
    assert prepared.selection is not None
    detail = prepared.detail

    def text(part: tuple[bool, int] | None) -> str:
        (what, shape, build), = histogram_builders(detail.query, detail.restriction, None,
                                                   one_statement=True, copy=source, part=part)
        assert what == CELLS and shape == COPIED
        return dialect(build(), engine.dialect).sql(engine.dialect)

    pair = (text((False, middle)), text((True, middle)))
    return text(None), pair, parts(prepared.selection.query)[1]


def _copy(engine: Engine, table: str, twin: bool) -> tuple[str, str]:
    copy, = [t for t in engine.backend.owned_tables()
             if t.startswith(f"{table}__ranked_") and not t.endswith(UNIT_ORDER)]
    return SCHEMA, copy + UNIT_ORDER if twin and engine.samples.twin(copy) else copy


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(units=st.lists(st.tuples(st.integers(1, 40), st.integers(0, 10_000)), min_size=1,
                      max_size=7),
       middle=st.integers(0, 42), twin=st.booleans(),
       where=st.sampled_from(["WHERE w > -20", "WHERE person % 3 <> 1",
                              "WHERE id % 4 <> 0 AND (v IS NULL OR v < 55)"]))
def test_the_parts_add_up_to_the_whole(scratch: Callable[..., Engine],
                                       units: list[tuple[int, int]], middle: int, twin: bool,
                                       where: str) -> None:
    """Whatever K (below every unit, between, above every unit: one part then reads no row),
    the parts' cells summed by ``cells`` are the whole statement's marginals: the same
    integers per cap bin, the same weights up to the order of additions."""
    engine, table = _table(scratch, units)
    sql = f"SELECT SUM(v), AVG(w) FROM {table} {where}"
    whole, pair, clipped = _texts(engine, sql, _copy(engine, table, twin), middle)
    for text in pair:  # each part as the verifier sees any statement sent
        verify(text, engine.dialect, engine.statements.outgoing, "noised_by_proxy",
               frozenset({table}))
    expected = cells(engine.statements, None, whole, LIMIT, clipped, stored=False)
    split = cells(engine.statements, None, whole, LIMIT, clipped, stored=False, copied=True,
                  parts=pair)
    assert set(split) == set(expected)
    assert split[("cap",)].tolist() == expected[("cap",)].tolist()
    for what in expected:
        np.testing.assert_allclose(split[what], expected[what], rtol=1e-12, atol=1e-12)


def test_a_light_branch_alone_and_a_part_summing_more_are_refused(
        scratch: Callable[..., Engine]) -> None:
    """The exemption covers only aggregations that sum weights and marks: a part whose barrier
    also sums its cell key, or an answer's light branch read alone, is still refused."""
    engine, table = _table(scratch, [(3, 1), (12, 2), (30, 3)])
    source = _copy(engine, table, twin=True)
    _, (lower, _), _ = _texts(engine, f"SELECT SUM(v) FROM {table} WHERE w > -20", source, 5)
    tampered = lower.replace("SUM(c.wc) AS wc", "SUM(c.wc) AS wc, SUM(c.k) AS kk", 1)
    assert tampered != lower
    with pytest.raises(Refused):
        verify(tampered, engine.dialect, engine.statements.outgoing, "noised_by_proxy",
               frozenset({table}))
    light = (f'SELECT SUM(t.v) AS m0 FROM {source[0]}."{source[1]}" AS t '
             "WHERE t.__chorus_unit_rows <= 5")
    with pytest.raises(Refused, match="without its heavy branch"):
        verify(light, engine.dialect, engine.statements.outgoing, "noised_by_proxy",
               frozenset({table}))


def test_postgres_sends_the_parts_and_remembers_the_whole(scratch: Callable[..., Engine],
                                                          backend_url: str,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """On Postgres a filtered query's cells over the twin run as two parts (at the twin's
    middle stored count), never the whole; their marginals are remembered under the whole's
    text (a second run sends no cells).  On DuckDB, which spreads a window over its threads
    itself, the whole runs."""
    engine, table = _table(scratch, [(2, 1), (4, 2), (9, 3), (15, 4), (40, 5)])
    sent: list[str] = []
    run = engine.backend.run
    monkeypatch.setattr(engine.backend, "run",
                        lambda sql: (sent.append(sql), run(sql))[1])
    sql = f"SELECT SUM(v), AVG(w) FROM {table} WHERE w > -20"
    _, prepared = engine.prepare(sql, "alice", epsilon=10.0)
    assert prepared.selection is not None
    (_, shape, whole), = prepared.selection.histograms
    assert shape == COPIED and UNIT_ORDER in whole
    split = prepared.selection.parts
    if engine.dialect != "postgres":
        assert split == ()
        return
    middle = engine.samples.middle(_copy(engine, table, twin=False)[1])
    assert middle == 40  # the middle row of 70 in stored-count order is one of the 40's
    assert len(split) == 2 and f"__chorus_unit_rows <= {middle}" in split[0] \
        and f"__chorus_unit_rows > {middle}" in split[1]
    for _ in range(2):
        answer = engine.execute(sql, analyst="alice", epsilon=10.0)
        assert answer.rows and answer.report.charged
    cells_sent = [s for s in sent if "SUM(c.wc)" in s and not s.startswith("EXPLAIN")]
    # Both parts once, side by side (in either order); the second run read from memory.
    assert sorted(cells_sent) == sorted(split)
    assert whole not in sent


@pytest.fixture
def postgres_backend(postgres_url: str) -> PostgresBackend:
    backend = PostgresBackend(postgres_url, statement_timeout_s=30)
    yield backend
    backend.close()


@pytest.mark.postgres
def test_side_by_side_gives_each_result_in_order(postgres_backend: PostgresBackend) -> None:
    """Each statement's rows, in the statements' order, the statements at once: each on a
    connection of its own, together in about the time of one."""
    texts = [f"SELECT {i} AS x, pg_backend_pid() AS pid FROM generate_series(1, {i}), "
             "(SELECT pg_sleep(0.5)) AS slept" for i in (3, 1, 2)]
    started = time.monotonic()
    results = postgres_backend.run_side_by_side(texts)
    assert time.monotonic() - started < 1.4  # one after the other: 3 s of sleeps
    assert [[row[0] for row in r.rows] for r in results] == [[3] * 3, [1], [2] * 2]
    assert len({r.rows[0][1] for r in results}) == 3


@pytest.mark.postgres
def test_a_failing_part_cancels_the_others(postgres_backend: PostgresBackend) -> None:
    """A part failing while reading (a division by zero on its rows) stops the others: the
    call ends long before their sleep, with the failure's detail, as having read data."""
    started = time.monotonic()
    with pytest.raises(StatementFailed) as failed:
        postgres_backend.run_side_by_side([
            "SELECT pg_sleep(0.2), 1 / (x - 3) FROM generate_series(1, 5) AS x",
            "SELECT pg_sleep(20)"])
    assert time.monotonic() - started < 10
    assert "division by zero" in failed.value.detail and failed.value.touched_data


@pytest.mark.postgres
@pytest.mark.parametrize("when", [0.3, 1.2])  # during the first part, then while waiting
def test_a_cancel_reaches_every_part(postgres_backend: PostgresBackend, when: float) -> None:
    """A cancel of the calling thread (a client's cancel request, a front door's timeout)
    stops every part, whether it lands while the caller runs its own part or while it waits
    for the others."""
    caller = threading.get_ident()
    timer = threading.Timer(when, lambda: interrupt(caller, "user request"))
    timer.start()
    started = time.monotonic()
    try:
        with pytest.raises(StatementFailed) as failed:
            postgres_backend.run_side_by_side(["SELECT pg_sleep(0.8 * (1 - floor(random())))"
                                               if when > 1 else "SELECT pg_sleep(20)",
                                               "SELECT pg_sleep(20)"])
    finally:
        timer.cancel()
    assert time.monotonic() - started < 10
    assert failed.value.cancelled == "user request"
    # The connections are usable again: nothing of the cancel lingers on them.
    assert [r.rows for r in postgres_backend.run_side_by_side(["SELECT 1", "SELECT 2"])] \
        == [[(1,)], [(2,)]]
