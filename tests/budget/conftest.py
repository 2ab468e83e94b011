"""Fixtures shared by the ledger tests."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

LEDGER_TABLES = ("meta", "blocks", "claims", "journal", "blocklists")


def drop_pg_ledger(url: str) -> None:
    """Drop the ledger's tables from a Postgres database (a fresh ledger on next open)."""
    with psycopg.connect(url, autocommit=True) as con:
        for t in LEDGER_TABLES:
            con.execute(f"DROP TABLE IF EXISTS chorus_ledger_{t}")


@pytest.fixture
def pg_ledger_url(postgres_url: str) -> Iterator[str]:
    """A Postgres database with empty ledger tables."""
    drop_pg_ledger(postgres_url)
    yield postgres_url
