"""One DuckDB cursor per thread, and the statements prepared on it.

A DP query's answer on DuckDB is a long generated text (the noise CTE, the clip, the ranked
copy's window; 31 VALUES rows for a day of March) that DuckDB parses, binds and plans again on
every run: 0.3-0.7 ms of a 1-2 ms statement for the cheapest queries (benchmarks/fixed_costs.py).
A text run again (a warm query: same rewrite, choices reused, noise drawn by the database) is
prepared on its thread's cursor the second time it is seen and executed by name afterwards.

A prepared statement keeps nothing of the data: DuckDB draws ``random()`` at each execution,
binds again when a table it reads was replaced (a ranked copy rebuilt, a public copy
refreshed), and each execution still runs in the read-only transaction the backend opens.
Prepared statements belong to one connection (a cursor is one), so they are kept per thread;
a thread's cursor is dropped with them after any error (an interrupted or failed statement
leaves nothing behind for the next one).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

import duckdb

# Per thread: prepared texts kept (a cached query shape's statements: the answer, a histogram
# of stored counts) and texts seen once (a one-off text, e.g. a first run's choices, is not
# prepared: PREPARE then EXECUTE costs a little more than running it once).
PREPARED_PER_THREAD = 64
SEEN_PER_THREAD = 256
# Only plain queries are prepared (not EXPLAIN, the transaction's BEGIN / ROLLBACK, or DDL).
_PREPARABLE = ("select", "with")


class ThreadCursor:
    """One thread's cursor on a DuckDB database and the statements prepared on it."""

    __slots__ = ("_count", "_prepared", "_seen", "cursor", "thread")

    def __init__(self, cursor: duckdb.DuckDBPyConnection, thread: threading.Thread) -> None:
        self.cursor = cursor
        self.thread = thread
        self._prepared: OrderedDict[str, str] = OrderedDict()  # text -> statement name
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._count = 0

    def execute(self, sql: str) -> duckdb.DuckDBPyConnection:
        """Run ``sql`` on this cursor: by the name it was prepared under when it was seen
        before, as text otherwise."""
        name = self._prepared.get(sql)
        if name is not None:
            self._prepared.move_to_end(sql)
            return self.cursor.execute(f"EXECUTE {name}")
        if sql in self._seen and sql.lstrip()[:6].lower().startswith(_PREPARABLE):
            del self._seen[sql]
            self._count += 1
            name = f"chorus_prepared_{self._count}"
            self.cursor.execute(f"PREPARE {name} AS {sql}")
            self._prepared[sql] = name
            if len(self._prepared) > PREPARED_PER_THREAD:
                _, old = self._prepared.popitem(last=False)
                self.cursor.execute(f"DEALLOCATE PREPARE {old}")
            return self.cursor.execute(f"EXECUTE {name}")
        self._seen[sql] = None
        self._seen.move_to_end(sql)
        if len(self._seen) > SEEN_PER_THREAD:
            self._seen.popitem(last=False)
        return self.cursor.execute(sql)

    @property
    def prepared(self) -> int:
        """How many statements are prepared on this cursor."""
        return len(self._prepared)


class ThreadCursors:
    """The cursors of one DuckDB connection, one per thread that runs statements on it.

    Creating a cursor is cheap, but the statements prepared on one are not: each thread keeps
    its cursor, which no other thread uses (a thread runs one statement at a time, so a
    cursor's ``interrupt`` stops only that thread's statement).  Cursors of threads that ended
    are closed when the next cursor is made, and all of them by ``close``.
    """

    def __init__(self, open_cursor: Callable[[], duckdb.DuckDBPyConnection]) -> None:
        self._open = open_cursor
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: list[ThreadCursor] = []

    def get(self) -> ThreadCursor:
        """The calling thread's cursor (made on its first statement)."""
        mine: ThreadCursor | None = getattr(self._local, "cursor", None)
        if mine is not None:
            return mine
        me = threading.current_thread()
        with self._lock:
            ended = [c for c in self._all if not c.thread.is_alive()]
            self._all = [c for c in self._all if c.thread.is_alive()]
            mine = ThreadCursor(self._open(), me)
            self._all.append(mine)
        for cursor in ended:
            cursor.cursor.close()
        self._local.cursor = mine
        return mine

    def drop(self) -> None:
        """Close the calling thread's cursor (after an error): its next statement gets a new
        one, with nothing prepared."""
        mine: ThreadCursor | None = getattr(self._local, "cursor", None)
        if mine is None:
            return
        self._local.cursor = None
        with self._lock:
            self._all = [c for c in self._all if c is not mine]
        mine.cursor.close()

    def close(self) -> None:
        """Close every thread's cursor."""
        with self._lock:
            cursors, self._all = self._all, []
        for cursor in cursors:
            cursor.cursor.close()
