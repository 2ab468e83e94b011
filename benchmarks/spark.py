"""The Spark backend on the demo trips as Parquet: DP / raw time per query, the cost of the
bounding step, and where the time goes.  Writes the ``spark`` section of benchmarks/RESULTS.md.

    python -m benchmarks.spark [--trips 10000000] [--runs 3] [--cache DIR]

1. The demo at ``--trips`` trips as Parquet (``chorus demo --parquet``: generate_demo, then
   export_parquet), made once under ``--cache`` and reused while present.
2. One local Spark (``spark://local``, every core) serving the demo's ``policy-spark.toml``
   under several policies (the budget per block raised so that the runs never exhaust it):
   the shipped default (automatic caps <= 200 and clipping bounds, per-query bounding from the
   ranked copy; the choices of an identical query are reused for 10 minutes when they were
   not dominated by noise: the first run of each query shows what choosing costs), and a
   fixed cap of 10 with the declared clipping bounds (no histogram), bounded per query from
   the ranked copy, per query without it, and from the stored sample
   (``bounding = "materialized"``).
3. Per query, ``--runs`` times, alternating: the analyst's SQL sent straight to Spark (raw),
   then for each policy the proxy end to end (``Engine.execute``) and the rewritten statement
   that proxy run sent, sent again straight to Spark.  Medians.
4. Where the time of a DP query goes, from the calls the engine makes: the selection
   histograms (their statements on Spark), the answer statement on Spark, the ledger (claim,
   consumed on grant: one SQLite transaction), and the rest: the proxy's own work (preparing
   from its caches, the noise, the finish in its scratch DuckDB, py4j).  Python CPU time of the
   proxy process is measured beside it (Spark runs in its own JVM process).

The bounding step cannot be switched off (every DP query bounds each rider's rows), so its cost
is read from the rewritten statement against the raw query, per-query bounding against the
stored sample.  ``chorus serve --workers N`` refuses a local Spark (each process would start a
Spark of its own): the throughput of several proxy processes is benchmarks/workers.py's, on
Postgres.  Shared, noisy machine: read ratios and medians; the load average is in the results.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.phases import Phases, Recorder, timed  # noqa: E402
from benchmarks.results import write_section  # noqa: E402
from benchmarks.run import E2E_QUERIES  # noqa: E402
from chorus_py.demo import generate_demo  # noqa: E402
from chorus_py.demo.parquet import export_parquet  # noqa: E402
from chorus_py.demo.people import JOIN_QUERIES  # noqa: E402
from chorus_py.engine import Engine  # noqa: E402
from chorus_py.stores.samples import ranked_copy_applies  # noqa: E402

# The engine section's queries (benchmarks/run.py), and the demo's join of trips and riders
# (the same privacy unit: elastic sensitivity, both tables bounded).
QUERIES = [*E2E_QUERIES, JOIN_QUERIES[0][1]]
DEFAULT_CACHE = Path(tempfile.gettempdir()) / "chorus-bench-spark"
READY = "READY"  # written last: a cache without it was cut short and is made again

# Each variant of the policy: (name, [(line-anchored pattern, replacement)]), each pattern
# found exactly once in the demo's policy-spark.toml (a changed policy fails loudly).
_FIXED = [(r'contribution = "auto"', 'contribution = "fixed"'),
          (r"max_rows_per_unit = 200", "max_rows_per_unit = 10"),
          (r'clipping = "auto"', 'clipping = "fixed"')]
VARIANTS: list[tuple[str, list[tuple[str, str]]]] = [
    ("the demo's: auto cap <= 200, auto clipping, per-query bounding (ranked copy)", []),
    ("fixed cap 10, per-query bounding (ranked copy)", _FIXED),
    ("fixed cap 10, per-query bounding, no ranked copy",
     [*_FIXED, (r"ranked_copy = true", "ranked_copy = false")]),
    ("fixed cap 10, materialized bounding",
     [*_FIXED, (r'bounding = "per-query"', 'bounding = "materialized"')]),
]


def demo_parquet(trips: int, cache: Path) -> Path:
    """The demo at ``trips`` trips as Parquet, made under ``cache`` unless already there;
    the directory holding policy-spark.toml and parquet/."""
    directory = cache / f"trips-{trips}"
    if (directory / READY).exists():
        print(f"reusing the demo at {directory}", file=sys.stderr)
        return directory
    started = time.perf_counter()
    generate_demo(directory, rows=trips,
                  progress=lambda message, _: print(message, file=sys.stderr))
    export_parquet(directory)
    (directory / "demo.duckdb").unlink()  # Spark reads the Parquet files only
    (directory / READY).write_text(f"made in {time.perf_counter() - started:.0f} s\n")
    return directory


def policy_variant(directory: Path, index: int, edits: list[tuple[str, str]]) -> Path:
    """The demo's Spark policy with ``edits``, its own fresh ledger and a budget per block no
    run exhausts; written next to it (its paths are relative to the policy file)."""
    text = (directory / "policy-spark.toml").read_text()
    edits = [(r"epsilon_per_block = 10\.0", "epsilon_per_block = 1e9"),
             (r'ledger = "sqlite:///budget\.sqlite3"',
              f'ledger = "sqlite:///bench-{index}.budget.sqlite3"'), *edits]
    for pattern, replacement in edits:
        text, found = re.subn(f"(?m)^{pattern}", replacement, text)
        if found != 1:
            raise SystemExit(f"policy-spark.toml: {pattern!r} found {found} times, not once")
    for stale in directory.glob(f"bench-{index}.budget.sqlite3*"):
        stale.unlink()
    path = directory / f"bench-policy-{index}.toml"
    path.write_text(text)
    return path


@dataclass
class Cell:
    """One (query, policy): the first run's phases (not in the medians), the runs' DP phases
    and the rewritten statement's direct times."""

    first: Phases
    dp: list[Phases] = field(default_factory=list)
    rewritten: list[float] = field(default_factory=list)


