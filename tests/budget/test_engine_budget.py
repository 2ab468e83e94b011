"""The engine's use of the ledger: events, Rényi and DPF policies, reports, id-range blocks."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest

from chorus_py.engine import Engine
from chorus_py.errors import BudgetExhausted, InvalidParameter
from chorus_py.policy import load_policy
from mechanisms import DiscreteLaplace
from mechanisms.rdp import discrete_laplace_rdp

ALICE = {"analyst": "alice"}


@pytest.fixture
def engine_with(duckdb_data: str, write_policy: Callable[..., Path]
                ) -> Callable[..., Engine]:
    """An engine on DuckDB whose [privacy] section gets extra lines (and other replacements)."""
    engines: list[Engine] = []

    def make(privacy: str = "", *, replace: tuple[str, str] | None = None,
             **overrides: object) -> Engine:
        path = write_policy(duckdb_data, **overrides)
        text = path.read_text().replace('noise = "sql"', 'noise = "sql"\n' + privacy)
        if replace:
            text = text.replace(*replace)
        path.write_text(text)
        engine = Engine(load_policy(path))
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()


def test_claims_record_one_event_per_mechanism(engine_with: Callable[..., Engine]) -> None:
    engine = engine_with()
    engine.execute("SELECT COUNT(*) FROM visits", epsilon=0.5, **ALICE)
    (claim,) = engine.ledger.store.claims()
    (event,) = claim.events
    assert event["kind"] == "discrete_laplace"
    assert (event["epsilon"], event["sensitivity"]) == (0.5, 1.0)
    assert claim.demand == (0.5,)


def test_a_cached_query_records_the_same_events_computed_once(
        engine_with: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch) -> None:
    """Identical queries reuse their prepared plan's events; each claim still records them."""
    import chorus_py.kinds.single as engine_module

    computed: list[object] = []
    real = engine_module.events_for_plan
    monkeypatch.setattr(engine_module, "events_for_plan",
                        lambda plan: computed.append(plan) or real(plan))
    engine = engine_with()
    for analyst in ("alice", "bob", "alice"):
        engine.execute("SELECT COUNT(*), SUM(seconds) FROM visits", epsilon=0.5,
                       analyst=analyst)
    claims = engine.ledger.store.claims()
    assert len(computed) == 1 and len(claims) == 3
    for claim in claims:
        assert [(e["kind"], e["epsilon"]) for e in claim.events] == [
            ("discrete_laplace", 0.25), ("snapping", 0.25)]  # epsilon split over two
        assert claim.demand == (0.5,)
    assert [c.analyst for c in claims] == ["alice", "bob", "alice"]


def test_report_states_the_guarantee_left_per_block(engine_with: Callable[..., Engine]) -> None:
    engine = engine_with()
    result = engine.execute("SELECT COUNT(*) FROM trips WHERE pickup_time >= '2026-03-30'",
                            epsilon=2.0, **ALICE)
    report = result.report
    assert report.accounting == "basic"
    assert [r.block for r in report.remaining] == ["trips/2026-03-30", "trips/2026-03-31"]
    for r in report.remaining:  # epsilon_per_block = 1000 in the test policy
        assert (r.epsilon_spent, r.epsilon_left, r.state) == (2.0, 998.0, "active")
        assert r.delta_left == pytest.approx(1e-3)
    explained = engine.explain("SELECT COUNT(*) FROM trips WHERE pickup_time >= '2026-03-31'",
                               epsilon=1.0, **ALICE)
    assert [(r.block, r.epsilon_left) for r in explained.remaining] == [
        ("trips/2026-03-31", 998.0)]


