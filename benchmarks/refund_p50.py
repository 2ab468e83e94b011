"""Per-query CPU time of ``Engine.execute`` (p50 and mean of 300 calls after 20 warm-ups) on
the test data, fixed and automatic caps, on DuckDB or Postgres.  Run it on two checkouts to
compare them (the code measured is the one on PYTHONPATH); CPU time, not wall time, as the
shared test machine's load swings wall times by 2-3x between runs.

    PYTHONPATH=$PWD python benchmarks/refund_p50.py duckdb|postgres
"""

from __future__ import annotations

import pathlib
import statistics
import sys
import tempfile
import time

import duckdb
import psycopg

from chorus_py.demo import generate_demo
from chorus_py.engine import Engine
from chorus_py.policy import load_policy
from tests.conftest import _VISITS_SQL, PG_ADMIN_URL, POLICY_TEMPLATE

QUERIES = ("SELECT COUNT(*) FROM trips",
           "SELECT city, COUNT(*), SUM(fare) FROM trips GROUP BY city")


def _data(backend: str, directory: pathlib.Path) -> str:
    if backend == "duckdb":
        generate_demo(directory, rows=4000)
        con = duckdb.connect(str(directory / "demo.duckdb"))
        for statement in _VISITS_SQL:
            con.execute(statement.replace("DOUBLE PRECISION", "DOUBLE"))
        con.close()
        return f"duckdb:///{directory}/demo.duckdb"
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + "/refund_bench"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS refund_bench WITH (FORCE)")
        admin.execute("CREATE DATABASE refund_bench")
    generate_demo(directory, backend_url=url, rows=4000)
    with psycopg.connect(url, autocommit=True) as con:
        for statement in _VISITS_SQL:
            con.execute(statement)
    return url


def main(backend: str) -> None:
    """Print the CPU time per query of each (cap mode, query)."""
    directory = pathlib.Path(tempfile.mkdtemp())
    url = _data(backend, directory)
    for contribution in ("fixed", "auto"):
        path = directory / f"policy-{contribution}.toml"
        path.write_text(POLICY_TEMPLATE.format(
            url=url, noise="sql", k=10, epsilon_per_block=1e9, max_epsilon=500,
            contribution=contribution).replace("[privacy]", '[privacy]\nledger = "memory"'))
        engine = Engine(load_policy(path))
        for sql in QUERIES:
            for _ in range(20):
                engine.execute(sql, analyst="alice", epsilon=0.1, remaining=False)
            times = []
            for _ in range(300):
                started = time.process_time()
                engine.execute(sql, analyst="alice", epsilon=0.1, remaining=False)
                times.append(time.process_time() - started)
            print(f"{backend} {contribution:5} {sql[:40]:40} CPU p50 "
                  f"{statistics.median(times) * 1000:.3f} ms, mean "
                  f"{statistics.mean(times) * 1000:.3f} ms")
        engine.close()
    if backend == "postgres":
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
            admin.execute("DROP DATABASE IF EXISTS refund_bench WITH (FORCE)")


if __name__ == "__main__":
    main(sys.argv[1])
