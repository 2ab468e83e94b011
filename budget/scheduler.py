"""Private blocks, claims and the schedulers: FCFS, DPF N-based and DPF time-based.

Everything here is pure bookkeeping on in-memory records; the ledger (``budget.ledger``) runs it
inside one store transaction, so it is atomic and serialised across threads and processes.

A **block** holds a budget vector (one entry for basic accounting, one per Rényi order) split in
four fields with the invariant (PrivateKube, section 3.2)::

    global = locked + unlocked + allocated + consumed          (at every order)

plus a delta pool (delta^G for basic accounting, the approximate-delta share for Rényi) split in
``delta_pool = delta_free + delta_allocated + delta_consumed``.  Budget only moves between the
four fields, by these transitions (each one journaled by the ledger):

=============  ======================  ==============================================
transition     move                    when
=============  ======================  ==============================================
``unlock``     locked -> unlocked      DPF-N: a claim arrives; DPF-T: a tick passes
``allocate``   unlocked -> allocated   a claim is granted (all of its blocks at once)
``consume``    allocated -> consumed   before any row of the answer is released
``release``    allocated -> unlocked   nothing reached the analyst
=============  ======================  ==============================================

FCFS blocks are created fully unlocked.  A DPF block is created fully locked; DPF-N unlocks
epsilon^G / N on each block a newly arrived claim asks for (Algorithm 1, OnPipelineArrival), DPF-T
unlocks epsilon^G * tick / lifetime per elapsed tick (Algorithm 2).  Waiting claims are tried in
order of their dominant share max_j d_j / epsilon^G_j, ties broken by the next-largest shares and
then by arrival (never at random); a claim is granted when it fits on every block it asks for,
otherwise the scheduler moves to the next one.

With Rényi accounting a grant subtracts the demand at *every* order, so ``unlocked`` may become
negative at orders where the claim did not fit; the invariant still holds, and at the order the
claim was granted at every claim so far fits: that order witnesses the guarantee.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from budget.accounting import SLACK, Accountant, Vec

ClaimState = Literal["waiting", "allocated", "consumed", "released", "refused"]
Policy = Literal["fcfs", "dpf-n", "dpf-t"]
FIELDS = ("locked", "unlocked", "allocated", "consumed")

# Tolerance of the invariant's sum: float rounding accumulated over millions of moves stays far
# below 1e-9 of the global budget.
_SUM_TOL = 1e-9


class InvariantError(RuntimeError):
    """A block's accounting is inconsistent: a bug, which must stop the ledger, never overspend."""


@dataclass(frozen=True)
class SchedulerSettings:
    """How claims are granted (``privacy.scheduler`` of the policy)."""

    policy: Policy = "fcfs"
    n: int | None = None
    lifetime_seconds: float | None = None
    tick_seconds: float | None = None
    wait_seconds: float = 0.0
    max_wait_seconds: float = 60.0

    def __post_init__(self) -> None:
        if self.policy == "dpf-n" and not (self.n and self.n > 0):
            raise ValueError("scheduler 'dpf-n' needs n > 0")
        if self.policy == "dpf-t" and not (
                self.lifetime_seconds and self.tick_seconds
                and 0 < self.tick_seconds <= self.lifetime_seconds):
            raise ValueError("scheduler 'dpf-t' needs 0 < tick <= lifetime")
        if self.wait_seconds < 0 or self.max_wait_seconds < 0:
            raise ValueError("wait times must be >= 0")