def test_renyi_accounting_charges_the_mechanisms_curves(
        engine_with: Callable[..., Engine]) -> None:
    engine = engine_with('accounting = "renyi"')
    result = engine.execute("SELECT COUNT(*) FROM visits", epsilon=0.5, **ALICE)
    assert result.report.accounting == "renyi"
    (claim,) = engine.ledger.store.claims()
    mech = DiscreteLaplace.from_sensitivity(1.0, 0.5)
    orders = engine.ledger.accountant.orders
    assert claim.demand == pytest.approx(
        tuple(discrete_laplace_rdp(a, mech.scale, 1) for a in orders))
    (left,) = result.report.remaining
    # (epsilon^G, delta^G) = (1000, 1e-3): delta_c = 5e-4; spent = min over alpha of
    # rdp(alpha) + ln(1 / 5e-4) / (alpha - 1), which is below the basic 0.5 + 0 for large alpha
    expected = min(d + math.log(1 / 5e-4) / (a - 1) for a, d in zip(orders, claim.demand,
                                                                   strict=True))
    assert left.epsilon_spent == pytest.approx(expected)
    assert left.epsilon_left == pytest.approx(1000 - expected)
    assert left.delta_spent == pytest.approx(5e-4)


def test_renyi_thresholded_keys_charge_the_delta_pool(engine_with: Callable[..., Engine]) -> None:
    engine = engine_with('accounting = "renyi"')
    engine.execute("SELECT page, COUNT(*) FROM visits GROUP BY page", epsilon=1.0, delta=1e-5,
                   **ALICE)
    (block,) = engine.ledger.blocks()
    assert block.delta_consumed == pytest.approx(1e-5)
    assert block.delta_pool == pytest.approx(5e-4)  # renyi_delta_share 0.5 of 1e-3


def test_dpf_n_fair_share_is_granted_and_more_waits_then_is_refused(
        engine_with: Callable[..., Engine]) -> None:
    # epsilon^G = 1000, N = 4: each arriving query unlocks 250 on the blocks it reads.
    engine = engine_with('scheduler = { policy = "dpf-n", n = 4, wait_seconds = 0 }')
    engine.execute("SELECT COUNT(*) FROM visits", epsilon=250.0, **ALICE)
    with pytest.raises(BudgetExhausted) as info:
        engine.execute("SELECT COUNT(*) FROM visits", epsilon=300.0, **ALICE)
    assert "visits" in info.value.message and "wait" in (info.value.hint or "")
    # That refusal still unlocked 250 (it arrived): 500 unlocked, 250 taken, 250 left.
    (block,) = engine.ledger.blocks()
    assert (block.epsilon_locked, block.epsilon_unlocked, block.epsilon_consumed) == (
        500.0, 250.0, 250.0)
    with pytest.raises(InvalidParameter, match="wait_seconds"):
        engine.execute("SELECT COUNT(*) FROM visits", epsilon=1.0, wait_seconds=-1, **ALICE)


def test_exhausted_block_is_named_in_the_refusal(engine_with: Callable[..., Engine]) -> None:
    engine = engine_with(epsilon_per_block=1.0, max_epsilon=1.0)
    engine.execute("SELECT COUNT(*) FROM visits", epsilon=1.0, **ALICE)
    with pytest.raises(BudgetExhausted, match=r"visits .*retired"):
        engine.execute("SELECT COUNT(*) FROM visits", epsilon=0.1, **ALICE)
    assert engine.ledger.blocks()[0].state == "retired"


def test_the_ledger_survives_the_engine(engine_with: Callable[..., Engine]) -> None:
    engine = engine_with()
    engine.execute("SELECT COUNT(*) FROM visits", epsilon=3.0, **ALICE)
    path = Path(engine.policy.source)
    ledger_file = path.with_name(f"{path.stem}.budget.sqlite3")
    assert ledger_file.exists()
    engine.close()
    with Engine.from_policy(path) as again:
        assert again.ledger.blocks()[0].epsilon_consumed == 3.0


def test_in_list_of_days_pays_and_reads_only_those_days(
        engine_with: Callable[..., Engine]) -> None:
    engine = engine_with()
    sql = ("SELECT COUNT(*) FROM trips WHERE pickup_time < '2026-01-02' "
           "OR pickup_time >= '2026-03-31'")
    report = engine.explain(sql, epsilon=1.0, **ALICE)
    assert report.blocks == ("trips/2026-01-01", "trips/2026-03-31")
    rewritten = report.rewritten_sql or ""
    assert "2026-01-02 00:00:00" in rewritten and "2026-03-31 00:00:00" in rewritten
    assert "2026-02-01" not in rewritten
    result = engine.execute(sql, epsilon=400.0, **ALICE)
    truth = engine.backend.run(
        "SELECT COUNT(*) FROM (SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY rider_id "
        "ORDER BY trip_id) AS r FROM trips WHERE pickup_time < '2026-01-02' OR pickup_time >= "
        "'2026-03-31') AS x WHERE r <= 10) AS y").rows[0][0]
    assert abs(result.rows[0][0] - truth) < 0.2 * truth + 20
    spent = {b.block_id for b in engine.ledger.blocks() if b.epsilon_consumed > 0}
    assert spent == {"trips/2026-01-01", "trips/2026-03-31"}


