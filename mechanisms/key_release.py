"""Why a thresholded GROUP BY released few or no rows, and what epsilon would release them.

Setting (``mechanisms.thresholding``): a group's key is released only when its noisy count
c + X exceeds tau = 1 + b ln(D / delta), X discrete Laplace of scale b = s / epsilon_t (s the
gate count's sensitivity, epsilon_t its share of the query's epsilon, D the most groups one unit
reaches).  Whether a group of true count n appears is a coin with a known bias:

    P(n + X > tau) = P(X >= m),  m = floor(tau - n) + 1,

and for the discrete Laplace with q = exp(-1/b), P(X >= m) = q**m / (1 + q) for m >= 1 and
1 - q**(1 - m) / (1 + q) for m <= 0 (symmetry).  It increases with n, so "the group size released
with probability p" is the smallest integer n with P >= p (:func:`smallest_released_group`).

At another query epsilon E the gate has epsilon_t = share * E, so b and tau both shrink like 1 / E
and the release probability of a group of n >= 2 grows towards 1 (tau -> 1 < n).  A group of one
is never released with probability above about delta / D: that is what the threshold is for.
:func:`epsilon_to_release` finds the smallest E by bisection on ln E.  None of this reads data:
tau, b, delta and D are fixed before the query runs, so EXPLAIN can warn and a report can explain
an empty answer at no privacy cost.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from mechanisms.base import check_confidence
from mechanisms.discrete_laplace import DiscreteLaplace
from mechanisms.thresholding import key_release_threshold

__all__ = [
    "DEFAULT_SIZES",
    "KeyReleaseOdds",
    "empty_result_message",
    "epsilon_to_release",
    "key_release_odds",
    "release_probability",
    "smallest_released_group",
    "threshold_warning",
]

# The bisection's range of query epsilons and its relative precision.
_EPSILON_RANGE = (1e-9, 1e9)
_EPSILON_PRECISION = 1e-6


def _log_tail(m: int, scale: float) -> float:
    """ln P(X >= m) for X discrete Laplace of scale b, m >= 1: -m/b - ln(1 + q)."""
    return -m / scale - math.log1p(math.exp(-1.0 / scale))


def _probability_at(count: int, threshold: float, scale: float) -> float:
    m = math.floor(threshold - count) + 1
    if m >= 1:
        return math.exp(_log_tail(m, scale))
    return -math.expm1(_log_tail(1 - m, scale))  # 1 - P(X >= 1 - m), accurate near 1


def release_probability(count: int, threshold: float, mechanism: DiscreteLaplace) -> float:
    """P(count + X > threshold): the chance a group of true ``count`` is released.

    >>> gate = DiscreteLaplace.from_sensitivity(1, 1.0)
    >>> round(release_probability(10, 10.0, gate), 4)  # X >= 1
    0.2689
    """
    if not isinstance(mechanism, DiscreteLaplace):
        raise ValueError(f"key release uses a discrete Laplace count, not {mechanism.name}")
    if not math.isfinite(threshold):
        raise ValueError(f"the threshold must be finite, got {threshold!r}")
    return _probability_at(int(count), threshold, mechanism.scale)


def _smallest(threshold: float, scale: float, probability: float) -> int:
    """The smallest integer n >= 0 with P(n + X > threshold) >= probability (P increases in n)."""
    lo = 0
    if _probability_at(lo, threshold, scale) >= probability:
        return lo
    # Above tau + b ln(1 / (1 - p)) + 2 the tail is below 1 - p: an upper end that holds.
    hi = max(1, math.ceil(threshold + scale * -math.log1p(-probability)) + 2)
    while _probability_at(hi, threshold, scale) < probability:
        hi *= 2
    while hi - lo > 1:  # invariant: P(lo) < p <= P(hi)
        mid = (lo + hi) // 2
        if _probability_at(mid, threshold, scale) >= probability:
            hi = mid
        else:
            lo = mid
    return hi


def smallest_released_group(threshold: float, mechanism: DiscreteLaplace,
                            probability: float) -> int:
    """The smallest true count released with at least ``probability``.

    >>> gate = DiscreteLaplace.from_sensitivity(1, 0.2)  # b = 5
    >>> tau = key_release_threshold(5.0, 1, 1e-6)
    >>> smallest_released_group(tau, gate, 0.5), smallest_released_group(tau, gate, 0.95)
    (71, 82)
    """
    p = check_confidence(probability)
    release_probability(0, threshold, mechanism)  # validates the mechanism and threshold
    return _smallest(threshold, mechanism.scale, p)


def epsilon_to_release(size: int, probability: float, *, sensitivity: float,
                       groups_per_unit: int, delta: float, share: float) -> float:
    """The smallest query epsilon at which a group of ``size`` is released with ``probability``.

    ``sensitivity`` is the gate count's (its mechanism's), ``share`` the fraction of the query's
    epsilon the gate gets (``gate.epsilon / plan.epsilon``: the separate key-release share, or
    1 / number of measurements when a measured count is reused).  Returns ``math.inf`` when no
    epsilon does (a group of 1, or a probability out of reach within epsilon 1e9).

    >>> round(epsilon_to_release(100, 0.95, sensitivity=1, groups_per_unit=1, delta=1e-6,
    ...                          share=0.2), 3)
    0.813
    """
    p = check_confidence(probability)
    if not 0.0 < share <= 1.0:
        raise ValueError(f"share must be in (0, 1], got {share!r}")
    if sensitivity <= 0 or not math.isfinite(sensitivity):
        raise ValueError(f"sensitivity must be positive and finite, got {sensitivity!r}")
    n = int(size)

    def released(epsilon: float) -> bool:
        scale = sensitivity / (share * epsilon)
        tau = key_release_threshold(scale, groups_per_unit, delta)
        return _probability_at(n, tau, scale) >= p

    lo, hi = _EPSILON_RANGE
    if n < 2 or not released(hi):
        return math.inf
    if released(lo):
        return lo
    # The release probability grows with epsilon (module docstring): bisect on ln epsilon,
    # keeping released(hi); hi is returned, so the answer always releases.
    while hi / lo - 1.0 > _EPSILON_PRECISION:
        mid = math.sqrt(lo * hi)
        if released(mid):
            hi = mid
        else:
            lo = mid
    return hi


@dataclass(frozen=True)
class KeyReleaseOdds:
    """What the key-release threshold of one query means for group sizes.

    ``size_50`` / ``size_95``: the smallest true counts released with probability 50% / 95%
    at this ``epsilon`` (the query's); the other fields restate the gate.
    """

    threshold: float
    scale: float
    sensitivity: float
    delta: float
    groups_per_unit: int
    epsilon: float
    share: float
    size_50: int
    size_95: int

    def epsilon_for(self, size: int, probability: float = 0.95) -> float:
        """The query epsilon that would release groups of ``size`` with ``probability``."""
        return epsilon_to_release(size, probability, sensitivity=self.sensitivity,
                                  groups_per_unit=self.groups_per_unit, delta=self.delta,
                                  share=self.share)


def key_release_odds(gate: DiscreteLaplace, threshold: float, delta: float,
                     groups_per_unit: int, epsilon: float) -> KeyReleaseOdds:
    """The odds of a query's gate: ``NoisePlan.threshold`` gives ``gate`` (its mechanism),
    ``threshold`` and ``delta``; ``groups_per_unit`` is D and ``epsilon`` the query's."""
    if not epsilon > 0 or not math.isfinite(epsilon):
        raise ValueError(f"epsilon must be positive and finite, got {epsilon!r}")
    share = gate.epsilon / epsilon
    if not 0.0 < share <= 1.0 + 1e-12:
        raise ValueError(f"the gate's epsilon {gate.epsilon!r} exceeds the query's {epsilon!r}")
    return KeyReleaseOdds(
        threshold=threshold, scale=gate.scale, sensitivity=gate.sensitivity, delta=delta,
        groups_per_unit=groups_per_unit, epsilon=epsilon, share=min(share, 1.0),
        size_50=smallest_released_group(threshold, gate, 0.5),
        size_95=smallest_released_group(threshold, gate, 0.95))


#: Group sizes whose epsilon the messages quote when the caller names none.
DEFAULT_SIZES = (10, 100, 1000, 10_000)


def _epsilon(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 else f"{value:.2g}"


def _suggestions(odds: KeyReleaseOdds, counted: str, sizes: Sequence[int],
                 max_epsilon: float | None) -> str:
    parts = []
    for n in (n for n in sizes if 2 <= n < odds.size_95):
        eps = odds.epsilon_for(n)
        if not math.isfinite(eps):
            continue
        over = max_epsilon is not None and eps > max_epsilon
        parts.append(f"groups of {n:,} {counted} need epsilon {_epsilon(eps)}"
                     + (" (above the limit per query)" if over else ""))
    if not parts:
        return ""
    return "To be released with 95% probability, " + "; ".join(parts) + "."


def empty_result_message(odds: KeyReleaseOdds, counted: str, released: int = 0,
                         sizes: Sequence[int] = DEFAULT_SIZES,
                         max_epsilon: float | None = None) -> str:
    """The report's explanation when thresholding released ``released`` groups (0: none).

    ``counted`` names what the gate counts, e.g. "distinct rider_id" or "rows"; the message
    quotes the epsilon that would release groups of each of ``sizes`` (those not already
    released with 95% probability), flagging any above ``max_epsilon`` (the policy's
    ``max_epsilon_per_query``).
    """
    head = ("No group was released" if released == 0 else
            f"Only {released:,} group(s) were released")
    text = (f"{head}: a group appears only when its noisy count of {counted} exceeds the "
            f"threshold {odds.threshold:,.0f} (tau = 1 + b ln(D / delta), b = {odds.scale:.3g}, "
            f"D = {odds.groups_per_unit}, delta = {odds.delta:.2g}). At epsilon "
            f"{_epsilon(odds.epsilon)}, groups of {odds.size_50:,} {counted} appear half the "
            f"time and groups of {odds.size_95:,} 95% of the time; smaller groups are likely "
            "hidden.")
    more = _suggestions(odds, counted, sizes, max_epsilon)
    return f"{text} {more}" if more else text


def threshold_warning(odds: KeyReleaseOdds, counted: str, *, large: int = 100,
                      reference: float | None = None, reference_label: str = "",
                      reference_share: float = 0.01,
                      sizes: Sequence[int] = DEFAULT_SIZES,
                      max_epsilon: float | None = None) -> str | None:
    """EXPLAIN's warning when the threshold hides groups a user would expect, else None.

    Warns when groups need ``large`` or more (``size_50``) to appear half the time, or, when a
    figure the user can see is given (``reference``, e.g. a public table's row count, named by
    ``reference_label``), when ``size_50`` is at least ``reference_share`` of it.
    """
    big = odds.size_50 >= large
    relative = reference is not None and reference > 0 and \
        odds.size_50 >= reference_share * reference
    if not (big or relative):
        return None
    text = (f"groups with fewer than about {odds.size_50:,} {counted} will mostly be hidden "
            f"(key-release threshold {odds.threshold:,.0f} at epsilon {_epsilon(odds.epsilon)})")
    if relative and reference is not None:
        text += f", {odds.size_50 / reference:.0%} of {reference_label or 'the reference'}"
    text += "."
    more = _suggestions(odds, counted, sizes, max_epsilon)
    return f"{text} {more}" if more else text
