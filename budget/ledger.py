"""The per-block privacy budget ledger: claims, the DPF scheduler, durable storage.

The engine's whole use of it (DESIGN.md section 3, steps 6 and 10)::

    ledger.ensure_blocks(ids)                 # blocks appear on their schedule: fresh budget
    claim = ledger.claim(analyst, ids, epsilon, delta, events=..., wait_seconds=...)
    ...                                       # run the rewritten query
    ledger.consume(claim)                     # before any row is returned
    ledger.release(claim)                     # only when the backend never ran the statement

``claim`` is all or nothing: it returns an *allocated* claim, having taken the demand on every
block, or raises :class:`~chorus_py.errors.BudgetExhausted` having taken nothing.  A claim that does
not fit at once waits (blocking the calling thread) up to its wait time for the scheduler to grant
it; it is refused at once when it never could fit (a block is retired, or has less left than the
demand) or when its wait time is 0.

What a claim costs is decided by the accountant (``budget.accounting``: basic or Rényi) from the
claim's events; when it is granted by the scheduler (``budget.scheduler``: FCFS, DPF-N, DPF-T);
where the state lives by the store (``budget.store``: memory, SQLite, Postgres).  Every change is
one store transaction, serialised across threads and processes, with the block invariant checked
and a journal row appended (:func:`replay` rebuilds every block from the journal alone).

Claims of a process that died are settled when a ledger is next opened on the same machine
(:meth:`Ledger.recover`): a waiting claim is refused (it held nothing), an allocated one is
*consumed*: the query may have read data, so charging it is the safe side.
"""

from __future__ import annotations

import enum
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, NamedTuple

from budget import scheduler as sched
from budget.accounting import Accountant, BasicAccountant, Event, Vec, accountant_for
from budget.journal import replay
from budget.scheduler import (
    BlockState,
    ClaimRecord,
    ClaimState,
    InvariantError,
    SchedulerSettings,
)
from budget.store import (
    BLOCKS_KEY,
    SCHEMA_VERSION,
    ClaimTotals,
    LedgerMismatch,
    MemoryStore,
    PostgresStore,
    SQLiteStore,
    Store,
    Tx,
)
from chorus_py.errors import BudgetExhausted

__all__ = ["BlockBudget", "BlockLeft", "Claim", "InMemoryLedger", "InvariantError", "Ledger",
           "LedgerMismatch", "Viewer", "open_ledger", "replay"]


@dataclass(frozen=True)
class BlockBudget:
    """A snapshot of one block.

    Vectors have one entry (basic accounting) or one per Rényi order; the scalar ``epsilon_*``
    properties read them at ``index`` (for Rényi: the order with the best remaining guarantee).
    """

    block_id: str
    state: str
    accounting: str
    orders: tuple[float, ...]
    epsilon_global: float
    delta_global: float
    global_: Vec
    locked: Vec
    unlocked: Vec
    allocated: Vec
    consumed: Vec
    delta_pool: float
    delta_allocated: float
    delta_consumed: float
    arrivals: int
    epsilon_spent: float
    delta_spent: float
    index: int
    by_analyst: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, *values: Any) -> BlockBudget:
        """``BlockBudget(*values)``, several times faster: a frozen dataclass's ``__init__``
        sets each of its 19 fields through ``object.__setattr__``, and a claim views every
        block it charges (about 90 for a quarter of daily blocks)."""
        view = object.__new__(cls)
        view.__dict__.update(zip(_BUDGET_FIELDS, values, strict=True))
        return view

    @property
    def epsilon_capacity(self) -> float:
        """The budget at ``index`` (epsilon^G for basic accounting)."""
        return self.global_[self.index]

    @property
    def epsilon_locked(self) -> float:
        """Budget not yet unlocked by the scheduler."""
        return self.locked[self.index]

    @property
    def epsilon_unlocked(self) -> float:
        """Budget that claims may be granted now."""
        return self.unlocked[self.index]

    @property
    def epsilon_allocated(self) -> float:
        """Budget granted to claims not yet consumed or released."""
        return self.allocated[self.index]

    @property
    def epsilon_consumed(self) -> float:
        """Budget spent for good."""
        return self.consumed[self.index]

    @property
    def epsilon_remaining(self) -> float:
        """Budget that future claims may still take: locked + unlocked."""
        return self.global_[self.index] - self.allocated[self.index] - self.consumed[self.index]

    @property
    def delta_remaining(self) -> float:
        """Delta that future claims may still take."""
        return self.delta_pool - self.delta_allocated - self.delta_consumed

    @property
    def epsilon_left(self) -> float:
        """epsilon^G minus the epsilon of the guarantee already spent (never negative)."""
        return max(0.0, self.epsilon_global - self.epsilon_spent)

    @property
    def delta_left(self) -> float:
        """delta^G minus the delta of the guarantee already spent (never negative)."""
        return max(0.0, self.delta_global - self.delta_spent)

    def as_dict(self, viewer: Viewer) -> dict[str, Any]:
        """JSON-serialisable view for ``viewer`` (scalars at ``index``; Rényi vectors too).

        The block's totals are the same for everyone; ``by_analyst`` holds every analyst's
        spending for the data owner, and only the viewer's own entry (0.0 when they spent
        nothing on the block) for an analyst: see :class:`Viewer`.
        """
        out: dict[str, Any] = {
            "block": self.block_id,
            "state": self.state,
            "accounting": self.accounting,
            "epsilon_global": self.epsilon_global,
            "delta_global": self.delta_global,
            "epsilon_locked": self.epsilon_locked,
            "epsilon_unlocked": self.epsilon_unlocked,
            "epsilon_allocated": self.epsilon_allocated,
            "epsilon_consumed": self.epsilon_consumed,
            "epsilon_remaining": max(0.0, self.epsilon_remaining),
            "delta_allocated": self.delta_allocated,
            "delta_consumed": self.delta_consumed,
            "delta_remaining": max(0.0, self.delta_remaining),
            "guarantee_spent": {"epsilon": self.epsilon_spent, "delta": self.delta_spent},
            "guarantee_left": {"epsilon": self.epsilon_left, "delta": self.delta_left},
            "by_analyst": viewer.spending(self.by_analyst),
        }
        if self.accounting == "renyi":
            out["alpha"] = self.orders[self.index]
            out["renyi"] = {"orders": list(self.orders), "capacity": list(self.global_),
                            "locked": list(self.locked), "unlocked": list(self.unlocked),
                            "allocated": list(self.allocated), "consumed": list(self.consumed)}
        return out


