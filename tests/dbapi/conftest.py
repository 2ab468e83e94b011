"""Fixtures: the same DB-API tests in-process (DuckDB, Postgres) and remote over REST (DuckDB)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import chorus_py
from chorus_py.clients.dbapi import Connection
from chorus_py.engine import Engine
from tests.rest.harness import ALICE_TOKEN, ServerThread, policy_with_tokens, serve_engine


@pytest.fixture(scope="module")
def duckdb_policy(duckdb_data: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("dbapi") / "policy.toml"
    path.write_text(policy_with_tokens(duckdb_data))
    return path


@pytest.fixture(scope="module")
def postgres_policy(postgres_data: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("dbapi") / "policy.toml"
    path.write_text(policy_with_tokens(postgres_data))
    return path


@pytest.fixture(scope="module")
def remote(duckdb_policy: Path) -> Iterator[ServerThread]:
    """A REST server over its own engine (its own ledger) on the DuckDB data."""
    engine = Engine.from_policy(duckdb_policy)
    try:
        with serve_engine(engine) as server:
            yield server
    finally:
        engine.close()


Connect = Callable[..., Connection]


@pytest.fixture(params=["local-duckdb", pytest.param("local-postgres", marks=pytest.mark.postgres),
                        "remote-duckdb"])
def connect(request: pytest.FixtureRequest) -> Iterator[Connect]:
    """``connect(**kwargs)`` opens a connection as analyst alice, in-process or over REST."""
    opened: list[Connection] = []

    if request.param == "remote-duckdb":
        server: ServerThread = request.getfixturevalue("remote")

        def make(**kwargs: object) -> Connection:
            conn = chorus_py.connect(server.url, token=ALICE_TOKEN, **kwargs)
            opened.append(conn)
            return conn
    else:
        policy: Path = request.getfixturevalue(f"{request.param.split('-')[1]}_policy")

        def make(**kwargs: object) -> Connection:
            conn = chorus_py.connect(policy=policy, analyst="alice", **kwargs)
            opened.append(conn)
            return conn

    def engine() -> Engine:
        """The engine (and ledger) the connections of this parameter charge."""
        if request.param == "remote-duckdb":
            return request.getfixturevalue("remote").engine
        from chorus_py.clients.dbapi import _shared_engine

        return _shared_engine(request.getfixturevalue(f"{request.param.split('-')[1]}_policy"))

    make.kind = request.param  # type: ignore[attr-defined]
    make.engine = engine  # type: ignore[attr-defined]
    yield make
    for conn in opened:
        conn.close()
