"""Quantiles (MEDIAN, percentiles, MIN, MAX) next to COUNT/SUM/AVG-like aggregates in one query.

``SELECT city, MEDIAN(fare), COUNT(*) FROM trips GROUP BY city`` is split by
``analyses.mixed`` into a quantile part (``kinds.quantile``: the exponential mechanism) and an
analytic part (``kinds.single``: Laplace-like noise), the same FROM, WHERE and GROUP BY each.

Budget: one claim of the query's whole (epsilon, delta) on its blocks, whose events are both
parts' events.  By sequential (basic) composition the two parts, each (eps_i, delta_i)-DP on
the whole data, are together (eps_q + eps_a, delta_q + delta_a)-DP; the split is

    eps_q = epsilon * n_q / (n_q + n_a),   eps_a = epsilon - eps_q,
    delta_q = 0,                            delta_a = delta

with n_q the quantiles asked and n_a the noisy measurements of the analytic part (AVG counts
two: a sum and a count), so every measurement gets the same epsilon / (n_q + n_a), as in a
query of either kind alone.  The quantile part is pure epsilon-DP: all of delta goes to the
analytic part.  Each part may spend its own share choosing its row cap first, as it does
alone (contribution = "auto"): the quantile part for its rank error
(``kinds.quantile_selection``), the analytic part for its noise, with its clipping bounds
(``kinds.selection``); the two caps may differ, each bounding only its own part's rows, and each
part's sensitivities are at its own cap.  Over a join neither part chooses: the quantile part's
S is a public constant (``analyses.quantile_joins``), the join kind bounds its rows itself.

Run, after the claim: the quantile part, then the analytic part, through the same
:class:`~chorus_py.statements.QueryRun`: once the first read the data, a failure of the second
refunds nothing.  The parts' rows are matched on the group keys (every declared value or
calendar bucket: the same public grid in both) into one row of released values per group
(k<i>, q<i>, a<j>); the finish (``analyses.mixed``) computes the outputs, HAVING, ORDER BY and
LIMIT over them in the proxy's scratch DuckDB: post-processing of noisy values, free.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sqlglot import exp

from analyses.mixed import ROW, MixedSplit, asks_mixed, split_mixed
from analyses.per_person import PerPersonQuery
from analyses.quantiles import QuantileQuery
from analyses.query import AggregateQuery, PublicQuery
from chorus_py.backends import ResultSet
from chorus_py.caches import LRU
from chorus_py.errors import InternalError, NotSupportedError
from chorus_py.kinds.base import Answer, ChoiceStep, Prepared, Services
from chorus_py.kinds.finish import Column, finish_rows, noisy_table
from chorus_py.kinds.join import JoinKind
from chorus_py.kinds.quantile import QuantileKind, key_columns
from chorus_py.kinds.single import SingleTableKind
from chorus_py.report import ColumnReport, ContributionReport, PrivacyReport
from chorus_py.statements import QueryRun, Statements
from mechanisms.intervals import Interval, NoInterval


@dataclass(frozen=True)
class MixedQuery:
    """The analysed mixed query: its split and each part's analysis."""

    split: MixedSplit
    quantile: QuantileQuery
    analytic: AggregateQuery


@dataclass(frozen=True)
class EpsilonSplit:
    """How a mixed query's (epsilon, delta) is split between its parts (module docstring)."""

    quantiles: int      # n_q
    measurements: int   # n_a
    quantile_epsilon: float
    analytic_epsilon: float
    analytic_delta: float

    @classmethod
    def of(cls, query: MixedQuery, epsilon: float, delta: float) -> EpsilonSplit:
        """In proportion to the number of measurements of each part; all of delta to the
        analytic part (the exponential mechanism is pure epsilon-DP)."""
        n_q = len(query.quantile.quantiles)
        n_a = len(query.analytic.measurements)
        eps_q = epsilon * n_q / (n_q + n_a)
        return cls(n_q, n_a, eps_q, epsilon - eps_q, delta)

    def describe(self, epsilon: float, delta: float) -> str:
        """The split as the report states it (``delta``: what the analytic part charges, 0
        when its keys are public)."""
        n = self.quantiles + self.measurements
        return (f"epsilon {epsilon:g} split in proportion to the measurements of each part "
                f"(sequential composition, one claim): {self.quantiles} quantile(s) get "
                f"{self.quantiles}/{n} = {self.quantile_epsilon:g} (exponential mechanism, "
                f"delta 0), {self.measurements} noisy measurement(s) of COUNT/SUM/AVG-like "
                f"aggregates get {self.measurements}/{n} = {self.analytic_epsilon:g} and "
                f"delta {delta:g}")


