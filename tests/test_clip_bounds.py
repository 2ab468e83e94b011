"""Automatic clipping bounds (clipping = "auto"): the histogram's math, the rule, end to end."""

from __future__ import annotations

import math
from collections.abc import Callable
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chorus_py.engine import Engine
from chorus_py.policy import TablePolicy
from mechanisms.caps import CapTerm, RowModel, choose
from mechanisms.clip_bounds import STEPS, ClipColumn, Z, magnitude_edges, representatives
from tests.conftest import nothing_spent, tolerance

ALICE = {"analyst": "alice"}


# -- the histogram and the rule ----------------------------------------------------------------
def test_edges_and_representatives() -> None:
    edges = magnitude_edges(8.0)
    assert len(edges) == STEPS + 1
    assert edges[:3] == (8.0, pytest.approx(8 / math.sqrt(2)), pytest.approx(4.0))
    assert edges[-1] == pytest.approx(8 * 2 ** -12)
    a = representatives(8.0)
    assert len(a) == STEPS + 2
    assert a[0] == 8.0                                     # exactly the declared bound
    assert a[2] == pytest.approx((4 + 8 / math.sqrt(2)) / 2)  # middle of [4, 5.657)
    assert a[-1] == pytest.approx(8 * 2 ** -13)            # middle of [0, 8 / 4096)
    with pytest.raises(ValueError):
        magnitude_edges(0.0)


def test_column_statistics_by_hand() -> None:
    # Half the weight at the bound 8, half in the lowest bin (a = 8 / 8192): mu = 4.00048828125.
    h = [0.0] * (STEPS + 2)
    h[0], h[-1] = 50.0, 50.0
    col = ClipColumn(0.0, 8.0, tuple(h))
    low = 8 / 8192
    assert col.mean() == pytest.approx((8 + low) / 2)
    # Clipped at 4: mu(4) = (4 + low) / 2, loss = (mu - mu(4)) / mu = 2 / mu.
    assert col.mean(4.0) == pytest.approx((4 + low) / 2)
    assert col.loss(4.0) == pytest.approx(2 / ((8 + low) / 2))
    assert col.loss(8.0) == 0.0
    # nu(B) = E[min(a, B)^2] - mu(B)^2 = (16 + low^2) / 2 - ((4 + low) / 2)^2 at B = 4.
    assert col.spread(4.0) == pytest.approx((16 + low * low) / 2 - ((4 + low) / 2) ** 2)
    # The upper estimate adds Z sd loss(B), sd loss(B) = sqrt(V sum_j (e_j - loss a_j)^2) / A
    # (the delta method), e_j = max(0, a_j - B), A = W mu; V = the Snapping variance.
    noisy = ClipColumn(0.0, 8.0, tuple(h), epsilon=1.0)
    from mechanisms import Snapping

    v = Snapping.from_sensitivity(1.0, 1.0).variance()
    loss = col.loss(4.0)
    deviations = [max(0.0, x - 4.0) - loss * x for x in representatives(8.0)]
    sd = math.sqrt(v * sum(d * d for d in deviations)) / (100 * col.mean())
    assert noisy.loss_sd(4.0) == pytest.approx(sd)
    assert noisy.loss_upper(4.0) == pytest.approx(loss + Z * sd)
    assert noisy.loss_upper(4.0, z=0.0) == pytest.approx(loss)


def test_variance_terms_by_hand() -> None:
    # Half the weight at 8, half in the lowest bin (a_low = 8 / 8192), as above.
    h = [0.0] * (STEPS + 2)
    h[0], h[-1] = 50.0, 50.0
    col = ClipColumn(0.0, 8.0, tuple(h))
    low = 8 / 8192
    # Two equal masses d apart: nu = d^2 / 4, E[(x - mu)^4] = d^4 / 16, kappa = 1.
    # At M = 8: d = 8 - low; at B = 4: d = 4 - low.  Spread loss = 1 - (4 - low)^2 / (8 - low)^2.
    assert col.spread(8.0) == pytest.approx((8 - low) ** 2 / 4)
    assert col.spread_loss(4.0) == pytest.approx(1 - (4 - low) ** 2 / (8 - low) ** 2)
    assert col.spread_loss(8.0) == 0.0
    assert col.kurtosis(8.0) == pytest.approx(1.0)
    # A 90/10 split: kappa = (1 - 3pq) / (pq) with p = 0.9, q = 0.1 -> 0.73 / 0.09 = 8.11.
    h[0], h[-1] = 10.0, 90.0
    assert ClipColumn(0.0, 8.0, tuple(h)).kurtosis(8.0) == pytest.approx(0.73 / 0.09, rel=1e-6)


