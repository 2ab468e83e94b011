"""A small thread-safe least-recently-used cache, for what the engine and the kinds of query
compute once per query shape (analyses, plans, rewrites, statement verdicts)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class LRU(Generic[K, V]):
    """A small thread-safe least-recently-used cache."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._items: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        """The value kept under ``key`` (None: none), now the most recently used."""
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        """Keep ``value`` under ``key``, dropping the least recently used beyond the size."""
        with self._lock:
            self._items[key] = value
            if len(self._items) > self._size:
                self._items.popitem(last=False)

    def clear(self) -> None:
        """Forget everything."""
        with self._lock:
            self._items.clear()

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._items

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


class WeightedLRU(Generic[K, V]):
    """A thread-safe least-recently-used cache bounded by the total weight of its values (their
    bytes, say) rather than by their number: for values whose sizes differ by orders of
    magnitude (a few cap bins against a grouped quantile's 10,000 bins per group)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._total = 0
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        """The value kept under ``key`` (None: none), now the most recently used."""
        with self._lock:
            found = self._items.get(key)
            if found is None:
                return None
            self._items.move_to_end(key)
            return found[0]

    def put(self, key: K, value: V, weight: int) -> None:
        """Keep ``value`` of ``weight`` under ``key``, dropping the least recently used until
        the total is within the limit; a value heavier than the limit alone is not kept."""
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._total -= old[1]
            if weight > self._limit:
                return
            self._items[key] = (value, weight)
            self._total += weight
            while self._total > self._limit:
                _, (_, dropped) = self._items.popitem(last=False)
                self._total -= dropped

    @property
    def weight(self) -> int:
        """The total weight kept."""
        with self._lock:
            return self._total

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)