@dataclass(frozen=True)
class PartChoices:
    """The choices of both parts of a mixed query (None: that part had none to make)."""

    quantile: Any
    analytic: Any


def part_key(part: str, key: tuple[object, ...]) -> tuple[object, ...]:
    """Under which a mixed query's ``part`` ("quantile" or "analytic") keeps its choices:
    the part's own key (the part's SQL shape, its share of epsilon, delta, blocks) tagged as a
    mixed query's part, so that they are reused only by the same part of a mixed query (the
    same analyst's: ``budget.answers``), never by a query of one kind."""
    return ("mixed", part, key)


@dataclass(frozen=True)
class PartSelections:
    """Both parts' choices, made one after the other between the claim and the answer: the
    quantile part's row cap (``kinds.quantile_selection``), then the analytic part's cap and
    bounds (``kinds.selection``).  Each is paid for by its part's own share, inside the one
    claim.  Each part's choices are kept apart (``kept``): a later mixed query of the same
    analyst with the same part (an identical query, say) reuses them when they may be reused,
    and a part without reusable choices chooses afresh (``MixedKind.prepare``)."""

    quantile: ChoiceStep | None
    analytic: ChoiceStep | None
    apply: Callable[[PartChoices], Prepared]

    @property
    def key(self) -> tuple[object, ...]:
        """Both parts' keys."""
        return ("mixed", *(None if s is None else s.key for s in (self.quantile,
                                                                   self.analytic)))

    def kept(self, chosen: PartChoices) -> tuple[tuple[tuple[object, ...], Any], ...]:
        """Each part's choices under :func:`part_key` when they may be reused: a part whose
        histograms were dominated by noise does not stop the other's reuse."""
        return tuple((part_key(part, key), choices)
                     for part, step, choices in (("quantile", self.quantile, chosen.quantile),
                                                 ("analytic", self.analytic, chosen.analytic))
                     if step is not None
                     for key, choices in step.kept(choices))

    def choose(self, statements: Statements, run: QueryRun) -> PartChoices:
        """The quantile part's choices, then the analytic part's."""
        return PartChoices(
            None if self.quantile is None else self.quantile.choose(statements, run),
            None if self.analytic is None else self.analytic.choose(statements, run))


@dataclass(frozen=True)
class MixedDetail:
    """The kind's state of a prepared mixed query (``Prepared.detail``); ``columns``: the
    finish's scratch columns of released values."""

    query: MixedQuery
    split: EpsilonSplit
    quantile: Prepared
    analytic: Prepared
    columns: tuple[Column, ...]


