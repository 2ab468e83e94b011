"""Connections to the unmodified database the proxy forwards rewritten SQL to.

One module per database: ``duckdb`` (an embedded file) and ``postgres`` (psycopg 3); ``base``
is what every backend is, ``cancel`` how another thread stops a running statement.  Both run
every statement the proxy sends as read-only as the database allows (defence in depth: the
analyser already refuses writes).  A new backend is a module here with a ``Backend`` subclass,
and a URL scheme in :func:`open_backend`.
"""

from __future__ import annotations

from chorus_py.backends.base import (
    SCHEMA,
    Backend,
    ResultSet,
    StatementFailed,
    portable_type,
)
from chorus_py.backends.cancel import cancellable, interrupt
from chorus_py.backends.duckdb import DuckDBBackend, duckdb_path
from chorus_py.backends.postgres import PostgresBackend

__all__ = ["SCHEMA", "Backend", "DuckDBBackend", "PostgresBackend", "ResultSet",
           "StatementFailed", "cancellable", "duckdb_path", "interrupt", "open_backend",
           "portable_type"]


def open_backend(url: str, statement_timeout_s: float = 300.0) -> Backend:
    """Open the backend a policy's URL names; statements running longer than
    ``statement_timeout_s`` are cancelled, whichever front door sent them."""
    if url.startswith("duckdb://"):
        return DuckDBBackend(duckdb_path(url), statement_timeout_s)
    return PostgresBackend(url, statement_timeout_s)
