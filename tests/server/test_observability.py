"""What the operator sees (issue 21, parts 4 and 5): one JSON log line per query, refusal, failed
login and database health change, and every front door in /metrics.

The main test runs the real ``chorus serve --log-format json`` on the test Postgres, talks to it
with psycopg (wire protocol) and httpx (REST), scrapes /metrics, stops it and reads its log.
"""

from __future__ import annotations

import hashlib
import json
import logging
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from chorus_py.activity import Activity, JsonFormatter, configure_logging
from chorus_py.clients import dbapi
from chorus_py.demo import generate_demo
from chorus_py.engine import Engine
from chorus_py.policy import load_policy
from server.metrics import Metrics
from server.pgwire.scram import make_verifier
from tests.conftest import PG_ADMIN_URL, free_port
from tests.rest.harness import ALICE_TOKEN, OWNER_TOKEN, policy_with_tokens, serve_engine

pytestmark = pytest.mark.postgres

CHORUS = Path(sys.executable).parent / "chorus"
ANSWERED = "SELECT COUNT(*) FROM trips WHERE fare > 12.5"
REFUSED = "SELECT fare FROM trips WHERE fare > 12.5"  # raw rows: refused by the policy



def _wait_for(port: int, proc: subprocess.Popen[str]) -> None:
    deadline = time.time() + 60
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.1)
    raise AssertionError(f"nothing listens on {port}")


