"""The kept set S of a table whose rows belong to several privacy units, stored by the proxy.

``rewriters.attribution`` chooses S from the attribution structure alone; this module keeps the
rows of S in the proxy's own schema, as ``chorus_private.<table>__attr_<keyed digest>``, a copy of
the kept rows with every column, and queries read that copy instead of the table (exactly like
``chorus_py.stores.samples`` samples, and through the same ``sample`` argument of the pipeline).  A
copy rather than a list of ids: a row whose units change after S was built cannot push a unit
past k, since queries see the snapshot whose bound was checked.

Versioning and naming follow ``chorus_py.stores.samples``: a fingerprint of the table (and of the
attribution table) is read at most once per TTL (Postgres statistics counters, or on DuckDB a row
count and a hash checksum of the declared columns, since S copies them); the name carries an
HMAC of it under the proxy's secret key, so analysts, who see the name in the rewritten SQL,
learn only that the data changed.  When the fingerprint changes S is chosen again and the old
copy dropped.

Every S is verified in SQL after it is stored: each unit has at most k rows in it and row ids are
unique there; otherwise it is dropped and the query refused (fail closed).

What is released about S: nothing to analysts (|S| and the rows per unit depend on the
structure, which the fixed-graph guarantee does not protect, see ``rewriters.attribution``).
The data owner sees them in ``chorus bound``.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import numpy as np
from sqlglot import exp

from chorus_py.backends import SCHEMA, Backend
from chorus_py.errors import InvalidParameter, OperationalError, PolicyError
from chorus_py.policy import AttributionTable, TablePolicy
from chorus_py.report import ContributionReport
from chorus_py.stores.owned import serialised
from rewriters.attribution import METHODS, Attribution, Method, Selection, select, sql_rank

log = logging.getLogger("chorus.attribution")

_UPLOAD_CHUNK = 200_000  # ids per INSERT: one string literal, parsed once


@dataclass(frozen=True)
class BoundSummary:
    """What ``chorus bound`` tells the data owner (exact: never shown to analysts)."""

    table: str
    method: Method
    k: int
    rows: int               # rows of the table
    kept: int               # |S|
    units: int              # units with at least one row
    max_rows_per_unit: int  # in S (<= k, checked in SQL)
    units_at_k: int         # units with exactly k rows in S
    mean_rows_per_unit: float   # in S, over units with a row in S
    mean_units_per_row: float   # over all rows with a unit
    mean_units_per_kept_row: float
    seconds: float
    stored_as: str | None   # chorus_private.<name>, or None for a dry run
    optimal: bool | None = None  # ilp: proven optimal within its time limit


class AttributionStore:
    """Keeps one up-to-date kept set S per multi-attribution table (thread-safe)."""

    def __init__(self, backend: Backend, naming_key: Callable[[], bytes],
                 ttl_seconds: float = 60.0, ilp_time_limit_seconds: float = 60.0) -> None:
        self._backend = backend
        self._key = naming_key
        self._ttl = ttl_seconds
        self._ilp_seconds = ilp_time_limit_seconds
        self._current: dict[str, tuple[float, str]] = {}
        self._lock = threading.Lock()

    def relation(self, table: str, policy: TablePolicy) -> str:
        """The name (in ``chorus_private``) of the current S of ``table``, built if needed."""
        now = time.monotonic()
        with self._lock:
            hit = self._current.get(table)
            if hit is not None and now - hit[0] < self._ttl:
                return hit[1]
            name, seed = self._version(table, policy)
            if not self._exists(name):
                try:
                    self._build(table, policy, name, _method(policy), seed)
                except (PolicyError, OperationalError) as err:
                    # Whether the data passes the checks is itself a fact about the data: the
                    # analyst learns only that the table is unavailable, the owner why.
                    log.error("kept set of %s not built: %s", table, err.message)
                    raise OperationalError(
                        f"table '{table}' is not available: the rows it keeps per unit could "
                        "not be chosen", hint="ask the data owner to run `chorus bound`") from None
            self._current[table] = (now, name)
            return name

    def bound(self, table: str, policy: TablePolicy, method: str | None = None,
              seed: int | None = None, progress: Callable[[float], None] | None = None
              ) -> BoundSummary:
        """Choose S now (the data owner's ``chorus bound``) and describe it.

        With the policy's method S replaces the table's current one (queries use it at once);
        another method is a dry run that stores nothing, to compare methods before choosing.
        """
        tell = progress or (lambda fraction: None)
        started = time.perf_counter()
        if method is not None and method not in METHODS:
            raise InvalidParameter(f"unknown method {method!r}",
                                   hint="one of " + ", ".join(METHODS))
        method = cast(Method, method or _method(policy))
        store = method == _method(policy)
        with self._lock:
            name, derived = self._version(table, policy)
            seed = derived if seed is None else seed
            att = _fetch(self._backend, table, policy)
            tell(0.05)
            if method == "sql-rank":
                kept_ids = [r[0] for r in self._backend.run(_rank_sql(
                    table, policy, seed, self._backend.dialect)).rows]
                keep = np.isin(att.row_ids, np.asarray(kept_ids, dtype=np.int64))
                sel = Selection(keep, "sql-rank")
            else:
                sel = self._select(att, policy, method, seed,
                                   lambda f: tell(0.05 + 0.8 * f))
            tell(0.85)
            stored = None
            if store:
                self._store(table, policy, name, att.row_ids[sel.keep])
                self._current[table] = (time.monotonic(), name)
                stored = f"{SCHEMA}.{name}"
            tell(1.0)
        total = self._backend.run(f'SELECT COUNT(*) FROM "{table}"').rows[0][0]
        per_unit = att.rows_per_unit(sel.keep)
        used = per_unit[per_unit > 0]
        degree = att.degrees()
        k = policy.contribution_bound
        return BoundSummary(
            table=table, method=method, k=k, rows=int(total), kept=int(sel.keep.sum()),
            units=att.n_units, max_rows_per_unit=int(used.max()) if len(used) else 0,
            units_at_k=int(np.count_nonzero(per_unit == k)),
            mean_rows_per_unit=float(used.mean()) if len(used) else 0.0,
            mean_units_per_row=float(degree[degree > 0].mean()) if att.n_rows else 0.0,
            mean_units_per_kept_row=float(degree[sel.keep].mean()) if sel.keep.any() else 0.0,
            seconds=time.perf_counter() - started, stored_as=stored,
            optimal=sel.optimal if method == "ilp" else None)

    # -- internals -----------------------------------------------------------------------------
    def _version(self, table: str, policy: TablePolicy) -> tuple[str, int]:
        """The name of S for the table's current data, and the seed of its random order.

        The seed is derived from the key and the fingerprint: every proxy sharing the database
        chooses the same S for the same data, and nobody without the key can predict it.
        """
        fingerprint = self._fingerprint(table, policy)
        mac = hmac.new(self._key(), fingerprint.encode(), hashlib.sha256).digest()
        return f"{table}__attr_{mac.hex()[:16]}", int.from_bytes(mac[16:24], "big") >> 2

    def _fingerprint(self, table: str, policy: TablePolicy) -> str:
        unit = policy.privacy_unit
        tables = [table] + ([unit.table] if isinstance(unit, AttributionTable) else [])
        parts = []
        for name in tables:
            if self._backend.dialect == "postgres":
                rows = self._backend.run(
                    "SELECT n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_user_tables "
                    f"WHERE schemaname = current_schema() AND relname = '{name}'").rows
            else:
                cols = _fingerprint_columns(table, name, policy)
                hashed = ", ".join(f'"{c}"' for c in cols)
                rows = self._backend.run(
                    f'SELECT COUNT(*), SUM(hash({hashed}) % 1000000007) FROM "{name}"').rows
            parts.append(str(rows))
        # The policy's bounding settings are part of the version: a new k or method, a new S.
        spec = policy.model_dump_json(include={"privacy_unit", "row_id", "max_rows_per_unit",
                                               "attribution_method", "attribution_balance"})
        return "|".join(parts) + "|" + spec

    def _exists(self, name: str) -> bool:
        return name in self._backend.owned_tables()

    def _select(self, att: Attribution, policy: TablePolicy, method: Method, seed: int,
                progress: Callable[[float], None]) -> Selection:
        balance = policy.attribution_balance
        extra = {"u": balance.u, "c1": balance.c1, "c2": balance.c2} if balance else {}
        return select(att, method, policy.contribution_bound, seed,
                      time_limit_seconds=self._ilp_seconds, progress=progress, **extra)

    def _build(self, table: str, policy: TablePolicy, name: str, method: Method,
               seed: int) -> None:
        started = time.perf_counter()
        if method == "sql-rank":
            self._store(table, policy, name, None, seed)
        else:
            att = _fetch(self._backend, table, policy)
            sel = self._select(att, policy, method, seed, lambda f: None)
            self._store(table, policy, name, att.row_ids[sel.keep])
        log.info("kept set of %s (%s) rebuilt as %s.%s in %.0f ms", table, method, SCHEMA, name,
                 (time.perf_counter() - started) * 1000)

    def _store(self, table: str, policy: TablePolicy, name: str, ids: np.ndarray | None,
               seed: int = 0) -> None:
        """Store S (``ids``; None: sql-rank in the database), check it, drop older versions."""
        dialect = self._backend.dialect
        rid = _row_id(policy)
        target = f'{SCHEMA}."{name}"'
        statements = [f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}", f"DROP TABLE IF EXISTS {target}"]
        if ids is None:
            kept = _rank_sql(table, policy, seed, dialect)
        else:
            staging = f'{SCHEMA}."{name}__ids"'
            statements += [f"DROP TABLE IF EXISTS {staging}",
                           f"CREATE TABLE {staging} (row_id BIGINT)"]
            for start in range(0, len(ids), _UPLOAD_CHUNK):
                chunk = ",".join(str(int(i)) for i in ids[start:start + _UPLOAD_CHUNK])
                values = (f"unnest('{{{chunk}}}'::BIGINT[])" if dialect == "postgres"
                          else "CAST(v AS BIGINT) FROM (SELECT explode(split("
                          f"'{chunk}', ',')) AS v) AS ids" if dialect == "spark"
                          else f"unnest(CAST(string_split('{chunk}', ',') AS BIGINT[]))")
                statements.append(f"INSERT INTO {staging} SELECT {values}")
            kept = f"SELECT row_id FROM {staging}"
        statements.append(f'CREATE TABLE {target} AS SELECT t.* FROM "{table}" AS t '
                          f'WHERE t."{rid}" IN ({kept})')
        if ids is not None:
            statements.append(f'DROP TABLE {SCHEMA}."{name}__ids"')
        if dialect == "postgres":
            statements.append(f"ANALYZE {target}")
        self._backend.run_owned(serialised(self._backend.dialect, statements))
        self._verify(table, policy, name)
        stale = [t for t in self._backend.owned_tables()
                 if t.startswith(f"{table}__attr_") and t != name]
        if stale:
            self._backend.run_owned(serialised(
                self._backend.dialect,
                [f'DROP TABLE IF EXISTS {SCHEMA}."{old}"' for old in stale]))

    def _verify(self, table: str, policy: TablePolicy, name: str) -> None:
        """Fail closed unless S keeps <= k rows of every unit, each row once (checked in SQL)."""
        k = policy.contribution_bound
        stored = exp.Table(this=exp.to_identifier(name, quoted=True),
                           db=exp.to_identifier(SCHEMA))
        pairs = _pairs(stored, policy).sql(self._backend.dialect)
        rid = _row_id(policy)
        worst, duplicates = self._backend.run(
            f"SELECT (SELECT COALESCE(MAX(c), 0) FROM (SELECT p.unit, COUNT(*) AS c FROM "
            f"({pairs}) AS p GROUP BY p.unit) AS per_unit), "
            f'(SELECT COUNT(*) - COUNT(DISTINCT "{rid}") FROM {SCHEMA}."{name}")').rows[0]
        if worst > k or duplicates:
            self._backend.run_owned(serialised(self._backend.dialect,
                                               [f'DROP TABLE IF EXISTS {SCHEMA}."{name}"']))
            log.error("kept set of %s failed its check (a unit above k, or a repeated row id)",
                      table)
            raise OperationalError(
                f"the rows kept for table '{table}' could not be verified (the table changed "
                "while they were chosen, or its row_id is not unique); the query was refused",
                hint="retry; if it persists, make the row_id column unique")


def _method(policy: TablePolicy) -> Method:
    return policy.attribution_method or "greedy"


def _row_id(policy: TablePolicy) -> str:
    unit = policy.privacy_unit
    rid = policy.row_id or (unit.row_id if isinstance(unit, AttributionTable) else None)
    assert rid is not None  # policy.check_attribution guarantees it
    return rid


def _fingerprint_columns(table: str, name: str, policy: TablePolicy) -> list[str]:
    unit = policy.privacy_unit
    if name != table and isinstance(unit, AttributionTable):
        return [unit.row_id, unit.unit_id]
    # Every declared column: S is a copy of the kept rows, so any change must rebuild it.
    cols = [_row_id(policy)] + (list(unit) if isinstance(unit, tuple) else [])
    return list(dict.fromkeys(cols + list(policy.columns)))


def _pairs(source: exp.Table, policy: TablePolicy) -> exp.Select:
    """``SELECT DISTINCT row_id, unit`` of the rows of ``source`` (the table, or a stored S)."""
    rid = _row_id(policy)
    unit = policy.privacy_unit
    if isinstance(unit, AttributionTable):
        rows = exp.select(exp.column(rid, table="t", quoted=True)).from_(
            source.copy().as_("t"))
        return (exp.select(exp.alias_(exp.column(unit.row_id, table="a", quoted=True), "row_id"),
                           exp.alias_(exp.column(unit.unit_id, table="a", quoted=True), "unit"))
                .distinct()
                .from_(exp.Table(this=exp.to_identifier(unit.table, quoted=True)).as_("a"))
                .where(exp.column(unit.unit_id, table="a", quoted=True).is_(exp.null()).not_())
                .where(exp.column(unit.row_id, table="a", quoted=True).isin(query=rows)))
    assert isinstance(unit, tuple)
    branches = [
        exp.select(exp.alias_(exp.column(rid, table="t", quoted=True), "row_id"),
                   exp.alias_(exp.column(c, table="t", quoted=True), "unit"))
        .from_(source.copy().as_("t"))
        .where(exp.column(c, table="t", quoted=True).is_(exp.null()).not_())
        .where(exp.column(rid, table="t", quoted=True).is_(exp.null()).not_())
        for c in unit]
    union: exp.Query = branches[0]
    for branch in branches[1:]:
        union = exp.union(union, branch, distinct=False)
    return exp.select("row_id", "unit").distinct().from_(union.subquery("u"))


def _table(table: str) -> exp.Table:
    return exp.Table(this=exp.to_identifier(table, quoted=True))


def _rank_sql(table: str, policy: TablePolicy, seed: int, dialect: str) -> str:
    return sql_rank(_pairs(_table(table), policy), policy.contribution_bound, seed,
                    dialect).sql(dialect)


def _fetch(backend: Backend, table: str, policy: TablePolicy) -> Attribution:
    """Read the attribution structure (row ids and units only, never other columns).

    Fails when the row id is not unique: S is stored by row id, and two rows sharing one would
    both be kept.
    """
    rid = _row_id(policy)
    total, distinct, nulls = backend.run(
        f'SELECT COUNT(*), COUNT(DISTINCT "{rid}"), COUNT(*) - COUNT("{rid}") '
        f'FROM "{table}"').rows[0]
    if total != distinct + nulls:
        raise PolicyError(f"tables.{table}.row_id: the column '{rid}' is not unique, so the "
                          "rows the proxy keeps cannot be named by it",
                          hint="declare a unique int column as row_id")
    dialect = backend.dialect
    pairs = _pairs(_table(table), policy).sql(dialect)
    probe = backend.run(f"SELECT p.unit FROM ({pairs}) AS p LIMIT 1").rows
    if not probe:
        empty = np.empty(0, np.int64)
        return Attribution.from_pairs(empty, empty, empty)
    if isinstance(probe[0][0], int) and dialect != "spark":
        # Integer units: two comma-separated strings, parsed by numpy, are about twice as fast
        # as a million Python tuples.  (Spark has no ordered string_agg: it sends the tuples.)
        order = "ORDER BY p.row_id, p.unit"
        text_rows, text_units = backend.run(
            f"SELECT string_agg(CAST(p.row_id AS VARCHAR), ',' {order}), "
            f"string_agg(CAST(p.unit AS VARCHAR), ',' {order}) FROM ({pairs}) AS p").rows[0]
        row_ids = np.fromstring(text_rows, dtype=np.int64, sep=",")
        units = np.fromstring(text_units, dtype=np.int64, sep=",")
    else:
        rows = backend.run(f"SELECT p.row_id, p.unit FROM ({pairs}) AS p "
                           "ORDER BY p.row_id").rows
        row_col, unit_col = zip(*rows, strict=True)
        row_ids = np.fromiter(row_col, dtype=np.int64, count=len(rows))
        units = np.array([str(u) for u in unit_col])
    # Rows with no unit are never kept (rewriters.attribution), so the row set is the pairs'.
    return Attribution.from_pairs(np.unique(row_ids), row_ids, units)


def attribution_report(policy: TablePolicy) -> ContributionReport:
    """What reports and EXPLAIN say about S: the method and k, never |S| (see the docstring)."""
    k = policy.contribution_bound
    method = _method(policy)
    note = (f"at most {k} rows per {policy.unit_label}: the query reads a stored set S of rows "
            f"chosen by the '{method}' method from who is attributed to each row, never from "
            "row contents (fixed-attribution DP: a neighbouring database adds or removes one "
            f"unit's <= {k} rows of S); how many rows S keeps depends on the attribution and is "
            "shown only to the data owner (`chorus bound`)")
    return ContributionReport("fixed", k, k, 0.0, note, method=method)


def summary_lines(s: BoundSummary) -> list[str]:
    """``chorus bound``'s report to the data owner."""
    share = s.kept / s.rows if s.rows else 0.0
    lines = [
        f"table {s.table}: method {s.method}, k = {s.k}"
        + ("" if s.optimal is None else f" ({'optimal' if s.optimal else 'time limit hit'})"),
        f"  |S| = {s.kept:,} of {s.rows:,} rows ({share:.1%})",
        f"  units: {s.units:,}; rows per unit in S: mean {s.mean_rows_per_unit:.2f}, "
        f"max {s.max_rows_per_unit} (bound {s.k}), {s.units_at_k:,} units at the bound",
        f"  units per row: {s.mean_units_per_kept_row:.2f} in S, "
        f"{s.mean_units_per_row:.2f} in the table",
        f"  {s.seconds:.2f} s; " + (f"stored as {s.stored_as}; queries read it from now on"
                                    if s.stored_as else
                                    "dry run (not the table's attribution_method): nothing "
                                    "stored"),
        "  These numbers depend on who is attributed to which row: keep them to yourself "
        "(analysts never see them).",
    ]
    return lines
