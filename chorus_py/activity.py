"""What happens at the front doors, for the operator: one record per query, failed login,
connection and database health change, written to the log and handed to listeners (metrics).

The engine records every query it answers or refuses (:meth:`chorus_py.engine.Engine.execute`,
``explain``), whichever door it came through (``door``: ``wire``, ``rest``, ``dbapi``, ``cli``,
``python``), so no door can forget to; the doors record what only they see: failed logins,
connections, health probes.  Every record goes to the ``chorus.audit`` logger at INFO (failed
logins and an unreachable database at WARNING), which ``chorus serve`` always shows, as text or
one JSON object per line (:func:`configure_logging`).

What a record may hold: the analyst, a SHA-256 prefix of the SQL (never its text: it can hold
literal values), the query's cost and blocks, the outcome with the error's class and SQLSTATE
(never its message, which can quote the SQL) and the time taken.  Nothing else about the data:
the log never learns more than the analyst was told.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

log = logging.getLogger("chorus.audit")

#: Hex digits of the SQL's SHA-256 kept in a record: enough to group a query's repeats.
SQL_HASH_CHARS = 16
#: The longest user name a failed-login record keeps (the name is the client's, untrusted).
USER_CHARS = 64

#: Refusals by SQLSTATE: the analyst's query or parameters are not allowed (nothing was
#: charged), as against a failure of the proxy or the database.
_REFUSAL_CLASSES = {"53": "budget", "22": "parameter", "0A": "unsupported"}
_REFUSAL_CODES = {"42501": "policy", "42601": "syntax", "42P01": "unknown_table",
                  "42703": "unknown_column"}

Outcome = Literal["answered", "refused", "canceled", "failed"]


def sql_hash(sql: str) -> str:
    """The first :data:`SQL_HASH_CHARS` hex digits of the SQL's SHA-256."""
    return hashlib.sha256(sql.encode("utf-8", "surrogatepass")).hexdigest()[:SQL_HASH_CHARS]


def refusal_class(sqlstate: str) -> str | None:
    """What kind of refusal a SQLSTATE is (``budget``, ``policy``, ``syntax``...), or None when
    it is no refusal (a database failure, a cancel, a bug)."""
    if sqlstate in _REFUSAL_CODES:
        return _REFUSAL_CODES[sqlstate]
    if sqlstate[:2] == "42":
        return "query"
    return _REFUSAL_CLASSES.get(sqlstate[:2])


@dataclass(frozen=True)
class QueryEvent:
    """One query or EXPLAIN request, as the log and the metrics see it."""

    door: str
    action: Literal["query", "explain"]
    analyst: str | None
    sql_sha256: str
    outcome: Outcome
    ms: float
    epsilon: float | None = None
    delta: float | None = None
    blocks: int = 0
    charged: bool = False
    sqlstate: str | None = None
    reason: str | None = None  # the error's class name: BudgetExhausted, QueryRefused...
    refusal_class: str | None = None


def query_event(door: str, action: Literal["query", "explain"], analyst: str | None, sql: str,
                started: float, report: Any = None,
                error: BaseException | None = None) -> QueryEvent:
    """The event of a query that ended with ``report`` (a ``PrivacyReport``) or ``error``;
    ``started`` is its ``time.perf_counter()`` at arrival."""
    ms = round((time.perf_counter() - started) * 1000, 3)
    base = {"door": door, "action": action, "analyst": _short(analyst),
            "sql_sha256": sql_hash(sql), "ms": ms}
    if error is not None:
        sqlstate = getattr(error, "sqlstate", None) or "XX000"
        kind = refusal_class(sqlstate)
        outcome: Outcome = "refused" if kind else \
            "canceled" if sqlstate.startswith("57") else "failed"
        return QueryEvent(**base, outcome=outcome, sqlstate=sqlstate,
                          reason=type(error).__name__, refusal_class=kind)
    charged = bool(getattr(report, "charged", False))
    return QueryEvent(**base, outcome="answered", epsilon=getattr(report, "epsilon", None),
                      delta=getattr(report, "delta", None),
                      blocks=len(getattr(report, "blocks", ())) if charged else 0,
                      charged=charged)


