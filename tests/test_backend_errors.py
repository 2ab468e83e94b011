"""Backend failures: classified as "touched data" or not, charged accordingly, never leaked."""

from __future__ import annotations

import psycopg
import pytest

from chorus_py.backends import PostgresBackend, StatementFailed
from chorus_py.backends.postgres import RANDOM_PAGE_COST
from chorus_py.engine import Engine
from chorus_py.errors import BackendError, InternalError
from chorus_py.statements import QueryRun

# Fails while reading values: the error text would quote 'secret-value-42'.
DATA_ERROR = "SELECT CAST(x AS INTEGER) FROM (VALUES ('secret-value-42')) AS t(x)"
PLAN_ERROR = "SELECT no_such_column FROM trips"


def test_data_errors_touch_data(engine: Engine) -> None:
    with pytest.raises(StatementFailed) as info:
        engine.backend.run(DATA_ERROR)
    assert info.value.touched_data
    assert "secret-value-42" in info.value.detail  # the detail is for the operator's log only


def test_plan_errors_do_not_touch_data(engine: Engine) -> None:
    for sql in ("SELEC 1", PLAN_ERROR):
        with pytest.raises(StatementFailed) as info:
            engine.backend.run(sql)
        assert not info.value.touched_data


def test_data_error_after_claim_is_charged_and_sanitised(engine: Engine) -> None:
    engine.ledger.ensure_blocks(["b"])
    # The engine's claims are consumed when granted, before the query runs.
    claim = engine.ledger.claim("alice", ["b"], 0.5, 0.0, consume_on_grant=True)
    with pytest.raises(BackendError) as info:
        engine.statements.run(DATA_ERROR, QueryRun(claim))
    assert "secret-value-42" not in str(info.value)
    assert claim.state == "consumed"
    assert engine.ledger.blocks()[0].epsilon_consumed == 0.5


def test_plan_error_after_claim_is_refunded(engine: Engine) -> None:
    engine.ledger.ensure_blocks(["b"])
    claim = engine.ledger.claim("alice", ["b"], 0.5, 0.0, consume_on_grant=True)
    with pytest.raises(InternalError):
        engine.statements.run(PLAN_ERROR, QueryRun(claim))
    assert claim.state == "released"
    assert engine.ledger.blocks()[0].epsilon_consumed == 0.0
    assert engine.ledger.history()[-1]["event"] == "claim_refunded"


def test_the_backend_connection_cannot_write(engine: Engine) -> None:
    """Defence in depth behind the validator: every statement runs in a read-only transaction
    (Postgres: default_transaction_read_only; DuckDB: BEGIN TRANSACTION READ ONLY)."""
    for sql in ("CREATE TABLE chorus_escape (a INTEGER)", "DELETE FROM trips"):
        with pytest.raises(StatementFailed) as info:
            engine.backend.run(sql)
        assert "read-only" in info.value.detail.lower() or "read only" in \
            info.value.detail.lower()
    assert engine.backend.run("SELECT COUNT(*) FROM trips").rows[0][0] > 0


def test_a_cancel_after_the_statement_ended_is_dropped(engine: Engine) -> None:
    """A late cancel must not reach the connection's next statement (another query's)."""
    import threading

    from chorus_py.backends import cancel

    sent: list[str] = []
    me = threading.get_ident()
    with cancel.cancellable(lambda: sent.append("during")):
        assert engine.backend.interrupt(me)
    assert cancel._RUNNING.get(me) is None and not engine.backend.interrupt(me)
    # A cancel looked up while the statement ran but sent after it ended: dropped.
    with cancel.cancellable(lambda: sent.append("late")):
        looked_up = cancel._RUNNING[me]
    assert not looked_up.cancel("user request")
    assert sent == ["during"]


@pytest.mark.postgres
def test_postgres_prepares_repeated_queries_and_survives_a_replaced_table(
        postgres_url: str) -> None:
    """A repeated query text is prepared on its connection (Postgres skips planning it); when a
    table it reads is replaced by one of other column types, Postgres refuses the stale plan
    before reading a row and the backend runs the query again on a fresh connection."""
    import psycopg

    from chorus_py.backends import PostgresBackend

    with psycopg.connect(postgres_url, autocommit=True) as owner:
        owner.execute("DROP TABLE IF EXISTS replaced")
        owner.execute("CREATE TABLE replaced (v integer)")
        owner.execute("INSERT INTO replaced VALUES (1), (2)")
        backend = PostgresBackend(postgres_url, statement_timeout_s=10, pool_size=1)
        sql = "SELECT v FROM replaced ORDER BY v"
        for _ in range(8):
            assert backend.run(sql).rows == [(1,), (2,)]
        con = backend._pool.get_nowait()
        prepared = con.execute("SELECT statement FROM pg_prepared_statements").fetchall()
        backend._pool.put_nowait(con)
        assert [r[0] for r in prepared] == [sql]
        owner.execute("DROP TABLE replaced")
        owner.execute("CREATE TABLE replaced (v text)")
        owner.execute("INSERT INTO replaced VALUES ('a')")
        result = backend.run(sql)
        assert result.rows == [("a",)] and result.types == ("text",)
        owner.execute("DROP TABLE replaced")
    backend.close()


@pytest.mark.postgres
@pytest.mark.parametrize("options", [None, 4.0, 0.5])
def test_postgres_connections_plan_with_a_random_page_cost_no_higher_than_ssds(
        postgres_url: str, options: float | None) -> None:
    """The proxy's connections lower random_page_cost to 1.1 (its twins' indexes are read in
    order: ``chorus_py.backends.postgres``) and never raise a lower one the server (here also
    the connection's options) already has; public queries keep the server's."""
    url = postgres_url if options is None else \
        f"{postgres_url}?options=-c%20random_page_cost%3D{options}"
    setting = "SELECT current_setting('random_page_cost')::float8"
    with psycopg.connect(url) as plain:
        (server,) = plain.execute(setting).fetchone()  # type: ignore[misc]
    backend = PostgresBackend(url, statement_timeout_s=30)
    try:
        assert backend.run(setting).rows == [(min(server, RANDOM_PAGE_COST),)]
        assert backend.run_public(setting).rows == [(server,)]
    finally:
        backend.close()
