"""Issue 18, visibility: each analyst sees only their own spending at every front door.

Two analysts spend on the same blocks, alice over the wire protocol and bob over REST, on one
engine (one ledger); then each looks at the budget through every door (wire ``SHOW
chorus.budget``, REST ``/v1/budget`` and the owner-only pages, the DB-API in-process and over
REST, the CLI).  An analyst must see every block's totals, the same numbers the owner sees, and
their own spending; never the other analyst's name or amount.  The owner's token sees both.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import chorus_py
from budget.ledger import Viewer
from chorus_py.engine import Engine
from chorus_py.policy import load_policy
from tests.rest.harness import (
    ALICE_TOKEN,
    BOB_TOKEN,
    OWNER_TOKEN,
    ServerThread,
    policy_with_tokens,
    serve_engine,
)
from tests.server.conftest import Wire, start_wire

SQL = "SELECT COUNT(*) FROM trips WHERE pickup_time >= '2026-03-30'"
BLOCKS = ("trips/2026-03-30", "trips/2026-03-31")
SPENT = {"alice": 0.25, "bob": 0.125}
OTHER = {"alice": "bob", "bob": "alice"}
CHORUS = Path(sys.executable).parent / "chorus"


def _totals(blocks: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each block's numbers but ``by_analyst``: what every viewer must see alike."""
    return {b["block"]: {k: v for k, v in b.items() if k != "by_analyst"} for b in blocks}


@pytest.fixture(params=["duckdb", pytest.param("postgres", marks=pytest.mark.postgres)])
def doors(request: pytest.FixtureRequest,
          tmp_path: Path) -> Iterator[tuple[Wire, ServerThread]]:
    """The wire server and the REST server on one engine; alice spent over the wire, bob over
    REST, both on BLOCKS."""
    policy = tmp_path / "policy.toml"
    policy.write_text(policy_with_tokens(request.getfixturevalue(f"{request.param}_data")))
    with start_wire(policy, backend=request.param) as wire, serve_engine(wire.engine) as rest:
        with psycopg.connect(wire.url("alice"), autocommit=True) as con:
            con.execute(f"SET chorus.epsilon = {SPENT['alice']}")
            con.execute(SQL)
        with rest.client(BOB_TOKEN) as bob:
            answer = bob.post("/v1/query", json={"sql": SQL, "epsilon": SPENT["bob"]})
            assert answer.status_code == 200, answer.text
            assert "alice" not in answer.text  # the report shows block totals, no names
        yield wire, rest


def test_wire_show_budget_shows_only_the_sessions_own_spending(
        doors: tuple[Wire, ServerThread]) -> None:
    wire, _ = doors
    owner = wire.engine.ledger.budget_view(Viewer.owner())
    for block in owner:
        if block["block"] in BLOCKS:
            assert block["by_analyst"] == SPENT  # both spent here: a view could leak either
    for me, other in OTHER.items():
        owner = wire.engine.ledger.budget_view(Viewer.owner())
        with psycopg.connect(wire.url(me), autocommit=True) as con:
            cur = con.execute("SHOW chorus.budget_full")
            names = [d.name for d in cur.description]
            rows = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
        assert f"by_analyst_{me}" in names
        assert not any(other in n for n in names)
        assert other not in json.dumps(rows, default=str)
        assert {r["block"]: r[f"by_analyst_{me}"] for r in rows} == {
            b: pytest.approx(mine["by_analyst"][me]) for b in BLOCKS
            for mine in owner if mine["block"] == b}
        for row in rows:  # the same totals as the owner's
            mine = next(b for b in owner if b["block"] == row["block"])
            for key in ("epsilon_consumed", "epsilon_allocated", "epsilon_remaining",
                        "delta_consumed"):
                assert row[key] == pytest.approx(mine[key]), key
            for part in ("spent", "left"):
                assert row[f"guarantee_{part}_epsilon"] == pytest.approx(
                    mine[f"guarantee_{part}"]["epsilon"])
        # the same in binary results, and over the simple query protocol (psql)
        with psycopg.connect(wire.url(me), autocommit=True) as con:
            binary = con.cursor(binary=True).execute("SHOW chorus.budget_full")
            assert [d.name for d in binary.description] == names
            assert other not in json.dumps(binary.fetchall(), default=str)
            # a query's report (EXPLAIN: rows; an answer: a NOTICE) shows block totals only
            notices: list[str] = []
            con.add_notice_handler(
                lambda diag, out=notices: out.append(str(diag.message_primary)))
            con.execute("SET chorus.epsilon = 0.001")
            explained = con.execute(f"EXPLAIN {SQL}").fetchall()
            con.execute("SELECT COUNT(*) FROM trips WHERE pickup_time >= '2026-03-31'")
            assert notices and other not in json.dumps([explained, notices], default=str)
        psql = shutil.which("psql")
        if psql is not None:
            shown = subprocess.run([psql, wire.url(me), "-XAc", "SHOW chorus.budget_full"],
                                   capture_output=True, text=True, timeout=60, check=False)
            assert shown.returncode == 0, shown.stderr
            assert f"by_analyst_{me}" in shown.stdout and other not in shown.stdout


