"""The automatic row cap of DP quantiles (contribution = "auto": ``mechanisms.quantile_cap``,
``chorus_py.kinds.quantile_selection``), on DuckDB and Postgres: the cap chosen on small skewed
data, the exponential mechanism's Delta at the chosen cap, the report's epsilons adding up to
the charge, thresholded keys with a bounded number of groups per unit, a fixed cap unchanged,
refusals free, and the selection charged even when the answer fails after it."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chorus_py.engine import Engine
from chorus_py.errors import BackendError, InvalidParameter
from chorus_py.kinds.quantile import KeyGate
from mechanisms.caps import RowModel, cap_bins, choose_groups_checked
from mechanisms.discrete_laplace import DiscreteLaplace
from mechanisms.quantile_cap import choose_quantile_cap, soft_threshold
from tests.conftest import nothing_spent

ALICE = {"analyst": "alice"}

# 1000 light units with u % 3 + 1 rows (1 to 3) and 5 heavy ones (1001..1005) with 100 rows
# each; limit 200.  v: light units spread over [0, 100), heavy units all at 100 (outliers at
# the bound).  h (no public values): u % 4, so each unit is in exactly one h group; g: public.
# Half the epsilon goes to the selection, so its histograms are precise enough for hand checks.
POLICY = """
[backend]
url = "{url}"

[privacy]
epsilon_per_block = 1e6
delta_per_block = 0.5
max_epsilon_per_query = 1e5
cap_epsilon_share = 0.5
choice_reuse_seconds = 600

[tables.qskew]
privacy_unit = "unit_id"
max_rows_per_unit = 200
contribution = "{contribution}"

[tables.qskew.columns]
unit_id = {{ type = "int", private_id = true }}
g       = {{ type = "text", public_values = ["a", "b"] }}
h       = {{ type = "int" }}
v       = {{ type = "float", lower = 0, upper = 100 }}

[analysts.alice]
"""

CREATE = [
    "CREATE TABLE qskew AS SELECT CAST(u AS BIGINT) AS unit_id, "
    "CASE WHEN u % 2 = 0 THEN 'a' ELSE 'b' END AS g, CAST(u % 4 AS BIGINT) AS h, "
    "CASE WHEN u > 1000 THEN 100.0 ELSE CAST((u * 37) % 1000 AS DOUBLE PRECISION) / 10 END "
    "AS v FROM generate_series(1, 1005) AS a(u), generate_series(1, 100) AS b(r) "
    "WHERE r <= CASE WHEN u > 1000 THEN 100 ELSE u % 3 + 1 END",
]


def _engine(scratch: Callable[..., Engine], contribution: str = "auto") -> Engine:
    return scratch("qskew", CREATE, POLICY.replace("{contribution}", contribution))


def _consumed(engine: Engine) -> float:
    """The epsilon consumed on the table's block (it has no block column: one block)."""
    (block,) = engine.ledger.blocks()
    return block.epsilon_consumed


# -- the rule, by hand --------------------------------------------------------------------------
def test_the_rule_by_hand() -> None:
    """1000 units of 2 rows and 10 in the bin [136, 161] (middle 148.5), a median at
    epsilon_q 0.45 over 10,000 bins: E_q(k) = k ln(200,000) / 0.45 = 27.124 k; k = 2 drops
    10 (148.5 - 2) = 1465 rows, E = 732.5 + 54.25; k = 161 drops none, E = 4367; k = 1 drops
    1000 + 1475, E = 1264.6.  Two quantiles (p 0.5 and 0.9) weigh the rows twice as much as
    one: w = 0.5 + 0.9."""
    starts = cap_bins(200)
    counts = [0.0] * len(starts)
    counts[starts.index(2)], counts[starts.index(136)] = 1000.0, 10.0
    rows = RowModel(starts, tuple(counts), 200, 0.0)
    per_k = math.log(10_000 / 0.05) / 0.45
    found = choose_quantile_cap(rows, [0.5], lambda k: k * per_k)
    assert found.cap == 2
    assert found.dropped == pytest.approx(0.5 * 1465)
    assert found.rank_error == pytest.approx(2 * 27.1241, rel=1e-4)
    assert found.error == pytest.approx(0.5 * 1465 + 2 * per_k)
    two = choose_quantile_cap(rows, [0.5, 0.9], lambda k: 2 * k * per_k)
    assert two.dropped == pytest.approx(1.4 * 1465) and two.cap == 2
    # A rank error so small that nothing is worth dropping: the bin's end, 161.
    assert choose_quantile_cap(rows, [0.5], lambda k: k * 0.01).cap == 161
    # Spread over G = 10 public groups the rows dropped per group are a tenth.
    assert choose_quantile_cap(rows, [0.5], lambda k: k * per_k, groups=10).dropped \
        == pytest.approx(0.05 * 1465)


