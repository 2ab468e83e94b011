"""The ``chorus`` console script, run as a real subprocess.

Exit status: 0 on success, 2 when a query is refused, 1 on any other failure (bad policy,
unreachable backend).  With ``--json`` stdout holds exactly one JSON object.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

CHORUS = Path(sys.executable).parent / "chorus"
PG_ADMIN_URL = os.environ.get("CHORUS_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
COUNT_SQL = "SELECT COUNT(*) FROM trips"


def chorus(*args: str, cwd: Path | None = None,
           timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(CHORUS), *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, check=False)


def one_json(stdout: str) -> dict[str, Any]:
    """stdout must be exactly one JSON object (one line)."""
    lines = stdout.strip().splitlines()
    assert len(lines) == 1, stdout
    value = json.loads(lines[0])
    assert isinstance(value, dict)
    return value


@pytest.fixture
def policy(duckdb_data: str, write_policy: Callable[..., Path], tmp_path: Path) -> Path:
    """The test policy on a private copy of the DuckDB file.

    A subprocess cannot open a DuckDB file this pytest process has open (file lock), and other
    tests may hold engines on the shared one.
    """
    copy = tmp_path / "cli.duckdb"
    shutil.copy(duckdb_data.removeprefix("duckdb:///"), copy)
    return write_policy(f"duckdb:///{copy}")


def test_executable_exists() -> None:
    assert CHORUS.exists(), f"console script not installed at {CHORUS}"


# -- help --------------------------------------------------------------------------------------
@pytest.mark.parametrize(("args", "example"), [
    ([], "chorus query --policy"),
    (["query"], "chorus query --policy demo/policy.toml"),
    (["explain"], "chorus explain --policy demo/policy.toml"),
    (["demo"], "chorus demo --dir"),
])
def test_help_prints_an_example(args: list[str], example: str) -> None:
    result = chorus(*args, "--help")
    assert result.returncode == 0, result.stderr
    assert "Example" in result.stdout or "Start here" in result.stdout
    assert example in result.stdout
    if not args:
        for command in ("demo", "query", "explain"):
            assert command in result.stdout
    else:
        assert f"Usage: chorus {args[0]}" in result.stdout


def test_short_help_flag() -> None:
    result = chorus("query", "-h")
    assert result.returncode == 0 and "--policy" in result.stdout


# -- query -------------------------------------------------------------------------------------
def test_query_json(policy: Path) -> None:
    # -v logs to stderr: stdout stays one JSON object.
    result = chorus("-v", "query", "--policy", str(policy), "--analyst", "alice", "--json",
                    COUNT_SQL)
    assert result.returncode == 0, result.stderr
    assert "chorus.audit" in result.stderr and "sql_sha256=" in result.stderr
    answer = one_json(result.stdout)
    assert {"columns", "rows", "report"} <= answer.keys()
    assert len(answer["columns"]) == 1
    assert len(answer["rows"]) == 1 and len(answer["rows"][0]) == 1
    count = answer["rows"][0][0]
    assert isinstance(count, int)
    assert 0 < count < 4000 + 100  # 4000 trips at most, scale-10 noise
    report = answer["report"]
    assert report["charged"] is True
    assert report["analyst"] == "alice"
    assert report["epsilon"] == 1.0  # privacy.default_epsilon
    assert report["delta"] >= 0
    assert report["blocks"] and all(b.startswith("trips/") for b in report["blocks"])
    (column,) = report["columns"]
    assert column["role"] == "aggregate"
    assert column["mechanism"] == "discrete_laplace"
    assert column["scale"] == pytest.approx(10.0)  # sensitivity k = 10 over epsilon 1


def test_query_text_with_epsilon(policy: Path) -> None:
    result = chorus("query", "--policy", str(policy), "--analyst", "bob", "--epsilon", "0.5",
                    "SELECT city, COUNT(*) AS n FROM trips GROUP BY city")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "city" in out and "SF" in out and "NYC" in out
    assert "privacy: charged epsilon=0.5" in out
    assert "discrete_laplace, scale 20" in out


def test_query_text_shows_a_quantile_with_its_note(policy: Path) -> None:
    """A quantile has no value interval (its error is in ranks): the table shows its value and
    the rank note beside it, not the note alone."""
    result = chorus("query", "--policy", str(policy), "--analyst", "alice", "--epsilon", "1",
                    "SELECT MEDIAN(fare) AS med FROM trips")
    assert result.returncode == 0, result.stderr
    row = result.stdout.splitlines()[2]
    assert re.match(r"\s*-?[\d,]+\.\d\d \(rank within ", row), row


REFUSALS = [
    pytest.param(["--analyst", "alice"], "SELECT * FROM trips", "42501", "QueryRefused",
                 "SELECT * would release raw rows", id="raw rows"),
    pytest.param(["--analyst", "alice"], "SELECT COUNT(*) FROM nope", "42P01", "UndefinedTable",
                 "unknown table 'nope'", id="unknown table"),
    pytest.param(["--analyst", "bob", "--epsilon", "0.6"], COUNT_SQL, "22023",
                 "InvalidParameter", "above the per-query maximum 0.5", id="epsilon too large"),
    pytest.param([], COUNT_SQL, "22023", "InvalidParameter", "no analyst given",
                 id="no analyst among several"),
]


def test_refused_query_text(policy: Path) -> None:
    result = chorus("query", "--policy", str(policy), "--analyst", "alice",
                    "SELECT fare FROM trips")
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines[0] == ("error: column fare in SELECT is neither aggregated nor in GROUP BY: "
                        "raw values are never released")
    assert lines[1].startswith("hint: ")


@pytest.mark.parametrize(("options", "sql", "sqlstate", "kind", "message"), REFUSALS)
def test_refused_query_json(policy: Path, options: list[str], sql: str, sqlstate: str,
                            kind: str, message: str) -> None:
    result = chorus("query", "--policy", str(policy), *options, "--json", sql)
    assert result.returncode == 2, (result.stdout, result.stderr)
    error = one_json(result.stdout)["error"]
    assert error["sqlstate"] == sqlstate
    assert error["type"] == kind
    assert message in error["message"]
    assert "hint" in error


def test_refused_explain_exits_2(policy: Path) -> None:
    result = chorus("explain", "--policy", str(policy), "--analyst", "alice", "--json",
                    "SELECT * FROM trips")
    assert result.returncode == 2
    assert one_json(result.stdout)["error"]["type"] == "QueryRefused"


# -- bad policies exit 1 -------------------------------------------------------------------------
def test_missing_policy_file_exits_1(tmp_path: Path) -> None:
    missing = tmp_path / "absent.toml"
    result = chorus("query", "--policy", str(missing), COUNT_SQL)
    assert result.returncode == 1
    assert result.stdout == ""
    assert f"error: {missing}: cannot read the policy file" in result.stderr

    result = chorus("query", "--policy", str(missing), "--json", COUNT_SQL)
    assert result.returncode == 1
    error = one_json(result.stdout)["error"]
    assert error["type"] == "PolicyError" and error["sqlstate"] == "F0000"
    assert str(missing) in error["message"]


def test_invalid_policy_exits_1(policy: Path) -> None:
    text = policy.read_text().replace("upper = 200", "uper = 200")
    policy.write_text(text)
    result = chorus("query", "--policy", str(policy), "--analyst", "alice", COUNT_SQL)
    assert result.returncode == 1
    assert f"{policy}: tables.trips.columns.fare.uper: unknown key" in result.stderr


def test_policy_disagreeing_with_the_database_exits_1(policy: Path) -> None:
    policy.write_text(policy.read_text().replace('city        = { type = "text"',
                                                 'city        = { type = "int"'))
    result = chorus("explain", "--policy", str(policy), "--json", COUNT_SQL)
    assert result.returncode == 1
    error = one_json(result.stdout)["error"]
    assert "tables.trips.columns.city.type" in error["message"]


def test_missing_database_file_exits_1(policy: Path, tmp_path: Path) -> None:
    (tmp_path / "cli.duckdb").unlink()
    result = chorus("query", "--policy", str(policy), "--analyst", "alice", COUNT_SQL)
    assert result.returncode == 1
    assert "does not exist" in result.stderr
    assert not (tmp_path / "cli.duckdb").exists()  # and was not created


def test_a_ledger_of_a_newer_version_exits_1_with_a_hint(policy: Path) -> None:
    """A ledger upgraded by a newer chorus is refused before anything is read or spent."""
    policy.write_text(policy.read_text().replace(
        "[privacy]\n", '[privacy]\nledger = "sqlite:///cli-ledger.sqlite3"\n', 1))
    first = chorus("query", "--policy", str(policy), "--analyst", "alice", COUNT_SQL)
    assert first.returncode == 0, first.stderr
    ledger = policy.parent / "cli-ledger.sqlite3"
    with contextlib.closing(sqlite3.connect(ledger)) as con, con:
        con.execute("UPDATE ledger_meta SET value = '99' WHERE key = 'schema'")
    result = chorus("query", "--policy", str(policy), "--analyst", "alice", COUNT_SQL)
    assert result.returncode == 1
    assert "has layout (schema) 99, written by a newer version of chorus" in result.stderr
    assert "hint: run the same chorus version on every proxy" in result.stderr
    assert "Traceback" not in result.stderr


# -- explain -----------------------------------------------------------------------------------
def test_explain_json_charges_nothing(policy: Path) -> None:
    result = chorus("explain", "--policy", str(policy), "--analyst", "alice", "--epsilon", "2",
                    "--json", "SELECT AVG(fare) FROM trips WHERE city = 'SF'")
    assert result.returncode == 0, result.stderr
    answer = one_json(result.stdout)
    assert answer["columns"] == [] and answer["rows"] == []
    report = answer["report"]
    assert report["charged"] is False
    assert report["epsilon"] == 2.0
    assert report["rewritten_sql"] and "trips" in report["rewritten_sql"]
    assert report["measurements"]


def test_explain_text_shows_the_rewritten_sql(policy: Path) -> None:
    result = chorus("explain", "--policy", str(policy), "--analyst", "alice", COUNT_SQL)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "would charge epsilon=1" in out
    assert "rewritten SQL:" in out
    rewritten = out.split("rewritten SQL:", 1)[1]
    assert "SELECT" in rewritten and "trips" in rewritten
    assert "m0 = COUNT(*)" in out


# -- demo --------------------------------------------------------------------------------------
DEMO_QUESTIONS = ("How many trips per city?", "Average fare and distance",
                  "Fare spread", "Busiest hours of the day", "Busiest drivers")


def _check_demo_output(out: str, policy_path: Path) -> None:
    assert f"policy written to {policy_path}" in out
    for question in DEMO_QUESTIONS:
        assert f"-- {question}" in out
    assert out.count("privacy: charged epsilon=") >= 4
    # Private choices other than the cap are shown too (DP outputs): the busiest-drivers
    # query's groups per rider, and the chosen clipping interval of the fares.
    assert "groups per rider_id (sets the key-release threshold" in out
    assert "trips.fare: [" in out
    assert "Budget left per block" in out
    assert f"Try: chorus query --policy {policy_path}" in out


def test_demo_on_duckdb(tmp_path: Path) -> None:
    directory = tmp_path / "tmp"
    result = chorus("demo", "--dir", str(directory), "--rows", "3000")
    assert result.returncode == 0, result.stderr
    assert (directory / "policy.toml").is_file()
    assert (directory / "demo.duckdb").is_file()
    _check_demo_output(result.stdout, directory / "policy.toml")
    assert "3,000 trips" in result.stderr  # progress goes to stderr
    assert 'url = "duckdb:///demo.duckdb"' in (directory / "policy.toml").read_text()

    # The written policy works from any directory (its URL is relative to the policy file).
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    query = chorus("query", "--policy", "../tmp/policy.toml", "--json", COUNT_SQL,
                   cwd=elsewhere)
    assert query.returncode == 0, query.stderr
    assert one_json(query.stdout)["report"]["charged"] is True
    assert not (elsewhere / "demo.duckdb").exists()


@pytest.fixture
def fresh_postgres_db() -> Iterator[str]:
    """A new, empty Postgres database (dropped afterwards)."""
    try:
        admin = psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3)
    except psycopg.Error:
        if os.environ.get("CHORUS_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"Postgres is required but unreachable at {PG_ADMIN_URL}")
        pytest.skip(f"Postgres unreachable at {PG_ADMIN_URL}")
    name = f"chorus_cli_{uuid.uuid4().hex[:10]}"
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{name}"
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as con:
            con.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.postgres
def test_demo_on_postgres(fresh_postgres_db: str, tmp_path: Path) -> None:
    directory = tmp_path / "pg"
    result = chorus("demo", "--dir", str(directory), "--rows", "3000", "--backend",
                    fresh_postgres_db)
    assert result.returncode == 0, result.stderr
    policy_path = directory / "policy.toml"
    assert policy_path.is_file()
    assert not (directory / "demo.duckdb").exists()
    assert f'url = "{fresh_postgres_db}"' in policy_path.read_text()
    _check_demo_output(result.stdout, policy_path)
    with psycopg.connect(fresh_postgres_db) as con:
        assert con.execute("SELECT COUNT(*) FROM trips").fetchone() == (3000,)
    query = chorus("query", "--policy", str(policy_path), "--json", COUNT_SQL)
    assert query.returncode == 0, query.stderr
    assert one_json(query.stdout)["report"]["charged"] is True


def test_demo_refuses_a_non_postgres_backend(tmp_path: Path) -> None:
    result = chorus("demo", "--dir", str(tmp_path / "d"), "--rows", "10", "--backend",
                    "mysql://localhost/x")
    assert result.returncode != 0
    assert "unsupported demo backend URL" in result.stderr
