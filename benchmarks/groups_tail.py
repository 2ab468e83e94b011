"""How far the analytic kinds' groups-per-unit bound g (``mechanisms.caps.choose_groups_checked``)
falls from its exact-count choice when read from a noisy histogram: the rule alone, on synthetic
histograms of distinct groups per unit, many draws each.

"Best" is the rule on the exact counts; "far" is g > 2 best or g < best / 2.  ``excess`` is
E(g) - E(best) on the exact counts (the share of (unit, group) pairs lost above g, plus, with a
key-release count, the share in groups suppressed by tau(g): the rule's own objective).  The
noise is discrete Laplace of scale 1 / epsilon_h from a seeded numpy generator (the mechanism's
own sampler is cryptographic: slow and unseeded).

    python -m benchmarks.groups_tail [draws]
"""

from __future__ import annotations

import math
import sys

import numpy as np

from mechanisms.caps import RowModel, cap_bins, choose_groups_checked
from mechanisms.thresholding import key_release_threshold

LIMIT = 200
STARTS = cap_bins(LIMIT)


def population(groups_per_unit: dict[int, int]) -> np.ndarray:
    """Units per bin of ``cap_bins(LIMIT)`` from {groups: units}."""
    counts = np.zeros(len(STARTS))
    for groups, units in groups_per_unit.items():
        counts[np.searchsorted(STARTS, groups, side="right") - 1] += units
    return counts


POPULATIONS = {
    "1005 units in 1 group": population({1: 1005}),
    "600 in 1, 390 in 2, 15 in 30": population({1: 600, 2: 390, 30: 15}),
    "600 in 1, 395 in 2, 5 in 30": population({1: 600, 2: 395, 30: 5}),
    "500 uniform in 1..20": population({g: 25 for g in range(1, 21)}),
    "900 in 1, 5 in each bin of 10..199 (90)": population(
        {1: 900} | {s: 5 for s in STARTS if 10 <= s < 200}),
    "1000 geometric, mean 3": population(
        {g: round(1000 * (1 / 3) * (2 / 3) ** (g - 1)) for g in range(1, 40)}),
}


def excess(exact: RowModel, g: int, best: int, gate: tuple[float, float] | None) -> float:
    """E(g) - E(best) on the exact counts (``choose_groups_checked``'s objective)."""
    pairs = exact.all_rows()
    quantile = choose_groups_checked(exact).groups

    def e(c: int) -> float:
        error = exact.lost(c, 0.0) / pairs
        if gate is not None:
            r = key_release_threshold(c / gate[0], c, gate[1]) / (exact.kept(c) / quantile)
            error += 1.0 - (1.0 + r) * math.exp(-r)
        return error

    return e(g) - e(best)


def run(draws: int, seed: int = 2026) -> list[str]:
    rng = np.random.default_rng(seed)
    lines = ["| population | eps_h | gate | best | g = best | far | far above | far below "
             "| excess mean | excess p95 |", "|" + "---|" * 10]
    for name, counts in POPULATIONS.items():
        exact = RowModel(STARTS, tuple(counts), LIMIT, 0.0)
        for eps_h in (0.5, 0.1, 0.025):
            a = math.exp(-eps_h)
            for gate in (None, (0.18, 1e-8)):
                best = choose_groups_checked(exact, *(gate or ())).groups
                found = []
                for _ in range(draws):
                    noise = (rng.geometric(1 - a, len(counts))
                             - rng.geometric(1 - a, len(counts)))
                    noisy = RowModel(STARTS, tuple(counts + noise), LIMIT, eps_h)
                    found.append(choose_groups_checked(noisy, *(gate or ())).groups)
                g = np.asarray(found)
                above, below = np.mean(g > 2 * best), np.mean(g < best / 2)
                lost = np.asarray([excess(exact, int(c), best, gate) for c in g])
                lines.append(
                    f"| {name} | {eps_h} | {'eps_t 0.18' if gate else 'none'} | {best} "
                    f"| {np.mean(g == best):.0%} | {above + below:.0%} | {above:.0%} "
                    f"| {below:.0%} | {lost.mean():.3f} | {np.quantile(lost, 0.95):.3f} |")
    return lines


if __name__ == "__main__":
    print("\n".join(run(int(sys.argv[1]) if len(sys.argv) > 1 else 1000)))
