"""The embedded DuckDB backend: a database file opened read-only for analyst-derived SQL, and an
in-memory copy of the public tables for public-only queries."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import duckdb
import numpy as np

from chorus_py.backends.base import (
    Backend,
    ResultSet,
    StatementFailed,
    group_columns,
    portable_type,
)
from chorus_py.backends.cancel import Stop, cancellable
from chorus_py.backends.duckdb_cursors import ThreadCursors
from chorus_py.errors import OperationalError

log = logging.getLogger("chorus.backends")

# GROUP BY a key of at most 2^14 values (a quantile histogram's 10,000 bins, whose range
# DuckDB reads from the stored bin's statistics or the bin's CASE) by direct indexing
# instead of hashing: DuckDB's default stops at 2^12.  Measured on 1M demo trips, the
# MAX(distance_km) histogram: 22-29 -> 13-15 ms with the stored bin (benchmarks/RESULTS.md,
# "Stored quantile bins").
PERFECT_HASH = ("perfect_ht_threshold", 14)
# No Python replacement scans either: DuckDB would otherwise read a NumPy array (a DataFrame...)
# of the calling Python frame that a statement names as a table.
DUCKDB_CONFIG = (("enable_external_access", False), ("python_enable_replacements", False),
                 ("lock_configuration", True),
                 PERFECT_HASH)
# The restricted connection of public queries: an in-memory database of its own, which cannot
# read files or the network, load extensions or see Python objects (DuckDB's replacement scans
# would otherwise resolve an unknown table name to a variable of the calling Python frame), and
# whose configuration nobody can change back.
_PUBLIC_DUCKDB_CONFIG = {"enable_external_access": False, "python_enable_replacements": False,
                         "autoinstall_known_extensions": False,
                         "autoload_known_extensions": False, "lock_configuration": True}
# Column types NumPy carries exactly from one DuckDB to another.
_NUMPY_EXACT = frozenset({"BOOLEAN", "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT",
                          "USMALLINT", "UINTEGER", "UBIGINT", "FLOAT", "DOUBLE", "VARCHAR"})


T = TypeVar("T")


def _rows(cur: duckdb.DuckDBPyConnection) -> ResultSet:
    rows = cur.fetchall()
    desc = cur.description or []
    return ResultSet(tuple(d[0] for d in desc), tuple(portable_type(str(d[1])) for d in desc),
                     rows)


def _integers(cur: duckdb.DuckDBPyConnection) -> tuple[np.ndarray, ...]:
    """``Backend.run_integers``' columns: int64 arrays, NULL as -1."""
    found = cur.fetchnumpy()  # every column, in order (a repeated name gets a suffix)
    columns = []
    for name, values in found.items():
        if values.dtype.kind not in "iu":
            raise StatementFailed(True, f"column {name} of an integer result is not integral")
        columns.append(np.ma.filled(values.astype(np.int64), -1)
                       if isinstance(values, np.ma.MaskedArray) else values.astype(np.int64))
    return tuple(columns)


