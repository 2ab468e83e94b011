"""Privacy events and the accountants that turn them into budget demands.

The ledger never stores a bare epsilon: a claim carries immutable :class:`Event` records, one per
noisy release of the query (the mechanism's kind, scale, sensitivity, the (epsilon, delta) it was
calibrated for, and its full ``describe()``).  An *accountant* interprets those events as a demand
on a block's budget.  An event's meaning never changes; a new kind of release gets a new ``kind``
(the dp_accounting habit, STYLE.md section 3).

Two accountants, selected by ``privacy.accounting``:

``basic`` (:class:`BasicAccountant`)
    Basic composition (Dwork and Roth, "The Algorithmic Foundations of Differential Privacy",
    2014, Theorem 3.16): releases of (eps_i, delta_i) on one block compose to
    (sum eps_i, sum delta_i).  A budget is one number (a vector of length 1) plus delta.

``renyi`` (:class:`RenyiAccountant`)
    Rényi DP (Mironov, "Rényi Differential Privacy", CSF 2017, arXiv:1702.07476v3).  A budget is a
    vector over the fixed orders :data:`ORDERS`; a release costs its RDP curve at each order
    (``Mechanism.rdp``), and curves add up (Mironov, Proposition 1).  A block with global
    (epsilon^G, delta^G) has capacity

        cap(alpha) = max(0, epsilon^G - ln(1 / delta_c) / (alpha - 1))

    at each order (Mironov, Proposition 3: (alpha, r)-RDP implies
    (r + ln(1/delta_c)/(alpha-1), delta_c)-DP), so consumed(alpha) <= cap(alpha) at *some* alpha
    gives (epsilon^G, delta_c)-DP for the block.  A claim fits when some alpha fits on every block
    it asks for (PrivateKube, section 5).

    Releases that are only (epsilon, delta)-DP with a delta that no RDP curve captures (the noisy
    key-release threshold; a release known only by its (epsilon, delta)) are charged as
    *delta-approximate* RDP: the pure curve of their epsilon plus their delta.  delta-approximate
    RDP composes by adding the RDP curves and the deltas, and converts to
    (r + ln(1/delta_c)/(alpha-1), delta_c + sum delta_i)-DP (Bun and Steinke, "Concentrated
    Differential Privacy", TCC 2016, arXiv:1605.02065v1, section 8, for the zCDP form;
    (eps, delta)-DP is delta-approximately eps-DP).  So a block's delta^G is split:
    ``delta_c = (1 - share) delta^G`` for the conversion and ``share * delta^G`` as a pool the
    approximate deltas are charged to with basic composition (``privacy.renyi_delta_share``).
    The total stays <= delta^G.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from mechanisms import DiscreteLaplace, Gaussian, Laplace, Mechanism, Snapping, pure_dp_rdp

__all__ = ["ORDERS", "Accountant", "BasicAccountant", "Event", "RenyiAccountant",
           "accountant_for", "events_for_plan"]

#: Rényi orders of every Rényi budget vector (DESIGN.md section 7).
ORDERS: tuple[float, ...] = (1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 16.0, 32.0, 64.0)

#: Relative floating-point slack when comparing a demand with what is left: 1e-12 of the block's
#: global budget, never in the analyst's favour by more than that (sums of a few hundred doubles
#: carry a relative rounding error far below it).
SLACK = 1e-12

Vec = tuple[float, ...]

_MECHANISMS: dict[str, type[Mechanism]] = {
    cls.name: cls for cls in (DiscreteLaplace, Snapping, Laplace, Gaussian)}


@dataclass(frozen=True)
class Event:
    """One noisy release, as the ledger stores it.

    ``kind`` is a mechanism name (``discrete_laplace``, ``snapping``, ``laplace``, ``gaussian``),
    ``epsilon_delta`` (a release known only by its (epsilon, delta)-DP guarantee) or
    ``key_release`` (the delta of releasing group keys through a noisy threshold; its noisy count
    is an event of its own).  ``params`` is the mechanism's full ``describe()``, from which the
    Rényi accountant rebuilds it (the constructor re-checks its calibration, so a stored event
    cannot under-report its cost).
    """

    kind: str
    epsilon: float
    delta: float = 0.0
    scale: float | None = None
    sensitivity: float | None = None
    params: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @classmethod
    def from_mechanism(cls, mechanism: Mechanism) -> Event:
        """The event of one mechanism's release."""
        return cls(mechanism.name, float(mechanism.epsilon), float(mechanism.delta),
                   float(mechanism.scale), float(mechanism.sensitivity), mechanism.describe())

    @classmethod
    def epsilon_delta(cls, epsilon: float, delta: float = 0.0) -> Event:
        """A release known only by its (epsilon, delta)-DP guarantee."""
        return cls("epsilon_delta", float(epsilon), float(delta))

    @classmethod
    def key_release(cls, delta: float) -> Event:
        """Group keys released through a noisy-count threshold: costs delta, no epsilon."""
        return cls("key_release", 0.0, float(delta))

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (the ledger's storage format)."""
        return {"kind": self.kind, "epsilon": self.epsilon, "delta": self.delta,
                "scale": self.scale, "sensitivity": self.sensitivity, "params": dict(self.params)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Event:
        """Inverse of :meth:`to_dict`."""
        return cls(data["kind"], data["epsilon"], data.get("delta", 0.0), data.get("scale"),
                   data.get("sensitivity"), data.get("params") or {})

    def mechanism(self) -> Mechanism:
        """Rebuild the mechanism of a mechanism event (``ValueError`` for any other kind)."""
        cls = _MECHANISMS.get(self.kind)
        if cls is None:
            raise ValueError(f"event kind {self.kind!r} is not a known mechanism")
        names = {f.name for f in fields(cls) if f.init}
        try:
            return cls(**{k: v for k, v in self.params.items() if k in names})
        except TypeError as err:
            raise ValueError(f"incomplete {self.kind} event: {err}") from None


def events_for_plan(plan: Any) -> tuple[Event, ...]:
    """The events of a ``mechanisms.planning.NoisePlan``: every mechanism, the key release."""
    events = [Event.from_mechanism(m) for m in plan.mechanisms.values()]
    threshold = plan.threshold
    if threshold is not None:
        if threshold.separate:  # its own noisy count; a reused count is already listed
            events.append(Event.from_mechanism(threshold.mechanism))
        events.append(Event.key_release(threshold.delta))
    return tuple(events)


def check_events(events: Sequence[Event]) -> None:
    """Raise ``ValueError`` unless every event has a finite, non-negative cost."""
    if not events:
        raise ValueError("a claim needs at least one privacy event")
    for e in events:
        if not (math.isfinite(e.epsilon) and e.epsilon >= 0 and math.isfinite(e.delta)
                and 0 <= e.delta < 1):
            raise ValueError(f"a claim needs a finite epsilon > 0 and a finite delta >= 0 "
                             f"(event {e.kind}: epsilon={e.epsilon!r}, delta={e.delta!r})")


class Accountant:
    """Interprets events as demands and budgets as vectors (one entry per order)."""

    name: Literal["basic", "renyi"]
    orders: tuple[float, ...]

    def capacity(self, epsilon_global: float, delta_global: float) -> tuple[Vec, float]:
        """A fresh block's budget vector and its delta pool."""
        raise NotImplementedError

    def demand(self, events: Iterable[Event]) -> tuple[Vec, float]:
        """The budget vector and delta a claim of these events takes on each of its blocks."""
        raise NotImplementedError

    def fitting_order(self, demands: Sequence[Vec], available: Sequence[Vec],
                      globals_: Sequence[Vec]) -> int | None:
        """An index at which every demand fits its available budget, or None."""
        raise NotImplementedError

    def guarantee(self, used: Vec, delta_used: float, epsilon_global: float,
                  delta_global: float) -> tuple[float, float, int]:
        """(epsilon, delta) guarantee of ``used`` budget, and the index it is read at."""
        raise NotImplementedError

    def dominant_share(self, demand: Vec, global_: Vec) -> float:
        """A claim's share of one block (DPF orders claims by their largest share)."""
        raise NotImplementedError


def _fits(d: float, a: float, g: float) -> bool:
    return d <= a + SLACK * g


class BasicAccountant(Accountant):
    """Basic composition: epsilons add up, deltas add up."""

    name = "basic"
    orders = ()

    def capacity(self, epsilon_global: float, delta_global: float) -> tuple[Vec, float]:
        return (float(epsilon_global),), float(delta_global)

    def demand(self, events: Iterable[Event]) -> tuple[Vec, float]:
        events = list(events)
        check_events(events)
        # Dwork-Roth Theorem 3.16: the sum of the events' epsilons and deltas.
        return (math.fsum(e.epsilon for e in events),), math.fsum(e.delta for e in events)

    def fitting_order(self, demands: Sequence[Vec], available: Sequence[Vec],
                      globals_: Sequence[Vec]) -> int | None:
        ok = all(_fits(d[0], a[0], g[0]) for d, a, g in zip(demands, available, globals_,
                                                            strict=True))
        return 0 if ok else None

    def guarantee(self, used: Vec, delta_used: float, epsilon_global: float,
                  delta_global: float) -> tuple[float, float, int]:
        return used[0], delta_used, 0

    def dominant_share(self, demand: Vec, global_: Vec) -> float:
        return demand[0] / global_[0] if global_[0] > 0 else math.inf


class RenyiAccountant(Accountant):
    """Rényi DP over :data:`ORDERS` (see the module docstring for the derivation)."""

    name = "renyi"

    def __init__(self, delta_share: float = 0.5, orders: Sequence[float] = ORDERS) -> None:
        if not 0 <= delta_share < 1:
            raise ValueError("the Rényi delta share must be in [0, 1)")
        if not orders or any(not (a > 1 and math.isfinite(a)) for a in orders):
            raise ValueError("Rényi orders must be finite and > 1")
        self.delta_share = float(delta_share)
        self.orders = tuple(float(a) for a in orders)

    def conversion_delta(self, delta_global: float) -> float:
        """delta_c: the part of delta^G spent converting RDP to (epsilon, delta)-DP."""
        return delta_global * (1.0 - self.delta_share)

    def capacity(self, epsilon_global: float, delta_global: float) -> tuple[Vec, float]:
        delta_c = self.conversion_delta(delta_global)
        if not delta_c > 0:
            raise ValueError("Rényi accounting needs delta_per_block > 0")
        log_inv = math.log(1.0 / delta_c)
        # Mironov Proposition 3, solved for the RDP budget at each order; 0 where the conversion
        # alone already exceeds epsilon^G (no claim can fit there).
        cap = tuple(max(0.0, epsilon_global - log_inv / (a - 1.0)) for a in self.orders)
        return cap, delta_global * self.delta_share

    def demand(self, events: Iterable[Event]) -> tuple[Vec, float]:
        events = list(events)
        check_events(events)
        total = [0.0] * len(self.orders)
        delta = 0.0
        for e in events:
            if e.kind == "key_release":
                delta += e.delta  # approximate-DP delta, no RDP cost of its own
                continue
            if e.kind == "epsilon_delta":
                # (eps, delta)-DP is delta-approximately eps-DP; pure eps-DP has the RDP curve
                # pure_dp_rdp (Steinke 2024, Theorem 4; at most eps at every order).
                curve = [pure_dp_rdp(a, e.epsilon) if e.epsilon > 0 else 0.0
                         for a in self.orders]
                delta += e.delta
            else:
                # A mechanism's own RDP curve (Gaussian included: its curve already covers the
                # delta it was calibrated for, so no approximate delta is added).
                mech = e.mechanism()
                curve = [mech.rdp(a) for a in self.orders]
            for i, r in enumerate(curve):
                if not (r >= 0 and math.isfinite(r)):
                    raise ValueError(f"{e.kind} event has no finite RDP cost at order "
                                     f"{self.orders[i]:g}")
                total[i] += r
        return tuple(total), delta

    def fitting_order(self, demands: Sequence[Vec], available: Sequence[Vec],
                      globals_: Sequence[Vec]) -> int | None:
        for i in range(len(self.orders)):
            if all(g[i] > 0 and _fits(d[i], a[i], g[i])
                   for d, a, g in zip(demands, available, globals_, strict=True)):
                return i
        return None

    def guarantee(self, used: Vec, delta_used: float, epsilon_global: float,
                  delta_global: float) -> tuple[float, float, int]:
        # Mironov Proposition 3 at the best order, plus the approximate deltas.
        delta_c = self.conversion_delta(delta_global)
        log_inv = math.log(1.0 / delta_c)
        best, index = math.inf, 0
        for i, (a, u) in enumerate(zip(self.orders, used, strict=True)):
            eps = u + log_inv / (a - 1.0)
            if eps < best:
                best, index = eps, i
        return best, delta_c + delta_used, index

    def dominant_share(self, demand: Vec, global_: Vec) -> float:
        # A claim's share of a block is its share at the order where it is cheapest relative to
        # the capacity (the order it would most likely be granted at).
        shares = [d / g for d, g in zip(demand, global_, strict=True) if g > 0]
        return min(shares) if shares else math.inf


def accountant_for(name: str, delta_share: float = 0.5) -> Accountant:
    """The accountant named by ``privacy.accounting``."""
    if name == "basic":
        return BasicAccountant()
    if name == "renyi":
        return RenyiAccountant(delta_share)
    raise ValueError(f"unknown accounting {name!r}; expected 'basic' or 'renyi'")
