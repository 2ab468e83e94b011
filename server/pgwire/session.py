"""One client connection as a state machine: frontend messages in, backend bytes out.

:meth:`Session.handle` takes one decoded frontend message and is a generator: whenever it needs
the engine or the catalog (blocking work), it yields a :class:`Work` item, and the I/O shell runs
it in a thread pool (with the statement timeout and cancellation) and sends the result back in,
as psycopg's generators do.  Everything else (authentication, session settings, transactions,
the extended-protocol bookkeeping) happens here without waiting.  Output accumulates in
:attr:`Session.output`; the shell writes it after each batch of messages, so pipelined requests
get one write, and ``Flush`` is honoured without waiting for ``Sync``.

The session holds no privacy logic: it hands SQL text to :meth:`Engine.execute` /
:meth:`Engine.explain` with the connection's analyst and the session's epsilon and delta, and
maps errors to ErrorResponse by their SQLSTATE.  ``Describe`` never executes anything (that would
spend budget): result columns are predicted from the query's shape on the catalog's empty tables.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
import textwrap
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import sqlglot
from sqlglot import exp

from budget.ledger import Viewer
from chorus_py.errors import ChorusError, QuerySyntaxError
from chorus_py.report import PrivacyReport, QueryResult, elastic_lines, interval_dict, shown
from server.pgwire import protocol as p
from server.pgwire import types as t
from server.pgwire.catalog import (
    SERVER_VERSION,
    Catalog,
    CatalogError,
    Column,
    SessionInfo,
    column_name,
)
from server.pgwire.commands import (
    Statement,
    classify,
    parse_postgres,
    route,
    split_statements,
)
from server.pgwire.scram import (
    MECHANISM,
    AuthenticationFailed,
    ScramError,
    ScramExchange,
    Verifier,
)

log = logging.getLogger("chorus.pgwire")


class QueryCanceled(ChorusError, code="57014"):
    """The statement was cancelled (cancel request or statement timeout)."""


class WireError(ChorusError):
    """An error the wire server raises itself, with any SQLSTATE."""

    def __init__(self, sqlstate: str, message: str, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.sqlstate = sqlstate


@dataclass(frozen=True)
class Work:
    """Blocking work for the shell's thread pool; its return value is sent back in."""

    fn: Callable[[], Any]
    cancellable: bool = True


@dataclass
class ServerContext:
    """What every session of one server shares."""

    engine: Any  # chorus_py.engine.Engine (duck-typed: execute, explain, ledger, policy)
    catalog: Catalog
    verifiers: Mapping[str, Verifier | None]
    tls_available: bool = False
    # [server] tls = "require": a startup that did not come through TLS is refused.
    tls_required: bool = False
    # policy table -> column -> wire type; used to infer parameter types
    columns: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.table_names = frozenset(self.columns)

    @property
    def dialect(self) -> str:
        return str(self.engine.dialect)


@dataclass
class _Prepared:
    name: str
    sql: str
    statement: Statement
    param_oids: tuple[int, ...]  # declared by the client, 0 = infer
    inferred: tuple[int, ...]  # what ParameterDescription reports
    target: str  # "engine", "catalog" or "command"
    tree: exp.Expr | None  # Postgres-dialect parse of a query (for routing / catalog / typing)
    fields: tuple[Column, ...] | None = None  # described result columns, once described


@dataclass
class _Portal:
    statement: _Prepared
    params: tuple[Any, ...]
    formats: tuple[int, ...]
    fields: tuple[Column, ...] | None = None
    rows: list[tuple[Any, ...]] | None = None
    position: int = 0
    tag: str = ""
    notice: bytes = b""
    done: bool = False


_REPORTED = ("application_name", "client_encoding", "DateStyle", "default_transaction_read_only",
             "in_hot_standby", "integer_datetimes", "IntervalStyle", "is_superuser",
             "server_encoding", "server_version", "session_authorization",
             "standard_conforming_strings", "TimeZone")
_CANONICAL = {name.lower(): name for name in _REPORTED}
_READ_ONLY_SETTINGS = frozenset({"server_version", "server_encoding", "integer_datetimes",
                                 "is_superuser", "session_authorization", "in_hot_standby",
                                 "server_version_num", "max_identifier_length",
                                 "transaction_read_only"})
_UTF8 = frozenset({"utf8", "utf-8", "unicode"})


def _defaults(user: str) -> dict[str, str]:
    return {
        "application_name": "", "client_encoding": "UTF8", "datestyle": "ISO, MDY",
        "default_transaction_read_only": "on", "in_hot_standby": "off",
        "integer_datetimes": "on", "intervalstyle": "postgres", "is_superuser": "off",
        "server_encoding": "UTF8", "server_version": SERVER_VERSION,
        "server_version_num": "150000", "session_authorization": user,
        "standard_conforming_strings": "on", "timezone": "UTC", "extra_float_digits": "1",
        "search_path": '"$user", public', "transaction_isolation": "read committed",
        "transaction_read_only": "on", "default_transaction_isolation": "read committed",
        "max_identifier_length": "63", "lc_messages": "C", "bytea_output": "hex",
        "statement_timeout": "0", "lock_timeout": "0",
        "idle_in_transaction_session_timeout": "0",
    }


