"""Metadata the engine reads from the database and caches: which block windows exist.

Block windows are the days (hours, weeks) between the first and the last value of a table's
block column, aligned to the Unix epoch (UTC; a ``timestamp`` without time zone is read as UTC).
As in PrivateKube, the set of blocks is public metadata: it says when data exists, not what it is.
It is re-read after ``ttl_seconds`` so new data gets new blocks with fresh budget.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import cached_property
from typing import Any

from chorus_py.backends import Backend
from chorus_py.policy import BlockConfig

_EPOCH = datetime(1970, 1, 1)


@dataclass(frozen=True)
class BlockWindows:
    """Consecutive windows [start + i * width, start + (i + 1) * width) for i < count.

    Time windows (datetime start, timedelta width), or ranges of privacy-unit ids (int start and
    width, User DP; ``column`` names the unit).
    """

    table: str
    start: Any
    width: Any
    count: int
    column: str = ""

    @property
    def end(self) -> datetime:
        """End of the last window."""
        return self.start + self.width * self.count

    def ids(self) -> tuple[str, ...]:
        """Block ids such as ``trips/2026-01-01`` (time shown when windows are sub-day), or
        ``trips/rider_id:0-9999`` for id ranges."""
        return self._ids

    @cached_property
    def _ids(self) -> tuple[str, ...]:
        # Computed once per windows object (cached per table for the catalog's TTL): every
        # query over the table asks for them (about 90 date labels for a quarter of days).
        if isinstance(self.width, int):
            return tuple(f"{self.table}/{self.column}:{lo}-{lo + self.width - 1}"
                         for lo in range(self.start, self.start + self.width * self.count,
                                         self.width))
        daily = self.width % timedelta(days=1) == timedelta(0)
        out = []
        for i in range(self.count):
            start = self.start + self.width * i
            label = start.date().isoformat() if daily else start.isoformat(timespec="minutes")
            out.append(f"{self.table}/{label}")
        return tuple(out)


class BlockCatalog:
    """Caches the block windows of each table (thread-safe)."""

    def __init__(self, backend: Backend, ttl_seconds: float = 60.0) -> None:
        self._backend = backend
        self._ttl = ttl_seconds
        self._cache: dict[str, tuple[float, BlockWindows]] = {}
        self._lock = threading.Lock()

    def windows(self, table: str, block: BlockConfig) -> BlockWindows:
        """The windows of ``table``, read from the database at most once per TTL."""
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(table)
            if hit is not None and now - hit[0] < self._ttl:
                return hit[1]
        col = f'"{block.column}"'
        result = self._backend.run(f'SELECT MIN({col}), MAX({col}) FROM "{table}"')
        low, high = result.rows[0]
        windows = _windows(table, block, low, high)
        with self._lock:
            self._cache[table] = (now, windows)
        return windows

    def invalidate(self) -> None:
        """Forget cached windows (after loading data, in tests)."""
        with self._lock:
            self._cache.clear()


def _windows(table: str, block: BlockConfig, low: object, high: object) -> BlockWindows:
    ids = block.ids_per_block
    if ids is not None:  # User DP: ranges of ids aligned to multiples of the width
        if low is None or high is None:
            return BlockWindows(table, 0, ids, 0, block.column)
        first, last = int(low) // ids, int(high) // ids  # type: ignore[call-overload]
        return BlockWindows(table, first * ids, ids, last - first + 1, block.column)
    width = block.width
    if low is None or high is None:
        return BlockWindows(table, _EPOCH, width, 0)
    lo, hi = _as_datetime(low), _as_datetime(high)
    first = (lo - _EPOCH) // width
    last = (hi - _EPOCH) // width
    return BlockWindows(table, _EPOCH + width * first, width, int(last - first + 1))


def _as_datetime(value: object) -> datetime:
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(UTC).replace(tzinfo=None)
        return value
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day)
    raise TypeError(f"block column value of unexpected type {type(value).__name__}")