@dataclass
class BlockState:
    """One private block's budget (mutable inside a transaction; see the module docstring)."""

    block_id: str
    created_at: float
    epsilon_global: float
    delta_global: float
    global_: list[float]
    locked: list[float]
    unlocked: list[float]
    allocated: list[float]
    consumed: list[float]
    delta_pool: float
    delta_allocated: float = 0.0
    delta_consumed: float = 0.0
    arrivals: int = 0
    retired: bool = False
    # Per analyst: the epsilons (as asked, basic sum) of their allocated and consumed claims.
    by_analyst: dict[str, float] = field(default_factory=dict)

    @classmethod
    def new(cls, block_id: str, created_at: float, epsilon_global: float, delta_global: float,
            accountant: Accountant, locked: bool) -> BlockState:
        """A fresh block: fully locked (DPF) or fully unlocked (FCFS)."""
        cap, pool = accountant.capacity(epsilon_global, delta_global)
        zero = [0.0] * len(cap)
        return cls(block_id, created_at, epsilon_global, delta_global, list(cap),
                   list(cap) if locked else list(zero), list(zero) if locked else list(cap),
                   list(zero), list(zero), pool)

    def copy(self) -> BlockState:
        """An independent copy."""
        return BlockState(self.block_id, self.created_at, self.epsilon_global, self.delta_global,
                          list(self.global_), list(self.locked), list(self.unlocked),
                          list(self.allocated), list(self.consumed), self.delta_pool,
                          self.delta_allocated, self.delta_consumed, self.arrivals, self.retired,
                          dict(self.by_analyst))

    @property
    def delta_free(self) -> float:
        """Delta that new claims may still take."""
        return self.delta_pool - self.delta_allocated - self.delta_consumed

    def check(self, accounting: str) -> None:
        """Raise :class:`InvariantError` unless the invariant holds (module docstring)."""
        if accounting == "basic":
            check_basic((self,))
            return
        for i, g in enumerate(self.global_):
            parts = [getattr(self, f)[i] for f in FIELDS]
            tol = SLACK * max(1.0, g)
            if abs(g - math.fsum(parts)) > _SUM_TOL * max(1.0, g):
                raise InvariantError(f"block {self.block_id}: global != locked + unlocked + "
                                     f"allocated + consumed at index {i}: {self}")
            if min(self.locked[i], self.allocated[i], self.consumed[i]) < -tol:
                raise InvariantError(f"block {self.block_id}: negative budget field at index "
                                     f"{i}: {self}")
        if any(a + c > 0 for a, c in zip(self.allocated, self.consumed, strict=True)) and not any(
                g > 0 and a + c <= g * (1 + SLACK) for g, a, c in
                zip(self.global_, self.allocated, self.consumed, strict=True)):
            raise InvariantError(f"block {self.block_id}: no Rényi order within budget: {self}")
        self._check_delta()

    def _diagnose_basic(self) -> None:
        """Raise the error that names which basic invariant fails (``check_basic`` found one)."""
        g = self.global_[0]
        lk, u, a, c = self.locked[0], self.unlocked[0], self.allocated[0], self.consumed[0]
        scale = g if g > 1.0 else 1.0
        if abs(g - (lk + u + a + c)) > _SUM_TOL * scale:
            raise InvariantError(f"block {self.block_id}: global != locked + unlocked + "
                                 f"allocated + consumed: {self}")
        if min(lk, u, a, c) < -SLACK * scale:
            raise InvariantError(f"block {self.block_id}: negative budget field: {self}")
        if a + c > g * (1 + SLACK) + SLACK:
            raise InvariantError(f"block {self.block_id} overspent: {self}")
        self._check_delta()
        # Nothing above failed, yet the combined test did: a field is NaN.
        raise InvariantError(f"block {self.block_id}: a budget field is not a number: {self}")

    def _check_delta(self) -> None:
        tol = SLACK * max(self.delta_pool, 1e-300)
        if (self.delta_allocated < -tol or self.delta_consumed < -tol
                or self.delta_allocated + self.delta_consumed > self.delta_pool + tol):
            raise InvariantError(f"block {self.block_id}: delta overspent: {self}")

    def to_dict(self, share: bool = False) -> dict[str, Any]:
        """JSON-serialisable form; a copy unless ``share`` (to serialise it at once)."""
        if share:
            # A dataclass instance's __dict__ holds exactly its fields, in order: serialising
            # it as is saves rebuilding a dict for every block of every claim.
            return self.__dict__
        return {k: _copied(getattr(self, k)) for k in _BLOCK_FIELDS}


_BLOCK_FIELDS = ("block_id", "created_at", "epsilon_global", "delta_global", "global_", "locked",
                 "unlocked", "allocated", "consumed", "delta_pool", "delta_allocated",
                 "delta_consumed", "arrivals", "retired", "by_analyst")


def _copied(value: Any) -> Any:
    return list(value) if isinstance(value, list) else (
        dict(value) if isinstance(value, dict) else value)


