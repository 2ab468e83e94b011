"""Block rows written at checkpoints: a block read back is its row plus the journal since.

Between checkpoints a claim writes its claim and journal rows only; these tests check that what
any reader sees (this ledger, another ledger on the same database, a ledger opened afresh) is
exactly the live state and exactly what the journal replays to, across checkpoints, rollbacks,
ledgers written before checkpoints existed, and changes the journal would not explain.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from budget import blocklists
from budget import store as store_module
from budget.accounting import RenyiAccountant
from budget.ledger import Claim, Ledger, LedgerMismatch, replay
from budget.scheduler import BlockState, InvariantError, SchedulerSettings
from budget.store import CHECKPOINT_EVERY, SQLiteStore, Tx
from chorus_py.errors import BudgetExhausted

SIXTY_FOURTH = 1 / 64


def states(led: Ledger) -> dict[str, BlockState]:
    """Every block's full state as ``led`` reads it (in a transaction that is rolled back)."""
    return {b.block_id: b for b in led._peek(lambda tx: [x.copy() for x in tx.all_blocks()])}


def stored_rows(path: Path) -> dict[str, str]:
    with contextlib.closing(sqlite3.connect(path)) as con:
        return dict(con.execute("SELECT block_id, data FROM ledger_blocks"))


def marker(path: Path) -> int | None:
    with contextlib.closing(sqlite3.connect(path)) as con:
        row = con.execute("SELECT value FROM ledger_meta WHERE key = 'blocks_seq'").fetchone()
    return None if row is None else int(row[0])


def last_seq(path: Path) -> int:
    with contextlib.closing(sqlite3.connect(path)) as con:
        return int(con.execute("SELECT MAX(seq) FROM ledger_journal").fetchone()[0])


