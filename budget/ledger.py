"""The first per-block budget ledger: in memory, basic composition, all-or-nothing claims.

Each private block holds a global budget (epsilon^G, delta^G).  A claim asks for (epsilon, delta)
on every block a query reads; it is granted only if it fits on *all* of them (basic composition:
epsilons add up, deltas add up), then it is *allocated*.  The engine *consumes* it before any row
reaches the analyst, or *releases* it when nothing did.  Check-then-commit happens under one lock,
so two threads racing for the last budget can never overspend.

The DPF scheduler, Rényi accounting and the durable ledger (DESIGN.md section 7) replace this class
behind the same interface: ``claim`` / ``consume`` / ``release`` / ``blocks``.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from chorus_py.errors import BudgetExhausted

# Floating-point slack when comparing sums of epsilons: 1e-12 relative, never in the analyst's
# favour by more than that.
_SLACK = 1e-12

ClaimState = Literal["allocated", "consumed", "released"]


@dataclass
class BlockBudget:
    """One private block: ``global = unlocked + allocated + consumed`` (nothing locked yet)."""

    block_id: str
    epsilon_global: float
    delta_global: float
    epsilon_allocated: float = 0.0
    epsilon_consumed: float = 0.0
    delta_allocated: float = 0.0
    delta_consumed: float = 0.0

    @property
    def epsilon_remaining(self) -> float:
        """Budget that new claims may still take."""
        return self.epsilon_global - self.epsilon_allocated - self.epsilon_consumed

    @property
    def delta_remaining(self) -> float:
        """Delta that new claims may still take."""
        return self.delta_global - self.delta_allocated - self.delta_consumed

    def check_invariant(self) -> None:
        """Every field non-negative and nothing spent beyond the global budget."""
        values = (self.epsilon_allocated, self.epsilon_consumed, self.delta_allocated,
                  self.delta_consumed)
        if (any(v < -_SLACK for v in values)
                or self.epsilon_remaining < -_SLACK * max(1.0, self.epsilon_global)
                or self.delta_remaining < -_SLACK):
            # Never reachable through claim/consume/release; a bug must stop the proxy, not
            # silently overspend.
            raise RuntimeError(f"budget invariant violated on block {self.block_id}: {self}")

    def as_dict(self) -> dict[str, object]:
        """JSON-serialisable view."""
        return {
            "block": self.block_id,
            "epsilon_global": self.epsilon_global,
            "epsilon_allocated": self.epsilon_allocated,
            "epsilon_consumed": self.epsilon_consumed,
            "epsilon_remaining": max(0.0, self.epsilon_remaining),
            "delta_global": self.delta_global,
            "delta_consumed": self.delta_consumed,
            "delta_remaining": max(0.0, self.delta_remaining),
        }


@dataclass
class Claim:
    """A grant of (epsilon, delta) on a set of blocks, for one analyst's query."""

    claim_id: int
    analyst: str
    blocks: tuple[str, ...]
    epsilon: float
    delta: float
    state: ClaimState = "allocated"
    description: str = field(default="")


class InMemoryLedger:
    """Per-block budgets with basic composition, safe under threads."""

    def __init__(self, epsilon_per_block: float, delta_per_block: float) -> None:
        if epsilon_per_block <= 0 or delta_per_block < 0:
            raise ValueError("block budgets must be positive")
        self.epsilon_per_block = epsilon_per_block
        self.delta_per_block = delta_per_block
        self._blocks: dict[str, BlockBudget] = {}
        self._claims: dict[int, Claim] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def ensure_blocks(self, block_ids: Iterable[str]) -> None:
        """Create blocks seen for the first time, each with a fresh global budget."""
        with self._lock:
            for block_id in block_ids:
                if block_id not in self._blocks:
                    self._blocks[block_id] = BlockBudget(
                        block_id, self.epsilon_per_block, self.delta_per_block)

    def can_claim(self, blocks: Sequence[str], epsilon: float, delta: float) -> list[str]:
        """Names of the blocks the demand does not fit on (empty: it fits). Changes nothing."""
        with self._lock:
            return self._short(blocks, epsilon, delta)

    def claim(self, analyst: str, blocks: Sequence[str], epsilon: float, delta: float,
              description: str = "") -> Claim:
        """Allocate (epsilon, delta) on every block, all or nothing; raise if any lacks budget."""
        if not (math.isfinite(epsilon) and epsilon > 0 and math.isfinite(delta) and delta >= 0):
            raise ValueError("a claim needs a finite epsilon > 0 and a finite delta >= 0")
        blocks = tuple(dict.fromkeys(blocks))  # a block named twice is charged once
        if not blocks:
            raise ValueError("a claim needs at least one block")
        with self._lock:
            short = self._short(blocks, epsilon, delta)
            if short:
                listed = ", ".join(short[:5]) + (f" and {len(short) - 5} more" if len(short) > 5
                                                 else "")
                raise BudgetExhausted(
                    f"not enough privacy budget left on block(s) {listed} for "
                    f"epsilon={epsilon:g}, delta={delta:g}; nothing was spent",
                    hint="ask for a smaller epsilon, or restrict the query to other blocks",
                )
            for block_id in blocks:
                block = self._blocks[block_id]
                block.epsilon_allocated += epsilon
                block.delta_allocated += delta
                block.check_invariant()
            claim = Claim(next(self._ids), analyst, tuple(blocks), epsilon, delta,
                          description=description)
            self._claims[claim.claim_id] = claim
            return claim

    def consume(self, claim: Claim) -> None:
        """Turn an allocated claim into spent budget (before any row is released)."""
        with self._lock:
            self._settle(claim, "consumed")

    def release(self, claim: Claim) -> None:
        """Give an allocated claim back: nothing reached the analyst."""
        with self._lock:
            self._settle(claim, "released")

    def blocks(self) -> list[BlockBudget]:
        """A snapshot of every block, sorted by id."""
        with self._lock:
            return [BlockBudget(**vars(b)) for _, b in sorted(self._blocks.items())]

    def claims(self) -> list[Claim]:
        """Every claim so far, oldest first."""
        with self._lock:
            return list(self._claims.values())

    def _short(self, blocks: Sequence[str], epsilon: float, delta: float) -> list[str]:
        short = []
        for block_id in blocks:
            block = self._blocks.get(block_id)
            if block is None:
                raise KeyError(f"unknown block {block_id}")
            eps_ok = epsilon <= block.epsilon_remaining + _SLACK * block.epsilon_global
            if not eps_ok or delta > block.delta_remaining + _SLACK * block.delta_global:
                short.append(block_id)
        return short

    def _settle(self, claim: Claim, state: ClaimState) -> None:
        if claim.state != "allocated":
            raise ValueError(f"claim {claim.claim_id} is already {claim.state}")
        for block_id in claim.blocks:
            block = self._blocks[block_id]
            block.epsilon_allocated -= claim.epsilon
            block.delta_allocated -= claim.delta
            if state == "consumed":
                block.epsilon_consumed += claim.epsilon
                block.delta_consumed += claim.delta
            block.check_invariant()
        claim.state = state
