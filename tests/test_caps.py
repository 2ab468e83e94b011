"""Automatic contribution caps (contribution = "auto"): the rule, its accounting, end to end."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import chorus_py.kinds.selection as selection_module
from chorus_py.engine import Engine
from mechanisms.caps import (
    CapTerm,
    RowModel,
    cap_bins,
    choose,
    choose_cap,
    discrete_laplace_variance,
    limit_is_certain,
)
from mechanisms.clip_bounds import Z
from tests.conftest import nothing_spent, tolerance

ALICE = {"analyst": "alice"}


# -- the rule ------------------------------------------------------------------------------------
def test_bins_partition_one_to_the_limit() -> None:
    assert cap_bins(1) == (1,)
    assert cap_bins(8) == (1, 2, 3, 4, 5, 6, 7, 8)
    starts = cap_bins(200)
    assert starts[0] == 1 and starts[-1] <= 200
    assert all(b > a for a, b in itertools.pairwise(starts))
    # Above 8 each bin is at most ~19% wide (factor 2^(1/4), rounded).
    assert all(b / a <= 1.25 for a, b in itertools.pairwise(starts[8:]))


def test_rule_by_hand() -> None:
    # Bins start at 1, 2, 4, 8 with limit 8: the bins are {1}, {2, 3}, {4..7}, {8}, with
    # m_b = 1, 2.5, 5.5, 8.  100 units with 8 rows, exact counts (epsilon_h = 0: no Z term):
    # N(k) = 100 min(8, k), N(8) = 800.  One count released as a total, epsilon = 1/sqrt(2) so
    # that its noise is 2k rows: e(k) = (800 - N(k) + 2k) / 800, smallest at k = 8 (16 / 800).
    count = CapTerm(1.0, 1 / math.sqrt(2), True)
    assert choose_cap((1, 2, 4, 8), [0, 0, 0, 100], 8, [count]) == 8
    rows = RowModel((1, 2, 4, 8), (0, 0, 0, 100), 8, 0.0)
    assert rows.candidates() == [1, 2, 3, 4, 7, 8]
    assert rows.all_rows() == 800 and rows.kept(4) == 400 and rows.lost(7) == 100
    # Noise of 200k rows (epsilon = 1/(100 sqrt(2))): k=1 costs 700 + 200 = 900 < 1600 at k=8.
    loud = CapTerm(1.0, 1 / (100 * math.sqrt(2)), True)
    assert choose_cap((1, 2, 4, 8), [0, 0, 0, 100], 8, [loud]) == 1
    # Only inside a ratio, the count's error is its noise over N(k): 2k / (100 min(8, k)) is
    # 0.02 for every k <= 8: the smallest minimiser, k = 1.
    ratio = CapTerm(1.0, 1 / math.sqrt(2), False)
    assert choose_cap((1, 2, 4, 8), [0, 0, 0, 100], 8, [ratio]) == 1
    # Grouped over G = 100 groups the loss per group shrinks the same way as the rows per group,
    # but the noise does not: with noise 2k per group, e(1) = (7 + 2) / 8 < e(8) = 16 / 8.
    assert choose_cap((1, 2, 4, 8), [0, 0, 0, 100], 8, [count], groups=100) == 1
    # Units in the bin {4..7} count as m = 5.5 rows: k = 7 keeps them all.
    assert choose_cap((1, 2, 4, 8), [0, 0, 100, 0], 8, [count]) == 7
    # Negative counts are made consistent (all 0 here: the tail sums are all negative).  Taken
    # as exact, nothing is lost at any cap: k = 1, the least noise.  As a noisy histogram
    # (epsilon_h = 0.5), the empty bins could hide units with up to 8 rows: the cap stays at the
    # limit, and the choice says it fell back (the point estimates alone would take k = 1).
    assert choose_cap((1, 2, 4, 8), [-50, -3, 0, 0], 8, [count]) == 1
    noisy = choose(RowModel((1, 2, 4, 8), (-50, -3, 0, 0), 8, 0.5), [count])
    assert noisy.cap == 8 and noisy.noise_dominated
    with pytest.raises(ValueError):
        choose_cap((1,), [1.0], 1, [CapTerm(1.0, 0.0, True)])


def test_histogram_noise_keeps_the_cap_up() -> None:
    # 100 units with 4..7 rows (m = 5.5), none at 8; one count total with epsilon 1 (noise
    # sqrt(2) k).  Exact: R(7) = 0, so k = 7.  With a histogram of epsilon_h = 0.1 the empty
    # bin {8} could hide units: L(7) = Z sd R(7) = Z sqrt(V) * (8 - 7), V = 2a/(1-a)^2 with
    # a = exp(-0.1): about 1.645 * 14.1 = 23.2 rows, more than the sqrt(2) (8 - 7) = 1.4 rows
    # of noise k = 8 adds: the rule keeps k = 8.
    count = CapTerm(1.0, 1.0, True)
    exact = RowModel((1, 2, 4, 8), (0, 0, 100, 0), 8, 0.0)
    assert choose(exact, [count]).cap == 7
    noisy = RowModel((1, 2, 4, 8), (0, 0, 100, 0), 8, 0.1)
    a = math.exp(-0.1)
    assert discrete_laplace_variance(0.1) == pytest.approx(2 * a / (1 - a) ** 2)
    assert noisy.lost(7) == pytest.approx(Z * math.sqrt(2 * a / (1 - a) ** 2))
    assert noisy.lost(7, z=0.0) == 0.0
    assert choose(noisy, [count]).cap == 8
    # A fixed cap is taken as given (only the clipping bounds are chosen then).
    assert choose(noisy, [count], caps=(4,)).cap == 4


@settings(max_examples=300, deadline=None)
@given(limit=st.integers(1, 500), data=st.data())
def test_chosen_cap_never_exceeds_the_limit(limit: int, data: st.DataObject) -> None:
    starts = cap_bins(limit)
    counts = data.draw(st.lists(st.floats(-1e6, 1e6), min_size=len(starts),
                                max_size=len(starts)))
    terms = [CapTerm(data.draw(st.floats(0.0, 2.0)), data.draw(st.floats(1e-3, 1e3)),
                     data.draw(st.booleans()), kind=data.draw(st.sampled_from(["count", "sum"])))
             for _ in range(data.draw(st.integers(1, 4)))]
    rows = RowModel(starts, tuple(counts), limit,
                    data.draw(st.just(0.0) | st.floats(1e-6, 10.0)))
    caps = data.draw(st.none() | st.lists(st.integers(1, 1000), min_size=1)
                     .filter(lambda c: min(c) <= limit))
    choice = choose(rows, terms, (), data.draw(st.integers(1, 50)), caps)
    assert 1 <= choice.cap <= limit
    assert choice.cap in (rows.candidates() if caps is None else caps)


def test_limit_is_certain_by_hand() -> None:
    # epsilon_h = 0.1: V = 2a / (1 - a)^2 = 199.8, Z sqrt(V) = 1.645 * 14.13 = 23.25 rows per
    # unit below the limit; a COUNT of epsilon 0.9 saves only sqrt(2) / 0.9 = 1.57 rows per unit
    # of cap: the limit is certain.  With G = 20 public groups the bias is shared by 20
    # groups (23.25 / 20 = 1.16 < 1.57): not certain any more.
    count = CapTerm(1.0, 0.9, True)
    assert Z * math.sqrt(discrete_laplace_variance(0.1)) == pytest.approx(23.25, abs=0.01)
    assert limit_is_certain([count], 0.1)
    assert not limit_is_certain([count], 0.1, groups=20)
    # A sum with fixed bounds (w = 2): 2 sqrt(2) / 0.9 = 3.14 < 23.25, still certain; at
    # epsilon_h = 25 the histogram is exact to ~1e-11: not certain.
    assert limit_is_certain([count, CapTerm(2.0, 0.9, True)], 0.1)
    assert not limit_is_certain([count], 25.0)
    # A ratio, a clipped column, or no term at all: never certain.
    assert not limit_is_certain([count, CapTerm(2.0, 0.9, False)], 0.1)
    assert not limit_is_certain([CapTerm(1.0, 0.9, True, column=0)], 0.1)
    assert not limit_is_certain([], 0.1)


@settings(max_examples=300, deadline=None)
@given(limit=st.integers(2, 300), data=st.data())
def test_a_certain_limit_is_what_the_rule_chooses(limit: int, data: st.DataObject) -> None:
    """Whatever the histogram shows, when limit_is_certain says so, choose() keeps the limit."""
    starts = cap_bins(limit)
    eps_h = data.draw(st.floats(1e-3, 5.0))
    groups = data.draw(st.integers(1, 30))
    terms = [CapTerm(data.draw(st.sampled_from([0.0, 1.0, 2.0])), data.draw(st.floats(1e-2, 1e2)),
                     True) for _ in range(data.draw(st.integers(1, 3)))]
    if not limit_is_certain(terms, eps_h, groups):
        return
    counts = data.draw(st.lists(st.floats(-1e5, 1e6), min_size=len(starts),
                                max_size=len(starts)))
    rows = RowModel(starts, tuple(counts), limit, eps_h)
    assert choose(rows, terms, (), groups).cap == limit


# -- end to end ----------------------------------------------------------------------------------
EXACT_POLICY = """
[backend]
url = "{url}"

