"""Wall 6: charge before touching, never refund after (DESIGN.md section 11).

The attack: with an automatic cap and clipping bounds, a query that failed to plan *after* its
selection histograms ran on the data was refunded, yet the noisy choices made on the data were
stored and reused, so varying a no-op predicate bought fresh private selections for free.  Now
every statement of a query is planned (EXPLAIN) before the claim and before any histogram runs,
a failure after any statement read a row keeps the whole charge, and choices are stored only
once the query was answered.  Also here: an empty list of public keys is valid SQL, the
per-query epsilon floor, and caches kept per analyst.  Every test runs on DuckDB and Postgres.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chorus_py.engine import Engine
from chorus_py.errors import BackendError, InvalidParameter, NotSupportedError, QueryRefused
from chorus_py.policy import load_policy
from chorus_py.statements import QueryRun
from tests.conftest import nothing_spent
from tests.test_sampling import P_VISITS

ALICE = {"analyst": "alice"}
CITIES = ["SF", "NYC", "LA", "CHI", "SEA"]
PROPERTY = settings(max_examples=15, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])

# Outputs that pass the analysis but that the database cannot plan: each fails only in the
# final statement (the selection histograms never compute them).
BROKEN = ["LOWER(COUNT(*))", "UPPER(SUM(fare))", "LENGTH(AVG(fare))", "LOWER(SUM(distance_km))"]
# Aggregates beside them, so the query has a cap and clipping bounds to choose.
AGGREGATES = ["SUM(fare)", "COUNT(*)", "AVG(distance_km)", "SUM(fare), SUM(distance_km)"]


@pytest.fixture
def auto(backend_url: str, write_policy: Callable[..., Path]) -> Iterator[Callable[..., Engine]]:
    """Engines on the test trips with contribution and clipping "auto" and choice reuse on."""
    engines: list[Engine] = []

    def make(noise: str = "sql", extra_privacy: str = "", reuse: float = 600,
             bob_max: float = 0.5) -> Engine:
        path = write_policy(backend_url, noise=noise, k=20, contribution="auto")
        text = path.read_text().replace(
            "max_delta_per_query = 1e-4",
            f"max_delta_per_query = 1e-4\nchoice_reuse_seconds = {reuse}\n" + extra_privacy
        ).replace("[analysts.bob]\nmax_epsilon_per_query = 0.5",
                  f"[analysts.bob]\nmax_epsilon_per_query = {bob_max}")
        path.write_text(text)
        engine = Engine(load_policy(path))
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()


class _Statements:
    """Every statement the engine sends to its backend (a pass-through spy on the real one)."""

    def __init__(self, engine: Engine, monkeypatch: pytest.MonkeyPatch,
                 before: Callable[[str], None] | None = None) -> None:
        # The block windows (public metadata, read by the block catalog, cached for a minute)
        # are read first, so the spy sees only the statements of queries.
        engine.explain("SELECT COUNT(*) FROM trips", epsilon=1.0, **ALICE)
        self.sent: list[str] = []
        real, real_integers = engine.backend.run, engine.backend.run_integers
        real_constant = engine.statements.run_constant
        constant = False  # inside the totality analysis' constant checks: they read no table
        # Inside run_integers, whose default reads the rows through run: one statement, once.
        integers = False

        def sent(sql: str) -> None:
            if not constant and not integers:
                self.sent.append(sql)
                if before is not None:
                    before(sql)

        def run(sql: str) -> Any:
            sent(sql)
            return real(sql)

        def run_integers(sql: str) -> Any:  # histograms, column by column
            nonlocal integers
            sent(sql)
            integers = True
            try:
                return real_integers(sql)
            finally:
                integers = False

        def run_constant(sql: str) -> bool:
            nonlocal constant
            constant = True
            try:
                return real_constant(sql)
            finally:
                constant = False

        monkeypatch.setattr(engine.backend, "run", run)
        monkeypatch.setattr(engine.backend, "run_integers", run_integers)
        monkeypatch.setattr(engine.statements, "run_constant", run_constant)

    def reading(self) -> list[str]:
        """The statements that could read a row (everything but EXPLAIN)."""
        return [s for s in self.sent if not s.startswith("EXPLAIN ")]


def _rename_what_it_reads(engine: Engine, statement: str) -> str:
    """Rename the relation ``statement`` reads (the table, or its ranked copy) away, as its
    owner might: the statement then fails before it reads a row.  Returns the old name."""
    copy = re.search(r'chorus_private\."(trips__ranked_\w+)"', statement)
    name = f'chorus_private."{copy.group(1)}"' if copy else "trips"
    engine.backend.run_owned([f"ALTER TABLE {name} RENAME TO trips_away"])
    return name


def _rename_back(engine: Engine, names: list[str]) -> None:
    for name in names:
        away = "chorus_private.trips_away" if name != "trips" else "trips_away"
        engine.backend.run_owned([f"ALTER TABLE {away} RENAME TO {name.split('.')[-1]}"])


def _no_choices(engine: Engine, sql: str) -> bool:
    """Nothing in the choice cache, and EXPLAIN would choose afresh (no "reused" step)."""
    report = engine.explain(sql, epsilon=1.0, **ALICE)
    steps = report.contribution.steps if report.contribution is not None else ()
    return not engine.choices._items and all(s.mechanism != "reused" for s in steps)


# -- the attack: a query that cannot plan, after its histograms would have run ------------------
@pytest.mark.parametrize("noise", ["sql", "proxy"])
@pytest.mark.parametrize("sql", [
    "SELECT LOWER(COUNT(*)) AS c, SUM(fare) FROM trips WHERE fare > 10",
    "SELECT LOWER(COUNT(*)) AS c, SUM(fare) FROM trips WHERE fare > 10 AND 1 = 1",
    "SELECT city, UPPER(SUM(fare)) FROM trips GROUP BY city",
])
def test_a_query_that_cannot_plan_is_refused_before_anything_touches_the_data(
        auto: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch, noise: str,
        sql: str) -> None:
    engine = auto(noise)
    statements = _Statements(engine, monkeypatch)
    for _ in range(2):  # asked again: still refused, still free
        with pytest.raises(QueryRefused, match="nothing was charged"):
            engine.execute(sql, epsilon=1.0, **ALICE)
    assert statements.reading() == []  # no histogram, no final statement: only EXPLAIN
    assert nothing_spent(engine)
    assert _no_choices(engine, sql)


@PROPERTY
@given(broken=st.sampled_from(BROKEN), aggregates=st.sampled_from(AGGREGATES),
       threshold=st.integers(0, 150), where=st.sampled_from(["fare > {n}", "distance_km < {n}",
                                                             "fare > {n} OR fare <= {n}"]))
def test_the_class_is_refused_free_whatever_the_no_op_predicate(
        auto: Callable[..., Engine], broken: str, aggregates: str, threshold: int,
        where: str) -> None:
    engine = auto()
    sql = f"SELECT {broken} AS x, {aggregates} FROM trips WHERE {where.format(n=threshold)}"
    with pytest.raises(QueryRefused, match="nothing was charged"):
        engine.execute(sql, epsilon=1.0, **ALICE)
    assert nothing_spent(engine)
    assert _no_choices(engine, sql)


def test_plans_are_checked_once_per_query_shape(auto: Callable[..., Engine],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    engine = auto(reuse=0)  # every query chooses afresh: the same statements each time
    statements = _Statements(engine, monkeypatch)
    sql = "SELECT COUNT(*), SUM(fare) FROM trips WHERE fare > 10"
    engine.execute(sql, epsilon=0.5, **ALICE)
    planned = [s for s in statements.sent if s.startswith("EXPLAIN ")]
    # The final statement at the limit cap and declared bounds, and every histogram.
    assert len(planned) == len(statements.reading()) >= 2
    for analyst in ("alice", "bob"):
        engine.execute(sql, epsilon=0.5, analyst=analyst)
    assert [s for s in statements.sent if s.startswith("EXPLAIN ")] == planned


# -- no refund once a statement read a row -------------------------------------------------------
def test_a_failure_after_a_statement_read_rows_is_never_refunded(engine: Engine) -> None:
    """The structure itself: a QueryRun that saw a statement read rows refunds nothing, even
    when a later statement fails before reading (a plan error)."""
    engine.ledger.ensure_blocks(["b"])
    claim = engine.ledger.claim("alice", ["b"], 0.5, 0.0, consume_on_grant=True)
    run = QueryRun(claim)
    engine.statements.run("SELECT COUNT(*) FROM trips", run)  # a histogram, say: it read the data
    with pytest.raises(BackendError, match="charged"):
        engine.statements.run("SELECT no_such_column FROM trips", run)
    assert claim.state == "consumed"
    assert engine.ledger.blocks()[0].epsilon_consumed == 0.5
    assert all(e["event"] != "claim_refunded" for e in engine.ledger.history())


def test_a_run_time_failure_after_the_histograms_keeps_the_whole_charge(
        auto: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch) -> None:
    """The final statement fails when it runs, after the histograms read the data: the table
    is renamed by its owner in between, so the failure comes before the statement reads a row
    (a catalog error, which was refunded before) and depends on no data value."""
    engine = auto()
    sql = "SELECT COUNT(*), SUM(fare) FROM trips WHERE fare > 10"
    renamed: list[bool] = []

    def rename_before_the_final_statement(statement: str) -> None:
        histograms = set(engine.single._histograms._items.values())
        if not statement.startswith("EXPLAIN ") and statement not in histograms and not renamed:
            renamed.append(_rename_what_it_reads(engine, statement))

    statements = _Statements(engine, monkeypatch, rename_before_the_final_statement)
    try:
        with pytest.raises(BackendError, match="charged"):
            engine.execute(sql, epsilon=1.0, **ALICE)
    finally:
        _rename_back(engine, renamed)
    assert renamed and len(statements.reading()) >= 2  # histograms, then the final statement
    # The whole epsilon (selection and answer) stays charged on every block it claimed.
    (claim,) = engine.ledger.claims()
    assert claim.state == "consumed"
    consumed = {b.block_id: b.epsilon_consumed for b in engine.ledger.blocks()}
    assert set(consumed) == set(claim.blocks)
    assert all(v == pytest.approx(1.0) for v in consumed.values())
    assert all(e["event"] != "claim_refunded" for e in engine.ledger.history())
    # The choices made on the data were not kept: the next identical query chooses afresh.
    monkeypatch.undo()
    assert _no_choices(engine, sql)


def test_choices_made_on_remembered_histograms_keep_the_whole_charge(
        auto: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch) -> None:
    """An unfiltered query's selection histograms over the ranked copy are remembered by the
    proxy (Statements.run_stored): the second run reads no row before its final statement, yet
    its choices were made on the data, so that statement failing keeps the whole charge."""
    engine = auto(reuse=0)  # no choice reuse: the second run chooses again
    sql = "SELECT COUNT(*), SUM(fare) FROM trips"
    engine.execute(sql, epsilon=1.0, **ALICE)
    renamed: list[str] = []

    def rename_before_the_final_statement(statement: str) -> None:
        if not statement.startswith("EXPLAIN ") and "__ranked_" in statement and not renamed:
            renamed.append(_rename_what_it_reads(engine, statement))

    statements = _Statements(engine, monkeypatch, rename_before_the_final_statement)
    before = {b.block_id: b.epsilon_consumed for b in engine.ledger.blocks()}
    try:
        with pytest.raises(BackendError, match="charged"):
            engine.execute(sql, epsilon=1.0, **ALICE)
    finally:
        _rename_back(engine, renamed)
    assert len(statements.reading()) == 1  # the final statement only: histograms remembered
    claim = engine.ledger.claims()[-1]
    assert claim.state == "consumed"
    after = {b.block_id: b.epsilon_consumed for b in engine.ledger.blocks()}
    assert all(after[b] - before[b] == pytest.approx(1.0) for b in claim.blocks)
    assert all(e["event"] != "claim_refunded" for e in engine.ledger.history())


# -- an empty list of public keys ----------------------------------------------------------------
def _keys_kept(values: list[str]) -> set[str]:
    return {v for v in CITIES if v in values}


@PROPERTY
@given(kept=st.lists(st.sampled_from(CITIES), unique=True, max_size=5),
       undeclared=st.lists(st.sampled_from(["ZZZ", "sf", "Paris"]), unique=True, max_size=2),
       form=st.sampled_from(["in", "eq"]), noise=st.sampled_from(["sql", "proxy"]))
def test_a_where_leaving_zero_one_or_all_public_keys_answers_exactly_those_groups(
        make_engine: Callable[..., Engine], backend_url: str, kept: list[str],
        undeclared: list[str], form: str, noise: str) -> None:
    values = kept + undeclared
    if not values or (form == "eq" and len(values) != 1):
        values = values[:1] or ["ZZZ"]
        form = "eq"
    where = f"city = '{values[0]}'" if form == "eq" else \
        "city IN (" + ", ".join(f"'{v}'" for v in values) + ")"
    engine = make_engine(backend_url, noise=noise)
    grouped = engine.execute(f"SELECT city, COUNT(*) AS n, SUM(fare) AS s FROM trips "
                             f"WHERE {where} GROUP BY city", epsilon=1.0, **ALICE)
    # One row per declared value the WHERE keeps (none: an empty answer), noisy, charged.
    assert {row[0] for row in grouped.rows} == _keys_kept(values)
    assert len(grouped.rows) == len(_keys_kept(values))
    assert grouped.report.charged
    # Thresholded (driver_id has no public values): only kept cities can appear.
    gated = engine.execute(f"SELECT city, driver_id, COUNT(*) FROM trips WHERE {where} "
                           "GROUP BY city, driver_id", epsilon=1.0, delta=1e-6, **ALICE)
    assert {row[0] for row in gated.rows} <= _keys_kept(values)
    # A join with a public table keyed by the same column.
    joined = engine.execute(f"SELECT t.city, COUNT(*) FROM trips t JOIN cities c "
                            f"ON t.city = c.city WHERE t.{where} GROUP BY t.city",
                            epsilon=1.0, **ALICE)
    assert {row[0] for row in joined.rows} == _keys_kept(values)


@pytest.mark.parametrize("noise", ["sql", "proxy"])
def test_no_public_key_left_with_automatic_choices(auto: Callable[..., Engine],
                                                   noise: str) -> None:
    """The second instance of the attack: `(VALUES )` was invalid SQL after the histograms."""
    engine = auto(noise)
    sql = "SELECT city, COUNT(*), SUM(fare) FROM trips WHERE city = 'ZZZ' GROUP BY city"
    result = engine.execute(sql, epsilon=1.0, **ALICE)
    assert result.rows == [] and result.report.charged
    assert "(VALUES )" not in (result.report.rewritten_sql or "")


# -- the per-query epsilon floor -----------------------------------------------------------------
def test_epsilon_below_the_floor_is_refused_on_every_path(make_engine: Callable[..., Engine],
                                                          backend_url: str) -> None:
    engine = make_engine(backend_url, extra=P_VISITS)
    for call, kwargs in ((engine.execute, {}), (engine.explain, {}),
                         (engine.execute, {"sensitivity": "sampled"}),
                         (engine.explain, {"sensitivity": "sampled"})):
        sql = "SELECT MEDIAN(seconds) FROM visits" if kwargs else "SELECT COUNT(*) FROM trips"
        with pytest.raises(InvalidParameter, match="min_epsilon_per_query") as info:
            call(sql, epsilon=1e-12, **ALICE, **kwargs)
        assert "0.001" in str(info.value)
    assert nothing_spent(engine)
    # At the floor itself the query is answered (and charged).
    assert engine.execute("SELECT COUNT(*) FROM trips", epsilon=0.001, **ALICE).report.charged


# -- caches kept per analyst ---------------------------------------------------------------------
def test_choices_are_reused_only_by_the_analyst_who_paid_for_them(
        auto: Callable[..., Engine]) -> None:
    # A larger epsilon and selection share: the choices rest on evidence, so they are kept for
    # reuse (a noise-dominated choice is not: tests/test_caps.py).
    engine = auto(extra_privacy="cap_epsilon_share = 0.5\n", bob_max=500)
    sql = "SELECT AVG(fare) FROM trips WHERE fare < 40"
    first = engine.execute(sql, epsilon=3.0, **ALICE).report.contribution
    assert first is not None and first.epsilon > 0
    # Bob's EXPLAIN and query do not show alice's choices as "reused": they choose afresh.
    explained = engine.explain(sql, epsilon=3.0, analyst="bob").contribution
    assert explained is not None and "reused" not in explained.note
    bob = engine.execute(sql, epsilon=3.0, analyst="bob").report.contribution
    assert bob is not None and bob.epsilon > 0 and "reused" not in bob.note
    assert all(s.mechanism != "reused" for s in bob.steps)
    # Alice's second query reuses hers, and says they were hers.
    again = engine.execute(sql, epsilon=3.0, **ALICE).report.contribution
    assert again is not None and again.epsilon == 0 and "your identical earlier query" in \
        again.note


def test_answers_are_served_again_only_to_the_analyst_who_paid(
        auto: Callable[..., Engine]) -> None:
    engine = auto(extra_privacy="answer_cache_seconds = 600\n")
    sql = "SELECT COUNT(*) FROM trips"
    first = engine.execute(sql, epsilon=0.5, **ALICE)
    bob = engine.execute(sql, epsilon=0.5, analyst="bob")
    assert bob.report.charged and not any("earlier" in n for n in bob.report.notes)
    again = engine.execute(sql, epsilon=0.5, **ALICE)
    assert not again.report.charged and again.rows == first.rows
    assert any("your earlier identical query" in n for n in again.report.notes)


def test_a_mixed_query_whose_second_part_fails_keeps_the_whole_charge(
        engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """A query of quantiles and other aggregates (chorus_py.kinds.mixed) runs its quantile
    histogram, then its analytic statement, under one claim: the table renamed in between, the
    second fails after the first read the data, so nothing is refunded."""
    sql = "SELECT city, MEDIAN(fare), COUNT(*) FROM trips GROUP BY city"
    _, prepared = engine.prepare(sql, epsilon=1.0, **ALICE)
    histograms = set(prepared.detail.quantile.statements)
    renamed: list[str] = []
    ran: list[str] = []

    def rename_after_the_histogram(statement: str) -> None:
        if statement.startswith("EXPLAIN "):
            return
        if ran and not renamed:
            renamed.append(_rename_what_it_reads(engine, statement))
        if statement in histograms:
            ran.append(statement)

    _Statements(engine, monkeypatch, rename_after_the_histogram)
    try:
        with pytest.raises(BackendError, match="charged"):
            engine.execute(sql, epsilon=1.0, **ALICE)
    finally:
        _rename_back(engine, renamed)
    assert ran and renamed
    (claim,) = engine.ledger.claims()
    assert claim.state == "consumed"
    assert all(b.epsilon_consumed == pytest.approx(1.0) for b in engine.ledger.blocks()
               if b.block_id in claim.blocks)
    assert all(e["event"] != "claim_refunded" for e in engine.ledger.history())


def test_a_refused_mixed_query_costs_nothing(engine: Engine) -> None:
    for sql in ("SELECT MAX(fare) - AVG(MIN(fare)) FROM trips",
                "SELECT city, MEDIAN(fare) FROM trips GROUP BY city "
                "HAVING SUM(COUNT(*)) OVER () > 1"):
        with pytest.raises(NotSupportedError):
            engine.execute(sql, epsilon=1.0, **ALICE)
    assert nothing_spent(engine)
