"""Key-release odds (``mechanisms.key_release``): exact probabilities against the closed form and
against releases drawn by the discrete Laplace mechanism's SQL, the inverse functions, and the
messages."""

from __future__ import annotations

import math
from dataclasses import replace

import duckdb
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms import DiscreteLaplace, Laplace
from mechanisms.key_release import (
    KeyReleaseOdds,
    empty_result_message,
    epsilon_to_release,
    key_release_odds,
    release_probability,
    smallest_released_group,
    threshold_warning,
)
from mechanisms.planning import NoiseRequest, ThresholdRequest, plan_noise
from mechanisms.thresholding import key_release_threshold
from tests.mechanisms.stats import check_proportion, draw

SCALES = st.floats(0.2, 5000.0)
PROBABILITIES = st.floats(0.01, 0.999)


def gate(scale: float) -> DiscreteLaplace:
    # epsilon a hair above 1 / b, so the calibration check (b >= 1 / epsilon) holds in floats.
    return DiscreteLaplace(sensitivity=1.0, epsilon=(1.0 + 1e-9) / scale, scale=scale)


def test_release_probability_by_hand() -> None:
    g = DiscreteLaplace.from_sensitivity(1, 1.0)  # b = 1, q = 1/e
    q = math.exp(-1.0)
    # count 10, tau 10: X >= 1.  count 12, tau 10: X >= -1, i.e. 1 - P(X >= 2).
    assert release_probability(10, 10.0, g) == pytest.approx(q / (1 + q))
    assert release_probability(12, 10.0, g) == pytest.approx(1 - q**2 / (1 + q))
    # tau 10.5: count 10 needs X >= 1 too (10 + X > 10.5); count 11 needs X >= 0.
    assert release_probability(10, 10.5, g) == pytest.approx(q / (1 + q))
    assert release_probability(11, 10.5, g) == pytest.approx(1 / (1 + q))


def test_a_group_of_one_is_released_with_probability_below_delta() -> None:
    for d, delta in ((1, 1e-6), (10, 1e-8), (3, 1e-3)):
        g = DiscreteLaplace.from_sensitivity(d, 0.3)
        tau = key_release_threshold(g.scale, d, delta)
        assert release_probability(1, tau, g) <= delta / d


@pytest.mark.parametrize("count", [60, 71, 75, 82, 90])
def test_release_probability_matches_the_sql_mechanism(count: int) -> None:
    g = DiscreteLaplace.from_sensitivity(1, 0.2)
    tau = key_release_threshold(g.scale, 1, 1e-6)
    con = duckdb.connect()
    try:
        noisy = draw(g, count, "duckdb", con)
    finally:
        con.close()
    check_proportion(int(np.sum(noisy > tau)), noisy.size, release_probability(count, tau, g),
                     f"count {count}")


@settings(max_examples=300, deadline=None, derandomize=True)
@given(SCALES, st.floats(1.0, 1e6), st.integers(0, 10**6))
def test_release_probability_grows_with_the_count(scale: float, tau: float, count: int) -> None:
    g = gate(scale)
    assert release_probability(count, tau, g) <= release_probability(count + 1, tau, g)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(SCALES, st.floats(1.0, 1e6), PROBABILITIES)
def test_the_smallest_released_group_is_the_first_to_reach_the_probability(
        scale: float, tau: float, p: float) -> None:
    g = gate(scale)
    n = smallest_released_group(tau, g, p)
    assert release_probability(n, tau, g) >= p
    assert n == 0 or release_probability(n - 1, tau, g) < p


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.integers(2, 100_000), st.floats(0.5, 0.99), st.integers(1, 20),
       st.integers(1, 10), st.sampled_from([1e-4, 1e-6, 1e-9]), st.floats(0.05, 1.0))
def test_epsilon_to_release_is_the_smallest_that_does(size: int, p: float, sens: int, d: int,
                                                      delta: float, share: float) -> None:
    eps = epsilon_to_release(size, p, sensitivity=sens, groups_per_unit=d, delta=delta,
                             share=share)
    assert math.isfinite(eps)

    def prob(e: float) -> float:
        b = sens / (share * e)
        return release_probability(size, key_release_threshold(b, d, delta), gate(b))

    assert prob(eps) >= p
    assert prob(eps * (1 - 1e-5)) < p


def test_no_epsilon_releases_a_group_of_one() -> None:
    assert epsilon_to_release(1, 0.5, sensitivity=1, groups_per_unit=1, delta=1e-6,
                              share=0.2) == math.inf