class DuckDBBackend(Backend):
    """An embedded DuckDB database file (or ``:memory:``)."""

    dialect = "duckdb"

    # Errors raised before execution starts: nothing was read.
    _BEFORE_EXECUTION = (duckdb.ParserException, duckdb.BinderException,
                         duckdb.CatalogException, duckdb.SyntaxException)

    def __init__(self, path: str, statement_timeout_s: float = 300.0) -> None:
        if path != ":memory:" and not Path(path).exists():
            raise OperationalError(
                f"the DuckDB file {path} does not exist",
                hint="run `chorus demo` to create demo data, or fix [backend] url in the policy",
            )
        try:
            # Defence in depth: no file or network access from SQL, and nobody may turn it back
            # on.  Every connection of this process to the file must use the same config.
            self._con = duckdb.connect(path, config=dict(DUCKDB_CONFIG))
        except duckdb.Error as err:
            raise OperationalError(f"cannot open DuckDB file {path}: {err}") from None
        self._lock = threading.Lock()
        # DuckDB has no statement timeout of its own: the watchdog interrupts the statement.
        self._timeout_s = statement_timeout_s
        self._public: duckdb.DuckDBPyConnection | None = None
        self._public_tables: tuple[str, ...] = ()
        self._public_ttl = 60.0
        self._public_at = 0.0  # time.monotonic() of the last copy
        self._public_lock = threading.Lock()
        self._refresh_lock = threading.Lock()
        self._cursors = ThreadCursors(self._open_cursor)
        self._public_cursors: ThreadCursors | None = None

    def run(self, sql: str) -> ResultSet:
        return self._run_on(self._cursors, sql, _rows)

    def run_integers(self, sql: str) -> tuple[np.ndarray, ...]:
        """The columns by ``fetchnumpy``: no Python object per value (a grouped quantile
        histogram has about 20,000 rows, which took 30-60 ms to fetch and transpose as
        tuples)."""
        return self._run_on(self._cursors, sql, _integers)

    def _open_cursor(self) -> duckdb.DuckDBPyConnection:
        with self._lock:
            return self._con.cursor()  # a cursor is DuckDB's per-thread handle on the database

    def _run_on(self, cursors: ThreadCursors, sql: str,
                fetch: Callable[[duckdb.DuckDBPyConnection], T]) -> T:
        """Run ``sql`` on the calling thread's cursor of ``cursors`` (prepared when the thread
        ran the same text before, ``chorus_py.backends.duckdb_cursors``), read-only,
        cancellable, timed, its result read by ``fetch``.  After an error the thread's cursor
        is dropped, with what was prepared on it."""
        mine = cursors.get()
        cur = mine.cursor
        stop: Stop | None = None
        try:
            # A read-only transaction: DuckDB has no read-only connection to a file the proxy
            # also writes its stored samples to, so each statement gets one (defence in depth
            # behind the validator, as default_transaction_read_only on Postgres).  A prepared
            # statement runs in it as any other.
            cur.execute("BEGIN TRANSACTION READ ONLY")
            try:
                with cancellable(cur.interrupt, self._timeout_s) as stop:
                    result = fetch(mine.execute(sql))
            finally:
                cur.execute("ROLLBACK")  # nothing to keep: it read only
        except self._BEFORE_EXECUTION as err:
            cursors.drop()
            raise StatementFailed(False, str(err)) from None
        except duckdb.InterruptException as err:
            cursors.drop()
            reason = (stop.reason if stop is not None else None) or "user request"
            raise StatementFailed(True, str(err), cancelled=reason) from None
        except duckdb.Error as err:
            cursors.drop()
            raise StatementFailed(True, str(err)) from None
        except BaseException:
            cursors.drop()
            raise
        return result

    def restrict_public(self, public: Sequence[str], private: Sequence[str],
                        public_url: str | None = None,
                        refresh_seconds: float = 60.0) -> tuple[str, ...]:
        """Public queries run on an in-memory DuckDB holding copies of the public tables only.

        DuckDB has no roles, and one process cannot open the file twice with different
        settings: the restricted database is a separate in-memory one, which the private tables
        never enter.  The copies are refreshed from the file every ``refresh_seconds`` (the
        engine's catalog TTL).  ``public_url`` is a Postgres setting: refused here.
        """
        if public_url is not None:
            raise OperationalError("backend.public_url is for a Postgres backend",
                                   hint="remove it: on DuckDB public queries run on an "
                                        "in-memory copy of the public tables")
        self._public_tables = tuple(public)
        self._public_ttl = refresh_seconds
        self._public = duckdb.connect(":memory:", config=dict(_PUBLIC_DUCKDB_CONFIG))
        self._public_cursors = ThreadCursors(self._open_public_cursor)
        self._copy_public()
        return ()

    def _copy_public(self) -> None:
        """Copy the public tables into the restricted database, each replaced in one
        transaction (a public query running meanwhile sees the old or the new copy).

        Column by column through NumPy (100,000 rows of 9 columns: 0.6 s, where row-wise
        INSERTs took 5 s); a type NumPy would not carry exactly (DECIMAL, dates, nested types)
        travels as DuckDB's text form and is cast back to its declared type.
        """
        assert self._public is not None
        for table in self._public_tables:
            with self._lock:
                cur = self._con.cursor()
            try:
                cur.execute("BEGIN TRANSACTION READ ONLY")
                columns = cur.execute(
                    "SELECT column_name, data_type FROM information_schema.columns WHERE "
                    "table_schema = current_schema() AND lower(table_name) = lower(?) "
                    "ORDER BY ordinal_position", [table]).fetchall()
                data = cur.execute("SELECT " + ", ".join(
                    quote_identifier(c) if ty in _NUMPY_EXACT
                    else f"CAST({quote_identifier(c)} AS VARCHAR)"
                    for c, ty in columns) + f" FROM {quote_identifier(table)}").fetchnumpy()
                cur.execute("ROLLBACK")
            finally:
                cur.close()
            out = self._public.cursor()  # registrations are per cursor: no query sees this one
            try:
                out.register("chorus_copy", {f"c{i}": v for i, v in enumerate(data.values())})
                out.execute("BEGIN TRANSACTION")
                out.execute(f"CREATE OR REPLACE TABLE {quote_identifier(table)} ("
                            + ", ".join(f"{quote_identifier(c)} {ty}" for c, ty in columns) + ")")
                out.execute(f"INSERT INTO {quote_identifier(table)} SELECT "
                            + ", ".join(f"CAST(c{i} AS {ty})" for i, (_, ty) in
                                        enumerate(columns)) + " FROM chorus_copy")
                out.execute("COMMIT")
            except duckdb.Error:
                out.execute("ROLLBACK")
                raise
            finally:
                out.close()
        self._public_at = time.monotonic()

    def run_public(self, sql: str) -> ResultSet:
        if self._public is None:
            return super().run_public(sql)
        # Stale copies: one thread refreshes them; the others go on with the current ones.
        if time.monotonic() - self._public_at >= self._public_ttl and \
                self._refresh_lock.acquire(blocking=False):
            try:
                self._copy_public()
            except duckdb.Error as err:
                raise StatementFailed(False, f"copying the public tables: {err}") from None
            finally:
                self._refresh_lock.release()
        assert self._public_cursors is not None
        return self._run_on(self._public_cursors, sql, _rows)

    def _open_public_cursor(self) -> duckdb.DuckDBPyConnection:
        assert self._public is not None
        with self._public_lock:
            return self._public.cursor()

    def run_owned(self, statements: Sequence[str]) -> None:
        with self._lock:
            cur = self._con.cursor()
        try:
            cur.execute("BEGIN TRANSACTION")
            for statement in statements:
                cur.execute(statement)
            cur.execute("COMMIT")
        except duckdb.Error:
            cur.execute("ROLLBACK")
            raise
        finally:
            cur.close()

    def table_columns(self) -> dict[str, dict[str, str]]:
        result = self.run(
            "SELECT table_name, column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position"
        )
        return group_columns(result.rows)

    def close(self) -> None:
        self._cursors.close()
        self._con.close()
        if self._public_cursors is not None:
            self._public_cursors.close()
        if self._public is not None:
            self._public.close()


def quote_identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'




def duckdb_path(url: str) -> str:
    """The file of a ``duckdb:///relative`` or ``duckdb:////absolute`` URL (or ``:memory:``)."""
    rest = url.removeprefix("duckdb:///")
    return rest if rest == ":memory:" or Path(rest).is_absolute() else str(Path(rest).resolve())
