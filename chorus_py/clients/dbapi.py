"""A Python DB-API 2.0 (PEP 249) driver for the proxy, in-process or over REST.

In-process, on the engine of a policy file (an embedded DuckDB needs no server)::

    import chorus_py
    with chorus_py.connect(policy="policy.toml", analyst="alice", epsilon=0.1) as conn:
        cur = conn.cursor()
        cur.execute("SELECT city, COUNT(*) FROM trips WHERE fare > :fare GROUP BY city",
                    {"fare": 20})
        rows = cur.fetchall()
        print(cur.privacy_report.epsilon, cur.privacy_report.blocks[:3])

Remote, through a proxy's REST endpoint (the token decides the analyst)::

    conn = chorus_py.connect("http://127.0.0.1:8000", token="demo-token")

Parameters use the ``named`` style (``:name``).  They are bound as SQL literals in the parsed
statement (sqlglot), never pasted into the text.  Every ``execute`` is one differentially private
query: it charges the privacy budget, and ``commit``/``rollback`` cannot give it back (they are
no-ops: the proxy never writes).  Connections opened in one process on the same policy file share
one engine, so they share one budget ledger.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import os
import threading
import time
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import sqlglot
from sqlglot import exp

from chorus_py.errors import (
    ChorusError,
    DatabaseError,
    DataError,
    IntegrityError,
    InterfaceError,
    InternalError,
    NotSupportedError,
    OperationalError,
    ProgrammingError,
    QuerySyntaxError,
    Warning,
    lookup,
)
from chorus_py.report import PrivacyReport, interval_dict

__all__ = [
    "BINARY", "DATETIME", "NUMBER", "ROWID", "STRING", "Binary", "Connection", "Cursor",
    "DataError", "DatabaseError", "Date", "DateFromTicks", "Error", "IntegrityError",
    "InterfaceError", "InternalError", "NotSupportedError", "OperationalError",
    "ProgrammingError", "Time", "TimeFromTicks", "Timestamp", "TimestampFromTicks", "Warning",
    "apilevel", "bind_parameters", "connect", "paramstyle", "threadsafety",
]

#: PEP 249 module globals.
apilevel = "2.0"
#: Threads may share the module and connections, not cursors.
threadsafety = 2
#: ``WHERE city = :city``, with a mapping of values.
paramstyle = "named"

Error = ChorusError


class InvalidAuthorization(OperationalError, code="28000"):
    """The proxy did not accept the credentials (missing or unknown token)."""


class ProgramLimitExceeded(ProgrammingError, code="54000"):
    """The request is larger than the proxy accepts."""


# -- types (PEP 249 type objects and constructors) --------------------------------------------

class DBAPITypeObject:
    """Compares equal to every ``type_code`` (a portable type name) of its family."""

    def __init__(self, name: str, *type_codes: str) -> None:
        self.name = name
        self.type_codes = frozenset(type_codes)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DBAPITypeObject):
            return self.type_codes == other.type_codes
        return isinstance(other, str) and other.lower() in self.type_codes

    def __hash__(self) -> int:
        return hash(self.type_codes)

    def __repr__(self) -> str:
        return f"<DBAPITypeObject {self.name}>"


STRING = DBAPITypeObject("STRING", "text", "varchar", "char", "string", "uuid", "json")
BINARY = DBAPITypeObject("BINARY", "blob", "bytea", "binary", "varbinary")
NUMBER = DBAPITypeObject("NUMBER", "integer", "float", "numeric", "decimal", "boolean")
DATETIME = DBAPITypeObject("DATETIME", "timestamp", "date", "time", "timestamptz", "interval")
ROWID = DBAPITypeObject("ROWID", "rowid", "oid")

Date = dt.date
Time = dt.time
Timestamp = dt.datetime
Binary = bytes


def DateFromTicks(ticks: float) -> dt.date:
    """The local date of a Unix time."""
    return dt.date(*time.localtime(ticks)[:3])


def TimeFromTicks(ticks: float) -> dt.time:
    """The local time of day of a Unix time."""
    return dt.time(*time.localtime(ticks)[3:6])


def TimestampFromTicks(ticks: float) -> dt.datetime:
    """The local date and time of a Unix time."""
    return dt.datetime(*time.localtime(ticks)[:6])


# -- parameters -------------------------------------------------------------------------------

def _literal(name: str, value: Any) -> exp.Expr:
    """A SQL literal for one parameter value (never SQL text from the caller)."""
    if value is None:
        return exp.null()
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, int):
        return exp.Literal.number(value)
    if isinstance(value, float | Decimal):
        if not math.isfinite(value):
            raise DataError(f"parameter :{name} is {value}, which SQL cannot represent")
        return exp.Literal.number(repr(value) if isinstance(value, float) else str(value))
    if isinstance(value, str):
        if "\x00" in value:
            raise DataError(f"parameter :{name} contains a NUL character")
        return exp.Literal.string(value)
    if isinstance(value, dt.datetime):
        kind = "TIMESTAMPTZ" if value.tzinfo is not None else "TIMESTAMP"
        return exp.cast(exp.Literal.string(value.isoformat(sep=" ")), kind)
    if isinstance(value, dt.date):
        return exp.cast(exp.Literal.string(value.isoformat()), "DATE")
    if isinstance(value, dt.time):
        return exp.cast(exp.Literal.string(value.isoformat()), "TIME")
    if isinstance(value, bytes | bytearray | memoryview):
        raise NotSupportedError(f"parameter :{name}: binary values cannot be bound",
                                hint="the proxy answers aggregates; compare text or numbers")
    raise ProgrammingError(
        f"parameter :{name}: cannot bind a value of type {type(value).__name__}",
        hint="bind None, bool, int, float, Decimal, str, date, time or datetime; for IN lists "
        "write IN (:a, :b)")


def bind_parameters(sql: str, parameters: Mapping[str, Any] | Sequence[Any] | None,
                    dialect: str) -> str:
    """Replace ``:name`` placeholders with literals in the parsed SQL; return the new SQL.

    >>> bind_parameters("SELECT COUNT(*) FROM t WHERE city = :c AND n > :n",
    ...                 {"c": "O'Hare", "n": 3}, "duckdb")
    "SELECT COUNT(*) FROM t WHERE city = 'O''Hare' AND n > 3"
    """
    if parameters is None:
        return sql
    if isinstance(parameters, Mapping):
        values = dict(parameters)
    elif isinstance(parameters, Sequence) and not isinstance(parameters, str | bytes):
        if parameters:
            raise ProgrammingError(
                "parameters must be a mapping: the paramstyle is 'named'",
                hint="write WHERE city = :city and pass {'city': 'SF'}")
        values = {}
    else:
        raise ProgrammingError("parameters must be a mapping such as {'city': 'SF'}")
    if not values:
        return sql
    try:
        statements = sqlglot.parse(sql, read=dialect)
    except (sqlglot.errors.ParseError, sqlglot.errors.TokenError) as err:
        raise QuerySyntaxError(f"the SQL does not parse: {str(err).splitlines()[0]}") from None
    out = []
    for tree in statements:
        if tree is None:
            continue
        for node in list(tree.find_all(exp.Placeholder)):
            name = node.this if isinstance(node.this, str) else ""
            if not name or name == "?":
                raise ProgrammingError("only named placeholders (:name) can be bound",
                                       hint="the paramstyle is 'named'")
            if name not in values:
                raise ProgrammingError(f"no value given for parameter :{name}")
            node.replace(_literal(name, values[name]))
        out.append(tree.sql(dialect))
    return ";\n".join(out)


# -- reports ----------------------------------------------------------------------------------

def _build(tp: Any, value: Any) -> Any:
    """Rebuild a report dataclass (or a tuple / optional of one) from its JSON form."""
    if value is None:
        return None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return _build(inner[0], value) if len(inner) == 1 else value
    if origin is tuple:
        args = typing.get_args(tp)
        return tuple(_build(args[0] if args else Any, v) for v in value)
    if dataclasses.is_dataclass(tp) and isinstance(value, Mapping):
        hints = typing.get_type_hints(tp)
        known = {f.name for f in dataclasses.fields(tp)}
        return tp(**{k: _build(hints[k], v) for k, v in value.items() if k in known})
    return value


def report_from_dict(data: Mapping[str, Any]) -> PrivacyReport:
    """A :class:`PrivacyReport` from ``PrivacyReport.to_dict()`` output (unknown keys ignored)."""
    report = _build(PrivacyReport, data)
    assert isinstance(report, PrivacyReport)
    return report


# -- transports -------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Answer:
    columns: tuple[str, ...]
    types: tuple[str, ...]
    rows: list[tuple[Any, ...]]
    report: PrivacyReport
    # Per row, per column: the cell's 95% interval as JSON (report.interval_dict), on demand.
    intervals: Callable[[], list[tuple[dict[str, Any] | None, ...]]]


_engines: dict[tuple[str, int], Any] = {}
_engines_lock = threading.Lock()


def _shared_engine(policy: str | os.PathLike[str]) -> Any:
    """One engine (and budget ledger) per policy file per process, kept for the process."""
    from chorus_py.engine import Engine

    path = Path(policy).expanduser().resolve()
    try:
        stamp = path.stat().st_mtime_ns
    except OSError:
        stamp = 0  # load_policy reports the missing file
    with _engines_lock:
        engine = _engines.get((str(path), stamp))
        if engine is None:
            engine = Engine.from_policy(path)
            _engines[(str(path), stamp)] = engine
        return engine


class _Local:
    """The engine in this process."""

    def __init__(self, engine: Any, analyst: str | None) -> None:
        self.engine = engine
        self.dialect: str = engine.dialect
        self.analyst = engine._analyst(analyst)  # fail at connect time on an unknown analyst

    def execute(self, sql: str, epsilon: float | None, delta: float | None,
                wait_seconds: float | None, **options: Any) -> _Answer:
        result = self.engine.execute(sql, analyst=self.analyst, epsilon=epsilon, delta=delta,
                                     wait_seconds=wait_seconds, door="dbapi", **options)
        return _Answer(tuple(result.columns), tuple(result.types), list(result.rows),
                       result.report, lambda: [tuple(interval_dict(iv) for iv in row)
                                               for row in result.intervals()])

    def explain(self, sql: str, epsilon: float | None, delta: float | None,
                **options: Any) -> PrivacyReport:
        return self.engine.explain(sql, analyst=self.analyst, epsilon=epsilon, delta=delta,
                                   door="dbapi", **options)

    def tables(self) -> dict[str, dict[str, str]]:
        out = {n: {c: cp.type for c, cp in t.columns.items()}
               for n, t in self.engine.policy.tables.items()}
        for name, columns in self.engine.public_columns.items():
            out[name] = {**dict(columns), **out.get(name, {})}
        return out

    def budget(self) -> list[dict[str, Any]]:
        from budget.ledger import Viewer

        # The same view as SHOW chorus.budget and GET /v1/budget give this analyst.
        return self.engine.ledger.budget_view(Viewer.of(self.analyst))

    def close(self) -> None:
        """The engine is shared: it stays open."""


def _parse_value(type_code: str, value: Any) -> Any:
    if isinstance(value, str):
        try:
            if type_code == "timestamp":
                return dt.datetime.fromisoformat(value)
            if type_code == "date":
                return dt.date.fromisoformat(value)
        except ValueError:
            return value
    return value


class _Remote:
    """A proxy's REST endpoint, through httpx."""

    def __init__(self, url: str, token: str, analyst: str | None, timeout: float) -> None:
        import httpx

        self._httpx = httpx
        self.url = url.rstrip("/")
        self.client = httpx.Client(
            base_url=self.url, timeout=timeout,
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json",
                     "User-Agent": "chorus-py-dbapi"})
        try:
            info = self._request("GET", "/v1/info")
        except BaseException:
            self.client.close()
            raise
        if info.get("analyst") is None:
            self.client.close()
            raise InterfaceError("this token is not an analyst's token",
                                 hint="the data owner's token cannot run queries")
        if analyst is not None and analyst != info["analyst"]:
            self.client.close()
            raise InterfaceError(f"the token belongs to analyst {info['analyst']!r}, "
                                 f"not {analyst!r}")
        self.analyst: str = info["analyst"]
        self.dialect: str = info["dialect"]
        self.info = info

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        httpx = self._httpx
        try:
            response = self.client.request(method, path, json=body)
        except httpx.TimeoutException:
            raise OperationalError(f"the proxy at {self.url} did not answer in time",
                                   hint="the query may still have been charged") from None
        except httpx.HTTPError as err:
            raise OperationalError(f"cannot reach the proxy at {self.url}: {err}") from None
        if response.status_code >= 400:
            raise _problem_error(response.status_code, response)
        try:
            return response.json()
        except ValueError:
            raise InterfaceError(f"the proxy at {self.url} answered something other than "
                                 "JSON") from None

    def execute(self, sql: str, epsilon: float | None, delta: float | None,
                wait_seconds: float | None, **options: Any) -> _Answer:
        body = _body(sql, epsilon, delta) | options
        if wait_seconds is not None:
            body["wait_seconds"] = wait_seconds
        data = self._request("POST", "/v1/query", body)
        kinds = tuple(data["types"])
        rows = [tuple(_parse_value(k, v) for k, v in zip(kinds, row, strict=False))
                for row in data["rows"]]
        intervals = [tuple(row) for row in data.get("intervals") or ()]
        return _Answer(tuple(data["columns"]), kinds, rows, report_from_dict(data["report"]),
                       lambda: intervals)

    def explain(self, sql: str, epsilon: float | None, delta: float | None,
                **options: Any) -> PrivacyReport:
        data = self._request("POST", "/v1/explain", _body(sql, epsilon, delta) | options)
        return report_from_dict(data["report"])

    def tables(self) -> dict[str, dict[str, str]]:
        return {n: {c: v["type"] for c, v in t["columns"].items()}
                for n, t in self.info["tables"].items()}

    def budget(self) -> list[dict[str, Any]]:
        return list(self._request("GET", "/v1/budget")["blocks"])

    def close(self) -> None:
        self.client.close()


