"""The heavy branch's row cap on DuckDB (issue 23): ``ROW_NUMBER()`` against the running count
``COUNT(*) OVER (PARTITION BY unit ORDER BY __chorus_rank ROWS BETWEEN UNBOUNDED PRECEDING AND
CURRENT ROW)`` (``rewriters.contribution.kept_rank``), side by side.  Writes the ``kept-rank``
section of benchmarks/RESULTS.md.

    python -m benchmarks.kept_rank [--rows 1000000] [--repeat 5] [--out FILE]

DuckDB 2.0.1's optimizer ``top_n_window_elimination`` plans ``ROW_NUMBER() ... <= k`` as a
per-unit top-k hash aggregate; the running count (the same numbers, so the same rows) is left
a window.  ``counted_pays`` picks the count on DuckDB at caps 4..20 over the copy.

1. Statements straight to DuckDB, the demo at ``--rows`` trips, its ranked copy and twin: per
   cap k in 1, 2, 4, 9, 20, 81, 200, #7's filtered rows (``distance_km BETWEEN 5 AND 10``,
   ``AVG(fare)``) and #27's histogram-like grouping of all rows (city, distance bin), each
   bounded by ``ranked_contribution`` over the copy and over its twin, with ROW_NUMBER and
   with the count; ``--repeat`` rounds alternating the shapes, medians.
2. End to end: the corpus's #7, #13, #20, #27 and #29 (``benchmarks.corpus``) through
   ``Engine.execute`` at the default epsilon and at 0.01, as shipped and as before
   (``counted_pays`` forced off: ROW_NUMBER everywhere; the quantile kind's ``reads_twin``
   forced off: its histograms read the copy alone), each in a fresh engine (no plan or
   template of the other shape cached), the two alternated twice; raw = the analyst's SQL
   straight to DuckDB.  Medians of each query's rounds; DP / raw.
Shared, noisy machine: the load average is in the results.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import platform
import shutil
import statistics
import sys
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from sqlglot import parse_one

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import chorus_py.kinds.quantile  # noqa: E402
import chorus_py.kinds.single  # noqa: E402
import rewriters.pipeline  # noqa: E402
from benchmarks.corpus import LOW_EPSILON  # noqa: E402
from benchmarks.demo_data import demo_on, demo_options, open_engine, ranked_copy  # noqa: E402
from benchmarks.phases import timed  # noqa: E402
from benchmarks.results import write_section  # noqa: E402
from chorus_py.backends import SCHEMA  # noqa: E402
from chorus_py.engine import Engine  # noqa: E402
from rewriters.contribution import counted_pays, ranked_contribution  # noqa: E402

CAPS = (1, 2, 4, 9, 20, 81, 200)
#: The corpus's filtered queries and quantiles still above 4x on DuckDB (benchmarks.corpus).
QUERIES = {
    7: "SELECT AVG(fare) FROM trips WHERE distance_km BETWEEN 5 AND 10",
    13: "SELECT city, VARIANCE(fare) FROM trips WHERE pickup_time >= '2026-03-01' "
        "GROUP BY city",
    20: "SELECT city, AVG(fare) AS avg_fare FROM trips WHERE distance_km > 10 GROUP BY city "
        "HAVING AVG(fare) > 20 ORDER BY avg_fare DESC LIMIT 3",
    27: "SELECT city, PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY distance_km) AS p90 "
        "FROM trips GROUP BY city",
    29: "SELECT city, PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY fare) AS median_fare, "
        "COUNT(*) FROM trips GROUP BY city",
}
#: The statements of part 1: an outer SELECT over the bounded rows ``b``, the filter.
STATEMENTS = {
    "#7 AVG, distance 5-10": ("SELECT COUNT(*), SUM(b.trip_id), AVG(b.fare) FROM ({rows}) AS b",
                              "t.distance_km BETWEEN 5 AND 10"),
    "#27-like (city, bin) counts": (
        "SELECT b.city, FLOOR(b.distance_km * 100) AS bin, COUNT(*) FROM ({rows}) AS b "
        "GROUP BY 1, 2", "NOT t.distance_km IS NULL"),
}
#: The modules that call counted_pays (imported by name): forced off for "before".
_CALLERS = (rewriters.pipeline, chorus_py.kinds.single, chorus_py.kinds.quantile)


@contextlib.contextmanager
def as_before(on: bool) -> Iterator[None]:
    """While ``on``, the shapes before: ``counted_pays`` forced to False in its callers
    (ROW_NUMBER everywhere) and the quantile kind's ``reads_twin`` too (its histograms read
    the copy alone; the one-table answers still read the twin where it pays)."""
    saved = [m.counted_pays for m in _CALLERS]
    twin = chorus_py.kinds.quantile.reads_twin
    try:
        if on:
            for m in _CALLERS:
                m.counted_pays = lambda dialect, k, twin: False
            chorus_py.kinds.quantile.reads_twin = lambda services, query, reads: False
        yield
    finally:
        for m, f in zip(_CALLERS, saved, strict=True):
            m.counted_pays = f
        chorus_py.kinds.quantile.reads_twin = twin


def statements(engine: Engine, repeat: int) -> list[tuple[str, int, str, list[float]]]:
    """Part 1: (statement, cap, source, [ms ROW_NUMBER, ms count])."""
    copy = ranked_copy(engine, "trips")
    out = []
    for label, (outer, where) in STATEMENTS.items():
        rows = parse_one(f'SELECT t.* FROM {SCHEMA}."{copy}" AS t WHERE {where}')
        for k in CAPS:
            for twin in (False, True):
                texts = [outer.format(rows=ranked_contribution(
                    rows, "t", "rider_id", k, twin, counted).sql("duckdb"))
                    for counted in (False, True)]
                results = [_rounded(engine.backend.run(t).rows) for t in texts]
                if results[0] != results[1]:
                    raise SystemExit(f"{label} k={k}: the two shapes differ")
                times: list[list[float]] = [[], []]
                for _ in range(repeat):
                    for i, text in enumerate(texts):
                        times[i].append(timed(engine.backend.run, text))
                ms = [statistics.median(t) * 1000 for t in times]
                out.append((label, k, "twin" if twin else "copy", ms))
                print(f"{label} k={k} {'twin' if twin else 'copy'}: {ms[0]:.1f} / {ms[1]:.1f}",
                      file=sys.stderr)
    return out


def _rounded(rows: list[tuple[object, ...]]) -> list[tuple[object, ...]]:
    """``rows`` sorted, floats to 9 significant digits (an AVG summed in another order)."""
    return sorted(tuple(float(f"{v:.9g}") if isinstance(v, float) else v for v in r)
                  for r in rows)


def end_to_end(policy: Path, repeat: int) -> dict[tuple[int, str], tuple[float, float, float]]:
    """Part 2: per (query, epsilon label): median ms raw, before, as shipped."""
    times: dict[tuple[int, str, str], list[float]] = {}
    epsilons: dict[str, float | None] = {"default": None, str(LOW_EPSILON): LOW_EPSILON}
    for _ in range(2):
        for mode in ("before", "shipped"):
            with as_before(mode == "before"):
                engine = open_engine(policy)
                try:
                    for number, sql in QUERIES.items():
                        for label, eps in epsilons.items():
                            kw = {} if eps is None else {"epsilon": eps}
                            answer = functools.partial(engine.execute, sql, remaining=False,
                                                       **kw)
                            answer()  # the choices, the plan, the template
                            for _ in range(repeat):
                                times.setdefault((number, label, "raw"), []).append(
                                    timed(engine.backend.run, sql))
                                times.setdefault((number, label, mode), []).append(
                                    timed(answer))
                finally:
                    engine.close()
    out = {}
    for number in QUERIES:
        for label in epsilons:
            raw, before, after = (statistics.median(times[number, label, m]) * 1000
                                  for m in ("raw", "before", "shipped"))
            out[number, label] = (raw, before, after)
            print(f"#{number} eps {label}: raw {raw:.1f}, before {before:.1f}, "
                  f"shipped {after:.1f}", file=sys.stderr)
    return out


def report(parts: list[tuple[str, int, str, list[float]]],
           e2e: dict[tuple[int, str], tuple[float, float, float]],
           args: argparse.Namespace, load: tuple[float, float], when: str) -> str:
    lines = [
        "## The heavy branch's row cap on DuckDB: ROW_NUMBER or a running count (issue 23)",
        "",
        f"Written by `python -m benchmarks.kept_rank --rows {args.rows} --repeat "
        f"{args.repeat}` on {when} UTC; {platform.machine()}, {os.cpu_count()} cores shared "
        f"with other jobs (load average {load[0]:.1f} at the start, {load[1]:.1f} at the end), "
        f"{args.rows:,} demo trips.",
        "",
        "Statements straight to DuckDB (medians of the rounds; the two shapes return the same "
        "rows, checked):",
        "",
        "| statement | k | heavy branch reads | ROW_NUMBER ms | COUNT(*) ROWS ms | "
        "ROW_NUMBER / count | shipped shape |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, k, source, (rn, ct) in parts:
        shipped = "count" if counted_pays("duckdb", k, source == "twin") else "ROW_NUMBER"
        lines.append(f"| {label} | {k} | {source} | {rn:.1f} | {ct:.1f} | {rn / ct:.2f} | "
                     f"{shipped} |")
    lines += [
        "",
        "End to end (`Engine.execute`, default policy; before = `counted_pays` and the "
        "quantile kind's `reads_twin` forced off: ROW_NUMBER everywhere, quantile histograms "
        "from the copy alone; each in fresh engines, alternated twice):",
        "",
        "| # | epsilon | raw ms | DP ms, before | DP / raw, before | DP ms, shipped | "
        "DP / raw, shipped |",
        "|---|---|---|---|---|---|---|",
    ]
    for (number, label), (raw, before, after) in e2e.items():
        lines.append(f"| {number} | {label} | {raw:.1f} | {before:.1f} | {before / raw:.2f} | "
                     f"{after:.1f} | {after / raw:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    demo_options(parser, None)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="chorus-kept-rank-"))
    try:
        policy = demo_on("DuckDB", work, args)
        engine = open_engine(policy)
        try:
            parts = statements(engine, args.repeat)
        finally:
            engine.close()
        e2e = end_to_end(policy, args.repeat)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = report(parts, e2e, args, (load_start, os.getloadavg()[0]),
                  f"{datetime.now(UTC):%Y-%m-%d %H:%M}")
    write_section("kept-rank", text, args.out)
    print(text)


if __name__ == "__main__":
    main()
