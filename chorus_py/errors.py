"""The one exception hierarchy of the proxy (PEP 249 shaped, with SQLSTATE codes).

Every front door (CLI, DB-API, wire protocol, REST) maps an error to its answer through
``sqlstate`` alone, so a new error class only has to pick the right code.  Classes register
themselves with ``__init_subclass__(code=...)`` and :func:`lookup` falls back on the two-letter
SQLSTATE class, as psycopg does.

Codes reuse Postgres where they fit: 42501 for policy refusals, 0A000 for unsupported SQL,
42601 for syntax errors, 42P01 / 42703 for unknown tables / columns, class 53 for an exhausted
privacy budget.
"""

from __future__ import annotations

_by_code: dict[str, type[ChorusError]] = {}


class ChorusError(Exception):
    """Base of every error the proxy raises on purpose (PEP 249 ``Error``)."""

    sqlstate: str = "XX000"

    def __init_subclass__(cls, code: str | None = None, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if code is not None:
            cls.sqlstate = code
            _by_code.setdefault(code, cls)

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} (hint: {self.hint})" if self.hint else self.message


# PEP 249 names, so the DB-API driver can re-export them unchanged.
class Warning(Exception):
    """PEP 249 ``Warning``."""


class InterfaceError(ChorusError, code="08000"):
    """Misuse of the client interface (closed cursor, bad connection arguments)."""


class DatabaseError(ChorusError, code="58000"):
    """Errors related to the database."""


class DataError(DatabaseError, code="22000"):
    """A value out of range or of the wrong type."""


class OperationalError(DatabaseError, code="08006"):
    """The backend is unreachable or failed while running a rewritten query."""


class IntegrityError(DatabaseError, code="23000"):
    """Unused by the proxy (it never writes) but part of PEP 249."""


class InternalError(DatabaseError, code="XX000"):
    """A bug in the proxy."""


class ProgrammingError(DatabaseError, code="42000"):
    """The analyst's SQL is wrong or not allowed."""


class NotSupportedError(DatabaseError, code="0A000"):
    """Valid SQL the proxy cannot answer privately (yet)."""


class PolicyError(ChorusError, code="F0000"):
    """The policy (catalog) file is invalid; the message names the file and key."""


class QuerySyntaxError(ProgrammingError, code="42601"):
    """The SQL does not parse."""


class UndefinedTable(ProgrammingError, code="42P01"):
    """The query names a table the policy does not declare."""


class UndefinedColumn(ProgrammingError, code="42703"):
    """The query names a column the policy does not declare."""


class QueryRefused(ProgrammingError, code="42501"):
    """The query is valid SQL but the privacy policy does not allow it."""


class InvalidParameter(ProgrammingError, code="22023"):
    """Epsilon, delta or another privacy parameter is missing or out of range."""


class BudgetExhausted(OperationalError, code="53400"):
    """A block the query reads has too little privacy budget left; nothing was spent."""


class BackendError(OperationalError, code="58030"):
    """The backend failed while running the rewritten SQL. The message is sanitised."""


class StatementCanceled(OperationalError, code="57014"):
    """A statement was cancelled: its statement timeout, or a client's cancel request."""


def lookup(sqlstate: str) -> type[ChorusError]:
    """Return the error class for a SQLSTATE, falling back on its two-letter class."""
    if sqlstate in _by_code:
        return _by_code[sqlstate]
    prefix = sqlstate[:2]
    for code, cls in _by_code.items():
        if code.startswith(prefix) and code.endswith("000"):
            return cls
    return ChorusError
