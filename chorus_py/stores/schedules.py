"""Block windows: public metadata, from the policy's schedule and the clock, never from the data.

A table's blocks are declared in its policy (``chorus_py.policy.BlockConfig``): time windows of
``size`` from ``start`` up to ``end``, or, without ``end``, up to the window holding the current
UTC time (a new block appears when its window begins, whatever rows exist); id-range blocks over
the declared ``[start, end)``.  Boundaries lie on the grid of the size (``chorus_py.blockgrid``:
fixed steps from 1970-01-01 00:00 UTC, weeks from their start day, calendar months; a
``timestamp`` without time zone is read as UTC).  As in PrivateKube, the set of
blocks is public; here it is public by declaration (DESIGN.md section 11, wall 7): which blocks
exist, and so which blocks a query is charged on, is the same whether or not any one person's
rows are in the database.  Rows outside the schedule belong to no block: every query is
restricted to the windows of the blocks it is charged on (``rewriters.blocks``), so they are
never read.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from analyses.blocks import BlockWindows
from chorus_py.blockgrid import FixedGrid
from chorus_py.policy import BlockConfig


def utc_now() -> datetime:
    """The current time as a naive UTC datetime (the block windows' convention)."""
    return datetime.now(UTC).replace(tzinfo=None)


def scheduled_windows(table: str, block: BlockConfig, now: datetime) -> BlockWindows:
    """The windows of ``table``'s schedule at ``now``: a function of the policy and the clock."""
    per = block.ids_per_block
    if per is not None:
        return BlockWindows(table, block.start, per, block.count_at(now), block.column)
    grid = block.grid
    # Windows of one fixed length from a start on their grid are that grid: they keep their
    # timedelta form (and so their ids and the names stored samples derive from them); the grid
    # itself cuts calendar months and names ISO weeks.
    width = grid.step if isinstance(grid, FixedGrid) and not grid.iso_weeks else grid
    return BlockWindows(table, block.start, width, block.count_at(now))


class BlockCatalog:
    """The block windows of each table on its public schedule (thread-safe).

    Reads no data.  The windows object of a table is kept, with the span of time during which
    the schedule keeps it (until the next block begins), so a query costs one clock read and a
    comparison, and block ids are computed once per block, not once per query.
    """

    def __init__(self, clock: Callable[[], datetime] | None = None) -> None:
        self._clock = clock  # None: ``utc_now``, looked up at each call
        # table -> (block config, valid from, valid until (POSIX seconds), windows)
        self._cache: dict[str, tuple[BlockConfig, float, float, BlockWindows]] = {}
        self._lock = threading.Lock()

    def windows(self, table: str, block: BlockConfig) -> BlockWindows:
        """The windows of ``table`` now."""
        # Every query asks: the common case is one float clock read and two comparisons
        # (time.time() takes ~50 ns, a UTC datetime ~1.3 us).
        stamp = time.time() if self._clock is None else _posix(self._clock())
        with self._lock:
            kept = self._cache.get(table)
        if kept is not None and kept[0] is block and kept[1] <= stamp < kept[2]:
            return kept[3]
        now = utc_now() if self._clock is None else self._clock()
        fresh = scheduled_windows(table, block, now)
        if kept is not None and kept[3] == fresh:
            fresh = kept[3]  # keep the object whose ids are already computed
        valid_from, valid_until = _unchanged_between(block, fresh)
        with self._lock:
            self._cache[table] = (block, _posix(valid_from), _posix(valid_until), fresh)
        return fresh


def _posix(moment: datetime) -> float:
    """A naive UTC datetime (or datetime.min / max) as POSIX seconds."""
    if moment == datetime.min:
        return -math.inf
    if moment == datetime.max:
        return math.inf
    return moment.replace(tzinfo=UTC).timestamp()


def _unchanged_between(block: BlockConfig, windows: BlockWindows) -> tuple[datetime, datetime]:
    """The clock times at which the schedule has exactly ``windows.count`` blocks."""
    if block.ids_per_block is not None:
        return datetime.min, datetime.max  # a declared range: no clock involved
    assert isinstance(block.start, datetime)
    count = windows.count
    if count == 0:
        return datetime.min, block.start
    begun = windows.bound(count - 1)  # the last block's start
    if isinstance(block.end, datetime) and windows.end >= block.end:
        return begun, datetime.max  # complete: no block begins any more
    return begun, windows.end
