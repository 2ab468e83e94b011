"""The private choices of a one-table query, made on the data after its claim: the row cap per
unit (contribution = "auto"), the clipping bounds of its summed columns (clipping = "auto") and,
for keys released by thresholding, the groups per unit.

A :class:`Selection` is one object with its own share of the query's epsilon
(``privacy.cap_epsilon_share``): it runs its noisy histograms (sensitivity 1 each, an equal part
of that share each, so together they cost exactly the share, by basic composition) and picks
the cap and bounds from them (``mechanisms.caps``, ``mechanisms.clip_bounds``).  Only noisy
histograms leave :meth:`Selection.choose`; the choices are post-processing of them.  The
histograms' SQL is built and planned before the claim (wall 6), like the answer's.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from sqlglot import exp

from analyses.blocks import BlockWindows
from analyses.query import AggregateQuery, display_sql
from chorus_py.backends import ResultSet
from chorus_py.report import ContributionReport, PrivacyReport, SelectionStep
from chorus_py.statements import QueryRun, Statements
from chorus_py.stores.samples import covers_whole_copy
from mechanisms import DiscreteLaplace, Snapping
from mechanisms.caps import (
    CapTerm,
    RowModel,
    cap_bins,
    choose,
    choose_groups_checked,
    limit_is_certain,
)
from mechanisms.clip_bounds import STEPS, ClipColumn, magnitude_edges
from mechanisms.planning import THRESHOLD_ID, NoisePlan
from mechanisms.selection_bias import Bias as SelectionBias
from mechanisms.selection_bias import cap_bias, clip_bias
from rewriters.blocks import BlockRestriction
from rewriters.grouped_copy import groups_per_unit
from rewriters.pipeline import cap_histogram, filtered_rows
from rewriters.selection import (
    DISTINCT_GROUPS_DIALECTS,
    ClippedArgument,
    cell_base,
    choice_histogram,
    clipped_arguments,
    group_histogram,
    units_per_bin,
    value_histogram,
)


@dataclass(frozen=True)
class Choices:
    """What a selection chose: the cap, the clipping bounds (argument, lower, upper) and the
    groups per unit (None: not bounded).

    ``reusable``: False when a choice fell back because its histogram was mostly noise
    (``mechanisms.caps.Choice.noise_dominated``): an identical query then looks again instead
    of reusing it.  ``cap_bias`` (None: the cap drops nothing the histograms can see, or no
    cap was chosen) and ``clip_bias`` (per clipped argument) say how low the answers may come
    out (``mechanisms.selection_bias``, from the same noisy histograms: free).
    """

    cap: int
    bounds: tuple[tuple[str, float, float], ...]
    groups: int | None
    reusable: bool = True
    cap_bias: SelectionBias | None = None
    clip_bias: tuple[tuple[str, SelectionBias], ...] = ()


# (what, bins, SQL) of one selection histogram: ("cap",), ("groups",) or ("clip", argument).
Histogram = tuple[tuple[str, ...], int, str]


@dataclass(frozen=True)
class Selection:
    """The choices a prepared query still has to make, and how: run by the engine between the
    claim and the answer.  ``key``: under which the choices may be reused by an identical query
    (privacy.choice_reuse_seconds); ``apply``: the query prepared with the choices."""

    query: AggregateQuery
    plan: NoisePlan
    epsilon: float
    histograms: tuple[Histogram, ...]
    key: tuple[object, ...]
    apply: Callable[[Choices], Any]
    # Histograms over stored relations only (the groups histogram over a grouped twin):
    # their exact result is kept in memory (``Statements.run_stored``), noised afresh.
    stored: frozenset[tuple[str, ...]] = frozenset()
    # The cells statement (``CELLS``) cut into parts that keep whole units, run side by side
    # instead of it (``rewriters.selection.choice_histogram``'s ``part``); () runs it whole.
    parts: tuple[str, ...] = ()

    def kept(self, chosen: Choices) -> tuple[tuple[tuple[object, ...], Choices], ...]:
        """The choices under ``key`` when they may be reused."""
        return ((self.key, chosen),) if chosen.reusable else ()

    def choose(self, statements: Statements, run: QueryRun) -> Choices:
        """Run the noisy histograms and pick the cap, the bounds and the groups per unit.

        Each histogram has sensitivity 1 and gets an equal part of the selection epsilon, so
        together they cost exactly ``self.epsilon`` (basic composition).
        """
        query, plan = self.query, self.plan
        limit = query.table_policy.contribution_bound
        with_rows, clipped = parts(query)
        by_groups = bounds_groups(query)
        eps_h = self.epsilon / (int(with_rows) + int(by_groups) + len(clipped))
        sized = {what: (size, sql) for what, size, sql in self.histograms}
        exact_of = _exact_histograms(statements, run, sized, query, clipped, self.stored,
                                     self.parts)
        per_unit = None
        groups_fell_back = False
        if by_groups:  # g first: the histogram of distinct groups per unit (sensitivity 1)
            gate = plan.threshold  # its epsilon and delta are public: the rule weighs tau(g)
            assert gate is not None
            group_choice = choose_groups_checked(
                noisy_units(exact_of(("groups",)), limit, eps_h),
                gate.mechanism.epsilon, gate.delta)
            per_unit = group_choice.groups
            groups_fell_back = group_choice.noise_dominated
        columns = []
        for arg in clipped:
            exact = exact_of(("clip", arg.key))
            # The exact weights never leave this function: only their noisy version is used.
            noisy = Snapping.from_sensitivity(1.0, eps_h).sample(exact)
            columns.append(ClipColumn(arg.lower, arg.upper, tuple(float(v) for v in noisy),
                                      eps_h))  # its epsilon: biases at their upper estimates
        if not with_rows and not clipped:  # only g to choose: the cap stays as it is
            return Choices(query.stability, (), per_unit, reusable=not groups_fell_back)
        if with_rows:
            rows = noisy_units(exact_of(("cap",)), limit, eps_h)
        else:  # event level: the units (rows) the value histograms counted
            rows = RowModel.exact_rows(max(max(sum(c.weights()), 1.0) for c in columns))
        terms = cap_terms(query, plan, {arg.key: i for i, arg in enumerate(clipped)},
                          per_unit is not None)
        auto = query.auto_cap and cap_matters(query)
        choice = choose(rows, terms, columns, public_groups(query) or 1,
                        None if auto else (query.stability,))
        return Choices(
            choice.cap, tuple((arg.key, *columns[i].interval(choice.bounds[i]))
                              for i, arg in enumerate(clipped)), per_unit,
            reusable=not (choice.noise_dominated or groups_fell_back),
            cap_bias=cap_bias(rows, choice.cap) if with_rows and auto else None,
            clip_bias=tuple((arg.key, clip_bias(columns[i], choice.bounds[i]))
                            for i, arg in enumerate(clipped)))


def noisy_units(exact: np.ndarray, limit: int, eps_h: float) -> RowModel:
    """An exact histogram of units per bin (``mechanisms.caps.cap_bins`` of ``limit``; L1
    sensitivity 1: a unit is in one bin) as the choice rules read it: discrete Laplace noise of
    scale 1 / ``eps_h`` on every bin.  The exact counts go no further than this function."""
    noisy = DiscreteLaplace.from_sensitivity(1, eps_h).sample(exact)
    return RowModel(cap_bins(limit), tuple(float(v) for v in noisy), limit, eps_h)


def _bias_text(bias: SelectionBias | None, what: str) -> str | None:
    """A step's bias as the report shows it: "up to 3% low (rows above the cap)"."""
    if bias is None:
        return None
    return f"about {bias.estimate:.1%}, up to {bias.upper:.1%} low ({what})"


