"""The ranked copy's grouped twin (issue 23): DP / raw time of thresholded keys with groups per
rider, with and without it, side by side.  Writes the ``grouped-twin`` section of
benchmarks/RESULTS.md.

    python -m benchmarks.grouped_twin [--rows 1000000] [--repeat 7] [--postgres URL]
                                      [--database NAME] [--skip-postgres] [--skip-duckdb]

Keys released by a threshold (no public list of drivers) bound each rider to g groups: over the
whole copy, the light and middle riders read the grouped twin's stored group ranks by a plain
scan (``rewriters.grouped_copy``) instead of two windows per query.  Per backend, the demo at
``--rows`` trips and one engine on its default policy (``benchmarks.demo_data.open_engine``); per
query, a first run of each path (the choices, reused after; the twin's build, timed apart),
then ``--repeat`` rounds alternating the analyst's SQL straight to the database (raw),
``Engine.execute`` reading the twin (the default) and ``Engine.execute`` with
``samples.read_grouped_twins = False`` (before).  Medians.
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
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.demo_data import demo_engines, demo_options  # noqa: E402
from benchmarks.phases import timed  # noqa: E402
from benchmarks.results import write_section  # noqa: E402
from chorus_py.engine import Engine  # noqa: E402

QUERIES = {
    "top 10 drivers (corpus #22)":
        "SELECT driver_id, COUNT(*) AS n FROM trips GROUP BY driver_id ORDER BY n DESC LIMIT 10",
    "top 10 drivers by average fare":
        "SELECT driver_id, AVG(fare) AS a, COUNT(*) AS n FROM trips GROUP BY driver_id "
        "ORDER BY a DESC LIMIT 10",
}


def bench(engine: Engine, repeat: int) -> dict[str, tuple[float, float, float, float]]:
    """Per query: median ms of raw, DP with the grouped twin, DP without it; the twin's
    build in ms."""
    out = {}
    for label, sql in QUERIES.items():
        raw, twin, before = [], [], []
        answer = functools.partial(engine.execute, sql, remaining=False)
        engine.backend.run(sql)
        engine.samples.read_grouped_twins = False
        engine.execute(sql, remaining=False)  # the choices, reused by every later run
        engine.samples.read_grouped_twins = True
        started = time.perf_counter()
        engine.execute(sql, remaining=False)  # starts the twin's build in the background
        engine.samples.wait()
        build = (time.perf_counter() - started) * 1000
        engine.execute(sql, remaining=False)  # the twin's statement planned
        for _ in range(repeat):
            raw.append(timed(engine.backend.run, sql))
            engine.samples.read_grouped_twins = True
            twin.append(timed(answer))
            engine.samples.read_grouped_twins = False
            before.append(timed(answer))
        engine.samples.read_grouped_twins = True
        out[label] = (*(statistics.median(v) * 1000 for v in (raw, twin, before)), build)
        print(f"{label}: raw {out[label][0]:.1f} ms, twin {out[label][1]:.1f}, "
              f"before {out[label][2]:.1f}, build {build:.0f}", file=sys.stderr)
    return out


def report(results: dict[str, dict[str, tuple[float, float, float, float]]],
           args: argparse.Namespace, load: tuple[float, float], when: str) -> str:
    lines = [
        "## The ranked copy's grouped twin (issue 23): thresholded keys side by side",
        "",
        f"Written by `python -m benchmarks.grouped_twin --rows {args.rows} --repeat "
        f"{args.repeat}` on {when} UTC; {platform.machine()}, {os.cpu_count()} cores shared "
        f"with other jobs (load average {load[0]:.1f} at the start, {load[1]:.1f} at the end), "
        f"{args.rows:,} demo trips, the demo's default policy.  Medians of {args.repeat} "
        "rounds alternating raw, DP reading the grouped twin (the default) and DP without it "
        "(`samples.read_grouped_twins = False`, as before); the same reused choices.  Build: "
        "the first query's wait for the twin's build in the background (once per copy and "
        "key columns; queries meanwhile take the path without it).",
        "",
        "| backend | query | raw ms | DP ms, before | DP / raw, before | DP ms, twin | "
        "DP / raw, twin | twin / before | build ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for backend, cells in results.items():
        for label, (raw, twin, before, build) in cells.items():
            lines.append(f"| {backend} | {label}: `{QUERIES[label]}` | {raw:.1f} | "
                         f"{before:.1f} | {before / raw:.2f} | {twin:.1f} | {twin / raw:.2f} "
                         f"| {twin / before:.2f} | {build:.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=7)
    demo_options(parser, "grouped_twin_bench")
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="chorus-grouped-twin-"))
    results: dict[str, dict[str, tuple[float, float, float, float]]] = {}
    try:
        for label, engine in demo_engines(args, work):
            results[label] = bench(engine, args.repeat)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = report(results, args, (load_start, os.getloadavg()[0]),
                  f"{datetime.now(UTC):%Y-%m-%d %H:%M}")
    write_section("grouped-twin", text, args.out)
    print(text)


if __name__ == "__main__":
    main()