def median_of(values: list[float]) -> float:
    return statistics.median(values) * 1000 if values else float("nan")


def bench(engines: dict[str, Engine], recorder: Recorder, runs: int
          ) -> tuple[dict[str, list[float]], dict[tuple[str, str], Cell]]:
    """Per query: a first run everywhere (not in the medians: the shape's plans and caches,
    a stored sample, choices no earlier query made), then ``runs`` rounds of raw, and per
    policy DP then its rewritten statement straight to Spark."""
    raw: dict[str, list[float]] = {}
    cells: dict[tuple[str, str], Cell] = {}
    backend = next(iter(engines.values())).backend
    for sql in QUERIES:
        print(f"query: {sql}", file=sys.stderr)
        backend.run(sql)
        for name, engine in engines.items():
            with recorder.measure() as phases:
                engine.execute(sql, remaining=False)
            cells[(sql, name)] = Cell(phases)
        raw[sql] = []
        for round_ in range(runs):
            raw[sql].append(timed(backend.run, sql))
            for name, engine in engines.items():
                cell = cells[(sql, name)]
                with recorder.measure() as phases:
                    engine.execute(sql, remaining=False)
                cell.dp.append(phases)
                answer = [s for phase, s, _ in phases.statements if phase == "answer"]
                cell.rewritten.append(timed(engine.backend.run, answer[-1]))
            print(f"  round {round_ + 1}: raw {raw[sql][-1] * 1000:.0f} ms, DP "
                  + ", ".join(f"{cells[(sql, n)].dp[-1].total * 1000:.0f}" for n in engines),
                  file=sys.stderr)
    return raw, cells