class ActivityListener(Protocol):
    """What a listener (``server.metrics.Metrics``) is told; every method must be quick."""

    def on_query(self, event: QueryEvent) -> None: ...

    def on_login_failed(self, door: str) -> None: ...

    def on_connection(self, door: str, opened: bool) -> None: ...

    def on_health(self, up: bool) -> None: ...


class Activity:
    """The records of one engine: logged, and handed to every subscribed listener.

    Listeners are held weakly: a REST app built and dropped (as tests do by the hundred) stops
    listening with it.
    """

    def __init__(self) -> None:
        self._listeners: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._backend_up: bool | None = None

    def subscribe(self, listener: ActivityListener) -> None:
        """Hand ``listener`` every record from now on."""
        with self._lock:
            self._listeners.add(listener)

    def _each(self) -> list[Any]:
        with self._lock:
            return list(self._listeners)

    def query(self, event: QueryEvent) -> None:
        """Record one query (answered, refused or failed)."""
        if log.isEnabledFor(logging.INFO):  # vars, not asdict (which copies deeply): per query
            _emit(logging.INFO, "query", f"query {event.outcome}", vars(event))
        for listener in self._each():
            listener.on_query(event)

    def login_failed(self, door: str, user: str | None, why: str) -> None:
        """Record a failed login (``user``: the name the client gave, if any; never a secret)."""
        fields = {"door": door, "user": _short(user), "reason": why}
        _emit(logging.WARNING, "login_failed", "login failed", fields)
        for listener in self._each():
            listener.on_login_failed(door)

    def connection(self, door: str, opened: bool) -> None:
        """Count a connection opened or closed (not logged: a login or a query is)."""
        for listener in self._each():
            listener.on_connection(door, opened)

    def health(self, up: bool, problem: BaseException | None = None) -> None:
        """Record a health probe's verdict on the database; logged only when it changes, so
        a database that stays down writes one line, not one traceback per probe."""
        with self._lock:
            changed, self._backend_up = self._backend_up != up, up
        if changed:
            if up:
                _emit(logging.INFO, "health", "the database answers", {"database": "up"})
            else:
                first = str(problem).strip().splitlines()[0] if problem and str(problem) else ""
                _emit(logging.WARNING, "health", "the database does not answer",
                      {"database": "down", "error": type(problem).__name__ if problem else None,
                       "detail": first[:300] or None})
        for listener in self._each():
            listener.on_health(up)


def _short(name: str | None) -> str | None:
    return None if name is None else name[:USER_CHARS]


def _emit(level: int, event: str, message: str, fields: dict[str, Any]) -> None:
    if not log.isEnabledFor(level):
        return
    fields = {"event": event, **{k: v for k, v in fields.items() if v is not None}}
    text = " ".join(f"{k}={_text(v)}" for k, v in fields.items() if k != "event")
    log.log(level, "%s: %s", message, text, extra={"chorus": fields})


def _text(value: Any) -> str:
    """A value in a text log line: numbers short, strings quoted and escaped when they hold a
    space, '=', a quote or anything unprintable (a client-given name must not forge another
    field, another line or a terminal escape)."""
    if isinstance(value, float):
        return f"{value:.6g}" if math.isfinite(value) else str(value)
    text = str(value)
    plain = text and text.isprintable() and not any(c in text for c in ' ="')
    return text if plain else json.dumps(text)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and a record's fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(), "logger": record.name,
            "message": record.getMessage()}
        fields = getattr(record, "chorus", None)
        if isinstance(fields, dict):
            # An audit record: its short message ("query refused"), then its fields.
            out["message"] = str(record.args[0]) if isinstance(record.args, tuple) and \
                record.args else out["message"]
            out.update(fields)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        # default=str: a value json cannot encode is written as text, never dropped.
        return json.dumps(out, default=str)


TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


def configure_logging(fmt: Literal["text", "json"] = "text") -> None:
    """How ``chorus serve`` logs: every record to stderr as text or JSON lines, with the
    ``chorus.audit`` records (queries, failed logins, health changes) and the start-up lines
    (``chorus.serve``) at the default level."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    # The records an operator always needs, whatever -v says: queries, logins, health
    # (chorus.audit) and what the doors listen on (chorus.serve).
    for name in ("chorus.audit", "chorus.serve"):
        logger = logging.getLogger(name)
        if logger.getEffectiveLevel() > logging.INFO:
            logger.setLevel(logging.INFO)
