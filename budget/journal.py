"""The ledger's journal read back: what each event did to the blocks it names.

Every change to a block is one of these events, written in the transaction that made it, so a
block's state is its creation event followed by every later event that names it.  That makes the
journal an audit trail (:func:`replay` rebuilds every block from it alone, as an auditor would)
and lets the SQL store write block rows only at checkpoints: a block read back is its stored row
(as of the checkpoint) with the journal's events since then applied (:func:`apply`).

Each step is the scheduler's own transition, with the amounts the event recorded, in the order
the ledger made them, so the result is the live state exactly (the same float operations in the
same order), not an approximation of it; tests compare the two for equality.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from budget import scheduler as sched
from budget.scheduler import BlockState

# The events that move budget between fields of the blocks they name (a claim's blocks).
MOVES = ("claim_granted", "claim_consumed", "claim_released", "claim_refunded")


def touched(event: str, data: Mapping[str, Any]) -> tuple[str, ...]:
    """The ids of the blocks an event changes (empty for events that change no block)."""
    if event == "block_created":
        return (data["block"]["block_id"],)
    if event == "unlock":
        return tuple(data["blocks"])
    if event in MOVES:
        return tuple(data["blocks"])
    if event in ("block_retired", "block_reopened", "block_budget_raised"):
        return (data["block"],)
    return ()


def apply(blocks: dict[str, BlockState], event: str, data: Mapping[str, Any],
          only: Collection[str] | None = None) -> None:
    """Apply one journal event to ``blocks`` (in place), on the blocks in ``only`` (all: None).

    A ``block_created`` event (re)sets its block to the recorded initial state; every other
    event needs its blocks present in ``blocks`` (KeyError otherwise: the journal and the
    blocks disagree, which must never be papered over).
    """
    if event == "block_created":
        state = data["block"]
        if only is None or state["block_id"] in only:
            blocks[state["block_id"]] = BlockState(**copy.deepcopy(state))
    elif event == "unlock":
        for b, amount in data["blocks"].items():
            if only is not None and b not in only:
                continue
            block = blocks[b]
            if "arrival" in data:
                block.arrivals += 1
            sched.move(block, "locked", "unlocked", amount)
    elif event in MOVES:
        per = data.get("per_block", {})
        who, eps, delta = data.get("analyst", ""), data.get("epsilon", 0.0), data["delta"]
        for b in data["blocks"]:
            if only is not None and b not in only:
                continue
            amount, block = tuple(per.get(b, data["amount"])), blocks[b]
            if event == "claim_granted":
                sched.allocate(block, amount, delta, who, eps)
            elif event == "claim_consumed":
                sched.consume(block, amount, delta)
            elif event == "claim_released":
                sched.release(block, amount, delta, who, eps)
            else:  # claim_refunded: consumed -> allocated -> unlocked
                sched.unconsume(block, amount, delta)
                sched.release(block, amount, delta, who, eps)
    elif event == "block_budget_raised" and (only is None or data["block"] in only):
        sched.raise_budget(blocks[data["block"]], data["epsilon_global"], data["delta_global"],
                           data["added"], data["pool_added"], data["into"])
    elif event in ("block_retired", "block_reopened") and (only is None
                                                          or data["block"] in only):
        blocks[data["block"]].retired = event == "block_retired"


def replay(journal: Iterable[Mapping[str, Any]]) -> dict[str, BlockState]:
    """Rebuild every block's state from the journal alone (what an auditor does)."""
    blocks: dict[str, BlockState] = {}
    for row in journal:
        apply(blocks, row["event"], row["data"])
    return blocks
