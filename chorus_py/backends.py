"""Connections to the unmodified database the proxy forwards rewritten SQL to.

Two backends: an embedded DuckDB file and Postgres (psycopg 3).  Both run every statement the
proxy sends as read-only as the database allows (defence in depth: the analyser already refuses
writes), and both classify failures so the engine can tell "the data was touched" (charge the
budget) from "the statement never ran" (release it).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import queue
import re
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import psycopg

from chorus_py.errors import OperationalError

log = logging.getLogger("chorus.backends")

# The proxy's own schema, written only by ``Backend.run_owned`` (bounded samples, kept sets,
# the naming key): analysts can never name it.
SCHEMA = "chorus_private"


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

    def __init__(self, touched_data: bool, detail: str, cancelled: str | None = None) -> None:
        super().__init__(detail)
        self.touched_data = touched_data
        self.detail = detail
        # Why the statement was cancelled ("statement timeout", "user request"), if it was.
        self.cancelled = cancelled


class Backend(ABC):
    """A database that runs the proxy's rewritten SQL."""

    dialect: str
    # What the start-up checks found worth telling the data owner (see restrict_public).
    warnings: tuple[str, ...] = ()

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
        """Cancel the statement thread ``thread_id`` is running, if any (:func:`interrupt`)."""
        return interrupt(thread_id)

    def restrict_public(self, public: Sequence[str], private: Sequence[str],
                        public_url: str | None = None,
                        refresh_seconds: float = 60.0) -> tuple[str, ...]:
        """Set up the connection :meth:`run_public` uses, which can read only the ``public``
        tables of the policy (``private``: its other tables).

        Checks what that connection can read and refuses (:class:`OperationalError`) when it
        could read anything else.  Returns (and keeps in :attr:`warnings`) what the data owner
        should know about the main connection, e.g. that it can write.  The base backend has no
        restricted connection: its :meth:`run_public` refuses every statement.
        """
        return ()

    def run_public(self, sql: str) -> ResultSet:
        """Run a statement that reads only public tables, on the restricted connection.

        The second wall behind the analyser (DESIGN.md section 11, wall 5): even SQL that names
        a private table fails there, as that connection cannot read it.
        """
        raise StatementFailed(False, "this backend has no connection restricted to the "
                                     "public tables")


class _Stop:
    """One running statement's cancel: sends it at most while the statement runs."""

    __slots__ = ("_cancel", "_lock", "over", "reason")

    def __init__(self, cancel: Callable[[], object]) -> None:
        self._cancel = cancel
        self._lock = threading.Lock()
        self.over = False
        self.reason: str | None = None  # why it was cancelled: "statement timeout"...

    def cancel(self, reason: str) -> bool:
        """Cancel the statement unless it is over; the first reason given is kept."""
        # The lock makes "still running?" and "send the cancel" one step against the
        # statement's end: sent late, a cancel would stop whatever that connection runs next
        # (a Postgres cancel request targets the backend process, not a statement), e.g. the
        # next query of another analyst.
        with self._lock:
            if self.over:
                return False
            self.reason = self.reason or reason
            self._cancel()
            return True

    def end(self) -> None:
        with self._lock:
            self.over = True


