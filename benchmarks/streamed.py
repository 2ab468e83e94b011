"""The heavy branch streamed (issue 23): DuckDB's filtered queries at small automatic caps with
each unit's first k rows kept as the twin is read (``rewriters.contribution.streamed_rank``)
against the window partitioned by the unit it replaces, side by side.  Writes the ``streamed``
section of benchmarks/RESULTS.md.

    python -m benchmarks.streamed [--rows 1000000] [--repeat 9]

The queries are the corpus's and the held-out set's filtered AVG / VARIANCE / STDDEV
questions (``benchmarks.corpus``), whose heavy branch reads the copy's twin.  On the demo at
``--rows`` trips with the default policy (``benchmarks.demo_data.open_engine``), per query,
after a first run (the choices, then reused by every round), ``--repeat`` rounds alternating:

- raw: the analyst's SQL sent straight to DuckDB;
- streamed: the engine's own measurement statement (proxy noise: the exact aggregates);
- window: the same statement with its heavy branch flagged as before, ``ROW_NUMBER() OVER
  (PARTITION BY rider_id ORDER BY __chorus_rank) <= k`` (DuckDB plans it as a per-unit top-k
  aggregate); the two must return the same rows, which is checked first;
- DP: ``Engine.execute`` end to end (the ledger, the noise, the finish).

Medians.  Shared, noisy machine: read the ratios.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import platform
import re
import shutil
import statistics
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.demo_data import demo_on, demo_options, open_engine  # noqa: E402
from benchmarks.phases import timed  # noqa: E402
from benchmarks.results import write_section  # noqa: E402
from chorus_py.engine import Engine  # noqa: E402

QUERIES = [
    "SELECT AVG(fare) FROM trips WHERE distance_km BETWEEN 5 AND 10",
    "SELECT city, VARIANCE(fare) FROM trips WHERE pickup_time >= '2026-03-01' GROUP BY city",
    "SELECT city, AVG(fare) AS avg_fare FROM trips WHERE distance_km > 10 GROUP BY city "
    "HAVING AVG(fare) > 20 ORDER BY avg_fare DESC LIMIT 3",
    "SELECT city, AVG(fare) FROM trips WHERE pickup_time BETWEEN '2026-01-01' AND "
    "'2026-01-31' GROUP BY city",
    "SELECT AVG(distance_km) FROM trips WHERE fare BETWEEN 10 AND 20",
    "SELECT AVG(fare) FROM trips WHERE city <> 'NYC' AND fare IS NOT NULL",
    "SELECT STDDEV(fare) FROM trips WHERE city = 'NYC'",
]

# The streamed flag as the rewriter prints it over the ``trips`` alias (group 1: the cap).
_STREAMED = re.compile(
    r"CASE WHEN trips\.__chorus_pos <= LAG\(trips\.__chorus_pos, 1, 0\) OVER \(\) THEN "
    r"ERROR\('[^']*'\) ELSE LAG\(trips\.__chorus_run, (\d+), 0\) OVER \(\) <> "
    r"trips\.__chorus_run END")
# The same flag from a window partitioned by the unit (as before the stream).
_WINDOW = r"(ROW_NUMBER() OVER (PARTITION BY trips.rider_id ORDER BY trips.__chorus_rank) <= \1)"


def statements(engine: Engine, sql: str) -> tuple[str, str] | None:
    """(the engine's measurement statement, the same with the windowed heavy branch), or None
    when the query's heavy branch is not streamed (it reads the copy, not its twin)."""
    engine.execute(sql, remaining=False)  # the choices, made once and reused
    _, prepared = engine.prepare(sql, "demo", 0.5, 1e-8)
    streamed = prepared.detail.sql
    if not _STREAMED.search(streamed):
        return None
    return streamed, _STREAMED.sub(_WINDOW, streamed)


def _same(a: list[tuple[object, ...]], b: list[tuple[object, ...]]) -> bool:
    """The same rows, sums of doubles to 1e-9 relative (added in another order)."""
    if len(a) != len(b):
        return False
    for x, y in zip(sorted(a, key=repr), sorted(b, key=repr), strict=True):
        for u, v in zip(x, y, strict=True):
            if isinstance(u, float) and isinstance(v, float):
                if not math.isclose(u, v, rel_tol=1e-9, abs_tol=1e-6):
                    return False
            elif u != v:
                return False
    return True


def bench(engine: Engine, repeat: int) -> list[tuple[str, float, float, float, float] | str]:
    """Per query: (SQL, raw, streamed, window, DP) median ms, or the SQL alone when its
    heavy branch is not streamed."""
    out: list[tuple[str, float, float, float, float] | str] = []
    run = engine.backend.run
    for sql in QUERIES:
        pair = statements(engine, sql)
        if pair is None:
            out.append(sql)
            continue
        streamed, window = pair
        if not _same(run(streamed).rows, run(window).rows):
            raise SystemExit(f"the two heavy branches measure differently: {sql}")
        times: dict[str, list[float]] = {"raw": [], "streamed": [], "window": [], "dp": []}
        for _ in range(repeat):
            times["raw"].append(timed(run, sql))
            times["streamed"].append(timed(run, streamed))
            times["window"].append(timed(run, window))
            times["dp"].append(timed(functools.partial(engine.execute, sql, remaining=False)))
        medians = {k: statistics.median(v) * 1000 for k, v in times.items()}
        out.append((sql, medians["raw"], medians["streamed"], medians["window"], medians["dp"]))
        print(f"{sql[:60]}: " + ", ".join(f"{k} {v:.1f}" for k, v in medians.items()),
              file=sys.stderr)
    return out


def report(rows: list[tuple[str, float, float, float, float] | str], args: argparse.Namespace,
           load: tuple[float, float], when: str) -> str:
    lines = [
        "## The heavy branch streamed (issue 23): DuckDB's filtered queries side by side",
        "",
        f"Written by `python -m benchmarks.streamed --rows {args.rows} --repeat {args.repeat}` "
        f"on {when} UTC; {platform.machine()}, {os.cpu_count()} cores shared with other jobs "
        f"(load average {load[0]:.1f} at the start, {load[1]:.1f} at the end), "
        f"{args.rows:,} demo trips on DuckDB, the demo's default policy.  Medians of "
        f"{args.repeat} rounds alternating raw, the engine's measurement statement (heavy "
        "branch streamed), the same statement with the heavy branch numbered by ROW_NUMBER "
        "per rider (as before; the same rows, checked), and the DP query end to end.",
        "",
        "| query | raw ms | statement, window ms | statement, streamed ms | window / streamed "
        "| DP ms | DP / raw |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if isinstance(row, str):
            lines.append(f"| `{row}` | | | | heavy branch not streamed (reads the copy) | | |")
            continue
        sql, raw, streamed, window, dp = row
        lines.append(f"| `{sql}` | {raw:.1f} | {window:.1f} | {streamed:.1f} | "
                     f"{window / streamed:.2f} | {dp:.1f} | {dp / raw:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    demo_options(parser, None)
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="chorus-streamed-"))
    try:
        engine = open_engine(demo_on("DuckDB", work, args))
        try:
            rows = bench(engine, args.repeat)
        finally:
            engine.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = report(rows, args, (load_start, os.getloadavg()[0]),
                  f"{datetime.now(UTC):%Y-%m-%d %H:%M}")
    write_section("streamed", text, args.out)
    print(text)


if __name__ == "__main__":
    main()
