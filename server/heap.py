"""The garbage collector's settings of a long-running server (``chorus serve``, ``python -m
server.rest``): freeze the heap built at start, collect the young generation less often.

Why.  sqlglot trees are reference cycles (every node points to its parent), so each tree a
query discards waits for CPython's cyclic collector, and every collection of the oldest
generation walks every object the process holds: the imported modules, the engine, its caches
(hundreds of thousands of objects; 90-180 ms a full collection, the p95 outliers of a cold
query in benchmarks/RESULTS.md "Cold queries").  ``gc.freeze()`` moves every object alive at
that moment into the permanent generation, which no collection walks again: the server's
start (modules, policy, engine) is built once and lives as long as the process.  A larger
first threshold (``gc.set_threshold``) makes young collections rarer, and with them the
older generations' collections, which CPython counts in young ones; the numbers that chose
:data:`GEN0_THRESHOLD` are in benchmarks/RESULTS.md "The garbage collector of `chorus serve`".

Only the servers' start calls :func:`settle_heap`: these are process-wide settings, which a
library must not change in its host's process, so :class:`chorus_py.engine.Engine` and the
DB-API never do.  ``CHORUS_GC=default`` in the environment leaves CPython's settings as they
are (docs/owner-guide.md, "Throughput").
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass

#: The environment variable that turns the settings off (``default``).
ENV = "CHORUS_GC"

#: Allocations (net of deallocations) of container objects between two young collections;
#: CPython's default is 700.  The young generation's walk costs about the same per object at
#: either size, but with 700 a query of a few ms runs several collections, and each tenth of
#: them collects the middle generation too.
GEN0_THRESHOLD = 10_000


@dataclass(frozen=True)
class HeapSettings:
    """What :func:`settle_heap` did, for the start-up log line."""

    frozen: int  # objects in the permanent generation (gc.get_freeze_count())
    thresholds: tuple[int, int, int]  # gc.get_threshold() after

    def describe(self) -> str:
        """The log line's text."""
        return (f"garbage collector: {self.frozen} objects of the start frozen (gc.freeze), "
                f"thresholds {self.thresholds[0]}/{self.thresholds[1]}/{self.thresholds[2]}; "
                f"{ENV}=default keeps CPython's")


def settle_heap(gen0: int | None = GEN0_THRESHOLD, freeze: bool = True) -> HeapSettings | None:
    """Collect once and freeze what is left (unless not ``freeze``), set the young generation's
    threshold to ``gen0`` (None: leave it); None (nothing changed) when ``CHORUS_GC=default``.
    Call it once the engine is built.  The servers use the defaults; benchmarks/cold.py and
    benchmarks/gc_serve.py measure the other combinations."""
    if os.environ.get(ENV, "").strip().lower() == "default":
        return None
    if freeze:
        # The start's garbage (the policy's parse, import-time temporaries) is collected
        # first: frozen, a dead cycle would never be freed.
        gc.collect()
        gc.freeze()
    if gen0 is not None:
        _, gen1, gen2 = gc.get_threshold()
        gc.set_threshold(gen0, gen1, gen2)
    return HeapSettings(gc.get_freeze_count(), gc.get_threshold())
