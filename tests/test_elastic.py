"""Elastic sensitivity and the smooth bound (analyses.elastic) against hand-derived values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyses.elastic import (
    Const,
    Freq,
    _tail_bound,
    add,
    maximum,
    minimum,
    mul,
    smooth_bound,
    smoothing_beta,
)

MF = {"orders.customer_id": 100.0, "recommendations.customer_id": 250.0}
ORDERS = Freq("orders.customer_id", 1)
RECS = Freq("recommendations.customer_id", 1)


def join(a: Freq, b: Freq) -> object:
    """r1 JOIN r2 ON a = b, two base private tables: max(mf_k(a) * 1, mf_k(b) * 1)."""
    return maximum(mul(a, Const(1)), mul(b, Const(1)))


def self_join(a: Freq, b: Freq) -> object:
    """A table joined to itself: mf_k(a) * S2 + mf_k(b) * S1 + S1 * S2 with S1 = S2 = 1."""
    return add(mul(a, Const(1)), mul(b, Const(1)), mul(Const(1), Const(1)))


# -- DESIGN.md section 5 worked values ----------------------------------------------------------

def test_worked_join_250_252() -> None:
    s = join(ORDERS, RECS)
    assert (s.at(0, MF), s.at(2, MF)) == (250, 252)


def test_worked_self_join_201_205_231() -> None:
    s = self_join(ORDERS, ORDERS)
    assert [s.at(k, MF) for k in (0, 2, 15)] == [201, 205, 231]


def test_worked_smoothing_scale_5409() -> None:
    beta = smoothing_beta(0.1, 1e-8)
    assert beta == pytest.approx(0.0026159, abs=1e-7)
    bound = smooth_bound(Freq("x", 1), {"x": 250}, beta)
    assert bound.peak_k == 132
    assert bound.value == pytest.approx(270.459, abs=1e-3)
    assert bound.scale(0.1) == pytest.approx(5409.18, abs=0.01)
    assert bound.at_zero == 250


# -- more hand-derived cases -----------------------------------------------------------------------

def test_constant_stability_peaks_at_zero() -> None:
    # A join to a public table: S(k) = 1 * mf(public key) = 7 at every k; S* = 7 at k = 0.
    s = mul(Const(1), Freq("cities.city", 0))
    bound = smooth_bound(s, {"cities.city": 7}, smoothing_beta(1.0, 1e-6))
    assert (bound.value, bound.peak_k) == (7, 0)


def test_linear_small_mf_peaks_at_one() -> None:
    # beta = 0.5 (delta = 2 / e): S(k) = 1 + k: k=0: 1, k=1: 2 e^-0.5 = 1.21306, k=2: 3 e^-1.
    beta = smoothing_beta(1.0, 2 / math.e)
    assert beta == pytest.approx(0.5)
    bound = smooth_bound(Freq("x", 1), {"x": 1}, beta)
    assert bound.peak_k == 1
    assert bound.value == pytest.approx(2 * math.exp(-0.5))


def test_linear_large_mf_peaks_at_zero() -> None:
    # 1 / beta - m = 2 - 5 < 0: exp(-beta k)(5 + k) falls from k = 0.
    bound = smooth_bound(Freq("x", 1), {"x": 5}, 0.5)
    assert (bound.value, bound.peak_k) == (5, 0)


def test_square_peaks_at_two_over_beta_minus_m() -> None:
    # (1 + k)^2 e^{-k/2}: derivative zero at k = 2/beta - 1 = 3: 16 e^-1.5 = 3.5701.
    s = mul(Freq("x", 1), Freq("x", 1))
    bound = smooth_bound(s, {"x": 1}, 0.5)
    assert bound.peak_k == 3
    assert bound.value == pytest.approx(16 * math.exp(-1.5))


def test_unit_growth_c() -> None:
    # A table with at most c = 10 rows per unit: mf_k = mf + 10 k. mf = 5, beta = 0.5:
    # k=0: 5, k=1: 15 e^-0.5 = 9.098, k=2: 25 e^-1 = 9.197, k=3: 35 e^-1.5 = 7.81.
    bound = smooth_bound(Freq("t.a", 10), {"t.a": 5}, 0.5)
    assert bound.peak_k == 2
    assert bound.value == pytest.approx(25 * math.exp(-1))


def test_three_table_chain() -> None:
    # (a JOIN b ON a.x = b.x) JOIN c ON b.y = c.y, all private, event level.
    # S_ab = max(mf_k(a.x), mf_k(b.x)); mf_k(b.y) after the join = mf_k(b.y) * mf_k(a.x);
    # S = max(mf_k(b.y, ab) * S_c, mf_k(c.y) * S_ab).  mf: a.x 3, b.x 4, b.y 2, c.y 5.
    ax, bx, by, cy = (Freq(n, 1) for n in ("a.x", "b.x", "b.y", "c.y"))
    s_ab = maximum(ax, bx)
    s = maximum(mul(by, ax, Const(1)), mul(cy, s_ab))
    mf = {"a.x": 3, "b.x": 4, "b.y": 2, "c.y": 5}
    # k = 0: max(2*3, 5*4) = 20; k = 1: max(3*4, 6*5) = 30.
    assert (s.at(0, mf), s.at(1, mf)) == (20, 30)


def test_min_of_equalities() -> None:
    # ON a.x = b.x AND a.y = b.y: the smaller bound at each k.  x: mfs 9 and 2 -> 9 + k;
    # y: 3 and 4 -> 4 + k.  min = 4 + k.
    sx = maximum(Freq("a.x", 1), Freq("b.x", 1))
    sy = maximum(Freq("a.y", 1), Freq("b.y", 1))
    s = minimum(sx, sy)
    mf = {"a.x": 9, "b.x": 2, "a.y": 3, "b.y": 4}
    assert [s.at(k, mf) for k in (0, 5)] == [4, 9]


def test_self_join_on_unique_key() -> None:
    # A key that is unique (mf 1) joined to itself: 1 + 1 + 1 = 3 at k = 0, 3 + 2k later.
    s = self_join(Freq("t.id", 1), Freq("t.id", 1))
    assert [s.at(k, {"t.id": 1}) for k in (0, 1, 4)] == [3, 5, 11]


def test_falls_then_rises_is_not_cut_short() -> None:
    # 1 + 0.001 k^3 with beta = 0.1 falls from k=0 to k=1 (1.001 e^-0.1 < 1) and rises again:
    # stopping at the first fall would return S* = 1, the true maximum is 1.39698 at k = 29.
    s = add(Const(1), mul(Const(0.001), Freq("x", 1), Freq("x", 1), Freq("x", 1)))
    mf = {"x": 0.0}
    assert s.at(1, mf) * math.exp(-0.1) < s.at(0, mf)
    bound = smooth_bound(s, mf, 0.1)
    brute = max(math.exp(-0.1 * k) * (1 + 0.001 * k**3) for k in range(2000))
    assert bound.value == pytest.approx(brute)
    assert bound.value > 1.39 and bound.peak_k == 29  # 25.389 e^-2.9 = 1.39698


def test_max_of_constant_and_quadratic() -> None:
    # max(1000, (1 + k)^2): the constant wins at k = 0 and falls; the quadratic's peak at
    # k = 2 / beta - 1 is far higher.
    beta = smoothing_beta(0.1, 1e-8)
    s = maximum(Const(1000), mul(Freq("x", 1), Freq("x", 1)))
    bound = smooth_bound(s, {"x": 1}, beta)
    top = 2 / beta - 1
    expected = max(math.exp(-beta * k) * (1 + k) ** 2 for k in (math.floor(top), math.ceil(top)))
    assert bound.value == pytest.approx(expected)
    assert bound.peak_k in (math.floor(top), math.ceil(top))


def test_text_names_columns_only() -> None:
    s = join(ORDERS, RECS)
    assert s.text() == "max(mf_k(orders.customer_id), mf_k(recommendations.customer_id))"
    assert "100" not in s.text() and "250" not in s.text()
    assert mul(Const(10), Freq("cities.city", 0)).text() == "10 * mf(cities.city)"


def test_sum_multiplier() -> None:
    # SUM of a value clipped to [-3, 8]: S* * 8; scale 2 S* 8 / epsilon.
    bound = smooth_bound(Const(4), {}, 0.5)
    assert bound.scale(2.0, 8) == 2 * 4 * 8 / 2.0


def test_delta_required() -> None:
    with pytest.raises(ValueError, match="delta"):
        smoothing_beta(1.0, 0.0)


def test_tiny_epsilon_refused_by_shape_not_data() -> None:
    with pytest.raises(ValueError, match="too small"):
        smooth_bound(mul(Freq("x", 1), Freq("x", 1)), {"x": 1}, 1e-7)


# -- properties ------------------------------------------------------------------------------------

polys = st.lists(st.floats(0, 50), min_size=1, max_size=4)


def _poly_term(coefs: list[float]) -> object:
    k = Freq("k", 1)
    return add(*[mul(Const(c), *([k] * i)) for i, c in enumerate(coefs)])


@settings(max_examples=60, deadline=None)
@given(polys, st.floats(0.05, 2.0))
def test_matches_brute_force(coefs: list[float], beta: float) -> None:
    term = _poly_term(coefs)
    mf = {"k": 0.0}
    bound = smooth_bound(term, mf, beta)
    ks = np.arange(0, 4000, dtype=float)
    brute = float(np.max(np.exp(-beta * ks) * term.evaluate(ks, mf)))
    assert bound.value == pytest.approx(brute, rel=1e-9, abs=1e-12)
    assert bound.value >= bound.at_zero


@settings(max_examples=60, deadline=None)
@given(polys, st.floats(0.01, 2.0), st.floats(0, 500))
def test_tail_bound_is_an_upper_bound(coefs: list[float], beta: float, k0: float) -> None:
    tail = _tail_bound(coefs, beta, k0)
    for k in np.linspace(k0, k0 + 5 * len(coefs) / beta, 50):
        value = math.exp(-beta * k) * sum(c * k**i for i, c in enumerate(coefs))
        assert value <= tail * (1 + 1e-9) + 1e-300


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 300), st.integers(1, 300), st.sampled_from([1, 2, 10]),
       st.floats(0.05, 1.0), st.floats(1e-10, 1e-3))
def test_smooth_bound_is_smooth(m1: int, m2: int, growth: int, eps: float, delta: float) -> None:
    # A neighbour moves every mf by at most the growth: S*(neighbour) <= e^beta S*(x).
    a, b = Freq("a", growth), Freq("b", growth)
    term = add(maximum(a, b), mul(a, b))
    beta = smoothing_beta(eps, delta)
    here = smooth_bound(term, {"a": m1, "b": m2}, beta).value
    there = smooth_bound(term, {"a": m1 + growth, "b": m2 + growth}, beta).value
    assert there <= math.exp(beta) * here * (1 + 1e-12)
    assert here <= there