def test_odds_from_a_plan_and_the_epsilon_they_suggest() -> None:
    requests = [NoiseRequest("m0", 10, True), NoiseRequest("m1", 2000.0, False)]
    plan = plan_noise(requests, 0.1, 1e-6, ThresholdRequest(None, 10))
    t = plan.threshold
    assert t is not None and isinstance(t.mechanism, DiscreteLaplace)
    odds = key_release_odds(t.mechanism, t.threshold, t.delta, 10, plan.epsilon)
    assert odds.share == pytest.approx(0.2)
    assert odds.threshold == pytest.approx(1 + 500 * math.log(10 / 1e-6))
    assert odds.size_50 < odds.size_95
    # The planner at the suggested epsilon releases groups of 1000 with >= 95% probability.
    eps = odds.epsilon_for(1000)
    again = plan_noise(requests, eps, 1e-6, ThresholdRequest(None, 10)).threshold
    assert again is not None and isinstance(again.mechanism, DiscreteLaplace)
    assert release_probability(1000, again.threshold, again.mechanism) >= 0.95
    assert key_release_odds(again.mechanism, again.threshold, 1e-6, 10, eps).size_95 <= 1000
    # A reused count: the gate is one of the measurements, share 1 / 2.
    reused = plan_noise(requests, 0.1, 1e-6, ThresholdRequest("m0", 10)).threshold
    assert reused is not None and isinstance(reused.mechanism, DiscreteLaplace)
    assert key_release_odds(reused.mechanism, reused.threshold, 1e-6, 10, 0.1).share == \
        pytest.approx(0.5)


def _odds() -> KeyReleaseOdds:
    plan = plan_noise([NoiseRequest("m0", 10, True)], 0.1, 1e-6, ThresholdRequest(None, 10))
    t = plan.threshold
    assert t is not None and isinstance(t.mechanism, DiscreteLaplace)
    return key_release_odds(t.mechanism, t.threshold, t.delta, 10, 0.1)


def test_the_empty_result_message() -> None:
    odds = _odds()
    text = empty_result_message(odds, "distinct rider_id", max_epsilon=1.0)
    assert text.startswith("No group was released: a group appears only when its noisy count "
                           "of distinct rider_id exceeds the threshold 8,060")
    assert f"groups of {odds.size_50:,} distinct rider_id appear half the time" in text
    assert f"groups of {odds.size_95:,} 95% of the time" in text
    assert f"groups of 1,000 distinct rider_id need epsilon {odds.epsilon_for(1000):.2g}" in text
    assert "groups of 100 distinct rider_id need epsilon 9.3 (above the limit per query)" in text
    assert "10,000" not in text  # already released at this epsilon
    some = empty_result_message(odds, "rows", released=3, sizes=())
    assert some.startswith("Only 3 group(s) were released") and "To be released" not in some


def test_the_explain_warning() -> None:
    odds = _odds()
    warning = threshold_warning(odds, "distinct rider_id")
    assert warning is not None and warning.startswith(
        f"groups with fewer than about {odds.size_50:,} distinct rider_id will mostly be hidden")
    small = replace(odds, size_50=40)
    assert threshold_warning(small, "rows") is None
    relative = threshold_warning(small, "rows", reference=2000, reference_label="the 2,000 rows "
                                 "of the public table")
    assert relative is not None and "2% of the 2,000 rows of the public table" in relative


def test_bad_inputs_raise() -> None:
    lap = Laplace.from_sensitivity(1.0, 1.0)
    with pytest.raises(ValueError, match="discrete Laplace"):
        release_probability(3, 2.0, lap)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="finite"):
        release_probability(3, math.inf, gate(1.0))
    with pytest.raises(ValueError, match="share"):
        epsilon_to_release(10, 0.5, sensitivity=1, groups_per_unit=1, delta=1e-6, share=0)
    with pytest.raises(ValueError, match="sensitivity"):
        epsilon_to_release(10, 0.5, sensitivity=0, groups_per_unit=1, delta=1e-6, share=1)
    with pytest.raises(ValueError, match="confidence"):
        smallest_released_group(10.0, gate(1.0), 1.0)
    with pytest.raises(ValueError, match="epsilon"):
        key_release_odds(gate(1.0), 10.0, 1e-6, 1, 0.0)
    with pytest.raises(ValueError, match="exceeds"):
        key_release_odds(gate(1.0), 10.0, 1e-6, 1, 0.5)
