"""The demo as Parquet files for the Spark backend (``chorus demo --parquet DIR``).

Every demo table of ``DIR/demo.duckdb`` is copied to ``DIR/parquet/<table>.parquet`` (DuckDB
writes them), and ``DIR/policy-spark.toml`` is the demo policy with ``url = "spark://local"``
and ``[backend.spark] warehouse = "parquet"``: the same tables, bounds and budget, answered by a
local Spark.
"""

from __future__ import annotations

import pathlib
import re

import duckdb

from chorus_py.demo.rides import DEMO_TABLES
from chorus_py.errors import InvalidParameter

_SPARK_BACKEND = """\
[backend.spark]
# The Parquet tables: every <name>.parquet in this directory (relative to this policy file).
warehouse = "parquet"
# Where the proxy stores bounded samples (owner-only; analysts cannot name it).
private_dir = "spark-private"

"""


def export_parquet(directory: pathlib.Path) -> pathlib.Path:
    """Copy the demo tables to Parquet and write the Spark policy; return its path."""
    directory = pathlib.Path(directory).expanduser().resolve()
    db_path = directory / "demo.duckdb"
    policy = directory / "policy.toml"
    if not db_path.exists() or not policy.exists():
        raise InvalidParameter(f"no DuckDB demo in {directory} to export",
                               hint="run chorus demo --parquet without --backend")
    out = directory / "parquet"
    out.mkdir(exist_ok=True)
    con = duckdb.connect(str(db_path), read_only=True)
    try:
        for table in DEMO_TABLES:
            target = str(out / f"{table}.parquet").replace("'", "''")
            con.execute(f'COPY "{table}" TO \'{target}\' (FORMAT parquet)')
    finally:
        con.close()
    text = policy.read_text(encoding="utf-8")
    text = re.sub(r"(?m)^url = .*$", 'url = "spark://local"', text, count=1)
    # On Spark the proxy adds the noise (the policy refuses "sql" there: rewriters.dialect).
    text = re.sub(r'(?m)^noise = "sql".*$', 'noise = "proxy"          # Spark: the proxy adds '
                  "the noise (Spark's rand() is drawn again on a retried task)", text, count=1)
    text = text.replace("\n[privacy]\n", "\n" + _SPARK_BACKEND + "[privacy]\n", 1)
    spark_policy = directory / "policy-spark.toml"
    spark_policy.write_text(text, encoding="utf-8")
    return spark_policy