def _exact_histograms(statements: Statements, run: QueryRun,
                      sized: dict[tuple[str, ...], tuple[int, str]], query: AggregateQuery,
                      clipped: tuple[ClippedArgument, ...],
                      stored: frozenset[tuple[str, ...]] = frozenset(),
                      parts: tuple[str, ...] = ()
                      ) -> Callable[[tuple[str, ...]], np.ndarray]:
    """A function giving each exact histogram of the selection by its name: run on its own, or
    read from the one statement of cells (``CELLS``) that holds the cap histogram and the
    clipping histograms, run once (as its ``parts`` when given), the first time one of them is
    asked for."""
    split: dict[tuple[str, ...], np.ndarray] = {}

    def exact_of(what: tuple[str, ...]) -> np.ndarray:
        if what in sized:
            return histogram(statements, run, *sized[what], stored=what in stored)
        if not split:
            size, sql = sized[CELLS]
            split.update(cells(statements, run, sql, query.table_policy.contribution_bound,
                               clipped, stored=size == STORED, copied=size == COPIED,
                               parts=parts))
        return split[what]
    return exact_of


def stored_counts(query: AggregateQuery, restriction: BlockRestriction | None,
                  windows: BlockWindows | None, ranked: tuple[str, str] | None
                  ) -> tuple[str, str] | None:
    """The ranked copy ``ranked`` when its stored row counts are the query's rows per unit:
    the query filters nothing but its claimed blocks (``restriction``), and claims every
    block of the table's schedule (``windows``: the copy holds the rows of the schedule when
    it was built, which only grows: every one of them passes).  Then the selection
    histograms read the counts instead of counting (``rewriters.selection.
    choice_histogram``)."""
    if ranked is None or query.where is not None or (
            query.thresholded and any(k.public_values is not None for k in query.keys)):
        return None
    if query.table_policy.block is None:
        return ranked
    return ranked if windows is not None and covers_whole_copy(restriction, windows) else None


