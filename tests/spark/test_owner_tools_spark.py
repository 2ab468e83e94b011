"""The owner's tools on Spark: ``chorus init --from spark://local --parquet DIR`` drafts the
same policy as from the DuckDB the Parquet files were copied from (the same statistics, read by
Spark), ``chorus check`` reads a Spark policy's data, and the one-shot ``chorus query`` and
``chorus explain`` answer and return (they close their Spark sessions before exit)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from chorus_py.backends import open_backend
from chorus_py.backends.duckdb import duckdb_path
from chorus_py.backends.spark import SparkBackend
from chorus_py.cli import main
from chorus_py.draft import draft_policy
from chorus_py.policy import SparkConfig
from tests.spark.conftest import TABLES


def _tables(text: str) -> str:
    """A draft's [tables...] sections of the tables both backends serve (its backend and
    token lines differ by design)."""
    sections = re.split(r"\n(?=\[)", text)
    return "\n".join(s for s in sections
                     if (m := re.match(r"\[tables\.(\w+)", s)) and m.group(1) in TABLES)


def test_init_from_parquet_drafts_what_duckdb_drafts_and_it_answers(
        duckdb_data: str, spark_data: Path, tmp_path: Path) -> None:
    spark = SparkBackend(SparkConfig(warehouse=str(spark_data),
                                     private_dir=str(spark_data / "private")))
    try:
        drafted = draft_policy("spark://local", spark, "spark", spark_data,
                               warehouse=spark_data)
    finally:
        spark.close()
    assert 'url = "spark://local"' in drafted.text
    assert '[backend.spark]\n# Every <name>.parquet' in drafted.text
    assert '\nwarehouse = "."\n' in drafted.text  # relative to the policy's directory
    # The DuckDB file the Parquet files were written from (a copy: another test may hold it).
    copied = tmp_path / "source.duckdb"
    shutil.copyfile(duckdb_path(duckdb_data), copied)
    duck = open_backend(f"duckdb:///{copied}")
    try:
        # Only the tables Spark serves: the unit guess reads every table of the database.
        for extra in set(duck.table_columns()) - set(TABLES):
            duck.run_owned([f"DROP TABLE {extra}"])
        reference = draft_policy(f"duckdb:///{copied}", duck, "duckdb", tmp_path)
    finally:
        duck.close()
    assert _tables(drafted.text) == _tables(reference.text) != ""
    # The draft loads, and `chorus check`, `query` and `explain` read the data through it (its
    # stores in the directory of the process's Spark: one per process).
    path = spark_data / "drafted.toml"
    path.write_text(drafted.text.replace('\nwarehouse = "."\n',
                                         '\nwarehouse = "."\nprivate_dir = "private"\n'))
    runner = CliRunner()
    checked = runner.invoke(main, ["check", "--policy", str(path)])
    assert "error:" not in checked.output, checked.output
    assert checked.exit_code == 0, checked.output
    answered = runner.invoke(main, ["query", "--policy", str(path), "--epsilon", "0.5",
                                    "SELECT COUNT(*) FROM trips"])
    assert answered.exit_code == 0, answered.output
    assert "charged epsilon=0.5" in answered.output and "noise in proxy" in answered.output
    explained = runner.invoke(main, ["explain", "--policy", str(path), "--epsilon", "0.5",
                                     "SELECT MEDIAN(fare) FROM trips"])
    assert explained.exit_code == 0, explained.output
    assert "would charge epsilon=0.5" in explained.output and "exponential" in explained.output


@pytest.mark.parametrize(("args", "message"), [
    (["--from", "spark://local"], "needs --parquet DIR"),
    (["--from", "sc://cluster:15002"], "not over Spark Connect"),
])
def test_init_says_what_spark_needs(args: list[str], message: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["init", *args, "--out", str(tmp_path / "p.toml")])
    assert result.exit_code == 1 and message in result.output, result.output