[privacy]
epsilon_per_block = 1e6
max_epsilon_per_query = 1e5
cap_epsilon_share = 0.5

[tables.exact]
privacy_unit = "unit_id"
max_rows_per_unit = 50
contribution = "auto"
bounding = "{bounding}"

[tables.exact.columns]
unit_id = {{ type = "int" }}
value   = {{ type = "float", lower = 0, upper = 10 }}

[analysts.alice]
"""


@pytest.fixture
def exact_units(scratch: Callable[..., Engine], backend_url: str) -> Callable[..., Engine]:
    """Table `exact`: 400 units with exactly c rows each (c set per test)."""
    double = "DOUBLE" if backend_url.startswith("duckdb") else "DOUBLE PRECISION"

    def make(c: int, bounding: str = "per-query", extra: str = "") -> Engine:
        create = (f"CREATE TABLE exact AS SELECT CAST(u AS BIGINT) AS unit_id, CAST(r AS {double}) "
                  f"AS value FROM generate_series(1, 400) AS a(u), generate_series(1, {c}) AS b(r)")
        text = EXACT_POLICY.replace("{bounding}", bounding).replace(
            "cap_epsilon_share = 0.5\n", f"cap_epsilon_share = 0.5\n{extra}")
        return scratch("exact", [create], text)

    return make


@pytest.mark.parametrize("c", [6, 13, 50])
def test_cap_equals_the_rows_every_unit_has(exact_units: Callable[..., Engine], c: int) -> None:
    # Every unit has exactly c rows (c is a bin end: 6 alone in its bin, 13 ends [12, 13], 50 is
    # the limit).  At eps 50 (25 on the histogram, noise scale 0.04, variance ~3e-11) E(k) is
    # minimal at k = c: fewer drops rows, more only adds noise.
    engine = exact_units(c)
    result = engine.execute("SELECT COUNT(*) FROM exact", epsilon=50.0, **ALICE)
    contribution = result.report.contribution
    assert contribution is not None and contribution.cap == c
    assert result.rows[0][0] == pytest.approx(400 * c, abs=tolerance(result.report.columns[0]))


def test_materialized_sample_honours_the_chosen_cap(exact_units: Callable[..., Engine]) -> None:
    engine = exact_units(13, bounding="materialized")
    result = engine.execute("SELECT COUNT(*) FROM exact", epsilon=50.0, **ALICE)
    assert result.report.contribution.cap == 13
    assert "__chorus_rank <= 13" in result.report.rewritten_sql
    assert result.rows[0][0] == pytest.approx(5200, abs=tolerance(result.report.columns[0]))


def test_distinct_units_over_a_stored_sample_read_every_kept_row(
        exact_units: Callable[..., Engine]) -> None:
    """COUNT(DISTINCT unit) alone needs no cap (sensitivity 1 whatever the rows per unit).  Over
    a stored sample the cap 1 of per-query bounding would keep each unit's stored rank-1 row
    only, and a filter would then miss every unit whose rank-1 row fails it (half of them
    here): the query reads every row the sample keeps instead."""
    engine = exact_units(6, bounding="materialized")
    result = engine.execute("SELECT COUNT(DISTINCT unit_id) FROM exact WHERE value > 3",
                            epsilon=50.0, **ALICE)
    assert "__chorus_rank <=" not in result.report.rewritten_sql
    # Ungrouped COUNT(DISTINCT unit): one unit changes it by at most 1, whatever its rows.
    assert result.report.measurements[0].sensitivity == 1
    assert result.rows[0][0] == pytest.approx(400, abs=tolerance(result.report.columns[0]))


def test_epsilon_adds_up_to_the_charge(exact_units: Callable[..., Engine]) -> None:
    engine = exact_units(6)
    result = engine.execute("SELECT COUNT(*), AVG(value) FROM exact", epsilon=2.0, **ALICE)
    report = result.report
    assert report.contribution is not None
    assert report.contribution.epsilon == pytest.approx(1.0)  # cap_epsilon_share = 0.5
    spent = report.contribution.epsilon + sum(m.mechanism["epsilon"] for m in report.measurements)
    assert spent == pytest.approx(2.0, rel=1e-12)
    assert report.epsilon == 2.0
    (block,) = engine.ledger.blocks()
    assert block.epsilon_consumed == pytest.approx(2.0)
    # The sensitivities are those of the chosen cap: COUNT(*) has Delta = k.
    count = next(m for m in report.measurements if m.aggregate == "COUNT(*)")
    assert count.sensitivity == report.contribution.cap


def test_explain_does_not_run_the_selection(exact_units: Callable[..., Engine]) -> None:
    engine = exact_units(6)
    report = engine.explain("SELECT SUM(value) FROM exact", epsilon=1.0, **ALICE)
    assert report.contribution is not None and report.contribution.cap is None
    assert "limit 50" in report.contribution.note
    # Shown at the limit: SUM(value) in [0, 10] with k = 50 -> Delta = 500.
    assert report.measurements[0].sensitivity == 500
    assert report.epsilon == 1.0
    assert nothing_spent(engine)


def test_distinct_units_alone_need_no_selection(exact_units: Callable[..., Engine]) -> None:
    engine = exact_units(6)
    result = engine.execute("SELECT COUNT(DISTINCT unit_id) FROM exact", epsilon=10.0, **ALICE)
    assert result.report.contribution.cap == 1
    assert result.report.contribution.epsilon == 0
    assert result.report.measurements[0].mechanism["epsilon"] == pytest.approx(10.0)
    assert result.rows[0][0] == pytest.approx(400, abs=5)


def test_no_histogram_where_the_rule_must_keep_the_limit(
        exact_units: Callable[..., Engine]) -> None:
    """A COUNT at epsilon 1 with share 0.5: epsilon_h = 0.5, V = 2a / (1 - a)^2 = 7.84 (a =
    exp(-0.5)), Z sqrt(V) = 4.61 rows per unit of cap against sqrt(2) / 0.5 = 2.83 rows of noise
    saved: the test would keep the limit whatever the histogram shows.  No histogram runs and
    the whole epsilon goes to the count, at the limit 50."""
    engine = exact_units(6)
    result = engine.execute("SELECT COUNT(*) FROM exact", epsilon=1.0, **ALICE)
    contribution = result.report.contribution
    assert contribution is not None
    assert contribution.epsilon == 0 and contribution.cap == 50 and not contribution.steps
    assert "no histogram" in contribution.note
    (count,) = result.report.measurements
    assert count.sensitivity == 50
    assert count.mechanism["epsilon"] == pytest.approx(1.0)
    assert result.report.epsilon == pytest.approx(1.0)
    (block,) = engine.ledger.blocks()
    assert block.epsilon_consumed == pytest.approx(1.0)
    # An AVG next to it can favour a smaller cap: the selection runs.
    both = engine.execute("SELECT COUNT(*), AVG(value) FROM exact", epsilon=1.0, **ALICE)
    assert both.report.contribution.epsilon == pytest.approx(0.5)


GROUPED_POLICY = """
[backend]
url = "{url}"