class Session:
    """The state of one connection (see the module docstring)."""

    def __init__(self, context: ServerContext, pid: int, secret: int) -> None:
        self.ctx = context
        self.pid = pid
        self.secret = secret
        self.output = bytearray()
        self.user = ""
        self.database = ""
        self.authenticated = False
        self.closed = False
        self.want_tls = False  # the shell starts TLS after writing the 'S'
        self.cancel_target: tuple[int, int] | None = None  # a CancelRequest to relay
        self.settings: dict[str, str] = {}
        self.epsilon: float | None = None
        self.delta: float | None = None
        # SET chorus.sensitivity = 'sampled' / chorus.gamma: random DP (chorus_py.kinds.sampled).
        self.sensitivity: str | None = None
        self.gamma: float | None = None
        # SET chorus.wait_seconds: how long a query waits for budget the scheduler cannot grant
        # at once (None: the policy's scheduler.wait_seconds).
        self.wait_seconds: float | None = None
        # The last noisy answer of this session: SHOW chorus.intervals gives its error bars.
        self.last_answer: QueryResult | None = None
        self.status = "I"  # transaction status: I idle, T in a block, E failed block
        self._state = "startup"  # startup -> sasl_initial -> sasl_final -> ready
        self._scram: ScramExchange | None = None
        self._prepared: dict[str, _Prepared] = {}
        self._portals: dict[str, _Portal] = {}
        self._skip_to_sync = False
        self._tls = False

    # -- output helpers -------------------------------------------------------------------------
    def take_output(self) -> bytes:
        data = bytes(self.output)
        self.output.clear()
        return data

    def _send(self, data: bytes) -> None:
        self.output += data

    def _fatal(self, code: str, message: str) -> None:
        self._send(p.error_response(code, message, severity="FATAL"))
        self.closed = True

    def protocol_violation(self, message: str) -> None:
        """The stream could not be decoded: answer FATAL and close."""
        self._fatal("08P01", message)

    def tls_started(self) -> None:
        self._tls = True

    def session_info(self) -> SessionInfo:
        return SessionInfo(self.user, self.database, self.pid, self.settings)

    # -- entry point ----------------------------------------------------------------------------
    def handle(self, message: p.FrontendMessage) -> Generator[Work, Any, None]:
        """Process one frontend message (a generator: see the module docstring)."""
        if self.closed:
            return
        if self._state == "startup":
            self._startup(message)
            return
        if self._state in ("sasl_initial", "sasl_final"):
            self._authenticate(message)
            return
        if isinstance(message, p.Terminate):
            self.closed = True
            return
        if isinstance(message, p.Query):
            yield from self._simple_query(message.sql)
            return
        if isinstance(message, p.Sync):
            self._skip_to_sync = False
            if self.status == "I":
                self._portals.clear()
            self._ready()
            return
        if isinstance(message, p.Flush):
            return  # the shell writes the output after every batch of messages
        if self._skip_to_sync:
            return
        try:
            if isinstance(message, p.Parse):
                yield from self._parse(message)
            elif isinstance(message, p.Bind):
                self._bind(message)
            elif isinstance(message, p.Describe):
                yield from self._describe(message)
            elif isinstance(message, p.Execute):
                yield from self._execute(message)
            elif isinstance(message, p.Close):
                if message.kind == "S":
                    self._prepared.pop(message.name, None)
                else:
                    self._portals.pop(message.name, None)
                self._send(p.close_complete())
            elif isinstance(message, p.Password):
                raise WireError("08P01", "unexpected password message")
            elif isinstance(message, p.Unsupported):
                if message.type in ("d", "c", "f"):
                    raise WireError("08P01", "COPY is not supported by the proxy")
                raise WireError("0A000", "the function call protocol is not supported")
            else:
                raise WireError("08P01", f"unexpected message {type(message).__name__}")
        except Exception as err:
            self._error(err)
            self._skip_to_sync = True

    # -- startup and authentication -------------------------------------------------------------
    def _startup(self, message: p.FrontendMessage) -> None:
        if isinstance(message, p.SSLRequest):
            if self.ctx.tls_available and not self._tls:
                self._send(b"S")
                self.want_tls = True
            else:
                self._send(b"N")
            return
        if isinstance(message, p.GSSENCRequest):
            self._send(b"N")
            return
        if isinstance(message, p.CancelRequest):
            # Allowed in plaintext even when TLS is required, as Postgres does: libpq sends
            # cancels unencrypted, and the secret key it carries was sent over TLS.
            self.cancel_target = (message.pid, message.key)
            self.closed = True
            return
        if not isinstance(message, p.Startup):
            self.protocol_violation("expected a startup message")
            return
        if self.ctx.tls_required and not self._tls:
            # Before anything of the startup is read or answered: a plaintext client learns
            # nothing but that TLS is required, and never gets to send a password.
            self._send(p.error_response(
                "28000", "this server requires TLS: the connection is not encrypted",
                severity="FATAL",
                hint="connect with sslmode=require (or verify-ca / verify-full)"))
            self.closed = True
            return
        extensions = [k for k in message.params if k.startswith("_pq_.")]
        if message.version != p.PROTOCOL_3_0 or extensions:
            # 3.x with x > 0, or protocol extensions: say we speak 3.0 without them.
            self._send(p.negotiate_protocol_version(0, extensions))
        params = message.params
        self.user = params.get("user", "")
        if not self.user:
            self._fatal("28000", "no PostgreSQL user name specified in startup packet")
            return
        if "replication" in params and params["replication"].lower() not in ("false", "off",
                                                                             "0", "no"):
            self._fatal("28000", "replication connections are not supported by the proxy")
            return
        self.database = params.get("database") or self.user
        self.settings = _defaults(self.user)
        self.settings["application_name"] = params.get("application_name", "")
        options = params.get("options", "")
        for key, value in params.items():
            low = key.lower()
            if low in ("user", "database", "options", "replication", "client_encoding") or \
                    low.startswith("_pq_."):
                continue
            self._startup_setting(low, value)
        for match in re.finditer(r"(?:-c\s*|--)([A-Za-z0-9_.]+)=(\S+)", options):
            self._startup_setting(match.group(1).lower(), match.group(2).replace("\\ ", " "))
        if self.closed:
            return
        verifier = self.ctx.verifiers.get(self.user)
        self._scram = ScramExchange(verifier, self.user)
        self._send(p.authentication_sasl((MECHANISM,)))
        self._state = "sasl_initial"

    def _startup_setting(self, name: str, value: str) -> None:
        try:
            self._apply_setting(name, (value,))
        except ChorusError as err:
            self._fatal(err.sqlstate, err.message)

    def _authenticate(self, message: p.FrontendMessage) -> None:
        if not isinstance(message, p.Password):
            self._fatal("08P01", "expected a SASL response message")
            return
        assert self._scram is not None
        try:
            if self._state == "sasl_initial":
                mechanism, payload = p.parse_sasl_initial(message.data)
                if mechanism != MECHANISM:
                    self._fatal("28000", f"SASL mechanism {mechanism!r} is not supported; "
                                f"use {MECHANISM}")
                    return
                self._send(p.authentication_sasl_continue(self._scram.first(payload)))
                self._state = "sasl_final"
                return
            final = self._scram.final(message.data)
        except (ScramError, p.ProtocolViolation) as err:
            self._fatal("08P01", f"malformed SCRAM message: {err}")
            return
        except AuthenticationFailed:
            # The client is told nothing more (no user enumeration); the operator's log is.
            verifiers = self.ctx.verifiers
            why = "wrong_password" if verifiers.get(self.user) is not None else \
                "no_password" if self.user in verifiers else "unknown_user"
            self.ctx.engine.activity.login_failed("wire", self.user, why)
            self._fatal("28P01", f'password authentication failed for user "{self.user}"')
            return
        self._send(p.authentication_sasl_final(final))
        self._send(p.authentication_ok())
        self.authenticated = True
        self._state = "ready"
        for name in _REPORTED:
            self._send(p.parameter_status(name, self.settings[name.lower()]))
        self._send(p.backend_key_data(self.pid, self.secret))
        self._ready()
        log.info("analyst %r connected (pid %d)", self.user, self.pid)

    def _ready(self) -> None:
        self._send(p.ready_for_query(self.status))

    # -- errors ---------------------------------------------------------------------------------
    def _error(self, err: BaseException) -> None:
        if isinstance(err, ChorusError):
            code, message, hint = err.sqlstate, err.message, err.hint
        elif isinstance(err, CatalogError):
            code, message, hint = err.sqlstate, err.message, None
        elif isinstance(err, t.ParameterError):
            code, message, hint = "22P02", str(err), None
        else:
            log.exception("internal error in a wire session")
            code, message, hint = "XX000", "internal error in the proxy", \
                "this is a bug: the server log has the details"
        self._send(p.error_response(code, message, hint=hint))
        if self.status == "T":
            self.status = "E"

    # -- simple query protocol ------------------------------------------------------------------
    def _simple_query(self, sql: str) -> Generator[Work, Any, None]:
        try:
            statements = split_statements(sql)
        except Exception as err:
            self._error(err)
            self._ready()
            return
        if not statements:
            self._send(p.empty_query_response())
        for text in statements:
            try:
                prepared = self._prepare("", text, ())
                portal = _Portal(prepared, (), ())
                yield from self._run_portal(portal, describe=True, max_rows=0)
            except Exception as err:
                self._error(err)
                break
        if self.status == "I":
            self._portals.clear()
        self._ready()

    # -- extended query protocol ----------------------------------------------------------------
    def _prepare(self, name: str, sql: str, oids: tuple[int, ...]) -> _Prepared:
        if "\0" in sql:
            raise WireError("22021", "invalid byte sequence: the query contains a NUL byte")
        statement = classify(sql)
        tree = None
        inferred: tuple[int, ...] = ()
        if statement.kind == "query":
            found = route(statement.sql, self.ctx.table_names)
            target, tree = found.target, found.tree
            n = _parameter_count(tree) if tree is not None else _count_dollars(sql)
            n = max(n, len(oids))
            inferred = tuple((oids[i] if i < len(oids) and oids[i] else
                              _infer(tree, i + 1, self.ctx.columns) if tree is not None
                              else t.TEXT) for i in range(n))
        elif statement.kind == "explain":
            target = "command"
            n = max(_count_dollars(statement.sql), len(oids))
            inferred = tuple(oids[i] if i < len(oids) and oids[i] else t.TEXT for i in range(n))
        else:
            target = "command"
            if _count_dollars(sql) or oids:
                raise WireError("42P02", "parameters are not allowed in this statement")
        return _Prepared(name, sql, statement, tuple(oids), inferred, target, tree)

    def _parse(self, message: p.Parse) -> Generator[Work, Any, None]:
        if len(split_statements(message.sql)) > 1:
            raise WireError("42601", "cannot insert multiple commands into a prepared statement")
        if message.name and message.name in self._prepared:
            raise WireError("42P05", f'prepared statement "{message.name}" already exists')
        self._check_transaction(classify(message.sql))
        prepared = self._prepare(message.name, message.sql, message.param_oids)
        self._prepared[message.name] = prepared
        self._send(p.parse_complete())
        return
        yield  # a generator like the other handlers

    def _bind(self, message: p.Bind) -> None:
        prepared = self._prepared.get(message.statement)
        if prepared is None:
            raise WireError("26000", f'prepared statement "{message.statement}" does not exist')
        n = len(prepared.inferred)
        if len(message.params) != n:
            raise WireError("08P01", f"bind message supplies {len(message.params)} parameters, "
                            f"but prepared statement \"{prepared.name}\" requires {n}")
        formats = message.param_formats
        if len(formats) not in (0, 1, n):
            raise WireError("08P01", "bind message has a wrong number of parameter formats")
        values = []
        for i, raw in enumerate(message.params):
            fmt = formats[0] if len(formats) == 1 else formats[i] if formats else 0
            values.append(t.decode_parameter(raw, prepared.inferred[i], fmt == 1))
        if message.portal and message.portal in self._portals:
            raise WireError("42P03", f'cursor "{message.portal}" already exists')
        self._portals[message.portal] = _Portal(prepared, tuple(values), message.result_formats)
        self._send(p.bind_complete())

    def _describe(self, message: p.Describe) -> Generator[Work, Any, None]:
        if message.kind == "S":
            prepared = self._prepared.get(message.name)
            if prepared is None:
                raise WireError("26000", f'prepared statement "{message.name}" does not exist')
            self._send(p.parameter_description(prepared.inferred))
            fields = yield from self._fields(prepared, None)
            self._send_row_description(fields, ())
            return
        portal = self._portals.get(message.name)
        if portal is None:
            raise WireError("34000", f'portal "{message.name}" does not exist')
        portal.fields = yield from self._fields(portal.statement, portal.params)
        self._send_row_description(portal.fields, portal.formats)

    def _execute(self, message: p.Execute) -> Generator[Work, Any, None]:
        portal = self._portals.get(message.portal)
        if portal is None:
            raise WireError("34000", f'portal "{message.portal}" does not exist')
        yield from self._run_portal(portal, describe=False, max_rows=message.max_rows)

    # -- describing ---------------------------------------------------------------------------
    def _send_row_description(self, fields: tuple[Column, ...] | None,
                              formats: tuple[int, ...]) -> None:
        if fields is None:
            self._send(p.no_data())
            return
        self._send(p.row_description([
            p.Field(c.name, c.oid, t.TYPE_INFO.get(c.oid, ("", -1))[1], -1,
                    _format(formats, i)) for i, c in enumerate(fields)]))

    def _fields(self, prepared: _Prepared,
                params: tuple[Any, ...] | None) -> Generator[Work, Any, tuple[Column, ...] | None]:
        """Result columns of a statement, without running it (None: no rows)."""
        if prepared.fields is not None:
            return prepared.fields
        st = prepared.statement
        fields: tuple[Column, ...] | None
        if st.kind == "show":
            fields = self._show_fields(st.name)
        elif st.kind == "explain":
            fields = (Column("QUERY PLAN", t.TEXT),)
        elif st.kind != "query":
            fields = None
        elif prepared.target == "catalog" and prepared.tree is not None:
            tree = _bind_tree(prepared.tree, params or (None,) * len(prepared.inferred),
                              prepared.inferred)
            result = yield Work(lambda: self.ctx.catalog.run(_limit_zero(tree),
                                                             self.session_info()))
            fields = result.columns
        else:
            fields = yield Work(lambda: self._predict(prepared))
        prepared.fields = fields
        return fields

    def _predict(self, prepared: _Prepared) -> tuple[Column, ...] | None:
        """Names and wire types of an engine query's answer, from its shape alone."""
        tree = prepared.tree
        if tree is None:
            raise QuerySyntaxError("could not parse the query to describe it",
                                   hint="check the SQL syntax")
        if not isinstance(tree, exp.Query):
            return None  # not a query (the engine refuses it when it is executed)
        select = tree
        while isinstance(select, exp.SetOperation):
            select = select.this
        try:
            described = self.ctx.catalog.describe(tree)
        except CatalogError:
            described = None
        if not isinstance(select, exp.Select):
            if described is None:
                raise QuerySyntaxError("cannot describe this statement")
            return tuple(described)
        expressions = select.expressions
        star = any(isinstance(e, exp.Star) or (isinstance(e, exp.Column) and e.is_star)
                   for e in expressions)
        if star:
            if described is None:
                raise QuerySyntaxError("cannot describe this query")
            return tuple(described)
        out = []
        for i, node in enumerate(expressions):
            inner = node.unalias()
            base = described[i].oid if described is not None and len(described) == len(
                expressions) else None
            if isinstance(inner, exp.Count):
                oid = t.INT8
            elif inner.find(exp.AggFunc) is not None:
                oid = t.FLOAT8 if base in (None, t.INT8, t.INT4, t.INT2, t.FLOAT4, t.FLOAT8,
                                           t.NUMERIC) else base
            else:
                oid = base if base is not None else t.TEXT
            if oid in (t.INT4, t.INT2):
                oid = t.INT8
            elif oid in (t.FLOAT4, t.NUMERIC):
                oid = t.FLOAT8
            out.append(Column(column_name(node), oid))
        return tuple(out)

    def _show_fields(self, name: str) -> tuple[Column, ...]:
        if name == INTERVALS:
            return INTERVAL_FIELDS
        if name == "chorus.budget":
            return tuple(Column(n, o) for n, o in _BUDGET_COLUMNS)
        if name == "chorus.budget_full":
            return tuple(Column(n, o) for n, o in self._budget_full()[0])
        if name == "all":
            return (Column("name", t.TEXT), Column("setting", t.TEXT),
                    Column("description", t.TEXT))
        return (Column(name.split(".")[-1] if not name.startswith("chorus.") else name,
                       t.TEXT),)

    # -- running --------------------------------------------------------------------------------
    def _check_transaction(self, st: Statement) -> None:
        if self.status == "E" and st.kind not in ("rollback", "commit", "rollback_to", "empty"):
            raise WireError("25P02", "current transaction is aborted, commands ignored until "
                            "end of transaction block")

    def _run_portal(self, portal: _Portal, describe: bool,
                    max_rows: int) -> Generator[Work, Any, None]:
        st = portal.statement.statement
        self._check_transaction(st)
        if portal.done:
            self._send(p.command_complete(portal.tag))
            return
        if portal.rows is None:
            if st.kind == "empty":
                self._send(p.empty_query_response())
                portal.done = True
                return
            fields, rows, tag, notice = yield from self._run_statement(portal)
            if fields is None:
                self._send(notice)
                self._send(p.command_complete(tag))
                portal.done, portal.tag = True, tag
                return
            if describe:
                portal.fields = fields
                self._send_row_description(fields, portal.formats)
            elif portal.fields is None:
                # Executed without Describe: the statement's earlier description (if any)
                # fixes the types; otherwise the client reads what comes.
                portal.fields = portal.statement.fields or fields
            portal.rows, portal.tag = rows, tag
            self._send(notice)
        assert portal.rows is not None and portal.fields is not None
        end = len(portal.rows) if max_rows <= 0 else min(len(portal.rows),
                                                         portal.position + max_rows)
        oids = [c.oid for c in portal.fields]
        formats = [_format(portal.formats, i) for i in range(len(oids))]
        for row in portal.rows[portal.position:end]:
            self._send(p.data_row([_encode(v, oid, fmt)
                                   for v, oid, fmt in zip(row, oids, formats, strict=False)]))
        portal.position = end
        if end < len(portal.rows):
            self._send(p.portal_suspended())
            return
        portal.done = True
        self._send(p.command_complete(portal.tag))

    def _run_statement(self, portal: _Portal) -> Generator[
            Work, Any, tuple[tuple[Column, ...] | None, list[tuple[Any, ...]], str, bytes]]:
        """Run a statement: (fields or None, rows, command tag, notice bytes)."""
        prepared = portal.statement
        st = prepared.statement
        if st.kind == "query":
            if prepared.target == "catalog" and prepared.tree is not None:
                tree = _bind_tree(prepared.tree, portal.params, prepared.inferred)
                result = yield Work(lambda: self.ctx.catalog.run(tree, self.session_info()))
                return result.columns, result.rows, f"SELECT {len(result.rows)}", b""
            sql = self._engine_sql(prepared, portal.params)
            # The NOTICE does not list each block's budget left (SHOW chorus.budget does).
            answer: QueryResult = yield Work(lambda: self.ctx.engine.execute(
                sql, analyst=self.user, epsilon=self.epsilon, delta=self.delta,
                sensitivity=self.sensitivity, gamma=self.gamma, wait_seconds=self.wait_seconds,
                remaining=False, door="wire"))
            fields = tuple(Column(n, t.PORTABLE_OIDS.get(ty, t.TEXT))
                           for n, ty in zip(answer.columns, answer.types, strict=True))
            if portal.fields is not None or prepared.fields is not None:
                described = portal.fields or prepared.fields
                assert described is not None
                fields = described
            rows = [tuple(t.coerce(v, c.oid) for v, c in zip(row, fields, strict=False))
                    for row in answer.rows]
            notice = _report_notice(answer.report)
            self.last_answer = answer
            return fields, rows, f"SELECT {len(rows)}", notice
        if st.kind == "show" and st.name == INTERVALS:
            # Computed on demand, off the event loop (an AVG's interval is simulated).
            last = self.last_answer
            rows = [] if last is None else (yield Work(lambda: interval_rows(last)))
            return self._show_fields(st.name), rows, "SHOW", b""
        if st.kind == "explain":
            return (yield from self._explain(st, prepared, portal.params))
        return self._command(st)

    def _engine_sql(self, prepared: _Prepared, params: tuple[Any, ...]) -> str:
        if not params:
            return prepared.statement.sql
        # Parameters become literal nodes of the parsed tree, in the engine's dialect, never
        # pasted text: a value cannot change the shape of the query.
        tree = None
        if self.ctx.dialect == "postgres":
            tree = prepared.tree if prepared.tree is not None and \
                prepared.statement.kind == "query" else parse_postgres(prepared.statement.sql)
        if tree is None:
            try:
                tree = sqlglot.parse_one(prepared.statement.sql, read=self.ctx.dialect)
            except Exception as err:
                raise QuerySyntaxError(f"syntax error: {str(err).splitlines()[0]}") from None
        return _bind_tree(tree, params, prepared.inferred).sql(self.ctx.dialect)

    def _explain(self, st: Statement, prepared: _Prepared, params: tuple[Any, ...]) -> Generator[
            Work, Any, tuple[tuple[Column, ...], list[tuple[Any, ...]], str, bytes]]:
        inner = classify(st.sql)
        fields = (Column("QUERY PLAN", t.TEXT),)
        if inner.kind != "query":
            raise WireError("0A000", "EXPLAIN shows the privacy cost of a query; "
                            f"{inner.sql.split()[0].upper()} has none")
        found = route(inner.sql, self.ctx.table_names)
        if found.target == "catalog":
            lines = ["catalog query: answered by the proxy from its description of the policy's "
                     "tables; no data is read and no privacy budget is spent"]
            if st.explain_format == "json":
                lines = [json.dumps({"catalog": True, "epsilon": 0.0, "delta": 0.0})]
            return fields, [(line,) for line in lines], "EXPLAIN", b""
        sql = inner.sql
        if params:
            fake = dataclasses.replace(prepared, statement=inner)
            sql = self._engine_sql(fake, params)
        report: PrivacyReport = yield Work(lambda: self.ctx.engine.explain(
            sql, analyst=self.user, epsilon=self.epsilon, delta=self.delta,
            sensitivity=self.sensitivity, gamma=self.gamma, door="wire"))
        if st.explain_format == "json":
            rows = [(json.dumps(report.to_dict(), default=str),)]
        else:
            rows = [(line,) for line in explain_lines(report, self.ctx.dialect)]
        return fields, rows, "EXPLAIN", b""

    # -- session commands -----------------------------------------------------------------------
    def _command(self, st: Statement) -> tuple[tuple[Column, ...] | None,
                                               list[tuple[Any, ...]], str, bytes]:
        kind = st.kind
        if kind == "refuse":
            raise WireError("0A000" if "syntax" not in st.reason else "42601", st.reason)
        if kind == "set":
            if self.status == "E":
                raise WireError("25P02", "current transaction is aborted")
            self._apply_setting(st.name, st.values)
            return None, [], "SET", b""
        if kind == "reset":
            if st.name == "all":
                keep = {k: self.settings[k] for k in ("session_authorization",)}
                self.settings = _defaults(self.user) | keep
                self.epsilon = self.delta = self.gamma = self.sensitivity = None
                self.wait_seconds = None
            else:
                self._reset_setting(st.name)
            return None, [], st.tag or "RESET", b""
        if kind == "show":
            fields = self._show_fields(st.name)
            return fields, self._show_rows(st.name), "SHOW", b""
        if kind == "begin":
            if self.status == "T":
                return None, [], "BEGIN", p.notice_response(
                    "there is already a transaction in progress", code="25001",
                    severity="WARNING")
            self.status = "T"
            return None, [], "BEGIN", b""
        if kind in ("commit", "rollback"):
            tag = "ROLLBACK" if kind == "rollback" or self.status == "E" else "COMMIT"
            notice = b""
            if self.status == "I":
                notice = p.notice_response("there is no transaction in progress",
                                           code="25P01", severity="WARNING")
            self.status = "I"
            self._portals = {k: v for k, v in self._portals.items() if k == ""}
            return None, [], tag, notice
        if kind in ("savepoint", "release", "rollback_to"):
            if self.status == "I":
                raise WireError("25P01", f"{st.tag} can only be used in transaction blocks")
            if kind == "rollback_to":
                self.status = "T"
            return None, [], st.tag, b""
        if kind == "discard":
            if st.name == "all":
                self._prepared.clear()
                self._portals.clear()
                self.settings = _defaults(self.user)
                self.epsilon = self.delta = self.gamma = self.sensitivity = None
                self.wait_seconds = None
            return None, [], st.tag, b""
        if kind == "deallocate":
            if st.name.upper() == "ALL":
                self._prepared = {k: v for k, v in self._prepared.items() if k == ""}
            elif self._prepared.pop(st.name, None) is None:
                raise WireError("26000", f'prepared statement "{st.name}" does not exist')
            return None, [], st.tag, b""
        if kind == "noop":
            return None, [], st.tag, b""
        raise WireError("0A000", f"unsupported statement: {st.sql[:40]}")

    def _apply_setting(self, name: str, values: tuple[str, ...]) -> None:
        value = ", ".join(values)
        if name == "chorus.epsilon":
            self.epsilon = _positive(value, name)
            return
        if name == "chorus.delta":
            delta = _number(value, name)
            if not 0 <= delta < 1:
                raise WireError("22023", f"chorus.delta must be in [0, 1), got {value}")
            self.delta = delta
            return
        if name == "chorus.sensitivity":
            if value.lower() not in ("analytic", "sampled"):
                raise WireError("22023", "chorus.sensitivity must be 'analytic' or 'sampled', "
                                f"got {value}")
            self.sensitivity = value.lower()
            return
        if name == "chorus.wait_seconds":
            wait = _number(value, name)
            limit = self.ctx.engine.policy.privacy.scheduler.max_wait_seconds
            if not 0 <= wait <= limit:
                raise WireError("22023", f"chorus.wait_seconds must be in [0, {_g(limit)}] "
                                f"(the policy's scheduler.max_wait_seconds), got {value}")
            self.wait_seconds = wait
            return
        if name == "chorus.gamma":
            gamma = _number(value, name)
            if not 0 < gamma < 1:
                raise WireError("22023", f"chorus.gamma must be in (0, 1), got {value}")
            self.gamma = gamma
            return
        if name.startswith("chorus."):
            raise WireError("42704", f'unrecognized configuration parameter "{name}"',
                            hint="the proxy's settings are chorus.epsilon, chorus.delta, "
                            "chorus.sensitivity, chorus.gamma and chorus.wait_seconds")
        if name in _READ_ONLY_SETTINGS:
            raise WireError("55P02", f'parameter "{name}" cannot be changed')
        if name == "client_encoding" and value.lower() not in _UTF8:
            raise WireError("0A000", f"client encoding {value!r} is not supported: the proxy "
                            "speaks UTF8 only")
        if name == "client_encoding":
            value = "UTF8"
        if name == "datestyle" and not value.upper().startswith("ISO"):
            raise WireError("0A000", f"DateStyle {value!r} is not supported: the proxy writes "
                            "ISO dates")
        if name == "datestyle":
            value = "ISO, MDY" if "," not in value else value.upper()
        if name == "default_transaction_read_only" and value.lower() in ("off", "false", "0"):
            raise WireError("25006", "the proxy is read-only")
        self.settings[name] = value
        if name in _CANONICAL and self.authenticated:
            self._send(p.parameter_status(_CANONICAL[name], value))

    def _reset_setting(self, name: str) -> None:
        if name == "chorus.epsilon":
            self.epsilon = None
        elif name == "chorus.delta":
            self.delta = None
        elif name == "chorus.sensitivity":
            self.sensitivity = None
        elif name == "chorus.gamma":
            self.gamma = None
        elif name == "chorus.wait_seconds":
            self.wait_seconds = None
        elif name in _READ_ONLY_SETTINGS:
            raise WireError("55P02", f'parameter "{name}" cannot be changed')
        else:
            default = _defaults(self.user).get(name)
            if default is None:
                self.settings.pop(name, None)
            else:
                self.settings[name] = default
                if name in _CANONICAL:
                    self._send(p.parameter_status(_CANONICAL[name], default))

    def _show_rows(self, name: str) -> list[tuple[Any, ...]]:
        privacy = self.ctx.engine.policy.privacy
        if name == "chorus.epsilon":
            value = self.epsilon if self.epsilon is not None else privacy.default_epsilon
            return [(_g(value),)]
        if name == "chorus.delta":
            value = self.delta if self.delta is not None else privacy.default_delta
            return [(_g(value),)]
        if name == "chorus.sensitivity":
            return [(self.sensitivity or privacy.sensitivity,)]
        if name == "chorus.gamma":
            return [(_g(self.gamma if self.gamma is not None else privacy.default_gamma),)]
        if name == "chorus.wait_seconds":
            wait = self.wait_seconds
            return [(_g(wait if wait is not None
                        else self.ctx.engine.policy.privacy.scheduler.wait_seconds),)]
        if name == "chorus.analyst":
            return [(self.user,)]
        if name == "chorus.budget":
            return self._budget()
        if name == "chorus.budget_full":
            return self._budget_full()[1]
        if name == "all":
            rows = [(k, v, "") for k, v in sorted(self.settings.items())]
            rows += [("chorus.delta", self._show_rows("chorus.delta")[0][0],
                      "delta of each query (SET chorus.delta = ...)"),
                     ("chorus.epsilon", self._show_rows("chorus.epsilon")[0][0],
                      "epsilon of each query (SET chorus.epsilon = ...)"),
                     ("chorus.gamma", self._show_rows("chorus.gamma")[0][0],
                      "gamma of sampled-sensitivity queries (SET chorus.gamma = ...)"),
                     ("chorus.sensitivity", self._show_rows("chorus.sensitivity")[0][0],
                      "'analytic' or 'sampled' (random DP) (SET chorus.sensitivity = ...)"),
                     ("chorus.wait_seconds", self._show_rows("chorus.wait_seconds")[0][0],
                      "seconds a query waits for budget (SET chorus.wait_seconds = ...)")]
            return rows
        if name in self.settings:
            return [(self.settings[name],)]
        raise WireError("42704", f'unrecognized configuration parameter "{name}"')

    def _budget(self) -> list[tuple[Any, ...]]:
        """SHOW chorus.budget: one short row per block of the ledger (:data:`_BUDGET_COLUMNS`),
        rounded: what this analyst can still spend on it (their own limit per block or the
        block's budget, whichever binds), what they spent, what everyone spent."""
        rows = []
        for left, mine in self.ctx.engine.budget_left(self.user):
            rows.append((left.block, left.state, _round(left.epsilon_left),
                         "your limit" if left.binding == "analyst" else "block",
                         _round(mine), _round(left.epsilon_spent), _round(left.delta_left)))
        return rows

    def _budget_full(self) -> tuple[list[tuple[str, int]], list[tuple[Any, ...]]]:
        """SHOW chorus.budget_full: every field of every block of the ledger, as this session's
        analyst may see it: block totals, and only their own spending (``by_analyst_<name>``).
        The wire protocol has no data-owner login, so no wire session sees other analysts."""
        viewer = Viewer.of(self.user)
        blocks = [_flat(b) for b in self.ctx.engine.ledger.budget_view(viewer)]
        if not blocks:
            names = ["block", "epsilon_global", "epsilon_consumed", "epsilon_remaining"]
            return [(n, t.TEXT if n == "block" else t.FLOAT8) for n in names], []
        names = list(blocks[0])
        oids = []
        for n in names:
            sample = next((b.get(n) for b in blocks if b.get(n) is not None), None)
            oids.append(t.FLOAT8 if isinstance(sample, int | float) and not isinstance(
                sample, bool) else t.TEXT)
        rows = [tuple(t.coerce(b.get(n), o) if o == t.FLOAT8 else
                      (None if b.get(n) is None else str(b.get(n)))
                      for n, o in zip(names, oids, strict=True)) for b in blocks]
        return list(zip(names, oids, strict=True)), rows


