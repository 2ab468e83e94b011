"""Bounded samples the proxy stores in its own schema (``bounding = "materialized"``).

For a table with a privacy unit and cap k, the proxy keeps one random sample of at most k rows per
unit in ``chorus_private.<table>__bounded_<keyed digest>``; queries then read that sample instead
of ranking rows per query.  Stability stays k for every query (each unit has <= k rows in the
sample, chosen at random, independently of other units), and reusing one sample across queries
costs no privacy.

The sample is versioned by a fingerprint of its source table and rebuilt when the table changes:
on Postgres the ``pg_stat_user_tables`` counters (inserts, updates, deletes: cheap, updated by the
statistics collector within about a second); on DuckDB the row count with a hash checksum of the
unit and block columns (one scan of two columns).  The fingerprint is read at most once per TTL.
The sample holds only the rows of the table's scheduled blocks
(``chorus_py.stores.schedules``): a row
outside the schedule belongs to no block and takes no part in the ranking; the schedule's span is
part of the version, so the sample is rebuilt when a new block begins.

The sample's name appears in the rewritten SQL that reports show to analysts, and the counters
behind the fingerprint are exact data-derived numbers (an unkeyed hash of a small insert count
could be inverted by brute force).  So the name carries an HMAC of the fingerprint under a
random key kept in the proxy's own schema (``chorus_private.chorus_key``, created once): every
proxy sharing the database computes the same names, and an analyst, who cannot read that schema,
learns only that the data changed when the name does.
Analysts cannot reach the schema: the analyser refuses schema-qualified and undeclared tables.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import threading
import time

from sqlglot import exp

from analyses.blocks import BlockWindows
from chorus_py.backends import SCHEMA, Backend
from chorus_py.policy import TablePolicy
from chorus_py.stores.schedules import BlockCatalog
from rewriters.blocks import blocks as restrict_blocks
from rewriters.contribution import sample_table

log = logging.getLogger("chorus.materialize")


class BoundedSamples:
    """Keeps one up-to-date bounded sample per table (thread-safe)."""

    def __init__(self, backend: Backend, ttl_seconds: float = 60.0,
                 blocks: BlockCatalog | None = None) -> None:
        self._backend = backend
        self._ttl = ttl_seconds
        self._blocks = blocks or BlockCatalog()
        self._current: dict[str, tuple[float, str]] = {}
        self._lock = threading.Lock()
        self._key: bytes | None = None  # names the samples; see the module docstring

    def relation(self, table: str, policy: TablePolicy) -> str:
        """The name (``chorus_private.x``) of the current sample of ``table``."""
        now = time.monotonic()
        with self._lock:
            hit = self._current.get(table)
            if hit is not None and now - hit[0] < self._ttl:
                return hit[1]
            span = self._span(table, policy)
            digest = hmac.new(self._naming_key(),
                              f"{self._fingerprint(table, policy)}|{span}".encode(),
                              hashlib.sha256).hexdigest()[:16]
            name = f"{table}__bounded_{digest}"
            if hit is None or hit[1] != name:
                self._build(table, policy, name, span)
            self._current[table] = (now, name)
            return name

    def naming_key(self) -> bytes:
        """The proxy's secret key; it also names ``chorus_py.stores.attribution``'s kept sets."""
        return self._naming_key()

    def _naming_key(self) -> bytes:
        """The shared secret key of the proxy's schema, created by the first proxy to need it."""
        if self._key is None:
            self._backend.run_owned([
                f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}",
                f"CREATE TABLE IF NOT EXISTS {SCHEMA}.chorus_key (id INTEGER PRIMARY KEY, "
                "k TEXT NOT NULL)",
                # Two proxies racing here: the primary key keeps the first key only.
                f"INSERT INTO {SCHEMA}.chorus_key VALUES (1, '{secrets.token_hex(32)}') "
                "ON CONFLICT DO NOTHING",
            ])
            (key,) = self._backend.run(f"SELECT k FROM {SCHEMA}.chorus_key WHERE id = 1").rows[0]
            self._key = bytes.fromhex(key)
        return self._key

    def _fingerprint(self, table: str, policy: TablePolicy) -> str:
        assert policy.privacy_unit is not None
        if self._backend.dialect == "postgres":
            row = self._backend.run(
                "SELECT n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_user_tables "
                f"WHERE schemaname = current_schema() AND relname = '{table}'").rows
        else:
            cols = [policy.privacy_unit] + ([policy.block.column] if policy.block else [])
            hashed = ", ".join(f'"{c}"' for c in cols)
            row = self._backend.run(
                f'SELECT COUNT(*), SUM(hash({hashed}) % 1000000007) FROM "{table}"').rows
        # The cap is part of the version: a new max_rows_per_unit needs a new sample; so is
        # its layout ("ordered": in block order, indexed), so that older samples are rebuilt.
        return f"{row}|{policy.privacy_unit}|{policy.contribution_bound}|ordered"

    def _span(self, table: str, policy: TablePolicy) -> BlockWindows | None:
        """The table's scheduled windows now (None: no blocks): the sample holds only their
        rows, so rows outside the schedule never take part in the ranking."""
        return None if policy.block is None else self._blocks.windows(table, policy.block)

    def _build(self, table: str, policy: TablePolicy, name: str,
               span: BlockWindows | None) -> None:
        assert policy.privacy_unit is not None
        started = time.perf_counter()
        where = None
        if span is not None:
            assert policy.block is not None
            where = restrict_blocks(None, exp.column(policy.block.column, table="t",
                                                     quoted=True),
                                    span.start, span.end,
                                    policy.columns[policy.block.column].type)
        select = sample_table(table, policy.privacy_unit, policy.contribution_bound, where)
        existing = self._backend.run(
            "SELECT table_name FROM information_schema.tables "
            f"WHERE table_schema = '{SCHEMA}' AND table_name LIKE '{table}__bounded_%'").rows
        stale = [r[0] for r in existing if r[0] != name]
        statements = [f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"]
        if not any(r[0] == name for r in existing):
            dialect = self._backend.dialect
            if policy.block is not None:
                # Every query filters on its blocks' windows of the block column: rows stored in
                # that order let DuckDB skip row groups (zone maps) and, with an index, Postgres
                # read only the blocks a query asks for (a query over the last days of a
                # quarter no longer scans it all).
                select = exp.select("*").from_(select.subquery("s")).order_by(
                    exp.column(policy.block.column, quoted=True))
            statements.append(f'CREATE TABLE {SCHEMA}."{name}" AS {select.sql(dialect)}')
            if dialect == "postgres":
                if policy.block is not None:
                    statements.append(f'CREATE INDEX ON {SCHEMA}."{name}" '
                                      f'("{policy.block.column}")')
                # Without statistics the planner guesses ~1000 rows and picks sort-based plans.
                statements.append(f'ANALYZE {SCHEMA}."{name}"')
        statements += [f'DROP TABLE IF EXISTS {SCHEMA}."{old}"' for old in stale]
        self._backend.run_owned(statements)
        log.info("bounded sample of %s rebuilt as %s.%s in %.0f ms", table, SCHEMA, name,
                 (time.perf_counter() - started) * 1000)
