"""Chorus: a differential-privacy SQL proxy.  ``chorus_py.connect`` is its DB-API 2.0 driver."""

# sqlglot loads a dialect on its first use, and registers the class before its module has
# finished loading: threads that use a dialect for the first time at once (a fresh server's
# first queries, or proxies building stored samples) may render with the half-loaded class,
# i.e. the generic dialect (RANDOM() came out as RAND() on Postgres; tests/test_shared_stores.py).
# Loaded here, under the import lock, before any thread of the proxy renders SQL.  Every
# dialect a backend speaks belongs in this list.
import sqlglot.dialects.duckdb
import sqlglot.dialects.postgres
import sqlglot.dialects.spark  # noqa: F401

from chorus_py.clients.dbapi import connect

__all__ = ["connect"]
