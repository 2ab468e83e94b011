"""Groups per unit for keys released by thresholding: the bound g, its sensitivities, its rule."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from chorus_py.engine import Engine
from mechanisms import DiscreteLaplace
from mechanisms.caps import (
    GroupChoice,
    RowModel,
    cap_bins,
    choose_groups,
    choose_groups_checked,
    discrete_laplace_variance,
)
from mechanisms.clip_bounds import Z
from mechanisms.planning import NoiseRequest, ThresholdRequest, plan_noise
from mechanisms.thresholding import key_release_threshold
from rewriters.contribution import contribution, group_bound
from rewriters.dialect import dialect
from rewriters.pipeline import filtered_rows
from rewriters.selection import group_histogram
from tests.conftest import nothing_spent

ALICE = {"analyst": "alice"}
DELTA = 1e-6


# -- the rule ------------------------------------------------------------------------------------
def test_rule_by_hand() -> None:
    # Limit 8: bins {1}, {2, 3}, {4..7}, {8}, m_b = 1, 2.5, 5.5, 8; candidates 1, 2, 3, 4, 7, 8.
    starts = (1, 2, 4, 8)
    # 990 units with 2-3 groups, 10 with 4-7: A(3) = 10 <= 1% of 1000 -> g = 3 (exact counts).
    assert choose_groups(RowModel(starts, (0, 990, 10, 0), 8, 0.0)) == 3
    # 20 units above 3 are 2% > 1%: g = 7 leaves none above (m = 5.5 <= 7).
    assert choose_groups(RowModel(starts, (0, 980, 20, 0), 8, 0.0)) == 7
    # A larger alpha tolerates them.
    assert choose_groups(RowModel(starts, (0, 980, 20, 0), 8, 0.0), alpha=0.05) == 3
    # Noise: g itself comes from the point estimates (the limit is no safe fallback: it
    # releases no group), but the test flags a g the histogram does not clearly support.  At
    # epsilon_h = 0.5, V = 2a / (1 - a)^2 (a = e^-0.5) = 7.92; at g = 3 two bins lie above:
    # A(3) + Z sqrt(2 V) = 10 + 6.55 > 1% of (1000 - Z sqrt(4 V)) = 9.91, at g = 7 one bin:
    # 0 + Z sqrt(V) = 4.63 <= 9.91: the tested quantile is 7 < 8, so g = 3 is not flagged.
    v = discrete_laplace_variance(0.5)
    assert v == pytest.approx(2 * math.exp(-0.5) / (1 - math.exp(-0.5)) ** 2)
    assert 10 + Z * math.sqrt(2 * v) > 0.01 * (1000 - Z * math.sqrt(4 * v)) >= Z * math.sqrt(v)
    noisy = choose_groups_checked(RowModel(starts, (0, 990, 10, 0), 8, 0.5))
    assert noisy == GroupChoice(3, False)
    # So noisy that no candidate passes the test: flagged.  At epsilon_h = 0.01 twice the
    # noise's sd is 2 sqrt(V) = 283 units: every bin shrinks to 0 and the shrunk quantile is 1;
    # the floor's lower limit at g = 1, 10 - Z sqrt(3 V) < 0, is no higher: g = 1.
    assert 2 * math.sqrt(discrete_laplace_variance(0.01)) == pytest.approx(282.8, abs=0.1)
    assert choose_groups_checked(RowModel(starts, (0, 5, 5, 0), 8, 0.01)) == GroupChoice(1, True)
    with pytest.raises(ValueError):
        choose_groups(RowModel(starts, (0, 1, 0, 0), 8, 0.0), alpha=0.0)


def tail(head: float, at: dict[int, float]) -> tuple[float, ...]:
    """Counts over cap_bins(200): ``head`` units in bin {1} and ``at`` {bin start: units}."""
    starts = cap_bins(200)
    counts = [head] + [0.0] * (len(starts) - 1)
    for start, units in at.items():
        counts[starts.index(start)] = units
    return tuple(counts)


def test_phantom_units_in_the_tail_by_hand() -> None:
    # 1005 units in one group and 5 each in the bins [136, 161], [162, 192], [193, 199], read
    # as a histogram of epsilon_h = 0.5 (2 sd = 2 sqrt(7.835) = 5.60): 15 units above g = 1
    # exceed 1% of 1020, so the consistent counts' quantile is 161 (m = 177 and 196 above it:
    # 10 <= 10.2), and with the gate g stays there (the phantom pairs beyond g = 1 weigh
    # 5 (147.5 + 176 + 195) = 2,592.5 of 3,612.5).  Each is within 2 sd of empty: shrunk to
    # 0, g = 1; the floor at g = 1, 15 - Z sqrt(26 V) = 15 - 23.5 < 0, does not lift it.
    v = discrete_laplace_variance(0.5)
    assert 2 * math.sqrt(v) == pytest.approx(5.598, abs=1e-3)
    assert 15 - Z * math.sqrt(26 * v) < 0.01 * 1020
    phantom = RowModel(cap_bins(200), tail(1005.0, {136: 5.0, 162: 5.0, 193: 5.0}), 200, 0.5)
    assert choose_groups_checked(phantom) == GroupChoice(1, False)
    assert choose_groups_checked(phantom, 0.18, 1e-8) == GroupChoice(1, False)


def test_the_floor_keeps_a_tail_of_thin_bins_by_hand() -> None:
    # 900 units in one group and 5 in each of the 18 bins from [10, 11] to [193, 199], epsilon_h
    # 0.5: every tail bin is within 2 sd (5.60) of empty and shrinks to 0 (the shrunk
    # quantile: 1), but together they are 90 units.  The floor: at g = 113 five bins lie above
    # (m = 124.5, 148.5, 177, 196, 200), A = 20: 20 - Z sqrt(5 V) = 9.70 <= 1% of (990 +
    # Z sqrt(27 V)) = 10.14; at g = 96 six (A = 25): 25 - Z sqrt(6 V) = 13.72 > 10.14: g_lo =
    # 113.  With the gate the pairs lost are read at their lower 95% limit too: g = 1 would lose
    # R(1) - Z sd R(1) = 4,154 of the P - Z sd P = 5,128 pairs, so g stays at 113.
    v = discrete_laplace_variance(0.5)
    bound = 0.01 * (990 + Z * math.sqrt(27 * v))
    assert 20 - Z * math.sqrt(5 * v) <= bound < 25 - Z * math.sqrt(6 * v)
    thin = RowModel(cap_bins(200), tail(900.0, {s: 5.0 for s in cap_bins(200) if 10 <= s < 200}),
                    200, 0.5)
    assert choose_groups_checked(thin) == GroupChoice(113, False)
    assert choose_groups_checked(thin, 0.18, 1e-8) == GroupChoice(113, False)
    assert thin.lost(1, -Z) == pytest.approx(4153.8, abs=0.1)


@pytest.mark.parametrize(("epsilon_h", "head", "at", "best", "share"), [
    (0.5, 1005, {}, 1, 0.95),            # before the shrinkage: 85% of draws
    (0.1, 1005, {}, 1, 0.85),            # before: 56%
    (0.5, 600, {2: 395, 29: 5}, 2, 0.95),  # 5 units of 1000 in 30 groups; before: 72%
])
def test_g_reads_past_the_noisy_tail(epsilon_h: float, head: int, at: dict[int, int],
                                     best: int, share: float) -> None:
    """Small skewed populations, the groups histogram at epsilon_h, the key release at
    epsilon_t 0.18 and delta 1e-8: g is the exact counts' choice in at least ``share`` of 300
    draws (benchmarks/groups_tail.py, 1000 seeded draws: 99%, 96%, 100%; the rule on the
    consistent counts: 85%, 56%, 72%, the rest far above, where tau(g) hides every group)."""
    exact = tail(float(head), {s: float(u) for s, u in at.items()})
    assert choose_groups_checked(RowModel(cap_bins(200), exact, 200, 0.0), 0.18, 1e-8).groups \
        == best
    noise = DiscreteLaplace.from_sensitivity(1, epsilon_h)
    found = [choose_groups_checked(RowModel(cap_bins(200),
                                            tuple(float(v) for v in noise.sample(np.array(exact))),
                                            200, epsilon_h), 0.18, 1e-8).groups
             for _ in range(300)]
    assert sum(g == best for g in found) >= share * len(found)


def test_rule_on_hours_of_the_day() -> None:
    # The 1M-trip demo's distinct pickup hours per rider (exact, in the bins of cap_bins(200)):
    # 0.71% of riders have more than 20 hours, 0.08% more than 23: g = 23 (bin [20, 23], m =
    # 21.5, is the last one above 20; 23 is its end).
    counts = [15855, 15533, 13553, 11443, 9472, 7787, 6391, 10066, 6898, 4726, 4482, 2277,
              1147, 90] + [0] * 13
    assert choose_groups(RowModel(cap_bins(200), tuple(map(float, counts)), 200, 0.0)) == 23


def test_suppression_term_by_hand() -> None:
    # The 1000 units of the doctest (bin [17, 19], m = 18) at epsilon_t = 1, delta = 1e-8:
    # g = 19: tau = 1 + 19 ln(19 / 1e-8) = 406.9, n = 18000 / 19 = 947.4, r = 0.4295,
    # S = 1 - (1 + r) e^-r = 0.0696, nothing lost.  g = 17: tau = 362.3, n = 17000 / 19,
    # S = 0.0629, plus L / P = 1000 / 18000: 0.118.  The rule keeps 19.
    one_bin = RowModel(cap_bins(200), (0,) * 11 + (1000,) + (0,) * 15, 200, 0.0)
    tau19 = key_release_threshold(19.0, 19, 1e-8)
    assert tau19 == pytest.approx(1 + 19 * math.log(19e8))
    r = tau19 / (18000 / 19)
    assert 1 - (1 + r) * math.exp(-r) == pytest.approx(0.0696, abs=1e-4)
    assert choose_groups(one_bin, 1.0, 1e-8) == 19
    # At epsilon_t = 0.05 tau(19) = 8119 hides nearly every group (r = 8.6, S ~ 0.998): a
    # smaller g drops pairs but releases groups.  By hand, g = 8 (bin-start candidate, ends:
    # all units keep 8 of 18): L / P = 10 / 18 = 0.556, tau(8) = 1 + 160 ln(8e8) = 3281,
    # n = 8000 / 19 = 421: r = 7.78, S = 0.997: worse.  Every candidate's S stays near 1, so
    # the pairs lost decide: g = 19 again.
    assert choose_groups(one_bin, 0.05, 1e-8) == 19


def test_suppression_moves_g_down_on_hours_at_a_small_epsilon() -> None:
    # The demo's hours (test above): g_q = 23.  At epsilon_t = 0.09 (the demo's default 0.5),
    # tau(23) = 5510 against n = 22,800 riders per hour: S = 2.5%, and g stays near g_q.  At
    # epsilon_t = 0.018 (epsilon 0.1), tau(23) = 27,545 > n: S(23) = 34%, and a g near 13
    # (tau 15,200, S ~ 14%, ~4% of pairs lost) releases most hours.
    counts = [15855, 15533, 13553, 11443, 9472, 7787, 6391, 10066, 6898, 4726, 4482, 2277,
              1147, 90] + [0] * 13
    hours = RowModel(cap_bins(200), tuple(map(float, counts)), 200, 0.0)
    assert 20 <= choose_groups(hours, 0.09, 1e-8) <= 23
    small = choose_groups(hours, 0.018, 1e-8)
    assert 10 <= small <= 16
    # The minimum by an independent computation of E(g) over the candidates g <= g_q.
    pairs = hours.all_rows()

    def e(g: int) -> float:
        r = key_release_threshold(g / 0.018, g, 1e-8) / (hours.kept(g) / 23)
        return hours.lost(g) / pairs + 1 - (1 + r) * math.exp(-r)

    assert small == min((c for c in hours.candidates() if c <= 23), key=lambda c: (e(c), -c))


# -- sensitivities and the threshold -----------------------------------------------------------
def test_threshold_at_d_groups_by_hand() -> None:
    # Separate key-release count, epsilon 1, share 0.2: eps_t = 0.2, D = 4: b = 20,
    # tau = 1 + 20 ln(4 / 1e-6) = 1 + 20 * 15.2018 = 305.04.
    plan = plan_noise([NoiseRequest("m0", 12.0, True)], 1.0, DELTA, ThresholdRequest(None, 4))
    assert plan.threshold is not None
    assert plan.threshold.mechanism.scale == pytest.approx(20.0)
    assert plan.threshold.threshold == pytest.approx(1 + 20 * math.log(4e6))
    assert plan.threshold.threshold == pytest.approx(305.036, abs=1e-3)
    assert key_release_threshold(20.0, 4, DELTA) == plan.threshold.threshold


POLICY = """
[backend]
url = "{url}"

