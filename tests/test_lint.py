"""``chorus check`` (chorus_py.lint): the owner's lint of a policy against the data, on DuckDB and
Postgres, and its command line."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from chorus_py.engine import Engine
from chorus_py.lint import check_policy
from tests.test_cli import chorus, policy  # noqa: F401  (the CLI test's policy fixture)

POLICY = """
[backend]
url = "{url}"

[privacy]
epsilon_per_block = 10

[tables.wards]
privacy_unit = "patient"
max_rows_per_unit = 5

[tables.wards.columns]
patient = {{ type = "int" }}
ward    = {{ type = "text", public_values = {wards} }}
cost    = {{ type = "float", lower = 0, upper = {upper} }}

[analysts.alice]
"""


def _engine(scratch: Callable[..., Engine], wards: str, upper: float) -> Engine:
    create = ("CREATE TABLE wards AS SELECT CAST(p AS BIGINT) AS patient, "
              "CASE WHEN p % 3 = 0 THEN 'Emergency' WHEN p % 3 = 1 THEN 'Surgery' "
              "ELSE 'Maternity' END AS ward, CAST(p * 10 AS DOUBLE PRECISION) AS cost "
              "FROM generate_series(1, 90) AS s(p)")
    return scratch("wards", [create], POLICY.replace("{wards}", wards).replace(
        "{upper}", str(upper)))


def test_a_clean_policy_has_no_finding(scratch: Callable[..., Engine]) -> None:
    engine = _engine(scratch, '["Emergency", "Surgery", "Maternity"]', 900)
    assert check_policy(engine.policy, engine.backend) == []


def test_a_typo_in_public_values_is_an_error_naming_the_real_values(
        scratch: Callable[..., Engine]) -> None:
    engine = _engine(scratch, '["Emergncy", "Surgery", "Maternity"]', 900)
    findings = check_policy(engine.policy, engine.backend)
    errors = [f for f in findings if f.severity == "error"]
    assert len(errors) == 1 and errors[0].where == "tables.wards.columns.ward"
    assert "'Emergncy'" in errors[0].problem and "'Emergency'" in errors[0].fix
    # ... and the 30 rows of the real "Emergency" are left out of every GROUP BY: a warning.
    (missed,) = [f for f in findings if f.severity == "warning"]
    assert "30 row(s)" in missed.problem and "'Emergency'" in missed.problem


def test_bounds_that_clip_much_of_a_column_are_a_warning(scratch: Callable[..., Engine]) -> None:
    engine = _engine(scratch, '["Emergency", "Surgery", "Maternity"]', 450)
    (finding,) = check_policy(engine.policy, engine.backend)
    assert finding.where == "tables.wards.columns.cost" and "50.0% of the 90" in finding.problem


def test_the_command_exits_1_on_an_error_and_prints_json(
        policy: Path, tmp_path: Path) -> None:  # noqa: F811
    # The test data's visits.seconds has about 10% of its rows above 600: a warning, exit 0.
    warned = chorus("check", "--policy", str(policy))
    assert warned.returncode == 0, warned.stderr
    assert "warning: tables.visits.columns.seconds" in warned.stdout and "error" not in \
        warned.stdout
    typo = tmp_path / "typo.toml"
    typo.write_text(policy.read_text().replace('"SEA"]', '"SEA", "Seatle"]'))
    found = chorus("check", "--policy", str(typo), "--json")
    assert found.returncode == 1, found.stderr
    (error,) = [f for f in json.loads(found.stdout) if f["severity"] == "error"]
    assert "'Seatle'" in error["problem"]