def test_noise_is_shrunk_before_rows_are_counted() -> None:
    """At epsilon_h 0.05 (sd of a bin's noise sqrt(V) = 28.3) a bin of 40 units near the limit
    is shrunk to 40 - 56.6 < 0: no rows counted there; 1000 units are shrunk to 943.4."""
    starts = cap_bins(200)
    counts = [0.0] * len(starts)
    counts[starts.index(3)], counts[-1] = 1000.0, 40.0
    rows = RowModel(starts, tuple(counts), 200, 0.05)
    margin = 2 * math.sqrt(rows.variance)
    assert margin == pytest.approx(56.57, abs=0.01)
    found = choose_quantile_cap(rows, [0.5], lambda k: 27.0 * k)
    assert found.cap == 3 and found.dropped == 0.0
    found = choose_quantile_cap(rows, [0.5], lambda k: 0.1 * k)  # nearly free noise
    assert found.cap == 3  # the limit bin shows nothing beyond the noise
    assert choose_quantile_cap(rows, [0.5], lambda k: 1000.0 * k).dropped \
        == pytest.approx(0.5 * (1000 - margin) * 2)


@settings(max_examples=60, deadline=None)
@given(c=st.integers(1, 7), units=st.integers(200, 5000),
       per_k=st.floats(0.1, 50.0), limit=st.integers(8, 400))
def test_units_of_one_size_get_that_cap(c: int, units: int, per_k: float, limit: int) -> None:
    """Every unit with c <= 7 rows (a bin of its own: [8, 9] is the first wider one), exact
    counts: E(k) = 0.5 U (c - k) + r k below c and r k from c on, so k = c whenever 0.5 U > r;
    never above the limit; and the chosen E is the least over the candidates."""
    starts = cap_bins(limit)
    counts = [0.0] * len(starts)
    counts[starts.index(c)] = float(units)
    rows = RowModel(starts, tuple(counts), limit, 0.0)
    found = choose_quantile_cap(rows, [0.5], lambda k: per_k * k)
    assert found.cap == c
    for k in rows.candidates():
        assert found.error <= 0.5 * units * max(0, c - k) + per_k * k + 1e-9


# -- end to end ---------------------------------------------------------------------------------
def test_the_cap_is_chosen_and_is_the_mechanisms_delta(scratch: Callable[..., Engine]) -> None:
    """epsilon 2: 1 for the cap histogram, 1 for the median.  Rank error per unit of cap r =
    ln(10,000 / 0.05) / 1 = 12.2, so k rises while more than r / w = 24.4 units have more
    rows: the 5 heavy units never pay for it, k = 3 (the light units' most).  Delta = 3 * 0.5."""
    engine = _engine(scratch)
    result = engine.execute("SELECT MEDIAN(v) FROM qskew", epsilon=2.0, **ALICE)
    report = result.report
    contribution = report.contribution
    assert contribution is not None and contribution.mode == "auto"
    cap = contribution.cap
    assert cap is not None and 2 <= cap <= 8, cap  # the heavy units' 100 rows are not kept
    (step,) = contribution.steps
    assert step.kind == "cap" and step.chosen == f"cap {cap}"
    (median,) = report.measurements
    assert median.sensitivity == pytest.approx(cap * 0.5)
    assert median.mechanism["epsilon"] == pytest.approx(1.0)
    assert median.mechanism["rank_error_95"] == pytest.approx(
        2 * cap * 0.5 / 1.0 * math.log(10_000 / 0.05), rel=1e-6)
    # The parts add up to the charge: 1 (the histogram) + 1 (the median) = 2.
    assert contribution.epsilon == pytest.approx(1.0) == step.epsilon
    assert report.epsilon == pytest.approx(contribution.epsilon + median.mechanism["epsilon"])
    assert _consumed(engine) == pytest.approx(2.0)
    assert f"at most {cap} rows" in " ".join(report.notes)
    # The answer: the median of the light units' rows, the heavy units' 3 rows at 100 (values
    # below: ranks, +-40 of the mechanism and +-15 of the heavy rows, generously).
    values = sorted(float(r[0]) for r in engine.backend.run(
        "SELECT v FROM qskew WHERE unit_id <= 1000").rows)
    rank = sum(1 for x in values if x < result.rows[0][0])
    assert abs(rank - len(values) / 2) <= 150


