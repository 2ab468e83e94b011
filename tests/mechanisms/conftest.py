"""Fixtures for the mechanisms tests: one DuckDB and one Postgres connection per module."""

from __future__ import annotations

import os
from collections.abc import Iterator

import duckdb
import pytest

PG_URL = os.environ.get("CHORUS_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.fixture(scope="module")
def duck() -> Iterator[duckdb.DuckDBPyConnection]:
    con = duckdb.connect()
    yield con
    con.close()


@pytest.fixture(scope="module")
def pg() -> Iterator[object]:
    psycopg = pytest.importorskip("psycopg")
    try:
        con = psycopg.connect(PG_URL, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as e:
        pytest.skip(f"Postgres not reachable at {PG_URL}: {e}")
    yield con
    con.close()