def _body(sql: str, epsilon: float | None, delta: float | None) -> dict[str, Any]:
    body: dict[str, Any] = {"sql": sql}
    if epsilon is not None:
        body["epsilon"] = epsilon
    if delta is not None:
        body["delta"] = delta
    return body


def _sampling(conn: Connection, sensitivity: str | None,
              gamma: float | None) -> dict[str, Any]:
    """The random-DP options of one query: its own, else the connection's (unset: omitted)."""
    options = {"sensitivity": conn.sensitivity if sensitivity is None else sensitivity,
               "gamma": conn.gamma if gamma is None else gamma}
    return {k: v for k, v in options.items() if v is not None}


def _problem_error(status: int, response: Any) -> ChorusError:
    """The exception of an RFC 9457 problem answer, by its SQLSTATE (else its HTTP status)."""
    try:
        data = response.json()
    except ValueError:
        data = {}
    if not isinstance(data, dict):
        data = {}
    detail = str(data.get("detail") or f"the proxy answered HTTP {status}")
    hint = data.get("hint")
    sqlstate = data.get("sqlstate")
    cls: type[ChorusError] = lookup(sqlstate) if isinstance(sqlstate, str) \
        else ChorusError
    if cls is ChorusError:
        cls = (InvalidAuthorization if status == 401 else
               OperationalError if status >= 500 else ProgrammingError)
    err = cls(detail, hint=hint if isinstance(hint, str) else None)
    err.status = status  # type: ignore[attr-defined]
    return err


