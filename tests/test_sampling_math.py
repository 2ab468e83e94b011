"""Theorem 15 of Rubinstein & Aldà (2017): m, k and rho (``mechanisms.sampling``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms.sampling import (
    min_samples,
    order_index,
    order_statistic,
    rho_for_min_order,
    rho_for_min_samples,
    sampler_parameters,
)

# (gamma, rho, m, k at m) computed by hand:
# - gamma 0.05, rho 0.01: ln(100) = 4.605170; 2 (0.04)^2 = 0.0032; 4.605170 / 0.0032 = 1439.12
#   -> m = 1440.  At m = 1440: sqrt(4.605170 / 2880) = 0.039988; 1 - 0.05 + 0.01 + 0.039988 =
#   0.999988; 1440 * 0.999988 = 1439.98 -> k = 1440 (at the minimum m, k = m).
# - gamma 0.1, rho 0.05: ln(20) = 2.995732; 2 (0.05)^2 = 0.005; 599.15 -> m = 600.  At m = 1000:
#   sqrt(2.995732 / 2000) = 0.038702; 0.9 + 0.05 + 0.038702 = 0.988702 -> k = ceil(988.70) = 989.
# - gamma 0.2, rho 0.1: ln(10) = 2.302585; 2 (0.1)^2 = 0.02; 115.13 -> m = 116.  At m = 200:
#   sqrt(2.302585 / 400) = 0.075871; 0.8 + 0.1 + 0.075871 = 0.975871 -> k = ceil(195.17) = 196.
# - gamma 0.5, rho 0.25: ln(4) = 1.386294; 2 (0.25)^2 = 0.125; 11.09 -> m = 12.  At m = 100:
#   sqrt(1.386294 / 200) = 0.083255; 0.5 + 0.25 + 0.083255 = 0.833255 -> k = ceil(83.33) = 84.
HAND = [
    (0.05, 0.01, 1440, 1440, 1440),
    (0.1, 0.05, 600, 1000, 989),
    (0.2, 0.1, 116, 200, 196),
    (0.5, 0.25, 12, 100, 84),
]


@pytest.mark.parametrize(("gamma", "rho", "m", "at", "k"), HAND)
def test_m_and_k_by_hand(gamma: float, rho: float, m: int, at: int, k: int) -> None:
    assert min_samples(gamma, rho) == m
    assert order_index(at, gamma, rho) == k
    assert order_index(m, gamma, rho) == m  # (1) with equality-ish: the largest sample


def test_m_below_the_minimum_is_refused() -> None:
    with pytest.raises(ValueError, match="too small"):
        order_index(1439, 0.05, 0.01)
    with pytest.raises(ValueError, match="needs m >="):
        sampler_parameters(0.01, m=2000)


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.1, math.nan])
def test_gamma_out_of_range(bad: float) -> None:
    with pytest.raises(ValueError, match="gamma"):
        sampler_parameters(bad)


def test_rho_out_of_range() -> None:
    with pytest.raises(ValueError, match="rho"):
        min_samples(0.05, 0.05)  # rho must stay below gamma
    with pytest.raises(ValueError, match="rho"):
        min_samples(0.9, 0.6)  # and below 1/2


def test_minimal_m_example() -> None:
    # gamma = 0.05: the optimum rho solves 0.05 / rho - 1 = 2 ln(1 / rho), rho ~ 0.00418
    # (0.05 / 0.00418 - 1 = 10.96; 2 ln(239.1) = 10.95); m = ceil(5.477 / (2 * 0.0458^2)) = 1305.
    p = sampler_parameters(0.05)
    assert p.rho == pytest.approx(0.004183, rel=1e-3)
    assert (p.m, p.k) == (1305, 1305)


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=0.005, max_value=0.9))
def test_chosen_rho_never_needs_more_samples_than_a_grid(gamma: float) -> None:
    chosen = min_samples(gamma, rho_for_min_samples(gamma))
    upper = min(gamma, 0.5)
    grid = [upper * i / 400 for i in range(1, 400)]
    assert chosen <= min(min_samples(gamma, r) for r in grid)


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=0.02, max_value=0.5), st.integers(min_value=0, max_value=20000))
def test_chosen_rho_never_gives_a_larger_k_than_a_grid(gamma: float, extra: int) -> None:
    m = min_samples(gamma, rho_for_min_samples(gamma)) + extra
    k = order_index(m, gamma, rho_for_min_order(gamma, m))
    upper = min(gamma, 0.5)
    feasible = []
    for i in range(1, 400):
        try:
            feasible.append(order_index(m, gamma, upper * i / 400))
        except ValueError:
            continue  # this rho needs more samples than m
    assert k <= m
    if feasible:
        assert k <= min(feasible)


def test_order_statistic() -> None:
    values = np.array([5.0, 1.0, 4.0, 2.0, 3.0])
    assert [order_statistic(values, k) for k in range(1, 6)] == [1.0, 2.0, 3.0, 4.0, 5.0]
    with pytest.raises(ValueError):
        order_statistic(values, 6)
