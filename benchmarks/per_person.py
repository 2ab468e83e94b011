"""Accuracy of per-person questions (issue 24 part 3) on the demo, against the true answers.

    python -m benchmarks.per_person [--rows 1000000] [--runs 100]

Each query is a CTE grouped by rider_id and an outer aggregate of the per-rider values.  Every
query runs --runs times at each epsilon (noise in the database, DuckDB, fresh noise each run;
the demo policy: max_rows_per_unit = 200, fare in [0, 200]).  Two truths are computed on the raw
table: the *clipped* truth (each rider's value clipped to the bounds the proxy used: what the
noise is added to; for the query without a bound of its own, the policy's bound, which clips
nothing) and the *true per-person answer* (no clipping).  The table shows the median
over runs (and groups) of |noisy - truth| / |truth| against each, so the bias of the clip and
the error of the noise can be told apart.  Writes a section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import re
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.results import write_section
from chorus_py.demo import generate_demo
from chorus_py.engine import Engine
from chorus_py.policy import load_policy

# (label, per-person query, clipped truth, unclipped truth); truths return (key, value) rows.
_PER = "SELECT rider_id, {value} AS v FROM trips {where} GROUP BY rider_id"
QUERIES = [
    ("average spend per rider, no bound in the query (policy bound [0, 200 x 200])",
     "WITH per AS (SELECT rider_id, SUM(fare) AS spend FROM trips GROUP BY rider_id) "
     "SELECT AVG(spend) FROM per",
     "SELECT 0, AVG(LEAST(v, 40000)) FROM ({per}) p", "SELECT 0, AVG(v) FROM ({per}) p",
     ("SUM(fare)", "")),
    ("average spend per rider, clipped in the query at 3000",
     "WITH per AS (SELECT rider_id, LEAST(SUM(fare), 3000) AS spend FROM trips "
     "GROUP BY rider_id) SELECT AVG(spend) FROM per",
     "SELECT 0, AVG(LEAST(v, 3000)) FROM ({per}) p", "SELECT 0, AVG(v) FROM ({per}) p",
     ("SUM(fare)", "")),
    ("average spend per rider in SF (filtered inner query)",
     "WITH per AS (SELECT rider_id, LEAST(SUM(fare), 3000) AS spend FROM trips "
     "WHERE city = 'SF' GROUP BY rider_id) SELECT AVG(spend) FROM per",
     "SELECT 0, AVG(LEAST(v, 3000)) FROM ({per}) p", "SELECT 0, AVG(v) FROM ({per}) p",
     ("SUM(fare)", "WHERE city = 'SF'")),
    ("riders with more than five trips",
     "WITH per AS (SELECT rider_id, COUNT(*) AS n FROM trips GROUP BY rider_id) "
     "SELECT COUNT(*) FROM per WHERE n > 5",
     "SELECT 0, COUNT(*) FROM ({per}) p WHERE LEAST(v, 200) > 5",
     "SELECT 0, COUNT(*) FROM ({per}) p WHERE v > 5", ("COUNT(*)", "")),
    ("histogram of trips per rider (n clipped to 30: 31 public keys)",
     "WITH per AS (SELECT rider_id, LEAST(COUNT(*), 30) AS n FROM trips GROUP BY rider_id) "
     "SELECT n, COUNT(*) FROM per GROUP BY n",
     "SELECT LEAST(v, 30), COUNT(*) FROM ({per}) p GROUP BY 1",
     "SELECT LEAST(v, 30), COUNT(*) FROM ({per}) p GROUP BY 1", ("COUNT(*)", "")),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        policy_path = generate_demo(Path(tmp), rows=args.rows)
        # A budget that lasts every run, in memory; the demo already caches no answer.
        text = policy_path.read_text().replace(
            'ledger = "sqlite:///budget.sqlite3"', 'ledger = "memory"').replace(
            "epsilon_per_block = 10.0", "epsilon_per_block = 1000000.0")
        # The demo clips automatically; the per-query choice is measured apart (below).
        auto_path = policy_path.with_name("policy-auto.toml")
        auto_path.write_text(text)
        policy_path.write_text(re.sub(r'(?m)^clipping = "auto"$', 'clipping = "fixed"', text))
        engine = Engine(load_policy(policy_path))
        try:
            lines = _measure(engine, args.runs, QUERIES)
            riders = engine.backend.run("SELECT COUNT(DISTINCT rider_id) FROM trips").rows[0][0]
        finally:
            engine.close()
        # The first query again with the demo's clipping = "auto": the policy's bound is
        # narrowed per query from noisy histograms (10% of epsilon).
        engine = Engine(load_policy(auto_path))
        try:
            label, *rest = QUERIES[0]
            lines += _measure(engine, args.runs,
                              [(label.replace(")", ', clipping = "auto")'), *rest)])
        finally:
            engine.close()
    header = (f"Written by `python -m benchmarks.per_person` on "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {args.rows:,} demo trips "
              f"({riders:,} riders), DuckDB, noise in the database, {args.runs} runs per cell; "
              "median relative error |noisy - truth| / |truth| over runs (and groups).  "
              "'clipped truth': each rider's value clipped to the bounds the proxy used; "
              "'true answer': the per-person answer without any clip.\n\n"
              "| query | epsilon | vs clipped truth | vs true answer |\n|---|---|---|---|\n")
    write_section("per-person", "## Per-person questions: accuracy on the demo\n\n" + header
                  + "\n".join(lines) + "\n")
    print("\n".join(lines))


def _measure(engine: Engine, runs: int, queries: list[tuple[str, str, str, str,
                                                            tuple[str, str]]]) -> list[str]:
    lines = []
    for label, sql, clipped_sql, true_sql, (value, where) in queries:
        per = _PER.format(value=value, where=where)
        clipped = dict(engine.backend.run(clipped_sql.format(per=per)).rows)
        true = dict(engine.backend.run(true_sql.format(per=per)).rows)
        for epsilon in (0.1, 1.0):
            to_clipped, to_true = [], []
            for _ in range(runs):
                result = engine.execute(sql, analyst=None, epsilon=epsilon, delta=1e-9)
                for row in result.rows:
                    key, noisy = (0, row[0]) if len(row) == 1 else (row[0], row[1])
                    if clipped.get(key):
                        to_clipped.append(abs(noisy - float(clipped[key])) / float(clipped[key]))
                    if true.get(key):
                        to_true.append(abs(noisy - float(true[key])) / float(true[key]))
            lines.append(f"| {label} | {epsilon:g} | {statistics.median(to_clipped):.3%} | "
                         f"{statistics.median(to_true):.3%} |")
    return lines


if __name__ == "__main__":
    main()