# The name of the one statement holding the cap and clipping histograms (its "bins": STORED
# when it reads the ranked copy's stored row counts, COPIED when its windows read the ranked
# copy's filtered rows, WINDOWED when they read the table's).
CELLS = ("cells",)
STORED, WINDOWED, COPIED = 1, 0, 2
# At most this many clipped arguments share the cells statement with the cap histogram: its
# rows are the cells of the joint histogram, up to (cap bins) x (STEPS + 2)^n of them.
CELLS_ARGUMENTS = 2


def cells(statements: Statements, run: QueryRun | None, sql: str, limit: int,
          clipped: tuple[ClippedArgument, ...], stored: bool, copied: bool = False,
          parts: Sequence[str] = ()) -> dict[tuple[str, ...], np.ndarray]:
    """Run ``rewriters.selection.choice_histogram``'s statement and sum its cells into the
    exact cap histogram and the exact clipping histogram of every argument.

    The cap marginal sums the marks wc (1 on one row of each unit, 0 on its other rows): the
    number of units per bin, an exact integer on both shapes (``stored``: the copy's rank 1;
    otherwise ROW_NUMBER() = 1 over the unit's filtered rows), so nothing is rounded and
    nothing can fail to add up.  L1 sensitivity 1: one more or one fewer unit moves its one
    mark, in the one bin of its c_u (``stored``: of n_u, which the caller checks is c_u; were
    a row of the copy filtered out, the unit would add at most 1 there: still <= 1).  The
    clipping marginals sum the per-row weights of ``choice_histogram`` (L1 sensitivity 1
    each, derived there), noised by the snapping mechanism.

    ``stored`` (the copy's stored counts) and ``copied`` (the windows over the copy's
    filtered rows): the statement reads only the ranked copy, which never changes under its
    name, so its exact marginals are remembered by its text (which names the copy) and every
    later query noises them afresh: the same exact histograms, each use its own noise and its
    own charge, as when the statement runs again.  Over filtered rows only the marginals are
    kept (``Statements.run_remembered``): analysts write the filters, so there may be many.

    ``parts`` (``copied`` only): the statement cut into parts over disjoint sets of units
    (``choice_histogram``'s ``part``), run side by side instead of it: a unit's rows, mark
    and weights are all in one part, so the parts' cells together are the statement's cells,
    summed into the same marginals (``np.add.at`` adds a cell key met in both parts twice:
    the same sums, up to the order of floating-point additions), remembered under its text.
    """
    def marginals(result: ResultSet) -> dict[tuple[str, ...], np.ndarray]:
        return _marginals(result.rows, limit, clipped)

    if copied:
        return statements.run_remembered(sql, run, (limit, tuple(a.key for a in clipped)),
                                         lambda result: _read_only(marginals(result)),
                                         parts=parts)
    if parts:
        raise ValueError("the cells run in parts only over the ranked copy's filtered rows")
    if not stored:
        return marginals(statements.run(sql, run))
    # The statement reads only the ranked copy, which never changes under its name: its exact
    # cells, and so their marginals, are kept in memory (read-only) and noised afresh by every
    # query.
    return statements.run_stored_as(sql, run, (limit, tuple(a.key for a in clipped)),
                                    lambda result: _read_only(marginals(result)))


