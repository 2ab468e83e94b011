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

Inside a transaction the ledger reads blocks and claims, changes them in memory and marks them
with ``save_*``; the store checks every changed block's invariant and writes everything, with the
journal rows describing the change, in the same commit.  Any exception rolls everything back.
The journal is append-only: rows are never updated or deleted.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import fields
from pathlib import Path
from typing import Any

from budget.scheduler import BlockState, ClaimRecord
from chorus_py.errors import OperationalError

__all__ = ["LedgerMismatch", "LedgerUnavailable", "MemoryStore", "PostgresStore", "SQLiteStore",
           "Store", "Tx"]

SCHEMA_VERSION = "1"


class LedgerUnavailable(OperationalError):
    """The ledger's database is busy or unreachable: no claim was made, nothing was spent."""


class LedgerMismatch(ValueError):
    """The stored ledger was created with other accounting settings than the policy's."""


def _block_from(data: str) -> BlockState:
    return BlockState(**json.loads(data))


def _claim_from(data: str) -> ClaimRecord:
    d = json.loads(data)
    d["blocks"] = tuple(d["blocks"])
    d["demand"] = tuple(d["demand"])
    d["events"] = tuple(d["events"])
    d["per_block"] = {k: tuple(v) for k, v in d.get("per_block", {}).items()}
    return ClaimRecord(**d)


_CLAIM_FIELDS = tuple(f.name for f in fields(ClaimRecord))


def _claim_json(claim: ClaimRecord) -> str:
    # dataclasses.asdict deep-copies every event: too slow for one claim per transaction.
    return json.dumps({f: getattr(claim, f) for f in _CLAIM_FIELDS}, separators=(",", ":"))


def _block_json(block: BlockState) -> str:
    return json.dumps(block.to_dict(share=True), separators=(",", ":"))


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
        for block in out:
            block.check(self.accounting)
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


