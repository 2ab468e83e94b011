"""The row cap of a DP quantile query (contribution = "auto"), chosen on the data after its claim.

The same machinery as the analytic kinds' :class:`~chorus_py.kinds.selection.Selection`: the
cap histogram of ``rewriters.pipeline.cap_histogram`` (units per bin of their rows in the
query's filtered rows, ``mechanisms.caps.cap_bins``; L1 sensitivity 1, discrete Laplace noise
of scale 1 / epsilon_h; when the query filters nothing but all its table's blocks, the same
counts read from the ranked copy's stored row counts: ``kinds.selection.cells``), and for keys
released by a threshold first the histogram of distinct
groups per unit (``rewriters.selection.group_histogram``, sensitivity 1), read as
``mechanisms.caps.RowModel``.  What differs is the rule: the cap minimises rows dropped plus the
exponential mechanism's rank error (``mechanisms.quantile_cap``), and the groups per unit are
the 99% quantile of the soft-thresholded groups histogram (``mechanisms.caps.
choose_groups_checked`` without its suppression term: g is kept where it drops almost nothing;
with g below k the gate counts distinct units, ``chorus_py.kinds.quantile.KeyGate``).

Budget: the selection has ``epsilon`` (the query's ``privacy.cap_epsilon_share``), split equally
over its histograms (each of sensitivity 1: basic composition gives exactly ``epsilon``); the
cap and g are post-processing of the noisy histograms.  Only noisy histograms leave
:meth:`QuantileSelection.choose`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from analyses.query import AggregateQuery
from chorus_py.kinds.selection import (
    CELLS,
    STORED,
    Choices,
    Histogram,
    bounds_groups,
    cells,
    histogram,
    noisy_units,
)
from chorus_py.statements import QueryRun, Statements
from mechanisms.caps import cap_bins, choose_groups_checked
from mechanisms.quantile_cap import choose_quantile_cap
from rewriters.blocks import BlockRestriction
from rewriters.pipeline import cap_histogram
from rewriters.selection import choice_histogram, group_histogram


@dataclass(frozen=True)
class QuantileSelection:
    """The cap (and groups per unit) a prepared quantile query still has to choose: run by the
    engine between the claim and the answer, as :class:`~chorus_py.kinds.selection.Selection`.

    ``ps``: one p per quantile; ``rank_error(k)``: the sum of their mechanisms' 95% rank errors
    at cap k (``mechanisms.quantile_cap``); ``groups``: G, the public groups (1 otherwise);
    ``key``: under which the choices may be reused by an identical query; ``apply``: the query
    prepared with the choices."""

    query: AggregateQuery
    epsilon: float
    ps: tuple[float, ...]
    rank_error: Callable[[int], float]
    groups: int
    histograms: tuple[Histogram, ...]
    key: tuple[object, ...]
    apply: Callable[[Choices], Any]

    def kept(self, chosen: Choices) -> tuple[tuple[tuple[object, ...], Choices], ...]:
        """The choices under ``key`` when they may be reused."""
        return ((self.key, chosen),) if chosen.reusable else ()

    def choose(self, statements: Statements, run: QueryRun) -> Choices:
        """Run the noisy histograms, then pick g (thresholded keys) and the cap."""
        query = self.query
        limit = query.table_policy.contribution_bound
        by_groups = bounds_groups(query)
        eps_h = self.epsilon / (1 + int(by_groups))
        sized = {what: (size, sql) for what, size, sql in self.histograms}
        per_unit, fell_back = None, False
        if by_groups:
            # The rule reads the soft-thresholded counts (phantom units in the noisy tail
            # would make D = k and the gate count rows); a choice the histogram does not
            # clearly support is not stored for reuse.
            group_choice = choose_groups_checked(noisy_units(
                histogram(statements, run, *sized[("groups",)]), limit, eps_h))
            per_unit, fell_back = group_choice.groups, group_choice.noise_dominated
        # Only the noisy histogram leaves: the exact one goes no further than noisy_units.
        if ("cap",) in sized:
            exact = histogram(statements, run, *sized[("cap",)])
        else:  # the ranked copy's stored row counts: the cap marginal of its cells
            exact = cells(statements, run, sized[CELLS][1], limit, (), stored=True)[("cap",)]
        rows = noisy_units(exact, limit, eps_h)
        cap = choose_quantile_cap(rows, self.ps, self.rank_error, self.groups).cap
        return Choices(cap, (), per_unit, reusable=not fell_back)


def quantile_histograms(query: AggregateQuery, restriction: BlockRestriction | None,
                        stored: tuple[str, str] | None = None
                        ) -> Sequence[tuple[tuple[str, ...], int, Callable[[], Any]]]:
    """The selection histograms of a quantile query, in the order :meth:`QuantileSelection.
    choose` reads them: (what, bins, a function building its tree) each.  ``stored``: the
    ranked copy whose stored row counts are the query's rows per unit (``kinds.selection.
    stored_counts``): the cap histogram is then its cells statement (``CELLS``, a plain scan
    of the rank-1 rows' counts, ``rewriters.selection.choice_histogram``, whose exact result
    the proxy keeps for the copy's lifetime), not a GROUP BY unit over the table."""
    starts = cap_bins(query.table_policy.contribution_bound)
    builds: list[tuple[tuple[str, ...], int, Callable[[], Any]]] = []
    if bounds_groups(query):
        builds.append((("groups",), len(starts),
                       lambda: group_histogram(query, restriction, None, starts)))
    if stored is not None:
        builds.append((CELLS, STORED,
                       lambda: choice_histogram(query, (), starts, restriction, None, stored)))
    else:
        builds.append((("cap",), len(starts),
                       lambda: cap_histogram(query, restriction, None, starts)))
    return builds