class MixedKind:
    """Quantiles and COUNT/SUM/AVG-like aggregates of one private table, or of a join whose
    rows per person are publicly bounded (``analyses.quantile_joins``), in one query; the
    analytic part of a join is answered by the join kind (smooth elastic sensitivity)."""

    charges = True

    def __init__(self, services: Services, quantile: QuantileKind, single: SingleTableKind,
                 join: JoinKind,
                 analyse: Callable[[str], AggregateQuery | PublicQuery | PerPersonQuery]
                 ) -> None:
        self.services = services
        self._quantile, self._single, self._join = quantile, single, join
        self._analyse = analyse
        self._analyses: LRU[str, MixedQuery] = LRU(1024)

    def accepts(self, sql: str) -> bool:
        """Whether ``sql`` asks a quantile, MIN or MAX next to another aggregate."""
        return asks_mixed(sql, self.services.dialect)

    def analyse(self, sql: str) -> MixedQuery:
        """Split ``sql`` and analyse each part (cached; refusals cost nothing)."""
        found = self._analyses.get(sql)
        if found is not None:
            return found
        split = split_mixed(sql, self.services.dialect)
        quantile = self._quantile.analyse(split.quantile_sql)
        analytic = self._analyse(split.analytic_sql)
        if isinstance(analytic, AggregateQuery) and analytic.thresholded:
            # Each part would release its own keys by its own threshold (two gates, two
            # deltas, different groups): not merged soundly here yet.
            raise NotSupportedError(
                "quantiles next to other aggregates grouped by a column without public_values "
                "are not supported",
                hint="ask the quantiles and the other aggregates in separate queries (each "
                "releases its groups by a noisy threshold)")
        if not isinstance(analytic, AggregateQuery):
            # A per-person aggregate next to a quantile of rows is a different question.
            raise NotSupportedError(
                "quantiles next to aggregates of per-person values are not supported",
                hint="ask the quantiles and the other aggregates in separate queries")
        found = MixedQuery(split, quantile, analytic)
        self._analyses.put(sql, found)
        return found

    def prepare(self, query: MixedQuery, analyst: str, epsilon: float,
                delta: float) -> Prepared:
        """Both parts prepared at their shares (pure, nothing charged) and joined into one
        prepared query: one claim, both parts' events and statements."""
        split = EpsilonSplit.of(query, epsilon, delta)
        quantile = self._quantile.prepare(query.quantile, analyst, split.quantile_epsilon, 0.0)
        kind = self._join if query.analytic.join is not None else self._single
        analytic = kind.prepare(query.analytic, analyst, split.analytic_epsilon,
                                split.analytic_delta)
        # Each part's choices of an earlier mixed query with this same part (the same part
        # SQL, share of epsilon, delta and blocks: the part's key), paid for by it and
        # reusable (not dominated by noise; ``privacy.choice_reuse_seconds``): DP outputs
        # released to this analyst's own query, so reusing them is post-processing.  The part
        # is then prepared as its own identical query would be with them: none of its share
        # goes to choosing (the report's "reused" step), all of it to its measurements, so
        # the parts still add up to epsilon.  Per analyst, as every reuse (budget.answers).
        choices = self.services.choices
        if quantile.selection is not None:
            earlier = choices.get(analyst, part_key("quantile", quantile.selection.key))
            if earlier is not None:
                quantile = self._quantile.prepare(query.quantile, analyst,
                                                  split.quantile_epsilon, 0.0, earlier)
        if analytic.selection is not None and kind is self._single:
            earlier = choices.get(analyst, part_key("analytic", analytic.selection.key))
            if earlier is not None:
                analytic = self._single.prepare(query.analytic, analyst,
                                                split.analytic_epsilon, split.analytic_delta,
                                                earlier)
        if quantile.finish is not None:  # the engine plans one finish: the others here
            self.services.statements.check_scratch_plan(*quantile.finish)
        columns = _columns(query, quantile)
        self.services.statements.check_scratch_plan(noisy_table(columns), query.split.finish)
        return self._combine(query, split, quantile, analytic, epsilon, columns)

    def _combine(self, query: MixedQuery, split: EpsilonSplit, quantile: Prepared,
                 analytic: Prepared, epsilon: float, columns: tuple[Column, ...]
                 ) -> Prepared:
        if quantile.blocks != analytic.blocks:  # the same WHERE: the same blocks
            raise InternalError("the parts of a query that mixes quantiles with other "
                                "aggregates read different blocks; nothing was charged",
                                hint="this is a bug in the proxy: please report the query")
        report = _report(query, split, quantile.report, analytic.report, epsilon)
        q_step, a_step = quantile.selection, analytic.selection
        selection = None
        if q_step is not None or a_step is not None:
            # Each part's cap (and bounds) chosen after the one claim, from its own share of its
            # part's epsilon (kinds.quantile, kinds.single): the claim holds both shares.  A
            # join's parts choose nothing (S public, the join kind's smooth elastic bound).
            selection = PartSelections(q_step, a_step, lambda chosen: self._combine(
                query, split,
                quantile if q_step is None else q_step.apply(chosen.quantile),
                analytic if a_step is None else a_step.apply(chosen.analytic), epsilon, columns))
        return Prepared(
            report, analytic.blocks, (*quantile.events, *analytic.events),
            MixedDetail(query, split, quantile, analytic, columns),
            statements=(*quantile.statements, *analytic.statements), finish=analytic.finish,
            answer_key=("mixed", query.split.sql, epsilon, report.delta, report.blocks),
            selection=selection)

    def run(self, prepared: Prepared, run: QueryRun) -> Answer:
        """The quantile part, then the analytic part (one charge: no refund once the first
        read the data), merged in the analyst's column order."""
        detail: MixedDetail = prepared.detail
        quantiles = self._quantile.run(detail.quantile, run)
        kind = self._join if detail.query.analytic.join is not None else self._single
        analytic = kind.run(detail.analytic, run)
        return _merge(detail, quantiles, analytic, self.services.statements.scratch)