def test_variance_keeps_the_tail_that_makes_its_spread() -> None:
    # 1000 units, one row each: 580 near 1.71 (bin 5), 400 near 3.41 (bin 3), 20 at the bound
    # 8.  mu = 0.58 * 1.70711 + 0.4 * 3.41421 + 0.02 * 8 = 2.51581; nu(8) = E[a^2] - mu^2 =
    # 0.58 * 2.91421 + 0.4 * 11.65685 + 0.02 * 64 - 6.32928 = 1.30370.  At B = 4 the 20 values
    # lose 4 each: mu(4) = 2.43581, nu(4) = 6.67299 - 5.93316 = 0.73983, a spread loss of
    # 1 - 0.73983 / 1.30370 = 43.3%.  A VARIANCE (centred sum of squares in a ratio, epsilon
    # 1): noise sqrt(2) 16 / (1000 nu(8)) = 0.0174 at B = 8 against sqrt(2) 4 / (1000 nu(4))
    # = 0.0076 at B = 4.  Without the spread term B = 4 looks
    # better; with it (+0.43) B stays 8.
    h = [0.0] * (STEPS + 2)
    h[0], h[3], h[5] = 20.0, 400.0, 580.0
    col = ClipColumn(0.0, 8.0, tuple(h))
    assert col.spread(8.0) == pytest.approx(1.30370, abs=1e-5)
    assert col.spread(4.0) == pytest.approx(0.73983, abs=1e-5)
    assert col.spread_loss(4.0) == pytest.approx(1 - 0.73983 / 1.30370, abs=1e-5)
    squares = CapTerm(0.0, 1.0, False, column=0, kind="sum_squares", centred=True)
    assert choose(RowModel.exact_rows(1000), [squares], [col]).bounds == (8.0,)
    # A mean over the same column has no spread term: at epsilon 0.01 its noise at B = 8,
    # sqrt(2) 8 / (1000 * 2.516 * 0.01) = 45%, outweighs the 0.08 / 2.516 = 3.2% bias of B = 4.
    mean = CapTerm(0.0, 0.01, False, column=0, kind="sum", centred=True)
    assert choose(RowModel.exact_rows(1000), [mean], [col]).bounds[0] < 8.0


def _two_values(lower: float = 0.0, upper: float = 8.0) -> ClipColumn:
    """Half the weight at the bound 8 (bin 0), half in bin 1, [5.657, 8), whose middle is
    a_1 = (8 + 8 / sqrt(2)) / 2 = 6.828427: mu = 7.414214, nu = (8 - a_1)^2 / 4 = 0.343146."""
    h = [0.0] * (STEPS + 2)
    h[0], h[1] = 500.0, 500.0
    return ClipColumn(lower, upper, tuple(h))


def test_offset_of_the_mean_from_the_centre_by_hand() -> None:
    a1 = (8 + 8 / math.sqrt(2)) / 2
    mu = (8 + a1) / 2
    # [0, 8]: the magnitudes are the values; c = 4, s = mu - 4 = 3.414214 (uncentred: s = mu).
    col = _two_values()
    assert col.offset(8.0, centred=True) == pytest.approx(mu - 4)
    assert col.offset(8.0, centred=False) == pytest.approx(mu)
    # At B = 4 every value clips to 4 = u', c = 2: s = 2.
    assert col.offset(4.0, centred=True) == pytest.approx(2.0)
    # [-8, 0]: the values are -|x|, mean -mu, c = -4: s = |-mu + 4| = mu - 4.
    assert _two_values(-8.0, 0.0).offset(8.0, centred=True) == pytest.approx(mu - 4)
    # [-2, 8]: signs unknown: the upper bound min(h, mu + |c|), c = 3, h = 5: 5.
    assert _two_values(-2.0, 8.0).offset(8.0, centred=True) == pytest.approx(5.0)
    # [-8, 8], c = 0: min(8, mu) = mu.
    assert _two_values(-8.0, 8.0).offset(8.0, centred=False) == pytest.approx(mu)