def _policy(directory: Path, url: str) -> Path:
    text = policy_with_tokens(url).replace(
        "[analysts.alice]", f'[analysts.alice]\npassword = "{make_verifier("alice-pw")}"')
    path = directory / "policy.toml"
    path.write_text(text)
    return path


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus text page: (name, sorted labels) -> value."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_serve_logs_json_and_counts_every_door(postgres_data: str, tmp_path: Path) -> None:
    policy = _policy(tmp_path, postgres_data)
    wire_port, rest_port = free_port(), free_port()
    proc = subprocess.Popen(
        [str(CHORUS), "serve", "--policy", str(policy), "--listen", f"127.0.0.1:{wire_port}",
         "--rest", f"127.0.0.1:{rest_port}", "--log-format", "json"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        _wait_for(wire_port, proc)
        _wait_for(rest_port, proc)
        wire = f"postgresql://alice:alice-pw@127.0.0.1:{wire_port}/chorus?sslmode=disable"
        rest = f"http://127.0.0.1:{rest_port}"
        with psycopg.connect(wire, autocommit=True) as con:
            assert isinstance(con.execute(ANSWERED).fetchone()[0], int)
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                con.execute(REFUSED)
            with pytest.raises(psycopg.OperationalError, match="password authentication"):
                psycopg.connect(wire.replace("alice-pw", "hunter2-nope"))
            with pytest.raises(psycopg.OperationalError, match="password authentication"):
                psycopg.connect(wire.replace("alice:alice-pw", "bob:hunter2-nope"))
            with httpx.Client(base_url=rest, timeout=60) as client:
                answer = client.post("/v1/query", json={"sql": ANSWERED, "epsilon": 0.5},
                                     headers={"Authorization": f"Bearer {ALICE_TOKEN}"})
                assert answer.status_code == 200, answer.text
                bad = client.post("/v1/query", json={"sql": ANSWERED},
                                  headers={"Authorization": "Bearer not-a-token-123"})
                assert bad.status_code == 401
                for _ in range(3):
                    assert client.get("/healthz").status_code == 200
                # Scraped while the wire connection is still open.
                page = client.get("/metrics",
                                  headers={"Authorization": f"Bearer {OWNER_TOKEN}"})
                assert page.status_code == 200, page.text
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)

    samples = _samples(page.text)
    queries = "chorus_queries_total"
    assert _value(samples, queries, door="wire", action="query", outcome="answered") == 1
    assert _value(samples, queries, door="wire", action="query", outcome="refused") == 1
    assert _value(samples, queries, door="rest", action="query", outcome="answered") == 1
    assert _value(samples, "chorus_refusals_total", door="wire", sqlstate="42501",
                  reason="QueryRefused") == 1
    assert _value(samples, "chorus_epsilon_charged_total", door="wire") == 1.0
    assert _value(samples, "chorus_epsilon_charged_total", door="rest") == 0.5
    assert _value(samples, "chorus_door_query_duration_seconds_count", door="wire",
                  action="query") == 2
    assert _value(samples, "chorus_failed_logins_total", door="wire") == 2
    assert _value(samples, "chorus_failed_logins_total", door="rest") == 1
    # _wait_for's probe, the analyst's connection and the two failed logins.
    assert _value(samples, "chorus_connections_opened_total", door="wire") == 4
    assert _value(samples, "chorus_connections", door="wire") == 1  # the one still open
    assert _value(samples, "chorus_backend_up") == 1

    # Every line of the log is one JSON object; SQL text and secrets never appear in it.
    lines = [json.loads(line) for line in err.splitlines() if line.strip()]
    assert "fare >" not in err and "FROM trips" not in err
    assert ALICE_TOKEN not in err and "not-a-token" not in err and "hunter2" not in err
    audit = [line for line in lines if line["logger"] == "chorus.audit"]
    answered_hash = hashlib.sha256(ANSWERED.encode()).hexdigest()[:16]
    wire_answer = next(e for e in audit if e.get("door") == "wire"
                       and e.get("outcome") == "answered")
    assert wire_answer["event"] == "query" and wire_answer["level"] == "info"
    assert wire_answer["analyst"] == "alice" and wire_answer["sql_sha256"] == answered_hash
    assert wire_answer["epsilon"] == 1.0 and wire_answer["charged"] is True
    assert wire_answer["blocks"] > 0 and wire_answer["ms"] > 0
    refusal = next(e for e in audit if e.get("outcome") == "refused")
    assert refusal | {"ms": 0} == {
        **refusal, "door": "wire", "analyst": "alice", "action": "query", "sqlstate": "42501",
        "reason": "QueryRefused", "refusal_class": "policy", "ms": 0,
        "sql_sha256": hashlib.sha256(REFUSED.encode()).hexdigest()[:16]}
    rest_answer = next(e for e in audit if e.get("door") == "rest")
    assert rest_answer["epsilon"] == 0.5 and rest_answer["sql_sha256"] == answered_hash
    logins = [e for e in audit if e["event"] == "login_failed"]
    assert {(e["door"], e.get("user"), e["reason"]) for e in logins} == {
        ("wire", "alice", "wrong_password"), ("wire", "bob", "no_password"),
        ("rest", None, "unknown_token")}
    assert all(e["level"] == "warning" for e in logins)
    # Three probes, one line: health is logged when it changes.
    assert [e["database"] for e in audit if e["event"] == "health"] == ["up"]


@pytest.fixture
def outage_db(postgres_url: str, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A database of its own (demo data) that the test can shut to new connections."""
    name = f"chorus_outage_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as con:
        con.execute(f'CREATE DATABASE "{name}"')
    url = f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{name}"
    try:
        yield url, name
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as con:
            con.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
            con.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class _Lines(logging.Handler):
    """The JSON lines the audit logger writes, kept in memory."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(JsonFormatter())
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(self.format(record)))


@pytest.fixture
def audit_lines() -> Iterator[list[dict[str, Any]]]:
    handler = _Lines()
    logger = logging.getLogger("chorus.audit")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_health_probes_log_the_outage_once(outage_db: tuple[str, str], tmp_path: Path,
                                           audit_lines: list[dict[str, Any]],
                                           caplog: pytest.LogCaptureFixture) -> None:
    url, name = outage_db
    policy = generate_demo(tmp_path, backend_url=url, rows=300)
    engine = Engine(load_policy(policy))
    try:
        with serve_engine(engine) as server, server.client() as client:
            assert client.get("/healthz").status_code == 200
            with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
                admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
                admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE datname = %s", (name,))
            for _ in range(4):
                assert client.get("/healthz").status_code == 503
            with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
                admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
            assert client.get("/healthz").status_code == 200
            assert client.get("/healthz").status_code == 200
    finally:
        engine.close()
    health = [e for e in audit_lines if e["event"] == "health"]
    assert [(e["database"], e["level"]) for e in health] == [
        ("up", "info"), ("down", "warning"), ("up", "info")]
    assert health[1]["error"] and "exception" not in health[1]
    # No traceback anywhere: not per probe, not once.
    assert not any(r.exc_info for r in caplog.records)


def test_in_process_dbapi_is_logged_and_counted(postgres_data: str, tmp_path: Path,
                                                audit_lines: list[dict[str, Any]]) -> None:
    engine = Engine(load_policy(_policy(tmp_path, postgres_data)))
    try:
        metrics = Metrics(engine)  # what `chorus serve`'s /metrics reads
        with dbapi.connect(engine=engine, analyst="alice") as con:
            cur = con.cursor()
            cur.execute(ANSWERED, epsilon=0.25)
            with pytest.raises(dbapi.ProgrammingError):
                cur.execute(ANSWERED, epsilon=-1)
        samples = _samples(_exposition(metrics))
    finally:
        engine.close()
    events = [e for e in audit_lines if e["event"] == "query"]
    assert [(e["door"], e["outcome"]) for e in events] == [("dbapi", "answered"),
                                                           ("dbapi", "refused")]
    assert events[1]["refusal_class"] == "parameter" and events[1]["sqlstate"] == "22023"
    assert "epsilon" not in events[1]  # nothing was charged or even planned
    assert _value(samples, "chorus_queries_total", door="dbapi", action="query",
                  outcome="answered") == 1
    assert _value(samples, "chorus_epsilon_charged_total", door="dbapi") == 0.25
    assert _value(samples, "chorus_refusals_total", door="dbapi", sqlstate="22023",
                  reason="InvalidParameter") == 1


def _exposition(metrics: Metrics) -> str:
    from prometheus_client import generate_latest

    return generate_latest(metrics.registry).decode()


def test_text_lines_cannot_forge_fields(capsys: pytest.CaptureFixture[str]) -> None:
    """A user name is the client's text: in a text line it is quoted, so it cannot add a
    field (``reason=ok``) or a line of its own."""
    root = logging.getLogger()
    handlers, audit_level = list(root.handlers), logging.getLogger("chorus.audit").level
    try:
        configure_logging("text")
        Activity().login_failed("wire", "mallory reason=ok\nforged line", "unknown_user")
        Activity().login_failed("wire", "eve\x1b[2J", "unknown_user")
        err = capsys.readouterr().err
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in handlers:
            root.addHandler(h)
        logging.getLogger("chorus.audit").setLevel(audit_level)
    assert err.count("\n") == 2 and "\x1b" not in err
    assert 'user="mallory reason=ok\\nforged line" reason=unknown_user' in err
    assert 'user="eve\\u001b[2J" reason=unknown_user' in err
