"""The exponential mechanism for quantiles (``mechanisms.exponential``): the rank utility and its
sensitivity against hand-derived values and brute force over neighbours, and the sampler's
output distribution against exp(epsilon u / (2 Delta)) on a tiny histogram."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from mechanisms.exponential import (
    FLOAT_SLACK,
    ExponentialMechanism,
    bin_value,
    rank_sensitivity,
    rank_utility,
)


def test_rank_utility_by_hand() -> None:
    # counts 3 0 5 2, n = 10.  p = 0.5: p n = 5; bins cover ranks [0,3] [3,3] [3,8] [8,10].
    assert rank_utility(np.array([3, 0, 5, 2]), 0.5).tolist() == [-2, -2, 0, -3]
    # p = 0.9: p n = 9, inside the last bin [8, 10]; the first bin is 9 - 3 = 6 away.
    assert rank_utility(np.array([3, 0, 5, 2]), 0.9).tolist() == [-6, -6, -1, 0]
    # No values: every bin is as good (0), so the draw is uniform over the bounds.
    assert rank_utility(np.zeros(4), 0.3).tolist() == [0, 0, 0, 0]


def test_rank_sensitivity_by_hand() -> None:
    assert rank_sensitivity(0.5, 1) == 0.5
    assert rank_sensitivity(0.5, 10) == 5.0
    assert rank_sensitivity(0.9, 3) == pytest.approx(2.7)
    assert rank_sensitivity(0.01, 3) == pytest.approx(2.97)  # MIN, k = 3
    with pytest.raises(ValueError):
        rank_sensitivity(1.5, 1)
    with pytest.raises(ValueError):
        rank_sensitivity(0.5, 0)


@settings(max_examples=200, deadline=None)
@given(counts=st.lists(st.integers(0, 6), min_size=1, max_size=6),
       added=st.lists(st.integers(0, 5), min_size=1, max_size=3),
       p=st.sampled_from([0.0, 0.01, 0.25, 0.5, 0.9, 0.99, 1.0]))
def test_one_unit_moves_every_utility_by_at_most_k_max_p(counts: list[int], added: list[int],
                                                         p: float) -> None:
    """Brute force: a unit adding k = len(added) values to any bins (added[i] mod bins) moves
    every bin's utility by at most k max(p, 1 - p), and some configurations reach it."""
    hist = np.array(counts, dtype=float)
    neighbour = hist.copy()
    for b in added:
        neighbour[b % len(hist)] += 1
    k = len(added)
    moved = np.abs(rank_utility(neighbour, p) - rank_utility(hist, p))
    assert moved.max() <= rank_sensitivity(p, k) + 1e-12


def test_the_bound_is_reached() -> None:
    # p = 0.5, one bin [n = 0] -> adding k values: p n moves by k / 2 while the first bin of two
    # keeps L = 0: the second bin's utility moves by exactly k max(p, 1 - p).
    k = 4
    before = rank_utility(np.array([0.0, 0.0]), 0.5)
    after = rank_utility(np.array([k, 0.0]), 0.5)
    assert abs(after[1] - before[1]) == rank_sensitivity(0.5, k)


def test_probabilities_are_exp_eps_u_over_2_delta() -> None:
    u = rank_utility(np.array([3.0, 0.0, 5.0, 2.0]), 0.5)  # [-2, -2, 0, -3]
    mech = ExponentialMechanism(1.0, 0.5)
    weights = np.exp((1.0 - FLOAT_SLACK) * u / (2 * 0.5))
    assert mech.probabilities(u) == pytest.approx(weights / weights.sum(), rel=1e-12)


def test_epsilon_dp_between_neighbours() -> None:
    """The log ratio of every output's probability between neighbours is at most epsilon."""
    base = np.array([3.0, 0.0, 5.0, 2.0])
    mech = ExponentialMechanism(0.7, rank_sensitivity(0.5, 2))
    for bins in itertools.product(range(4), repeat=2):
        neighbour = base.copy()
        for b in bins:
            neighbour[b] += 1
        ratio = np.log(mech.probabilities(rank_utility(neighbour, 0.5))
                       / mech.probabilities(rank_utility(base, 0.5)))
        assert np.abs(ratio).max() <= 0.7 + 1e-12


def test_sampler_matches_the_distribution() -> None:
    """Chi-square goodness of fit of 40,000 CSPRNG draws on a tiny histogram (p > 1e-6 holds
    with probability 1 - 1e-6 when the sampler is right), and the same draws reject the
    distribution the mechanism would have without the 2 (exp(eps u / Delta))."""
    u = rank_utility(np.array([3.0, 0.0, 5.0, 2.0, 1.0]), 0.5)
    mech = ExponentialMechanism(1.0, 0.5)
    n = 40_000
    draws = np.bincount([mech.sample(u) for _ in range(n)], minlength=len(u))
    expected = mech.probabilities(u) * n
    assert stats.chisquare(draws, expected).pvalue > 1e-6
    wrong = np.exp(u / 0.5)
    assert stats.chisquare(draws, wrong / wrong.sum() * n).pvalue < 1e-6


def test_sampler_reaches_unlikely_bins() -> None:
    """Bins far below the best keep their tiny probability: sorted ascending, the first bins of
    the CDF are resolved by the dense uniform (a 53-bit grid would make them unreachable)."""
    u = np.array([0.0, -30.0])  # P(bin 1) = exp(-30) / (1 + exp(-30)) ~ 9e-14
    probs = ExponentialMechanism(1.0, 0.5).probabilities(u)
    assert probs[1] == pytest.approx(math.exp(-30 * (1 - FLOAT_SLACK)), rel=1e-9)


def test_rank_error_formula() -> None:
    mech = ExponentialMechanism(1.0, 5.0)
    expected = 2 * 5.0 / (1.0 - FLOAT_SLACK) * math.log(10_000 / 0.05)
    assert mech.rank_error(10_000) == pytest.approx(expected)


def test_bad_parameters() -> None:
    with pytest.raises(ValueError):
        ExponentialMechanism(0.0, 1.0)
    with pytest.raises(ValueError):
        ExponentialMechanism(1e-9, 1.0)  # below what the sampler's slack allows
    with pytest.raises(ValueError):
        ExponentialMechanism(1.0, 0.0)


def test_bin_value_stays_in_its_bin() -> None:
    for _ in range(200):
        v = bin_value(3, 10, 0.0, 100.0, False)
        assert 30.0 <= v <= 40.0
        assert bin_value(9, 10, 0.0, 100.0, True) in {90.0, 91.0, 92.0, 93.0, 94.0, 95.0, 96.0,
                                                      97.0, 98.0, 99.0, 100.0}
    with pytest.raises(ValueError):
        bin_value(10, 10, 0.0, 1.0, False)
