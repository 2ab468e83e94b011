"""The ranked copy's twin in unit order (issue 23): DP / raw time of the corpus's worst
filtered queries with and without it, side by side.  Writes the ``unit-order`` section of
benchmarks/RESULTS.md.

    python -m benchmarks.unit_order [--rows 1000000] [--repeat 7] [--postgres URL]
                                    [--database NAME] [--skip-postgres] [--skip-duckdb]

A filtered query whose cap is below most units' row counts ranks nearly every filtered row in
the heavy branch of ``rewriters.contribution.ranked_branches``: a window partitioned by the unit
and ordered by the stored rank, i.e. a sort of the filtered rows.  The copy is stored in block
order; its twin (``<copy>_u``, ``chorus_py.stores.samples``) holds the same rows by unit then
stored rank, so the window sorts rows that arrive in nearly its own order.  Per backend, the
demo at ``--rows`` trips and one engine on the demo's policy (``benchmarks.corpus.
open_engine``: the default policy, a budget no run exhausts); per query, after a first run of
each path, ``--repeat`` rounds alternating the analyst's SQL straight to the database (raw),
``Engine.execute`` reading the twin (the default) and ``Engine.execute`` with
``samples.read_twins = False`` (the copy alone, as before).  Medians; the same choices serve
both paths (reused by the identical query), so the paths differ in the answer statement only.
The storage of the copy and of its twin is listed too.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import shutil
import statistics
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.demo_data import (  # noqa: E402
    demo_on,
    demo_options,
    drop_database,
    open_engine,
    ranked_copy,
)
from benchmarks.phases import timed  # noqa: E402
from benchmarks.results import write_section  # noqa: E402
from chorus_py.backends import SCHEMA  # noqa: E402
from chorus_py.engine import Engine  # noqa: E402
from rewriters.contribution import UNIT_ORDER  # noqa: E402

#: The corpus's worst filtered queries (benchmarks.corpus, numbers 7, 13 and 20).
QUERIES = {
    7: "SELECT AVG(fare) FROM trips WHERE distance_km BETWEEN 5 AND 10",
    13: "SELECT city, VARIANCE(fare) FROM trips WHERE pickup_time >= '2026-03-01' "
        "GROUP BY city",
    20: "SELECT city, AVG(fare) AS avg_fare FROM trips WHERE distance_km > 10 GROUP BY city "
        "HAVING AVG(fare) > 20 ORDER BY avg_fare DESC LIMIT 3",
}


def bench(engine: Engine, repeat: int) -> dict[int, tuple[float, float, float]]:
    """Per query: median ms of raw, DP with the twin, DP without it."""
    out = {}
    for number, sql in QUERIES.items():
        raw, twin, copy = [], [], []
        answer = functools.partial(engine.execute, sql, remaining=False)
        engine.backend.run(sql)
        for read in (True, False):  # first runs: the choices, each path's statement planned
            engine.samples.read_twins = read
            engine.execute(sql, remaining=False)
        for _ in range(repeat):
            raw.append(timed(engine.backend.run, sql))
            engine.samples.read_twins = True
            twin.append(timed(answer))
            engine.samples.read_twins = False
            copy.append(timed(answer))
        engine.samples.read_twins = True
        out[number] = tuple(statistics.median(v) * 1000 for v in (raw, twin, copy))
        print(f"#{number}: raw {out[number][0]:.1f} ms, twin {out[number][1]:.1f}, "
              f"copy {out[number][2]:.1f}", file=sys.stderr)
    return out


def storage(engine: Engine) -> tuple[float, float]:
    """MB of the trips table's ranked copy and of its twin."""
    copy = ranked_copy(engine, "trips")
    sizes = []
    for name in (copy, copy + UNIT_ORDER):
        if engine.dialect == "postgres":
            found = engine.backend.run(
                f"SELECT pg_total_relation_size('{SCHEMA}.\"{name}\"')").rows[0][0]
        else:  # DuckDB: its blocks of 256 KiB, once written to the file
            engine.backend.run_owned(["CHECKPOINT"])
            found = engine.backend.run(
                "SELECT COUNT(DISTINCT block_id) * 262144 FROM "
                f"pragma_storage_info('{SCHEMA}.\"{name}\"')").rows[0][0]
        sizes.append(found / 1e6)
    return sizes[0], sizes[1]


def report(results: dict[str, dict[int, tuple[float, float, float]]],
           sizes: dict[str, tuple[float, float]], args: argparse.Namespace,
           load: tuple[float, float], when: str) -> str:
    lines = [
        "## The ranked copy's twin in unit order (issue 23): filtered queries side by side",
        "",
        f"Written by `python -m benchmarks.unit_order --rows {args.rows} --repeat "
        f"{args.repeat}` on {when} UTC; {platform.machine()}, {os.cpu_count()} cores shared "
        f"with other jobs (load average {load[0]:.1f} at the start, {load[1]:.1f} at the end), "
        f"{args.rows:,} demo trips, the demo's default policy.  Medians of {args.repeat} "
        "rounds alternating raw, DP reading the twin (the default) and DP reading the copy "
        "alone (`samples.read_twins = False`, as before the twin); the same reused choices.",
        "",
        "| backend | # | query | raw ms | DP ms, copy alone | DP / raw, copy alone | DP ms, "
        "twin | DP / raw, twin |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for backend, cells in results.items():
        for number, (raw, twin, copy) in cells.items():
            lines.append(f"| {backend} | {number} | `{QUERIES[number]}` | {raw:.1f} | "
                         f"{copy:.1f} | {copy / raw:.2f} | {twin:.1f} | {twin / raw:.2f} |")
    lines += ["", "| backend | ranked copy MB | twin MB |", "|---|---|---|"]
    lines += [f"| {b} | {c:.1f} | {t:.1f} |" for b, (c, t) in sizes.items()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    demo_options(parser, "unit_order_bench")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="chorus-unit-order-"))
    results: dict[str, dict[int, tuple[float, float, float]]] = {}
    sizes: dict[str, tuple[float, float]] = {}
    try:
        for label, skip in (("DuckDB", args.skip_duckdb), ("Postgres", args.skip_postgres)):
            if skip:
                continue
            policy = demo_on(label, work, args)
            engine = open_engine(policy)
            try:
                results[label] = bench(engine, args.repeat)
                sizes[label] = storage(engine)
            finally:
                engine.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if not args.skip_postgres:
            drop_database(args)
    text = report(results, sizes, args, (load_start, os.getloadavg()[0]),
                  f"{datetime.now(UTC):%Y-%m-%d %H:%M}")
    write_section("unit-order", text, args.out)
    print(text)


if __name__ == "__main__":
    main()
