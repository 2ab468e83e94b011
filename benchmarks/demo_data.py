"""The demo data and engine that several benchmarks measure (corpus, quantile_sql, unit_order,
kept_rank, group_parts): made the same way in each, so here once.

- :func:`demo_options`: the command-line options these take (``--rows``, ``--postgres``,
  ``--database``, ``--skip-postgres``, ``--skip-duckdb``) and ``--out``;
- :func:`demo_on`: the demo trips on one backend, in a DuckDB file under the run's work folder
  or in a Postgres database (re)created for the run next to an admin URL;
- :func:`drop_database`: drop that database (at the end of the run, or before remaking it);
- :func:`open_engine`: an engine on the demo policy with a budget no run exhausts, warmed up as
  ``chorus serve`` starts;
- :func:`ranked_copy`: the name of a table's ranked copy (not its twin in unit order);
- :func:`demo_engines`: one warmed-up engine per backend not skipped, each on its own demo,
  closed (and its database dropped) before the next;
- :class:`RawQueries`: the analyst's SQL straight to an engine's database, the raw side of a
  DP / raw ratio.

Each takes what it needs from the benchmark's ``argparse`` namespace (``rows``, ``postgres``,
``database``); a benchmark keeps its own other options and its database's name.
"""

from __future__ import annotations

import argparse
import contextlib
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg

from benchmarks.results import RESULTS
from chorus_py.demo import generate_demo
from chorus_py.engine import Engine


def demo_options(parser: argparse.ArgumentParser, database: str | None,
                 skips: bool = True) -> None:
    """Add ``--rows`` (1,000,000 demo trips), ``--out`` (benchmarks/RESULTS.md) and, with a
    ``database`` (the default name of the run's Postgres database), ``--postgres`` and
    ``--database``, and (``skips``) ``--skip-postgres`` and ``--skip-duckdb``."""
    parser.add_argument("--rows", type=int, default=1_000_000)
    if database is not None:
        parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test",
                            help="an admin URL; the database --database is created next to it "
                                 "and dropped at the end")
        parser.add_argument("--database", default=database)
        if skips:
            parser.add_argument("--skip-postgres", action="store_true")
            parser.add_argument("--skip-duckdb", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)


def demo_on(label: str, work: Path, args: argparse.Namespace) -> Path:
    """The policy of ``args.rows`` demo trips on ``label``'s backend: "Postgres" (the database
    ``args.database``, dropped and created again next to the admin URL ``args.postgres``;
    files under ``work/pg``) or anything else for DuckDB (``work/duckdb``)."""
    if label != "Postgres":
        return generate_demo(work / "duckdb", rows=args.rows)
    drop_database(args)
    with psycopg.connect(args.postgres, autocommit=True) as con:
        con.execute(f"CREATE DATABASE {args.database}")
    base = args.postgres.rsplit("/", 1)[0]
    return generate_demo(work / "pg", backend_url=f"{base}/{args.database}", rows=args.rows)


def drop_database(args: argparse.Namespace) -> None:
    """Drop the run's Postgres database ``args.database`` (if it exists)."""
    with psycopg.connect(args.postgres, autocommit=True) as con:
        con.execute(f"DROP DATABASE IF EXISTS {args.database} WITH (FORCE)")


def open_engine(policy: Path) -> Engine:
    """The demo's policy with a budget per block that no run exhausts, warmed up."""
    text = policy.read_text()
    if text.count("epsilon_per_block = 10.0") != 1:
        raise SystemExit(f"{policy}: epsilon_per_block = 10.0 not found once")
    variant = policy.with_name("policy-corpus.toml")
    variant.write_text(text.replace("epsilon_per_block = 10.0", "epsilon_per_block = 1e9"))
    engine = Engine.from_policy(variant)
    engine.warm_up(wait=True)  # as `chorus serve` starts: the ranked copy is built
    return engine


def ranked_copy(engine: Engine, table: str) -> str:
    """The name of ``table``'s ranked copy in the engine's schema (one, built)."""
    (copy,) = [t for t in engine.backend.owned_tables()
               if re.fullmatch(rf"{re.escape(table)}__ranked_[0-9a-f]{{16}}", t)]
    return copy


def demo_engines(args: argparse.Namespace, work: Path,
                 order: Sequence[str] = ("DuckDB", "Postgres")) -> Iterator[tuple[str, Engine]]:
    """(label, engine) for each backend of ``order`` that ``args`` does not skip
    (``--skip-duckdb``, ``--skip-postgres``): the demo made under ``work`` (:func:`demo_on`),
    the engine opened (:func:`open_engine`) and, after the caller's turn, closed, and the
    run's Postgres database dropped, even when the caller's turn fails."""
    skips = {"DuckDB": args.skip_duckdb, "Postgres": args.skip_postgres}
    for label in order:
        if skips[label]:
            continue
        engine = open_engine(demo_on(label, work, args))
        with contextlib.ExitStack() as done:
            if label == "Postgres":
                done.callback(drop_database, args)
            done.callback(engine.close)
            yield label, engine


class RawQueries:
    """The analyst's SQL sent straight to an engine's database: the raw side of every DP /
    raw ratio.

    On DuckDB through the engine's backend (each statement in the read-only transaction every
    DP statement has too).  On Postgres on a connection of its own with the server's
    settings: the engine's connections plan with a lower ``random_page_cost``
    (``chorus_py.backends.postgres.RANDOM_PAGE_COST``, for the proxy's own twins), which
    changes the plans of some of the analyst's queries (a corpus question's raw time 421 ->
    686 ms): the raw side is what the analyst would get without the proxy."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._con: psycopg.Connection | None = None
        if engine.backend.dialect == "postgres":
            self._con = psycopg.connect(engine.policy.backend.url, autocommit=True)
            self._con.execute("SET default_transaction_read_only = on")

    def run(self, sql: str) -> list[tuple[Any, ...]]:
        """The rows of ``sql``."""
        if self._con is None:
            return self._engine.backend.run(sql).rows
        return self._con.execute(sql.encode()).fetchall()

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