def _read_only(arrays: dict[tuple[str, ...], np.ndarray]) -> dict[tuple[str, ...], np.ndarray]:
    for array in arrays.values():
        array.flags.writeable = False
    return arrays


def _marginals(rows: Sequence[tuple[Any, ...]], limit: int,
               clipped: tuple[ClippedArgument, ...]) -> dict[tuple[str, ...], np.ndarray]:
    """The cap and clipping marginals of the cells ``rows`` (``cells``)."""
    starts = np.array(cap_bins(limit))
    cap = np.zeros(len(starts))
    values = [np.zeros(STEPS + 2) for _ in clipped]
    base = cell_base(range(STEPS + 1))
    n = len(clipped)
    # Column by column over the cells (a few thousand: a per-row loop was most of a reused
    # SUM's proxy time).  np.add.at adds in row order, as the loop did: the same floats.
    keys = np.fromiter((int(row[0]) for row in rows), dtype=np.int64, count=len(rows))
    for i in reversed(range(n)):  # the last argument's bin is the lowest digit
        keys, b = np.divmod(keys, base)
        w = np.fromiter((np.nan if row[2 + i] is None else float(row[2 + i]) for row in rows),
                        dtype=np.float64, count=len(rows))
        kept = (b <= STEPS + 1) & ~np.isnan(w)  # STEPS + 2: a NULL value, no weight
        np.add.at(values[i], b[kept], w[kept])
    # key = min(c_u, limit): bin i holds starts[i] <= c_u < starts[i + 1], the last bin
    # c_u >= limit (``rewriters.pipeline.cap_histogram``'s bins).  The marks' SUM is an int
    # (DuckDB HUGEINT) or a Decimal (Postgres NUMERIC); below 2^53 units a float holds it
    # exactly.
    marks = np.fromiter((int(row[1] or 0) for row in rows), dtype=np.int64, count=len(rows))
    np.add.at(cap, np.searchsorted(starts, keys, side="right") - 1, marks)
    out = {("cap",): cap}
    for arg, vector in zip(clipped, values, strict=True):
        out[("clip", arg.key)] = vector
    return out


def histogram(statements: Statements, run: QueryRun, size: int, sql: str,
              stored: bool = False) -> np.ndarray:
    """Run one selection histogram: its exact (bin, value) rows as a vector of ``size``;
    ``stored``: it reads relations that never change under their names, so its result is
    kept in memory (``Statements.run_stored``: still exact, noised by the caller)."""
    exact = np.zeros(size)
    result = statements.run_stored(sql, run) if stored else statements.run(sql, run)
    for index, value in result.rows:
        exact[int(index)] = float(value)
    return exact


