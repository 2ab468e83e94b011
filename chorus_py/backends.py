"""Connections to the unmodified database the proxy forwards rewritten SQL to.

Two backends: an embedded DuckDB file and Postgres (psycopg 3).  Both run every statement the
proxy sends as read-only as the database allows (defence in depth: the analyser already refuses
writes), and both classify failures so the engine can tell "the data was touched" (charge the
budget) from "the statement never ran" (release it).
"""

from __future__ import annotations

import queue
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import psycopg

from chorus_py.errors import OperationalError


@dataclass(frozen=True)
class ResultSet:
    """Rows as returned by the backend, with column names and portable type names."""

    columns: tuple[str, ...]
    types: tuple[str, ...]
    rows: list[tuple[Any, ...]]


class StatementFailed(Exception):
    """The backend refused or failed a statement.

    ``touched_data`` is False only when the failure happened before any row was read (parse,
    bind or plan errors), so releasing the budget claim is safe.  ``detail`` is for the server
    log only: it may quote data values and must never reach an analyst.
    """

    def __init__(self, touched_data: bool, detail: str) -> None:
        super().__init__(detail)
        self.touched_data = touched_data
        self.detail = detail


class Backend(ABC):
    """A database that runs the proxy's rewritten SQL."""

    dialect: str

    @abstractmethod
    def run(self, sql: str) -> ResultSet:
        """Run one statement; raise :class:`StatementFailed` on any database error."""

    @abstractmethod
    def run_owned(self, statements: Sequence[str]) -> None:
        """Run statements that write the proxy's own schema, in one transaction.

        Only the proxy calls this (never with analyst SQL): it materialises data the proxy
        owns, such as bounded samples, in a schema analysts cannot name.
        """

    @abstractmethod
    def table_columns(self) -> dict[str, dict[str, str]]:
        """Every table of the default schema, with its columns and their portable types."""

    @abstractmethod
    def close(self) -> None:
        """Release connections."""

    def interrupt(self, thread_id: int) -> bool:
        """Cancel the statement thread ``thread_id`` is running in :meth:`run`, if any.

        Called from another thread (a client's cancel request, a statement timeout).  The
        statement then fails in its own thread like any backend error once it started, so the
        engine charges its claim.  Returns False when that thread runs no statement.
        """
        cancel = self.__dict__.get("_running", {}).get(thread_id)
        if cancel is None:
            return False
        cancel()
        return True

    @contextmanager
    def _cancellable(self, cancel: Callable[[], object]) -> Iterator[None]:
        """Register how to cancel the current thread's statement while the block runs.

        A cancel that arrives once the statement is over is dropped: sent late, it would cancel
        whatever that connection runs next (a Postgres cancel request targets the backend
        process, not a statement), e.g. the next query of another analyst.  The lock makes
        "still running?" and "send the cancel" one step against the statement's end.
        """
        running: dict[int, Callable[[], object]] = self.__dict__.setdefault("_running", {})
        me = threading.get_ident()
        lock = threading.Lock()
        live = True

        def guarded() -> None:
            with lock:
                if live:
                    cancel()

        running[me] = guarded
        try:
            yield
        finally:
            with lock:
                live = False
            running.pop(me, None)


def open_backend(url: str, statement_timeout_s: float = 300.0) -> Backend:
    """Open the backend a policy's URL names."""
    if url.startswith("duckdb://"):
        return DuckDBBackend(duckdb_path(url))
    return PostgresBackend(url, statement_timeout_s)


def duckdb_path(url: str) -> str:
    """The file of a ``duckdb:///relative`` or ``duckdb:////absolute`` URL (or ``:memory:``)."""
    rest = url.removeprefix("duckdb:///")
    return rest if rest == ":memory:" or Path(rest).is_absolute() else str(Path(rest).resolve())


def portable_type(name: str) -> str:
    """Map a backend type name to the small set the report uses."""
    n = name.lower()
    if any(s in n for s in ("int", "serial")) and "interval" not in n:
        return "integer"
    if any(s in n for s in ("double", "float", "real", "numeric", "decimal")):
        return "float"
    if "timestamp" in n:
        return "timestamp"
    if n == "date":
        return "date"
    if n in ("bool", "boolean"):
        return "boolean"
    if any(s in n for s in ("char", "text", "string")):
        return "text"
    return n


DUCKDB_CONFIG = (("enable_external_access", False), ("lock_configuration", True))


class DuckDBBackend(Backend):
    """An embedded DuckDB database file (or ``:memory:``)."""

    dialect = "duckdb"

    # Errors raised before execution starts: nothing was read.
    _BEFORE_EXECUTION = (duckdb.ParserException, duckdb.BinderException,
                         duckdb.CatalogException, duckdb.SyntaxException)

    def __init__(self, path: str) -> None:
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

    def run(self, sql: str) -> ResultSet:
        # A cursor is DuckDB's per-thread handle on the same database.
        with self._lock:
            cur = self._con.cursor()
        try:
            # A read-only transaction: DuckDB has no read-only connection to a file the proxy
            # also writes its stored samples to, so each statement gets one (defence in depth
            # behind the validator, as default_transaction_read_only on Postgres).
            cur.execute("BEGIN TRANSACTION READ ONLY")
            try:
                with self._cancellable(cur.interrupt):
                    cur.execute(sql)
                    rows = cur.fetchall()
                    desc = cur.description or []
            finally:
                cur.execute("ROLLBACK")  # nothing to keep: it read only
        except self._BEFORE_EXECUTION as err:
            raise StatementFailed(False, str(err)) from None
        except duckdb.Error as err:
            raise StatementFailed(True, str(err)) from None
        finally:
            cur.close()
        return ResultSet(tuple(d[0] for d in desc), tuple(portable_type(str(d[1])) for d in desc),
                         rows)

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
        return _group_columns(result.rows)

    def close(self) -> None:
        self._con.close()