def test_ratio_noise_by_hand() -> None:
    # 1000 units, one row each (exact rows: k = 1, n_k = n, no subsampling term), the column of
    # _two_values, exact histogram (no loss at B = 8; every narrower bound loses >= 23%).
    a1 = (8 + 8 / math.sqrt(2)) / 2
    mu, nu = (8 + a1) / 2, (8 - a1) ** 2 / 4
    s, h = mu - 4, 4.0  # c = 4, centred sums of x - 4 with per-row bound 4
    rows = RowModel.exact_rows(1000)
    col = _two_values()
    sum_ = CapTerm(0.0, 1.0, False, column=0, kind="sum", centred=True)
    count = CapTerm(1.0, 0.5, False, column=0, kind="count")
    # AVG = 4 + S / N: sd sqrt(2) sqrt((4 / 1)^2 + (3.414 / 0.5)^2) / 1000 = 0.011192, relative
    # to mu: 0.0015095.  (Weighed one measurement at a time, the count was a sum of per-row
    # bound 8 at epsilon 0.5 and the sum's part added on top: 0.0038149.)
    avg = choose(rows, [sum_, count], [col])
    assert avg.bounds == (8.0,)
    assert avg.error == pytest.approx(math.sqrt(2) * math.hypot(h / 1.0, s / 0.5) / (1000 * mu))
    assert avg.error == pytest.approx(0.0015095, rel=1e-4)
    # VARIANCE: add the centred sum of squares (per-row bound 16) at epsilon 2: sd sqrt(2)
    # sqrt((16 / 2)^2 + (2 s 4 / 1)^2 + ((s^2 - nu) / 0.5)^2) / 1000 = 0.0514206, relative
    # to nu: 0.149851.  Its spread loss and subsampling term are 0 here.
    squares = CapTerm(0.0, 2.0, False, column=0, kind="sum_squares", centred=True)
    var = choose(rows, [sum_, count, squares], [col])
    assert var.bounds == (8.0,)
    expected = math.sqrt(2) * math.sqrt((16 / 2) ** 2 + (2 * s * h) ** 2
                                        + ((s * s - nu) / 0.5) ** 2) / (1000 * nu)
    assert var.error == pytest.approx(expected)
    assert var.error == pytest.approx(0.149851, rel=1e-4)
    # COUNT(x) released as well (a total): its own error, sqrt(2) / 0.5 / 1000, joins the
    # AVG's, in which the count's noise still counts times s.
    released = CapTerm(1.0, 0.5, True, column=0, kind="count")
    both = choose(rows, [sum_, released], [col])
    assert both.error == pytest.approx(avg.error + math.sqrt(2) / 0.5 / 1000)


def test_variance_weighs_its_noise_against_subsampling() -> None:
    # Units with 1 row (600) and with 4 rows (100): n = 1000, and cap 1 keeps n_1 = 700 rows.
    # The column of _two_values (kappa = 1: two equal masses, so no subsampling term) at
    # epsilon 1 per measurement: the variance's noise grows with k / n_k, 1 / 700 at k = 1
    # and 4 / 1000 at k = 4: the rule picks 1.  E(1) = sqrt(2) sqrt(16^2 + (8 s)^2 +
    # (s^2 - nu)^2) / (700 nu).
    a1 = (8 + 8 / math.sqrt(2)) / 2
    mu, nu = (8 + a1) / 2, (8 - a1) ** 2 / 4
    s = mu - 4
    rows = RowModel((1, 2, 4), (600.0, 0.0, 100.0), 4, 0.0)
    assert rows.kept(1) == 700 and rows.all_rows() == 1000
    terms = [CapTerm(0.0, 1.0, False, column=0, kind="sum", centred=True),
             CapTerm(1.0, 1.0, False, column=0, kind="count"),
             CapTerm(0.0, 1.0, False, column=0, kind="sum_squares", centred=True)]
    choice = choose(rows, terms, [_two_values()])
    assert choice.cap == 1
    noise = math.sqrt(2) * math.sqrt(16 ** 2 + (8 * s) ** 2 + (s * s - nu) ** 2) / nu
    assert choice.error == pytest.approx(noise / 700)
    assert choose(rows, terms, [_two_values()], caps=(4,)).error == pytest.approx(
        4 * noise / 1000)