def test_rest_and_dbapi_show_only_the_analysts_own_spending(
        doors: tuple[Wire, ServerThread]) -> None:
    wire, rest = doors
    before = wire.engine.ledger.budget_view(Viewer.owner())
    with rest.client(OWNER_TOKEN) as owner_client:
        owner = owner_client.get("/v1/budget").json()["blocks"]
        assert {b["block"]: b["by_analyst"] for b in owner} == {b: SPENT for b in BLOCKS}
        assert owner_client.get("/v1/budget/analysts/alice").json()["epsilon_consumed"] == 0.25
        dashboard = owner_client.get("/v1/dashboard").json()
        assert {a["analyst"] for a in dashboard["analysts"]} >= {"alice", "bob"}
        assert 'analyst="alice"' in owner_client.get("/metrics").text
    for me, token in (("alice", ALICE_TOKEN), ("bob", BOB_TOKEN)):
        other = OTHER[me]
        with rest.client(token) as client:
            answer = client.get("/v1/budget")
            assert answer.status_code == 200
            assert other not in answer.text
            blocks = answer.json()["blocks"]
            assert {b["block"]: b["by_analyst"] for b in blocks} == {
                b: {me: SPENT[me]} for b in BLOCKS}
            assert _totals(blocks) == _totals(owner)
            mine = client.get(f"/v1/budget/analysts/{me}")
            assert mine.status_code == 200 and other not in mine.text
            # the owner's pages and the other analyst's spending stay closed
            for path in (f"/v1/budget/analysts/{other}", "/v1/dashboard", "/metrics"):
                refused = client.get(path)
                assert refused.status_code == 403, path
                assert other not in refused.json()["detail"]  # ("instance" echoes the path)
        # the DB-API: in-process on the same engine, and over REST
        for conn in (chorus_py.connect(engine=wire.engine, analyst=me),
                     chorus_py.connect(rest.url, token=token)):
            with conn:
                seen = conn.budget()
            assert other not in json.dumps(seen)
            assert {b["block"]: b["by_analyst"] for b in seen} == {
                b: {me: SPENT[me]} for b in BLOCKS}
            assert _totals(seen) == _totals(owner)
    assert wire.engine.ledger.budget_view(Viewer.owner()) == before  # looking costs nothing


def _chorus(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CHORUS), *args], capture_output=True, text=True, timeout=120,
                          check=False)


def test_cli_budget_as_an_analyst(duckdb_data: str, write_policy: Callable[..., Path]) -> None:
    path = write_policy(duckdb_data)
    with Engine(load_policy(path)) as engine:
        for analyst, epsilon in SPENT.items():
            engine.execute(SQL, analyst=analyst, epsilon=epsilon)
    owner = json.loads(_chorus("budget", "--policy", str(path), "--json").stdout)
    assert {b["block"]: b["by_analyst"] for b in owner["blocks"]} == {b: SPENT for b in BLOCKS}
    for me, other in OTHER.items():
        status = _chorus("budget", "--policy", str(path), "--json", "--analyst", me)
        assert status.returncode == 0, status.stderr
        assert other not in status.stdout
        assert _totals(json.loads(status.stdout)["blocks"]) == _totals(owner["blocks"])
        spending = _chorus("budget", "--policy", str(path), "--json", "--analyst", me,
                           "analysts")
        assert json.loads(spending.stdout)["analysts"] == {me: dict.fromkeys(BLOCKS, SPENT[me])}
        table = _chorus("budget", "--policy", str(path), "--analyst", me, "analysts")
        assert me in table.stdout and other not in table.stdout
        journal = _chorus("budget", "--policy", str(path), "--analyst", me, "history")
        assert journal.returncode == 2 and "data owner's view" in journal.stderr
        assert other not in journal.stdout + journal.stderr
    unknown = _chorus("budget", "--policy", str(path), "--analyst", "mallory")
    assert unknown.returncode == 2 and "no analyst named 'mallory'" in unknown.stderr
    everyone = _chorus("budget", "--policy", str(path), "analysts")
    assert "alice" in everyone.stdout and "bob" in everyone.stdout