@dataclass
class ClaimRecord:
    """A claim as the ledger stores it."""

    claim_id: int
    analyst: str
    blocks: tuple[str, ...]
    demand: Vec                      # the same on every block, unless ``per_block`` says more
    delta_demand: float
    epsilon: float                   # as asked (for reports)
    delta: float
    events: tuple[dict[str, Any], ...] = ()
    description: str = ""
    state: ClaimState = "waiting"
    arrived_at: float = 0.0
    deadline: float = 0.0
    owner: str = ""
    reason: str = ""
    granted_order: int | None = None
    per_block: dict[str, Vec] = field(default_factory=dict)
    # Consumed in the transaction that grants it (one commit per query instead of two); given
    # back with ``Ledger.refund`` when nothing reached the analyst.
    consume_on_grant: bool = False

    def demand_on(self, block_id: str) -> Vec:
        """The demand vector on one block."""
        return self.per_block.get(block_id, self.demand)


def check_blocks(blocks: Sequence[BlockState], accounting: str) -> None:
    """``check`` on every block (a commit checks each block it changed, ~90 per query)."""
    if accounting == "basic":
        check_basic(blocks)
    else:
        for block in blocks:
            block.check(accounting)


def check_basic(blocks: Sequence[BlockState]) -> None:
    """The basic invariant of each block (one order), every condition in one test, in one loop.

    The conditions of the module docstring, negated and combined: the sum is global, every
    field >= 0, allocated + consumed <= global, and the delta pool likewise (each within its
    tolerance); a NaN field fails the combined test too.  When it fails, the block's own
    diagnosis names what is wrong.
    """
    for b in blocks:
        g = b.global_[0]
        lk, u, a, c = b.locked[0], b.unlocked[0], b.allocated[0], b.consumed[0]
        scale = g if g > 1.0 else 1.0
        tol = SLACK * scale
        pool, da, dc = b.delta_pool, b.delta_allocated, b.delta_consumed
        dtol = SLACK * (pool if pool > 1e-300 else 1e-300)
        if not (-_SUM_TOL * scale <= g - (lk + u + a + c) <= _SUM_TOL * scale
                and lk >= -tol and u >= -tol and a >= -tol and c >= -tol
                and a + c <= g * (1 + SLACK) + SLACK
                and da >= -dtol and dc >= -dtol and da + dc <= pool + dtol):
            b._diagnose_basic()


# -- transitions ------------------------------------------------------------------------------
def raise_budget(block: BlockState, epsilon_global: float, delta_global: float,
                 added: Sequence[float], pool_added: float, into: str) -> None:
    """Raise a block's global budget to ``(epsilon_global, delta_global)``: ``added`` (one
    entry per order) joins the global vector and ``into`` ("unlocked" under FCFS, "locked" under
    DPF, which unlocks it on its own schedule), ``pool_added`` the delta pool.  The owner's
    ``chorus budget raise``; the journal's replay applies the same amounts."""
    for i, x in enumerate(added):
        block.global_[i] += x
        getattr(block, into)[i] += x
    block.delta_pool += pool_added
    block.epsilon_global, block.delta_global = epsilon_global, delta_global


def move(block: BlockState, source: str, target: str, amount: Sequence[float]) -> None:
    """Move ``amount`` (one entry per accounting order) of a block's budget from the state
    ``source`` to ``target`` (locked, unlocked, allocated, consumed): the one transition every
    scheduler step and the journal's replay use."""
    src, dst = getattr(block, source), getattr(block, target)
    if len(amount) == 1:  # basic accounting, the common case: a claim moves this per block
        x = amount[0]
        src[0] -= x
        dst[0] += x
        return
    for i, x in enumerate(amount):
        src[i] -= x
        dst[i] += x


def unlock(block: BlockState, amount: Sequence[float]) -> list[float]:
    """Move up to ``amount`` from locked to unlocked; return what moved."""
    moved = [max(0.0, min(a, lk)) for a, lk in zip(amount, block.locked, strict=True)]
    move(block, "locked", "unlocked", moved)
    return moved


def unlock_on_arrival(block: BlockState, n: int) -> list[float]:
    """DPF-N (Algorithm 1, OnPipelineArrival): unlock epsilon^G_j / N, until fully unlocked."""
    block.arrivals += 1
    if block.arrivals >= n:
        # The N-th arrival unlocks whatever is left, so N arrivals always unlock everything
        # (N * (g / N) may fall short of g by a rounding error).
        return unlock(block, list(block.locked))
    return unlock(block, [g / n for g in block.global_])