def _columns(query: MixedQuery, quantile: Prepared) -> tuple[Column, ...]:
    """The finish's columns: the keys typed as the quantile part types them, each quantile a
    DOUBLE, each other aggregate a BIGINT (a count) or a DOUBLE, the merged row's index."""
    split = query.split
    keys = key_columns(quantile.detail.analysis.query, quantile.detail.key_types)
    return (*keys, *((f"q{i}", "DOUBLE") for i in range(len(split.quantiles))),
            *((f"a{j}", "BIGINT" if count else "DOUBLE") for j, count in enumerate(split.counts)),
            (ROW, "BIGINT"))


def _report(query: MixedQuery, split: EpsilonSplit, quantile: PrivacyReport,
            analytic: PrivacyReport, epsilon: float) -> PrivacyReport:
    """One report: both parts' measurements, the columns in the analyst's order, the split."""
    s = query.split
    columns = []
    for name, source, text, output in zip(s.names, s.sources, s.texts, s.outputs,
                                          strict=True):
        if source is not None:
            part, index = (quantile, int(source[1:])) if source[0] in "kq" else \
                (analytic, int(source[1:]))
            at = index if source[0] == "k" else s.keys + index
            columns.append(dataclasses.replace(part.columns[at], name=name))
            continue
        used = _used(output)
        measurements = tuple(m for c in used for m in (
            quantile.columns[s.keys + int(c[1:])] if c[0] == "q"
            else analytic.columns[s.keys + int(c[1:])]).measurements)
        columns.append(ColumnReport(
            name, "derived" if measurements else "constant", text,
            tuple(dict.fromkeys(measurements)),
            note="post-processing of the noisy values of " + ", ".join(
                (s.quantiles[int(c[1:])] if c[0] == "q" else s.analytic[int(c[1:])])
                for c in used if c[0] in "qa") if measurements else ""))
    total = quantile.epsilon + analytic.epsilon
    assert abs(total - epsilon) <= 1e-9 * epsilon, (total, epsilon)
    notes = (split.describe(epsilon, analytic.delta),
             *(f"quantiles: {n}" for n in quantile.notes),
             *(f"aggregates: {n}" for n in analytic.notes),
             "outputs, HAVING, ORDER BY and LIMIT: computed by the proxy over the noisy values "
             "(post-processing); an aggregate named only in HAVING or ORDER BY is measured with "
             "noise like the others")
    return dataclasses.replace(
        analytic, epsilon=epsilon, delta=quantile.delta + analytic.delta,
        measurements=(*quantile.measurements, *analytic.measurements), columns=tuple(columns),
        rewritten_sql=f"{quantile.rewritten_sql}\n{analytic.rewritten_sql}", notes=notes,
        warnings=(*quantile.warnings, *analytic.warnings),
        contribution=_contribution(quantile.contribution, analytic.contribution))