[privacy]
epsilon_per_block = 1e6
delta_per_block = 1e-3
max_epsilon_per_query = 1e5
max_delta_per_query = 1e-4
default_delta = 1e-6
cap_epsilon_share = 0.5

[tables.spread]
privacy_unit = "unit_id"
max_rows_per_unit = 50
contribution = "auto"
bounding = "BOUNDING"

[tables.spread.columns]
unit_id = {{ type = "int" }}
grp     = {{ type = "int" }}
value   = {{ type = "float", lower = 0, upper = 10 }}
kind    = {{ type = "text", public_values = ["a", "b"] }}

[analysts.alice]
"""


@pytest.fixture
def spread(scratch: Callable[..., Engine], backend_url: str) -> Callable[..., Engine]:
    """Table `spread`: 300 units, each with ``rows`` rows in each of ``groups`` groups (grp)."""
    double = "DOUBLE" if backend_url.startswith("duckdb") else "DOUBLE PRECISION"

    def make(groups: int, rows: int, null_group: bool = False,
             bounding: str = "per-query") -> Engine:
        grp = "CASE WHEN g = 1 THEN NULL ELSE g END" if null_group else "g"
        create = (f"CREATE TABLE spread AS SELECT CAST(u AS BIGINT) AS unit_id, "
                  f"CAST({grp} AS BIGINT) AS grp, CAST(r AS {double}) AS value, "
                  "CASE WHEN r % 2 = 0 THEN 'a' ELSE 'b' END AS kind "
                  f"FROM generate_series(1, 300) AS a(u), generate_series(1, {groups}) AS b(g), "
                  f"generate_series(1, {rows}) AS c(r)")
        return scratch("spread", [create], POLICY.replace("BOUNDING", bounding))

    return make


SQL = ("SELECT grp, COUNT(*) AS n, COUNT(DISTINCT unit_id) AS units, SUM(value) AS s "
       "FROM spread GROUP BY grp")


def test_sensitivities_under_both_bounds(spread: Callable[..., Engine]) -> None:
    engine = spread(4, 3)
    query = engine._analyse(SQL)
    bounded = query.with_cap(12).with_groups(4)
    sens = {m.kind: m.sensitivity for m in bounded.measurements}
    # <= 12 rows in <= 4 groups: COUNT vector L1 <= 12, distinct-unit counts +1 in <= 4 groups,
    # SUM(value in [0, 10]) <= 12 * 10.
    assert sens == {"count": 12, "count_units": 4, "sum": 120}
    assert bounded.groups_per_unit == 4
    # g above the cap changes nothing: D = min(g, k) = k.
    wide = query.with_cap(3).with_groups(20)
    assert {m.kind: m.sensitivity for m in wide.measurements}["count_units"] == 3
    assert wide.groups_per_unit == 3
    # Re-deriving at another cap keeps g.
    assert {m.kind: m.sensitivity for m in bounded.with_cap(8).measurements}["count_units"] == 4
    # Public keys: no thresholding, no g.
    with pytest.raises(ValueError):
        engine._analyse("SELECT kind, COUNT(*) FROM spread GROUP BY kind").with_groups(2)


@pytest.mark.parametrize("null_group", [False, True])
def test_rows_kept_in_at_most_g_groups(spread: Callable[..., Engine], backend_url: str,
                                       null_group: bool) -> None:
    # Every unit has 6 groups (one of them NULL: a group of its own) with 2 rows each.  Kept in
    # g = 2 groups and k = 3 rows: exactly 2 groups and 3 rows per unit, the groups drawn at
    # random (15 possible pairs; 300 units show many of them).
    engine = spread(6, 2, null_group)
    query = engine._analyse(SQL)
    rows = filtered_rows(query, None, None)
    kept = contribution(group_bound(rows, "unit_id", [k.expr for k in query.keys], 2),
                        "unit_id", 3)
    flavour = "duckdb" if backend_url.startswith("duckdb") else "postgres"
    inner = dialect(kept, flavour).sql(flavour)
    per_unit = engine.backend.run(
        f"SELECT k.unit_id, COUNT(DISTINCT COALESCE(k.grp, -1)), COUNT(*), "
        f"MIN(COALESCE(k.grp, -1)) * 100 + MAX(COALESCE(k.grp, -1)) FROM ({inner}) AS k "
        "GROUP BY k.unit_id").rows
    assert len(per_unit) == 300
    assert {(g, n) for _, g, n, _ in per_unit} == {(2, 3)}
    assert len({pair for *_, pair in per_unit}) >= 8


@pytest.mark.parametrize("null_group", [False, True])
def test_groups_histogram_counted_per_unit_or_by_pairs(spread: Callable[..., Engine],
                                                       backend_url: str,
                                                       null_group: bool) -> None:
    """The groups histogram in one aggregation per unit (COUNT(DISTINCT key), plus 1 for a
    NULL key, Postgres's form) and by (unit, key) pairs give the same rows: 300 units of 5
    groups each (one NULL: a group of its own), plus, with ``WHERE``, units cut to fewer
    groups; by hand: bins start at (1, 2, 4), so G_u = 5 is bin 2, G_u = 3 bin 1."""
    engine = spread(5, 2, null_group)
    flavour = "duckdb" if backend_url.startswith("duckdb") else "postgres"
    starts = (1, 2, 4)
    for where, expected in (("", {(2, 300)}),
                            (" WHERE unit_id > 100 OR grp <= 3 OR grp IS NULL",
                             {(2, 200), (1, 100)})):
        query = engine._analyse(SQL.replace(" GROUP BY", where + " GROUP BY"))
        rows = {}
        for distinct in (False, True):
            tree = group_histogram(query, None, None, starts, distinct)
            text = dialect(tree, flavour).sql(flavour)
            assert ("DISTINCT" in text) == distinct
            rows[distinct] = set(engine.backend.run(text).rows)
        assert rows[True] == rows[False] == expected


@pytest.mark.parametrize("bounding", ["per-query", "materialized"])
def test_engine_chooses_g_and_releases_the_groups(spread: Callable[..., Engine],
                                                  bounding: str) -> None:
    # 300 units, each with 3 rows in each of 4 groups.  At epsilon 40 (20 on three histograms:
    # groups, rows, values; noise variance ~1e-5) g = 4: no unit has more, fewer leaves every
    # unit above it.  A stored sample (materialized) is read the same way, g applied on top.
    engine = spread(4, 3, bounding=bounding)
    result = engine.execute(SQL, epsilon=40.0, delta=DELTA, **ALICE)
    report = result.report
    contribution_report = report.contribution
    assert contribution_report is not None
    steps = {s.kind: s for s in contribution_report.steps}
    assert steps["groups"].chosen == "4 groups"
    k = contribution_report.cap
    assert k is not None and k >= 4
    sens = {m.aggregate: m.sensitivity for m in report.measurements}
    assert sens["COUNT(*)"] == k and sens["COUNT(DISTINCT unit_id)"] == 4
    # SUM(value) clipped to the chosen [l', u'] inside [0, 10]: Delta = k * max(|l'|, |u'|).
    low, high = (float(v) for v in steps["bounds"].chosen.strip("[]").split(", "))
    assert 0 <= low <= high <= 10
    assert sens["SUM(spread.value)"] == pytest.approx(k * max(abs(low), abs(high)), rel=1e-5)
    # The distinct-unit count (sensitivity D = 4) gates the keys: tau = 1 + b ln(4 / delta).
    gate = next(m for m in report.measurements if m.aggregate == "COUNT(DISTINCT unit_id)")
    b = gate.mechanism["scale"]
    assert b == pytest.approx(4 / gate.mechanism["epsilon"])
    assert report.key_release.threshold == pytest.approx(1 + b * math.log(4 / DELTA))
    assert "D = 4 groups per unit" in report.key_release.note
    assert "__chorus_grank <= 4" in report.rewritten_sql  # the rows kept in 4 groups per unit
    # Every group is released with all its 300 units (far above tau ~ 10), each count within
    # its noise: Laplace of scale b beyond b ln(1e6) once in a million.
    assert sorted(row[0] for row in result.rows) == [1, 2, 3, 4]
    assert all(abs(row[2] - 300) < b * math.log(1e6) for row in result.rows)
    # The selection parts add up to what was charged.
    spent = contribution_report.epsilon + sum(m.mechanism["epsilon"]
                                              for m in report.measurements)
    assert spent == pytest.approx(40.0, rel=1e-12)
    assert sum(s.epsilon for s in contribution_report.steps) == pytest.approx(20.0)


def test_explain_lists_the_groups_step_without_running_it(spread: Callable[..., Engine]) -> None:
    engine = spread(4, 3)
    report = engine.explain("SELECT grp, COUNT(*) FROM spread GROUP BY grp", epsilon=1.0,
                            delta=DELTA, **ALICE)
    steps = {s.kind: s for s in report.contribution.steps}
    assert steps["groups"].chosen is None and steps["groups"].epsilon == pytest.approx(0.25)
    # Shown at the limit: D = 50, the separate count gets 20% of the 0.5 left: b = 50 / 0.1.
    assert report.key_release.threshold == pytest.approx(1 + 500 * math.log(50 / DELTA))
    assert nothing_spent(engine)
    # Public keys need no groups step.
    public = engine.explain("SELECT kind, COUNT(*) FROM spread GROUP BY kind", epsilon=1.0,
                            **ALICE)
    assert "groups" not in {s.kind for s in public.contribution.steps}


def test_demo_busiest_hours_are_released(backend_url: str,
                                         make_engine: Callable[..., Engine]) -> None:
    # The demo's busiest-hours query at the cap limit 200, with a key the key analysis does not
    # recognise (EXTRACT(hour ...) + 0: released by the threshold; EXTRACT(hour ...) itself is a
    # public calendar key, analyses.keys): with D = k = 200 the threshold hides every hour of
    # the small test data; with g chosen (<= 24 hours a rider can reach) the three busiest
    # hours come back, with their true counts.
    engine = make_engine(backend_url, k=200, contribution="auto", epsilon_per_block=1e6,
                         max_epsilon=1e5)
    truth = dict(engine.backend.run(
        "SELECT EXTRACT(hour FROM pickup_time), COUNT(*) FROM trips GROUP BY 1").rows)
    top = sorted(truth.values(), reverse=True)[:3]
    for key, thresholded in (("EXTRACT(hour FROM pickup_time) + 0", True),
                             ("EXTRACT(hour FROM pickup_time)", False)):
        sql = f"SELECT {key} AS hour, COUNT(*) AS trips FROM trips GROUP BY 1 " \
              "ORDER BY trips DESC LIMIT 3"
        result = engine.execute(sql, epsilon=200.0, **ALICE)
        steps = {s.kind: s.chosen for s in result.report.contribution.steps}
        if thresholded:
            assert int(steps["groups"].split()[0]) <= 24
        else:  # public keys: no groups per rider to choose, no threshold
            assert "groups" not in steps and result.report.key_release.method == \
                "public_values"
        assert len(result.rows) == 3
        assert [row[1] for row in result.rows] == pytest.approx(top, abs=0.05 * top[0])
