"""The ranked copy's month twin (issue 23): DP / raw time of queries over one calendar month,
or part of one, with and without it, side by side.  Writes the ``month-twin`` section of
benchmarks/RESULTS.md.

    python -m benchmarks.month_twin [--rows 1000000] [--repeat 9] [--skip-postgres]

A query over one month of a quarter keeps its light units' rows by a scan of the copy, stored
in block order (the other months' row groups skipped), but its heavy branch read every heavy
row of the quarter from the twin in unit order, to keep the month's. The month twin
(``<copy>_m``, ``chorus_py.stores.samples``) holds the same rows by month, then in unit order:
the heavy branch of a query whose claimed blocks lie in one month reads that month's rows only
(``rewriters.contribution.month_ordered``). On Postgres the month twin is a partition per
month, in the twin's order and indexed so, which both branches read
(``chorus_py.stores.samples.partitioned_month_twin_statements``). Per backend, the demo at
``--rows`` trips and one engine on the demo's policy (``benchmarks.demo_data.open_engine``: the
default policy, a budget no run exhausts); per query, after a first run of each path,
``--repeat`` rounds alternating the analyst's SQL straight to the database (raw),
``Engine.execute`` reading the month twin (the default) and ``Engine.execute`` with
``samples.read_month_twins = False`` (as before). Medians; the same choices serve both paths
(reused by the identical query), so the paths differ in the answer statement only. The storage
of the copy and its twins is listed.
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

from benchmarks.demo_data import demo_engines, demo_options, ranked_copy  # noqa: E402
from benchmarks.phases import timed  # noqa: E402
from benchmarks.results import write_section  # noqa: E402
from chorus_py.backends import SCHEMA  # noqa: E402
from chorus_py.engine import Engine  # noqa: E402
from rewriters.contribution import MONTH_ORDER, UNIT_ORDER  # noqa: E402

#: Queries over one month or part of one (the corpus's #13, #17 and #8, the held-out set's
#: January AVG), then the last 7, 3 and 1 days of March.
QUERIES = {
    "#13": "SELECT city, VARIANCE(fare) FROM trips WHERE pickup_time >= '2026-03-01' "
           "GROUP BY city",
    "held-out January": "SELECT city, AVG(fare) FROM trips WHERE pickup_time BETWEEN "
                        "'2026-01-01' AND '2026-01-31' GROUP BY city",
    "#17": "SELECT CAST(pickup_time AS DATE) AS day, COUNT(*) FROM trips WHERE pickup_time >= "
           "'2026-03-01' GROUP BY 1 ORDER BY 1",
    "#8": "SELECT SUM(fare) FROM trips WHERE city = 'NYC' AND pickup_time >= '2026-02-01' AND "
          "pickup_time < '2026-03-01'",
    "14 days": "SELECT AVG(fare) FROM trips WHERE pickup_time >= '2026-03-18'",
    "7 days": "SELECT AVG(fare) FROM trips WHERE pickup_time >= '2026-03-25'",
    "3 days": "SELECT AVG(fare) FROM trips WHERE pickup_time >= '2026-03-29'",
    "1 day": "SELECT AVG(fare) FROM trips WHERE pickup_time >= '2026-03-31'",
}


def bench(engine: Engine, repeat: int) -> dict[str, tuple[float, float, float]]:
    """Per query: median ms of raw, DP with the month twin, DP without it."""
    out = {}
    samples = engine.samples
    for name, sql in QUERIES.items():
        raw, month, before = [], [], []
        answer = functools.partial(engine.execute, sql, remaining=False)
        engine.backend.run(sql)
        for read in (True, False):  # first runs: the choices, each path's statement planned
            samples.read_month_twins = read
            engine.execute(sql, remaining=False)
        for _ in range(repeat):
            raw.append(timed(engine.backend.run, sql))
            samples.read_month_twins = True
            month.append(timed(answer))
            samples.read_month_twins = False
            before.append(timed(answer))
        samples.read_month_twins = True
        out[name] = tuple(statistics.median(v) * 1000 for v in (raw, month, before))
        print(f"{name}: raw {out[name][0]:.1f} ms, month twin {out[name][1]:.1f}, "
              f"without {out[name][2]:.1f}", file=sys.stderr)
    return out


def storage(engine: Engine) -> tuple[float, float, float]:
    """MB of the trips table's ranked copy, its twin and its month twin (on Postgres with their
    indexes, the month twin's partitions summed)."""
    copy = ranked_copy(engine, "trips")
    sizes = []
    for name in (copy, copy + UNIT_ORDER, copy + MONTH_ORDER):
        if engine.dialect == "postgres":
            relation = f"'{SCHEMA}.\"{name}\"'::regclass"
            found = engine.backend.run(
                f"SELECT pg_total_relation_size({relation}) + COALESCE((SELECT "
                f"SUM(pg_total_relation_size(inhrelid)) FROM pg_inherits WHERE inhparent = "
                f"{relation}), 0)").rows[0][0]
        else:
            engine.backend.run_owned(["CHECKPOINT"])  # its blocks of 256 KiB, once written
            found = engine.backend.run(
                "SELECT COUNT(DISTINCT block_id) * 262144 FROM "
                f"pragma_storage_info('{SCHEMA}.\"{name}\"')").rows[0][0]
        sizes.append(float(found) / 1e6)
    return sizes[0], sizes[1], sizes[2]


def report(results: dict[str, dict[str, tuple[float, float, float]]],
           sizes: dict[str, tuple[float, float, float]], args: argparse.Namespace,
           load: tuple[float, float], when: str) -> str:
    lines = [
        "## The ranked copy's month twin (issue 23): queries over one month side by side",
        "",
        f"Written by `python -m benchmarks.month_twin --rows {args.rows} --repeat "
        f"{args.repeat}` on {when} UTC; {platform.machine()}, {os.cpu_count()} cores shared "
        f"with other jobs (load average {load[0]:.1f} at the start, {load[1]:.1f} at the end), "
        f"{args.rows:,} demo trips (January to March) per backend, the demo's default "
        f"policy.  Medians of {args.repeat} rounds alternating raw, DP reading the month twin "
        "where it applies (the default) and DP without it (`samples.read_month_twins = "
        "False`, as before); the same reused choices.",
        "",
        "| backend | query | SQL | raw ms | DP ms, without | DP / raw, without | DP ms, month "
        "twin | DP / raw, month twin |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, rows in results.items():
        for name, (raw, month, before) in rows.items():
            lines.append(f"| {label} | {name} | `{QUERIES[name]}` | {raw:.1f} | {before:.1f} | "
                         f"{before / raw:.2f} | {month:.1f} | {month / raw:.2f} |")
    lines += ["", "| backend | ranked copy MB | twin MB | month twin MB |", "|---|---|---|---|"]
    lines += ["| {} | {:.1f} | {:.1f} | {:.1f} |".format(label, *size)
              for label, size in sizes.items()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    demo_options(parser, "chorus_month_twin")
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="chorus-month-twin-"))
    results, sizes = {}, {}
    try:
        for label, engine in demo_engines(args, work):
            print(f"{label}:", file=sys.stderr)
            results[label] = bench(engine, args.repeat)
            sizes[label] = storage(engine)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = report(results, sizes, args, (load_start, os.getloadavg()[0]),
                  f"{datetime.now(UTC):%Y-%m-%d %H:%M}")
    write_section("month-twin", text, args.out)
    print(text)


if __name__ == "__main__":
    main()