def histogram_builders(query: AggregateQuery, restriction: BlockRestriction | None,
                       sample: tuple[str, str] | None, one_statement: bool = False,
                       stored: tuple[str, str] | None = None,
                       copy: tuple[str, str] | None = None, dialect: str | None = None,
                       grouped: tuple[str, str] | None = None, digits: bool = True,
                       part: tuple[bool, int] | None = None
                       ) -> list[tuple[tuple[str, ...], int, Callable[[], Any]]]:
    """The selection histograms of ``query``, in the order :meth:`Selection.choose` reads
    them: (what, bins, a function building its tree) each.

    ``one_statement``: the cap histogram and up to ``CELLS_ARGUMENTS`` clipping histograms
    come from one statement (``CELLS``, ``rewriters.selection.choice_histogram``), over the
    ranked copy ``stored`` (its row counts, no window) when it is given, else over the filtered
    rows of the ranked copy ``copy`` (windows, a result remembered: ``cells``; ``copy`` may
    name its twin in unit order) when it is given; ``digits``: read the magnitude digits
    the copy stores (``rewriters.selection.stored_digit_columns``), else compute them;
    ``part``: the cells statement's part (``choice_histogram``), over ``copy`` only.  The
    groups histogram keeps its own statement (one aggregation per unit on the ``dialect``s
    of ``DISTINCT_GROUPS_DIALECTS``; over the grouped twin ``grouped`` of a query that reads
    every row of the copy, the sum of its marks per unit), and so does a cap histogram alone
    over filtered rows."""
    limit = query.table_policy.contribution_bound
    with_rows, clipped = parts(query)
    builds: list[tuple[tuple[str, ...], int, Callable[[], Any]]] = []
    if bounds_groups(query):  # g first: the histogram of distinct groups per unit
        starts = cap_bins(limit)
        if grouped is not None:
            unit = query.privacy_unit
            assert unit is not None
            builds.append((("groups",), len(starts), lambda: units_per_bin(groups_per_unit(
                filtered_rows(query, restriction, None, grouped), query.alias, unit), starts)))
        else:
            builds.append((("groups",), len(starts),
                           lambda: group_histogram(query, restriction, sample, starts,
                                                   dialect in DISTINCT_GROUPS_DIALECTS)))
    # A cap histogram alone over filtered rows stays a GROUP BY unit (a hash aggregate, no
    # window to weigh the rows: cheaper); over stored counts it is a plain scan.
    if one_statement and with_rows and len(clipped) <= CELLS_ARGUMENTS \
            and (clipped or stored is not None):
        starts = cap_bins(limit)
        arguments = [(arg, magnitude_edges(max(abs(arg.lower), abs(arg.upper))))
                     for arg in clipped]
        over_copy = stored is None and copy is not None
        builds.append((CELLS, STORED if stored is not None else COPIED if over_copy
                       else WINDOWED,
                       lambda: choice_histogram(query, arguments, starts, restriction, sample,
                                                stored, copy if over_copy else None,
                                                digits, part if over_copy else None)))
        return builds
    for arg in clipped:
        edges = magnitude_edges(max(abs(arg.lower), abs(arg.upper)))
        builds.append((("clip", arg.key), STEPS + 2, lambda e=edges, a=arg: value_histogram(
            query, a.argument, a.lower, a.upper, e, restriction, sample)))
    if with_rows:
        starts = cap_bins(limit)
        builds.append((("cap",), len(starts),
                       lambda: cap_histogram(query, restriction, sample, starts)))
    return builds


# Row functions whose value depends on when a statement runs, not on the rows alone.
_OF_THE_MOMENT: tuple[type[exp.Expr], ...] = (
    exp.CurrentDate, exp.CurrentTimestamp, exp.CurrentTime, exp.CurrentDatetime, exp.Rand,
    exp.Randn, exp.Uuid)


def copy_cells(query: AggregateQuery) -> bool:
    """Whether the choices' cells of a filtered ``query`` may read the ranked copy and be
    remembered (``COPIED``): only when what the statement computes is a function of the rows
    alone.  A filter on ``CURRENT_DATE`` keeps other rows tomorrow: a result remembered by its
    text would then describe yesterday's rows (no privacy loss, every use is noised afresh,
    but stale choices), so such a query reads the table every time."""
    read = [query.where, *(k.expr for k in query.keys),
            *(a.argument for a in clipped_arguments(query))]
    return not any(e is not None and e.find(*_OF_THE_MOMENT) is not None for e in read)


def remembers(tree: exp.Expr, copy: tuple[str, str] | None) -> bool:
    """Whether the exact result of the statement ``tree`` may be remembered by its text
    (``Statements.run_remembered``): it reads only the ranked copy ``copy`` (schema, name) and
    the relations stored from it (its twins, named after it), which never change under their
    names (``chorus_py.stores.samples``), and calls no function whose value depends on when
    it runs or on a random draw.  Its text then names everything it reads, so the result
    read again would be the same; every use of it is still noised afresh and charged.  Any
    other relation (the table itself, a public table, a table function) is read every time."""
    if copy is None:
        return False
    schema, name = copy
    ctes = {cte.alias_or_name for cte in tree.find_all(exp.CTE)}
    for table in tree.find_all(exp.Table):
        stored = table.db == schema and table.name.startswith(name)
        if not (stored or (not table.db and table.name in ctes)):
            return False
    return tree.find(*_OF_THE_MOMENT) is None


