"""Opting in to sensitivity sampling through every front door: the Postgres wire protocol
(``SET chorus.sensitivity``), REST (a request option), the DB-API driver and the CLI."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

import chorus_py
from chorus_py.cli import main
from chorus_py.engine import Engine
from chorus_py.policy import load_policy
from tests.conftest import nothing_spent
from tests.rest.harness import ALICE_TOKEN, policy_with_tokens, serve_engine
from tests.server.conftest import start_wire
from tests.test_sampling import P_VISITS

MEDIAN = "SELECT MEDIAN(seconds) AS med FROM visits"


def test_wire_protocol_settings(duckdb_data: str, write_policy: Callable[..., Path]) -> None:
    with start_wire(write_policy(duckdb_data, extra=P_VISITS)) as wire, \
            psycopg.connect(wire.url(), autocommit=True) as con:
        assert con.execute("SHOW chorus.sensitivity").fetchone() == ("analytic",)
        con.execute("SET chorus.sensitivity = 'sampled'")
        con.execute("SET chorus.gamma = 0.05")
        assert con.execute("SHOW chorus.gamma").fetchone() == ("0.05",)
        text = "\n".join(r[0] for r in con.execute(f"EXPLAIN {MEDIAN}").fetchall())
        assert "random DP: (epsilon, delta, gamma) = (1, 0, 0.05)" in text and "m = 2000" in text
        assert nothing_spent(wire.engine)
        (value,) = con.execute(MEDIAN).fetchone()
        assert isinstance(value, float)
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            con.execute("SET chorus.gamma = 2")
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            con.execute("SET chorus.sensitivity = 'guess'")
        con.execute("RESET chorus.sensitivity")
        assert con.execute("SHOW chorus.sensitivity").fetchone() == ("analytic",)
        con.execute("RESET chorus.gamma")
        # Without the opt-in the exponential mechanism answers it (tests/test_quantiles.py).
        (analytic,) = con.execute(MEDIAN).fetchone()
        assert 0 <= analytic <= 600


def test_rest_option(duckdb_data: str, tmp_path: Path) -> None:
    path = tmp_path / "rest.toml"
    path.write_text(policy_with_tokens(duckdb_data).replace(
        "[tables.cities]", P_VISITS + "\n[tables.cities]"))
    engine = Engine(load_policy(path))
    try:
        with serve_engine(engine) as server, server.client(ALICE_TOKEN) as client:
            analytic = client.post("/v1/query", json={"sql": MEDIAN})
            assert analytic.status_code == 200, analytic.text
            assert analytic.json()["report"]["random_dp"] is None
            body = {"sql": MEDIAN, "sensitivity": "sampled", "gamma": 0.05}
            explained = client.post("/v1/explain", json=body)
            assert explained.status_code == 200, explained.text
            assert explained.json()["report"]["random_dp"]["m"] == 2000
            answered = client.post("/v1/query", json=body)
            assert answered.status_code == 200, answered.text
            assert answered.json()["report"]["random_dp"]["gamma"] == 0.05
            bad = client.post("/v1/query", json={**body, "gamma": 1.5})
            assert bad.status_code == 400 and "22023" in bad.text
    finally:
        engine.close()


def test_dbapi_option(duckdb_data: str, make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(duckdb_data, extra=P_VISITS)
    with chorus_py.connect(engine=engine, analyst="alice", sensitivity="sampled") as conn:
        cur = conn.cursor()
        cur.execute(MEDIAN)
        assert cur.privacy_report is not None and cur.privacy_report.random_dp is not None
        report = cur.explain(MEDIAN, gamma=0.04)
        assert report.random_dp is not None and report.random_dp.gamma == 0.04
        cur.execute(MEDIAN, sensitivity="analytic")  # the exponential mechanism's answer
        assert cur.privacy_report is not None and cur.privacy_report.random_dp is None


def test_cli_flags(duckdb_data: str, write_policy: Callable[..., Path]) -> None:
    policy = str(write_policy(duckdb_data, extra=P_VISITS))
    runner = CliRunner()
    out = runner.invoke(main, ["explain", "--policy", policy, "--analyst", "alice",
                               "--sensitivity", "sampled", "--gamma", "0.05", MEDIAN])
    assert out.exit_code == 0, out.output
    assert "random DP: gamma=0.05" in out.output and "sampling distribution P" in out.output
    out = runner.invoke(main, ["query", "--policy", policy, "--analyst", "alice", "--json",
                               "--sensitivity", "sampled", MEDIAN])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output.strip().splitlines()[-1])
    assert data["report"]["random_dp"]["k"] <= data["report"]["random_dp"]["m"]