class PostgresBackend(Backend):
    """Postgres through a small pool of psycopg connections, each in read-only mode
    (``default_transaction_read_only``: every statement runs in a read-only transaction)."""

    dialect = "postgres"

    def __init__(self, url: str, statement_timeout_s: float, pool_size: int = 8) -> None:
        self._url = url
        self._timeout_ms = int(statement_timeout_s * 1000)
        self._pool: queue.LifoQueue[psycopg.Connection] = queue.LifoQueue(maxsize=pool_size)
        with self._connection():  # fail at start-up, not on the first query
            pass

    def _connect(self) -> psycopg.Connection:
        try:
            # Autocommit: each statement is its own read-only transaction, one round trip
            # (psycopg's BEGIN READ ONLY ... COMMIT would add two per query).
            con = psycopg.connect(self._url, autocommit=True, connect_timeout=10)
        except psycopg.Error as err:
            raise OperationalError(
                f"cannot connect to Postgres: {str(err).strip().splitlines()[0]}",
                hint="check [backend] url in the policy and that the server is running",
            ) from None
        with con.cursor() as cur:
            cur.execute("SET default_transaction_read_only = on")
            cur.execute(f"SET statement_timeout = {self._timeout_ms}")
        return con

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection]:
        try:
            con = self._pool.get_nowait()
        except queue.Empty:
            con = self._connect()
        try:
            yield con
        finally:
            if con.closed or con.broken:
                con.close()
            else:
                try:
                    self._pool.put_nowait(con)
                except queue.Full:  # more threads than pooled connections: close the extra
                    con.close()

    def run(self, sql: str) -> ResultSet:
        try:
            query = sql.encode()
        except UnicodeEncodeError as err:
            raise StatementFailed(False, str(err)) from None
        for attempt in (1, 2):
            try:
                return self._run(query)
            except psycopg.errors.FeatureNotSupported as err:
                # A table a prepared statement reads was replaced by one of other column types
                # (a stored sample rebuilt, say): Postgres refuses before reading a row.  The
                # failed connection was dropped with its prepared statements: run it again.
                if attempt == 2 or "cached plan must not change result type" not in str(err):
                    raise StatementFailed(_pg_touched(err), str(err)) from None
        raise AssertionError("unreachable")

    def _run(self, query: bytes) -> ResultSet:
        with self._connection() as con:
            try:
                with con.cursor() as cur, self._cancellable(con.cancel_safe):
                    # A query text run often (a cached query shape: its rewrite is the same
                    # text each time, noise included, as the noise is drawn by the database)
                    # is prepared on its connection after psycopg's prepare_threshold runs:
                    # Postgres then skips parsing and planning it, the larger part of a small
                    # DP query's cost there (pgbench: +35% DP queries per second).
                    cur.execute(query)
                    rows = cur.fetchall() if cur.description else []
                    desc = cur.description or []
                    types = tuple(_PG_TYPES.get(d.type_code, f"oid {d.type_code}")
                                  for d in desc)
            except psycopg.errors.FeatureNotSupported as err:
                if "cached plan must not change result type" in str(err):
                    con.close()  # its prepared statements are stale: never pooled again
                raise
            except psycopg.Error as err:
                raise StatementFailed(_pg_touched(err), str(err)) from None
        return ResultSet(tuple(d.name for d in desc), types, rows)

    def run_owned(self, statements: Sequence[str]) -> None:
        # A separate, writable connection: the pooled ones are read-only on purpose.
        with psycopg.connect(self._url, connect_timeout=10) as con, con.cursor() as cur:
            for statement in statements:
                cur.execute(statement.encode(), prepare=False)

    def table_columns(self) -> dict[str, dict[str, str]]:
        result = self.run(
            "SELECT table_name::text, column_name::text, data_type::text "
            "FROM information_schema.columns WHERE table_schema = current_schema() "
            "ORDER BY table_name, ordinal_position"
        )
        return _group_columns(result.rows)

    def close(self) -> None:
        while True:
            try:
                self._pool.get_nowait().close()
            except queue.Empty:
                return


def _pg_touched(err: psycopg.Error) -> bool:
    # SQLSTATE class 42 (syntax or access rule) and 0A (feature not supported) are raised while
    # parsing or planning, before any row is read; everything else may have read data.
    state = getattr(err, "sqlstate", None) or ""
    return not state.startswith(("42", "0A"))


_PG_TYPES = {16: "boolean", 20: "integer", 21: "integer", 23: "integer", 25: "text",
             700: "float", 701: "float", 1043: "text", 1082: "date", 1114: "timestamp",
             1184: "timestamp", 1700: "float", 18: "text", 19: "text"}


def _group_columns(rows: Sequence[tuple[Any, ...]]) -> dict[str, dict[str, str]]:
    tables: dict[str, dict[str, str]] = {}
    for table, column, dtype in rows:
        tables.setdefault(str(table), {})[str(column)] = portable_type(str(dtype))
    return tables