[privacy]
epsilon_per_block = 1e6
delta_per_block = 0.5
max_epsilon_per_query = 1e5

[tables.spread]
privacy_unit = "unit_id"
max_rows_per_unit = 50
contribution = "auto"

[tables.spread.columns]
unit_id = {{ type = "int" }}
g       = {{ type = "text", public_values = ["a", "b", "c"] }}

[analysts.alice]
"""


def test_grouped_distinct_units_need_no_row_cap(scratch: Callable[..., Engine]) -> None:
    """COUNT(DISTINCT unit) by G = 3 public groups: Delta = min(k, G) = 3 at any cap >= 3, so
    the cap stays at the limit and nothing is spent choosing it.  Every one of the 400 units
    has 12 rows, 4 in each group: a cap of 1 (what the rule chose when it weighed the count's
    noise as growing with k) counted each unit in one group only, about 133 per group."""
    engine = scratch("spread", [
        "CREATE TABLE spread AS SELECT CAST(u AS BIGINT) AS unit_id, "
        "CASE r % 3 WHEN 0 THEN 'a' WHEN 1 THEN 'b' ELSE 'c' END AS g "
        "FROM generate_series(1, 400) AS a(u), generate_series(1, 12) AS b(r)"], GROUPED_POLICY)
    result = engine.execute("SELECT g, COUNT(DISTINCT unit_id) AS n FROM spread GROUP BY g "
                            "ORDER BY g", epsilon=30.0, **ALICE)
    contribution = result.report.contribution
    assert contribution is not None
    assert contribution.cap == 50 and contribution.epsilon == 0
    (measurement,) = result.report.measurements
    assert measurement.sensitivity == 3
    assert measurement.mechanism["epsilon"] == pytest.approx(30.0)
    assert [row[0] for row in result.rows] == ["a", "b", "c"]
    for _, n in result.rows:  # noise scale 3 / 30 = 0.1
        assert n == pytest.approx(400, abs=2)


def test_thresholded_distinct_units_choose_only_the_groups(
        scratch: Callable[..., Engine]) -> None:
    """COUNT(DISTINCT unit) by keys released through a threshold: each unit is kept in at most g
    of its groups (g chosen from a noisy histogram), so Delta = min(k, g) = g at the limit: only
    the groups histogram runs (no cap histogram), the cap stays at the limit, and each of the
    400 units, with 12 rows over 3 groups, is counted in every group it reaches (g = 3)."""
    policy = GROUPED_POLICY.replace(', public_values = ["a", "b", "c"]', "").replace(
        "max_epsilon_per_query = 1e5", "max_epsilon_per_query = 1e5\ncap_epsilon_share = 0.5")
    engine = scratch("spread", [
        "CREATE TABLE spread AS SELECT CAST(u AS BIGINT) AS unit_id, "
        "CASE r % 3 WHEN 0 THEN 'a' WHEN 1 THEN 'b' ELSE 'c' END AS g "
        "FROM generate_series(1, 400) AS a(u), generate_series(1, 12) AS b(r)"], policy)
    result = engine.execute("SELECT g, COUNT(DISTINCT unit_id) AS n FROM spread GROUP BY g "
                            "ORDER BY g", epsilon=60.0, delta=1e-6, **ALICE)
    contribution = result.report.contribution
    assert contribution is not None and contribution.cap == 50
    assert [step.kind for step in contribution.steps] == ["groups"]
    assert contribution.steps[0].epsilon == pytest.approx(30.0)
    assert contribution.steps[0].chosen == "3 groups"
    (measurement,) = result.report.measurements
    assert measurement.sensitivity == 3
    assert [row[0] for row in result.rows] == ["a", "b", "c"]
    for _, n in result.rows:
        assert n == pytest.approx(400, abs=3)


def test_demo_trips_are_not_biased_by_the_cap(backend_url: str,
                                              make_engine: Callable[..., Engine]) -> None:
    # With a fixed cap of 10, COUNT(*) loses the trips of heavy riders; the automatic cap keeps
    # (nearly) all of them at a generous epsilon.
    auto = make_engine(backend_url, k=200, contribution="auto", epsilon_per_block=1e6,
                       max_epsilon=1e5)
    fixed = make_engine(backend_url, k=10, epsilon_per_block=1e6, max_epsilon=1e5)
    (true,) = auto.backend.run("SELECT COUNT(*) FROM trips").rows[0]
    got_auto = auto.execute("SELECT COUNT(*) FROM trips", epsilon=1000.0, **ALICE).rows[0][0]
    got_fixed = fixed.execute("SELECT COUNT(*) FROM trips", epsilon=1000.0, **ALICE).rows[0][0]
    assert abs(got_auto - true) < 0.02 * true
    assert got_fixed < 0.9 * true


# -- reusing an identical query's choices (privacy.choice_reuse_seconds) --------------------------
def test_identical_query_reuses_the_choices_and_spends_all_epsilon_on_the_answer(
        exact_units: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch) -> None:
    engine = exact_units(6, extra="choice_reuse_seconds = 600\n")
    sql = "SELECT COUNT(*), SUM(value) FROM exact"
    eps = 20.0
    # Only a choice the histograms decided is kept (Choices.reusable): at epsilon 2 the
    # clipping histogram now and then could not tell (a flaky failure in CI); at 20 it can.
    histograms: list[object] = []
    run, run_cells = selection_module.histogram, selection_module.cells

    def counting(*args: object, **kwargs: object) -> object:
        histograms.append(args[3])
        return run(*args, **kwargs)  # type: ignore[arg-type]

    def counting_cells(*args: object, **kwargs: object) -> object:
        histograms.append(args[2])  # the one statement of the cap and clipping histograms
        return run_cells(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(selection_module, "histogram", counting)
    monkeypatch.setattr(selection_module, "cells", counting_cells)
    first = engine.execute(sql, epsilon=eps, **ALICE).report
    ran = len(histograms)
    assert ran >= 1 and first.contribution.epsilon == pytest.approx(eps / 2)  # share 0.5
    second = engine.execute(sql, epsilon=eps, **ALICE).report
    assert len(histograms) == ran  # no selection histogram ran again
    c1, c2 = first.contribution, second.contribution
    assert c2.cap == c1.cap and c2.epsilon == 0 and "reused" in c2.note
    assert [s.chosen for s in c2.steps] == [s.chosen for s in c1.steps]
    assert all(s.epsilon == 0 and s.mechanism == "reused" for s in c2.steps)
    # All of epsilon goes to the answer: its measurements' epsilons add up to eps, and the
    # ledger charged eps for each query.
    assert sum(m.mechanism["epsilon"] for m in second.measurements) == pytest.approx(eps)
    assert sum(m.mechanism["epsilon"] for m in first.measurements) == pytest.approx(eps / 2)
    (block,) = engine.ledger.blocks()
    assert block.epsilon_consumed == pytest.approx(2 * eps)
    # EXPLAIN shows what the next run would do: the reused cap, all of epsilon on the answer.
    explained = engine.explain(sql, epsilon=eps, **ALICE)
    assert explained.contribution.cap == c1.cap and explained.contribution.epsilon == 0


def test_choices_are_not_reused_across_epsilons_or_when_turned_off(
        exact_units: Callable[..., Engine]) -> None:
    engine = exact_units(6, extra="choice_reuse_seconds = 600\n")
    sql = "SELECT SUM(value) FROM exact"
    engine.execute(sql, epsilon=2.0, **ALICE)
    other = engine.execute(sql, epsilon=3.0, **ALICE).report  # the rule depends on epsilon
    assert other.contribution.epsilon == pytest.approx(1.5) and "reused" not in \
        other.contribution.note
    off = exact_units(6)  # choice_reuse_seconds defaults to 0
    off.execute(sql, epsilon=2.0, **ALICE)
    again = off.execute(sql, epsilon=2.0, **ALICE).report
    assert again.contribution.epsilon == pytest.approx(1.0)
    assert all(s.epsilon > 0 for s in again.contribution.steps)


def test_reuse_does_not_tell_that_rows_changed(exact_units: Callable[..., Engine]) -> None:
    # A stored sample is renamed (rebuilt) when the rows change; keying the reuse on it would
    # let the report's "reused" reveal that change.  The key holds public things only.
    engine = exact_units(6, bounding="materialized", extra="choice_reuse_seconds = 600\n")
    sql = "SELECT COUNT(*) FROM exact"
    # At epsilon 50 the histogram clearly shows every unit's 6 rows: an evidence-based choice,
    # kept for reuse (a noise-dominated one is not: the next test).
    first = engine.execute(sql, epsilon=50.0, **ALICE).report
    assert first.contribution.cap == 6
    engine.backend.run_owned(["INSERT INTO exact VALUES (9999, 1.0)"])
    second = engine.execute(sql, epsilon=50.0, **ALICE).report
    assert second.rewritten_sql != first.rewritten_sql  # a new sample was built and read
    assert "reused" in second.contribution.note and second.contribution.cap == \
        first.contribution.cap


def test_a_noise_dominated_choice_is_not_kept_for_reuse(
        exact_units: Callable[..., Engine]) -> None:
    """At a small epsilon the histogram is mostly noise: the cap falls back to the limit
    (``Choice.noise_dominated``) and an identical query chooses afresh instead of reusing it."""
    engine = exact_units(6, extra="choice_reuse_seconds = 600\n")
    sql = "SELECT COUNT(*) FROM exact"
    first = engine.execute(sql, epsilon=0.2, **ALICE).report
    assert first.contribution.cap == 50  # the limit
    second = engine.execute(sql, epsilon=0.2, **ALICE).report
    assert "reused" not in second.contribution.note
    assert all(s.epsilon > 0 and s.mechanism != "reused" for s in second.contribution.steps)
