"""The Spark suite's ``scratch`` fixture (tests/spark/conftest.py) against a table another test
left in the session's DuckDB file, which the fixture copies: the statements' unqualified
``DROP TABLE IF EXISTS`` once reached the read-only copy and failed, test by test, depending
on which tests the worker had run before (eight quantile tests failed in one full run)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import duckdb
import pytest

from chorus_py.backends import open_backend
from chorus_py.backends.duckdb import DUCKDB_CONFIG, duckdb_path
from chorus_py.engine import Engine
from tests.test_quantiles import CREATE, POLICY


@pytest.fixture
def leftover(duckdb_data: str) -> Iterator[None]:
    """A table ``quant_other`` (one column, ``leftover``) in the session's DuckDB file before
    ``scratch`` copies it, written to the file itself (DuckDB checkpoints in time), dropped
    after."""
    left = open_backend(duckdb_data)
    try:
        left.run_owned(["CREATE OR REPLACE TABLE quant_other AS SELECT 7 AS leftover"])
        with duckdb.connect(duckdb_path(duckdb_data), config=dict(DUCKDB_CONFIG)) as same:
            same.execute("CHECKPOINT")
        yield
    finally:
        left.run_owned(["DROP TABLE IF EXISTS quant_other"])
        left.close()


def test_scratch_tables_shadow_a_table_left_in_the_session_file(
        leftover: None, scratch: Callable[..., Engine]) -> None:
    engine = scratch("skew", CREATE, POLICY)  # failed here: DROP on the read-only copy
    # The statements' own quant_other, not the leftover (whose only column is leftover).
    assert engine.backend.run("SELECT unit_id, w FROM quant_other").rows == [(1, 1.0)]