# -- helpers ------------------------------------------------------------------------------------


def _format(formats: tuple[int, ...], i: int) -> int:
    if not formats:
        return 0
    return formats[0] if len(formats) == 1 else formats[i] if i < len(formats) else 0


def _encode(value: Any, oid: int, fmt: int) -> bytes | None:
    if value is None:
        return None
    try:
        return t.encode_binary(value, oid) if fmt == 1 else t.encode_text(value, oid)
    except (TypeError, ValueError, AttributeError, OverflowError):
        log.warning("value %r does not fit its described type %d; sent as NULL",
                    type(value).__name__, oid)
        return None


#: The columns of SHOW chorus.budget (SHOW chorus.budget_full has every field of the ledger).
_BUDGET_COLUMNS = (("block", t.TEXT), ("state", t.TEXT), ("epsilon_left", t.FLOAT8),
                   ("limited_by", t.TEXT), ("your_epsilon_spent", t.FLOAT8),
                   ("epsilon_spent", t.FLOAT8), ("delta_left", t.FLOAT8))


def _round(value: float) -> float:
    """Four significant digits: a budget shown, not a budget computed with."""
    return float(f"{value:.4g}")


def _g(value: float) -> str:
    return repr(float(value)) if not float(value).is_integer() else f"{value:g}"