class _Watchdog:
    """Fires statement timeouts: one thread for the process and a heap of deadlines (a timer
    thread per statement would start a thread per query).  A fired statement is interrupted
    again every 0.2 s until it returns: an interrupt that lands before the engine started
    executing would otherwise be lost."""

    RETRY = 0.2

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, _Stop]] = []
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._ended = 0  # finished statements still in the heap

    def watch(self, stop: _Stop, seconds: float) -> None:
        with self._cond:
            heapq.heappush(self._heap, (time.monotonic() + seconds, next(self._seq), stop))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True,
                                                name="chorus-statement-timeouts")
                self._thread.start()
            elif self._heap[0][2] is stop:
                self._cond.notify()

    def ended(self) -> None:
        """A watched statement is over: drop finished ones once they are half the heap, so
        a busy proxy does not keep every statement of the last timeout period."""
        with self._cond:
            self._ended += 1
            if self._ended > 64 and 2 * self._ended > len(self._heap):
                self._heap = [entry for entry in self._heap if not entry[2].over]
                heapq.heapify(self._heap)
                self._ended = 0

    def _loop(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                due: list[_Stop] = []
                while self._heap and self._heap[0][0] <= now:
                    stop = heapq.heappop(self._heap)[2]
                    if stop.over:
                        self._ended = max(self._ended - 1, 0)
                    else:
                        due.append(stop)
                if not due:
                    self._cond.wait(self._heap[0][0] - now if self._heap else None)
                    continue
            for stop in due:  # outside the lock: a cancel may be a network round trip
                try:
                    stop.cancel("statement timeout")
                except Exception:
                    log.debug("interrupting a statement at its timeout failed", exc_info=True)
                if not stop.over:
                    self.watch(stop, self.RETRY)


_WATCHDOG = _Watchdog()
# The statement each thread is running (a thread runs one at a time): a cancel request or a
# timeout of any front door reaches it by thread, whichever engine runs it (backend, catalog).
_RUNNING: dict[int, _Stop] = {}


@contextmanager
def cancellable(cancel: Callable[[], object],
                timeout_seconds: float | None = None) -> Iterator[_Stop]:
    """Register how to cancel the current thread's statement while the block runs.

    :func:`interrupt` (another thread: a cancel request, a front door's timeout) reaches it;
    with ``timeout_seconds`` it is also cancelled when it runs longer, with the reason
    "statement timeout".  The yielded handle's ``reason`` says why it was cancelled (None: it
    was not), so the caller can name it in its error.
    """
    stop = _Stop(cancel)
    me = threading.get_ident()
    _RUNNING[me] = stop
    if timeout_seconds is not None:
        _WATCHDOG.watch(stop, timeout_seconds)
    try:
        yield stop
    finally:
        stop.end()
        if _RUNNING.get(me) is stop:
            del _RUNNING[me]
        if timeout_seconds is not None:
            _WATCHDOG.ended()


def interrupt(thread_id: int, reason: str = "user request") -> bool:
    """Cancel the statement thread ``thread_id`` is running in a :func:`cancellable` block.

    Called from another thread (a client's cancel request, a statement timeout).  The
    statement then fails in its own thread like any backend error once it started, so the
    engine charges its claim.  Returns False when that thread runs no statement.
    """
    stop = _RUNNING.get(thread_id)
    return stop is not None and stop.cancel(reason)


def open_backend(url: str, statement_timeout_s: float = 300.0) -> Backend:
    """Open the backend a policy's URL names; statements running longer than
    ``statement_timeout_s`` are cancelled, whichever front door sent them."""
    if url.startswith("duckdb://"):
        return DuckDBBackend(duckdb_path(url), statement_timeout_s)
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


# No Python replacement scans either: DuckDB would otherwise read a NumPy array (a DataFrame...)
# of the calling Python frame that a statement names as a table.
DUCKDB_CONFIG = (("enable_external_access", False), ("python_enable_replacements", False),
                 ("lock_configuration", True))
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

    def run(self, sql: str) -> ResultSet:
        with self._lock:
            cur = self._con.cursor()  # a cursor is DuckDB's per-thread handle on the database
        return self._run_on(cur, sql)

    def _run_on(self, cur: duckdb.DuckDBPyConnection, sql: str) -> ResultSet:
        """Run ``sql`` on a fresh cursor (closed here), read-only, cancellable, timed."""
        stop: _Stop | None = None
        try:
            # A read-only transaction: DuckDB has no read-only connection to a file the proxy
            # also writes its stored samples to, so each statement gets one (defence in depth
            # behind the validator, as default_transaction_read_only on Postgres).
            cur.execute("BEGIN TRANSACTION READ ONLY")
            try:
                with cancellable(cur.interrupt, self._timeout_s) as stop:
                    cur.execute(sql)
                    rows = cur.fetchall()
                    desc = cur.description or []
            finally:
                cur.execute("ROLLBACK")  # nothing to keep: it read only
        except self._BEFORE_EXECUTION as err:
            raise StatementFailed(False, str(err)) from None
        except duckdb.InterruptException as err:
            reason = (stop.reason if stop is not None else None) or "user request"
            raise StatementFailed(True, str(err), cancelled=reason) from None
        except duckdb.Error as err:
            raise StatementFailed(True, str(err)) from None
        finally:
            cur.close()
        return ResultSet(tuple(d[0] for d in desc), tuple(portable_type(str(d[1])) for d in desc),
                         rows)

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
                    _quote(c) if ty in _NUMPY_EXACT else f"CAST({_quote(c)} AS VARCHAR)"
                    for c, ty in columns) + f" FROM {_quote(table)}").fetchnumpy()
                cur.execute("ROLLBACK")
            finally:
                cur.close()
            out = self._public.cursor()  # registrations are per cursor: no query sees this one
            try:
                out.register("chorus_copy", {f"c{i}": v for i, v in enumerate(data.values())})
                out.execute("BEGIN TRANSACTION")
                out.execute(f"CREATE OR REPLACE TABLE {_quote(table)} ("
                            + ", ".join(f"{_quote(c)} {ty}" for c, ty in columns) + ")")
                out.execute(f"INSERT INTO {_quote(table)} SELECT "
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
        with self._public_lock:
            cur = self._public.cursor()
        return self._run_on(cur, sql)

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
        if self._public is not None:
            self._public.close()


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class PostgresBackend(Backend):
    """Postgres through a small pool of psycopg connections, each in read-only mode
    (``default_transaction_read_only``: every statement runs in a read-only transaction)."""

    dialect = "postgres"

    def __init__(self, url: str, statement_timeout_s: float, pool_size: int = 8) -> None:
        self._url = url
        self._timeout_ms = int(statement_timeout_s * 1000)
        self._pool: queue.LifoQueue[psycopg.Connection] = queue.LifoQueue(maxsize=pool_size)
        # The restricted backend of public queries (backend.public_url), once configured.
        self._public: PostgresBackend | None = None
        self._public_tables: tuple[str, ...] = ()
        self._public_ttl = 60.0
        self._public_checked = 0.0  # time.monotonic() of the last check of its role
        self._public_refused: OperationalError | None = None  # what the last check found
        self._public_lock = threading.Lock()
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
                with con.cursor() as cur, cancellable(con.cancel_safe) as stop:
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
            except psycopg.errors.QueryCanceled as err:
                # The server's statement_timeout, or a cancel sent through cancellable().
                reason = stop.reason or ("statement timeout" if "statement timeout" in str(err)
                                         else "user request")
                raise StatementFailed(True, str(err), cancelled=reason) from None
            except psycopg.Error as err:
                raise StatementFailed(_pg_touched(err), str(err)) from None
        return ResultSet(tuple(d.name for d in desc), types, rows)

    def restrict_public(self, public: Sequence[str], private: Sequence[str],
                        public_url: str | None = None,
                        refresh_seconds: float = 60.0) -> tuple[str, ...]:
        """Public queries run on ``public_url``: a role of the owner's that can read the public
        tables and nothing else, which is checked here (refused with the GRANT / REVOKE
        statements to run otherwise).  Without it they run on the main connection (a warning).
        Also warns when the main connection's role can write or read undeclared tables."""
        warnings = list(self._write_warnings(list(public) + list(private)))
        if public_url is not None:
            self._public = PostgresBackend(public_url, self._timeout_ms / 1000, pool_size=4)
            self._public_tables, self._public_ttl = tuple(public), refresh_seconds
            try:
                _check_public_role(self._public, public)
                self._public_checked = time.monotonic()
            except BaseException:
                self._public.close()
                self._public = None
                raise
        elif public:
            warnings.append(
                "public queries run on the main connection, which can read the private tables: "
                "set backend.public_url to a role that can read only the public tables "
                "(docs/owner-guide.md, 'Least privilege')")
        self.warnings = tuple(warnings)
        for warning in warnings:
            log.warning("%s", warning)
        return self.warnings

    def run_public(self, sql: str) -> ResultSet:
        public = self._public
        if public is None:
            return self.run(sql)
        self._recheck_public(public)
        refused = self._public_refused
        if refused is not None:
            raise OperationalError(f"public queries are refused: {refused.message}",
                                   hint=refused.hint)
        return public.run(sql)

    def _recheck_public(self, public: PostgresBackend) -> None:
        """Check the public role again once per catalog TTL: a grant made after the start
        (on a private table, to the role or to PUBLIC) stops public queries until it is
        revoked.  One thread checks; the others go on with the last finding."""
        if time.monotonic() - self._public_checked < self._public_ttl or \
                not self._public_lock.acquire(blocking=False):
            return
        try:
            _check_public_role(public, self._public_tables)
            self._public_refused = None
        except OperationalError as err:
            if self._public_refused is None:
                log.error("%s", err)
            self._public_refused = err
        except StatementFailed as err:  # the check itself failed: keep the last finding
            log.warning("checking backend.public_url's role failed: %s", err.detail)
        finally:
            self._public_checked = time.monotonic()
            self._public_lock.release()

    def _write_warnings(self, declared: Sequence[str]) -> list[str]:
        """What the main connection's role can do beyond reading the declared tables."""
        row = self.run(
            "SELECT r.rolsuper, has_database_privilege(current_database(), 'CREATE'), "
            "has_schema_privilege(current_schema(), 'CREATE'), current_user::text "
            "FROM pg_roles r WHERE r.rolname = current_user").rows[0]
        superuser, create_db, create_schema, role = row
        if superuser:
            return [f"the proxy connects to Postgres as {role}, a superuser: it could write or "
                    "read anything.  Connect as a role with SELECT on the declared tables only "
                    "(docs/owner-guide.md, 'Least privilege')"]
        out = []
        if create_db or create_schema:
            out.append(f"the proxy's role {role} can create schemas or tables "
                       "(CREATE on the database or its schema): revoke it, and create the "
                       f"proxy's schema {SCHEMA} for it (docs/owner-guide.md)")
        names = [t.lower() for t in declared]
        writable = self.run(
            "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = "
            "c.relnamespace WHERE n.nspname = current_schema() "
            f"AND lower(c.relname) = ANY({_pg_text_array(names)}) "
            "AND has_table_privilege(c.oid, 'INSERT, UPDATE, DELETE, TRUNCATE') "
            "ORDER BY 1").rows
        if writable:
            out.append(f"the proxy's role {role} can write the tables "
                       f"{', '.join(r[0] for r in writable)}: REVOKE INSERT, UPDATE, DELETE, "
                       f"TRUNCATE ON them FROM {role} (it needs SELECT only)")
        undeclared = [f"{n}.{t}" for n, t, here in _readable(self) if n != SCHEMA
                      and not (here and t.lower() in names)]
        if undeclared:
            out.append(f"the proxy's role {role} can read tables the policy does not declare "
                       f"({', '.join(undeclared[:10])}{'...' if len(undeclared) > 10 else ''})"
                       ": it needs SELECT on the declared tables only")
        return out

    def run_owned(self, statements: Sequence[str]) -> None:
        # A separate, writable connection: the pooled ones are read-only on purpose.
        with psycopg.connect(self._url, connect_timeout=10) as con, con.cursor() as cur:
            for statement in statements:
                # Postgres checks CREATE on the database before IF NOT EXISTS: skip it when
                # the schema exists, so a role without that privilege works in the schema the
                # owner created for it (docs/owner-guide.md, "Least privilege").
                schema = _CREATE_SCHEMA.fullmatch(statement.strip())
                if schema and cur.execute("SELECT to_regnamespace(%s) IS NOT NULL",
                                          [schema.group(1)]).fetchone() == (True,):
                    continue
                cur.execute(statement.encode(), prepare=False)

    def table_columns(self) -> dict[str, dict[str, str]]:
        result = self.run(
            "SELECT table_name::text, column_name::text, data_type::text "
            "FROM information_schema.columns WHERE table_schema = current_schema() "
            "ORDER BY table_name, ordinal_position"
        )
        return _group_columns(result.rows)

    def close(self) -> None:
        if self._public is not None:
            self._public.close()
        while True:
            try:
                self._pool.get_nowait().close()
            except queue.Empty:
                return


_CREATE_SCHEMA = re.compile(r"CREATE SCHEMA IF NOT EXISTS (\w+)", re.IGNORECASE)
# Relations an analyst's SQL could read, outside the system schemas.
_READABLE_SQL = (
    "SELECT DISTINCT n.nspname::text, c.relname::text, n.nspname = current_schema() "
    "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
    "JOIN pg_roles r ON pg_has_role(current_user, r.oid, 'MEMBER') "
    "WHERE c.relkind IN ('r', 'v', 'm', 'f', 'p') "
    "AND n.nspname NOT IN ('pg_catalog', 'information_schema') "
    "AND n.nspname NOT LIKE 'pg\\_toast%' AND n.nspname NOT LIKE 'pg\\_temp%' "
    "AND has_any_column_privilege(r.oid, c.oid, 'SELECT') ORDER BY 1, 2")
# Roles that bypass table privileges or reach files: a restricted role must be none of them.
_POWERFUL_ROLES = ("pg_read_all_data", "pg_write_all_data", "pg_read_server_files",
                   "pg_write_server_files", "pg_execute_server_program")


def _readable(backend: PostgresBackend) -> list[tuple[str, str, bool]]:
    """(schema, relation, in the current schema) of every relation the connection's role can
    SELECT from (a column of), counting grants to PUBLIC and to every role it can SET ROLE to."""
    return [(str(n), str(t), bool(here))
            for n, t, here in backend.run(_READABLE_SQL).rows]


def _pg_text_array(values: Sequence[str]) -> str:
    return "ARRAY[" + ", ".join("'" + v.replace("'", "''") + "'" for v in values) + "]::text[]"


def _check_public_role(public: PostgresBackend, tables: Sequence[str]) -> None:
    """Refuse to start unless ``public``'s role can read exactly the public ``tables``."""
    role, schema, superuser = public.run(
        "SELECT current_user::text, current_schema()::text, rolsuper FROM pg_roles "
        "WHERE rolname = current_user").rows[0]
    powerful = [r[0] for r in public.run(
        "SELECT rolname::text FROM pg_roles WHERE rolname = ANY("
        + _pg_text_array(_POWERFUL_ROLES) + ") AND pg_has_role(current_user, oid, 'MEMBER') "
        "ORDER BY 1").rows]
    hint = "see docs/owner-guide.md, 'Least privilege'"
    if superuser or powerful:
        what = "a superuser" if superuser else "a member of " + ", ".join(powerful)
        raise OperationalError(
            f"backend.public_url connects as {role}, {what}: it could read the private tables",
            hint=f"connect as a role of its own, e.g. CREATE ROLE chorus_public_reader LOGIN; "
                 f"{hint}")
    names = {t.lower() for t in tables}
    readable = _readable(public)
    extra = [f"{n}.{t}" for n, t, here in readable if not (here and t.lower() in names)]
    found = {t.lower() for n, t, here in readable if here}
    missing = [t for t in tables if t.lower() not in found]
    if extra:
        raise OperationalError(
            f"backend.public_url connects as {role}, which can read tables that are not "
            f"declared public: {', '.join(extra)}; public queries must run on a connection "
            "that cannot read them",
            hint="run " + "; ".join(f"REVOKE SELECT ON {t} FROM {role}" for t in extra)
                 + f" (and from PUBLIC, or from the roles {role} is a member of, if that is "
                   f"where the grant comes from); {hint}")
    if missing:
        raise OperationalError(
            f"backend.public_url connects as {role}, which cannot read the public tables "
            f"{', '.join(missing)}",
            hint=f"run GRANT USAGE ON SCHEMA {schema} TO {role}; "
                 + "; ".join(f"GRANT SELECT ON {schema}.{t} TO {role}" for t in missing)
                 + f"; {hint}")


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