# -- connection and cursor --------------------------------------------------------------------

class Connection:
    """A DB-API connection to the proxy; every query charges the privacy budget."""

    Warning = Warning
    Error = Error
    InterfaceError = InterfaceError
    DatabaseError = DatabaseError
    DataError = DataError
    OperationalError = OperationalError
    IntegrityError = IntegrityError
    InternalError = InternalError
    ProgrammingError = ProgrammingError
    NotSupportedError = NotSupportedError

    def __init__(self, transport: _Local | _Remote, epsilon: float | None = None,
                 delta: float | None = None, wait_seconds: float | None = None,
                 sensitivity: str | None = None, gamma: float | None = None) -> None:
        self._transport: _Local | _Remote | None = transport
        #: Default privacy parameters of this connection's queries (None: the policy's).
        self.epsilon = epsilon
        self.delta = delta
        #: "sampled" opts in to sensitivity sampling (random DP, with ``gamma``); None: policy.
        self.sensitivity = sensitivity
        self.gamma = gamma
        #: How long a query waits for budget the scheduler cannot grant at once (None: policy).
        self.wait_seconds = wait_seconds

    @property
    def analyst(self) -> str:
        """The analyst every query of this connection is charged to."""
        return self._open().analyst

    @property
    def dialect(self) -> str:
        """The backend's SQL dialect (``duckdb`` or ``postgres``)."""
        return self._open().dialect

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._transport is None

    def _open(self) -> _Local | _Remote:
        if self._transport is None:
            raise InterfaceError("the connection is closed")
        return self._transport

    def close(self) -> None:
        """Close the connection (a second close does nothing)."""
        if self._transport is not None:
            self._transport.close()
            self._transport = None

    def commit(self) -> None:
        """Nothing to commit: the proxy never writes."""
        self._open()

    def rollback(self) -> None:
        """Nothing to roll back. Spent privacy budget is never given back."""
        self._open()

    def cursor(self) -> Cursor:
        """A new cursor."""
        self._open()
        return Cursor(self)

    def tables(self) -> dict[str, dict[str, str]]:
        """Tables an analyst may query, with their columns' types (extension)."""
        return self._open().tables()

    def budget(self) -> list[dict[str, Any]]:
        """Every block of the ledger as this connection's analyst may see it (extension): the
        block's totals (``epsilon_consumed``, ``epsilon_remaining``...) and, in ``by_analyst``,
        only this analyst's own spending, never another analyst's."""
        return self._open().budget()

    def __enter__(self) -> Connection:
        self._open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Cursor:
    """Runs queries and holds one noisy result set plus its :class:`PrivacyReport`."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.arraysize = 1
        self._answer: _Answer | None = None
        self._position = 0
        self._closed = False
        #: The privacy report of the last ``execute`` (what it cost, how it was answered).
        self.privacy_report: PrivacyReport | None = None

    # -- PEP 249 attributes
    @property
    def description(self) -> tuple[tuple[Any, ...], ...] | None:
        """One 7-tuple per column: (name, type_code, None, None, None, None, None).

        ``type_code`` is the portable type name (``integer``, ``float``, ``text``, ``date``,
        ``timestamp``, ``boolean``); it compares equal to NUMBER, STRING, DATETIME.
        """
        if self._answer is None:
            return None
        return tuple((name, kind, None, None, None, None, None)
                     for name, kind in zip(self._answer.columns, self._answer.types,
                                           strict=False))

    @property
    def rowcount(self) -> int:
        """Rows in the last result set (-1 before any execute)."""
        return -1 if self._answer is None else len(self._answer.rows)

    @property
    def rownumber(self) -> int | None:
        """Index of the next row to fetch (extension)."""
        return None if self._answer is None else self._position

    lastrowid = None

    @property
    def closed(self) -> bool:
        """True after :meth:`close` or once the connection is closed."""
        return self._closed or self.connection.closed

    def _check(self) -> _Local | _Remote:
        if self._closed:
            raise InterfaceError("the cursor is closed")
        return self.connection._open()

    # -- running queries
    def execute(self, operation: str, parameters: Mapping[str, Any] | Sequence[Any] | None = None,
                *, epsilon: float | None = None, delta: float | None = None,
                wait_seconds: float | None = None, sensitivity: str | None = None,
                gamma: float | None = None) -> Cursor:
        """Run one query with DP; ``epsilon``/``delta``/``wait_seconds`` (and
        ``sensitivity``/``gamma``, random DP) override the connection's defaults."""
        transport = self._check()
        if not isinstance(operation, str):
            raise ProgrammingError("the operation must be a SQL string")
        sql = bind_parameters(operation, parameters, transport.dialect)
        self._answer = None
        self.privacy_report = None
        conn = self.connection
        answer = transport.execute(
            sql, conn.epsilon if epsilon is None else epsilon,
            conn.delta if delta is None else delta,
            conn.wait_seconds if wait_seconds is None else wait_seconds,
            **_sampling(conn, sensitivity, gamma))
        self._answer = answer
        self._position = 0
        self.privacy_report = answer.report
        return self

    def executemany(self, operation: str,
                    seq_of_parameters: Sequence[Mapping[str, Any]]) -> None:
        """Refused: executemany is for writes, and the proxy only answers read-only queries."""
        self._check()
        raise NotSupportedError(
            "executemany is not supported: the proxy never writes, and each query is charged",
            hint="call execute once per parameter set")

    def explain(self, operation: str,
                parameters: Mapping[str, Any] | Sequence[Any] | None = None, *,
                epsilon: float | None = None, delta: float | None = None,
                sensitivity: str | None = None, gamma: float | None = None) -> PrivacyReport:
        """What ``execute`` would cost and do, without running or charging (extension)."""
        transport = self._check()
        sql = bind_parameters(operation, parameters, transport.dialect)
        return transport.explain(
            sql, self.connection.epsilon if epsilon is None else epsilon,
            self.connection.delta if delta is None else delta,
            **_sampling(self.connection, sensitivity, gamma))

    def callproc(self, procname: str, parameters: Sequence[Any] = ()) -> None:
        """Refused: there are no stored procedures behind the proxy."""
        self._check()
        raise NotSupportedError("stored procedures are not supported")

    def nextset(self) -> None:
        """There is only ever one result set."""
        self._check()
        return None

    @property
    def intervals(self) -> list[tuple[dict[str, Any] | None, ...]] | None:
        """The 95% interval of every cell of the last result, row by row (extension): None for
        a group key or constant, else a dict with ``text`` (e.g. ``5,112 ± 140 (noise)``),
        ``lower``/``upper`` (with the bias of caps and clipping) and ``noise_lower``/
        ``noise_upper`` (``chorus_py.report.interval_dict``).  None before any execute."""
        if self._answer is None:
            return None
        return self._answer.intervals()

    # -- fetching
    def _rows(self) -> list[tuple[Any, ...]]:
        self._check()
        if self._answer is None:
            raise ProgrammingError("no result set: call execute() first")
        return self._answer.rows

    def fetchone(self) -> tuple[Any, ...] | None:
        """The next row, or None when none is left."""
        rows = self._rows()
        if self._position >= len(rows):
            return None
        self._position += 1
        return rows[self._position - 1]

    def fetchmany(self, size: int | None = None) -> list[tuple[Any, ...]]:
        """Up to ``size`` (default ``arraysize``) rows."""
        rows = self._rows()
        size = self.arraysize if size is None else size
        if size < 0:
            raise ProgrammingError("fetchmany size must not be negative")
        chunk = rows[self._position:self._position + size]
        self._position += len(chunk)
        return chunk

    def fetchall(self) -> list[tuple[Any, ...]]:
        """Every remaining row."""
        rows = self._rows()
        chunk = rows[self._position:]
        self._position = len(rows)
        return chunk

    def setinputsizes(self, sizes: Any) -> None:
        """Accepted and ignored (PEP 249)."""

    def setoutputsize(self, size: Any, column: Any = None) -> None:
        """Accepted and ignored (PEP 249)."""

    def close(self) -> None:
        """Close the cursor; later calls raise InterfaceError."""
        self._closed = True
        self._answer = None

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return self

    def __next__(self) -> tuple[Any, ...]:
        row = self.fetchone()
        if row is None:
            raise StopIteration
        return row

    def __enter__(self) -> Cursor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(dsn: str | os.PathLike[str] | None = None, *,
            policy: str | os.PathLike[str] | None = None, analyst: str | None = None,
            token: str | None = None, epsilon: float | None = None,
            delta: float | None = None, wait_seconds: float | None = None, engine: Any = None,
            timeout: float = 300.0, sensitivity: str | None = None,
            gamma: float | None = None) -> Connection:
    """Open a connection.

    - ``connect(policy="policy.toml", analyst="alice")`` (or ``connect("policy.toml", ...)``):
      the engine runs in this process; connections on one policy file share its budget ledger.
    - ``connect("http://host:8000", token="...")``: a remote proxy's REST endpoint; the token
      (default: the ``CHORUS_TOKEN`` environment variable) decides the analyst.
    - ``connect(engine=engine, analyst="alice")``: an engine you built (you close it).

    ``epsilon`` / ``delta`` set the default privacy parameters of every query (None: the
    policy's defaults) and ``wait_seconds`` how long a query may wait for budget the scheduler
    cannot grant at once; ``cursor.execute(..., epsilon=...)`` overrides them per query.
    ``sensitivity="sampled"`` (with ``gamma``) opts every query in to sensitivity sampling
    (random DP) for queries with no analytic bound.
    ``timeout`` (remote only) bounds each HTTP request.
    """
    target = os.fspath(dsn) if dsn is not None else None
    if target is not None and target.startswith(("http://", "https://")):
        if policy is not None or engine is not None:
            raise InterfaceError("give either a proxy URL or a policy/engine, not both")
        token = token if token is not None else os.environ.get("CHORUS_TOKEN")
        if not token:
            raise InterfaceError("a token is needed to reach a remote proxy",
                                 hint="connect(url, token=...) or set CHORUS_TOKEN")
        return Connection(_Remote(target, token, analyst, timeout), epsilon, delta,
                          wait_seconds, sensitivity, gamma)
    if token is not None:
        raise InterfaceError("token is only used with a proxy URL (http://host:port)")
    if engine is not None:
        if target is not None or policy is not None:
            raise InterfaceError("give either an engine or a policy, not both")
        return Connection(_Local(engine, analyst), epsilon, delta, wait_seconds, sensitivity,
                          gamma)
    if target is not None and policy is not None:
        raise InterfaceError("give the policy once (as dsn or policy=)")
    policy = policy if policy is not None else target
    if policy is None:
        raise InterfaceError("nothing to connect to",
                             hint="connect(policy='policy.toml', analyst=...) or "
                             "connect('http://host:8000', token=...)")
    return Connection(_Local(_shared_engine(policy), analyst), epsilon, delta, wait_seconds,
                      sensitivity, gamma)