@given(lower=st.sampled_from([0.0, -3.0, -200.0, 1.0]), upper=st.sampled_from([7.5, 200.0]),
       noisy=st.lists(st.floats(-50.0, 5e4), min_size=STEPS + 2, max_size=STEPS + 2),
       epsilon=st.sampled_from([0.0, 0.05, 1.0]))
@settings(max_examples=60, deadline=None)
def test_every_bound_at_once_is_each_bound_by_the_formulas(
        lower: float, upper: float, noisy: list[float], epsilon: float) -> None:
    """The statistics at every candidate bound in one array operation (what the rule
    tabulates) against the module docstring's formulas summed bound by bound in plain Python
    (p_j = H'_j / W, a_j the representatives, m = min(a_j, B))."""
    col = ClipColumn(lower, upper, tuple(noisy), epsilon)
    bounds = col.candidates()
    weights = col.weights()
    total = sum(weights)
    p = [w / total for w in weights] if total >= 1.0 else [1.0] + [0.0] * (STEPS + 1)
    a = representatives(col.magnitude)
    variance = col._histogram_variance
    w_total = max(total, 1.0)
    a_total = max(sum(h * x for h, x in zip(weights, a, strict=True)), col.magnitude * 1e-9)

    def mean(b: float) -> float:
        return max(sum(pj * min(x, b) for pj, x in zip(p, a, strict=True)),
                   col.magnitude * 1e-9)

    def spread(b: float) -> float:
        mu = sum(pj * min(x, b) for pj, x in zip(p, a, strict=True))
        return max(sum(pj * min(x, b) ** 2 for pj, x in zip(p, a, strict=True)) - mu * mu,
                   (col.magnitude * 1e-6) ** 2)

    full_mean, full_spread = mean(col.magnitude), spread(col.magnitude)
    expected = {
        "means": [mean(b) for b in bounds],
        "mean_sds": [math.sqrt(variance * sum((min(x, b) - mean(b)) ** 2 for x in a))
                     / w_total for b in bounds],
        "losses": [min(max((full_mean - mean(b)) / full_mean, 0.0), 1.0) for b in bounds],
        "loss_sds": [math.sqrt(variance * sum(
            (max(x - b, 0.0) - min(max((full_mean - mean(b)) / full_mean, 0.0), 1.0) * x) ** 2
            for x in a)) / a_total for b in bounds],
        "spreads": [spread(b) for b in bounds],
        "spread_losses": [min(max((full_spread - spread(b)) / full_spread, 0.0), 1.0)
                          for b in bounds],
        "spread_loss_sds": [math.sqrt(variance * sum(max(x * x - b * b, 0.0) ** 2 for x in a))
                            / (w_total * full_spread) for b in bounds],
    }
    for name, values in expected.items():
        assert list(getattr(col, name)(bounds)) == pytest.approx(values, rel=1e-9, abs=1e-12), \
            name
    for b, got in zip(bounds, col.kurtoses(bounds), strict=True):
        mu = sum(pj * min(x, b) for pj, x in zip(p, a, strict=True))
        fourth = sum(pj * (min(x, b) - mu) ** 4 for pj, x in zip(p, a, strict=True))
        assert got == pytest.approx(max(fourth / spread(b) ** 2, 1.0), rel=1e-6)
    for centred in (False, True):
        for b, got in zip(bounds, col.offsets(bounds, centred), strict=True):
            lo, hi = col.interval(b)
            c = (lo + hi) / 2 if centred else 0.0
            want = (abs(mean(b) - c) if lower >= 0 else abs(mean(b) + c) if upper <= 0
                    else min(max(abs(lo - c), abs(hi - c)), mean(b) + abs(c)))
            assert got == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_intervals_and_per_row_bounds() -> None:
    col = ClipColumn(-3.0, 10.0, (1.0,) * (STEPS + 2))
    assert col.interval(10.0) == (-3.0, 10.0)
    assert col.interval(5.0) == (-3.0, 5.0)
    assert col.interval(2.0) == (-2.0, 2.0)
    assert col.per_row(5.0, "sum", centred=False) == 5.0            # max(|l'|, |u'|)
    assert col.per_row(5.0, "sum", centred=True) == 4.0             # (5 - (-3)) / 2
    assert col.per_row(5.0, "sum_squares", centred=True) == 16.0
    # A positive lower bound: no candidate below it (the interval would be empty).
    positive = ClipColumn(2.0, 8.0, (1.0,) * (STEPS + 2))
    assert min(positive.candidates()) >= 2.0
    assert positive.interval(4.0) == (2.0, 4.0)