def parts(query: AggregateQuery) -> tuple[bool, tuple[ClippedArgument, ...]]:
    """(whether the cap histogram runs, the expressions whose bounds are chosen)."""
    clipped = clipped_arguments(query) if query.table_policy.auto_clipping else ()
    # With a privacy unit the cap histogram also tells the clipping rule how many rows
    # there are; on an event-level table the value histogram counts the rows itself.
    rows = query.privacy_unit is not None and (
        (query.auto_cap and cap_matters(query)) or bool(clipped))
    return rows, clipped


def bounds_groups(query: AggregateQuery) -> bool:
    """Whether the query's rows per unit are also kept in at most g groups, g chosen with the
    cap: automatic caps and keys released by thresholding (``mechanisms.caps.choose_groups``)."""
    return query.auto_cap and query.thresholded and query.privacy_unit is not None


def cap_matters(query: AggregateQuery) -> bool:
    """Whether some noise scale of the query grows with the row cap k."""
    if query.thresholded and not bounds_groups(query):
        return True  # the key-release count reaches up to k groups per unit
    # With g chosen (bounds_groups), the key release needs D = min(g, k) groups per unit: g
    # at the limit, so only the measurements' own noise can make a smaller cap worth it.
    return any(cap_weight(query, m.id) > 0 for m in query.measurements)


def cap_stays_at_limit(query: AggregateQuery, plan: NoisePlan, epsilon: float) -> bool:
    """Whether a cap selection of ``epsilon`` (its whole share: the cap histogram alone, no
    clipped column, no thresholded keys) would keep the limit whatever its histogram showed,
    for the query answered with ``plan`` (``mechanisms.caps.limit_is_certain``)."""
    if query.thresholded or (query.table_policy.auto_clipping and clipped_arguments(query)):
        return False
    return limit_is_certain(cap_terms(query, plan, {}, False), epsilon,
                            public_groups(query) or 1)


def cap_terms(query: AggregateQuery, plan: NoisePlan, index: dict[str, int],
              groups_bounded: bool) -> list[CapTerm]:
    """The rule's view of every noisy measurement of ``plan`` (``mechanisms.caps.CapTerm``);
    ``index`` gives the clipped expressions' columns by their SQL."""
    by_id = {m.id: m for m in query.measurements}
    terms = []
    for mid, mechanism in plan.all_mechanisms().items():
        m = by_id.get(mid)
        column = index.get(m.argument_sql) if m is not None and m.argument is not None \
            else None
        kind = "count" if m is None or m.integral else m.kind
        # With g bounded, the unreleased key-release count's scale is min(g, k) / eps: the
        # cap rule leaves it out (g, not k, sets tau).
        weight = 0.0 if groups_bounded and mid == THRESHOLD_ID else cap_weight(query, mid)
        terms.append(CapTerm(weight, mechanism.epsilon, m.total if m is not None else False,
                             column, "count" if kind == "count_units" else kind,
                             bool(m is not None and m.center)))
    return terms


def public_groups(query: AggregateQuery) -> int | None:
    """G, the number of groups when every key has declared public values (None otherwise)."""
    if not query.keys or query.thresholded or any(k.public_values is None
                                                  for k in query.keys):
        return None
    return math.prod(len(k.public_values or ()) for k in query.keys)


def cap_weight(query: AggregateQuery, mid: str) -> float:
    """w_m of ``mechanisms.caps``: how a measurement's noise, in rows, grows with the cap."""
    kinds = {m.id: m.kind for m in query.measurements}
    kind = kinds.get(mid, "count")  # the separate key-release count behaves like a count
    if kind == "count_units":
        # Ungrouped: sensitivity 1 whatever the cap.  Over G public groups: min(k, G), which
        # the cap may as well leave at the limit (a smaller cap only drops the groups of
        # units' dropped rows: a bias, and no less noise once k >= G).
        # Thresholded keys with g chosen: min(k, g), the same.
        return 1.0 if query.keys and public_groups(query) is None \
            and not bounds_groups(query) else 0.0
    return 1.0 if kind == "count" else 2.0


