"""Connections to the unmodified database the proxy forwards rewritten SQL to.

One module per database: ``duckdb`` (an embedded file), ``postgres`` (psycopg 3) and ``spark``
(a local Spark, or a cluster through Spark Connect, over Parquet files; pyspark is imported
only when a policy names it); ``base`` is what every backend is, ``cancel`` how another thread
stops a running statement.  Both run
every statement the proxy sends as read-only as the database allows (defence in depth: the
analyser already refuses writes).  A new backend is a module here with a ``Backend`` subclass,
and a URL scheme in :func:`open_backend`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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
from chorus_py.errors import OperationalError

if TYPE_CHECKING:
    from chorus_py.policy import SparkConfig

__all__ = ["SCHEMA", "Backend", "DuckDBBackend", "PostgresBackend", "ResultSet",
           "StatementFailed", "cancellable", "duckdb_path", "interrupt", "open_backend",
           "portable_type"]


def open_backend(url: str, statement_timeout_s: float = 300.0,
                 spark: SparkConfig | None = None) -> Backend:
    """Open the backend a policy's URL names; statements running longer than
    ``statement_timeout_s`` are cancelled, whichever front door sent them.  ``spark``: the
    policy's ``[backend.spark]``, for ``spark://local`` and ``sc://host:port``."""
    if url.startswith("duckdb://"):
        return DuckDBBackend(duckdb_path(url), statement_timeout_s)
    if url.startswith(("spark://", "sc://")):
        from chorus_py.backends.spark import SparkBackend

        if spark is None:
            raise OperationalError("a Spark backend needs [backend.spark] in the policy")
        return SparkBackend(spark, statement_timeout_s,
                            remote=url if url.startswith("sc://") else None)
    return PostgresBackend(url, statement_timeout_s)
