"""Splitting one query's (epsilon, delta) among its noisy measurements.

Basic composition: k mechanisms of epsilon_i each cost sum(epsilon_i).  The planner gives every
measurement an equal share, except that a separate key-release count (see ``thresholding``) first
takes ``threshold_share`` of epsilon.  Counts get discrete Laplace noise, sums the snapping
mechanism; both cost exactly their share, so the total charged is exactly the epsilon asked for.
Delta is spent only on key release; a query without it costs delta = 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mechanisms import DiscreteLaplace, Mechanism, Snapping
from mechanisms.thresholding import key_release_threshold


@dataclass(frozen=True)
class NoiseRequest:
    """A measurement to protect: its id, L1 sensitivity and whether its values are integers."""

    id: str
    sensitivity: float
    integral: bool


@dataclass(frozen=True)
class ThresholdRequest:
    """Group keys need a noisy count above a threshold.

    ``reuse`` names a requested measurement that is exactly that count (then no extra epsilon is
    spent on it); ``sensitivity`` is D, the most groups one unit can reach.
    """

    reuse: str | None
    sensitivity: int


@dataclass(frozen=True)
class ThresholdPlan:
    """Which noisy count gates the keys, its mechanism, and tau."""

    measurement_id: str
    mechanism: Mechanism
    threshold: float
    delta: float
    separate: bool


@dataclass(frozen=True)
class NoisePlan:
    """A mechanism per measurement, the key-release gate, and the total cost."""

    mechanisms: dict[str, Mechanism]
    threshold: ThresholdPlan | None
    epsilon: float
    delta: float

    @property
    def gate(self) -> str | None:
        """The measurement the key-release threshold reads (None: no threshold)."""
        return self.threshold.measurement_id if self.threshold is not None else None

    def all_mechanisms(self) -> dict[str, Mechanism]:
        """Every noisy column: the measurements, and the key-release count when it is separate."""
        found = dict(self.mechanisms)
        if self.threshold is not None and self.threshold.separate:
            found[self.threshold.measurement_id] = self.threshold.mechanism
        return found


THRESHOLD_ID = "t0"


def plan_noise(
    requests: Sequence[NoiseRequest], epsilon: float, delta: float,
    threshold: ThresholdRequest | None = None, threshold_share: float = 0.2,
) -> NoisePlan:
    """Give each measurement its mechanism so the whole query costs (epsilon, delta)."""
    if not requests:
        raise ValueError("nothing to protect")
    if not epsilon > 0:
        raise ValueError("epsilon must be positive")
    separate = threshold is not None and threshold.reuse is None
    eps_threshold = epsilon * threshold_share if separate else 0.0
    share = (epsilon - eps_threshold) / len(requests)
    mechanisms: dict[str, Mechanism] = {}
    for req in requests:
        cls = DiscreteLaplace if req.integral else Snapping
        mechanisms[req.id] = cls.from_sensitivity(req.sensitivity, share)
    gate = None
    if threshold is not None:
        if threshold.reuse is not None:
            gid, mech = threshold.reuse, mechanisms[threshold.reuse]
        else:
            gid = THRESHOLD_ID
            mech = DiscreteLaplace.from_sensitivity(threshold.sensitivity, eps_threshold)
        tau = key_release_threshold(mech.scale, threshold.sensitivity, delta)
        gate = ThresholdPlan(gid, mech, tau, delta, separate)
    return NoisePlan(mechanisms, gate, epsilon, delta if threshold is not None else 0.0)