def with_contribution(report: PrivacyReport, query: AggregateQuery, cap_epsilon: float,
                      chosen: Choices | None, clipped: tuple[ClippedArgument, ...],
                      reused: bool = False, settled: str | None = None) -> PrivacyReport:
    """The report with its selection steps: what is chosen, at what epsilon, and (once the
    query ran, or when reused) what was chosen; the selection's epsilon is added to the
    report's.  ``settled``: why no selection ran although the cap is automatic (the cap is the
    query's stability)."""
    limit = query.table_policy.contribution_bound
    mode: Literal["auto", "fixed"] = "auto" if query.auto_cap else "fixed"
    with_rows, _ = parts(query)
    with_rows = with_rows and settled is None
    by_groups = bounds_groups(query)
    cap = chosen.cap if chosen is not None else None
    groups = chosen.groups if chosen is not None else None
    steps = []
    n_parts = int(with_rows) + int(by_groups) + len(clipped)
    eps_h = cap_epsilon / n_parts if n_parts else 0.0
    if by_groups:
        steps.append(SelectionStep(
            "groups", f"groups per {query.privacy_unit} (sets the key-release threshold: "
            "D = min(g, cap) groups per unit)", f"limit {limit}", eps_h, "discrete_laplace",
            None if groups is None else f"{groups} groups"))
    if with_rows:
        unit = query.privacy_unit
        steps.append(SelectionStep(
            "cap", f"rows per {unit}" if mode == "auto" else
            f"rows per {unit} (estimates the rows kept, for the clipping bounds)",
            f"limit {limit}", eps_h, "discrete_laplace",
            None if cap is None else f"cap {cap}" + ("" if mode == "auto" else " (fixed)"),
            _bias_text(chosen.cap_bias if chosen else None, "rows above the cap")))
    chosen_bounds = {key: (lo, hi) for key, lo, hi in (chosen.bounds if chosen else ())}
    for arg in clipped:
        got = chosen_bounds.get(arg.key)
        biases = dict(chosen.clip_bias) if chosen else {}
        steps.append(SelectionStep(
            "bounds", display_sql(arg.argument), f"[{arg.lower:g}, {arg.upper:g}]", eps_h,
            "snapping", None if got is None else f"[{got[0]:g}, {got[1]:g}]",
            _bias_text(biases.get(arg.key), "values clipped")))
    if reused:
        shown: int | None = cap if mode == "auto" else limit
        note = ("the choices of your identical earlier query (same SQL, epsilon, delta and "
                "blocks, within privacy.choice_reuse_seconds) are reused: they are noisy, "
                "differentially private outputs already paid for, so reusing them costs "
                "nothing and all of epsilon goes to the answer")
        steps = [dataclasses.replace(step, epsilon=0.0, mechanism="reused") for step in steps]
    elif settled is not None:
        note, shown = settled, query.stability
    elif cap_epsilon == 0 and query.keys:
        note = (f"COUNT(DISTINCT unit) over public groups has sensitivity min(cap, groups): "
                f"the limit {limit} keeps every group a unit reaches, no epsilon spent on "
                "choosing a cap")
        shown = query.stability
    elif cap_epsilon == 0:
        note = ("COUNT(DISTINCT unit) needs one row per unit: cap 1, no epsilon spent on "
                "choosing it")
        shown = query.stability
    else:
        shown = cap if mode == "auto" else limit
        what = " and ".join(
            (["the cap"] if mode == "auto" else [])
            + (["the groups per unit"] if by_groups else [])
            + (["the clipping bounds of " + ", ".join(s.target for s in steps
                                                      if s.kind == "bounds")]
               if clipped else []))
        note = (f"{what} chosen per query from noisy histograms (sensitivity 1 each, "
                f"epsilon {eps_h:g} each, {cap_epsilon:g} in all); "
                + ("the choices are noisy, differentially private outputs"
                   if cap is not None else
                   f"sensitivities above are shown at the limit {limit} and the declared "
                   "bounds; the choice is made when the query runs"))
    contribution = ContributionReport(mode, limit, shown, cap_epsilon, note, steps=tuple(steps))
    return dataclasses.replace(report, epsilon=report.epsilon + cap_epsilon,
                               contribution=contribution)
