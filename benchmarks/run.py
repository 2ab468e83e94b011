"""Benchmarks of the engine; writes benchmarks/RESULTS.md.

    python benchmarks/run.py [--rows 1000000] [--repeat 7] [--postgres URL] [--skip-postgres]
                             [--database NAME] [--variants TEXT] [--skip-latency] [--out FILE]

1. Analyse + rewrite latency (steps 1-5 and 7, no database work: block windows are cached) over a
   fixed set of single-table queries, cold (analysis cache cleared) and warm (cached by SQL text).
2. End-to-end DP query time over raw query time on the demo data, DuckDB and Postgres, measured
   side by side in one run (raw and DP alternate), medians over --repeat runs.

Machines here are shared and noisy: read ratios and medians, not absolute times.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.demo_data import RawQueries  # noqa: E402
from benchmarks.results import write_section  # noqa: E402
from chorus_py.demo import generate_demo  # noqa: E402
from chorus_py.engine import Engine  # noqa: E402

QUERIES = [
    "SELECT COUNT(*) FROM trips",
    "SELECT SUM(fare) FROM trips",
    "SELECT city, COUNT(*), AVG(fare) FROM trips GROUP BY city",
    "SELECT COUNT(DISTINCT rider_id) FROM trips WHERE distance_km > 20",
    "SELECT city, STDDEV(distance_km) FROM trips WHERE city IN ('SF', 'NYC') GROUP BY city",
    "SELECT COUNT(*) FROM trips WHERE pickup_time >= '2026-03-01' AND fare > 30",
    "WITH long AS (SELECT * FROM trips WHERE distance_km > 10) "
    "SELECT city, SUM(fare) / COUNT(*) AS per_trip FROM long GROUP BY city",
    "SELECT city, COUNT(*) AS n FROM trips GROUP BY city HAVING COUNT(*) > 1000 "
    "ORDER BY n DESC LIMIT 3",
    "SELECT EXTRACT(hour FROM pickup_time) AS h, COUNT(*) FROM trips GROUP BY 1",
    "SELECT AVG(fare * 2 - 1), VARIANCE(fare) FROM trips WHERE city = 'LA'",
]

# Queries for the end-to-end ratio (the raw query is the same SQL sent straight to the database).
E2E_QUERIES = [*QUERIES[:4], QUERIES[5],
               # A filtered SUM: its private choices cannot read the ranked copy's stored row
               # counts (issue 23: the one-statement histograms' window path).
               "SELECT city, SUM(fare) FROM trips WHERE fare > 30 GROUP BY city"]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def analyse_and_rewrite(engine: Engine, sql: str) -> None:
    """Steps 1-5 and 7 only: parse, validate, analyse, plan noise, rewrite (no ledger, no I/O)."""
    engine.prepare(sql, "demo", 0.5, 1e-8)


def bench_latency(engine: Engine, rounds: int) -> list[str]:
    cold: list[float] = []
    warm: list[float] = []
    for sql in QUERIES:  # warm the block-window cache and check every query is accepted
        analyse_and_rewrite(engine, sql)
    for _ in range(rounds):
        for sql in QUERIES:
            engine._analyses.clear()
            engine.single._prepared.clear()
            engine.join._prepared.clear()
            start = time.perf_counter()
            analyse_and_rewrite(engine, sql)
            cold.append((time.perf_counter() - start) * 1000)
            start = time.perf_counter()
            analyse_and_rewrite(engine, sql)
            warm.append((time.perf_counter() - start) * 1000)
    return [
        "| analysis cache | p50 ms | p95 ms | target p50 |",
        "|---|---|---|---|",
        f"| cold (parse, qualify, analyse, plan, rewrite) | {percentile(cold, .5):.3f} | "
        f"{percentile(cold, .95):.3f} | |",
        "| warm (analysis, plan and rewrite cached by SQL, epsilon, delta, blocks) | "
        f"{percentile(warm, .5):.3f} | "
        f"{percentile(warm, .95):.3f} | <= 0.5 |",
    ]


def bench_end_to_end(engine: Engine, label: str, repeat: int) -> tuple[list[str], list[float]]:
    rows = []
    ratios = []
    with contextlib.closing(RawQueries(engine)) as queries:
        for sql in E2E_QUERIES:
            engine.execute(sql, epsilon=0.01, delta=1e-9)  # warm caches and the buffer pool
            queries.run(sql)
            raw: list[float] = []
            dp: list[float] = []
            for _ in range(repeat):
                start = time.perf_counter()
                queries.run(sql)
                raw.append(time.perf_counter() - start)
                start = time.perf_counter()
                engine.execute(sql, epsilon=0.01, delta=1e-9)
                dp.append(time.perf_counter() - start)
            r, d = statistics.median(raw) * 1000, statistics.median(dp) * 1000
            ratios.append(d / r)
            rows.append(f"| {label} | `{sql}` | {r:.1f} | {d:.1f} | {d / r:.2f} |")
    return rows, ratios


def policy_variants(demo_policy: str) -> dict[str, str]:
    """The demo's policy text under the variants this benchmark compares (name -> text), its
    budget per block raised so that no run exhausts it.

    The same data under three policies: a fixed cap of 10 trips per rider bounded per query
    or from the stored sample, and the shipped default (automatic caps <= 200 and clipping
    bounds, which runs histogram queries first and keeps far more rows)."""
    text = demo_policy.replace("epsilon_per_block = 10.0", "epsilon_per_block = 1e9")
    # Fixed: the cap and the declared clipping bounds (no histogram query before the answer).
    fixed = text.replace('contribution = "auto"', 'contribution = "fixed"').replace(
        "max_rows_per_unit = 200", "max_rows_per_unit = 10").replace(
        'clipping = "auto"', 'clipping = "fixed"')
    return {
        "fixed cap 10, per-query bounding": fixed,
        "fixed cap 10, materialized bounding": fixed.replace(
            'bounding = "per-query"', 'bounding = "materialized"'),
        # (The demo's policy spells out the default, ranked_copy = true.)
        "automatic cap <= 200, per-query bounding, no ranked copy": text.replace(
            "ranked_copy = true", "ranked_copy = false"),
        "automatic cap <= 200, per-query bounding (default)": text,
        # Every run chooses again (at epsilon 0.01 a noise-dominated choice is never
        # reused anyway, so with reuse on the timings mix runs with and without choices).
        "automatic cap <= 200, per-query bounding (default, choices not reused)":
            text.replace("choice_reuse_seconds = 600", "choice_reuse_seconds = 0"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test",
                        help="an admin URL; a database chorus_bench is (re)created next to it")
    parser.add_argument("--skip-postgres", action="store_true")
    parser.add_argument("--database", default="chorus_bench",
                        help="the Postgres database (re)created for the run (another name lets "
                             "two runs share a server)")
    parser.add_argument("--variants", default="",
                        help="run only the policies whose name contains this text (e.g. "
                             "'(default)'); a subset run writes its table to --out as usual")
    parser.add_argument("--skip-latency", action="store_true",
                        help="skip the analyse + rewrite latency rounds")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "RESULTS.md")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="chorus-bench-"))
    print(f"generating {args.rows:,} demo trips in {work}", file=sys.stderr)
    policies = {"DuckDB": generate_demo(work / "duckdb", rows=args.rows)}
    if not args.skip_postgres:
        base = args.postgres.rsplit("/", 1)[0]
        with psycopg.connect(args.postgres, autocommit=True) as con:
            con.execute(f"DROP DATABASE IF EXISTS {args.database} WITH (FORCE)")
            con.execute(f"CREATE DATABASE {args.database}")
        policies["Postgres"] = generate_demo(work / "pg", backend_url=f"{base}/{args.database}",
                                             rows=args.rows)
    engines = {}
    for label, path in policies.items():
        variants = policy_variants(path.read_text())
        for name, content in variants.items():
            if args.variants not in name:
                continue
            variant = path.with_name(f"policy-{len(engines)}.toml")
            variant.write_text(content)
            engines[f"{label}, {name}"] = engine = Engine.from_policy(variant)
            started = time.perf_counter()
            engine.warm_up(wait=True)  # as `chorus serve` starts: the ranked copy is built
            print(f"{label}, {name}: warm-up {time.perf_counter() - started:.1f} s",
                  file=sys.stderr)

    print("analyse + rewrite latency", file=sys.stderr)
    latency = [] if args.skip_latency else bench_latency(next(iter(engines.values())), rounds=30)
    e2e: list[str] = []
    summary = []
    for label, engine in engines.items():
        print(f"end to end on {label}", file=sys.stderr)
        rows, ratios = bench_end_to_end(engine, label, args.repeat)
        e2e += rows
        # Issue 23's targets: materialized bounding <= 1.15x; the default median <= 2x and
        # every query <= 4x.
        target = ("median <= 1.15" if "materialized" in label
                  else "median <= 2, max <= 4" if "(default" in label else "none")
        summary.append(f"- {label}: median DP/raw ratio {statistics.median(ratios):.2f} "
                       f"(min {min(ratios):.2f}, max {max(ratios):.2f}; target: {target})")

    text = "\n".join([
        "## Engine: analyse + rewrite latency and DP/raw query time",
        "",
        f"Written by `python benchmarks/run.py` on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; "
        f"{platform.machine()}, Python {platform.python_version()}, {args.rows:,} demo trips, "
        f"medians of {args.repeat} alternating runs. Shared, noisy machine: read the ratios.",
        "",
        "### Analyse + rewrite latency (single-table queries, no database work)",
        "",
        *latency,
        "",
        f"Over {len(QUERIES)} queries x 30 rounds (DuckDB dialect).",
        "",
        "### End-to-end DP query time over raw query time",
        "",
        "Raw: the analyst's SQL sent straight to the database. DP: `Engine.execute` (analysis "
        "cached, noise drawn in the database, budget charged).",
        "",
        "| backend | query | raw ms | DP ms | DP / raw |",
        "|---|---|---|---|---|",
        *e2e,
        "",
        *summary,
        "",
        ('Reading the ratios: DuckDB answers a raw `COUNT(*)` from metadata in under a '
         'millisecond, while every DP query must scan (block restriction, contribution '
         'bounding, clipping) and commit a durable ledger transaction charging every block it '
         'reads (SQLite with synchronous = FULL, a few ms). Per-query bounding reads the '
         'ranked copy by default (`ranked_copy`, chorus_py.stores.samples): units with at most '
         'k rows pass by a plain scan and only heavier units are ranked, so a COUNT at the '
         'automatic cap needs no sort; "no ranked copy" ranks every filtered row per query, as '
         'before. Automatic caps and clipping bounds add one statement before the answer '
         '(rewriters.selection.choice_histogram): a plain scan of the ranked copy\'s stored row '
         'counts when the query filters nothing but its blocks, else one windowed pass over the '
         'filtered rows; a COUNT\'s cap alone over filtered rows is a GROUP BY unit. '
         '"choices not reused" sets choice_reuse_seconds = 0, so every run makes its choices.'),
        "",
    ])
    write_section("engine", text, args.out)
    print(text)


if __name__ == "__main__":
    main()