@dataclass(frozen=True)
class Viewer:
    """Who a view of the ledger is for: the data owner, or one analyst.

    What is public and what is not (issue 18):

    - A block's totals (epsilon^G, what is consumed, allocated, unlocked, locked and left, the
      guarantee spent) are public metadata of the ledger, the same for every analyst: every
      query's report already shows what is left of the blocks it reads, so an analyst can see
      that others spent on a block whatever view the ledger gives.  Hiding the totals would also
      leave analysts unable to plan their queries.  What this reveals, and accepts: a block's
      total minus an analyst's own spending is what all the others spent on it together (with
      one other analyst, that analyst's spending), never who they are or how it splits.
    - Who spent it, and how much each analyst spent, are not: the names of the other analysts
      and their spending tell who works on which data and how hard.  An analyst sees only their
      own spending; the owner sees everyone's.

    Every front door (wire ``SHOW chorus.budget``, REST ``/v1/budget``, the dashboard and
    metrics, the CLI) builds its view of the blocks through :meth:`Ledger.budget_view` or
    :meth:`BlockBudget.as_dict`, which take a ``Viewer`` with no default: a front door cannot
    forget to say whose view it builds.
    """

    #: The analyst the view is for; ``None`` for the data owner.
    analyst: str | None

    @classmethod
    def owner(cls) -> Viewer:
        """The data owner: sees every analyst's spending."""
        return cls(None)

    @classmethod
    def of(cls, analyst: str) -> Viewer:
        """One analyst: sees block totals and their own spending only."""
        if not analyst:
            raise ValueError("an analyst's view needs the analyst's name")
        return cls(analyst)

    @property
    def is_owner(self) -> bool:
        """True for the data owner's view."""
        return self.analyst is None

    def spending(self, by_analyst: Mapping[str, float]) -> dict[str, float]:
        """The part of a per-analyst mapping this viewer may see: all of it for the owner;
        for an analyst, only their own entry, present (0.0) even when they spent nothing, so
        that a view's shape never depends on who else used the block."""
        if self.analyst is None:
            return dict(by_analyst)
        return {self.analyst: by_analyst.get(self.analyst, 0.0)}


class BlockLeft(NamedTuple):
    """The guarantee spent on, and left of, one block: what a query's report shows.

    A light snapshot (a claim charges every block it reads, about 90 for a quarter of daily
    blocks): ``BlockBudget`` holds every field, this only the guarantee.
    """

    block_id: str
    state: str               # "active" or "retired"
    epsilon_left: float      # epsilon^G minus epsilon_spent, never negative
    delta_left: float
    epsilon_spent: float     # everything granted on the block so far is (eps, delta)-DP
    delta_spent: float


@dataclass
class Claim:
    """A claim of budget on a set of blocks, for one analyst's query."""

    claim_id: int
    analyst: str
    blocks: tuple[str, ...]
    epsilon: float
    delta: float
    state: ClaimState = "allocated"
    description: str = field(default="")
    demand: Vec = field(default=(), compare=False)
    delta_demand: float = field(default=0.0, compare=False)
    reason: str = field(default="", compare=False)
    # Set when the claim was consumed in the caller's own transaction: its blocks as that
    # transaction left them (what ``Ledger.remaining`` would show), in the claim's order.
    after: tuple[BlockBudget, ...] = field(default=(), compare=False)
    # The same moment's guarantees only (``Ledger.claim(..., views=False)``).
    left: tuple[BlockLeft, ...] = field(default=(), compare=False)


_BUDGET_FIELDS = tuple(f.name for f in fields(BlockBudget))


def _claim_view(rec: ClaimRecord, after: tuple[BlockBudget, ...] = (),
                left: tuple[BlockLeft, ...] = ()) -> Claim:
    return Claim(rec.claim_id, rec.analyst, rec.blocks, rec.epsilon, rec.delta, rec.state,
                 rec.description, rec.demand, rec.delta_demand, rec.reason, after, left)


