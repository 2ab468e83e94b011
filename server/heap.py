"""The garbage collector's settings of a long-running server (``chorus serve``, ``python -m
server.rest``): freeze the heap built at start, collect the young generation less often.

Why.  sqlglot trees are reference cycles (every node points to its parent), so each tree a
query discards waits for CPython's cyclic collector, and every collection of the oldest
generation walks every object the process holds: the imported modules, the engine, its caches
(hundreds of thousands of objects; 90-180 ms a full collection, the p95 outliers of a cold
query in benchmarks/RESULTS.md "Cold queries").  ``gc.freeze()`` moves every object alive at
that moment into the permanent generation, which no collection walks again: the server's
start (modules, policy, engine) is built once and lives as long as the process.

A larger threshold of the young generation (``gen0=N``, ``gc.set_threshold``; CPython's is
700) makes young collections rarer, and with them the older generations' collections, which
CPython counts in young ones; past 10,000 each young collection walks so many objects that the
p95 grows.  With 10,000 and the freeze, a real server spent 11-18% less CPU on a never-seen
query than with CPython's settings (the freeze alone: from 11% less to 2% more) and the
slowest one's p95 about halved; the client's median moved within the noise (-2% to +7%)
(benchmarks/RESULTS.md "The garbage collector of `chorus serve`" and "Cold queries under the
garbage collector's settings").

Only the servers' start calls :func:`settle_heap`: these are process-wide settings, which a
library must not change in its host's process, so :class:`chorus_py.engine.Engine` and the
DB-API never do.  ``CHORUS_GC`` in the environment chooses other settings
(docs/owner-guide.md, "Throughput"): ``default`` leaves CPython's as they are; otherwise
``+``-separated parts, ``freeze`` and ``gen0=N`` (benchmarks/cold.py's variants use the same
words).
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass

#: The environment variable that chooses the settings.
ENV = "CHORUS_GC"

#: What the servers apply when ``CHORUS_GC`` is not set (or is not a setting).
SHIPPED = "freeze+gen0=10000"


@dataclass(frozen=True)
class HeapSettings:
    """What :func:`settle_heap` did, for the start-up log line."""

    setting: str  # the setting applied (CHORUS_GC's value, or SHIPPED)
    frozen: int  # objects in the permanent generation (gc.get_freeze_count())
    thresholds: tuple[int, int, int]  # gc.get_threshold() after
    unknown: str = ""  # a value of CHORUS_GC that is no setting (ignored: SHIPPED applies)

    def describe(self) -> str:
        """The log line's text."""
        frozen = (f"{self.frozen} objects of the start frozen (gc.freeze)" if self.frozen
                  else "nothing frozen")
        line = (f"garbage collector: {frozen}, thresholds "
                f"{'/'.join(str(t) for t in self.thresholds)} ({ENV}={self.setting}; "
                f"{ENV}=default keeps CPython's)")
        if self.unknown:
            line += f"; {ENV}={self.unknown!r} is not a setting: ignored"
        return line


def parse_setting(text: str) -> tuple[bool, int | None]:
    """(freeze, young generation's threshold or None) of a setting other than ``default``:
    ``+``-separated parts ``freeze`` and ``gen0=N`` (N >= 1).  Raises ValueError."""
    freeze, gen0 = False, None
    for part in text.strip().lower().split("+"):
        name, _, value = part.strip().partition("=")
        if name == "freeze" and not value:
            freeze = True
        elif name == "gen0" and value.isdigit() and int(value) >= 1:
            gen0 = int(value)
        else:
            raise ValueError(f"{part!r} is neither freeze nor gen0=N")
    return freeze, gen0


def settle_heap(setting: str | None = None) -> HeapSettings | None:
    """Apply ``setting`` (None: ``CHORUS_GC``, else :data:`SHIPPED`); None when it is
    ``default`` (nothing changed).  Call it once the engine is built."""
    unknown = ""
    if setting is None:
        setting = os.environ.get(ENV, "").strip() or SHIPPED
    if setting.lower() == "default":
        return None
    try:
        freeze, gen0 = parse_setting(setting)
    except ValueError:
        unknown, setting = setting, SHIPPED
        freeze, gen0 = parse_setting(setting)
    if freeze:
        # The start's garbage (the policy's parse, import-time temporaries) is collected
        # first: frozen, a dead cycle would never be freed.
        gc.collect()
        gc.freeze()
    if gen0 is not None:
        _, gen1, gen2 = gc.get_threshold()
        gc.set_threshold(gen0, gen1, gen2)
    return HeapSettings(setting, gc.get_freeze_count(), gc.get_threshold(), unknown)
