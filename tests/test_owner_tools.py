"""The data owner's day (issue 21 parts 1 and 2): `chorus init` drafts a policy that loads and
answers, `chorus check` reads names, the role and the ledger, and `chorus budget reconcile`
raises blocks created under a smaller epsilon_per_block (journaled, replayed exactly)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tomllib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from budget.ledger import open_ledger, replay
from chorus_py.backends import open_backend
from chorus_py.demo import generate_demo
from chorus_py.engine import Engine
from chorus_py.lint import check_all
from chorus_py.policy import load_policy
from tests.conftest import TEST_ROWS
from tests.test_least_privilege import _as, roles  # noqa: F401  (the role fixture)

CHORUS = Path(sys.executable).parent / "chorus"


def chorus(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CHORUS), *args], capture_output=True, text=True, timeout=120,
                          check=False)


_CLINIC = [
    # 400 visits of 60 patients over 30 days; cost mostly 0..300 with a few outliers.
    "CREATE TABLE visits AS SELECT g AS visit_id, g % 60 AS patient_id, "
    "TIMESTAMP '2026-02-03 00:00:00' + (g % 30) * INTERVAL '1 day' + (g % 17) * "
    "INTERVAL '1 hour' AS visit_time, CAST(CASE WHEN g % 97 = 0 THEN 5000 ELSE g % 300 END "
    "AS DOUBLE PRECISION) AS cost, CASE g % 3 WHEN 0 THEN 'ER' WHEN 1 THEN 'ICU' ELSE "
    "'GEN' END AS ward FROM generate_series(1, 400) AS s(g)",
    "CREATE TABLE wards AS SELECT * FROM (VALUES ('ER', 1), ('ICU', 2), ('GEN', 3)) "
    "AS w(ward, floor)",
    "CREATE TABLE staff AS SELECT g AS badge, 'n' || g AS name FROM generate_series(1, 9) "
    "AS s(g)",
]


@pytest.fixture
def clinic(postgres_url: str) -> Iterator[str]:
    """A fresh Postgres database holding a small clinic's tables (not in this repository's
    demo): the kind of data a new owner brings."""
    name = f"chorus_clinic_{uuid.uuid4().hex[:8]}"
    base = postgres_url.rsplit("/", 1)[0]
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    with psycopg.connect(f"{base}/{name}", autocommit=True) as con:
        for statement in _CLINIC:
            con.execute(statement)
    yield f"{base}/{name}"
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.postgres
def test_init_drafts_a_policy_that_loads_checks_and_answers(clinic: str, tmp_path: Path) -> None:
    out = tmp_path / "policy.toml"
    drafted = chorus("init", "--from", clinic, "--out", str(out))
    assert drafted.returncode == 0, drafted.stderr
    text = out.read_text()
    policy = load_policy(out)  # the policy loader accepts the draft as written
    visits = policy.tables["visits"]
    # The unit: the identifier that repeats and is named like a person; the reason is written.
    assert visits.privacy_unit == "patient_id" and "repeats" in text
    assert visits.block is not None and visits.block.column == "visit_time"
    assert str(visits.block.start) == "2026-02-03 00:00:00" and visits.block.size == "1 day"
    assert visits.max_rows_per_unit == 7  # 400 visits / 60 patients: 6 or 7 each
    # Bounds from the 99th percentile: the outliers (5000) are clipped, not followed.
    cost = visits.columns["cost"]
    assert cost.lower == 0 and 290 <= (cost.upper or 0) < 5000
    assert "WARNING visits.cost" in drafted.stderr and "privacy decision" in drafted.stderr
    assert visits.columns["visit_id"].lower is None  # an identifier: no bounds
    # A small table without a person column is public; one with a person-like column is not.
    assert policy.tables["wards"].public and not policy.tables["staff"].public
    # Categories are offered, commented out: listing them is the owner's decision.
    assert '# ward = { type = "text", public_values = ["ICU", "ER", "GEN"] }' in text
    assert text.count("TODO") >= 5
    # The token is printed once; only its hash is in the file.
    token = drafted.stdout.strip().rsplit(" ", 1)[-1]
    assert token not in text
    assert policy.analysts["analyst"].token_digests == (
        hashlib.sha256(token.encode()).hexdigest(),)
    # The draft answers a query at once.
    with Engine(policy) as engine:
        answer = engine.execute("SELECT COUNT(*) FROM visits", epsilon=0.5)
        assert answer.report.charged
    # chorus check: connected as a superuser, the one error is the role (exit 1, for CI).
    checked = chorus("check", "--policy", str(out), "--json")
    assert checked.returncode == 1, checked.stderr
    errors = [f for f in json.loads(checked.stdout) if f["severity"] == "error"]
    assert [e["where"] for e in errors] == ["backend.url"] and "superuser" in errors[0]["problem"]


@pytest.mark.postgres
def test_check_passes_with_a_read_only_role_and_fails_when_it_can_write(
        clinic: str, tmp_path: Path, roles: Callable[..., str]) -> None:  # noqa: F811
    with psycopg.connect(clinic, autocommit=True) as admin:
        role = f"chorus_test_{uuid.uuid4().hex[:8]}"
        admin.execute(f"CREATE ROLE {role} LOGIN")
        admin.execute(f"GRANT SELECT ON visits, wards, staff TO {role}")
    try:
        out = tmp_path / "policy.toml"
        assert chorus("init", "--from", _as(clinic, role), "--out", str(out)).returncode == 0
        checked = chorus("check", "--policy", str(out))
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert "error" not in checked.stdout
        # Stored samples need the proxy's schema, which this role cannot create.
        good = out.read_text()
        out.write_text(good.replace('privacy_unit = "patient_id"', 'privacy_unit = '
                                    '"patient_id"\nbounding = "materialized"'))
        schema = chorus("check", "--policy", str(out))
        assert schema.returncode == 1
        assert f"CREATE SCHEMA chorus_private AUTHORIZATION {role}" in schema.stdout
        with psycopg.connect(clinic, autocommit=True) as admin:
            admin.execute(f"CREATE SCHEMA chorus_private AUTHORIZATION {role}")
        assert chorus("check", "--policy", str(out)).returncode == 0
        out.write_text(good)
        with psycopg.connect(clinic, autocommit=True) as admin:
            admin.execute(f"GRANT UPDATE ON visits TO {role}")
        wrote = chorus("check", "--policy", str(out))
        assert wrote.returncode == 1 and "can write the tables visits" in wrote.stdout
    finally:
        with psycopg.connect(clinic, autocommit=True) as admin:
            admin.execute(f"DROP OWNED BY {role}")
            admin.execute(f"DROP ROLE {role}")


def test_init_on_duckdb_writes_the_file_relative_to_the_policy(
        tmp_path: Path) -> None:
    # A demo of its own, not a copy of the session's file: other tests' engines write ranked
    # copies into that one (in the background) and add scratch tables to it, and a copy taken
    # mid-write drafted another policy (seen twice under load).
    data = tmp_path / "data" / "demo.duckdb"
    generate_demo(data.parent, rows=TEST_ROWS)
    out = tmp_path / "conf" / "policy.toml"
    out.parent.mkdir()
    drafted = chorus("init", "--from", f"duckdb:///{data}", "--out", str(out))
    assert drafted.returncode == 0, drafted.stderr
    assert 'url = "duckdb:///../data/demo.duckdb"' in out.read_text()
    policy = load_policy(out)
    assert policy.tables["trips"].privacy_unit == "rider_id", out.read_text()
    assert policy.tables["cities"].public
    again = chorus("init", "--from", f"duckdb:///{data}", "--out", str(out))
    assert again.returncode == 1 and "--force" in again.stderr  # never overwrites silently


_NAMES = """
[backend]
url = "{url}"