def test_rows_are_written_at_checkpoints_and_every_reader_sees_the_live_state(
        tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    led = Ledger(1.0, 0.0, store=SQLiteStore(path))
    led.ensure_blocks([f"d{i}" for i in range(5)])
    # The first transaction on a new ledger is a checkpoint: rows and marker are current.
    assert marker(path) == last_seq(path) == 5
    created = stored_rows(path)
    led.claim("x", ["d0", "d1"], SIXTY_FOURTH, 0.0, consume_on_grant=True)
    # A claim (3 journal rows: arrived, granted, consumed) leaves the block rows alone...
    assert stored_rows(path) == created and marker(path) == 5
    # ...yet a ledger opened afresh reads the charge: row + the journal since the checkpoint.
    fresh = Ledger(1.0, 0.0, store=SQLiteStore(path))
    assert states(fresh) == states(led) == replay(led.history())
    assert [round(b.epsilon_spent, 12) for b in fresh.blocks(["d0", "d4"])] == [1 / 64, 0.0]
    # 64 journal rows after the marker make the next transaction a checkpoint: 21 more claims
    # bring the journal to 5 + 22 * 3 = 71 rows, 66 past the marker.
    for _ in range(21):
        led.claim("x", ["d0", "d1"], SIXTY_FOURTH, 0.0, consume_on_grant=True)
    assert CHECKPOINT_EVERY == 64
    assert marker(path) == last_seq(path) == 71
    rows = stored_rows(path)
    assert rows["d2"] == created["d2"]  # untouched blocks are never rewritten
    live = states(led)
    for b in ("d0", "d1"):
        assert store_module._block_from(rows[b]) == live[b]
        assert live[b].consumed == [22 / 64]
    fresh.close()
    led.close()


def test_a_checkpoint_rewrites_every_block_changed_since_the_last_one_without_reading_the_journal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While this store wrote every journal row since the checkpoint, it knows which blocks
    they name: the checkpoint rewrites exactly those rows (a block left out would be read back
    without its charges) and reads no journal; after another writer it reads the journal."""
    path = tmp_path / "ledger.sqlite3"
    monkeypatch.setattr(store_module, "CHECKPOINT_EVERY", 7)
    led = Ledger(1.0, 0.0, store=SQLiteStore(path))
    led.ensure_blocks([f"d{i}" for i in range(4)])
    reads: list[int] = []  # checkpoints of led's store that had to read the journal
    checkpoint = store_module._SQLTx._checkpoint

    def counted(tx: store_module._SQLTx, journaled: set[str]) -> None:
        if tx._s is led.store and tx.since_checkpoint is None:
            reads.append(tx.seq_after)
        checkpoint(tx, journaled)

    monkeypatch.setattr(store_module._SQLTx, "_checkpoint", counted)
    for i in range(12):  # each claim names other blocks than the one before
        led.claim("x", [f"d{i % 4}"], SIXTY_FOURTH, 0.0, consume_on_grant=True)
        fresh = Ledger(1.0, 0.0, store=SQLiteStore(path))
        assert states(fresh) == states(led) == replay(led.history())
        fresh.close()
    # 4 block_created rows, then 3 rows per claim: checkpoints after claims 3, 6, 9 and 12.
    assert marker(path) == last_seq(path) == 4 + 3 * 12
    assert reads == []
    other = Ledger(1.0, 0.0, store=SQLiteStore(path))
    other.claim("y", ["d0"], SIXTY_FOURTH, 0.0, consume_on_grant=True)
    for i in range(3):  # the next checkpoint reads the journal: another store wrote to it
        led.claim("x", [f"d{i + 1}"], SIXTY_FOURTH, 0.0, consume_on_grant=True)
    assert reads == [marker(path)] == [40 + 3 + 2 * 3]  # its own two claims after the other
    fresh = Ledger(1.0, 0.0, store=SQLiteStore(path))
    assert states(fresh) == states(led) == states(other) == replay(led.history())
    assert states(fresh)["d0"].consumed == [4 / 64]
    for ledger in (fresh, other, led):
        ledger.close()


def legacy_json(block: BlockState) -> str:
    """A block row as schema 1 wrote it (no format stamp)."""
    return json.dumps(block.to_dict())


def test_a_schema_1_ledger_is_upgraded_once_and_older_proxies_are_shut_out(
        tmp_path: Path) -> None:
    """Schema 1 rewrote every row on every change: its rows are current, stamped on upgrade."""
    path = tmp_path / "ledger.sqlite3"
    led = Ledger(1.0, 0.0, store=SQLiteStore(path))
    led.ensure_blocks(["a", "b"])
    for _ in range(10):
        led.claim("x", ["a"], SIXTY_FOURTH, 0.0, consume_on_grant=True)
    before = states(led)
    led.close()
    # Make the file one that schema 1 wrote: rows current and unstamped, no marker.
    with contextlib.closing(sqlite3.connect(path)) as con, con:
        for block in before.values():
            con.execute("UPDATE ledger_blocks SET data = ? WHERE block_id = ?",
                        (legacy_json(block), block.block_id))
        con.execute("DELETE FROM ledger_meta WHERE key = 'blocks_seq'")
        con.execute("UPDATE ledger_meta SET value = '1' WHERE key = 'schema'")
    upgraded = Ledger(1.0, 0.0, store=SQLiteStore(path))
    assert marker(path) == last_seq(path)
    assert all('"format":2' in data for data in stored_rows(path).values())
    assert states(upgraded) == before == replay(upgraded.history())
    upgraded.claim("x", ["a", "b"], SIXTY_FOURTH, 0.0, consume_on_grant=True)
    assert states(Ledger(1.0, 0.0, store=SQLiteStore(path))) == states(upgraded)
    assert states(upgraded)["a"].consumed == [11 / 64]
    # A schema-1 proxy cannot open it any more...
    with pytest.raises(LedgerMismatch, match=r"\(schema\) 3, written by a newer version"):
        SQLiteStore(path).check_meta({"accounting": "basic", "schema": "1"})
    # ...and a row one still running might write is refused, not read as a checkpoint.
    with contextlib.closing(sqlite3.connect(path)) as con, con:
        con.execute("UPDATE ledger_blocks SET data = ? WHERE block_id = 'b'",
                    (legacy_json(states(upgraded)["b"]),))
    fresh = Ledger(1.0, 0.0, store=SQLiteStore(path))
    with pytest.raises(InvariantError, match=r"block b .* older version"):
        fresh.claim("x", ["b"], SIXTY_FOURTH, 0.0, consume_on_grant=True)
    fresh.close()
    upgraded.close()


def test_a_block_change_the_journal_does_not_name_is_refused(tmp_path: Path) -> None:
    """Such a change would be lost at the next read: refused, nothing written."""
    path = tmp_path / "ledger.sqlite3"
    led = Ledger(1.0, 0.0, store=SQLiteStore(path))
    led.ensure_blocks(["a"])
    seq = last_seq(path)

    def sneak(tx: Tx) -> None:
        block = tx.blocks(["a"])["a"]
        block.unlocked[0] -= 0.5
        block.consumed[0] += 0.5
        tx.save_block(block)

    with pytest.raises(InvariantError, match=r"journal rows do not name \(\['a'\]\)"), \
            led._tx() as tx:
        sneak(tx)
    assert last_seq(path) == seq
    assert states(led)["a"].consumed == [0.0]
    assert states(Ledger(1.0, 0.0, store=SQLiteStore(path)))["a"].consumed == [0.0]
    led.close()


# -- random workloads on two ledgers sharing a file, across checkpoints ---------------------------
OPS = st.lists(st.tuples(
    st.sampled_from(["claim", "claim_consumed", "consume", "release", "refund"]),
    st.sampled_from(["a", "b"]),                                    # which ledger acts
    st.lists(st.sampled_from(["d0", "d1", "d2", "d3"]), min_size=1, max_size=3, unique=True),
    st.sampled_from([1 / 16, 1 / 8, 3 / 16])), min_size=1, max_size=25)

KINDS = {
    "fcfs": lambda store: Ledger(1.0, 1e-6, store=store),
    "dpf-n": lambda store: Ledger(1.0, 1e-6, store=store,
                                  scheduler=SchedulerSettings("dpf-n", n=3)),
    "renyi": lambda store: Ledger(1.0, 1e-6, store=store, accountant=RenyiAccountant()),
}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, every=st.sampled_from([1, 2, 5, 64]), kind=st.sampled_from(sorted(KINDS)),
       list_from=st.sampled_from([1, 4]))
def test_two_ledgers_on_one_file_always_read_the_replayed_state(
        ops: list[tuple[str, str, list[str], float]], every: int, kind: str,
        list_from: int) -> None:
    """``list_from`` 1: every block list is stored once and named by reference."""
    previous = store_module.CHECKPOINT_EVERY, blocklists.LIST_FROM
    store_module.CHECKPOINT_EVERY, blocklists.LIST_FROM = every, list_from
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "ledger.sqlite3"
            ledgers = {name: KINDS[kind](SQLiteStore(path)) for name in ("a", "b")}
            ledgers["a"].ensure_blocks(["d0", "d1", "d2", "d3"])
            open_claims: list[Claim] = []
            refundable: list[Claim] = []
            for op, who, blocks, eps in ops:
                led = ledgers[who]
                with contextlib.suppress(BudgetExhausted, ValueError):
                    if op in ("claim", "claim_consumed"):
                        claim = led.claim("x", blocks, eps, 0.0,
                                          consume_on_grant=op == "claim_consumed")
                        (refundable if op == "claim_consumed" else open_claims).append(claim)
                    elif op in ("consume", "release") and open_claims:
                        getattr(led, op)(open_claims.pop(0))
                    elif op == "refund" and refundable:
                        led.refund(refundable.pop(0))
                # Each ledger, and one opened afresh (the stored rows plus the journal since
                # their checkpoint, no cache), reads exactly the replayed state.
                want = replay(led.history())
                for reader in ledgers.values():
                    assert states(reader) == want
                fresh = KINDS[kind](SQLiteStore(path))
                assert states(fresh) == want
                fresh.close()
            fresh = KINDS[kind](SQLiteStore(path))
            assert states(fresh) == replay(fresh.history())
            for led in (*ledgers.values(), fresh):
                led.close()
    finally:
        store_module.CHECKPOINT_EVERY, blocklists.LIST_FROM = previous