def test_the_explain_shows_the_limit_until_the_choice(scratch: Callable[..., Engine]) -> None:
    """EXPLAIN runs nothing: the step's choice is open, the mechanism shown at the limit
    (Delta 100) with the answer's epsilon, the charge the query's whole epsilon."""
    engine = _engine(scratch)
    report = engine.explain("SELECT MEDIAN(v) FROM qskew", epsilon=2.0, **ALICE)
    assert report.contribution is not None and report.contribution.steps[0].chosen is None
    assert report.measurements[0].sensitivity == pytest.approx(100.0)
    assert report.epsilon == pytest.approx(2.0)
    assert nothing_spent(engine)


def test_a_fixed_cap_keeps_the_limit(scratch: Callable[..., Engine]) -> None:
    """contribution = "fixed": no selection, Delta = 200 * 0.5 = 100, all of epsilon to the
    median (the behaviour before automatic caps)."""
    engine = _engine(scratch, "fixed")
    _, prepared = engine.prepare("SELECT MEDIAN(v) FROM qskew", epsilon=2.0, **ALICE)
    assert prepared.selection is None
    result = engine.execute("SELECT MEDIAN(v) FROM qskew", epsilon=2.0, **ALICE)
    (median,) = result.report.measurements
    assert median.sensitivity == 100.0 and median.mechanism["epsilon"] == pytest.approx(2.0)
    assert result.report.contribution is None
    assert "(the policy's limit)" in " ".join(result.report.notes)
    assert _consumed(engine) == pytest.approx(2.0)


def test_quantiles_of_one_column_drawn_jointly_at_the_chosen_cap(
        scratch: Callable[..., Engine]) -> None:
    """Two quantiles of v: the joint mechanism, Delta = 2k at the chosen k; the histogram
    weighs rows dropped by max(p, 1 - p) per quantile."""
    engine = _engine(scratch)
    result = engine.execute("SELECT PERCENTILE_CONT(0.25) WITHIN GROUP (ORDER BY v), "
                            "PERCENTILE_CONT(0.75) WITHIN GROUP (ORDER BY v) FROM qskew",
                            epsilon=2.0, **ALICE)
    cap = result.report.contribution.cap  # type: ignore[union-attr]
    assert cap is not None and cap < 200
    assert [m.sensitivity for m in result.report.measurements] == [2.0 * cap, 2.0 * cap]
    assert _consumed(engine) == pytest.approx(2.0)


def test_public_groups_take_the_chosen_cap(scratch: Callable[..., Engine]) -> None:
    engine = _engine(scratch)
    result = engine.execute("SELECT g, MEDIAN(v) FROM qskew GROUP BY g", epsilon=2.0, **ALICE)
    cap = result.report.contribution.cap  # type: ignore[union-attr]
    assert cap is not None and 2 <= cap <= 8
    assert result.report.measurements[0].sensitivity == pytest.approx(0.5 * cap)
    assert sorted(r[0] for r in result.rows) == ["a", "b"]


