"""Max-frequency metrics mf(column, table) for joins (DESIGN.md section 5), read and cached.

mf is the largest number of rows that share one value of a column:
``SELECT MAX(c) FROM (SELECT COUNT(*) AS c FROM t GROUP BY col)``.  NULLs form one group: they
never join, so counting them only makes the bound larger (safe).

Where a value comes from, in order:

1. ``max_frequency`` pinned in the policy for the column (a declared upper bound the data owner
   guarantees): the database is not asked, and the value may be shown to analysts.
2. Otherwise the backend is asked once and the answer cached.  For a private table the value is
   data-dependent: it is an input of the smooth bound only and never shown (``chorus_py.kinds.join``
   keeps it out of reports, EXPLAIN, the rewritten SQL and error messages).  For a public table
   it is public, like the table.

Change detection (a cached value is re-read when its table changed): at most once per
``ttl_seconds`` the catalog reads a cheap fingerprint of the table: on Postgres the
``pg_stat_user_tables`` counters (inserts, updates, deletes; no scan: the statistics collector
publishes them within about a second of a commit), on DuckDB the row count with a hash checksum of
the column (one scan of one column, far cheaper than the GROUP BY).  The fingerprint is the same
kind the stored bounded samples use (``chorus_py.stores.samples``).  So a value can lag a write
by at most the TTL (plus the collector's delay on Postgres); owners whose tables change under
running queries should use a short TTL or pin ``max_frequency``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from analyses.joins import FrequencyMetric
from chorus_py.backends import Backend, StatementFailed
from chorus_py.errors import QueryRefused

log = logging.getLogger("chorus.frequencies")


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def frequency_sql(table: str, column: str) -> str:
    """The one query that reads mf(column, table)."""
    return (f"SELECT MAX(c) FROM (SELECT COUNT(*) AS c FROM {_quote(table)} "
            f"GROUP BY {_quote(column)}) AS f")


class FrequencyCatalog:
    """Max frequencies by (table, column), refreshed when the table changes (thread-safe)."""

    def __init__(self, backend: Backend, ttl_seconds: float = 60.0) -> None:
        self._backend = backend
        self._ttl = ttl_seconds
        self._lock = threading.Lock()
        # (table, column) -> (fingerprint, value); (table, column) -> (checked at, fingerprint)
        self._values: dict[tuple[str, str], tuple[str, float]] = {}
        self._checked: dict[tuple[str, str], tuple[float, str]] = {}
        self.reads = 0  # metric queries run (for tests and benchmarks)

    def values(self, metrics: Sequence[FrequencyMetric]) -> dict[str, float]:
        """mf by metric name: pinned values as declared, the others read (or cached)."""
        out: dict[str, float] = {}
        for m in metrics:
            if m.source == "pinned":
                assert m.pinned is not None
                out[m.name] = m.pinned
            else:
                out[m.name] = self._read(m.table, m.column)
        return out

    def _read(self, table: str, column: str) -> float:
        key = (table, column)
        with self._lock:
            try:
                now = time.monotonic()
                checked = self._checked.get(key)
                if checked is not None and now - checked[0] < self._ttl:
                    fingerprint = checked[1]
                else:
                    fingerprint = self._fingerprint(table, column)
                    self._checked[key] = (now, fingerprint)
                cached = self._values.get(key)
                if cached is not None and cached[0] == fingerprint:
                    return cached[1]
                started = time.perf_counter()
                (value,) = self._backend.run(frequency_sql(table, column)).rows[0]
                self.reads += 1
            except StatementFailed:
                # No detail: the backend's message could quote data.
                raise QueryRefused(
                    f"the max frequency of {table}.{column} is unknown (it could not be read), "
                    "so a join on it has no bounded sensitivity",
                    hint=f"the data owner can pin tables.{table}.columns.{column}.max_frequency "
                    "in the policy") from None
            mf = float(value or 0)
            self._values[key] = (fingerprint, mf)
            # The value itself is never logged: it is data-dependent.
            log.info("max frequency of %s.%s read in %.0f ms", table, column,
                     (time.perf_counter() - started) * 1000)
            return mf

    def _fingerprint(self, table: str, column: str) -> str:
        if self._backend.dialect == "postgres":
            rows = self._backend.run(
                "SELECT n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_user_tables "
                f"WHERE schemaname = current_schema() AND relname = '{table}'").rows
        else:
            rows = self._backend.run(
                f"SELECT COUNT(*), SUM(hash({_quote(column)}) % 1000000007) "
                f"FROM {_quote(table)}").rows
        return repr(rows)
