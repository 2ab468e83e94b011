"""The analyst's view of their budget (issue 21, part 8), over the wire on a real Postgres: a
budget refusal says what they have left and which limit binds, the report's ``remaining`` shows
the binding limit, ``SHOW chorus.budget`` is compact and rounded, EXPLAIN reads as rows."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
import sqlglot

from chorus_py.engine import Engine
from chorus_py.errors import BudgetExhausted
from chorus_py.policy import load_policy
from tests.server.conftest import start_wire

pytestmark = pytest.mark.postgres

TWO_DAYS = "SELECT COUNT(*) FROM trips WHERE pickup_time < '2026-01-03'"
BLOCKS = ["trips/2026-01-01", "trips/2026-01-02"]


def _with_cap(policy: Path, cap: float) -> Path:
    """alice may spend at most ``cap`` on any one block (her own limit, below the block's)."""
    policy.write_text(policy.read_text().replace(
        "[analysts.alice]", f"[analysts.alice]\nmax_epsilon_per_block = {cap}"))
    return policy


def _spent(engine: Engine) -> float:
    return sum(b.epsilon_consumed + b.epsilon_allocated for b in engine.ledger.blocks())


def test_the_analysts_own_limit_binds(postgres_data: str,
                                      write_policy: Callable[..., Path]) -> None:
    policy = _with_cap(write_policy(postgres_data, epsilon_per_block=10.0, max_epsilon=5.0), 1.5)
    with start_wire(policy, backend="postgres") as wire, \
            psycopg.connect(wire.url(), autocommit=True) as con:
        con.execute("SET chorus.epsilon = 1")
        con.execute(TWO_DAYS)
        # the report after the charge: 0.25 left for alice (1.5 - 1.25), each block has 8.75
        answer = wire.engine.execute(TWO_DAYS, analyst="alice", epsilon=0.25)
        for left in answer.report.remaining:
            assert left.binding == "analyst"
            assert left.epsilon_left == pytest.approx(0.25)
            assert left.analyst_epsilon_left == pytest.approx(0.25)
            assert left.block_epsilon_left == pytest.approx(10 - 1.25)
        assert answer.to_dict()["report"]["remaining"][0]["binding"] == "analyst"

        cur = con.execute("SHOW chorus.budget")
        names = [d.name for d in cur.description]
        rows = {r[0]: dict(zip(names, r, strict=True)) for r in cur.fetchall()}
        assert sorted(rows) == BLOCKS
        assert rows[BLOCKS[0]] == {
            "block": BLOCKS[0], "state": "active", "epsilon_left": 0.25,
            "limited_by": "your limit", "your_epsilon_spent": 1.25, "epsilon_spent": 1.25,
            "delta_left": rows[BLOCKS[0]]["delta_left"]}
        assert rows[BLOCKS[0]]["delta_left"] == pytest.approx(1e-3, rel=1e-3)
        # bob has no limit of his own: the block's budget binds, he spent nothing
        with psycopg.connect(wire.url("bob"), autocommit=True) as bob:
            theirs = bob.execute("SHOW chorus.budget").fetchall()
        assert {r[0]: (r[2], r[3], r[4]) for r in theirs} == {
            b: (8.75, "block", 0.0) for b in BLOCKS}

        before = _spent(wire.engine)
        with pytest.raises(psycopg.errors.lookup("53400")) as refused:
            con.execute(TWO_DAYS)  # epsilon 1 > the 0.25 she has left
        message = refused.value.diag.message_primary or ""
        assert "nothing was spent" in message
        assert ("You have epsilon 0.25 left on the 2 block(s) this query reads (tightest: "
                "trips/2026-01-01, where your own limit of 1.5 per block leaves 0.25 and "
                "the block's budget 8.75)") in message
        assert "SHOW chorus.budget" in message
        assert _spent(wire.engine) == before
        con.execute("SET chorus.epsilon = 0.25")
        con.execute(TWO_DAYS)  # what she was told she has left is what she can spend


def test_a_block_budget_refusal_says_what_is_left(postgres_data: str,
                                                  write_policy: Callable[..., Path]) -> None:
    policy = write_policy(postgres_data, epsilon_per_block=2.0, max_epsilon=2.0)
    engine = Engine(load_policy(policy))
    try:
        engine.execute(TWO_DAYS, analyst="alice", epsilon=1.5)
        with pytest.raises(BudgetExhausted) as refused:
            engine.execute(TWO_DAYS, analyst="alice", epsilon=1.0)
        assert ("You have epsilon 0.5 left on the 2 block(s) this query reads (tightest: "
                "trips/2026-01-01, whose budget leaves 0.5)") in refused.value.message
        engine.execute(TWO_DAYS, analyst="alice", epsilon=0.5)
    finally:
        engine.close()


def test_explain_over_the_wire_reads_as_rows(postgres_data: str,
                                             write_policy: Callable[..., Path]) -> None:
    sql = "SELECT city, AVG(fare) AS f, COUNT(*) AS n FROM trips GROUP BY city"
    with start_wire(write_policy(postgres_data), backend="postgres") as wire, \
            psycopg.connect(wire.url(), autocommit=True) as con:
        rows = [r[0] for r in con.execute(f"EXPLAIN {sql}").fetchall()]
        report = wire.engine.explain(sql, analyst="alice")
    assert max(len(r) for r in rows) <= 240, max(rows, key=len)
    assert rows[0] == "verdict: allowed"
    first = rows.index("measurement m0 = SUM(trips.fare - 100)")
    assert rows[first + 1].startswith("  sensitivity ")
    assert rows[first + 2].startswith("  snapping noise: epsilon=")
    start = rows.index("rewritten SQL:")
    sql_rows = rows[start + 1:]
    assert len(sql_rows) > 10 and all(r.startswith("  ") for r in sql_rows)
    # The rows are the statement the proxy runs, laid out: it parses back to the same tree.
    assert report.rewritten_sql is not None
    assert sqlglot.parse_one("\n".join(sql_rows), read="postgres") == \
        sqlglot.parse_one(report.rewritten_sql, read="postgres")


def test_a_refusal_for_delta_says_delta_is_short(duckdb_data: str,
                                                 write_policy: Callable[..., Path]) -> None:
    """A block with epsilon to spare and no delta left: the refusal names delta, not only the
    (plentiful) epsilon left."""
    engine = Engine(load_policy(write_policy(duckdb_data)))
    released = "SELECT driver_id, COUNT(*) FROM trips GROUP BY driver_id"  # keys by threshold
    try:
        answered = 0
        with pytest.raises(BudgetExhausted) as refused:
            while answered < 11:  # delta_per_block 1e-3 pays ten of 1e-4
                engine.execute(released, analyst="alice", epsilon=0.01, delta=1e-4)
                answered += 1
        assert answered == 10
        message = refused.value.message
        assert "delta is short: " in message and "this query asks delta 0.0001" in message
        assert "You have epsilon 999.9 left" in message
    finally:
        engine.close()