def test_rule_narrows_to_where_the_values_are() -> None:
    # 1000 units, one row each (exact rows), values all in the bin [2, 2.83) of M = 8; a SUM
    # released as a total with epsilon 1.  Exact histogram (epsilon_h = 0): no loss at
    # B = 2.83, noise sqrt(2) * 2.83 vs sqrt(2) * 8 at the declared bound: B = 2.83.
    h = [0.0] * (STEPS + 2)
    h[4] = 1000.0  # bin 4 = [8 * 2^-2, 8 * 2^-1.5) = [2, 2.83)
    col = ClipColumn(0.0, 8.0, tuple(h))
    total = CapTerm(0.0, 1.0, True, column=0, kind="sum")
    choice = choose(RowModel.exact_rows(1000), [total], [col])
    assert choice.bounds == (pytest.approx(8 * 2 ** -1.5),)
    # At a tiny epsilon the noise dominates any clipping loss: the bound falls further.
    tiny = CapTerm(0.0, 1e-4, True, column=0, kind="sum")
    assert choose(RowModel.exact_rows(1000), [tiny], [col]).bounds[0] < 2.0


@settings(max_examples=200, deadline=None)
@given(lower=st.floats(-1e4, 1e4), width=st.floats(1e-3, 1e4), data=st.data())
def test_chosen_bounds_stay_inside_the_declared_ones(lower: float, width: float,
                                                     data: st.DataObject) -> None:
    upper = lower + width
    noisy = data.draw(st.lists(st.floats(-1e5, 1e5), min_size=STEPS + 2, max_size=STEPS + 2))
    col = ClipColumn(lower, upper, tuple(noisy), data.draw(st.just(0.0) | st.floats(1e-3, 10)))
    terms = [CapTerm(0.0, data.draw(st.floats(1e-3, 1e3)), data.draw(st.booleans()), column=0,
                     kind=data.draw(st.sampled_from(["sum", "sum_squares"])),
                     centred=data.draw(st.booleans()))]
    rows = RowModel((1, 2, 4), tuple(data.draw(st.lists(st.floats(-1e4, 1e4), min_size=3,
                                                        max_size=3))), 5, 0.5)
    choice = choose(rows, terms, [col])
    lo, hi = col.interval(choice.bounds[0])
    assert lower <= lo <= hi <= upper
    assert 1 <= choice.cap <= 5


# -- end to end ----------------------------------------------------------------------------------
# A generous selection share: the bound's bias is charged at its upper estimate (Z = 1), so the
# rule narrows to the data only when the histogram's epsilon is large against the measurements'
# (see mechanisms.caps); with 0.9 of epsilon 200 the best bound is chosen with high probability.
POLICY = """
[backend]
url = "{url}"

[privacy]
epsilon_per_block = 1e6
max_epsilon_per_query = 1e5
default_delta = 1e-8
cap_epsilon_share = 0.9

[tables.vals]
privacy_unit = "unit_id"
max_rows_per_unit = 50
contribution = "CONTRIBUTION"

[tables.vals.columns]
unit_id = {{ type = "int" }}
value   = {{ type = "float", lower = 0, upper = 1024 }}

[tables.ev]
clipping = "auto"

[tables.ev.columns]
value   = {{ type = "float", lower = -1024, upper = 1024 }}

[analysts.alice]
"""