def _number(value: str, name: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise WireError("22023", f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise WireError("22023", f"{name} must be finite, got {value!r}")
    return number


def _positive(value: str, name: str) -> float:
    number = _number(value, name)
    if number <= 0:
        raise WireError("22023", f"{name} must be positive, got {value!r}")
    return number


def _flat(raw: dict[str, Any]) -> dict[str, Any]:
    """A ledger block view as flat columns (nested {"epsilon": .., "delta": ..} -> x_epsilon...)."""
    flat: dict[str, Any] = {}
    for key, value in raw.items():
        if isinstance(value, dict):
            for sub, item in value.items():
                flat[f"{key}_{sub}"] = item
        elif isinstance(value, list | tuple):
            flat[key] = json.dumps(value, default=str)
        else:
            flat[key] = value
    return flat


def _count_dollars(sql: str) -> int:
    found = [int(m) for m in re.findall(r"\$(\d+)", sql)]
    return max(found, default=0)


def _placeholder_index(node: exp.Expr) -> int | None:
    if isinstance(node, exp.Parameter) and isinstance(node.this, exp.Literal):
        return int(node.this.this) if str(node.this.this).isdigit() else None
    if isinstance(node, exp.Placeholder):
        value = node.this
        return int(value) if value is not None and str(value).isdigit() else None
    return None


def _parameter_count(tree: exp.Expr) -> int:
    return max((i for n in tree.find_all(exp.Parameter, exp.Placeholder)
                if (i := _placeholder_index(n)) is not None), default=0)


_CAST_OIDS = {exp.DType.BIGINT: t.INT8, exp.DType.INT: t.INT4, exp.DType.SMALLINT: t.INT2,
              exp.DType.DOUBLE: t.FLOAT8, exp.DType.FLOAT: t.FLOAT4,
              exp.DType.DECIMAL: t.NUMERIC, exp.DType.BOOLEAN: t.BOOL,
              exp.DType.DATE: t.DATE, exp.DType.TIMESTAMP: t.TIMESTAMP,
              exp.DType.TIMESTAMPTZ: t.TIMESTAMPTZ, exp.DType.TEXT: t.TEXT,
              exp.DType.VARCHAR: t.VARCHAR}


def _infer(tree: exp.Expr, index: int, columns: Mapping[str, Mapping[str, int]]) -> int:
    """The type Postgres would infer for parameter ``$index`` (text when it cannot tell)."""
    for node in tree.find_all(exp.Parameter, exp.Placeholder):
        if _placeholder_index(node) != index:
            continue
        parent = node.parent
        if isinstance(parent, exp.Cast | exp.TryCast):
            return _CAST_OIDS.get(parent.to.this, t.TEXT)
        if isinstance(parent, exp.Limit | exp.Offset | exp.Fetch):
            return t.INT8
        other: exp.Expr | None = None
        if isinstance(parent, exp.Binary):
            other = parent.expression if parent.this is node else parent.this
        elif isinstance(parent, exp.In | exp.Between):
            other = parent.this
        if isinstance(other, exp.Column):
            oid = _column_oid(other, columns)
            if oid is not None:
                return oid
        if isinstance(other, exp.Literal) and not other.is_string:
            return t.FLOAT8
    return t.TEXT


def _column_oid(column: exp.Column, columns: Mapping[str, Mapping[str, int]]) -> int | None:
    name, table = column.name.lower(), column.table.lower()
    if table in columns and name in columns[table]:
        return columns[table][name]
    found = {cols[name] for cols in columns.values() if name in cols}
    return found.pop() if len(found) == 1 else None


def _literal(value: Any, oid: int) -> exp.Expr:
    """A SQL literal node for a decoded parameter value."""
    if value is None:
        return exp.Null()
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, int):
        node: exp.Expr = exp.Literal.number(str(value))
        return exp.Paren(this=node) if value < 0 else node
    if isinstance(value, float | Decimal):
        if not math.isfinite(float(value)):
            text = "NaN" if math.isnan(float(value)) else (
                "Infinity" if float(value) > 0 else "-Infinity")
            return exp.Cast(this=exp.Literal.string(text), to=exp.DataType.build("DOUBLE"))
        text = repr(value) if isinstance(value, float) else str(value)
        node = exp.Literal.number(text)
        return exp.Paren(this=node) if float(value) < 0 else node
    if hasattr(value, "isoformat"):
        kind = "TIMESTAMP" if hasattr(value, "hour") else "DATE"
        return exp.Cast(this=exp.Literal.string(value.isoformat(sep=" ") if kind == "TIMESTAMP"
                                                else value.isoformat()),
                        to=exp.DataType.build(kind))
    text = str(value)
    if "\0" in text:
        raise WireError("22021", "invalid byte sequence: a parameter contains a NUL byte")
    return exp.Literal.string(text)


def _bind_tree(tree: exp.Expr, params: tuple[Any, ...], oids: tuple[int, ...]) -> exp.Expr:
    """A copy of ``tree`` with each $n placeholder replaced by the literal of its value."""
    tree = tree.copy()
    for node in list(tree.find_all(exp.Parameter, exp.Placeholder)):
        index = _placeholder_index(node)
        if index is None or not 1 <= index <= len(params):
            raise WireError("42P02", f"there is no parameter ${index}")
        node.replace(_literal(params[index - 1], oids[index - 1]))
    return tree


def _limit_zero(tree: exp.Expr) -> exp.Expr:
    if isinstance(tree, exp.Select):
        return tree.limit(0, copy=True)
    return exp.select("*").from_(exp.Subquery(this=tree.copy(), alias="q")).limit(0)


def _report_notice(report: PrivacyReport) -> bytes:
    """The privacy report of an answer as a NOTICE (message: the cost; detail: the noise)."""
    if report.noise == "none":
        return p.notice_response(
            "chorus: public tables only: answered exactly, no privacy budget spent")
    blocks = report.blocks
    span = f"{blocks[0]} .. {blocks[-1]}" if len(blocks) > 1 else ", ".join(blocks) or "none"
    charged = "charged" if report.charged else "would charge"
    message = (f"chorus: {charged} epsilon={report.epsilon:g} delta={report.delta:g} to analyst "
               f"{report.analyst} on {len(blocks)} block(s) [{span}]")
    lines = []
    for col in report.columns:
        if col.role == "aggregate" and col.scale is not None and col.error_bound_95 is None:
            # No error bound in values (a DP quantile: its note gives the bound in ranks).
            lines.append(f"{col.name}: {col.mechanism}, scale {col.scale:.4g}"
                         + (f", {col.note}" if col.note else ""))
        elif col.role == "aggregate" and col.scale is not None:
            lines.append(f"{col.name}: {col.mechanism} noise, scale {col.scale:.4g}, 95% error "
                         f"within +-{col.error_bound_95:.4g}")
        elif col.role == "derived":
            lines.append(f"{col.name}: {col.note}")
    if report.random_dp is not None:
        lines.append(f"random DP with gamma={report.random_dp.gamma:g}: sensitivity sampled "
                     f"({shown(report.random_dp.sensitivity)}), not proven")
    if report.key_release is not None and report.key_release.method == "threshold":
        lines.append(f"group keys released when their noisy count exceeds "
                     f"{report.key_release.threshold:.1f}")
    lines += [f"warning: {w}" for w in report.warnings]
    lines.append(f"95% intervals of every noisy cell (bias of caps and clipping included): "
                 f"SHOW {INTERVALS}")
    return p.notice_response(message, detail="\n".join(lines))


#: SHOW chorus.intervals: the 95% interval of every noisy cell of the session's last answer.
INTERVALS = "chorus.intervals"
INTERVAL_FIELDS = (Column("row", t.INT8), Column("column", t.TEXT), Column("value", t.FLOAT8),
                   Column("lower", t.FLOAT8), Column("upper", t.FLOAT8),
                   Column("noise_lower", t.FLOAT8), Column("noise_upper", t.FLOAT8),
                   Column("interval", t.TEXT))


def interval_rows(answer: QueryResult) -> list[tuple[Any, ...]]:
    """One row per noisy cell of ``answer`` (rows numbered from 1): its estimate, the 95%
    interval with the bias of caps and clipping (``lower``/``upper``) and without it (noise
    alone), and the text ``chorus query`` prints.  Cells without an interval give their reason
    as the text; group keys and constants (no interval at all) are left out.  Post-processing
    of released values and public scales: free."""
    out: list[tuple[Any, ...]] = []
    for number, cells in enumerate(answer.intervals(), start=1):
        for name, iv in zip(answer.columns, cells, strict=True):
            found = interval_dict(iv)
            if found is None:
                continue
            value = getattr(iv, "estimate", None)
            out.append((number, name, value, found["lower"], found["upper"],
                        found.get("noise_lower"), found.get("noise_upper"), found["text"]))
    return out


def explain_lines(report: PrivacyReport, dialect: str | None = None) -> list[str]:
    """The DP explanation as text lines (the rows of EXPLAIN): one fact per row, details
    indented under their heading, the rewritten SQL laid out over rows (pretty-printed in
    ``dialect`` when given), so psql and notebooks show it without a very wide row."""
    lines = [f"verdict: {report.verdict}",
             f"cost: epsilon={report.epsilon:g} delta={report.delta:g} (nothing is charged by "
             "EXPLAIN)"]
    blocks = report.blocks
    if blocks:
        span = f"{blocks[0]} .. {blocks[-1]}" if len(blocks) > 1 else blocks[0]
        lines.append(f"blocks: {len(blocks)} [{span}]")
    if report.stability is not None:
        unit = report.privacy_unit
        lines.append(f"stability: {report.stability}" + (
            f" (at most {report.stability} rows per {unit})" if unit else " (event level)"))
    for m in report.measurements:
        mech = m.mechanism
        lines += [f"measurement {m.id} = {m.aggregate}",
                  f"  sensitivity {shown(m.sensitivity)}: {m.derivation}",
                  f"  {mech.get('name')} noise: epsilon={mech.get('epsilon', 0):.4g}, scale "
                  f"{shown(mech.get('scale', 0))}, 95% error within +-{shown(m.error_bound_95)}"]
    for col in report.columns:
        if col.role == "aggregate":
            lines.append(f"column {col.name}: {col.mechanism}, scale {shown(col.scale)}, 95% "
                         f"error within +-{shown(col.error_bound_95)}")
        elif col.role == "derived":
            lines.append(f"column {col.name}: {col.note}")
        else:
            lines.append(f"column {col.name}: {col.role} ({col.source})")
    if report.key_release is not None:
        kr = report.key_release
        lines.append(f"group keys: {kr.method}" + (
            f", released when the noisy count exceeds {kr.threshold:.1f}"
            if kr.threshold is not None else "") + (f"; {kr.note}" if kr.note else ""))
    lines += elastic_lines(report)
    if report.random_dp is not None:
        r = report.random_dp
        lines.append(f"random DP: (epsilon, delta, gamma) = ({report.epsilon:g}, "
                     f"{report.delta:g}, {r.gamma:g}); sampled sensitivity {shown(r.sensitivity)}"
                     f" = the k = {r.k}-th of m = {r.m} samples, rho = {r.rho:.4g}, n = {r.n} "
                     f"({r.n_source}); P: {r.distribution}")
        if r.note:
            lines.append(f"random DP: {r.note}")
    lines += [f"note: {n}" for n in report.notes]
    lines += [f"warning: {w}" for w in report.warnings]
    if report.rewritten_sql:
        lines.append("rewritten SQL:")
        lines += [f"  {line}" for line in _sql_rows(report.rewritten_sql, dialect)]
    return lines


#: The widest row the rewritten SQL is wrapped to when it cannot be pretty-printed.
_SQL_WIDTH = 100


def _sql_rows(sql: str, dialect: str | None) -> list[str]:
    """The rewritten SQL as rows: sqlglot's layout in ``dialect``, else wrapped at spaces."""
    if dialect is not None:
        try:
            return sqlglot.transpile(sql, read=dialect, write=dialect, pretty=True)[0] \
                .splitlines()
        except Exception:  # its own text is shown, wrapped, rather than no text
            log.debug("the rewritten SQL did not pretty-print", exc_info=True)
    return textwrap.wrap(sql, _SQL_WIDTH, break_long_words=False, break_on_hyphens=False)
