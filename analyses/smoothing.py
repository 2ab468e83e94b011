"""The smooth sensitivity of a join query, for the epsilon and delta it is asked with.

:mod:`analyses.joins` reads a join into its elastic stability S(k), an expression over the max
frequencies of the join keys, and :mod:`analyses.query` leaves each measurement of a join query
with an infinite sensitivity and its per-row factor.  Once the query's epsilon and delta are
known (and the frequencies read: pinned in the policy, measured, or public), :func:`resolve`
sets every measurement's sensitivity from the beta-smooth bound of S(k) (DESIGN.md section 5).
It depends only on the query's shape, (epsilon, delta) and the frequencies, never on other data.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

from analyses.elastic import SmoothBound, smooth_bound, smoothing_beta
from analyses.join_groups import groups_per_unit
from analyses.query import AggregateQuery, Measurement
from chorus_py.errors import InvalidParameter


@dataclass(frozen=True)
class ResolvedJoin:
    """The smooth bound of a join query for one (epsilon, delta): per measurement
    epsilon_i = epsilon / n and delta_i = delta / n (basic composition of the n measurements)."""

    bound: SmoothBound
    epsilon_each: float
    delta_each: float


def resolve(query: AggregateQuery, epsilon: float, delta: float,
            mf: Mapping[str, float]) -> tuple[AggregateQuery, ResolvedJoin]:
    """Set the sensitivity of every measurement of a join query to 2 S* times its factor.

    Smooth sensitivity (Nissim, Raskhodnikova, Smith 2007; Johnson et al. 2018, Theorem 3): noise
    of scale 2 S* / epsilon_i with S* the beta-smooth bound, beta = epsilon_i / (2 ln(2 /
    delta_i)), is (epsilon_i, delta_i)-DP.  The mechanisms are calibrated as scale =
    sensitivity / epsilon_i, so the sensitivity handed to them is 2 S* (times the per-row factor:
    1 for COUNT, the grid steps per value for SUM); their scale is then exactly 2 S* / epsilon_i.
    Counts and grid sums are integers and get discrete Laplace noise: for integer shifts its
    sliding property is Laplace's (ratio exp(shift / b)), and its dilation property holds with
    the same constant, since the normaliser tanh(1 / 2b) satisfies tanh(x) / tanh(x') <= x / x'
    for x >= x' > 0 (tanh is concave), so the (epsilon, delta) proof carries over.
    """
    join = query.join
    assert join is not None
    if not delta > 0:
        raise InvalidParameter(
            "a query that joins private data needs delta > 0: its noise is calibrated to the "
            "smooth bound of its elastic sensitivity, which is (epsilon, delta)-DP",
            hint="pass a small delta, e.g. 1e-8")
    n = len(query.measurements)
    eps_i, delta_i = epsilon / n, delta / n
    bound = smooth_bound(join.stability, mf, smoothing_beta(eps_i, delta_i))
    groups = None  # D, when keys are thresholded or distinct units are counted per group
    if query.keys and (query.thresholded or any(m.kind == "count_units"
                                                  for m in query.measurements)):
        groups = groups_per_unit(join, [k.expr for k in query.keys], mf)
    measurements = tuple(
        _distinct_units(m, query, groups) if m.kind == "count_units"
        else dataclasses.replace(m, sensitivity=2.0 * bound.value * m.factor)
        for m in query.measurements)
    resolved = ResolvedJoin(bound, eps_i, delta_i)
    return dataclasses.replace(query, measurements=measurements, max_groups=groups), resolved


def _distinct_units(m: Measurement, query: AggregateQuery, groups: int | None) -> Measurement:
    """COUNT(DISTINCT unit) over a join on the unit (``analyses.join_groups``): a person moves
    it by 1 in each group they reach: Delta = 1 ungrouped, else min(G, D) (G: the number of
    listed public keys, when every key is listed).  A global bound, so not smoothed: discrete
    Laplace of scale Delta / epsilon_i is epsilon_i-DP (charged, conservatively, with the other
    measurements' (epsilon_i, delta_i))."""
    if not query.keys:
        return dataclasses.replace(m, sensitivity=1.0, derivation=(
            "COUNT(DISTINCT unit) over a join on the unit: a person is one of the counted "
            "units or not: Delta = 1"))
    assert groups is not None
    listed = [k.public_values for k in query.keys]
    bound = groups
    if all(v is not None for v in listed):
        bound = max(1, min(groups, math.prod(len(v or ()) for v in listed)))
    return dataclasses.replace(m, sensitivity=float(bound), derivation=(
        f"COUNT(DISTINCT unit) over a join on the unit: +-1 in each of the <= {bound} groups "
        f"a person's join rows reach (D = {groups}): Delta = {bound}"))
