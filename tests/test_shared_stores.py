"""What the proxy keeps in the database (stored bounded samples, kept sets, the naming key) is
built by whichever proxy needs it first: several proxies (``chorus serve --workers``, or
several machines) racing to build the same thing must all get it, without an error and without
two copies.  Each racer here has its own backend (its own connections), as separate processes
would; Postgres only (an embedded DuckDB file has one process)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from chorus_py.backends import SCHEMA, Backend, open_backend
from chorus_py.policy import load_policy
from chorus_py.stores.attribution import AttributionStore
from chorus_py.stores.samples import BoundedSamples

pytestmark = pytest.mark.postgres

RACERS = 4


def _race(work: Callable[[int], object]) -> tuple[list[object], list[str]]:
    go = threading.Barrier(RACERS)
    results: list[object] = [None] * RACERS
    errors: list[str] = []

    def run(i: int) -> None:
        go.wait()
        try:
            results[i] = work(i)
        except Exception as err:  # reported below
            errors.append(repr(err))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(RACERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results, errors


def _drop(backend: Backend) -> None:
    backend.run_owned([f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"])


def test_proxies_racing_to_build_a_sample_get_one(postgres_data: str,
                                                   write_policy: Callable[..., Path]) -> None:
    table = load_policy(write_policy(postgres_data)).tables["trips"]
    backends = [open_backend(postgres_data) for _ in range(RACERS)]
    try:
        for _ in range(3):  # from nothing: the schema, the naming key, the sample
            _drop(backends[0])
            stores = [BoundedSamples(b) for b in backends]
            names, errors = _race(lambda i, s=stores: s[i].relation("trips", table))
            assert errors == []
            assert len(set(names)) == 1  # the same key, so the same name, for every proxy
            (name,) = set(names)
            tables = backends[0].run(
                "SELECT table_name FROM information_schema.tables "
                f"WHERE table_schema = '{SCHEMA}' ORDER BY 1").rows
            assert tables == [("chorus_key",), (name,)]
            (keys,) = backends[0].run(f"SELECT COUNT(*) FROM {SCHEMA}.chorus_key").rows
            assert keys == (1,)
            # One index on the block column, whoever built it.
            (indexes,) = backends[0].run(
                f"SELECT COUNT(*) FROM pg_indexes WHERE schemaname = '{SCHEMA}' "
                f"AND tablename = '{name}'").rows
            assert indexes == (1,)
    finally:
        _drop(backends[0])
        for b in backends:
            b.close()


@pytest.mark.parametrize("method", ["sql-rank", "greedy"])
def test_proxies_racing_to_build_a_kept_set_get_one(postgres_data: str, tmp_path: Path,
                                                     method: str) -> None:
    from tests.test_attribution import RIDES_POLICY, RIDES_SQL

    policy_file = tmp_path / "rides.toml"
    policy_file.write_text((RIDES_POLICY % (3, method)).format(url=postgres_data))
    table = load_policy(policy_file).tables["shared_rides"]
    backends = [open_backend(postgres_data) for _ in range(RACERS)]
    try:
        backends[0].run_owned(["DROP TABLE IF EXISTS shared_rides", *RIDES_SQL])
        for _ in range(2):
            _drop(backends[0])
            stores = [AttributionStore(b, BoundedSamples(b).naming_key) for b in backends]
            names, errors = _race(lambda i, s=stores: s[i].relation("shared_rides", table))
            assert errors == []
            assert len(set(names)) == 1
            (name,) = set(names)
            tables = backends[0].run(
                "SELECT table_name FROM information_schema.tables "
                f"WHERE table_schema = '{SCHEMA}' ORDER BY 1").rows
            assert tables == [("chorus_key",), (name,)]
    finally:
        _drop(backends[0])
        backends[0].run_owned(["DROP TABLE IF EXISTS shared_rides"])
        for b in backends:
            b.close()