class Store:
    """A ledger's storage: transactions, plus read-only listings for operators."""

    durable = False

    def transaction(self, accounting: str) -> Any:  # a context manager yielding a Tx
        raise NotImplementedError

    def check_meta(self, meta: dict[str, str]) -> None:
        """Record the ledger's settings on first use; refuse a ledger made with others."""
        raise NotImplementedError

    def claims(self) -> list[ClaimRecord]:
        """Every claim, oldest first."""
        raise NotImplementedError

    def journal(self, since: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        """Journal rows with seq > ``since``, oldest first."""
        raise NotImplementedError

    def close(self) -> None:
        """Release connections."""


def _check_meta(stored: dict[str, str], wanted: dict[str, str], where: str) -> None:
    for key, value in wanted.items():
        if key in stored and stored[key] != value:
            raise LedgerMismatch(
                f"the budget ledger {where} was created with {key} = {stored[key]}, but the "
                f"policy now says {value}; budgets in different units cannot be mixed")


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

    def claims(self) -> list[ClaimRecord]:
        with self._lock:
            return [_copy_claim(self._claims[k]) for k in sorted(self._claims)]

    def journal(self, since: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._journal[since:]
            return [dict(r) for r in (rows if limit is None else rows[:limit])]


# -- SQL (SQLite, Postgres) ------------------------------------------------------------------
class _SQLTx(Tx):
    def __init__(self, store: _SQLStore, cur: Any, accounting: str) -> None:
        super().__init__(accounting)
        self._s = store
        self._cur = cur

    def _q(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        self._cur.execute(self._s.sql(sql), params)
        return list(self._cur.fetchall()) if self._cur.description is not None else []

    def _load_blocks(self, ids: list[str]) -> dict[str, BlockState]:
        out: dict[str, BlockState] = {}
        for start in range(0, len(ids), 500):
            chunk = ids[start:start + 500]
            marks = ",".join("?" * len(chunk))
            for (data,) in self._q(f"SELECT data FROM {self._s.t}blocks WHERE block_id IN "
                                   f"({marks})", tuple(chunk)):
                block = _block_from(data)
                out[block.block_id] = block
        return out

    def _load_all_blocks(self) -> list[BlockState]:
        return [_block_from(d) for (d,) in self._q(f"SELECT data FROM {self._s.t}blocks")
                if json.loads(d)["block_id"] not in self._blocks]

    def _load_claim(self, claim_id: int) -> ClaimRecord | None:
        rows = self._q(f"SELECT data FROM {self._s.t}claims WHERE claim_id = ?", (claim_id,))
        return _claim_from(rows[0][0]) if rows else None

    def _load_open_claims(self, waiting_only: bool = False) -> list[ClaimRecord]:
        states = "('waiting')" if waiting_only else "('waiting', 'allocated')"
        rows = self._q(f"SELECT claim_id, data FROM {self._s.t}claims WHERE state IN {states} "
                       "ORDER BY claim_id")
        return [_claim_from(d) for i, d in rows if i not in self._claims]

    def _next_claim_id(self) -> int:
        # The transaction holds the ledger's write lock (BEGIN IMMEDIATE / FOR UPDATE), so no
        # other transaction can take the same id; a rolled-back id is simply reused.
        if not self._new_claims:
            rows = self._q(f"SELECT COALESCE(MAX(claim_id), 0) FROM {self._s.t}claims")
            self._base_id = int(rows[0][0])
        self._base_id += 1
        return self._base_id

    def flush(self) -> None:
        t = self._s.t
        changed = self.changed_blocks()
        new = [b for b in changed if b.block_id in self._new_blocks]
        old = [b for b in changed if b.block_id not in self._new_blocks]
        if new:
            self._cur.executemany(
                self._s.sql(f"INSERT INTO {t}blocks (block_id, state, data) VALUES (?, ?, ?)"),
                [(b.block_id, "retired" if b.retired else "active", _block_json(b))
                 for b in new])
        if old:
            self._cur.executemany(
                self._s.sql(f"UPDATE {t}blocks SET state = ?, data = ? WHERE block_id = ?"),
                [("retired" if b.retired else "active", _block_json(b), b.block_id)
                 for b in old])
        if self._new_claims:
            self._cur.executemany(
                self._s.sql(f"INSERT INTO {t}claims (claim_id, state, analyst, owner, data) "
                            "VALUES (?, ?, ?, ?, ?)"),
                [(c.claim_id, c.state, c.analyst, c.owner, _claim_json(c))
                 for c in (self._claims[i] for i in sorted(self._new_claims))])
        old = sorted(self._dirty_claims - self._new_claims)
        if old:
            self._cur.executemany(
                self._s.sql(f"UPDATE {t}claims SET state = ?, data = ? WHERE claim_id = ?"),
                [(c.state, _claim_json(c), c.claim_id) for c in (self._claims[i] for i in old)])
        if self._journal:
            self._cur.executemany(
                self._s.sql(f"INSERT INTO {t}journal (at, event, claim_id, data) "
                            "VALUES (?, ?, ?, ?)"),
                [(at, event, claim_id, json.dumps(data, separators=(",", ":")))
                 for at, event, claim_id, data in self._journal])


class _SQLStore(Store):
    durable = True
    t = "ledger_"  # table name prefix
    where = ""

    def sql(self, text: str) -> str:
        return text

    def _connection(self) -> Any:
        raise NotImplementedError

    def _begin(self, cur: Any) -> None:
        raise NotImplementedError

    def _commit(self, con: Any) -> None:
        con.commit()

    def _rollback(self, con: Any) -> None:
        con.rollback()

    # Hook for the crash test: called after every write of a transaction, before COMMIT.
    before_commit: Any = None

    # Errors of the database driver meaning "cannot get the ledger now" (busy, unreachable).
    _unavailable: tuple[type[BaseException], ...] = ()

    @contextmanager
    def transaction(self, accounting: str) -> Iterator[Tx]:
        try:
            con = self._connection()
            cur = con.cursor()
            self._begin(cur)
        except self._unavailable as err:
            raise LedgerUnavailable(
                f"the budget ledger {self.where} is unavailable ({str(err).strip()}); "
                "nothing was spent", hint="retry in a moment") from None
        try:
            tx = _SQLTx(self, cur, accounting)
            yield tx
            tx.flush()
            if self.before_commit is not None:
                self.before_commit()
        except BaseException:
            self._rollback(con)
            raise
        self._commit(con)

    @contextmanager
    def _read(self) -> Iterator[Any]:
        con = self._connection()
        cur = con.cursor()
        try:
            yield cur
        finally:
            self._rollback(con)

    def check_meta(self, meta: dict[str, str]) -> None:
        with self.transaction("basic") as tx:
            assert isinstance(tx, _SQLTx)
            stored = dict(tx._q(f"SELECT key, value FROM {self.t}meta"))
            _check_meta(stored, meta, self.where)
            for key, value in meta.items():
                if key not in stored:
                    tx._q(f"INSERT INTO {self.t}meta (key, value) VALUES (?, ?)", (key, value))

    def claims(self) -> list[ClaimRecord]:
        with self._read() as cur:
            cur.execute(self.sql(f"SELECT data FROM {self.t}claims ORDER BY claim_id"))
            return [_claim_from(d) for (d,) in cur.fetchall()]

    def journal(self, since: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        with self._read() as cur:
            sql = (f"SELECT seq, at, event, claim_id, data FROM {self.t}journal WHERE seq > ? "
                   "ORDER BY seq")
            if limit is not None:
                sql += f" LIMIT {int(limit)}"
            cur.execute(self.sql(sql), (since,))
            return [{"seq": s, "at": a, "event": e, "claim_id": c, "data": json.loads(d)}
                    for s, a, e, c, d in cur.fetchall()]


_SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS ledger_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS ledger_blocks (
    block_id TEXT PRIMARY KEY, state TEXT NOT NULL, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS ledger_claims (
    claim_id INTEGER PRIMARY KEY, state TEXT NOT NULL, analyst TEXT NOT NULL,
    owner TEXT NOT NULL, data TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS ledger_claims_state ON ledger_claims (state);
CREATE TABLE IF NOT EXISTS ledger_journal (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, event TEXT NOT NULL,
    claim_id INTEGER, data TEXT NOT NULL);
CREATE TRIGGER IF NOT EXISTS ledger_journal_append_only_u BEFORE UPDATE ON ledger_journal
    BEGIN SELECT RAISE(ABORT, 'the ledger journal is append-only'); END;
CREATE TRIGGER IF NOT EXISTS ledger_journal_append_only_d BEFORE DELETE ON ledger_journal
    BEGIN SELECT RAISE(ABORT, 'the ledger journal is append-only'); END;
"""


class SQLiteStore(_SQLStore):
    """A SQLite file (WAL mode), shared safely by threads and processes on one machine."""

    _unavailable = (sqlite3.OperationalError,)

    def __init__(self, path: str | Path, synchronous: str = "FULL",
                 busy_timeout_seconds: float = 60.0) -> None:
        if synchronous.upper() not in ("FULL", "NORMAL", "EXTRA"):
            raise ValueError("synchronous must be FULL, NORMAL or EXTRA")
        self.path = str(path)
        self.where = f"in {self.path}"
        self._sync = synchronous.upper()
        self._timeout = busy_timeout_seconds
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        con = self._connection()
        # Creating the schema takes the write lock too, so processes starting together agree.
        try:
            con.executescript("BEGIN IMMEDIATE;" + _SQLITE_SCHEMA + "COMMIT;")
        except BaseException:
            if con.in_transaction:
                con.execute("ROLLBACK")
            raise

    def _connection(self) -> sqlite3.Connection:
        con = getattr(self._local, "con", None)
        if con is None:
            con = sqlite3.connect(self.path, timeout=self._timeout, isolation_level=None,
                                  check_same_thread=False)
            con.execute(f"PRAGMA busy_timeout = {int(self._timeout * 1000)}")
            mode = con.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode.lower() != "wal" and self.path != ":memory:":
                raise OSError(f"cannot put the budget ledger {self.path} in WAL mode ({mode})")
            con.execute(f"PRAGMA synchronous = {self._sync}")
            self._local.con = con
            with self._all_lock:
                self._all.append(con)
        return con

    def _begin(self, cur: Any) -> None:
        cur.execute("BEGIN IMMEDIATE")

    def _commit(self, con: Any) -> None:
        con.execute("COMMIT")

    def _rollback(self, con: Any) -> None:
        if con.in_transaction:
            con.execute("ROLLBACK")

    @contextmanager
    def _read(self) -> Iterator[Any]:
        con = self._connection()
        cur = con.cursor()
        cur.execute("BEGIN")  # one consistent snapshot
        try:
            yield cur
        finally:
            self._rollback(con)

    def close(self) -> None:
        with self._all_lock:
            for con in self._all:
                with suppress(sqlite3.Error):
                    con.close()
            self._all.clear()
        self._local = threading.local()


_PG_SCHEMA = """
CREATE TABLE IF NOT EXISTS {t}meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS {t}blocks (
    block_id TEXT PRIMARY KEY, state TEXT NOT NULL, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS {t}claims (
    claim_id BIGSERIAL PRIMARY KEY, state TEXT NOT NULL, analyst TEXT NOT NULL,
    owner TEXT NOT NULL, data TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS {t}claims_state ON {t}claims (state);
CREATE TABLE IF NOT EXISTS {t}journal (
    seq BIGSERIAL PRIMARY KEY, at DOUBLE PRECISION NOT NULL, event TEXT NOT NULL,
    claim_id BIGINT, data TEXT NOT NULL);
INSERT INTO {t}meta (key, value) VALUES ('lock', '') ON CONFLICT DO NOTHING;
"""


class PostgresStore(_SQLStore):
    """Tables ``chorus_ledger_*`` in a Postgres database shared by several proxies."""

    def __init__(self, url: str) -> None:
        import psycopg  # a dependency already (the Postgres backend)

        self._psycopg = psycopg
        self._unavailable = (psycopg.OperationalError,)
        self.url = url
        self.t = "chorus_ledger_"
        self.where = "in Postgres"
        self._local = threading.local()
        self._all: list[Any] = []
        self._all_lock = threading.Lock()
        con = self._connection()
        with con.cursor() as cur:
            # Two proxies starting at once must not both create the tables.
            cur.execute("SELECT pg_advisory_xact_lock(7219540601)")
            cur.execute(_PG_SCHEMA.format(t=self.t))
        con.commit()

    def sql(self, text: str) -> str:
        return text.replace("?", "%s")

    def _connection(self) -> Any:
        con = getattr(self._local, "con", None)
        if con is None or con.closed:
            con = self._psycopg.connect(self.url, autocommit=False, connect_timeout=10)
            self._local.con = con
            with self._all_lock:
                self._all.append(con)
        return con

    def _begin(self, cur: Any) -> None:
        # The row lock serialises every ledger transaction of every proxy (module docstring).
        cur.execute(f"SELECT value FROM {self.t}meta WHERE key = 'lock' FOR UPDATE")

    def close(self) -> None:
        with self._all_lock:
            for con in self._all:
                with suppress(self._psycopg.Error):
                    con.close()
            self._all.clear()
        self._local = threading.local()


def now() -> float:
    """Wall-clock seconds (the ledger's default clock)."""
    return time.time()
