"""What every backend is: a database that runs the proxy's rewritten SQL read-only, and
classifies its failures so the engine can tell "the data was touched" (charge the budget) from
"the statement never ran" (release it)."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from chorus_py.backends.cancel import interrupt

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


def integer_column(values: Sequence[Any]) -> np.ndarray:
    """``values`` (integers or None) as an int64 array, None as -1 (``Backend.run_integers``)."""
    if None not in values:
        return np.asarray(values, dtype=np.int64)
    return np.fromiter((-1 if v is None else v for v in values), dtype=np.int64,
                       count=len(values))


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

    def run_integers(self, sql: str) -> tuple[np.ndarray, ...]:
        """Run one statement whose columns all hold integers: each column as an int64 NumPy
        array, NULL as -1 (the callers' columns are indexes, bins and counts, never negative).
        Raise :class:`StatementFailed` as :meth:`run` does.  This default reads the rows and
        transposes them; a backend that hands columns over without a Python object per value
        overrides it (DuckDB: a histogram's tens of thousands of rows)."""
        result = self.run(sql)
        columns = list(zip(*result.rows, strict=True)) if result.rows \
            else [()] * len(result.columns)
        return tuple(integer_column(c) for c in columns)

    def run_side_by_side(self, statements: Sequence[str]) -> list[ResultSet]:
        """Run ``statements``, which do not depend on one another, at once where the backend
        gains by it (Postgres: each on a connection of its own), else one after the other
        (here); their results in their order.  Raise :class:`StatementFailed` as :meth:`run`
        does once every statement has ended, ``touched_data`` when any of them may have read
        a row."""
        return [self.run(sql) for sql in statements]

    @abstractmethod
    def run_owned(self, statements: Sequence[str]) -> None:
        """Run statements that write the proxy's own schema, in one transaction.

        Only the proxy calls this (never with analyst SQL): it materialises data the proxy
        owns, such as bounded samples, in a schema analysts cannot name.
        """

    def settle_owned(self, tables: Sequence[str]) -> None:
        """After the proxy built ``tables`` in its schema: whatever makes them fastest to read
        that cannot run in ``run_owned``'s transaction.  Nothing on DuckDB and Spark; Postgres
        vacuums them (``PostgresBackend.settle_owned``)."""
        return None

    def owned_key(self, create: Sequence[str]) -> bytes:
        """The proxy's secret naming key (``chorus_py.stores.samples``): ``create`` makes the
        table ``chorus_private.chorus_key`` holding it (once, whichever proxy comes first)."""
        self.run_owned(create)
        (key,) = self.run(f"SELECT k FROM {SCHEMA}.chorus_key WHERE id = 1").rows[0]
        return bytes.fromhex(key)

    def owned_tables(self) -> tuple[str, ...]:
        """The tables of the proxy's own schema."""
        return tuple(str(r[0]) for r in self.run(
            "SELECT table_name FROM information_schema.tables "
            f"WHERE table_schema = '{SCHEMA}'").rows)

    def current_schema(self) -> str:
        """The schema :meth:`table_columns` reads, which qualifies every generated table name."""
        return str(self.run("SELECT current_schema()").rows[0][0])

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


def group_columns(rows: Sequence[tuple[Any, ...]]) -> dict[str, dict[str, str]]:
    tables: dict[str, dict[str, str]] = {}
    for table, column, dtype in rows:
        tables.setdefault(str(table), {})[str(column)] = portable_type(str(dtype))
    return tables
