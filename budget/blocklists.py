"""Block lists stored once: how a SQL ledger names a claim's list of blocks in its rows.

A claim names its blocks in its row and in the journal rows of its arrival, grant and
settlement: four copies of a list of about 90 ids, 7 KB of the 9 KB a query used to add to the
ledger.  A list of ``LIST_FROM`` blocks or more is stored once, in the ledger's blocklists table,
and those rows name it ``{"$blocks": id}``, id = the first 32 hex digits of the SHA-256 of the
list's JSON text: the same list gets the same id in every process, and a list read back is
checked against its id (a changed or missing row is refused, never misread).  Reading a ledger
gives the lists back (claims, journal, history): only the stored bytes change.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import orjson

from budget.journal import MOVES
from budget.scheduler import InvariantError

__all__ = ["LIST_FROM", "BlockLists", "Fetch", "event_holder", "list_id", "packed_event",
           "unpack"]

REF = "$blocks"
# Lists shorter than this stay in the rows (a reference is about 45 bytes).
LIST_FROM = 4

# fetch(ids) -> the stored (id, JSON text) rows of those lists
Fetch = Callable[[list[str]], Iterable[tuple[str, str]]]


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def list_id(text: str) -> str:
    """The id of a list, from its JSON text."""
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class BlockLists:
    """The block lists a SQL store has seen: their ids, and which are known to be committed.

    Shared by the store's threads: plain dict and set operations, each atomic."""

    def __init__(self) -> None:
        self.ids: dict[tuple[str, ...], str] = {}
        self.lists: dict[str, tuple[str, ...]] = {}
        self.stored: set[str] = set()

    def ref(self, blocks: tuple[str, ...] | list[str], new: dict[str, str]) -> Any:
        """How a row names ``blocks``: the list itself when short, else a reference; a list
        not known to be stored goes into ``new`` (id -> JSON text) for the writer to store."""
        if len(blocks) < LIST_FROM:
            return list(blocks)
        key = tuple(blocks)
        found = self.ids.get(key)
        text = None
        if found is None:
            text = _dumps(list(key))
            found = list_id(text)
            self.ids[key], self.lists[found] = found, key
        if found not in self.stored and found not in new:  # once per transaction
            new[found] = text if text is not None else _dumps(list(key))
        return {REF: found}

    def read(self, rows: Iterable[tuple[str, str]]) -> None:
        """Learn lists read from the blocklists table, each checked against its id."""
        for stored_id, text in rows:
            if list_id(text) != stored_id:
                raise InvariantError(
                    f"block list {stored_id} of the budget ledger does not match its id: the "
                    "ledger was changed outside chorus; nothing was spent")
            key = tuple(orjson.loads(text))
            self.ids[key], self.lists[stored_id] = stored_id, key
            self.stored.add(stored_id)


def event_holder(kind: str, data: dict[str, Any]) -> dict[str, Any] | None:
    """The dict of an event's data whose "blocks" may be a stored list (None: none is)."""
    if kind in MOVES:
        return data
    if kind in ("claim_arrived", "claim_refused"):
        return data.get("claim")
    return None


def packed_event(kind: str, data: dict[str, Any], lists: BlockLists,
                 new: dict[str, str]) -> dict[str, Any]:
    """An event's data as written: its claim's block list named by reference (a copy)."""
    holder = event_holder(kind, data)
    if holder is None or not isinstance(holder.get("blocks"), list | tuple):
        return data
    packed = {**holder, "blocks": lists.ref(holder["blocks"], new)}
    return packed if holder is data else {**data, "claim": packed}


def _ref_of(holder: dict[str, Any] | None) -> str | None:
    blocks = holder.get("blocks") if holder is not None else None
    if isinstance(blocks, dict) and len(blocks) == 1 and isinstance(blocks.get(REF), str):
        return blocks[REF]
    return None


def unpack(holders: Sequence[dict[str, Any] | None], lists: BlockLists, fetch: Fetch) -> None:
    """Replace the list references of ``holders`` (in place) by the lists; ``fetch(ids)``
    returns the (id, JSON text) rows of lists not yet known."""
    refs = [(h, r) for h in holders if (r := _ref_of(h)) is not None]
    unknown = sorted({r for _, r in refs if r not in lists.lists})
    if unknown:
        lists.read(fetch(unknown))
        gone = [r for r in unknown if r not in lists.lists]
        if gone:
            raise InvariantError(
                f"block list(s) {', '.join(gone)} named by the budget ledger are missing: the "
                "ledger was changed outside chorus; nothing was spent")
    for holder, ref in refs:
        assert holder is not None
        holder["blocks"] = list(lists.lists[ref])
