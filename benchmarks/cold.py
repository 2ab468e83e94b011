"""Cold queries (issue 23, part 2): the proxy's CPU for a query text it has never seen.

    python -m benchmarks.cold [--rows 20000] [--rounds 40] [--skip-postgres]
                              [--database chorus_cold] [--before DIR --before-python PYTHON]

Every run asks its query with a fresh alias (``COUNT(*) AS a17``), so no cache keyed by the text
applies: not the analysis, not the prepared query, not the text template of its shape (built on
a shape's second sighting, ``chorus_py.kinds.templates``).  What is timed is the proxy's own CPU
(``time.thread_time`` of the calling thread: other processes on this shared machine do not
count, a database working in another thread or process does not either) for the steps that
depend on the text:

- ``Engine.prepare``: parse, validate, analyse (binding, sqlglot qualify and type annotation,
  totality, sensitivity), plan the noise, rewrite and render every statement, run the outgoing
  verifier on each, build the report;
- for a query whose row cap and clipping bounds are chosen on the data (the demo policy's
  default), the final statement once they are chosen (``Selection.apply`` with fixed choices:
  a quarter of the limit, the upper bound halved); running the histograms is database work.

The last column, the floor, is what no never-seen query can skip with sqlglot (``floor``):
its parse, qualify and type annotation, one rendering of each statement it sends and, on
Postgres, the outgoing verifier's parse of each: a target below it is out of reach of any
rewriter built on sqlglot.

Not timed: the database's execution, the ledger's transaction, the histograms' run.  Block
windows, the ranked copy and the join keys' max frequencies are read before timing, as in a
running proxy.  Each measurement runs in its own process (this file with ``--worker``);
``--before DIR`` runs the same measurement, in alternating chunks, on another source tree (for
example ``git worktree add /tmp/before main``) with ``--before-python`` (an interpreter whose
environment has that tree's dependencies), and the table shows both side by side.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

#: name -> (kind, SQL with ``{i}`` for a fresh alias).
QUERIES = {
    "COUNT(*)": ("single", "SELECT COUNT(*) AS a{i} FROM trips"),
    "SUM(fare)": ("single", "SELECT SUM(fare) AS a{i} FROM trips"),
    "city, COUNT(*), AVG(fare)": (
        "single", "SELECT city, COUNT(*) AS a{i}, AVG(fare) FROM trips GROUP BY city"),
    "AVG(fare * 2 - 1), VARIANCE(fare) WHERE city = 'LA'": (
        "single", "SELECT AVG(fare * 2 - 1) AS a{i}, VARIANCE(fare) FROM trips "
        "WHERE city = 'LA'"),
    "trips JOIN cities (public)": (
        "join", "SELECT COUNT(*) AS a{i} FROM trips t JOIN cities c ON t.city = c.city "
        "WHERE c.population > 1000000"),
    "trips JOIN riders, grouped": (
        "join", "SELECT r.membership, COUNT(*) AS a{i}, SUM(t.fare) AS fares FROM trips t "
        "JOIN riders r ON t.rider_id = r.rider_id WHERE t.pickup_time < '2026-02-01' "
        "GROUP BY r.membership"),
}
TARGETS = {"single": 2.0, "join": 4.0}  # p50 ms (issue 23)


# -- worker: one process, one source tree -------------------------------------------------------
def _phases() -> tuple[Counter[str], Callable[[Callable[[], None]], None]]:
    """Wrap the steps of a cold prepare to time each (exclusive of the steps inside it); the
    names missing from a tree are skipped."""
    import chorus_py.engine as engine_module
    import chorus_py.kinds.join as join_module
    import chorus_py.kinds.single as single_module
    import chorus_py.statements as statements_module
    import rewriters.pipeline as pipeline_module

    spent: Counter[str] = Counter()
    stack: list[float] = []

    def timed(label: str, func: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.thread_time()
            stack.append(0.0)
            try:
                return func(*args, **kwargs)
            finally:
                elapsed = time.thread_time() - started
                inner = stack.pop()
                # "total" is the whole run; every other step without the steps it calls.
                spent[label] += elapsed if label == "total" else elapsed - inner
                if stack:
                    stack[-1] += elapsed
        return wrapper

    parse = "parse + validate (sqlglot parse, allowed shapes)"
    analyse = "analysis (binding, qualify, type annotation, totality, sensitivity)"
    answer = "rewrite + render the answer (rewriters, noise SQL or proxy's measure, sql())"
    plan = "noise plan, blocks, keys"
    places: list[tuple[Any, str, str]] = [
        (engine_module, "parse_statement", parse),
        (engine_module, "analyze_query", analyse),
        (engine_module, "analyze_per_person", analyse),
        (single_module, "one_table_sql", answer),
        (single_module, "pipeline", answer),  # proxy noise: no text template
        (pipeline_module.RewrittenQuery, "measure_sql", answer),
        (join_module, "pipeline", answer),
        (single_module.SingleTableKind, "_selection_statements",
         "rewrite + render the selection histograms"),
        (statements_module.Statements, "verify_outgoing", "outgoing verifier (parse + rules)"),
        (single_module, "aggregate_report", "report"),
        (join_module, "join_report", "report"),
        (single_module.SingleTableKind, "_noise_plan", plan),
        (single_module.SingleTableKind, "_blocks", plan),
        (join_module, "join_plan", plan),
        (join_module, "join_blocks", plan),
    ]
    for owner, name, label in places:
        if hasattr(owner, name):
            setattr(owner, name, timed(label, getattr(owner, name)))
    template = join_module.JoinTemplate.__dict__.get("build")
    if isinstance(template, classmethod):  # the join's rendering of its rewrite
        join_module.JoinTemplate.build = classmethod(timed(answer, template.__func__))
    return spent, timed("total", lambda run: run())


def worker(tree: Path, policy: Path, rounds: int, start: int, gc_mode: str = "default"
           ) -> dict[str, Any]:
    """Time ``rounds`` never-seen runs of every query on ``tree``'s engine: ms per run, and ms
    per phase summed over the runs.  ``gc_mode``: the garbage collector's settings applied
    after the warm-up, as ``chorus serve`` applies them (:func:`gc_settings`)."""
    sys.path.insert(0, str(tree))
    spent, run_total = _phases()
    from chorus_py.engine import Engine
    from chorus_py.kinds.selection import Choices
    from rewriters.selection import clipped_arguments

    engine = Engine.from_policy(policy)
    engine.warm_up(wait=True)  # the ranked copy, as `chorus serve` builds it at start
    gc_settings(gc_mode)
    fresh = itertools.count(start)

    prepares: list[float] = []  # the CPU of Engine.prepare alone, run by run

    def once(sql: str) -> None:
        started = time.thread_time()
        _, prepared = engine.prepare(sql.format(i=next(fresh)), "demo", 0.5, 1e-8)
        prepares.append((time.thread_time() - started) * 1000)
        selection = prepared.selection
        if selection is not None:
            query = selection.query
            bounds = tuple((a.key, a.lower, a.upper / 2) for a in clipped_arguments(query)) \
                if query.table_policy.auto_clipping else ()
            cap = max(1, query.table_policy.contribution_bound // 4)
            selection.apply(Choices(cap=cap, bounds=bounds, groups=None))

    for _, sql in QUERIES.values():  # block windows, max frequencies, constants: read once
        once(sql)
    times: dict[str, list[float]] = {}
    prepare_times: dict[str, list[float]] = {}
    phases: dict[str, dict[str, float]] = {}
    for name, (_, sql) in QUERIES.items():
        prepares.clear()
        runs = []
        per_run: list[Counter[str]] = []
        for _ in range(rounds):
            spent.clear()
            started = time.thread_time()
            run_total(lambda sql=sql: once(sql))
            runs.append((time.thread_time() - started) * 1000)
            per_run.append(Counter(spent))
        times[name] = runs
        prepare_times[name] = list(prepares)
        # Medians per phase: a garbage collection in one run would swell a mean.
        phases[name] = {label: statistics.median(r[label] for r in per_run) * 1000
                        for label in set().union(*per_run)}
    floors = {name: floor(engine, sql.format(i=next(fresh))) for name, (_, sql) in QUERIES.items()}
    engine.close()
    return {"times": times, "prepare": prepare_times, "phases": phases, "floor": floors}


def floor(engine: Any, sql: str, repeat: int = 30) -> float:
    """ms of the steps no never-seen query can skip, with sqlglot: parsing ``sql``, qualifying
    and type-annotating it (the analysis needs both), rendering each statement it sends (its
    choices' cells, then its final statement at fixed choices) from its tree, and, on
    Postgres, the outgoing verifier's parse of each (on DuckDB the statements sent do not
    carry the query's alias, whose verdict is then kept).  Medians of each step."""
    import sqlglot
    from sqlglot.optimizer.annotate_types import annotate_types
    from sqlglot.optimizer.qualify import qualify
    from sqlglot.schema import MappingSchema

    from analyses.query import SQL_TYPES
    from chorus_py.kinds.selection import Choices
    from rewriters.selection import clipped_arguments

    dialect = engine.dialect
    _, prepared = engine.prepare(sql, "demo", 0.5, 1e-8)
    sent = [prepared.detail.sql]
    selection = prepared.selection
    if selection is not None:
        query = selection.query
        bounds = tuple((a.key, a.lower, a.upper / 2) for a in clipped_arguments(query)) \
            if query.table_policy.auto_clipping else ()
        final = selection.apply(Choices(cap=max(1, query.table_policy.contribution_bound // 4),
                                        bounds=bounds, groups=None))
        sent = [*(text for _, _, text in selection.histograms), final.detail.sql]
    # The private tables' declared columns, the public ones' as the database has them.
    columns = {t: {c: SQL_TYPES[col.type] for c, col in tp.columns.items()}
               for t, tp in engine.policy.tables.items() if tp.columns}
    columns.update({t: dict(found) for t, found in engine.public_columns.items()})
    schema = MappingSchema(columns, dialect=dialect)

    def median_ms(step: Callable[[], object]) -> float:
        runs = []
        for _ in range(repeat):
            started = time.thread_time()
            step()
            runs.append(time.thread_time() - started)
        return statistics.median(runs) * 1000

    trees = [sqlglot.parse_one(text, dialect=dialect) for text in sent]
    total = median_ms(lambda: annotate_types(qualify(
        sqlglot.parse_one(sql, dialect=dialect), schema=schema, dialect=dialect),
        schema=schema, dialect=dialect))
    total += sum(median_ms(lambda t=t: t.sql(dialect)) for t in trees)
    if dialect == "postgres":
        total += sum(median_ms(lambda x=x: sqlglot.parse_one(x, dialect=dialect)) for x in sent)
    return total


def gc_settings(mode: str) -> None:
    """Apply the garbage collector's settings ``mode`` names (``default``: CPython's, or
    ``freeze``, ``gen0=N``, ``freeze+gen0=N``) with the function ``chorus serve`` calls."""
    from server.heap import settle_heap

    settle_heap(mode)


#: How to read the --gc-variants tables (written under them).
GC_READING = [
    "Variants: `default` is CPython's collector (thresholds 700/10/10), `freeze` is "
    "`gc.collect()` then `gc.freeze()` after the engine's warm-up, `gen0=N` the young "
    "generation's threshold; `server.heap.settle_heap` applies them, as `chorus serve` does.",
    "",
    "Reading (2026-12-04, 120 runs a query and variant; the geometric means over the 12 rows "
    "of the ratio to `default`, p50 / p95): freeze 0.995 / 0.956; gen0=10000 0.927 / 0.921; "
    "freeze+gen0=5000 0.944 / 0.881; freeze+gen0=10000 0.930 / 0.963; freeze+gen0=20000 "
    "0.905 / 1.080; freeze+gen0=50000 0.891 / 1.092 (its p95 up to 2.2 times `default`'s).  "
    "A larger young generation takes 5-11% off the median (fewer collections, and fewer of "
    "the middle and oldest generations, which CPython counts in young ones) but each young "
    "collection walks more objects: past 10,000 the p95 grows.  The freeze changes the median "
    "little in these short processes (a few hundred queries, small caches) and takes away the "
    "full collections' outliers (`default`'s 84 ms p95 on the filtered AVG/VARIANCE on "
    "Postgres); in a long-running server, whose caches grow, a full collection walks "
    "everything not frozen (section \"The garbage collector of `chorus serve`\").  "
    "Shipped: freeze+gen0=10000, the largest threshold whose p95 does not grow here (5,000 "
    "and 10,000 are within each other's noise).",
]

#: How to read the tables (written under them).
READING = [
    "Already in main before this round: compiled sqlglot (`sqlglot[c]`), no "
    "argument-repeating GREATEST/LEAST on DuckDB, fewer copies of the one-table rewrite, no "
    "text-template build inside a query's first run, a verifier that walks with a stack, "
    "one sqlglot schema per set of tables, one full verification per statement shape (the "
    "final statement of an automatic cap passes by its literal shape), no parser positions "
    "in the analysed trees and templates, builders that place fresh trees without copying.",
    "",
    "What this round compared (2026-12-05, third round; \"session start\" is 9a0425d): "
    "`SELECT *` and the joins of the key grid and of the public-keys finish built by "
    "constructors (`analyses.trees.select_star`, `join_to`) instead of parsed from `'*'`, "
    "`'left'` and `'cross'` by sqlglot's parser; the routing between the quantile, mixed and "
    "ordinary kinds skips its parse for a text that holds none of the words of a quantile, "
    "MEDIAN, MIN or MAX function (`analyses.quantiles.may_ask_quantiles`).",
    "",
    "Reading (two runs, 2026-12-05 14:40-14:50, on a machine 1.5-3 times faster than the "
    "earlier rounds': compare the session start's columns).  DuckDB: the grouped AVG 3.04 -> "
    "2.67 ms p50 (-12%), the riders join 3.03 -> 2.72, the filtered AVG/VARIANCE 5.91 -> 5.71, "
    "COUNT(*) and SUM(fare) within noise (their texts hold no join, and the routing parse of "
    "a small text is cheap).  Postgres: the grouped AVG 6.41 -> 6.14, the public join 3.68 -> "
    "3.43, the rest within noise.  Met at p50 on this machine: COUNT(*), SUM(fare) and both "
    "joins on DuckDB; COUNT(*) and the public join on Postgres.  Not met: the grouped AVG "
    "(DuckDB 2.67, floor 0.65), the filtered AVG/VARIANCE (DuckDB 5.7, floor 1.7; Postgres 15, "
    "floor 6.0), Postgres's SUM (3.3, floor 1.1), grouped AVG (6.1, floor 1.9) and riders join "
    "(5.3 against 4, floor 1.6).  py-spy (sampling) over a loop of never-seen grouped AVGs "
    "with the collector off: rendering 15% of the CPU, the analysis (qualify, type annotation, "
    "reading) 28%, the rewriters' trees a quarter, the report 6%, no step above 10% alone; the "
    "cyclic collector adds 10-14% under `chorus serve`'s settings (freeze, young generation "
    "every 10,000), 28% under CPython's.  The third run (15:35) also has the choices' "
    "cells in two halves on Postgres (section \"The choices' cells statement\"): the "
    "filtered AVG/VARIANCE renders and verifies two statements instead of one there, 15.1 -> "
    "16.1 ms p50 (its floor 6.0 -> 8.0), for 100-200 ms less of the database's time on 1M "
    "trips.",
    "",
]


# -- driver ---------------------------------------------------------------------------------------
def _run_worker(python: str, tree: Path, policy: Path, rounds: int, start: int,
                gc_mode: str) -> dict[str, Any]:
    out = subprocess.run(
        [python, str(Path(__file__).resolve()), "--worker", "--tree", str(tree),
         "--policy", str(policy), "--rounds", str(rounds), "--start", str(start),
         "--gc", gc_mode],
        check=True, capture_output=True, text=True, cwd=tree)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(variants: dict[str, tuple[str, Path, str]], policy: Path, rounds: int,
            chunks: int) -> dict[str, dict[str, Any]]:
    """Every variant's times and phases (the mean of the chunks' medians), measured in
    ``chunks`` alternating processes."""
    found: dict[str, dict[str, Any]] = {
        label: {"times": {n: [] for n in QUERIES}, "prepare": {n: [] for n in QUERIES},
                "phases": {n: Counter() for n in QUERIES}, "floor": {n: [] for n in QUERIES}}
        for label in variants}
    start = 0
    for _ in range(chunks):
        for label, (python, tree, gc_mode) in variants.items():
            start += 10**6  # aliases never repeat, across processes too
            part = _run_worker(python, tree, policy, max(1, rounds // chunks), start, gc_mode)
            for name in QUERIES:
                found[label]["times"][name] += part["times"][name]
                found[label]["prepare"][name] += part["prepare"][name]
                found[label]["floor"][name].append(part["floor"][name])
                found[label]["phases"][name].update(
                    {k: v / chunks for k, v in part["phases"][name].items()})
    return found


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def tables(backend: str, found: dict[str, dict[str, Any]], phases: bool = True) -> list[str]:
    """The side-by-side table of one backend, then (``phases``) each variant's phases."""
    labels = list(found)
    head = "| query | target p50 | " + " | ".join(
        f"{label} p50 | {label} p95 | {label} prepare alone p50" for label in labels) \
        + f" | floor ({labels[-1]}) |"
    lines = [f"#### {backend}", "", head,
             "|---|---:|" + "---:|---:|---:|" * len(labels) + "---:|"]
    for name, (kind, _) in QUERIES.items():
        cells = []
        for label in labels:
            runs = found[label]["times"][name]
            cells += [f"{statistics.median(runs):.2f}", f"{_pct(runs, 0.95):.2f}",
                      f"{statistics.median(found[label]['prepare'][name]):.2f}"]
        cells.append(f"{statistics.median(found[labels[-1]]['floor'][name]):.2f}")
        lines.append(f"| {name} | {TARGETS[kind]:.0f} | " + " | ".join(cells) + " |")
    for label in labels if phases else ():
        lines += ["", *_phase_table(label, found[label]["phases"])]
    return lines


def _phase_table(label: str, phases: dict[str, Counter[str]]) -> list[str]:
    """Where the time of ``label``'s runs goes, step by step."""
    names = sorted({p for per in phases.values() for p in per if p != "total"},
                   key=lambda p: -sum(per.get(p, 0.0) for per in phases.values()))
    lines = [f"Where the time goes ({label}; ms per run, the median of each step without the "
             "steps it calls, so the rows add up to about the p50):", "",
             "| phase | " + " | ".join(QUERIES) + " |", "|---|" + "---:|" * len(QUERIES)]
    for phase in names:
        lines.append(f"| {phase} | " + " | ".join(
            f"{phases[q].get(phase, 0.0):.2f}" for q in QUERIES) + " |")
    rest = [phases[q].get("total", 0.0) - sum(v for k, v in phases[q].items() if k != "total")
            for q in QUERIES]
    lines.append("| other (kind dispatch, caches, selection set-up) | "
                 + " | ".join(f"{r:.2f}" for r in rest) + " |")
    lines.append("| **total** | " + " | ".join(
        f"**{phases[q].get('total', 0.0):.2f}**" for q in QUERIES) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--chunks", type=int, default=4,
                        help="alternating processes per variant (shared-machine noise)")
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--database", default="chorus_cold",
                        help="the Postgres database of the demo, created next to --postgres")
    parser.add_argument("--skip-postgres", action="store_true")
    parser.add_argument("--before", type=Path, help="another source tree, measured alongside")
    parser.add_argument("--before-python", default=sys.executable)
    parser.add_argument("--before-label", default="before")
    parser.add_argument("--gc-variants", default="",
                        help="comma-separated garbage-collector settings measured on this "
                        "tree side by side (default, freeze, gen0=N, freeze+gen0=N; "
                        "server.heap), instead of --before; writes the cold-gc section")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "RESULTS.md")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tree", type=Path, default=ROOT, help=argparse.SUPPRESS)
    parser.add_argument("--policy", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--gc", default="default", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.tree, args.policy, args.rounds, args.start, args.gc)))
        return

    sys.path.insert(0, str(ROOT))
    import psycopg

    from benchmarks.results import write_section
    from chorus_py.demo import generate_demo

    work = Path(tempfile.mkdtemp(prefix="chorus-cold-"))
    policies = {"DuckDB": generate_demo(work / "duckdb", rows=args.rows)}
    if not args.skip_postgres:
        base = args.postgres.rsplit("/", 1)[0]
        with psycopg.connect(args.postgres, autocommit=True) as con:
            name = psycopg.sql.Identifier(args.database)
            con.execute(psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
            con.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(name))
        policies["Postgres"] = generate_demo(work / "pg", backend_url=f"{base}/{args.database}",
                                             rows=args.rows)
    variants: dict[str, tuple[str, Path, str]] = {}
    if args.gc_variants:
        variants = {mode: (sys.executable, ROOT, mode) for mode in args.gc_variants.split(",")}
    else:
        if args.before is not None:
            variants[args.before_label] = (args.before_python, args.before.resolve(),
                                           "default")
        variants["this tree"] = (sys.executable, ROOT, "default")
    lines: list[str] = []
    for backend, policy in policies.items():
        print(f"cold queries on {backend}", file=sys.stderr)
        found = measure(variants, policy, args.rounds, args.chunks)
        lines += [*tables(backend, found, phases=not args.gc_variants), ""]
    title = "## Cold queries: proxy CPU of a never-seen query text (issue 23, part 2)"
    if args.gc_variants:
        title = "## Cold queries under the garbage collector's settings (issue 23, gc.freeze)"
    command = "python -m benchmarks.cold" + (f" --gc-variants {args.gc_variants}"
                                             if args.gc_variants else "")
    text = "\n".join([
        title,
        "",
        f"`{command}` "
        f"on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC (load average at the end "
        f"{os.getloadavg()[0]:.2f}, 2 CPUs shared with other work); "
        f"{platform.machine()}, Python {platform.python_version()}, {args.rows:,} demo trips, "
        f"the demo policy (automatic caps and clipping bounds), {args.rounds} runs per query "
        f"in {args.chunks} alternating processes per variant.  Milliseconds of the proxy "
        "thread's CPU for `Engine.prepare` of a text never seen before (a fresh alias each "
        "run) plus, when the cap and bounds are chosen on the data, the final statement once "
        "chosen; no database or ledger time (the module docstring says exactly what).",
        "",
        *lines,
        *(GC_READING if args.gc_variants else READING),
    ])
    write_section("cold-gc" if args.gc_variants else "cold", text, args.out)
    print(text)


if __name__ == "__main__":
    main()