[privacy]
epsilon_per_block = {eps}
ledger = "sqlite:///ledger.sqlite3"

[tables.trips]
privacy_unit = "rider_id"
max_rows_per_unit = 10
block = {{ column = "pickup_time", size = "1 day", start = "2026-01-01", end = "2026-01-11" }}

[tables.trips.columns]
rider_id = {{ type = "int" }}
pickup_time = {{ type = "timestamp" }}
fare = {{ type = "float", lower = 0, upper = 200 }}

[analysts.alice]
token_sha256 = "{digest}"

[analysts.nobody]
"""


def _policy(path: Path, url: str, eps: float) -> Path:
    path.write_text(_NAMES.format(url=url, eps=eps, digest="ab" * 32))
    return path


def test_check_finds_unused_names_and_a_ledger_behind_the_policy(
        duckdb_data: str, tmp_path: Path) -> None:
    import shutil

    data = tmp_path / "demo.duckdb"
    shutil.copy(duckdb_data.removeprefix("duckdb:///"), data)
    path = _policy(tmp_path / "policy.toml", f"duckdb:///{data}", 3)
    with Engine.from_policy(path) as engine:  # spend on the ten blocks under epsilon 3
        engine.execute("SELECT COUNT(*) FROM trips", analyst="alice", epsilon=0.5)
    _policy(path, f"duckdb:///{data}", 10)  # the owner raises the budget
    policy = load_policy(path)
    backend = open_backend(policy.backend.url)
    ledger = open_ledger(policy.privacy, policy.source, policy.analysts)
    try:
        findings = {(f.severity, f.where): f for f in check_all(policy, backend, ledger)}
    finally:
        backend.close()
    behind = findings[("error", "privacy.epsilon_per_block")]
    assert "10 block(s)" in behind.problem and "epsilon 3" in behind.problem
    assert "reconcile" in behind.fix
    assert "driver_id" in findings[("note", "tables.trips")].problem  # undeclared columns
    assert "visits" in findings[("note", "tables")].problem  # undeclared tables
    assert ("warning", "analysts.nobody") in findings  # cannot log in anywhere
    # The reconcile command raises the ten blocks, journaled; the journal replays them exactly.
    raised = chorus("budget", "--policy", str(path), "reconcile", "--yes")
    assert raised.returncode == 0 and "raised 10 block(s)" in raised.stdout, raised.stderr
    blocks = ledger.blocks()
    assert {(b.epsilon_global, round(b.epsilon_left, 9)) for b in blocks} == {(10.0, 9.5)}
    rebuilt = replay(ledger.history())
    for b in blocks:
        r = rebuilt[b.block_id]
        assert (r.epsilon_global, r.global_, r.unlocked, r.consumed) == (
            b.epsilon_global, list(b.global_), list(b.unlocked), list(b.consumed))
    assert "block_budget_raised" in {r["event"] for r in ledger.history()}
    ledger.close()
    assert chorus("check", "--policy", str(path)).returncode == 0
    nothing = chorus("budget", "--policy", str(path), "reconcile", "--yes")
    assert "nothing to do" in nothing.stdout
    # A query may now spend the raised budget.
    with Engine.from_policy(path) as engine:
        engine.execute("SELECT COUNT(*) FROM trips", analyst="alice", epsilon=1.0)


def test_check_reports_every_missing_name_not_only_the_first(
        duckdb_data: str, tmp_path: Path) -> None:
    import shutil

    data = tmp_path / "demo.duckdb"
    shutil.copy(duckdb_data.removeprefix("duckdb:///"), data)
    path = _policy(tmp_path / "policy.toml", f"duckdb:///{data}", 3)
    path.write_text(path.read_text().replace("fare = ", "fair = ").replace(
        "[analysts.alice]", "[tables.trip]\npublic = true\n\n[analysts.alice]").replace(
        'pickup_time = { type = "timestamp" }', 'pickup_time = { type = "date" }'))
    checked = chorus("check", "--policy", str(path), "--json")
    assert checked.returncode == 1
    errors = {f["where"] for f in json.loads(checked.stdout) if f["severity"] == "error"}
    assert errors == {"tables.trips.columns.fair", "tables.trip",
                      "tables.trips.columns.pickup_time.type"}
    assert tomllib.loads(path.read_text())  # check never edits the file