def report(args: argparse.Namespace, names: list[str], raw: dict[str, list[float]],
           cells: dict[tuple[str, str], Cell], setup: list[str], load: tuple[float, float],
           made: str) -> str:
    e2e = ["| query | raw ms | " + " | ".join(f"DP ms, {short(n)}" for n in names)
           + " | DP / raw (default) |",
           "|---|---|" + "---|" * len(names) + "---|"]
    for sql in QUERIES:
        r = median_of(raw[sql])
        dps = [median_of([p.total for p in cells[(sql, n)].dp]) for n in names]
        e2e.append(f"| `{sql}` | {r:.0f} | " + " | ".join(f"{d:.0f}" for d in dps)
                   + f" | {dps[0] / r:.1f} |")
    bounding = ["| query | raw ms | " + " | ".join(
        f"rewritten ms, {short(n)}" for n in names) + " |",
        "|---|---|" + "---|" * len(names)]
    for sql in QUERIES:
        r = median_of(raw[sql])
        bounding.append(f"| `{sql}` | {r:.0f} | " + " | ".join(
            f"{median_of(cells[(sql, n)].rewritten):.0f} "
            f"({median_of(cells[(sql, n)].rewritten) / r:.1f}x)" for n in names) + " |")
    where = ["| policy | query | first run ms (histograms ms) | DP ms | histograms ms (n) | "
             "answer ms | other Spark ms | ledger ms | proxy rest ms | proxy CPU ms |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for n in names:
        for sql in QUERIES:
            dp, once = cells[(sql, n)].dp, cells[(sql, n)].first
            count = statistics.median(
                [sum(1 for phase, _, _ in p.statements if phase == "histogram") for p in dp])
            where.append(
                f"| {short(n)} | `{sql[:60]}{'...' if len(sql) > 60 else ''}` | "
                f"{once.total * 1000:.0f} ({once.histograms * 1000:.0f}) | "
                f"{median_of([p.total for p in dp]):.0f} | "
                f"{median_of([p.histograms for p in dp]):.0f} ({count:g}) | "
                f"{median_of([p.answer for p in dp]):.0f} | "
                f"{median_of([p.other for p in dp]):.0f} | "
                f"{median_of([p.ledger for p in dp]):.1f} | "
                f"{median_of([p.beside_statements for p in dp]):.0f} | "
                f"{median_of([p.cpu for p in dp]):.0f} |")
    legend = [f"- *{short(n)}*: {n}" for n in names]
    return "\n".join([
        "## Spark backend: DP / raw time, the bounding step, where the time goes",
        "",
        f"Written by `python -m benchmarks.spark --trips {args.trips} --runs {args.runs}` on "
        f"{made} UTC; {platform.machine()}, {os.cpu_count()} cores shared with other "
        f"engineers' jobs (load average {load[0]:.1f} at the start, {load[1]:.1f} at the end), "
        f"Python {platform.python_version()}, {args.trips:,} demo trips as Parquet "
        "(`chorus demo --parquet`), one local Spark (`spark://local`, every core, the "
        "policy's 4 shuffle partitions, Spark's default driver memory), noise added by the "
        f"proxy (the only choice on Spark); epsilon 0.5 (the demo's default) per query; "
        f"medians of {args.runs} alternating runs after a first run (shown apart). "
        "Read the ratios.",
        "",
        "Policies (the demo's `policy-spark.toml`, budget per block raised so that no run "
        "exhausts it):",
        "",
        *legend,
        "",
        *setup,
        "",
        "### End to end: the analyst's SQL straight to Spark (raw) against the proxy (DP)",
        "",
        *e2e,
        "",
        "### The bounding step: the rewritten statement sent straight to Spark",
        "",
        "The statement each DP run sent for its answer, sent again by itself (no histogram, "
        "no ledger, no proxy work): its time over the raw query's is what bounding each "
        "rider's rows (and clipping, the block restriction) costs Spark.",
        "",
        *bounding,
        "",
        "### Where the time of a DP query goes",
        "",
        "Histograms: the selection histograms' statements on Spark (automatic caps and "
        "clipping bounds; none when an identical query's choices are reused or the cap and "
        "bounds are fixed). Answer: the answer statement on Spark. Ledger: the claim "
        "(charged on grant, one SQLite transaction over the ~90 blocks read). Proxy rest: "
        "everything else (prepare from its caches, drawing the noise, the finish in its "
        "scratch DuckDB, py4j). Proxy CPU: the proxy process's CPU time over the whole query "
        "(Spark runs in its own JVM).",
        "",
        *where,
        "",
        "### Several proxy processes",
        "",
        "`chorus serve --workers N` refuses a `spark://local` policy (server/workers.py): "
        "pyspark runs one Spark per process, so each worker would start a local Spark of its "
        "own on the same cores, and the private directory that holds the stored samples and "
        "ranked copies belongs to one process (owner guide, \"When one machine is not "
        "enough\"). The throughput of `--workers 2` against 1 "
        "over the wire is therefore measured on Postgres, by `python -m benchmarks.workers` "
        "(its section, \"Several proxy processes\", in this file). What it says carries "
        "over: a proxy process's own work is a few ms per query (the proxy columns above), "
        "while Spark's statements take most of the time, so a second proxy process in front "
        "of the same cores would not answer faster; a larger Spark would.",
        "",
    ])


def short(name: str) -> str:
    return {VARIANTS[i][0]: label for i, label in enumerate(
        ["default", "fixed, ranked copy", "fixed, no ranked copy",
         "fixed, materialized"])}[name]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trips", type=int, default=10_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE,
                        help="where the demo's Parquet files are made once and reused")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "RESULTS.md")
    args = parser.parse_args()

    load_start = os.getloadavg()[0]
    directory = demo_parquet(args.trips, args.cache)
    recorder = Recorder()
    engines: dict[str, Engine] = {}
    setup = []
    for index, (name, edits) in enumerate(VARIANTS):
        started = time.perf_counter()
        engine = Engine.from_policy(policy_variant(directory, index, edits))
        opened = time.perf_counter() - started
        started = time.perf_counter()
        engine.warm_up(wait=True)  # as `chorus serve` starts: the ranked copy is built
        warm = time.perf_counter() - started
        recorder.attach(engine)
        engines[name] = engine
        print(f"{name}: open {opened:.1f} s, warm-up {warm:.1f} s", file=sys.stderr)
        setup.append(f"- {short(name)}: engine opened in {opened:.1f} s"
                     + (" (starting the local Spark)" if index == 0 else "")
                     + (f", ranked copy built in {warm:.1f} s"
                        if ranked_copy_applies(engine.policy.tables["trips"]) else ""))
    raw, cells = bench(engines, recorder, args.runs)
    setup = [f"{line}; first query {cells[(QUERIES[0], name)].first.total:.1f} s"
             + (" (building the stored sample)" if "materialized" in name else "")
             for line, name in zip(setup, engines, strict=True)]
    load = (load_start, os.getloadavg()[0])
    made = f"{datetime.now(UTC):%Y-%m-%d %H:%M}"
    text = report(args, list(engines), raw, cells, setup, load, made)
    for engine in engines.values():
        engine.close()
    write_section("spark", text, args.out)
    print(text)


if __name__ == "__main__":
    main()
