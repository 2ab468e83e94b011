"""The statements the stores write, serialised across every proxy that shares the database.

``chorus serve --workers N``, or proxies on several machines, share one database: two of them
needing the same stored thing at once (the naming key, a bounded sample, a kept set) would
both create it, and Postgres refuses the second ``CREATE`` of a schema or a table that the
first has not committed yet (a unique violation in its catalog, even with ``IF NOT EXISTS``).
So on Postgres each batch of ``Backend.run_owned`` statements (one transaction) first takes
a transaction-level advisory lock that every proxy takes with the same key: batches run one
after the other, and a batch written to skip what exists (``IF NOT EXISTS``) finds what the
one before it committed.  The lock is released at commit or rollback, and by the server if
the proxy dies.  An embedded DuckDB file has one process: nothing to take there.
"""

from __future__ import annotations

from collections.abc import Sequence

# The advisory lock's key: any 64-bit number no other user of the database takes; this one is
# "chorus" in ASCII.
LOCK_KEY = 0x63686F727573


def serialised(dialect: str, statements: Sequence[str]) -> list[str]:
    """``statements`` (one ``run_owned`` batch), behind the stores' lock on Postgres."""
    if dialect != "postgres":
        return list(statements)
    return [f"SELECT pg_advisory_xact_lock({LOCK_KEY})", *statements]