# -- keys released by a threshold ---------------------------------------------------------------
def test_thresholded_keys_bound_the_groups_per_unit(scratch: Callable[..., Engine]) -> None:
    """GROUP BY h (no public values), epsilon 8, delta 1e-6: 4 to the selection (2 for the
    groups histogram, 2 for the cap histogram: noise small enough that g = 1 in every draw),
    of the other 4, 0.8 to the key-release count and 3.2 to the medians.  Each
    unit is in one h group: g = 1 < k, so D = min(g, k) = 1 and the gate counts distinct units
    (kinds.quantile.KeyGate): L1 sensitivity D = 1, b = 1 / 0.8 = 1.25, tau = 1 + 1.25
    ln(1 / 1e-6) = 18.27 units, against ~250 units per group: all four are released.  At the
    fixed limit k = 200 (no g), the gate counts rows: b = 200 / 1.6 = 125, tau = 200 + 125
    ln(200 / 1e-6) = 2,589 rows, against ~500 rows per group: none is."""
    engine = _engine(scratch)
    result = engine.execute("SELECT h, MEDIAN(v) FROM qskew GROUP BY h", epsilon=8.0,
                            delta=1e-6, **ALICE)
    report = result.report
    contribution = report.contribution
    assert contribution is not None
    steps = {s.kind: s for s in contribution.steps}
    assert set(steps) == {"groups", "cap"}
    assert all(s.epsilon == pytest.approx(2.0) for s in steps.values())
    assert steps["groups"].chosen == "1 groups"
    k = contribution.cap
    assert k is not None and 2 <= k <= 8
    release = report.key_release
    assert release is not None and release.method == "threshold"
    assert release.threshold == pytest.approx(1 + 1.25 * math.log(1 / 1e-6))
    median, gate = report.measurements
    assert gate.aggregate == "COUNT(DISTINCT unit_id) per group (key release)"
    assert gate.sensitivity == 1.0 and gate.mechanism["scale"] == pytest.approx(1.25)
    assert gate.mechanism["epsilon"] == pytest.approx(0.8)
    assert median.mechanism["epsilon"] == pytest.approx(3.2)
    assert median.sensitivity == pytest.approx(0.5 * k)
    # The parts add up to the charge.
    assert contribution.epsilon + gate.mechanism["epsilon"] + median.mechanism["epsilon"] \
        == pytest.approx(8.0) == report.epsilon
    assert _consumed(engine) == pytest.approx(8.0)
    assert sorted(int(r[0]) for r in result.rows) == [0, 1, 2, 3]

    fixed = _engine(scratch, "fixed")
    old = fixed.execute("SELECT h, MEDIAN(v) FROM qskew GROUP BY h", epsilon=8.0, delta=1e-6,
                        **ALICE)
    release = old.report.key_release
    assert release is not None
    assert release.threshold == pytest.approx(200 + 200 / 1.6 * math.log(200 / 1e-6))
    assert old.report.measurements[1].aggregate == "COUNT(*) per group (key release)"
    assert old.rows == [] and "row count" in old.report.warnings[0]


def test_groups_per_unit_read_past_the_noisy_tail() -> None:
    """1005 units in one group each, the groups histogram at epsilon_h 0.5 (sd of a bin's
    noise 2.8): mechanisms.caps's quantile alone reads phantom units in the tail (g far above
    1 in about 30% of draws); from the soft-thresholded counts g = 1 all but rarely."""
    starts = cap_bins(200)
    exact = np.zeros(len(starts))
    exact[0] = 1005
    noise = DiscreteLaplace.from_sensitivity(1, 0.5)
    found = [choose_groups_checked(soft_threshold(RowModel(
        starts, tuple(float(v) for v in noise.sample(exact)), 200, 0.5))).groups
        for _ in range(200)]
    assert sum(g == 1 for g in found) >= 190


def test_the_gate_by_hand() -> None:
    """The two gates of kinds.quantile.KeyGate at k = 50, D = 2, epsilon_t = 0.18, delta 1e-8:
    rows: b = 50 / 0.18, tau = 50 + b ln(2e8) = 5,359; units: b = 2 / 0.18, tau = 1 + b
    ln(2e8) = 213.4."""
    rows = KeyGate.plan(50, 2, 0.18, 1e-8, units=False)
    units = KeyGate.plan(50, 2, 0.18, 1e-8, units=True)
    assert rows.mechanism.scale == pytest.approx(50 / 0.18)
    assert rows.threshold == pytest.approx(50 + 50 / 0.18 * math.log(2e8))
    assert round(rows.threshold) == 5359
    assert units.mechanism.scale == pytest.approx(2 / 0.18)
    assert units.threshold == pytest.approx(1 + 2 / 0.18 * math.log(2e8))
    assert round(units.threshold, 1) == 213.4


