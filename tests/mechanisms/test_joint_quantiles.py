"""The joint exponential mechanism for several quantiles (``mechanisms.joint_quantiles``):
its sampler against brute-force enumeration, its sensitivity against neighbours, its floating
point slack against the closed form."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms.exponential import FLOAT_SLACK
from mechanisms.joint_quantiles import (
    MAX_JOINT,
    MAX_VALUES,
    JointQuantiles,
    cut_value,
    float_slack,
    joint_utility,
    range_logsumexp,
)

_counts = st.lists(st.integers(0, 6), min_size=1, max_size=6)
_ps = st.lists(st.sampled_from([0.0, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0]),
               min_size=1, max_size=3).map(lambda ps: tuple(sorted(ps)))


def _sequences(bins: int, m: int) -> list[tuple[int, ...]]:
    return [s for s in itertools.product(range(bins + 1), repeat=m) if list(s) == sorted(s)]


@settings(max_examples=60, deadline=None)
@given(_counts, _ps, st.integers(1, 3), st.sampled_from([0.5, 2.0, 8.0]))
def test_the_sampler_draws_exactly_the_exponential_mechanism(counts: list[int],
                                                             ps: tuple[float, ...], cap: int,
                                                             epsilon: float) -> None:
    # P(t) = exp(a u(t)) / Z over every non-decreasing sequence, a = epsilon' / (2 * 2k).
    histogram = np.array(counts, dtype=float)
    mechanism = JointQuantiles(epsilon, cap, ps, len(counts))
    a = mechanism.working_epsilon / (2 * 2 * cap)
    sequences = _sequences(len(counts), len(ps))
    logw = np.array([a * joint_utility(histogram, ps, s) for s in sequences])
    logz = np.logaddexp.reduce(logw)
    for seq, w in zip(sequences, logw, strict=True):
        assert mechanism.log_probability(histogram, seq) == pytest.approx(w - logz, abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(_counts, _ps, st.lists(st.integers(0, 5), min_size=1, max_size=4))
def test_one_units_values_move_the_utility_by_at_most_2r(counts: list[int],
                                                         ps: tuple[float, ...],
                                                         added: list[int]) -> None:
    # A unit adds r values (in any bins): |u' - u| <= 2r for every sequence of cuts.
    before = np.array(counts, dtype=float)
    after = before.copy()
    for b in added:
        after[min(b, len(counts) - 1)] += 1
    for seq in _sequences(len(counts), len(ps)):
        change = abs(joint_utility(after, ps, seq) - joint_utility(before, ps, seq))
        assert change <= 2 * len(added) + 1e-9


def test_a_hand_computed_change() -> None:
    # Values in bins [1, 1], the median cut between them: gaps 1 and 1, asked 1 and 1: u = 0.
    # One value added to bin 1: n = 3, gaps 1 and 2, asked 1.5 and 1.5: u = -1 (<= 2r = 2: the
    # derivation bounds the gap counts' and the targets' moves separately, r each).
    before, after = np.array([1.0, 1.0]), np.array([1.0, 2.0])
    assert joint_utility(before, [0.5], [1]) == 0.0
    assert joint_utility(after, [0.5], [1]) == -1.0


def test_draws_follow_the_exact_distribution() -> None:
    # 3000 draws over the 10 sequences of 2 cuts in 3 bins: every frequency within 6 standard
    # deviations of its probability (a false alarm has probability below 1e-7).
    histogram = np.array([3.0, 1.0, 4.0])
    mechanism = JointQuantiles(4.0, 1, (0.25, 0.75), 3)
    draws = [mechanism.sample(histogram) for _ in range(3000)]
    for seq in _sequences(3, 2):
        p = math.exp(mechanism.log_probability(histogram, seq))
        seen = sum(d == seq for d in draws) / len(draws)
        assert abs(seen - p) <= 6 * math.sqrt(p * (1 - p) / len(draws)) + 1e-3


def test_large_histograms_land_near_the_true_quantiles() -> None:
    counts = np.full(10_000, 100.0)  # a million values, uniform: the p-quantile is at cut p B
    cuts = JointQuantiles(1.0, 200, (0.1, 0.5, 0.9), 10_000).sample(counts)
    assert cuts == tuple(sorted(cuts))
    for cut, p in zip(cuts, (0.1, 0.5, 0.9), strict=True):
        assert abs(cut - p * 10_000) <= 200  # 20,000 ranks; the bound itself is ~23,000


def test_float_slack_closed_form() -> None:
    # depth ceil(log2(10001)) = 14; a = 1 / 800; M = 3 a 2^32 + 3 ln(10001);
    # 2 * [2 (8 * 14 + 10) 3^2 M 2^-52] + 3 FLOAT_SLACK.
    m = 3 * (1 / 800) * 2**32 + 3 * math.log(10_001)
    expected = 2 * (2 * 122 * 9 * m * 2**-52) + 3 * FLOAT_SLACK
    assert float_slack(1.0, 200, 3, 10_000) == pytest.approx(expected)
    mechanism = JointQuantiles(1.0, 200, (0.1, 0.5, 0.9), 10_000)
    assert mechanism.working_epsilon == pytest.approx(1.0 - expected)
    assert mechanism.sensitivity == 400.0


def test_refusals() -> None:
    with pytest.raises(ValueError, match="sorted"):
        JointQuantiles(1.0, 1, (0.5, 0.25), 10)
    with pytest.raises(ValueError, match="sorted"):
        JointQuantiles(1.0, 1, tuple(i / 20 for i in range(MAX_JOINT + 1)), 10)
    with pytest.raises(ValueError, match="too small"):
        JointQuantiles(1e-9, 1, (0.25, 0.75), 10)
    mechanism = JointQuantiles(1.0, 1, (0.5,), 1)
    with pytest.raises(ValueError, match="at most"):
        mechanism.sample(np.array([float(MAX_VALUES + 1)]))
    with pytest.raises(ValueError, match="non-negative"):
        mechanism.sample(np.array([1.0, 2.0]))


def test_cut_values() -> None:
    assert cut_value(0, 4, 10.0, 20.0, False) == 10.0
    assert cut_value(3, 4, 10.0, 20.0, False) == 17.5
    assert cut_value(3, 4, 10.0, 20.0, True) == 18.0  # rounded: an integer column
    with pytest.raises(ValueError):
        cut_value(5, 4, 10.0, 20.0, False)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-50, 50), min_size=1, max_size=40), st.data())
def test_range_log_sum_exp_matches_the_direct_sum(values: list[float],
                                                  data: st.DataObject) -> None:
    array = np.array(values)
    starts = data.draw(st.lists(st.integers(0, len(values)), min_size=1, max_size=10))
    stops = [data.draw(st.integers(s, len(values))) for s in starts]
    found = range_logsumexp(array, np.array(starts), np.array(stops))
    for s, e, got in zip(starts, stops, found, strict=True):
        want = np.logaddexp.reduce(array[s:e]) if e > s else -np.inf
        assert got == pytest.approx(want, abs=1e-9) if e > s else got == -np.inf