def test_user_dp_id_range_blocks(engine_with: Callable[..., Engine]) -> None:
    engine = engine_with(replace=(
        'block = { column = "pickup_time", size = "1 day", start = "2026-01-01", '
        'end = "2026-04-01" }',
        'block = { column = "rider_id", size = "100 ids", start = 0, end = 1000 }'))
    result = engine.execute("SELECT COUNT(*) FROM trips WHERE rider_id < 150", epsilon=300.0,
                            **ALICE)
    assert result.report.blocks == ("trips/rider_id:0-99", "trips/rider_id:100-199")
    assert "rider_id < 200" in (result.report.rewritten_sql or "")
    truth = engine.backend.run("SELECT SUM(LEAST(n, 10)) FROM (SELECT COUNT(*) AS n FROM trips "
                               "WHERE rider_id < 150 GROUP BY rider_id) AS x").rows[0][0]
    assert abs(result.rows[0][0] - truth) <= 60
    everything = engine.explain("SELECT COUNT(*) FROM trips", epsilon=1.0, **ALICE)
    # The declared range [0, 1000), whatever ids the data holds (public schedule).
    assert len(everything.blocks) == 10


def test_identical_query_gets_the_same_answer_for_free(
        engine_with: Callable[..., Engine]) -> None:
    engine = engine_with("answer_cache_seconds = 60")
    sql = "SELECT page, COUNT(*) AS n FROM visits GROUP BY page ORDER BY page"
    first = engine.execute(sql, epsilon=0.5, delta=1e-6, **ALICE)
    again = engine.execute(sql, epsilon=0.5, delta=1e-6, **ALICE)
    assert again.rows == first.rows  # the very same noisy numbers: post-processing
    assert first.report.charged and not again.report.charged
    assert "no budget spent" in again.report.notes[-1]
    (block,) = engine.ledger.blocks()
    assert block.epsilon_consumed == 0.5
    # Another analyst's identical query is not served from alice's answers: a free hit would
    # tell bob that alice just asked it (budget.answers).  It is charged, with fresh noise.
    bob = engine.execute(sql, epsilon=0.5, delta=1e-6, analyst="bob")
    assert bob.report.charged and not any("no budget spent" in n for n in bob.report.notes)
    assert engine.ledger.blocks()[0].epsilon_consumed == 1.0
    # Anything that changes the release is a new query: another epsilon, other blocks.
    engine.execute(sql, epsilon=0.25, delta=1e-6, **ALICE)
    assert engine.ledger.blocks()[0].epsilon_consumed == 1.25


def test_answer_cache_expires(engine_with: Callable[..., Engine]) -> None:
    engine = engine_with("answer_cache_seconds = 60")
    now = [0.0]
    engine.answers._clock = lambda: now[0]
    engine.execute("SELECT COUNT(*) FROM visits", epsilon=0.5, **ALICE)
    now[0] = 59.0
    assert not engine.execute("SELECT COUNT(*) FROM visits", epsilon=0.5, **ALICE).report.charged
    now[0] = 61.0
    assert engine.execute("SELECT COUNT(*) FROM visits", epsilon=0.5, **ALICE).report.charged
    assert engine.ledger.blocks()[0].epsilon_consumed == 1.0


def test_answer_cache_is_off_by_default(engine_with: Callable[..., Engine]) -> None:
    engine = engine_with()
    for _ in range(2):
        assert engine.execute("SELECT COUNT(*) FROM visits", epsilon=0.5, **ALICE).report.charged