def _process_start(pid: int) -> str:
    """The start time of a process (ticks since boot), to tell a reused pid apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return "?"


def _owner() -> str:
    pid = os.getpid()
    return f"{socket.gethostname()}:{pid}:{_process_start(pid)}"


def _owner_alive(owner: str) -> bool | None:
    """True/False for an owner on this machine, None when it lives elsewhere (unknown)."""
    try:
        host, pid_text, start = owner.rsplit(":", 2)
        pid = int(pid_text)
    except ValueError:
        return None
    if host != socket.gethostname():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return start == "?" or _process_start(pid) == start


def _listed(ids: Sequence[str]) -> str:
    return ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")


class Ledger:
    """Per-block budgets, claims and their scheduling (see the module docstring)."""

    def __init__(self, epsilon_per_block: float, delta_per_block: float, *,
                 store: Store | None = None, accountant: Accountant | None = None,
                 scheduler: SchedulerSettings | None = None,
                 clock: Callable[[], float] = time.time, poll_seconds: float = 0.05,
                 on_grant: Callable[[int], None] | None = None,
                 analyst_caps: Mapping[str, float] | None = None) -> None:
        if not (math.isfinite(epsilon_per_block) and epsilon_per_block > 0
                and math.isfinite(delta_per_block) and 0 <= delta_per_block < 1):
            raise ValueError("block budgets must be positive: epsilon > 0, 0 <= delta < 1")
        self.epsilon_per_block = float(epsilon_per_block)
        self.delta_per_block = float(delta_per_block)
        self.store = store or MemoryStore()
        self.accountant = accountant or BasicAccountant()
        self._orders = tuple(getattr(self.accountant, "orders", ()))  # for the block views
        self._basic = self.accountant.name == "basic"
        self.settings = scheduler or SchedulerSettings()
        self.clock = clock
        self.poll_seconds = poll_seconds
        self.on_grant = on_grant  # called with each granted claim id (the simulator listens)
        # Per analyst: the most they may spend on one block (sum of the epsilons they asked).
        self.analyst_caps = dict(analyst_caps or {})
        self.owner = _owner()
        # DPF order keys depend only on a claim's demands and its blocks' global budgets, which
        # change only when the owner raises them: computed once per waiting claim, kept while
        # it waits.  The claims waiting are every process's (a ledger shared by `chorus serve
        # --workers` or several proxies): each pass forgets the keys of claims no longer
        # waiting, whoever granted or refused them.
        self._keys: dict[int, tuple[tuple[float, ...], int]] = {}
        # Fail early on a Rényi ledger that cannot hold anything (delta^G = 0).
        self.accountant.capacity(self.epsilon_per_block, self.delta_per_block)
        # The store's layout (budget.store.SCHEMA_VERSION); older ledgers are upgraded.
        meta = {"accounting": self.accountant.name, "schema": SCHEMA_VERSION}
        if self.accountant.name == "renyi":
            acc: Any = self.accountant
            meta["orders"] = ",".join(f"{a:g}" for a in acc.orders)
            meta["renyi_delta_share"] = f"{acc.delta_share:g}"
        self.store.check_meta(meta)
        self._known: set[str] = set()
        self._changed = threading.Condition()
        # Claims waiting for the next group-commit transaction (``_arrive_batched``).
        self._arrivals: list[_Arrival] = []
        self._arrivals_cv = threading.Condition()
        # Threads that run overlapped claims' transactions (``claim_overlapped``), made on first
        # use: a process that never claims that way starts none.
        self._committers: ThreadPoolExecutor | None = None
        self._committers_lock = threading.Lock()
        if self.store.durable:
            self.recover()

    @property
    def accounting(self) -> str:
        """``basic`` or ``renyi``."""
        return self.accountant.name

    def close(self) -> None:
        """Release the store's connections (after any overlapped commit has finished)."""
        with self._committers_lock:
            committers, self._committers = self._committers, None
        if committers is not None:
            committers.shutdown(wait=True)
        self.store.close()

    # -- blocks -------------------------------------------------------------------------------
    def check_block_schemes(self, schemes: Mapping[str, tuple[str, Callable[[str], bool]]]
                            ) -> None:
        """Record how each table's blocks are cut; refuse a policy that cuts them another way.

        ``schemes``: per table, the cut in words (``chorus_py.policy.block_schemes``) and a test
        of whether a block id is one of its blocks.  Blocks cut two ways would overlap, and the
        same rows would be charged on fresh budget: a changed cut raises ``LedgerMismatch``.  A
        ledger that has not recorded a table's cut yet (made before cuts were recorded) is
        checked block by block: every block it holds of that table must be one the policy's cut
        makes (weeks that began on Thursdays keep working with ``week_start = "thursday"``).
        """
        stored = self.store.meta()
        unrecorded = [t for t in schemes if f"{BLOCKS_KEY}{t}" not in stored]
        if unrecorded:
            held = self._peek(lambda tx: [b.block_id for b in tx.all_blocks()])
            for table in unrecorded:
                text, names = schemes[table]
                foreign = [i for i in held if (i == table or i.startswith(f"{table}/"))
                           and not names(i)]
                if foreign:
                    raise LedgerMismatch(
                        f"the budget ledger holds blocks of table {table} that the policy's "
                        f"cut ('{text}') does not make: {_listed(foreign)}; blocks cut two ways "
                        "overlap, so the same rows would be charged on fresh budget",
                        hint=f"keep tables.{table}.block as the ledger was made with it (for "
                        "weeks that began on Thursdays: week_start = \"thursday\"), or point "
                        "privacy.ledger at a new ledger if the owner means to start every "
                        "budget afresh")
        self.store.check_meta({f"{BLOCKS_KEY}{t}": text for t, (text, _) in schemes.items()})

    def ensure_blocks(self, block_ids: Iterable[str]) -> None:
        """Create blocks seen for the first time, each with a fresh global budget."""
        ids = [b for b in dict.fromkeys(block_ids) if b not in self._known]
        if not ids:
            return
        with self._tx() as tx:
            now = self.clock()
            have = tx.blocks(ids)
            locked = self.settings.policy != "fcfs"
            for block_id in ids:
                if block_id not in have:
                    block = BlockState.new(block_id, now, self.epsilon_per_block,
                                           self.delta_per_block, self.accountant, locked)
                    tx.add_block(block)
                    tx.log("block_created", None, {"block": block.to_dict()}, now)
        self._known.update(ids)

    def raise_budgets(self, epsilon_global: float, delta_global: float) -> list[str]:
        """Raise every block whose global budget is below ``(epsilon_global, delta_global)``
        to it (the policy's ``epsilon_per_block`` / ``delta_per_block`` after the owner raised
        them: blocks keep the budget they were created with otherwise).  The ids raised.

        Budgets only grow: a block above the new value in either epsilon or delta is left as it
        is (lowering it could not take back what was spent).  One transaction, journaled as
        ``block_budget_raised`` per block (and ``block_reopened`` for a retired block that has
        budget again), so ``replay`` rebuilds the raised blocks exactly.
        """
        if not (math.isfinite(epsilon_global) and epsilon_global > 0
                and math.isfinite(delta_global) and 0 <= delta_global < 1):
            raise ValueError("block budgets must be positive: epsilon > 0, 0 <= delta < 1")
        cap, pool = self.accountant.capacity(epsilon_global, delta_global)
        into = "unlocked" if self.settings.policy == "fcfs" else "locked"
        raised: list[str] = []
        with self._tx() as tx:
            now = self.clock()
            for block in tx.all_blocks():
                if block.epsilon_global > epsilon_global or block.delta_global > delta_global \
                        or (block.epsilon_global, block.delta_global) == (epsilon_global,
                                                                          delta_global):
                    continue
                data = {"block": block.block_id, "epsilon_global": epsilon_global,
                        "delta_global": delta_global, "into": into,
                        "added": [max(0.0, c - g) for c, g in zip(cap, block.global_,
                                                                 strict=True)],
                        "pool_added": max(0.0, pool - block.delta_pool)}
                sched.raise_budget(block, epsilon_global, delta_global, data["added"],
                                   data["pool_added"], into)
                tx.save_block(block)
                tx.log("block_budget_raised", None, data, now)
                if block.retired and not sched.exhausted(block):
                    block.retired = False
                    tx.log("block_reopened", None, {"block": block.block_id}, now)
                raised.append(block.block_id)
            if raised:
                self._schedule(tx, now)  # waiting claims may fit now
        self._keys.clear()  # DPF order keys read the blocks' global budgets
        self._notify()
        return raised

    # -- claims -------------------------------------------------------------------------------
    def can_claim(self, blocks: Sequence[str], epsilon: float, delta: float,
                  events: Sequence[Event] | None = None) -> list[str]:
        """Blocks whose unlocked budget the demand does not fit on now (empty: it fits).

        Changes nothing (in particular, asking does not unlock DPF budget).
        """
        rec = self._record("", blocks, epsilon, delta, events, "", None)

        def check(tx: Tx) -> list[str]:
            have = self._load(tx, rec.blocks)
            self._refresh(tx, have, self.clock(), journal=False)
            short = sched.short_blocks(self.accountant, rec, have)
            if not short and sched.fit_order(self.accountant, rec, have) is None:
                short = list(rec.blocks)  # fits each block alone, at no common Rényi order
            return short

        return self._peek(check)

    def claim(self, analyst: str, blocks: Sequence[str], epsilon: float, delta: float,
              description: str = "", *, events: Sequence[Event] | None = None,
              wait_seconds: float | None = None,
              per_block: Mapping[str, Sequence[Event]] | None = None,
              consume_on_grant: bool = False, views: bool | None = True) -> Claim:
        """Allocate the demand on every block, all or nothing, waiting if the scheduler says so.

        Returns an allocated claim or raises ``BudgetExhausted`` (nothing taken).  With
        ``consume_on_grant`` the claim is consumed by the transaction that grants it (it comes
        back *consumed*, with its blocks as that transaction left them: ``after``, with
        ``views=False`` only their guarantees, ``left``, with ``views=None`` neither): one
        durable commit per query instead of two, and ``refund`` gives it back if nothing
        reached the analyst.  Charging before the query runs is never less safe than charging
        after it.
        """
        claim = self.submit(analyst, blocks, epsilon, delta, description, events=events,
                            wait_seconds=wait_seconds, per_block=per_block,
                            consume_on_grant=consume_on_grant, views=views)
        if claim.state in ("allocated", "consumed"):
            return claim
        return self._wait(claim)

    def submit(self, analyst: str, blocks: Sequence[str], epsilon: float, delta: float,
               description: str = "", *, events: Sequence[Event] | None = None,
               wait_seconds: float | None = None,
               per_block: Mapping[str, Sequence[Event]] | None = None,
               consume_on_grant: bool = False, views: bool | None = True) -> Claim:
        """Register a claim and run the scheduler once; never blocks.

        Returns the claim *allocated* or *waiting*; raises ``BudgetExhausted`` when it is refused.
        """
        arrival = self._arrival(analyst, blocks, epsilon, delta, description, events,
                                wait_seconds, per_block, consume_on_grant, views)
        self._arrive_batched(arrival)
        self._notify()
        return self._outcome(arrival)

    def claim_overlapped(self, analyst: str, blocks: Sequence[str], epsilon: float,
                         delta: float, description: str = "", *,
                         events: Sequence[Event] | None = None,
                         wait_seconds: float | None = None, views: bool | None = True,
                         ) -> tuple[Claim, Callable[[], None]]:
        """``claim(..., consume_on_grant=True)`` whose durable commit overlaps the caller's work.

        Returns the claim as soon as its transaction has *decided* it, consumed on grant, in
        the caller's thread, without waiting for the commit (on a durable store an fsync, 1-6
        ms here: as long as a whole DuckDB answer), which the ledger's commit thread finishes
        (``_decide_here``), and ``durable``, which waits for that commit and raises when the
        charge was not recorded (the store failed to commit).  The caller may run the query's
        statements at once but must call ``durable`` before anything of the query leaves the
        process: its answer, an error that may depend on the data, a refund, a choice kept
        for reuse.  So an answer is only ever released on a charge that is on disk, as with
        ``claim``; a process that dies before the commit released nothing (its transaction
        never committed).  A refusal is decided before any statement runs, as with ``claim``;
        a claim that must wait for the scheduler (DPF) waits
        here, for its commit first.  On a store that is not durable, or when other claims of
        this process are queued or committing (under load, where a group commit shares the
        fsync and handing the transaction to another thread would only add CPU, ~0.3 ms a
        query): ``claim``, and a ``durable`` that does nothing.
        """
        arrival = None
        if self.store.durable:
            arrival = self._arrival(analyst, blocks, epsilon, delta, description, events,
                                    wait_seconds, None, True, views)
            with self._arrivals_cv:
                if self._arrivals:
                    arrival = None
                else:
                    # Alone: claims arriving from now on queue behind this one (group commit,
                    # ``_arrive_batched``) until its commit is done.
                    self._arrivals.append(arrival)
        if arrival is None:
            return self.claim(analyst, blocks, epsilon, delta, description, events=events,
                              wait_seconds=wait_seconds, consume_on_grant=True,
                              views=views), _recorded
        commit = self._decide_here(arrival)
        if not arrival.done and not arrival.refused and arrival.rec.state == "consumed":
            claim = self._outcome(arrival)

            def durable() -> None:
                commit.result()  # the transaction's own error, if it failed
                if arrival.refused or arrival.rec.state != "consumed":
                    raise BudgetExhausted(arrival.rec.reason or "the claim was not granted",
                                          hint=_hint(arrival.rec, self.settings))

            return claim, durable
        commit.result()
        claim = self._outcome(arrival)
        if claim.state not in ("allocated", "consumed"):
            claim = self._wait(claim)
        return claim, _recorded

    def _decide_here(self, arrival: _Arrival) -> Future[None]:
        """Decide ``arrival`` (queued alone at the head of ``_arrivals``) in a transaction of
        the calling thread, and hand the transaction's commit to the ledger's commit thread.

        The transaction takes the same locks as any other (this process's, the file's, the
        database's write lock), so the decision is the one a commit thread would have made, on
        the same state; the locks are released by the commit (or the rollback), in the commit
        thread.  Deciding here saves two thread hand-offs on the query's path (the commit
        thread waking to decide, the caller waking to go on): 0.2-0.3 ms on an idle machine,
        more under load.  The returned future raises when the charge was not recorded; the
        arrival is done (and the claims queued behind it go on) once it has finished.
        """
        done: Future[None] = Future()
        try:
            transaction = self._tx()
            tx = transaction.__enter__()
        except BaseException as err:
            arrival.error = err
            self._finish([arrival])
            raise
        try:
            arrival.refused, arrival.after = self._arrive(tx, arrival.rec, arrival.wait,
                                                          arrival.views)
        except BaseException as err:
            try:
                transaction.__exit__(type(err), err, err.__traceback__)  # rolls back
            finally:
                arrival.error = err
                self._finish([arrival])
            raise
        arrival.decided.set()

        def commit() -> None:
            try:
                transaction.__exit__(None, None, None)  # flush, commit, release the locks
                arrival.committed = True
            except BaseException as err:
                arrival.error = err
            finally:
                self._finish([arrival])
                self._notify()
            if arrival.error is not None:
                done.set_exception(arrival.error)
            else:
                done.set_result(None)

        try:
            self._committer().submit(commit)
        except BaseException:  # no thread to hand it to (the interpreter is shutting down)
            commit()
        return done

    def _finish(self, batch: list[_Arrival]) -> None:
        """Mark a transaction's arrivals done, and let the claims queued behind them go on."""
        with self._arrivals_cv:
            del self._arrivals[:len(batch)]
            for a in batch:
                if not a.committed and a.error is None:  # e.g. KeyboardInterrupt
                    a.error = RuntimeError("the ledger transaction was interrupted; "
                                           "nothing was spent")
                a.done = True
                a.decided.set()
            self._arrivals_cv.notify_all()

    def _arrival(self, analyst: str, blocks: Sequence[str], epsilon: float, delta: float,
                 description: str, events: Sequence[Event] | None, wait_seconds: float | None,
                 per_block: Mapping[str, Sequence[Event]] | None, consume_on_grant: bool,
                 views: bool | None) -> _Arrival:
        wait = self.settings.wait_seconds if wait_seconds is None else float(wait_seconds)
        if not (math.isfinite(wait) and wait >= 0):
            raise ValueError(f"wait_seconds must be a finite number >= 0, got {wait_seconds!r}")
        wait = min(wait, self.settings.max_wait_seconds)
        rec = self._record(analyst, blocks, epsilon, delta, events, description, per_block)
        rec.consume_on_grant = consume_on_grant
        return _Arrival(rec, wait, views)

    def _outcome(self, arrival: _Arrival) -> Claim:
        """The claim an arrival decided, as ``submit`` returns it; raises when refused."""
        if arrival.refused:
            raise BudgetExhausted(arrival.rec.reason, hint=_hint(arrival.rec, self.settings))
        if arrival.views:
            return _claim_view(arrival.rec, arrival.after)
        if arrival.views is None:
            return _claim_view(arrival.rec)
        return _claim_view(arrival.rec, left=arrival.after)  # type: ignore[arg-type]

    def _committer(self) -> ThreadPoolExecutor:
        with self._committers_lock:
            if self._committers is None:
                # As many as the threads that may claim at once (a front door's pool): a claim
                # queued here behind a busy thread would miss the group commit it could join.
                self._committers = ThreadPoolExecutor(max_workers=32,
                                                      thread_name_prefix="ledger-commit")
            return self._committers

    def _arrive_batched(self, arrival: _Arrival) -> _Arrival:
        """Run ``arrival`` in a ledger transaction, together with whatever arrived meanwhile.

        Group commit: claims arriving while a transaction runs queue up, and the first of them
        runs them all in the next transaction, in arrival order, with one commit.  Each claim
        is decided exactly as alone (the same steps, on the state its predecessors left), so
        batching changes how often the ledger commits, never what it decides.
        """
        with self._arrivals_cv:
            self._arrivals.append(arrival)
            while not arrival.done and self._arrivals[0] is not arrival:
                self._arrivals_cv.wait()
            batch = [] if arrival.done else list(self._arrivals)
        if batch:
            try:
                self._arrive_all(batch)
            finally:
                self._finish(batch)
        if arrival.error is not None:
            raise arrival.error
        return arrival

    def _arrive_all(self, batch: list[_Arrival]) -> None:
        # Arriving sets only scalar fields of a record (id, state, times, owner, reason, order):
        # a shallow copy keeps what a replay after a rolled-back batch starts from.
        originals = [replace(a.rec) for a in batch] if len(batch) > 1 else []
        try:
            with self._tx() as tx:
                for a in batch:
                    a.refused, a.after = self._arrive(tx, a.rec, a.wait, a.views)
                for a in batch:  # decided; an overlapped claim goes on while this commits
                    a.decided.set()
            for a in batch:
                a.committed = True
        except Exception as err:
            if len(batch) == 1:
                batch[0].error = err
                return
            # The whole transaction rolled back: run each claim alone, so that only the one
            # that fails sees an error.
            self._keys.clear()  # DPF keys of claim ids the rollback gave back
            for a, original in zip(batch, originals, strict=True):
                a.rec = original
                try:
                    with self._tx() as tx:
                        a.refused, a.after = self._arrive(tx, a.rec, a.wait, a.views)
                    a.committed = True
                except Exception as alone:
                    a.error = alone

    def _arrive(self, tx: Tx, rec: ClaimRecord, wait: float,
                views: bool | None = True) -> tuple[bool, tuple[BlockBudget | BlockLeft, ...]]:
        """One claim's arrival inside ``tx``: refused, or registered and scheduled.

        Returns (refused, the blocks after its charge when it was consumed on grant: views,
        only their guarantees, or nothing when ``views`` is None).
        """
        after: tuple[BlockBudget | BlockLeft, ...] = ()
        now = self.clock()
        rec.arrived_at, rec.deadline, rec.owner = now, now + wait, self.owner
        have = self._load(tx, rec.blocks)
        self._refresh(tx, have, now)
        # FCFS leaves the blocks as tested here until the grant below; DPF unlocks budget on
        # arrival or as time passes, and tests again.
        fcfs = self.settings.policy == "fcfs"
        any_retired, ever, fits_now = sched.arrival_fit(self.accountant, rec, have, now=fcfs)
        retired = [b for b in rec.blocks if have[b].retired] if any_retired else []
        never: list[str] = retired
        if not retired and not ever:
            never = sched.short_blocks(self.accountant, rec, have, "unspent") or list(
                rec.blocks)  # each block alone fits, but at no common Rényi order
        over = self._over_cap(rec, have)
        if never or over:
            # Refused on arrival: it could never fit, so it unlocks nothing either.
            what = ("are exhausted (retired)" if retired
                    else "have not enough privacy budget left")
            reason = (f"block(s) {_listed(never)} {what} for "
                      f"{self._asked(rec)}; nothing was spent") if never else (
                f"analyst '{rec.analyst}' would exceed their limit of epsilon "
                f"{self.analyst_caps.get(rec.analyst, 0):g} per block on block(s) "
                f"{_listed(over)} with {self._asked(rec)}; nothing was spent")
            rec.state, rec.reason = "refused", reason
            tx.add_claim(rec)
            tx.log("claim_refused", rec.claim_id, {"claim": _rec_dict(rec)}, now)
            refused = True
        else:
            refused = False
            tx.add_claim(rec)
            tx.log("claim_arrived", rec.claim_id, {"claim": _rec_dict(rec)}, now)
            if self.settings.policy == "dpf-n":
                assert self.settings.n is not None
                moved = {b: sched.unlock_on_arrival(have[b], self.settings.n)
                         for b in rec.blocks}
                for b in rec.blocks:
                    tx.save_block(have[b])
                tx.log("unlock", rec.claim_id, {"blocks": moved, "arrival": True}, now)
            self._schedule(tx, now, arriving=(rec, have, fits_now if fcfs else _Fit.UNTESTED))
            if rec.state == "waiting" and wait <= 0:
                short = sched.short_blocks(self.accountant, rec, have)
                self._refuse(tx, rec, now, (
                    f"not enough privacy budget available on block(s) "
                    f"{_listed(short or list(rec.blocks))} for {self._asked(rec)}; "
                    "nothing was spent"))
                refused = True
            elif rec.state == "consumed" and views is not None:
                view = self._view if views else self._left
                after = tuple(view(have[b]) for b in rec.blocks)
        return refused, after

    def poll(self, claim: Claim) -> Claim:
        """Run the scheduler once and return the claim's current state (never blocks)."""
        with self._tx() as tx:
            self._schedule(tx, self.clock())
            rec = tx.claim(claim.claim_id)
        if rec is None:
            raise KeyError(f"unknown claim {claim.claim_id}")
        claim.state, claim.reason = rec.state, rec.reason
        return claim

    def schedule(self) -> list[int]:
        """Run the scheduler once (time-based unlocking, expiries, grants); granted claim ids."""
        with self._tx() as tx:
            granted = self._schedule(tx, self.clock())
        self._notify()
        return granted

    def consume(self, claim: Claim) -> list[BlockBudget]:
        """Turn an allocated claim into spent budget (before any row is released).

        Returns the claim's blocks as the same transaction left them, in the claim's order:
        what ``remaining`` would show, without a second read of the ledger.
        """
        return self._settle(claim, "consumed")

    def release(self, claim: Claim) -> None:
        """Give an allocated claim back: nothing reached the analyst."""
        self._settle(claim, "released")
        self._notify()

    def refund(self, claim: Claim) -> None:
        """Give back a claim consumed on grant (``consume_on_grant``): nothing reached the
        analyst, e.g. the database refused the query before reading any row.

        consumed -> allocated -> unlocked on every block, journaled as ``claim_refunded``; a
        block that its consumption had retired is reopened if it has budget again.
        """
        with self._tx() as tx:
            rec = tx.claim(claim.claim_id)
            if rec is None:
                raise KeyError(f"unknown claim {claim.claim_id}")
            if rec.state != "consumed" or not rec.consume_on_grant:
                raise ValueError(f"claim {claim.claim_id} is {rec.state}; only a claim "
                                 "consumed on grant can be refunded")
            now = self.clock()
            have = self._load(tx, rec.blocks)
            for b in rec.blocks:
                block = have[b]
                sched.unconsume(block, rec.demand_on(b), rec.delta_demand)
                sched.release(block, rec.demand_on(b), rec.delta_demand, rec.analyst,
                              rec.epsilon)
                tx.save_block(block)
            rec.state = "released"
            tx.save_claim(rec)
            tx.log("claim_refunded", rec.claim_id,
                   _move_data(rec, "consumed", "unlocked", rec.granted_order), now)
            for b in rec.blocks:
                block = have[b]
                if block.retired and not sched.exhausted(block):
                    block.retired = False
                    tx.log("block_reopened", None, {"block": b}, now)
            self._schedule(tx, now)  # the budget given back may let waiting claims in
        claim.state = "released"
        self._notify()

    # -- views --------------------------------------------------------------------------------
    def blocks(self, ids: Iterable[str] | None = None) -> list[BlockBudget]:
        """Snapshots of the blocks (all of them by default), sorted by id."""
        def view(tx: Tx) -> list[BlockBudget]:
            states = (tx.all_blocks() if ids is None
                      else [b for _, b in sorted(tx.blocks(list(ids)).items())])
            self._refresh(tx, {b.block_id: b for b in states}, self.clock())
            return [self._view(b) for b in states]

        if self.settings.policy == "dpf-t":
            # Time-based unlocking due by now is applied and journaled, so what is shown is
            # exactly what the journal replays to.
            with self._tx() as tx:
                return view(tx)
        return self._peek(view)

    def remaining(self, ids: Sequence[str]) -> list[BlockBudget]:
        """Snapshots of ``ids`` in that order; a block not created yet shows a fresh budget."""
        have = {b.block_id: b for b in self.blocks(ids)}
        out = []
        for b in ids:
            if b not in have:
                fresh = BlockState.new(b, self.clock(), self.epsilon_per_block,
                                       self.delta_per_block, self.accountant,
                                       self.settings.policy != "fcfs")
                have[b] = self._view(fresh)
            out.append(have[b])
        return out

    def claims(self, analyst: str | None = None,
               states: Iterable[str] | None = None) -> list[Claim]:
        """Every claim so far, oldest first; when given, only ``analyst``'s and only in
        ``states`` (the filter runs in the store: other claims are not read)."""
        return [_claim_view(r) for r in self.store.claims(analyst, states)]

    def claim_totals(self, analyst: str | None = None) -> list[ClaimTotals]:
        """Per analyst and state: how many claims, and the sums of their epsilon and delta as
        asked (``Claim.epsilon``/``Claim.delta``), sorted by analyst, then state; when given,
        only ``analyst``'s.

        One aggregate in the store (a GROUP BY in SQL): no claim is loaded into Python, so
        views that only count and sum (metrics, the dashboard) stay cheap as the ledger grows.
        Read-only; a SQL store reads a snapshot without taking the ledger's write lock.
        """
        return self.store.claim_totals(analyst)

    def history(self, since: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        """Journal rows (seq, at, event, claim_id, data) after ``since``, oldest first."""
        return self.store.journal(since, limit)

    def budget_view(self, viewer: Viewer,
                    ids: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """Every block the ledger holds (or ``ids``' that exist), as ``viewer`` may see it:
        the one place every front door gets its view of the blocks (see :class:`Viewer`)."""
        return [b.as_dict(viewer) for b in self.blocks(ids)]

    def spending(self, viewer: Viewer) -> dict[str, dict[str, float]]:
        """Per analyst and block, the epsilons they asked for in allocated or consumed claims:
        every analyst's for the owner, only the viewer's own for an analyst."""
        out: dict[str, dict[str, float]] = {}
        for block in self.blocks():
            for analyst, eps in viewer.spending(block.by_analyst).items():
                if eps > 0:
                    out.setdefault(analyst, {})[block.block_id] = eps
        return out

    # -- recovery -----------------------------------------------------------------------------
    def recover(self) -> list[int]:
        """Settle open claims of processes of this machine that ended; return their ids."""
        settled: list[int] = []
        with self._tx() as tx:
            now = self.clock()
            for rec in tx.open_claims():
                if rec.owner == self.owner or _owner_alive(rec.owner) is not False:
                    continue
                if rec.state == "waiting":
                    self._refuse(tx, rec, now, "the process that made the claim ended")
                else:
                    self._apply_settle(tx, rec, "consumed", now, recovered=True)
                settled.append(rec.claim_id)
        return settled

    # -- internals ----------------------------------------------------------------------------
    def _tx(self) -> Any:
        return self.store.transaction(self.accountant.name)

    def _peek(self, read: Callable[[Tx], Any]) -> Any:
        """Run ``read`` in a transaction that is rolled back: it changes nothing."""
        try:
            with self._tx() as tx:
                raise _Rollback(read(tx))
        except _Rollback as done:
            return done.value

    def _record(self, analyst: str, blocks: Sequence[str], epsilon: float, delta: float,
                events: Sequence[Event] | None, description: str,
                per_block: Mapping[str, Sequence[Event]] | None) -> ClaimRecord:
        if not (isinstance(epsilon, int | float) and math.isfinite(epsilon) and epsilon > 0
                and isinstance(delta, int | float) and math.isfinite(delta) and delta >= 0):
            raise ValueError("a claim needs a finite epsilon > 0 and a finite delta >= 0")
        ids = tuple(dict.fromkeys(blocks))  # a block named twice is charged once
        if not ids:
            raise ValueError("a claim needs at least one block")
        evs = list(events) if events else [Event.epsilon_delta(epsilon, delta)]
        demand, delta_demand = self.accountant.demand(evs)
        if self.accounting == "basic":
            # Pessimistic: never charge less than the (epsilon, delta) the report states.
            demand = (max(demand[0], float(epsilon)),)
            delta_demand = max(delta_demand, float(delta))
        per: dict[str, Vec] = {}
        for b, b_events in (per_block or {}).items():
            if b not in ids:
                raise ValueError(f"per-block demand for block {b} the claim does not ask for")
            per[b], d = self.accountant.demand(b_events)
            delta_demand = max(delta_demand, d)
        return ClaimRecord(0, analyst, ids, demand, delta_demand, float(epsilon), float(delta),
                           tuple(e.to_dict() for e in evs), description[:500], per_block=per)

    def _asked(self, rec: ClaimRecord) -> str:
        return f"epsilon={rec.epsilon:g}, delta={rec.delta:g}"

    def _load(self, tx: Tx, ids: Sequence[str]) -> dict[str, BlockState]:
        have = tx.blocks(ids)
        for b in ids:
            if b not in have:
                raise KeyError(f"unknown block {b}")
        return have

    def _refresh(self, tx: Tx, blocks: Mapping[str, BlockState], now: float,
                 journal: bool = True) -> None:
        """DPF-T: unlock what the elapsed ticks allow on these blocks."""
        s = self.settings
        if s.policy != "dpf-t":
            return
        assert s.lifetime_seconds is not None and s.tick_seconds is not None
        moved = {}
        for block in blocks.values():
            if block.retired or not any(x > 0 for x in block.locked):
                continue
            amount = sched.unlock_by_time(block, now, s.lifetime_seconds, s.tick_seconds)
            if any(x > 0 for x in amount):
                moved[block.block_id] = amount
                tx.save_block(block)
        if moved and journal:
            tx.log("unlock", None, {"blocks": moved, "time": True}, now)

    def _schedule(self, tx: Tx, now: float,
                  arriving: tuple[ClaimRecord, dict[str, BlockState], int | _Fit | None]
                  | None = None) -> list[int]:
        """One scheduling pass: expire overdue claims, then grant in policy order.

        ``arriving``: the claim that just arrived, with its blocks as this transaction loaded
        them and the order it fits them at (``fit_order``; ``_Fit.UNTESTED``: not tested on them
        as they are); when it is the only one waiting, neither is looked up again.
        """
        waiting = []
        for rec in tx.waiting():
            if rec.deadline < now:
                self._refuse(tx, rec, now, _timeout_reason(rec, self.accountant, tx))
            else:
                waiting.append(rec)
        if not waiting:
            self._keys.clear()  # claims another process settled leave no key behind
            return []
        known: int | _Fit | None = _Fit.UNTESTED
        if arriving is not None and len(waiting) == 1 and waiting[0] is arriving[0]:
            _, have, known = arriving
        else:
            have = tx.blocks({b for rec in waiting for b in rec.blocks})
        self._refresh(tx, have, now)
        if self.settings.policy == "fcfs":
            order = sorted(waiting, key=lambda r: r.claim_id)
        else:
            keys = self._keys
            ids = {r.claim_id for r in waiting}
            for gone in [c for c in keys if c not in ids]:  # settled by another process
                del keys[gone]
            for r in waiting:
                if r.claim_id not in keys:
                    keys[r.claim_id] = sched.dpf_key(self.accountant, r, have)
            order = sorted(waiting, key=lambda r: keys[r.claim_id])
        granted = []
        for rec in order:
            index = (sched.fit_order(self.accountant, rec, have) if known is _Fit.UNTESTED
                     else known)
            if index is None or self._over_cap(rec, have):
                continue
            # Consumed on grant: each block moves unlocked -> allocated -> consumed in one pass
            # (the same two steps, in the same order, as granting then consuming, so replaying
            # the journal's two events gives exactly these numbers).
            consume = rec.consume_on_grant
            exhausted = None
            if consume and len(rec.demand) == 1 and not rec.per_block:  # basic, the common case
                blocks = [have[b] for b in rec.blocks]
                exhausted = sched.charge_all(blocks, rec.demand[0], rec.delta_demand,
                                             rec.analyst, rec.epsilon)
                tx.changed_in_place(rec.blocks)
            else:
                for b in rec.blocks:
                    block, demand = have[b], rec.demand_on(b)
                    sched.allocate(block, demand, rec.delta_demand, rec.analyst, rec.epsilon)
                    if consume:
                        sched.consume(block, demand, rec.delta_demand)
                    tx.save_block(block)
            rec.state, rec.granted_order = "allocated", index
            tx.save_claim(rec)
            tx.log("claim_granted", rec.claim_id, _move_data(rec, "unlocked", "allocated", index),
                   now)
            if consume:
                self._settled(tx, rec, "consumed", have, now, exhausted=exhausted)
            granted.append(rec.claim_id)
            self._keys.pop(rec.claim_id, None)
            if self.on_grant is not None:
                self.on_grant(rec.claim_id)
        return granted

    def _over_cap(self, rec: ClaimRecord, have: Mapping[str, BlockState]) -> list[str]:
        """Blocks where the claim would take its analyst past their per-block limit."""
        cap = self.analyst_caps.get(rec.analyst)
        if cap is None:
            return []
        return [b for b in rec.blocks
                if have[b].by_analyst.get(rec.analyst, 0.0) + rec.epsilon > cap * (1 + 1e-12)]

    def _refuse(self, tx: Tx, rec: ClaimRecord, now: float, reason: str) -> None:
        self._keys.pop(rec.claim_id, None)
        rec.state, rec.reason = "refused", reason
        tx.save_claim(rec)
        tx.log("claim_refused", rec.claim_id, {"reason": reason}, now)

    def _settle(self, claim: Claim, state: ClaimState) -> list[BlockBudget]:
        with self._tx() as tx:
            rec = tx.claim(claim.claim_id)
            if rec is None:
                raise KeyError(f"unknown claim {claim.claim_id}")
            if rec.state != "allocated":
                raise ValueError(f"claim {claim.claim_id} is already {rec.state}"
                                 if rec.state in ("consumed", "released") else
                                 f"claim {claim.claim_id} is {rec.state}, not allocated")
            now = self.clock()
            have = self._apply_settle(tx, rec, state, now)
            if state == "released":
                self._schedule(tx, now)  # the budget given back may let waiting claims in
            views = [self._view(have[b]) for b in rec.blocks]
        claim.state = state
        return views

    def _apply_settle(self, tx: Tx, rec: ClaimRecord, state: ClaimState, now: float,
                      recovered: bool = False) -> dict[str, BlockState]:
        have = self._load(tx, rec.blocks)
        for b in rec.blocks:
            block = have[b]
            if state == "consumed":
                sched.consume(block, rec.demand_on(b), rec.delta_demand)
            else:
                sched.release(block, rec.demand_on(b), rec.delta_demand, rec.analyst,
                              rec.epsilon)
            tx.save_block(block)
        self._settled(tx, rec, state, have, now, recovered)
        return have

    def _settled(self, tx: Tx, rec: ClaimRecord, state: ClaimState,
                 have: Mapping[str, BlockState], now: float, recovered: bool = False,
                 exhausted: Sequence[BlockState] | None = None) -> None:
        """Record a settlement whose blocks have moved: the claim's state, the journal, and
        the blocks it used up (retired; ``exhausted``: those blocks, when already known)."""
        rec.state = state
        tx.save_claim(rec)
        target = "consumed" if state == "consumed" else "unlocked"
        data = _move_data(rec, "allocated", target, rec.granted_order)
        if recovered:
            data["recovered"] = "the process that held the claim ended; charged, as the data " \
                "may have been read"
        tx.log(f"claim_{state}", rec.claim_id, data, now)
        if state == "consumed":
            if exhausted is None:
                exhausted = [have[b] for b in rec.blocks if sched.exhausted(have[b])]
            for block in exhausted:
                if not block.retired:
                    block.retired = True
                    tx.log("block_retired", None, {"block": block.block_id}, now)

    def _wait(self, claim: Claim) -> Claim:
        # Waits in real time, whatever the ledger's clock; passes use the ledger's clock for
        # deadlines and ticks.
        rec_deadline = time.monotonic() + max(0.0, min(
            self.settings.max_wait_seconds, self._deadline_of(claim) - self.clock()))
        while True:
            left = rec_deadline - time.monotonic()
            if left > 0:
                with self._changed:
                    self._changed.wait(timeout=min(self.poll_seconds, left))
            self.poll(claim)
            if claim.state in ("allocated", "consumed"):
                return claim
            if claim.state == "refused":
                raise BudgetExhausted(claim.reason,
                                      hint="ask for a smaller epsilon, or retry later")
            if time.monotonic() >= rec_deadline:
                with self._tx() as tx:
                    rec = tx.claim(claim.claim_id)
                    assert rec is not None
                    if rec.state == "waiting":
                        self._refuse(tx, rec, self.clock(),
                                     _timeout_reason(rec, self.accountant, tx))
                    claim.state, claim.reason = rec.state, rec.reason
                if claim.state in ("allocated", "consumed"):
                    return claim
                raise BudgetExhausted(claim.reason,
                                      hint="ask for a smaller epsilon, or retry later")

    def _deadline_of(self, claim: Claim) -> float:
        def deadline(tx: Tx) -> float:
            rec = tx.claim(claim.claim_id)
            assert rec is not None
            return rec.deadline

        return self._peek(deadline)

    def _notify(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def _spent(self, b: BlockState) -> tuple[float, float, int]:
        """(epsilon, delta) of the guarantee spent on a block, and the Rényi order index."""
        if self.accountant.name == "basic":  # the common case, without the general path's lists
            return b.allocated[0] + b.consumed[0], b.delta_allocated + b.delta_consumed, 0
        used = tuple(a + c for a, c in zip(b.allocated, b.consumed, strict=True))
        return self.accountant.guarantee(
            used, b.delta_allocated + b.delta_consumed, b.epsilon_global, b.delta_global)

    def _left(self, b: BlockState) -> BlockLeft:
        if self._basic:  # _spent without the call: a query's report shows ~90 blocks
            eps, dlt = b.allocated[0] + b.consumed[0], b.delta_allocated + b.delta_consumed
        else:
            eps, dlt, _ = self._spent(b)
        return BlockLeft(b.block_id, "retired" if b.retired else "active",
                         max(0.0, b.epsilon_global - eps), max(0.0, b.delta_global - dlt),
                         eps, dlt)

    def _view(self, b: BlockState) -> BlockBudget:
        accounting = self.accountant.name
        eps, dlt, index = self._spent(b)
        return BlockBudget.of(
            b.block_id, "retired" if b.retired else "active", accounting,
            self._orders, b.epsilon_global, b.delta_global,
            tuple(b.global_), tuple(b.locked), tuple(b.unlocked), tuple(b.allocated),
            tuple(b.consumed), b.delta_pool, b.delta_allocated, b.delta_consumed, b.arrivals,
            eps, dlt, index, dict(b.by_analyst))


def _timeout_reason(rec: ClaimRecord, accountant: Accountant, tx: Tx) -> str:
    have = tx.blocks(rec.blocks)
    short = sched.short_blocks(accountant, rec, have) or list(rec.blocks)
    waited = max(0.0, rec.deadline - rec.arrived_at)
    return (f"not enough privacy budget was unlocked on block(s) {_listed(short)} for "
            f"epsilon={rec.epsilon:g}, delta={rec.delta:g} within the wait time of "
            f"{waited:g} s; nothing was spent")


def _hint(rec: ClaimRecord, settings: SchedulerSettings) -> str:
    if "retired" in rec.reason or "left for" in rec.reason:
        return "these blocks cannot pay for this query any more: restrict it to other blocks"
    if settings.policy != "fcfs":
        return ("the DPF scheduler unlocks budget gradually: wait longer (wait_seconds), ask "
                "for a smaller epsilon, or retry later")
    return "ask for a smaller epsilon, or restrict the query to other blocks"


def _rec_dict(rec: ClaimRecord) -> dict[str, Any]:
    return {"analyst": rec.analyst, "blocks": list(rec.blocks), "demand": list(rec.demand),
            "delta_demand": rec.delta_demand, "epsilon": rec.epsilon, "delta": rec.delta,
            "events": list(rec.events), "description": rec.description,
            "deadline": rec.deadline, "owner": rec.owner, "state": rec.state,
            "per_block": {k: list(v) for k, v in rec.per_block.items()}}


def _move_data(rec: ClaimRecord, source: str, target: str, index: int | None) -> dict[str, Any]:
    data: dict[str, Any] = {"move": [source, target], "blocks": list(rec.blocks),
                            "amount": list(rec.demand), "delta": rec.delta_demand,
                            "order": index, "analyst": rec.analyst, "epsilon": rec.epsilon}
    if rec.per_block:
        data["per_block"] = {k: list(v) for k, v in rec.per_block.items()}
    return data


class _Fit(enum.Enum):
    """``_schedule``'s "the arriving claim's fit was not tested" (None: it does not fit)."""

    UNTESTED = 0


@dataclass
class _Arrival:
    """A claim queued for a group-commit transaction, and what became of it."""

    rec: ClaimRecord
    wait: float
    views: bool | None = True
    done: bool = False
    committed: bool = False
    refused: bool = False
    after: tuple[BlockBudget | BlockLeft, ...] = ()
    error: BaseException | None = None
    # Set once its transaction has decided it (before the commit), and again when done.
    decided: threading.Event = field(default_factory=threading.Event)


def _recorded() -> None:
    """``durable`` of a claim whose commit had finished when it was returned."""


class _Rollback(Exception):
    """Leaves a transaction without writing anything, carrying the result of a read."""

    def __init__(self, value: Any) -> None:
        super().__init__()
        self.value = value


def InMemoryLedger(epsilon_per_block: float, delta_per_block: float,
                   **kwargs: Any) -> Ledger:
    """A ledger kept in this process only (basic accounting, FCFS unless told otherwise)."""
    return Ledger(epsilon_per_block, delta_per_block, store=MemoryStore(), **kwargs)


def open_ledger(privacy: Any, source: str = "<memory>", analysts: Mapping[str, Any] | None = None,
                **kwargs: Any) -> Ledger:
    """The ledger a policy's ``[privacy]`` section describes.

    ``privacy.ledger``: ``"memory"``, ``"sqlite:///file"`` (relative to the policy file) or
    ``"postgresql://..."``; unset means ``sqlite:///<policy stem>.budget.sqlite3`` next to the
    policy file, or memory for a policy not read from a file.  ``analysts`` (the policy's) gives
    the per-analyst limits (``max_epsilon_per_block``).
    """
    caps = {name: a.max_epsilon_per_block for name, a in (analysts or {}).items()
            if getattr(a, "max_epsilon_per_block", None) is not None}
    url = privacy.ledger
    if url is None:
        url = "memory" if source == "<memory>" else f"sqlite:///{Path(source).stem}.budget.sqlite3"
    store: Store
    if url == "memory":
        store = MemoryStore()
    elif url.startswith("sqlite:///"):
        path = Path(url.removeprefix("sqlite:///"))
        if not path.is_absolute() and source != "<memory>":
            path = Path(source).resolve().parent / path
        store = SQLiteStore(path)
    elif url.startswith(("postgresql://", "postgres://")):
        store = PostgresStore(url)
    else:
        raise ValueError(f"unknown ledger URL {url!r}")
    sch = privacy.scheduler
    settings = SchedulerSettings(
        policy=sch.policy, n=sch.n, lifetime_seconds=sch.lifetime_seconds,
        tick_seconds=sch.tick_seconds, wait_seconds=sch.wait_seconds,
        max_wait_seconds=sch.max_wait_seconds)
    try:
        return Ledger(privacy.epsilon_per_block, privacy.delta_per_block, store=store,
                      accountant=accountant_for(privacy.accounting, privacy.renyi_delta_share),
                      scheduler=settings, analyst_caps=caps, **kwargs)
    except BaseException:
        store.close()
        raise
