"""Where the ledger keeps its state: in memory, in a SQLite file, or in Postgres.

Every change to the ledger happens inside one :meth:`Store.transaction`, which is serialised
against every other transaction on the same ledger, in this process and in any other:

- :class:`MemoryStore`: a process-wide lock; changes are made on copies and applied at commit.
- :class:`SQLiteStore`: ``BEGIN IMMEDIATE`` takes SQLite's write lock before the first read, so
  two processes racing for the last budget run one after the other, the second seeing the first's
  commit (WAL mode, ``synchronous = FULL``: a committed change survives a crash or power loss).
- :class:`PostgresStore`: the transaction first locks the ledger's row in ``chorus_ledger_meta``
  (``SELECT ... FOR UPDATE``), which serialises ledger transactions of every proxy sharing the
  database the same way.

SQLite and Postgres share one code path, :class:`SQLStore`, on a SQLAlchemy 2 engine: the same
tables (Core ``Table`` objects, created under the ledger's lock), the same statements (built with
Core and compiled once for the engine's dialect, then run on the transaction's DBAPI cursor so a
claim costs little more than the database's own work), the same journal.  The engines differ
only in how they lock: on SQLite a ``connect`` event sets WAL mode and turns off the sqlite3
module's own transaction handling, and a ``begin`` event emits ``BEGIN IMMEDIATE`` (plain
``BEGIN`` for read-only snapshots); on Postgres each transaction starts with the row lock
(``with_for_update()``).  ``PostgresStore`` takes ``postgresql://``, ``postgres://`` or
SQLAlchemy's ``postgresql+psycopg://`` URLs.

A transaction reads only the blocks and claims it asks for, so a claim's cost does not grow with
the number of blocks in the ledger.  Block rows are written at checkpoints, not by every claim
(a query over a quarter of daily blocks charges about 90 of them): the journal rows a transaction
writes say exactly what it did to each block (``budget.journal``), so a block is read back as its
row, as of the checkpoint ``blocks_seq`` in the meta table, with the journal's events since then
applied; a transaction that has moved the journal ``CHECKPOINT_EVERY`` rows past the checkpoint
rewrites the rows of every block changed since, and moves the marker, in the same commit.  A
block change the journal does not name is refused before commit.  A SQL store also keeps the
blocks as its last commit left them (:class:`_BlockCache`): while the journal's last row is the
one that commit wrote, no transaction of any process has changed anything since, and the next
transaction starts from those blocks instead of reading them again; when another process has
committed since, the cached blocks catch up by applying its journal rows.  Every proxy sharing a
ledger must run a version with checkpoints: an older one would rewrite rows without moving the
marker (the block invariant then refuses every claim on those blocks: no overspend, no service).

A claim's list of blocks (about 90 ids for a quarter of days) is stored once, in the blocklists
table, and claim and journal rows name it by a hash of its contents (``budget.blocklists``); whoever
reads the ledger through this module gets the lists back.

Inside a transaction the ledger reads blocks and claims, changes them in memory and marks them
with ``save_*``; the store checks every changed block's invariant and writes everything, with the
journal rows describing the change, in the same commit.  Any exception rolls everything back.
The journal is append-only: rows are never updated or deleted (triggers refuse it, on SQLite
and on Postgres).
"""

from __future__ import annotations

import fcntl
import math
import operator
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import fields
from pathlib import Path
from typing import Any, NamedTuple

import orjson
from sqlalchemy import (
    JSON,
    URL,
    BigInteger,
    Column,
    Connection,
    Double,
    Engine,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    bindparam,
    cast,
    create_engine,
    event,
    func,
    insert,
    make_url,
    select,
    type_coerce,
    update,
)
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import OperationalError as OperationalError_

from budget.blocklists import BlockLists, Fetch, event_holder, packed_event, unpack
from budget.journal import apply as apply_event
from budget.journal import touched
from budget.scheduler import BlockState, ClaimRecord, InvariantError, check_blocks
from chorus_py.errors import OperationalError, PolicyError

__all__ = ["BLOCKS_KEY", "ClaimTotals", "LedgerMismatch", "LedgerUnavailable", "MemoryStore",
           "PostgresStore", "SQLStore", "SQLiteStore", "Store", "Tx"]

# Meta keys ``blocks:<table>``: how that table's blocks are cut (``Ledger.check_block_schemes``).
BLOCKS_KEY = "blocks:"

# The ledger's layout: 2 added block-row checkpoints, 3 block lists stored once by reference.
SCHEMA_VERSION = "3"


class LedgerUnavailable(OperationalError):
    """The ledger's database is busy or unreachable: no claim was made, nothing was spent."""


class LedgerMismatch(PolicyError, ValueError):
    """The stored ledger was created with other accounting settings than the policy's, or by a
    version of chorus with another layout: nothing is read or spent."""


# Block rows carry the format they were written in.  Rows of format 2 are as of the checkpoint
# (``_SQLTx.flush``); a row without it comes from a version that rewrote every row on every
# change and knew nothing of checkpoints, so reading it with the journal since the checkpoint
# would count events twice: refused, except once, when a ledger of schema 1 is upgraded.
_ROW_FORMAT = 2


def _block_from(data: str, legacy: bool = False) -> BlockState:
    d = orjson.loads(data)
    if d.pop("format", None) != _ROW_FORMAT and not legacy:
        raise InvariantError(
            f"block {d.get('block_id')} of the budget ledger was written by an older version of "
            "chorus, which does not keep journal checkpoints; nothing was spent")
    return BlockState(**d)


def _claim_from(d: dict[str, Any]) -> ClaimRecord:
    """A claim from its row's JSON (parsed, its block list unpacked: ``_claims_from``)."""
    d["blocks"] = tuple(d["blocks"])
    d["demand"] = tuple(d["demand"])
    d["events"] = tuple(d["events"])
    d["per_block"] = {k: tuple(v) for k, v in d.get("per_block", {}).items()}
    return ClaimRecord(**d)


_CLAIM_FIELDS = tuple(f.name for f in fields(ClaimRecord))


def _claim_json(claim: ClaimRecord, lists: BlockLists, new: dict[str, str]) -> str:
    # dataclasses.asdict deep-copies every event: too slow for one claim per transaction.
    d = {f: getattr(claim, f) for f in _CLAIM_FIELDS}
    d["blocks"] = lists.ref(claim.blocks, new)
    return _dumps(d)


def _block_json(block: BlockState) -> str:
    return _dumps({**block.to_dict(share=True), "format": _ROW_FORMAT})


def _dumps(value: Any) -> str:
    """Compact JSON text; numpy scalars (a mechanism's epsilon, say) are written as numbers."""
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY).decode()


