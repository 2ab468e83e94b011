"""The interface every kind of query implements, and what the engine lends each kind.

A *kind* answers one family of analyst queries: public-only (``public``), one private table
under analytic sensitivity (``single``), a join under elastic sensitivity (``join``), sensitivity
sampling (``sampled``).  Each goes through the same steps, which the engine orchestrates (DESIGN.md
section 3) without knowing how a kind does them:

``prepare``
    pure: plan the noise, rewrite, build the report and the ledger events.  Nothing charged;
    every refusal happens here or before.
``run``
    after the claim: run the rewritten statement(s) through :class:`~chorus_py.statements.
    Statements` (the only way SQL reaches the backend) and finish the answer (proxy noise,
    sampled noise).

A kind may have private choices left to make on the data (a row cap, clipping bounds): its
prepared query then carries a :class:`~chorus_py.kinds.selection.Selection` (its own share of
epsilon), which the engine runs between the claim and ``run``; the selection's ``apply`` gives
the query prepared with the choices.

A new kind is a module here with a class satisfying :class:`QueryKind`; the engine picks it in
``Engine._pick``.  A kind never imports the engine: everything it may use comes in a
:class:`Services` object.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from analyses.outgoing import Release
from budget.accounting import Event
from budget.answers import AnswerCache
from chorus_py.backends import ResultSet
from chorus_py.policy import Policy
from chorus_py.report import ErrorBars, PrivacyReport
from chorus_py.statements import QueryRun, Statements
from chorus_py.stores.attribution import AttributionStore
from chorus_py.stores.frequencies import FrequencyCatalog
from chorus_py.stores.samples import BoundedSamples
from chorus_py.stores.schedules import BlockCatalog


@dataclass(frozen=True)
class Services:
    """What the engine lends every kind: the policy, the statements runner (the only way to the
    backend), the stores, and the per-analyst cache of private choices."""

    policy: Policy
    dialect: str
    schema: str  # the backend's schema of the declared tables: generated SQL names it
    statements: Statements
    blocks: BlockCatalog
    samples: BoundedSamples
    attribution: AttributionStore
    frequencies: FrequencyCatalog
    choices: AnswerCache  # choices of identical earlier queries (privacy.choice_reuse_seconds)
    public_columns: dict[str, dict[str, str]]

    @property
    def release(self) -> Release:
        """How an answer's statement is released: noised in SQL or by the proxy."""
        return "noised_in_sql" if self.policy.privacy.noise == "sql" else "noised_by_proxy"


class ChoiceStep(Protocol):
    """Private choices a prepared query makes on the data after its claim: the analytic kinds'
    :class:`~chorus_py.kinds.selection.Selection`, the quantile kind's
    :class:`~chorus_py.kinds.quantile_selection.QuantileSelection`, or both parts' of a mixed
    query.  ``choose`` runs its noisy histograms (paid for by the claim) and returns the
    choices (with a ``reusable`` flag); ``apply`` gives the query prepared with them; ``key``:
    under which an identical query may reuse them; ``kept``: what of them the engine keeps
    for reuse once the query succeeded."""

    @property
    def key(self) -> tuple[object, ...]: ...

    def kept(self, chosen: Any) -> tuple[tuple[tuple[object, ...], Any], ...]:
        """(key, choices) pairs an identical later query may reuse (none when the choices
        are not reusable: dominated by noise)."""
        ...

    @property
    def apply(self) -> Callable[[Any], Any]: ...

    def choose(self, statements: Statements, run: QueryRun) -> Any:
        """Run the noisy histograms and make the choices."""
        ...


@dataclass(frozen=True)
class Prepared:
    """A query ready for its claim: everything the engine needs, whatever the kind.

    Prepared queries are shared by every analyst who asks the same (cached per shape): the
    report names no analyst until the engine's final report does.

    ``blocks``: the ledger blocks to charge; empty when the query reads no block (its answer is
    a constant of the query: no claim).  ``statements``: what the database plans (EXPLAIN)
    before the claim, so a statement that cannot plan is refused free; ``finish``, likewise,
    the proxy's finishing statement over the noisy values (``kinds.analytic.finish_plan``).
    ``answer_key``: the
    per-analyst key of the answer cache (None: answers of this kind are not kept).
    ``selection``: private choices left to make after the claim (None: none).  ``detail``:
    the kind's own state (its analysed query, noise plan, rewrite).
    """

    report: PrivacyReport
    blocks: tuple[str, ...]
    events: tuple[Event, ...]
    detail: Any
    statements: tuple[str, ...] = ()
    finish: tuple[str, str] | None = None
    answer_key: tuple[object, ...] | None = None
    selection: ChoiceStep | None = None


@dataclass(frozen=True)
class Answer:
    """What a kind's ``run`` gives back: the answer's rows, the error bars of its noisy cells
    (None: the kind has none, e.g. a public query, answered exactly), and warnings for the
    report."""

    result: ResultSet
    error_bars: ErrorBars | None = None
    warnings: tuple[str, ...] = ()  # added to the report's, e.g. why no group was released


class QueryKind(Protocol):
    """One family of queries: how it is prepared and run (see the module docstring).
    ``charges``: False for a kind whose answers are free (public tables only)."""

    charges: bool

    def prepare(self, analysis: Any, analyst: str, epsilon: float, delta: float) -> Prepared:
        """Plan, rewrite, report, ledger events: pure, nothing charged."""
        ...

    def run(self, prepared: Prepared, run: QueryRun) -> Answer:
        """Run the prepared query after its claim, and finish its answer."""
        ...