@pytest.fixture
def values(scratch: Callable[..., Engine], backend_url: str) -> Callable[..., Engine]:
    """`vals`: 400 units with 6 rows of value 1.4 each; `ev`: 2000 rows of -1.4."""
    double = "DOUBLE" if backend_url.startswith("duckdb") else "DOUBLE PRECISION"

    def make(contribution: str = "auto") -> Engine:
        create = [
            f"CREATE TABLE vals AS SELECT CAST(u AS BIGINT) AS unit_id, CAST(1.4 AS {double}) "
            "AS value FROM generate_series(1, 400) AS a(u), generate_series(1, 6) AS b(r)",
            "DROP TABLE IF EXISTS ev",
            f"CREATE TABLE ev AS SELECT CAST(-1.4 AS {double}) AS value "
            "FROM generate_series(1, 2000) AS a(i)",
        ]
        policy = POLICY.replace("CONTRIBUTION", contribution)
        return scratch("vals", create, policy)

    return make


# 1.4 lies in [1, 1.41421) = [1024 * 2^-10, 1024 * 2^-9.5): its smallest lossless bound.
BEST = 1024 * 2 ** -9.5


def _upper(chosen: str | None) -> float:
    """u' of a chosen "[l', u']", checked to be a lossless bound near the values: BEST, or a
    few edges above it.  The bias is charged at its upper estimate, and the histogram noise at
    the declared bound 1024 (a_0 - B ~ 1024, worth a thousand values of 1.4) sometimes keeps a
    wider edge; the chosen bound is then still at most 16, 1/64 of the declared one."""
    assert chosen is not None
    high = float(chosen.strip("[]").split(", ")[1])
    assert BEST * (1 - 1e-5) <= high <= 16
    # The report shows 6 significant digits: the bound itself is the nearest edge.
    edge = min(magnitude_edges(1024.0), key=lambda e: abs(e - high))
    assert edge == pytest.approx(high, rel=1e-5)
    return edge


def test_sum_and_avg_use_the_bound_where_the_values_are(values: Callable[..., Engine]) -> None:
    """Measured: in about 3% of runs a quantum of the histogram's noise (1/32 of a unit) in a
    top bin, charged at its upper estimate (a unit near 1024 is worth ~700 values of 1.4),
    keeps a bound of 22-256; so 5 runs, at least 3 of them at most 16 (a miss of this test:
    P(>= 3 of 5) ~ 3e-4), the answer checked on the first of those."""
    engine = values()
    runs = [engine.execute("SELECT SUM(value), AVG(value) FROM vals", epsilon=200.0, **ALICE)
            for _ in range(5)]
    chosen = [r.report.contribution.steps[1].chosen for r in runs]
    assert all(r.report.contribution.steps[1].declared == "[0, 1024]" for r in runs)
    assert all(c is not None and c.startswith("[0, ") for c in chosen)
    near = [r for r, c in zip(runs, chosen, strict=True)
            if float(c.strip("[]").split(", ")[1]) <= 16]
    assert len(near) >= 3, chosen
    result = near[0]
    report = result.report
    steps = report.contribution.steps
    assert [s.kind for s in steps] == ["cap", "bounds"]
    best = _upper(steps[1].chosen)
    assert report.contribution.cap == 6
    total, mean = result.rows[0]
    sum_m = next(m for m in report.measurements if m.aggregate.startswith("SUM(vals.value)"))
    # SUM clipped to [0, 1.41421] over the chosen cap: Delta = k * 1.41421.
    assert sum_m.sensitivity == pytest.approx(report.contribution.cap * best)
    assert total == pytest.approx(400 * 6 * 1.4, abs=tolerance(report.columns[0]))
    # AVG is re-centred on the chosen interval (c = B / 2), so it lands on 1.4, not near 512:
    # c + (S + e1) / (N + e2) with S = (1.4 - c) N is off by (e1 - (1.4 - c) e2) / (N + e2),
    # at most (t1 + |1.4 - c| t2) / (N - t2) for the tolerances t of S's and N's noise (a
    # fixed 0.01 failed once in CI: a bound of 8-16 has 6-11 times the noise of 1.41421).
    s_m, n_m = (next(m for m in report.measurements if m.id == i)
                for i in report.columns[1].measurements)
    assert s_m.aggregate.startswith("SUM(") and n_m.aggregate.startswith("COUNT(")
    t1, t2 = (tolerance(SimpleNamespace(scale=m.mechanism["scale"])) for m in (s_m, n_m))
    rows = 400 * 6
    assert mean == pytest.approx(1.4, abs=(t1 + abs(1.4 - best / 2) * t2) / (rows - t2))
    centred = next(m for m in report.measurements if f"- {best / 2:g}" in m.aggregate)
    assert centred.sensitivity == pytest.approx(report.contribution.cap * best / 2)