def unlock_by_time(block: BlockState, now: float, lifetime: float, tick: float) -> list[float]:
    """DPF-T (Algorithm 2): epsilon^G * tick / lifetime per tick elapsed since creation.

    Lazy and idempotent: the budget unlocked so far is brought to
    min(1, ticks * tick / lifetime) * epsilon^G, ticks = floor((now - created) / tick).
    """
    ticks = math.floor(max(0.0, now - block.created_at) / tick)
    fraction = min(1.0, ticks * tick / lifetime)
    if fraction >= 1.0:
        return unlock(block, list(block.locked))
    target = [g * fraction for g in block.global_]
    already = [g - lk for g, lk in zip(block.global_, block.locked, strict=True)]
    return unlock(block, [max(0.0, t - a) for t, a in zip(target, already, strict=True)])


def allocate(block: BlockState, demand: Vec, delta: float, analyst: str = "",
             epsilon: float = 0.0) -> None:
    """Grant: unlocked -> allocated (at every order), delta free -> allocated."""
    move(block, "unlocked", "allocated", demand)
    block.delta_allocated += delta
    if analyst:
        block.by_analyst[analyst] = block.by_analyst.get(analyst, 0.0) + epsilon


def consume(block: BlockState, demand: Vec, delta: float) -> None:
    """allocated -> consumed."""
    move(block, "allocated", "consumed", demand)
    block.delta_allocated -= delta
    block.delta_consumed += delta


def charge_all(blocks: Sequence[BlockState], epsilon_demand: float, delta: float, analyst: str,
               epsilon: float) -> list[BlockState]:
    """Basic accounting (one order): ``allocate`` then ``consume`` on every block, written out;
    returns the blocks this left exhausted (``exhausted``), in order.

    The same float operations in the same order as the two calls (so the journal's
    claim_granted and claim_consumed events replay to exactly this state), without their
    per-call overhead: a query charges every block it reads, about 90 for a quarter of days.
    """
    spent = []
    # Adding and taking away a delta of 0.0 leaves every float as it is: skipped (most queries
    # have delta = 0).
    moves_delta = delta != 0.0
    for block in blocks:
        block.unlocked[0] -= epsilon_demand
        allocated = block.allocated
        allocated[0] += epsilon_demand
        if moves_delta:
            block.delta_allocated += delta
        if analyst:
            by = block.by_analyst
            by[analyst] = by.get(analyst, 0.0) + epsilon
        allocated[0] -= epsilon_demand
        consumed = block.consumed
        consumed[0] += epsilon_demand
        if moves_delta:
            block.delta_allocated -= delta
            block.delta_consumed += delta
        g = block.global_[0]
        if g - consumed[0] <= SLACK * (g if g > 1.0 else 1.0):  # exhausted(), one order
            spent.append(block)
    return spent


def unconsume(block: BlockState, demand: Vec, delta: float) -> None:
    """consumed -> allocated: the first half of a refund (``release`` is the second)."""
    move(block, "consumed", "allocated", demand)
    block.delta_consumed -= delta
    block.delta_allocated += delta


def release(block: BlockState, demand: Vec, delta: float, analyst: str = "",
            epsilon: float = 0.0) -> None:
    """allocated -> unlocked: nothing reached the analyst."""
    move(block, "allocated", "unlocked", demand)
    block.delta_allocated -= delta
    if analyst:
        block.by_analyst[analyst] = max(0.0, block.by_analyst.get(analyst, 0.0) - epsilon)


def exhausted(block: BlockState) -> bool:
    """True when nothing is left to spend at any order (the block is retired)."""
    if len(block.global_) == 1:  # basic accounting: the same test without the generator
        g = block.global_[0]
        return g - block.consumed[0] <= SLACK * max(1.0, g)
    return all(g - c <= SLACK * max(1.0, g) for g, c in
               zip(block.global_, block.consumed, strict=True))


