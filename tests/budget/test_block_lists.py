"""Block lists stored once: a claim's long list of blocks is named by reference in its rows.

A query over a quarter of daily blocks names about 90 of them; its claim row and the journal
rows of its arrival, grant and consumption would each repeat that list.  These tests check that
the stored rows hold a reference instead, that every reader (this ledger, one opened afresh,
the history an auditor replays) gets the lists back exactly, that a list changed or removed
outside chorus is refused rather than misread, and that a ledger written before (schema 2) is
read as it is and upgraded.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from budget import blocklists
from budget import store as store_module
from budget.ledger import Ledger, LedgerMismatch, replay
from budget.scheduler import BlockState, InvariantError
from budget.store import PostgresStore, SQLiteStore, Store

QUARTER = [f"trips/2026-{m:02d}-{d:02d}" for m in (1, 2, 3) for d in range(1, 31)]
EPS = 1 / 64


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[object]:
    if request.param == "sqlite":
        path = tmp_path / "ledger.sqlite3"
        yield lambda: SQLiteStore(path)
    else:
        url = request.getfixturevalue("pg_ledger_url")
        yield lambda: PostgresStore(url)


def rows(store: Store, sql: str) -> list[tuple[object, ...]]:
    assert isinstance(store, store_module.SQLStore)
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(sql))]


def states(led: Ledger) -> dict[str, BlockState]:
    return {b.block_id: b for b in led._peek(lambda tx: [x.copy() for x in tx.all_blocks()])}


def test_a_long_block_list_is_stored_once_and_every_reader_gets_it_back(open_store) -> None:
    led = Ledger(1.0, 0.0, store=open_store())
    led.ensure_blocks(QUARTER)
    for _ in range(2):
        led.claim("alice", QUARTER, EPS, 0.0, consume_on_grant=True)
    led.claim("bob", QUARTER[:3], EPS, 0.0, consume_on_grant=True)  # short: kept inline
    p = "chorus_ledger_" if isinstance(led.store, PostgresStore) else "ledger_"
    (listed,) = rows(led.store, f"SELECT list_id, blocks FROM {p}blocklists")
    assert listed[1].count("trips/") == 90
    claim_rows = rows(led.store, f"SELECT claim_id, data FROM {p}claims ORDER BY claim_id")
    journal_rows = rows(led.store, f"SELECT event, data FROM {p}journal WHERE claim_id IS NOT "
                                   "NULL ORDER BY seq")
    # The two long claims and their 6 journal rows name the list; the short one lists its own.
    long_rows = [d for _, d in claim_rows[:2]] + [d for _, d in journal_rows[:6]]
    assert all(listed[0] in d and "trips/" not in d for d in long_rows)
    assert all("trips/2026-01-01" in d and "$blocks" not in d
               for d in [claim_rows[2][1]] + [d for _, d in journal_rows[6:]])
    # A 90-block claim now adds about 1 KB of claim and journal text, not 7.
    assert sum(len(d) for d in long_rows) / 2 < 1500
    fresh = Ledger(1.0, 0.0, store=open_store())
    for reader in (led, fresh):
        claims = reader.claims()
        assert [c.blocks for c in claims] == [tuple(QUARTER)] * 2 + [tuple(QUARTER[:3])]
        history = reader.history()
        moves = [e for e in history if e["event"] == "claim_consumed"]
        assert [m["data"]["blocks"] for m in moves] == [QUARTER] * 2 + [QUARTER[:3]]
        arrived = [e for e in history if e["event"] == "claim_arrived"]
        assert arrived[0]["data"]["claim"]["blocks"] == QUARTER
        assert states(reader) == replay(history)
    assert states(fresh)["trips/2026-01-01"].consumed == [3 * EPS]
    assert states(fresh)["trips/2026-03-30"].consumed == [2 * EPS]
    fresh.claim("carol", QUARTER, EPS, 0.0, consume_on_grant=True)  # a known list: no new row
    assert len(rows(fresh.store, f"SELECT list_id FROM {p}blocklists")) == 1
    assert states(led) == states(fresh) == replay(fresh.history())
    for ledger in (led, fresh):
        ledger.close()


def sqlite_rows(path: Path, sql: str, *args: object) -> None:
    with contextlib.closing(sqlite3.connect(path)) as con, con:
        con.execute(sql, args)


def test_a_block_list_changed_or_removed_outside_chorus_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    led = Ledger(1.0, 0.0, store=SQLiteStore(path))
    led.ensure_blocks(QUARTER)
    led.claim("alice", QUARTER, EPS, 0.0, consume_on_grant=True)
    led.close()
    # One block fewer: the claim would read as charged on 89 blocks.
    sqlite_rows(path, "UPDATE ledger_blocklists SET blocks = replace(blocks, "
                      "'\"trips/2026-01-01\",', '')")
    with pytest.raises(InvariantError, match="does not match its id"):
        Ledger(1.0, 0.0, store=SQLiteStore(path)).claims()
    with pytest.raises(InvariantError, match="does not match its id"):
        Ledger(1.0, 0.0, store=SQLiteStore(path)).history()
    sqlite_rows(path, "DELETE FROM ledger_blocklists")
    with pytest.raises(InvariantError, match="missing"):
        Ledger(1.0, 0.0, store=SQLiteStore(path)).claims()


def test_a_schema_2_ledger_is_read_as_it_is_and_upgraded(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ledger.sqlite3"
    with monkeypatch.context() as m:  # as schema 2 wrote it: every list inline
        m.setattr(blocklists, "LIST_FROM", 10**9)
        old = Ledger(1.0, 0.0, store=SQLiteStore(path))
        old.ensure_blocks(QUARTER)
        old.claim("alice", QUARTER, EPS, 0.0, consume_on_grant=True)
        old.close()
    sqlite_rows(path, "UPDATE ledger_meta SET value = '2' WHERE key = 'schema'")
    sqlite_rows(path, "DELETE FROM ledger_blocklists")
    led = Ledger(1.0, 0.0, store=SQLiteStore(path))
    assert led.claims()[0].blocks == tuple(QUARTER)
    led.claim("bob", QUARTER, EPS, 0.0, consume_on_grant=True)
    assert [c.blocks for c in led.claims()] == [tuple(QUARTER)] * 2
    assert states(led) == replay(led.history())
    assert states(led)["trips/2026-02-15"].consumed == [2 * EPS]
    with contextlib.closing(sqlite3.connect(path)) as con:
        assert con.execute("SELECT value FROM ledger_meta WHERE key = 'schema'").fetchone() \
            == ("3",)
        assert con.execute("SELECT COUNT(*) FROM ledger_blocklists").fetchone() == (1,)
    # A proxy of the older version would misread the references: it is refused.
    with pytest.raises(LedgerMismatch, match=r"\(schema\) 3, written by a newer version"):
        SQLiteStore(path).check_meta({"accounting": "basic", "schema": "2"})
    led.close()