def test_epsilon_parts_add_up_to_the_charge(values: Callable[..., Engine]) -> None:
    engine = values()
    result = engine.execute("SELECT COUNT(*), STDDEV(value) FROM vals", epsilon=3.0, **ALICE)
    report = result.report
    parts = [s.epsilon for s in report.contribution.steps]
    assert len(parts) == 2 and parts[0] == pytest.approx(parts[1])
    assert sum(parts) == pytest.approx(report.contribution.epsilon)
    assert report.contribution.epsilon == pytest.approx(2.7)  # cap_epsilon_share = 0.9
    spent = sum(parts) + sum(m.mechanism["epsilon"] for m in report.measurements)
    assert spent == pytest.approx(3.0, rel=1e-12)
    assert report.epsilon == 3.0
    (block,) = engine.ledger.blocks()
    assert block.epsilon_consumed == pytest.approx(3.0)


def test_explain_lists_the_steps_without_running_them(values: Callable[..., Engine]) -> None:
    engine = values()
    report = engine.explain("SELECT AVG(value) FROM vals", epsilon=1.0, **ALICE)
    steps = report.contribution.steps
    assert [(s.kind, s.chosen) for s in steps] == [("cap", None), ("bounds", None)]
    assert [s.target for s in steps] == ["rows per unit_id", "vals.value"]
    assert sum(s.epsilon for s in steps) == pytest.approx(0.9)
    assert "clipping bounds of vals.value" in report.contribution.note
    # Shown at the limit and the declared bounds: centred SUM, Delta = 50 * 512.
    assert max(m.sensitivity for m in report.measurements) == 50 * 512
    assert nothing_spent(engine)


def test_fixed_cap_with_automatic_bounds(values: Callable[..., Engine]) -> None:
    engine = values(contribution="fixed")
    assert engine.policy.tables["vals"].auto_clipping is False  # the default follows
    engine.policy.tables["vals"] = TablePolicy.model_validate(
        {**engine.policy.tables["vals"].model_dump(), "clipping": "auto"})
    result = engine.execute("SELECT SUM(value) FROM vals", epsilon=200.0, **ALICE)
    contribution = result.report.contribution
    assert contribution.mode == "fixed" and contribution.cap == 50
    assert contribution.steps[0].chosen == "cap 50 (fixed)"
    best = _upper(contribution.steps[1].chosen)
    assert result.report.measurements[0].sensitivity == pytest.approx(50 * best)


def test_event_level_table_with_automatic_bounds(values: Callable[..., Engine]) -> None:
    engine = values()
    result = engine.execute("SELECT SUM(value) FROM ev", epsilon=200.0, **ALICE)
    contribution = result.report.contribution
    # No privacy unit: no cap histogram; a symmetric interval narrows symmetrically (to
    # [-1.41421, 1.41421] about 9 times in 10: one histogram at epsilon 180 against one SUM
    # at 20; the answer is right whichever lossless bound is chosen).
    assert [s.kind for s in contribution.steps] == ["bounds"]
    lo, hi = (float(v) for v in contribution.steps[0].chosen.strip("[]").split(", "))
    assert lo == -hi and BEST * 0.999 <= hi < 1024
    assert contribution.epsilon == pytest.approx(180.0)
    assert result.rows[0][0] == pytest.approx(-2800, abs=tolerance(result.report.columns[0]))