# -- mixed queries ------------------------------------------------------------------------------
def test_a_mixed_query_chooses_each_parts_cap(scratch: Callable[..., Engine]) -> None:
    """MEDIAN next to COUNT: epsilon 2 split 1 : 1 between the parts; each spends half of its
    share on its own cap histogram.  The median is drawn at its own cap (Delta = k_q / 2), the
    count at the aggregates' cap; the report's steps name their parts and add up."""
    engine = _engine(scratch)
    result = engine.execute("SELECT g, MEDIAN(v), COUNT(*) FROM qskew GROUP BY g",
                            epsilon=2.0, **ALICE)
    report = result.report
    contribution = report.contribution
    assert contribution is not None
    quantile_steps = [s for s in contribution.steps if s.target.startswith("quantiles: ")]
    analytic_steps = [s for s in contribution.steps if s.target.startswith("aggregates: ")]
    assert len(quantile_steps) == 1 and analytic_steps
    k_q = int(quantile_steps[0].chosen.removeprefix("cap "))  # type: ignore[union-attr]
    assert 2 <= k_q <= 8
    median = next(m for m in report.measurements if m.id.startswith("q"))
    assert median.sensitivity == pytest.approx(0.5 * k_q)
    assert median.mechanism["epsilon"] == pytest.approx(0.5)
    assert quantile_steps[0].epsilon == pytest.approx(0.5)
    answer_epsilons = sum(float(m.mechanism["epsilon"]) for m in report.measurements)
    assert contribution.epsilon == pytest.approx(sum(s.epsilon for s in contribution.steps))
    assert contribution.epsilon + answer_epsilons == pytest.approx(2.0) == report.epsilon
    assert _consumed(engine) == pytest.approx(2.0)
    assert sorted(r[0] for r in result.rows) == ["a", "b"]


# -- refusals and failures ----------------------------------------------------------------------
@pytest.mark.parametrize(("sql", "kwargs", "error"), [
    ("SELECT h, MEDIAN(v) FROM qskew GROUP BY h", {"delta": 0.0}, InvalidParameter),
    ("SELECT MEDIAN(v) FROM qskew", {"epsilon": 1e-9}, InvalidParameter),
])
def test_refusals_cost_nothing(scratch: Callable[..., Engine], sql: str,
                               kwargs: dict[str, Any], error: type[Exception]) -> None:
    engine = _engine(scratch)
    with pytest.raises(error):
        engine.execute(sql, **{"epsilon": 2.0, **kwargs}, **ALICE)
    assert nothing_spent(engine)


def test_the_selection_is_charged_when_the_answer_fails(
        scratch: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch) -> None:
    """The table is renamed by its owner after the cap histogram read it: the median's
    histogram then fails, and the whole epsilon stays charged (the selection read the data);
    the choice is not kept for reuse."""
    engine = _engine(scratch)
    sql = "SELECT MEDIAN(v) FROM qskew"
    _, prepared = engine.prepare(sql, epsilon=2.0, **ALICE)
    assert prepared.selection is not None
    histograms = {statement for _, _, statement in prepared.selection.histograms}
    real = engine.backend.run
    ran: list[str] = []

    def run(statement: str) -> Any:
        if ran and not statement.startswith("EXPLAIN ") and statement not in histograms:
            engine.backend.run_owned(["ALTER TABLE qskew RENAME TO qskew_away"])
            ran.clear()
        if statement in histograms:
            ran.append(statement)
        return real(statement)

    monkeypatch.setattr(engine.backend, "run", run)
    try:
        with pytest.raises(BackendError, match="charged"):
            engine.execute(sql, epsilon=2.0, **ALICE)
    finally:
        monkeypatch.undo()
        engine.backend.run_owned(["ALTER TABLE IF EXISTS qskew_away RENAME TO qskew"])
    (claim,) = engine.ledger.claims()
    assert claim.state == "consumed"
    assert _consumed(engine) == pytest.approx(2.0)
    assert all(e["event"] != "claim_refunded" for e in engine.ledger.history())
    assert not engine.choices._items


def test_choices_are_reused_for_free(scratch: Callable[..., Engine]) -> None:
    """An identical query after an answered one reuses its cap (a released DP output): no
    step costs anything, all of epsilon goes to the median."""
    engine = _engine(scratch)
    sql = "SELECT MEDIAN(v) FROM qskew"
    first = engine.execute(sql, epsilon=2.0, **ALICE)
    report = engine.explain(sql, epsilon=2.0, **ALICE)
    contribution = report.contribution
    assert contribution is not None and contribution.epsilon == 0.0
    assert [s.mechanism for s in contribution.steps] == ["reused"]
    assert contribution.cap == first.report.contribution.cap  # type: ignore[union-attr]
    assert report.measurements[0].mechanism["epsilon"] == pytest.approx(2.0)
    assert report.measurements[0].sensitivity == pytest.approx(
        0.5 * first.report.contribution.cap)  # type: ignore[union-attr, operator]