# -- decisions --------------------------------------------------------------------------------
def fit_order(accountant: Accountant, claim: ClaimRecord, blocks: dict[str, BlockState],
              available: str = "unlocked") -> int | None:
    """The order at which ``claim`` fits ``available`` budget on all its blocks, or None.

    ``available`` is ``"unlocked"`` (can it be granted now?) or ``"unspent"`` (global - consumed:
    could it ever be granted?).  Delta must fit the free delta pool on every block too.
    """
    if not accountant.orders:
        # Basic accounting, the common case: the same test as the general path, without lists.
        unlocked = available == "unlocked"
        per, dd, d0 = claim.per_block, claim.delta_demand, claim.demand[0]
        for b in claim.blocks:
            block = blocks[b]
            d = per[b][0] if per and b in per else d0
            g = block.global_[0]
            room = block.unlocked[0] if unlocked else g - block.consumed[0]
            if d > room + SLACK * g:
                return None
            pool = block.delta_pool
            if dd > pool - block.delta_allocated - block.delta_consumed + SLACK * (
                    pool if pool > 1e-300 else 1e-300):
                return None
        return 0
    demands, avail, globals_ = [], [], []
    for b in claim.blocks:
        block = blocks[b]
        if claim.delta_demand > block.delta_free + SLACK * max(block.delta_pool, 1e-300):
            return None
        demands.append(claim.demand_on(b))
        globals_.append(block.global_)
        if available == "unlocked":
            avail.append(block.unlocked)
        else:
            avail.append([g - c for g, c in zip(block.global_, block.consumed, strict=True)])
    return accountant.fitting_order(demands, avail, globals_)


def arrival_fit(accountant: Accountant, claim: ClaimRecord, blocks: dict[str, BlockState],
                now: bool = True) -> tuple[bool, bool, int | None]:
    """What an arriving claim's decision needs: (a block is retired, it fits the unspent budget
    so that it could ever be granted, the order at which it fits the unlocked budget now or
    None).

    The same tests as ``fit_order(..., "unspent")`` and ``fit_order(...)``; with basic
    accounting in one pass over the blocks instead of three (a query reads ~90 blocks).
    ``now=False``: the caller tests the unlocked budget later (it unlocks some first); Rényi
    accounting then skips that test (None), basic accounting gets it in the same pass anyway.
    """
    if accountant.orders:
        return (any(blocks[b].retired for b in claim.blocks),
                fit_order(accountant, claim, blocks, "unspent") is not None,
                fit_order(accountant, claim, blocks) if now else None)
    per, dd, d0 = claim.per_block, claim.delta_demand, claim.demand[0]
    retired, ever, now = False, True, True
    for b in claim.blocks:
        block = blocks[b]
        if block.retired:
            retired = True
        d = per[b][0] if per and b in per else d0
        g = block.global_[0]
        tol = SLACK * g
        if d > g - block.consumed[0] + tol:
            ever = False
        if d > block.unlocked[0] + tol:
            now = False
        pool = block.delta_pool
        if dd > pool - block.delta_allocated - block.delta_consumed + SLACK * (
                pool if pool > 1e-300 else 1e-300):
            ever = now = False
    return retired, ever, 0 if now else None


def short_blocks(accountant: Accountant, claim: ClaimRecord, blocks: dict[str, BlockState],
                 available: str = "unlocked") -> list[str]:
    """The blocks on which the claim does not fit by itself (for error messages)."""
    out = []
    for b in claim.blocks:
        alone = ClaimRecord(claim.claim_id, claim.analyst, (b,), claim.demand_on(b),
                            claim.delta_demand, claim.epsilon, claim.delta)
        if fit_order(accountant, alone, {b: blocks[b]}, available) is None:
            out.append(b)
    return out


def dpf_key(accountant: Accountant, claim: ClaimRecord,
            blocks: dict[str, BlockState]) -> tuple[tuple[float, ...], int]:
    """DPF order: shares sorted from largest down (dominant share first), then arrival.

    Comparing the sorted share tuples lexicographically ranks by dominant share, ties by the
    second-largest share, then the third, ... (PrivateKube section 4.2); a claim on fewer blocks
    has no further shares and ranks first among otherwise equal ones (its missing shares are 0).
    The claim id (arrival order) breaks any remaining tie: never at random.
    """
    shares = sorted((accountant.dominant_share(claim.demand_on(b), blocks[b].global_)
                     for b in claim.blocks), reverse=True)
    return tuple(shares), claim.claim_id