class Tx:
    """One transaction's view of the ledger (see the module docstring)."""

    def __init__(self, accounting: str) -> None:
        self.accounting = accounting
        self._blocks: dict[str, BlockState] = {}
        self._new_blocks: set[str] = set()
        self._dirty_blocks: set[str] = set()
        self._claims: dict[int, ClaimRecord] = {}
        self._dirty_claims: set[int] = set()
        self._journal: list[tuple[float, str, int | None, dict[str, Any]]] = []
        self._new_claims: set[int] = set()

    # reads ----------------------------------------------------------------------------------
    def blocks(self, ids: Iterable[str]) -> dict[str, BlockState]:
        """The blocks among ``ids`` that exist (working copies, shared within the transaction)."""
        ids = list(ids)
        missing = [i for i in ids if i not in self._blocks]
        if missing:
            self._blocks.update(self._load_blocks(missing))
        return {i: self._blocks[i] for i in ids if i in self._blocks}

    def all_blocks(self) -> list[BlockState]:
        """Every block, sorted by id."""
        for block in self._load_all_blocks():
            self._blocks.setdefault(block.block_id, block)
        return [self._blocks[k] for k in sorted(self._blocks)]

    def claim(self, claim_id: int) -> ClaimRecord | None:
        """One claim, or None."""
        if claim_id not in self._claims:
            found = self._load_claim(claim_id)
            if found is None:
                return None
            self._claims[claim_id] = found
        return self._claims[claim_id]

    def open_claims(self) -> list[ClaimRecord]:
        """Claims waiting or allocated, oldest first."""
        for rec in self._load_open_claims():
            self._claims.setdefault(rec.claim_id, rec)
        return sorted((c for c in self._claims.values() if c.state in ("waiting", "allocated")),
                      key=lambda c: c.claim_id)

    def waiting(self) -> list[ClaimRecord]:
        """Waiting claims, oldest first."""
        for rec in self._load_open_claims(waiting_only=True):
            self._claims.setdefault(rec.claim_id, rec)
        return sorted((c for c in self._claims.values() if c.state == "waiting"),
                      key=lambda c: c.claim_id)

    # writes ---------------------------------------------------------------------------------
    def add_block(self, block: BlockState) -> None:
        """Create a block."""
        self._blocks[block.block_id] = block
        self._new_blocks.add(block.block_id)
        self._dirty_blocks.add(block.block_id)

    def save_block(self, block: BlockState) -> None:
        """Mark a block changed."""
        self._blocks[block.block_id] = block
        self._dirty_blocks.add(block.block_id)

    def changed_in_place(self, ids: Iterable[str]) -> None:
        """Mark blocks changed that were changed in place: the working copies ``blocks``
        returned (no pass over the objects: a claim changes ~90)."""
        self._dirty_blocks.update(ids)

    def add_claim(self, claim: ClaimRecord) -> int:
        """Store a new claim (written at commit); assigns and returns its id."""
        claim.claim_id = self._next_claim_id()
        self._claims[claim.claim_id] = claim
        self._new_claims.add(claim.claim_id)
        return claim.claim_id

    def save_claim(self, claim: ClaimRecord) -> None:
        """Mark a claim changed."""
        self._claims[claim.claim_id] = claim
        self._dirty_claims.add(claim.claim_id)

    def log(self, event: str, claim_id: int | None, data: dict[str, Any], at: float) -> None:
        """Append a journal row (written at commit)."""
        self._journal.append((at, event, claim_id, data))

    def changed_blocks(self) -> list[BlockState]:
        """Blocks this transaction changed, invariant-checked (raises InvariantError)."""
        out = [self._blocks[i] for i in sorted(self._dirty_blocks)]
        check_blocks(out, self.accounting)
        return out

    # backend hooks --------------------------------------------------------------------------
    def _load_blocks(self, ids: list[str]) -> dict[str, BlockState]:
        raise NotImplementedError

    def _load_all_blocks(self) -> list[BlockState]:
        raise NotImplementedError

    def _load_claim(self, claim_id: int) -> ClaimRecord | None:
        raise NotImplementedError

    def _load_open_claims(self, waiting_only: bool = False) -> list[ClaimRecord]:
        raise NotImplementedError

    def _next_claim_id(self) -> int:
        raise NotImplementedError


class ClaimTotals(NamedTuple):
    """The claims of one analyst in one state: how many, and the sums of their epsilon and
    delta as asked (a claim's own ``epsilon``/``delta``; a missing or non-finite one counts 0)."""

    analyst: str
    state: str
    claims: int
    epsilon: float
    delta: float


