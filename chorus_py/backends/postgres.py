"""The Postgres backend (psycopg 3): a small pool of read-only connections, and a second role
restricted to the public tables for public-only queries."""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import re
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import psycopg

from chorus_py.backends.base import (
    SCHEMA,
    Backend,
    ResultSet,
    StatementFailed,
    group_columns,
)
from chorus_py.backends.cancel import cancellable, interrupt
from chorus_py.errors import OperationalError

log = logging.getLogger("chorus.backends")

#: The random page cost the proxy's connections plan with (``PostgresBackend._connect``):
#: the value usually advised for solid-state storage.
RANDOM_PAGE_COST = 1.1


class PostgresBackend(Backend):
    """Postgres through a small pool of psycopg connections, each in read-only mode
    (``default_transaction_read_only``: every statement runs in a read-only transaction).

    ``page_cost``: the ``random_page_cost`` its connections plan with, when lower than the
    server's (the proxy's statements, :data:`RANDOM_PAGE_COST`); None keeps the server's, as
    for public queries, which are the analyst's own SQL (:meth:`run_public`)."""

    dialect = "postgres"

    def __init__(self, url: str, statement_timeout_s: float, pool_size: int = 8,
                 page_cost: float | None = RANDOM_PAGE_COST) -> None:
        self._url = url
        self._timeout_ms = int(statement_timeout_s * 1000)
        self._page_cost = page_cost
        # Public queries without a role of their own: the same URL, the server's planner
        # settings (made on the first one).
        self._as_server: PostgresBackend | None = None
        self._pool: queue.LifoQueue[psycopg.Connection] = queue.LifoQueue(maxsize=pool_size)
        # The restricted backend of public queries (backend.public_url), once configured.
        self._public: PostgresBackend | None = None
        self._public_tables: tuple[str, ...] = ()
        self._public_ttl = 60.0
        self._public_checked = 0.0  # time.monotonic() of the last check of its role
        self._public_refused: OperationalError | None = None  # what the last check found
        self._public_lock = threading.Lock()
        self._helpers: concurrent.futures.ThreadPoolExecutor | None = None  # side by side
        self._helpers_lock = threading.Lock()
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
            # The proxy reads its twins through indexes built in one pass, in the order their
            # windows want: their leaf pages follow one another on disk.  Postgres's default
            # random_page_cost (4, for spinning disks) prices each as a random read, and for
            # a covering index as large as its table (``chorus_py.stores.samples.
            # covering_index``) chose to sort 300,000 rows on disk instead (1M demo trips,
            # held-out STDDEV of one city: 322 -> 232 ms at 1.1).  Only ever lowered.
            if self._page_cost is not None:
                (cost,) = cur.execute("SELECT current_setting('random_page_cost')::float8"
                                      ).fetchone()  # type: ignore[misc]
                if cost > self._page_cost:
                    cur.execute(f"SET random_page_cost = {float(self._page_cost)}")
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

    def run_side_by_side(self, statements: Sequence[str]) -> list[ResultSet]:
        """:meth:`Backend.run_side_by_side`: the first statement in this thread, the others
        each on a connection of the pool in a helper thread.  Postgres runs a window in one
        process (no parallel plan holds one: benchmarks/RESULTS.md, "The floors"), so the
        choices' cells cut in two halves run in about half the time on two cores.

        The others are the query's too: a cancel of this thread's statement (a client's
        cancel request, a front door's timeout, ``cancellable``) reaches them, sent again
        every 0.1 s while they run (one could be about to start); a failure of one cancels
        the others; the error raised, once all have ended, is the first failure's, with
        ``touched_data`` when any statement may have read a row (one that ran to its end
        did)."""
        if len(statements) < 2:
            return [self.run(sql) for sql in statements]
        helpers = self._helper_threads()
        threads: dict[int, int] = {}  # the helper thread of each statement, once started
        stopping: list[str] = []  # why the others are cancelled, once they are

        def helper(index: int, sql: str) -> ResultSet:
            threads[index] = threading.get_ident()
            if stopping:
                raise StatementFailed(False, "not started: another part failed",
                                      cancelled=stopping[0])
            return self.run(sql)

        def stop_others(reason: str) -> None:
            if not stopping:
                stopping.append(reason)
            for ident in list(threads.values()):
                interrupt(ident, stopping[0])

        futures = [helpers.submit(helper, i, sql) for i, sql in enumerate(statements[1:], 1)]
        results: list[ResultSet | None] = [None] * len(statements)
        failures: list[StatementFailed] = []
        unexpected: list[Exception] = []
        try:
            results[0] = self.run(statements[0])
        except StatementFailed as err:
            failures.append(err)
            stop_others(err.cancelled or "another part failed")
        except Exception as err:
            unexpected.append(err)
            stop_others("another part failed")
        # While the others run, this thread's cancel is theirs.
        with cancellable(lambda: stop_others("user request")) as stop:
            for index, future in enumerate(futures, 1):
                while True:
                    try:
                        results[index] = future.result(timeout=0.1)
                    except concurrent.futures.TimeoutError:
                        if stopping or stop.reason:
                            stop_others(stop.reason or stopping[0])
                        continue
                    except StatementFailed as err:
                        failures.append(err)
                        stop_others(err.cancelled or "another part failed")
                    except Exception as err:  # e.g. no connection to be had: not a statement's
                        unexpected.append(err)
                        stop_others("another part failed")
                    break
        if failures:
            # The first failure seen is the cause; the others were cancelled because of it.
            first = failures[0]
            touched = any(f.touched_data for f in failures) or any(
                r is not None for r in results)
            raise StatementFailed(touched, first.detail,
                                  cancelled=first.cancelled or stop.reason)
        if unexpected:
            raise unexpected[0]
        return [r for r in results if r is not None]

    def _helper_threads(self) -> concurrent.futures.ThreadPoolExecutor:
        """The threads of :meth:`run_side_by_side`'s other statements, started on first use."""
        with self._helpers_lock:
            if self._helpers is None:
                self._helpers = concurrent.futures.ThreadPoolExecutor(
                    max_workers=4, thread_name_prefix="chorus-side-by-side")
            return self._helpers

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
            self._public = PostgresBackend(public_url, self._timeout_ms / 1000, pool_size=4,
                                           page_cost=None)
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
            with self._public_lock:
                if self._as_server is None:
                    self._as_server = PostgresBackend(self._url, self._timeout_ms / 1000,
                                                      pool_size=2, page_cost=None)
            return self._as_server.run(sql)
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

    def settle_owned(self, tables: Sequence[str]) -> None:
        """VACUUM the proxy's new ``tables``: a table made by CREATE TABLE AS has an empty
        visibility map until a VACUUM (autovacuum's comes a minute or more later), and until
        then an index-only scan reads every row's heap page too
        (``chorus_py.stores.samples.covering_index``).  Outside a transaction, as VACUUM must
        run; the tables are the proxy's own, so its role owns them."""
        with psycopg.connect(self._url, connect_timeout=10, autocommit=True) as con:
            for table in tables:
                con.execute(f'VACUUM {SCHEMA}."{table}"'.encode(), prepare=False)

    def table_columns(self) -> dict[str, dict[str, str]]:
        result = self.run(
            "SELECT table_name::text, column_name::text, data_type::text "
            "FROM information_schema.columns WHERE table_schema = current_schema() "
            "ORDER BY table_name, ordinal_position"
        )
        return group_columns(result.rows)

    def close(self) -> None:
        if self._helpers is not None:
            self._helpers.shutdown(wait=True)
        for other in (self._public, self._as_server):
            if other is not None:
                other.close()
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