def test_mixed_choices_are_reused_for_free(scratch: Callable[..., Engine]) -> None:
    """MIN and MAX next to a COUNT and an AVG (``kinds.mixed``): each part keeps its choices
    apart when they may be reused (the quantile part's cap always is here; the aggregates'
    cap and bounds unless their histograms were dominated by noise), and an identical query
    of the same analyst reuses exactly the kept ones: those steps are "reused" and free, the
    others chosen afresh from their part's share; the measurements and the steps add up to
    the whole charge; the caps and bounds reused are the first query's; another analyst
    chooses afresh.  Then the aggregates' choices dropped (as when dominated by noise): the
    quantile part still reuses its own."""
    epsilon = 20.0
    engine = scratch("qskew", CREATE, POLICY.replace("{contribution}", "auto")
                     + "\n[analysts.bob]\n")
    sql = "SELECT COUNT(*), AVG(v), MIN(v), MAX(v) FROM qskew WHERE g = 'a'"
    first = engine.execute(sql, epsilon=epsilon, **ALICE)
    chosen = first.report.contribution
    assert chosen is not None and chosen.epsilon > 0
    kept = {key[1][1] for key in engine.choices._items if key[1][:1] == ("mixed",)}
    assert "quantile" in kept  # a cap with no groups bound is always reusable
    aggregates = chosen.epsilon - _quantile_share(chosen)  # their steps' share
    _reuses_what_was_kept(engine.execute(sql, epsilon=epsilon, **ALICE), first, kept,
                          epsilon, aggregates)
    for key in [k for k in engine.choices._items if k[1][:2] == ("mixed", "analytic")]:
        del engine.choices._items[key]
    _reuses_what_was_kept(engine.execute(sql, epsilon=epsilon, **ALICE), first, {"quantile"},
                          epsilon, aggregates)
    assert _consumed(engine) == pytest.approx(3 * epsilon)
    other = engine.explain(sql, epsilon=epsilon, analyst="bob").contribution
    assert other is not None and other.epsilon > 0
    assert "reused" not in {s.mechanism for s in other.steps}


def _reuses_what_was_kept(answered: Any, first: Any, kept: set[str], epsilon: float,
                          aggregates: float) -> None:
    """Each step of ``answered`` (a mixed query) is "reused" at epsilon 0 exactly when its
    part's choices were ``kept``, else chosen afresh at the part's share (``aggregates`` for
    the aggregates' steps: the quantile part is always kept here); the steps and the
    measurements add up to ``epsilon``; the reused caps (and bounds) are ``first``'s."""
    contribution, chosen = answered.report.contribution, first.report.contribution
    assert contribution is not None
    for step in contribution.steps:
        part = "quantile" if step.target.startswith("quantiles:") else "analytic"
        assert (step.mechanism == "reused") == (part in kept), step
        assert (step.epsilon == 0.0) == (part in kept), step
    assert contribution.epsilon == pytest.approx(0.0 if "analytic" in kept else aggregates)
    assert _spent(answered) + contribution.epsilon == pytest.approx(epsilon)
    caps = re.compile(r"quantiles: cap (\d+)")
    assert caps.findall(contribution.note) == caps.findall(chosen.note)
    if "analytic" in kept:  # the aggregates' cap and the AVG's bounds as first chosen
        assert contribution.cap == chosen.cap
        assert [m.sensitivity for m in answered.report.measurements] == \
            [m.sensitivity for m in first.report.measurements]


def _spent(result: Any) -> float:
    """The epsilon of a result's measurements, a joint MIN/MAX draw once."""
    spent = {}
    for m in result.report.measurements:
        joint = m.mechanism.get("quantiles")
        spent[tuple(joint) if joint else m.id] = m.mechanism["epsilon"]
    return sum(spent.values())


def _quantile_share(contribution: Any) -> float:
    """The epsilon of a mixed query's quantile part's choice steps."""
    return sum(s.epsilon for s in contribution.steps if s.target.startswith("quantiles:"))
