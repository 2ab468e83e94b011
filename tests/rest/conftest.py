"""Fixtures: a real uvicorn server per backend over an engine whose policy has REST tokens."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.rest.harness import ServerThread, serve_engine, token_engine


@pytest.fixture(scope="module",
                params=["duckdb", pytest.param("postgres", marks=pytest.mark.postgres)])
def live(request: pytest.FixtureRequest,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """A running REST server on each backend (module scope: its ledger is shared)."""
    url = request.getfixturevalue(f"{request.param}_data")
    engine = token_engine(tmp_path_factory.mktemp("rest"), url)
    try:
        with serve_engine(engine) as server:
            yield server
    finally:
        engine.close()


@pytest.fixture(scope="module")
def live_duckdb(duckdb_data: str,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """A running REST server on DuckDB only."""
    engine = token_engine(tmp_path_factory.mktemp("rest"), duckdb_data)
    try:
        with serve_engine(engine) as server:
            yield server
    finally:
        engine.close()