def _contribution(quantile: ContributionReport | None, analytic: ContributionReport | None
                  ) -> ContributionReport | None:
    """Both parts' selection steps in one report, each step's target naming its part, and
    their epsilons added (each part pays its own, inside the one claim).  ``cap``: the
    aggregates' (the quantiles' own is in its step and the note)."""
    if quantile is None or analytic is None:
        return analytic if quantile is None else quantile
    steps = (
        *(dataclasses.replace(s, target=f"quantiles: {s.target}") for s in quantile.steps),
        *(dataclasses.replace(s, target=f"aggregates: {s.target}") for s in analytic.steps))
    return dataclasses.replace(
        analytic, epsilon=quantile.epsilon + analytic.epsilon, steps=steps,
        note=f"quantiles: cap {quantile.cap}; {quantile.note} | aggregates: cap "
        f"{analytic.cap}; {analytic.note}")


def _used(node: exp.Expr) -> tuple[str, ...]:
    """The scratch columns an output reads (q<i>, a<j>, k<i>), in order, once each."""
    return tuple(dict.fromkeys(c.name for c in node.find_all(exp.Column)))


def _match(value: Any) -> Any:
    """A group key's value as both parts' rows compare it: a backend's date, Decimal or int
    and the declared value it stands for compare equal."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float | Decimal):
        return float(value)
    if isinstance(value, datetime.datetime):
        return value.replace(tzinfo=None)
    if isinstance(value, datetime.date):
        return datetime.datetime(value.year, value.month, value.day)
    return value


def _merge(detail: MixedDetail, quantiles: Answer, analytic: Answer,
           scratch: Callable[[], Any]) -> Answer:
    """The parts' rows matched on their keys (the quantile part lists every public group) into
    rows of released values, then the finish over them (``analyses.mixed``)."""
    split = detail.query.split
    q_rows, a_rows = quantiles.result.rows, analytic.result.rows
    n_keys, n_q, n_a = split.keys, len(split.quantiles), len(split.analytic)
    by_key = {tuple(_match(v) for v in row[:n_keys]): i for i, row in enumerate(a_rows)}
    pairs: list[tuple[int | None, int | None]] = []
    for i, row in enumerate(q_rows):
        pairs.append((i, by_key.pop(tuple(_match(v) for v in row[:n_keys]), None)))
    pairs += [(None, j) for j in sorted(by_key.values())]
    rows = []
    for r, (q, a) in enumerate(pairs):
        keys = q_rows[q][:n_keys] if q is not None else a_rows[a][:n_keys]  # type: ignore[index]
        rows.append((*keys,
                     *(q_rows[q][n_keys:] if q is not None else (None,) * n_q),
                     *(a_rows[a][n_keys:] if a is not None else (None,) * n_a), r))
    finished = finish_rows(scratch, detail.columns, split.finish, rows)
    result = ResultSet(finished.columns[:-1], finished.types[:-1],
                       [row[:-1] for row in finished.rows])
    bars = _MergedBars(split, quantiles, analytic,
                       [pairs[row[-1]] for row in finished.rows])
    return Answer(result, bars, (*quantiles.warnings, *analytic.warnings))


class _MergedBars:
    """Error bars of a merged answer: an output that is one part's value has that part's bar;
    an expression of several has none (its distribution is not computed here)."""

    def __init__(self, split: MixedSplit, quantiles: Answer, analytic: Answer,
                 pairs: list[tuple[int | None, int | None]]) -> None:
        self.split, self.quantiles, self.analytic = split, quantiles, analytic
        self.pairs = pairs

    def intervals(self) -> tuple[tuple[Interval | NoInterval | None, ...], ...]:
        """Per row, per column: the interval of the part's cell, None for a key."""
        q_bars = self.quantiles.error_bars.intervals() if self.quantiles.error_bars else ()
        a_bars = self.analytic.error_bars.intervals() if self.analytic.error_bars else ()
        n_keys = self.split.keys
        out = []
        for q, a in self.pairs:
            row: list[Interval | NoInterval | None] = []
            for source in self.split.sources:
                if source is None:
                    row.append(NoInterval("computed from several noisy values: no interval"))
                    continue
                bars, at = (q_bars, q) if source[0] == "q" else (a_bars, a)
                if source[0] == "k" or at is None or at >= len(bars):
                    row.append(None)
                    continue
                row.append(bars[at][n_keys + int(source[1:])])
            out.append(tuple(row))
        return tuple(out)
