"""The noisy-answer cache: an identical query over the same blocks gets the same noisy answer.

Re-serving an answer that was already released is post-processing of that release, so it costs
no budget (Dwork and Roth 2014, Proposition 2.1).  Entries belong to one analyst: a hit is
visible (the report says no budget was spent), so a cache shared across analysts would tell one
of them that another just asked the same query, which no noise protects.  The key is the
analyst and everything the answer depends on that they control or can see: the normalised
query, epsilon, delta and the blocks it reads.  Whether the *data* changed is deliberately not
consulted: deciding that from the rows (a count, a checksum) would let an analyst learn, from a
hit or a miss, whether a row changed, which no noise protects.  Entries expire instead after
``ttl_seconds`` (the policy's ``privacy.answer_cache_seconds``), which bounds how stale a
re-served answer can be; new data in new blocks changes the block set and so the key.
``ttl_seconds = 0`` turns the cache off.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any


class AnswerCache:
    """A thread-safe LRU of released answers (or other noisy releases, such as the engine's
    reusable choices) with a time to live, kept apart per analyst."""

    def __init__(self, ttl_seconds: float, size: int = 1024,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = float(ttl_seconds)
        self._size = size
        self._clock = clock
        self._items: OrderedDict[Hashable, tuple[float, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, analyst: str, key: Hashable) -> Any | None:
        """The answer ``analyst`` stored under ``key`` if it has not expired."""
        if self.ttl <= 0:
            return None
        with self._lock:
            hit = self._items.get((analyst, key))
            if hit is None:
                return None
            if self._clock() - hit[0] >= self.ttl:
                del self._items[(analyst, key)]
                return None
            self._items.move_to_end((analyst, key))
            return hit[1]

    def put(self, analyst: str, key: Hashable, answer: Any) -> None:
        """Remember an answer released to ``analyst`` (served again to them only)."""
        if self.ttl <= 0:
            return
        with self._lock:
            self._items[(analyst, key)] = (self._clock(), answer)
            self._items.move_to_end((analyst, key))
            while len(self._items) > self._size:
                self._items.popitem(last=False)