class Store:
    """A ledger's storage: transactions, plus read-only listings for operators."""

    durable = False

    def transaction(self, accounting: str) -> Any:  # a context manager yielding a Tx
        raise NotImplementedError

    def check_meta(self, meta: dict[str, str]) -> None:
        """Record the ledger's settings on first use; refuse a ledger made with others."""
        raise NotImplementedError

    def meta(self) -> dict[str, str]:
        """The settings recorded so far."""
        raise NotImplementedError

    def claims(self, analyst: str | None = None,
               states: Iterable[str] | None = None) -> list[ClaimRecord]:
        """Every claim, oldest first; when given, only ``analyst``'s and only in ``states``."""
        raise NotImplementedError

    def claim_totals(self, analyst: str | None = None) -> list[ClaimTotals]:
        """Per analyst and state, how many claims and the sums of their own epsilon and delta,
        sorted by analyst, then state; when given, only ``analyst``'s.  SQL stores answer with
        one GROUP BY: no claim is loaded into Python."""
        raise NotImplementedError

    def journal(self, since: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        """Journal rows with seq > ``since``, oldest first."""
        raise NotImplementedError

    def close(self) -> None:
        """Release connections."""


def _check_meta(stored: dict[str, str], wanted: dict[str, str], where: str) -> None:
    for key, value in wanted.items():
        if key == "schema" and key in stored and stored[key] != value:
            newer = stored[key].isdigit() and value.isdigit() and int(stored[key]) > int(value)
            raise LedgerMismatch(
                f"the budget ledger {where} has layout (schema) {stored[key]}, written by "
                f"{'a newer' if newer else 'another'} version of chorus; this one reads schema "
                f"{value}", hint="run the same chorus version on every proxy that shares the "
                "ledger (a newer one upgrades an older ledger when it opens it)")
        if key.startswith(BLOCKS_KEY) and key in stored and stored[key] != value:
            table = key.removeprefix(BLOCKS_KEY)
            raise LedgerMismatch(
                f"the budget ledger {where} holds blocks of table {table} cut as "
                f"'{stored[key]}', but the policy now cuts them as '{value}': blocks of the two "
                "cuts overlap, so the same rows would be charged on fresh budget",
                hint=f"keep tables.{table}.block as the ledger was made with it (for weeks that "
                "began on Thursdays: week_start = \"thursday\"), or point privacy.ledger at a "
                "new ledger if the owner means to start every budget afresh")
        if key in stored and stored[key] != value:
            raise LedgerMismatch(
                f"the budget ledger {where} was created with {key} = {stored[key]}, but the "
                f"policy now says {value}; budgets in different units cannot be mixed",
                hint="use the settings the ledger was created with, or a new ledger")


# -- memory -----------------------------------------------------------------------------------
class _MemoryTx(Tx):
    # Claims are handed out without copying (a pass may look at thousands of waiting claims);
    # the fields a transaction may change are saved first and restored on rollback.
    def __init__(self, store: MemoryStore, accounting: str) -> None:
        super().__init__(accounting)
        self._store = store
        self._undo: list[tuple[ClaimRecord, tuple[Any, ...]]] = []

    def _keep(self, rec: ClaimRecord) -> ClaimRecord:
        self._undo.append((rec, (rec.state, rec.reason, rec.granted_order)))
        return rec

    def rollback(self) -> None:
        for rec, (state, reason, order) in reversed(self._undo):
            rec.state, rec.reason, rec.granted_order = state, reason, order

    def _load_blocks(self, ids: list[str]) -> dict[str, BlockState]:
        return {i: self._store._blocks[i].copy() for i in ids if i in self._store._blocks}

    def _load_all_blocks(self) -> list[BlockState]:
        return [b.copy() for k, b in self._store._blocks.items() if k not in self._blocks]

    def _load_claim(self, claim_id: int) -> ClaimRecord | None:
        rec = self._store._claims.get(claim_id)
        return None if rec is None else self._keep(rec)

    def _load_open_claims(self, waiting_only: bool = False) -> list[ClaimRecord]:
        claims = self._store._claims
        return [self._keep(claims[i]) for i in sorted(self._store._open)
                if i not in self._claims and (not waiting_only or claims[i].state == "waiting")]

    def _next_claim_id(self) -> int:
        self._store._next_id += 1  # ids are never reused, even after a rollback
        return self._store._next_id


def _copy_claim(rec: ClaimRecord) -> ClaimRecord:
    return ClaimRecord(**{**rec.__dict__, "per_block": dict(rec.per_block)})


def _finite(value: Any) -> float:
    # What a SQL store sums: JSON has no NaN or infinity (orjson writes them as null), and SUM
    # skips nulls.
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return 0.0
    return float(value)


class MemoryStore(Store):
    """State in this process only: fast, lost on exit."""

    def __init__(self) -> None:
        self._blocks: dict[str, BlockState] = {}
        self._claims: dict[int, ClaimRecord] = {}
        self._open: set[int] = set()
        self._journal: list[dict[str, Any]] = []
        self._meta: dict[str, str] = {}
        self._next_id = 0
        self._lock = threading.RLock()

    @contextmanager
    def transaction(self, accounting: str) -> Iterator[Tx]:
        with self._lock:
            tx = _MemoryTx(self, accounting)
            try:
                yield tx
                changed = tx.changed_blocks()  # checks invariants before anything is applied
            except BaseException:
                tx.rollback()
                raise
            for block in changed:
                self._blocks[block.block_id] = block
            for claim_id in tx._dirty_claims | {c for c in tx._claims if c not in self._claims}:
                rec = tx._claims[claim_id]
                self._claims[claim_id] = rec
                if rec.state in ("waiting", "allocated"):
                    self._open.add(claim_id)
                else:
                    self._open.discard(claim_id)
            for at, event, claim_id, data in tx._journal:
                self._journal.append({"seq": len(self._journal) + 1, "at": at, "event": event,
                                      "claim_id": claim_id, "data": data})

    def check_meta(self, meta: dict[str, str]) -> None:
        with self._lock:
            _check_meta(self._meta, meta, "in memory")
            self._meta.update(meta)

    def meta(self) -> dict[str, str]:
        with self._lock:
            return dict(self._meta)

    def claims(self, analyst: str | None = None,
               states: Iterable[str] | None = None) -> list[ClaimRecord]:
        wanted = None if states is None else frozenset(states)
        with self._lock:
            picked = (self._claims[k] for k in sorted(self._claims))
            return [_copy_claim(c) for c in picked
                    if (analyst is None or c.analyst == analyst)
                    and (wanted is None or c.state in wanted)]

    def claim_totals(self, analyst: str | None = None) -> list[ClaimTotals]:
        sums: dict[tuple[str, str], list[Any]] = {}
        with self._lock:
            for k in sorted(self._claims):  # claim order, as summing ``claims()`` would
                c = self._claims[k]
                if analyst is None or c.analyst == analyst:
                    entry = sums.setdefault((c.analyst, c.state), [0, 0.0, 0.0])
                    entry[0] += 1
                    entry[1] += _finite(c.epsilon)
                    entry[2] += _finite(c.delta)
        return [ClaimTotals(a, s, *sums[a, s]) for a, s in sorted(sums)]

    def journal(self, since: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._journal[since:]
            return [dict(r) for r in (rows if limit is None else rows[:limit])]


# -- SQL (SQLite, Postgres) through SQLAlchemy Core ----------------------------------------------
def _tables(prefix: str) -> tuple[MetaData, Table, Table, Table, Table]:
    """The ledger's four tables (same layout on SQLite and Postgres)."""
    # INTEGER PRIMARY KEY on SQLite: an alias of the rowid (AUTOINCREMENT for the journal).
    big = BigInteger().with_variant(Integer(), "sqlite")
    md = MetaData()
    meta = Table(f"{prefix}meta", md,
                 Column("key", Text, primary_key=True),
                 Column("value", Text, nullable=False))
    blocks = Table(f"{prefix}blocks", md,
                   Column("block_id", Text, primary_key=True),
                   Column("state", Text, nullable=False),
                   Column("data", Text, nullable=False))
    claims = Table(f"{prefix}claims", md,
                   Column("claim_id", big, primary_key=True, autoincrement=False),
                   Column("state", Text, nullable=False),
                   Column("analyst", Text, nullable=False),
                   Column("owner", Text, nullable=False),
                   Column("data", Text, nullable=False),
                   Index(f"{prefix}claims_state", "state"))
    journal = Table(f"{prefix}journal", md,
                    Column("seq", big, primary_key=True, autoincrement=True),
                    Column("at", Double, nullable=False),
                    Column("event", Text, nullable=False),
                    Column("claim_id", BigInteger),
                    Column("data", Text, nullable=False),
                    sqlite_autoincrement=True)
    # A claim's block list (90 ids for a quarter of days) is stored once here, and named by a
    # hash of its contents in the claim rows and journal rows (``budget.blocklists``).
    Table(f"{prefix}blocklists", md,
          Column("list_id", Text, primary_key=True),
          Column("blocks", Text, nullable=False))
    return md, meta, blocks, claims, journal


def _block_state(block: BlockState) -> str:
    return "retired" if block.retired else "active"


class _Compiled:
    """A Core statement compiled once for the store's dialect, run on the transaction's DBAPI
    cursor (SQLAlchemy's own per-execution work would cost more than SQLite does)."""

    def __init__(self, statement: Any, dialect: Any, fixed: dict[str, Any] | None = None) -> None:
        compiled = statement.compile(dialect=dialect)
        self.sql = compiled.string
        self.order = tuple(compiled.positiontup or ()) if compiled.positional else None
        # Parameters that never change: literals of the statement (the 0 of COALESCE) and
        # ``fixed``; the others are given at each execution.
        self.fixed = {**{k: v for k, v in compiled.params.items() if v is not None},
                      **(fixed or {})}
        # Positional dialects (SQLite): one C-level lookup builds a row's tuple (a claim
        # writes one row per block it charges).
        self._pick = operator.itemgetter(*self.order) if self.order else None

    def params(self, values: dict[str, Any]) -> Any:
        if self.fixed:
            values = {**self.fixed, **values}
        if self._pick is None:
            return values if self.order is None else ()
        picked = self._pick(values)
        return picked if len(self.order or ()) > 1 else (picked,)


class _BlockCache:
    """Blocks as this store's last commit left them, valid while the journal has not moved.

    Every transaction that changes a block also appends to the journal (in the same commit;
    ``_SQLTx.flush`` refuses to commit otherwise), so the journal's last ``seq`` names the
    ledger's state: when it is still the one our last commit left, the blocks we hold are
    exactly the ledger's, and ``blocks_seq`` the checkpoint their stored rows are as of.  Used
    only under the ledger's write lock (one transaction at a time), so it needs no lock of its
    own.
    """

    def __init__(self) -> None:
        self.blocks: dict[str, BlockState] = {}
        self.seq: int | None = None  # the journal's last seq when ``blocks`` were current
        self.blocks_seq: int | None = None  # the rows' checkpoint then (None: unknown)
        # The blocks the journal names after the checkpoint ``blocks_seq``: exactly those whose
        # rows the next checkpoint rewrites.  Known only while every journal row since the
        # checkpoint was written by this store (None: unknown, the checkpoint reads them from
        # the journal instead).
        self.since_checkpoint: set[str] | None = None

    def start(self, seq: int) -> dict[str, BlockState]:
        """The cached blocks a transaction may use, given the journal's last seq now."""
        if seq != self.seq:
            self.blocks.clear()  # someone else committed: read everything afresh
            self.seq, self.blocks_seq, self.since_checkpoint = seq, None, None
        return self.blocks

    def committed(self, tx: _SQLTx, seq: int) -> None:
        """``tx`` committed and the journal now ends at ``seq``: its blocks are current."""
        self.blocks.update(tx._blocks)
        self.seq, self.blocks_seq = seq, tx._blocks_seq
        self.since_checkpoint = tx.since_checkpoint

    def abandoned(self, tx: _SQLTx) -> None:
        """``tx`` rolled back: the blocks it handed out may have been changed in memory."""
        for block_id in tx._blocks:
            self.blocks.pop(block_id, None)


# Block rows are written at a checkpoint once the journal has grown by this many rows since
# the last one (a claim writes about three): between checkpoints a claim writes its claim and
# journal rows only, not one row per block it charges, and reading a block back applies at most
# this many journal rows to its stored row.
CHECKPOINT_EVERY = 64
# A store whose cached blocks are at most this many journal rows behind catches up by applying
# them; further behind, it reads the blocks it needs afresh.
CATCH_UP_LIMIT = 256


class _SQLTx(Tx):
    def __init__(self, store: SQLStore, conn: Connection, accounting: str) -> None:
        super().__init__(accounting)
        self._s = store
        self._conn = conn
        # The DBAPI cursor of the connection SQLAlchemy began the transaction on.
        self._cur = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        self._last = self.last_seq()
        cache = store._cache
        behind = self._last - cache.seq if cache.seq is not None else -1
        if 0 < behind <= CATCH_UP_LIMIT and cache.blocks:
            # Another process committed since our last transaction: bring the cached blocks
            # up to date with its journal rows rather than reading them all again (two
            # proxies on one ledger would otherwise re-read every block on every claim).
            for kind, data in self._events(self._rows(
                    store.q_journal_tail, {"after": cache.seq, "upto": self._last})):
                apply_event(cache.blocks, kind, data, only=cache.blocks.keys())
            cache.seq, cache.blocks_seq = self._last, None  # it may have moved the checkpoint
            cache.since_checkpoint = None
        self._cached = cache.start(self._last)
        # The checkpoint the block rows are as of: the journal rows after it are applied to a
        # block read from its row.  A ledger written before checkpoints existed has no such
        # row: its block rows are current (None here; the first write makes a checkpoint).
        self._blocks_seq = cache.blocks_seq
        # The blocks the journal names since that checkpoint, when the cache knows them (a
        # copy: this transaction may roll back).  At commit: those as of the commit.
        known = cache.since_checkpoint if self._blocks_seq is not None else None
        self.since_checkpoint = set(known) if known is not None else None
        if self._blocks_seq is None:
            rows = self._rows(store.q_meta, {"key": "blocks_seq"})
            self._blocks_seq = int(rows[0][0]) if rows else None
        self._tail: list[tuple[str, dict[str, Any]]] | None = None
        self.seq_after = self._last
        self.new_lists: dict[str, str] = {}  # block lists this transaction stores (id -> JSON)

    def last_seq(self) -> int:
        """The journal's last seq (0 when empty), as this transaction sees it."""
        return int(self._rows(self._s.q_last_seq)[0][0])

    def _rows(self, statement: _Compiled, values: dict[str, Any] | None = None) -> list[Any]:
        self._cur.execute(statement.sql, statement.params(values or {}))
        return self._cur.fetchall()

    def _stored_lists(self, ids: list[str]) -> list[tuple[str, str]]:
        out = []
        for start in range(0, len(ids), 500):  # SQLite's limit on bound parameters
            chunk = ids[start:start + 500]
            out += self._rows(self._s.q_lists(len(chunk)),
                              {f"id{i}": x for i, x in enumerate(chunk)})
        return out

    def _events(self, rows: Iterable[tuple[str, str]]) -> list[tuple[str, dict[str, Any]]]:
        return self._s._events_from(rows, self._stored_lists)

    # Only the blocks and claims a transaction asks for are read, and only those it changed are
    # written back: a claim's cost does not grow with the number of blocks in the ledger.
    def _load_blocks(self, ids: list[str]) -> dict[str, BlockState]:
        cached = self._cached
        out = {i: cached[i] for i in ids if i in cached}
        missing = [i for i in ids if i not in out]
        if not missing:
            return out
        read: dict[str, BlockState] = {}
        for start in range(0, len(missing), 500):
            chunk = missing[start:start + 500]
            for (data,) in self._rows(self._s.q_blocks(len(chunk)),
                                      {f"id{i}": b for i, b in enumerate(chunk)}):
                block = _block_from(data)
                read[block.block_id] = block
        self._apply_tail(read, set(missing))
        return {**out, **read}

    def _load_all_blocks(self) -> list[BlockState]:
        read = {i: _block_from(d) for i, d in self._rows(self._s.q_all_blocks)
                if i not in self._blocks}
        created = {touched(e, d)[0] for e, d in self._journal_tail() if e == "block_created"}
        self._apply_tail(read, (set(read) | created) - set(self._blocks))
        return list(read.values())

    def _journal_tail(self) -> list[tuple[str, dict[str, Any]]]:
        """The journal's events after the block rows' checkpoint, up to this transaction."""
        if self._tail is None:
            after = self._last if self._blocks_seq is None else self._blocks_seq
            self._tail = self._events(self._rows(
                self._s.q_journal_tail, {"after": after, "upto": self._last}))
        return self._tail

    def _apply_tail(self, read: dict[str, BlockState], ids: set[str]) -> None:
        """Bring blocks read from their rows (``read``, the blocks ``ids``) up to date."""
        for kind, data in self._journal_tail():
            apply_event(read, kind, data, only=ids)

    def _load_claim(self, claim_id: int) -> ClaimRecord | None:
        rows = self._rows(self._s.q_claim, {"id": claim_id})
        return self._s._claims_from([rows[0][0]], self._stored_lists)[0] if rows else None

    def _load_open_claims(self, waiting_only: bool = False) -> list[ClaimRecord]:
        rows = self._rows(self._s.q_waiting if waiting_only else self._s.q_open_claims)
        return self._s._claims_from([d for i, d in rows if i not in self._claims],
                                    self._stored_lists)

    def _next_claim_id(self) -> int:
        # The transaction holds the ledger's write lock (BEGIN IMMEDIATE / FOR UPDATE), so no
        # other transaction can take the same id; a rolled-back id is simply reused.
        if not self._new_claims:
            self._base_id = int(self._rows(self._s.q_max_claim)[0][0])
        self._base_id += 1
        return self._base_id

    def _write(self, statement: _Compiled, rows: list[dict[str, Any]]) -> None:
        if len(rows) == 1:
            self._cur.execute(statement.sql, statement.params(rows[0]))
        else:
            self._cur.executemany(statement.sql, [statement.params(r) for r in rows])

    def flush(self) -> None:
        """Write the transaction: claims and journal rows always, block rows at checkpoints.

        A changed block's row is not rewritten on every claim: the journal rows written here
        say what changed, and a block is read back as its row plus the journal since the
        checkpoint (``_load_blocks``).  So every change to a block must be in the journal,
        exactly: a change that is not would be lost, and is refused here instead.
        """
        s = self._s
        changed = self.changed_blocks()
        journaled: set[str] = set()
        for _, kind, _, data in self._journal:
            journaled.update(touched(kind, data))
        if journaled != self._dirty_blocks:  # the ids of ``changed``
            raise InvariantError(
                "a ledger transaction changed blocks its journal rows do not name "
                f"({sorted(journaled.symmetric_difference(b.block_id for b in changed))}); "
                "nothing was written")
        new = [b for b in changed if b.block_id in self._new_blocks]
        if new:  # a new block's row: its block_created event resets it when read back
            self._write(s.insert_block, [
                {"block_id": b.block_id, "state": _block_state(b), "data": _block_json(b)}
                for b in new])
        lists, new = s._lists, self.new_lists
        claim_rows = [
            {"claim_id": c.claim_id, "state": c.state, "analyst": c.analyst,
             "owner": c.owner, "data": _claim_json(c, lists, new)}
            for c in (self._claims[i] for i in sorted(self._new_claims))]
        updated_rows = [
            {"c_id": c.claim_id, "c_state": c.state, "c_data": _claim_json(c, lists, new)}
            for c in (self._claims[i] for i in sorted(self._dirty_claims - self._new_claims))]
        journal_rows = [
            {"at": at, "event": event, "claim_id": claim_id,
             "data": _dumps(packed_event(event, data, lists, new))}
            for at, event, claim_id, data in self._journal]
        if new:  # lists first: a row never names a list its commit does not hold
            ids = sorted(new)
            have = {i for i, _ in self._stored_lists(ids)}
            rows = [{"list_id": i, "blocks": new[i]} for i in ids if i not in have]
            if rows:
                self._write(s.insert_list, rows)
        if claim_rows:
            self._write(s.insert_claim, claim_rows)
        if updated_rows:
            self._write(s.update_claim, updated_rows)
        if not journal_rows:
            return
        self._write(s.insert_journal, journal_rows)
        self.seq_after = self.last_seq()
        if self._blocks_seq is None or self.seq_after - self._blocks_seq >= CHECKPOINT_EVERY:
            self._checkpoint(journaled)
        elif self.since_checkpoint is not None:
            self.since_checkpoint |= journaled

    def _upgrade_rows(self) -> None:
        """Stamp the current rows of a schema-1 ledger as the checkpoint at the journal's end."""
        rows = [_block_from(d, legacy=True) for _, d in self._rows(self._s.q_all_blocks)]
        if rows:
            self._write(self._s.update_block, [
                {"b_id": b.block_id, "b_state": _block_state(b), "b_data": _block_json(b)}
                for b in rows])
        self.seq_after = self._last
        self._write_marker()

    def _write_marker(self) -> None:
        """The rows are as of ``seq_after`` now (no block is changed since)."""
        if self._blocks_seq is None:
            self._write(self._s.insert_meta, [{"key": "blocks_seq", "value": str(self.seq_after)}])
        else:
            self._write(self._s.update_meta, [{"m_key": "blocks_seq",
                                               "m_value": str(self.seq_after)}])
        self._blocks_seq = self.seq_after
        self.since_checkpoint = set()

    def _checkpoint(self, journaled: set[str]) -> None:
        """Write every block changed since the last checkpoint, as of this transaction."""
        s = self._s
        # The blocks named by the journal rows since the checkpoint: known to the cache when
        # this store wrote them all (no journal to read and parse), else read from the journal.
        since = self.since_checkpoint
        if since is None:
            since = {b for kind, data in self._journal_tail() for b in touched(kind, data)}
        ids = journaled | since
        have = self.blocks(sorted(ids))
        if ids:
            self._write(s.update_block, [
                {"b_id": b.block_id, "b_state": _block_state(b), "b_data": _block_json(b)}
                for b in (have[i] for i in sorted(ids))])
        self._write_marker()


_PROCESS_LOCKS: dict[str, threading.Lock] = {}
_PROCESS_LOCKS_GUARD = threading.Lock()


def _process_lock(where: str) -> threading.Lock:
    """One lock per ledger database in this process (several stores may open the same one).

    A plain lock, not re-entrant (no transaction opens another): a claim decided in its
    caller's thread is committed, and its transaction's lock released, by the ledger's commit
    thread (``Ledger.claim_overlapped``)."""
    with _PROCESS_LOCKS_GUARD:
        return _PROCESS_LOCKS.setdefault(where, threading.Lock())


class SQLStore(Store):
    """A ledger in a SQL database through one SQLAlchemy engine (SQLite or Postgres).

    Subclasses configure the engine (:class:`SQLiteStore`, :class:`PostgresStore`); reads,
    writes, the schema and the journal are the same code for both.
    """

    durable = True
    where = ""
    lock_key = ""  # names the ledger database for the in-process lock (``transaction``)

    # Hook for the crash test: called after every write of a transaction, before COMMIT.
    before_commit: Any = None

    def __init__(self, engine: Engine, prefix: str, *, row_lock: bool,
                 schema_lock: str | None = None, extra_ddl: Iterable[str] = ()) -> None:
        self.engine = engine
        self.t = prefix
        self._row_lock = row_lock
        self._md, self.meta_t, self.blocks_t, self.claims_t, self.journal_t = _tables(prefix)
        self.lists_t = self._md.tables[f"{prefix}blocklists"]
        self._lists = BlockLists()
        self._lists_in: dict[int, _Compiled] = {}
        bc, cc = self.blocks_t.c, self.claims_t.c
        # The statements of transactions, built with Core and compiled once for the dialect.
        dialect = engine.dialect

        def compiled(statement: Any) -> _Compiled:
            return _Compiled(statement, dialect)

        def open_claims(states: list[str]) -> _Compiled:
            names = {f"state{i}": state for i, state in enumerate(states)}
            return _Compiled(select(cc.claim_id, cc.data)
                             .where(cc.state.in_([bindparam(k) for k in names]))
                             .order_by(cc.claim_id), dialect, fixed=names)

        def insert_all(table: Table, skip: tuple[str, ...] = ()) -> _Compiled:
            return compiled(insert(table).values(
                {c.name: bindparam(c.name) for c in table.columns if c.name not in skip}))

        self._dialect = dialect
        self._blocks_in: dict[int, _Compiled] = {}
        self.q_all_blocks = compiled(select(bc.block_id, bc.data))
        self.q_claim = compiled(select(cc.data).where(cc.claim_id == bindparam("id")))
        self.q_open_claims = open_claims(["waiting", "allocated"])
        self.q_waiting = open_claims(["waiting"])
        self.q_max_claim = compiled(select(func.coalesce(func.max(cc.claim_id), 0)))
        self.q_last_seq = compiled(select(func.coalesce(func.max(self.journal_t.c.seq), 0)))
        jc, mc = self.journal_t.c, self.meta_t.c
        self.q_journal_tail = compiled(
            select(jc.event, jc.data)
            .where(jc.seq > bindparam("after"), jc.seq <= bindparam("upto")).order_by(jc.seq))
        self.q_meta = compiled(select(mc.value).where(mc.key == bindparam("key")))
        self.insert_meta = insert_all(self.meta_t)
        self.update_meta = compiled(
            update(self.meta_t).where(mc.key == bindparam("m_key"))
            .values(value=bindparam("m_value")))
        self._cache = _BlockCache()
        self._writer: Connection | None = None  # see _begin
        self.insert_block = insert_all(self.blocks_t)
        self.insert_claim = insert_all(self.claims_t)
        self.insert_journal = insert_all(self.journal_t, skip=("seq",))
        self.insert_list = insert_all(self.lists_t)
        self.update_block = compiled(
            update(self.blocks_t).where(bc.block_id == bindparam("b_id"))
            .values(state=bindparam("b_state"), data=bindparam("b_data")))
        self.update_claim = compiled(
            update(self.claims_t).where(cc.claim_id == bindparam("c_id"))
            .values(state=bindparam("c_state"), data=bindparam("c_data")))
        self._lock_row = (select(self.meta_t.c.value).where(self.meta_t.c.key == "lock")
                          .with_for_update())
        # Creating the schema happens under the ledger's lock (BEGIN IMMEDIATE on SQLite, an
        # advisory lock on Postgres), so processes starting together agree.
        with self.engine.connect() as conn:
            conn.begin()
            if schema_lock is not None:
                conn.exec_driver_sql(schema_lock)
            self._md.create_all(conn)
            for ddl in extra_ddl:
                conn.exec_driver_sql(ddl)
            conn.commit()

    def q_blocks(self, n: int) -> _Compiled:
        """SELECT the data of ``n`` blocks (parameters id0 ... id<n-1>)."""
        found = self._blocks_in.get(n)
        if found is None:
            bc = self.blocks_t.c
            found = self._blocks_in[n] = _Compiled(
                select(bc.data).where(bc.block_id.in_([bindparam(f"id{i}") for i in range(n)])),
                self._dialect)
        return found

    def q_lists(self, n: int) -> _Compiled:
        """SELECT ``n`` stored block lists (parameters id0 ... id<n-1>)."""
        found = self._lists_in.get(n)
        if found is None:
            lc = self.lists_t.c
            found = self._lists_in[n] = _Compiled(
                select(lc.list_id, lc.blocks)
                .where(lc.list_id.in_([bindparam(f"id{i}") for i in range(n)])), self._dialect)
        return found

    def _claims_from(self, texts: Iterable[str], fetch: Fetch) -> list[ClaimRecord]:
        """Claims from their rows' JSON; ``fetch(ids)`` reads stored block lists."""
        dicts = [orjson.loads(t) for t in texts]
        unpack(dicts, self._lists, fetch)
        return [_claim_from(d) for d in dicts]

    def _events_from(self, rows: Iterable[tuple[str, str]],
                     fetch: Fetch) -> list[tuple[str, dict[str, Any]]]:
        """Journal (event, data) from rows of (event, JSON); ``fetch`` as for claims."""
        events = [(kind, orjson.loads(text)) for kind, text in rows]
        unpack([event_holder(kind, data) for kind, data in events], self._lists, fetch)
        return events

    def _unavailable(self, err: DBAPIError) -> LedgerUnavailable:
        reason = str(err.orig if err.orig is not None else err).strip()
        return LedgerUnavailable(
            f"the budget ledger {self.where} is unavailable ({reason}); nothing was spent",
            hint="retry in a moment")

    @contextmanager
    def transaction(self, accounting: str) -> Iterator[Tx]:
        # Threads of this process queue on a lock first: only one of them at a time waits for
        # the database's write lock.  SQLite's busy handler sleeps in growing steps (up to
        # 100 ms) while it waits, so eight threads contending there serialise far more slowly
        # than on a lock that wakes the next one at once.
        with _process_lock(self.lock_key):
            yield from self._transaction(accounting)

    def _transaction(self, accounting: str) -> Iterator[Tx]:
        try:
            conn = self._begin()
        except OperationalError_ as err:
            raise self._unavailable(err) from None
        tx: _SQLTx | None = None
        try:
            tx = _SQLTx(self, conn, accounting)
            yield tx
            tx.flush()
            if self.before_commit is not None:
                self.before_commit()
            conn.commit()
        except BaseException:
            if tx is not None:
                self._cache.abandoned(tx)
            with suppress(DBAPIError):
                conn.rollback()
            self._drop_writer()  # whatever went wrong, the next transaction starts afresh
            raise
        self._cache.committed(tx, tx.seq_after)
        self._lists.stored.update(tx.new_lists)

    def _begin(self) -> Connection:
        """Begin a write transaction on the store's write connection.

        Write transactions run one at a time in a process (``transaction``'s lock), so one
        connection serves them all, kept open between them: taking one from the pool and giving
        it back (with SQLAlchemy's reset) for every claim cost more than the claim's SQL.
        """
        for attempt in (1, 2):
            conn = self._writer
            if conn is None or conn.closed or conn.invalidated:
                conn = self._writer = self.engine.connect()
            try:
                conn.begin()  # SQLite: BEGIN IMMEDIATE (the "begin" event of SQLiteStore)
                if self._row_lock:
                    # Postgres: the row lock serialises every ledger transaction of every proxy.
                    conn.execute(self._lock_row)
                return conn
            except DBAPIError as err:
                self._drop_writer()
                # A kept connection the server closed meanwhile: once more on a new one.
                if attempt == 2 or not err.connection_invalidated:
                    raise
            except BaseException:
                self._drop_writer()
                raise
        raise AssertionError("unreachable")

    def _drop_writer(self) -> None:
        conn, self._writer = self._writer, None
        if conn is not None:
            with suppress(DBAPIError):
                conn.close()

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        """One consistent snapshot, without the write lock, rolled back at the end."""
        with self.engine.connect() as conn:
            conn.execution_options(ledger_write=False)
            conn.begin()
            try:
                yield conn
            finally:
                conn.rollback()

    def check_meta(self, meta: dict[str, str]) -> None:
        with self.transaction("basic") as tx:
            assert isinstance(tx, _SQLTx)
            col = self.meta_t.c
            stored = {k: v for k, v in tx._conn.execute(select(col.key, col.value))}
            was, wanted = stored.get("schema"), meta.get("schema")
            if was in ("1", "2") and wanted == SCHEMA_VERSION:
                if was == "1":
                    # Schema 1 rewrote every changed block row on every change: its rows are
                    # current.  Stamped once, under the lock, as the checkpoint; rows a proxy
                    # of that version might still write are refused.
                    tx._upgrade_rows()
                # Schema 3 names long block lists by reference (``budget.blocklists``); rows
                # written before hold their lists, and are read as they are.  A proxy of an
                # older version refuses the ledger from now on (schema mismatch): it would
                # misread the references.
                tx._conn.execute(update(self.meta_t).where(col.key == "schema")
                                 .values(value=SCHEMA_VERSION))
                stored["schema"] = SCHEMA_VERSION
            _check_meta(stored, meta, self.where)
            missing = [{"key": k, "value": v} for k, v in meta.items() if k not in stored]
            if missing:
                tx._conn.execute(insert(self.meta_t), missing)

    def meta(self) -> dict[str, str]:
        col = self.meta_t.c
        with self._read() as conn:
            return {k: v for k, v in conn.execute(select(col.key, col.value))}

    def claims(self, analyst: str | None = None,
               states: Iterable[str] | None = None) -> list[ClaimRecord]:
        col = self.claims_t.c
        query = select(col.data).order_by(col.claim_id)
        if analyst is not None:
            query = query.where(col.analyst == analyst)
        if states is not None:
            query = query.where(col.state.in_(sorted(states)))
        with self._read() as conn:
            return self._claims_from([d for (d,) in conn.execute(query)],
                                     self._lists_reader(conn))

    def claim_totals(self, analyst: str | None = None) -> list[ClaimTotals]:
        col = self.claims_t.c
        # The claim's JSON text: SQLite's JSON functions read it as it is, Postgres needs a cast.
        data = (cast(col.data, JSON) if self._dialect.name == "postgresql"
                else type_coerce(col.data, JSON))
        query = (select(col.analyst, col.state, func.count(),
                        func.sum(data["epsilon"].as_float()), func.sum(data["delta"].as_float()))
                 .group_by(col.analyst, col.state))
        if analyst is not None:
            query = query.where(col.analyst == analyst)
        with self._read() as conn:
            rows = conn.execute(query).all()
        # Sorted here, not in SQL: Postgres would order by its collation, the memory store by
        # code point.  SUM is NULL when every value was (JSON null: not finite).
        return sorted(ClaimTotals(a, s, n, float(e or 0.0), float(d or 0.0))
                      for a, s, n, e, d in rows)

    def journal(self, since: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        j = self.journal_t.c
        query = (select(j.seq, j.at, j.event, j.claim_id, j.data).where(j.seq > since)
                 .order_by(j.seq))
        if limit is not None:
            query = query.limit(int(limit))
        with self._read() as conn:
            rows = conn.execute(query).all()
            events = self._events_from([(e, d) for _, _, e, _, d in rows],
                                       self._lists_reader(conn))
        return [{"seq": s, "at": a, "event": e, "claim_id": c, "data": data}
                for (s, a, e, c, _), (_, data) in zip(rows, events, strict=True)]

    def _lists_reader(self, conn: Connection) -> Fetch:
        """``fetch(ids)`` for stored block lists, on a read connection."""
        lc = self.lists_t.c

        def fetch(ids: list[str]) -> list[tuple[str, str]]:
            return [(i, b) for start in range(0, len(ids), 500) for i, b in conn.execute(
                select(lc.list_id, lc.blocks).where(lc.list_id.in_(ids[start:start + 500])))]
        return fetch

    def close(self) -> None:
        """Close every pooled connection (the store opens new ones if used again)."""
        with _process_lock(self.lock_key):  # not while a transaction uses the write connection
            self._drop_writer()
        self.engine.dispose()


_SQLITE_TRIGGERS = [
    "CREATE TRIGGER IF NOT EXISTS ledger_journal_append_only_u BEFORE UPDATE ON ledger_journal "
    "BEGIN SELECT RAISE(ABORT, 'the ledger journal is append-only'); END",
    "CREATE TRIGGER IF NOT EXISTS ledger_journal_append_only_d BEFORE DELETE ON ledger_journal "
    "BEGIN SELECT RAISE(ABORT, 'the ledger journal is append-only'); END",
]

# Connections kept open per store; more are opened when more threads use it at once.
_POOL_SIZE = 16


def _enter_wal(cur: sqlite3.Cursor, timeout_seconds: float) -> str:
    """Put the file in WAL mode (once per file: the mode is stored in it) and return the mode.

    Switching needs an exclusive lock, and SQLite answers SQLITE_BUSY at once, without its busy
    handler, when another process holds one (seen: two ``chorus serve --workers`` processes
    opening a new ledger together). So read the mode first, the common case, and retry the
    switch until the busy timeout.
    """
    mode = cur.execute("PRAGMA journal_mode").fetchone()[0]
    deadline = time.monotonic() + timeout_seconds
    while mode.lower() != "wal":
        try:
            return cur.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)
    return mode


class SQLiteStore(SQLStore):
    """A SQLite file (WAL mode), shared safely by threads and processes on one machine."""

    def __init__(self, path: str | Path, synchronous: str = "FULL",
                 busy_timeout_seconds: float = 60.0) -> None:
        if synchronous.upper() not in ("FULL", "NORMAL", "EXTRA"):
            raise ValueError("synchronous must be FULL, NORMAL or EXTRA")
        self.path = str(path)
        self.where = f"in {self.path}"
        self.lock_key = f"sqlite:{id(self)}" if self.path == ":memory:" else \
            f"sqlite:{Path(self.path).resolve()}"
        sync = synchronous.upper()
        memory = self.path == ":memory:"
        if not memory:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        pool: dict[str, Any] = {} if memory else {"pool_size": _POOL_SIZE, "max_overflow": -1}
        engine = create_engine(
            URL.create("sqlite", database=self.path),
            connect_args={"timeout": busy_timeout_seconds, "check_same_thread": False}, **pool)

        @event.listens_for(engine, "connect")
        def _connect(dbapi_con: sqlite3.Connection, _record: Any) -> None:
            # SQLAlchemy emits BEGIN itself (below), not the sqlite3 module.
            dbapi_con.isolation_level = None
            cur = dbapi_con.cursor()
            try:
                cur.execute(f"PRAGMA busy_timeout = {int(busy_timeout_seconds * 1000)}")
                mode = _enter_wal(cur, busy_timeout_seconds)
                if mode.lower() != "wal" and not memory:
                    raise OSError(f"cannot put the budget ledger {self.path} in WAL mode ({mode})")
                cur.execute(f"PRAGMA synchronous = {sync}")
            finally:
                cur.close()

        @event.listens_for(engine, "begin")
        def _begin(conn: Connection) -> None:
            # A write transaction takes SQLite's write lock before its first read, so two
            # processes racing for the last budget run one after the other; reads only need a
            # snapshot.
            write = conn.get_execution_options().get("ledger_write", True)
            conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

        super().__init__(engine, "ledger_", row_lock=False, extra_ddl=_SQLITE_TRIGGERS)
        self._lock_file = None if memory else f"{self.path}-lock"
        self._lock_fd: int | None = None

    @contextmanager
    def transaction(self, accounting: str) -> Iterator[Tx]:
        # Processes sharing the file (``chorus serve --workers``) queue on a file lock, as this
        # process's threads do on ``_process_lock``: SQLite's busy handler would make the
        # second process sleep in growing steps (up to 100 ms) until the write lock is free,
        # where a blocked flock() wakes as soon as the other process commits.  SQLite's own
        # lock (BEGIN IMMEDIATE) still decides: a process that takes no file lock is safe too.
        with _process_lock(self.lock_key), self._locked_file():
            yield from self._transaction(accounting)

    @contextmanager
    def _locked_file(self) -> Iterator[None]:
        if self._lock_file is None:
            yield
            return
        if self._lock_fd is None:
            self._lock_fd = os.open(self._lock_file, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def close(self) -> None:
        super().close()
        with _process_lock(self.lock_key):
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None


def _pg_url(url: str | URL) -> URL:
    """A Postgres URL for SQLAlchemy's psycopg (3) driver: ``postgresql://``, ``postgres://`` and
    ``postgresql+psycopg://`` are all accepted."""
    u = make_url(url)
    if u.drivername in ("postgresql", "postgres"):
        u = u.set(drivername="postgresql+psycopg")
    if u.drivername != "postgresql+psycopg":
        raise ValueError(f"the budget ledger needs a postgresql:// URL, not {u.drivername}://")
    return u


def _pg_ddl(t: str) -> list[str]:
    return [
        f"INSERT INTO {t}meta (key, value) VALUES ('lock', '') ON CONFLICT DO NOTHING",
        # The journal is append-only here too: UPDATE, DELETE and TRUNCATE are refused.
        f"CREATE OR REPLACE FUNCTION {t}journal_append_only() RETURNS trigger "
        "LANGUAGE plpgsql AS $$ BEGIN "
        "RAISE EXCEPTION 'the ledger journal is append-only'; END $$",
        f"DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = "
        f"'{t}journal_append_only' AND tgrelid = '{t}journal'::regclass) THEN "
        f"CREATE TRIGGER {t}journal_append_only BEFORE UPDATE OR DELETE OR TRUNCATE ON "
        f"{t}journal FOR EACH STATEMENT EXECUTE FUNCTION {t}journal_append_only(); "
        "END IF; END $$",
    ]


class PostgresStore(SQLStore):
    """Tables ``chorus_ledger_*`` in a Postgres database shared by several proxies."""

    def __init__(self, url: str | URL) -> None:
        self.url = str(url)
        self.where = "in Postgres"
        self.lock_key = f"postgres:{make_url(url).render_as_string(hide_password=True)}"
        t = "chorus_ledger_"
        engine = create_engine(_pg_url(url), connect_args={"connect_timeout": 10},
                               pool_size=_POOL_SIZE, max_overflow=-1)
        # Two proxies starting at once must not both create the tables.
        super().__init__(engine, t, row_lock=True,
                         schema_lock="SELECT pg_advisory_xact_lock(7219540601)",
                         extra_ddl=_pg_ddl(t))


def now() -> float:
    """Wall-clock seconds (the ledger's default clock)."""
    return time.time()
