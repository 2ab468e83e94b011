"""The garbage collector's settings of ``chorus serve`` (issue 23, ``server.heap``), through the
real server: CPython's collector against the frozen start and larger young generation.

    python -m benchmarks.gc_serve [--rows 20000] [--rounds 6] [--cold 8] [--seconds 4]
                                  [--clients 8]

Loads the demo trips into a scratch Postgres database and starts three ``chorus serve``
processes on it, with the demo policy (automatic caps and bounds, a budget that lasts): one with
``CHORUS_GC=default`` (CPython's settings), one with ``CHORUS_GC=freeze`` (the start frozen),
one as shipped (frozen, and a larger young generation).  Then, in rounds that
rotate the servers' order (a shared machine's speed drifts):

- cold: one client (asyncpg) asks each query of benchmarks/cold.py ``--cold`` times, every
  time with a fresh alias (a text the server has never seen, so no cache keyed by it applies);
  wall-clock ms per query seen by the client (the database's work included: the histograms
  that choose the cap and bounds), and the server process's CPU per query;
- warm: ``--clients`` clients run the small aggregates of benchmarks/pgwire.py (cached shapes)
  for ``--seconds``; queries per second and the server process's CPU per query.

The server's CPU is user + system time from /proc (10 ms ticks: only totals over a round are
divided, never one query's).  Writes the ``gc-serve`` section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.cold import QUERIES as COLD_QUERIES  # noqa: E402
from benchmarks.pgwire import QUERIES as WARM_QUERIES  # noqa: E402
from benchmarks.pgwire import cpu_seconds, demo_policy, free_port, serve, throughput  # noqa: E402
from benchmarks.results import write_section  # noqa: E402
from benchmarks.run import percentile  # noqa: E402
from chorus_py.demo import generate_demo  # noqa: E402
from server.heap import ENV, SHIPPED  # noqa: E402

#: label -> the environment of its `chorus serve`; the first is the base of the ratios.
VARIANTS = {"default": {ENV: "default"}, "freeze": {ENV: "freeze"},
            f"shipped ({SHIPPED})": {}}


async def cold_round(dsn: str, per_query: int, fresh: Iterator[int], pid: int
                     ) -> tuple[dict[str, list[float]], float]:
    """Client ms of every never-seen query by name, and the server's CPU ms per query."""
    import asyncpg

    con = await asyncpg.connect(dsn)
    await con.execute("SET chorus.epsilon = 0.1")
    times: dict[str, list[float]] = {name: [] for name in COLD_QUERIES}
    cpu = cpu_seconds(pid)
    try:
        for _ in range(per_query):
            for name, (_, sql) in COLD_QUERIES.items():
                started = time.perf_counter()
                await con.fetch(sql.format(i=next(fresh)))
                times[name].append((time.perf_counter() - started) * 1000)
    finally:
        await con.close()
    return times, (cpu_seconds(pid) - cpu) * 1000 / (per_query * len(COLD_QUERIES))


def warm_round(dsn: str, clients: int, seconds: float, pid: int) -> tuple[float, float]:
    """Queries per second of ``clients`` clients on cached shapes, server CPU ms per query
    (the clients' warm-up queries counted in neither)."""
    cpu = cpu_seconds(pid)
    qps = asyncio.run(throughput(dsn, clients, seconds))
    # throughput() first runs every query once per client (its warm-up): that CPU is in the
    # delta, so it is counted as queries too.
    done = qps * seconds + clients * len(WARM_QUERIES)
    return qps, (cpu_seconds(pid) - cpu) * 1000 / done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--cold", type=int, default=8, help="runs of each cold query a round")
    parser.add_argument("--seconds", type=float, default=4.0, help="one warm round's length")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--postgres", default=os.environ.get(
        "CHORUS_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test"))
    args = parser.parse_args()

    name = f"chorus_bench_gc_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.postgres, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    cold: dict[str, dict[str, list[float]]] = {v: {q: [] for q in COLD_QUERIES}
                                               for v in VARIANTS}
    cold_cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
    warm: dict[str, list[tuple[float, float]]] = {v: [] for v in VARIANTS}
    fresh = itertools.count()
    try:
        with tempfile.TemporaryDirectory(prefix="chorus-gc-serve-") as tmp:
            directory = Path(tmp)
            generate_demo(directory, backend_url=args.postgres.rsplit("/", 1)[0] + f"/{name}",
                          rows=args.rows)
            servers: dict[str, tuple[str, subprocess.Popen[bytes]]] = {}
            try:
                for i, (label, env) in enumerate(VARIANTS.items()):
                    policy = demo_policy(directory, f"v{'abcdefgh'[i]}", "per-query", "auto")
                    # Every cold query asks delta 1e-8 of each block: 1e-6 lasts 100 of them.
                    policy.write_text(policy.read_text().replace("delta_per_block = 1e-6",
                                                                 "delta_per_block = 0.01"))
                    port = free_port()
                    servers[label] = (f"postgresql://demo:demo@127.0.0.1:{port}/demo",
                                      serve(policy, port, env=env, rest=False))
                for r in range(args.rounds):
                    # Each server takes each place in the order in turn.
                    order = [*VARIANTS][r % len(VARIANTS):] + [*VARIANTS][:r % len(VARIANTS)]
                    for label in order:
                        dsn, proc = servers[label]
                        print(f"round {r + 1}: {label}", file=sys.stderr)
                        times, cpu = asyncio.run(cold_round(dsn, args.cold, fresh, proc.pid))
                        for q, values in times.items():
                            cold[label][q] += values
                        cold_cpu[label].append(cpu)
                        warm[label].append(warm_round(dsn, args.clients, args.seconds,
                                                      proc.pid))
            finally:
                for _, proc in servers.values():
                    proc.terminate()
                    proc.wait(10)
    finally:
        with psycopg.connect(args.postgres, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    text = report(cold, cold_cpu, warm, args)
    print(text)
    write_section("gc-serve", text)


#: How to read the tables (written under them).
READING = [
    "",
    "Reading (2026-12-04, load average 1-7: another job ran on the machine; the table is the "
    "last of five runs of the same settings that day, whose ratios to *default* follow).  "
    "Server CPU per cold query: shipped 0.89, 0.82, 0.86, 0.82, 0.86; freeze alone "
    "0.92, 0.89, 1.02, 0.97 (it ran in four).  The filtered AVG/VARIANCE's p95 (a full "
    "collection over everything the server holds, which grows with its caches, lands in "
    "some of its runs): shipped 0.45, 0.68, 0.59, 0.42, 0.45; freeze 0.86, 0.69, 0.73, "
    "0.68.  The client's median of a cold query (the database's work, the histograms that "
    "choose the cap, is most of it) moved by the runs' noise: shipped +3%, +7%, 0%, -2%, "
    "+3% (the mean over the six queries), freeze -2%, -7%, +5%, -1%.  Warm queries (cached "
    "shapes) discard few trees: CPU and throughput within 3% in the last three runs (the "
    "first two: 2% and 10% less CPU).  So the shipped settings: the freeze and the young "
    "generation every 10,000 allocations; benchmarks/cold.py --gc-variants measures the "
    "proxy's own CPU alone, and why 10,000 (section \"Cold queries under the garbage "
    "collector's settings\").",
]


def report(cold: dict[str, dict[str, list[float]]], cold_cpu: dict[str, list[float]],
           warm: dict[str, list[tuple[float, float]]], args: argparse.Namespace) -> str:
    """The section: cold latency per query, then CPU and throughput, variants side by side."""
    labels = list(VARIANTS)
    base, others = labels[0], labels[1:]
    lines = [
        "## The garbage collector of `chorus serve` (issue 23, `server.heap`)",
        "",
        f"`python -m benchmarks.gc_serve` on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC (load "
        f"average at the end {os.getloadavg()[0]:.2f}; {os.cpu_count()} CPUs shared with "
        f"Postgres, the clients and other work); {platform.machine()}, Python "
        f"{platform.python_version()}, {args.rows:,} demo trips in Postgres, the demo policy "
        f"(per-query bounding, automatic caps and bounds).  {len(labels)} `chorus serve` "
        f"processes, "
        f"{args.rounds} rounds rotating their order: *default* with `{ENV}=default` "
        f"(CPython's collector, thresholds 700/10/10), *freeze* with `{ENV}=freeze` (the "
        "start frozen, CPython's thresholds), *shipped* (frozen, and the young generation "
        f"collected every 10,000 allocations); ratios are to *{base}*.",
        "",
        f"Cold: client ms of a never-seen text (a fresh alias each run; {args.cold} runs a "
        "round, the database's work included).",
        "",
        "| query | " + " | ".join(f"{v} p50 | {v} p95" for v in labels) + " | "
        + " | ".join(f"{v}: p50 ratio | p95 ratio" for v in others) + " |",
        "|---|" + "---:|---:|" * (len(labels) + len(others)),
    ]
    for q in COLD_QUERIES:
        cells = [f"{f(cold[v][q]):.2f}" for v in labels for f in (statistics.median, _p95)]
        cells += [f"{f(cold[v][q]) / f(cold[base][q]):.2f}" for v in others
                  for f in (statistics.median, _p95)]
        lines.append(f"| {q} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Server CPU (ms per query, the median of the rounds) and warm throughput "
        f"({args.clients} clients, {args.seconds:g} s a round, the small aggregates of "
        "benchmarks/pgwire.py).",
        "",
        "| | " + " | ".join(labels) + " | " + " | ".join(f"{v}: ratio" for v in others) + " |",
        "|---|" + "---:|" * (len(labels) + len(others)),
    ]
    rows = [("cold: server CPU ms per query", {v: statistics.median(cold_cpu[v]) for v in labels}),
            ("warm: server CPU ms per query",
             {v: statistics.median(c for _, c in warm[v]) for v in labels}),
            ("warm: queries per second", {v: statistics.median(q for q, _ in warm[v])
                                          for v in labels})]
    for title, values in rows:
        lines.append(f"| {title} | " + " | ".join(f"{values[v]:.2f}" for v in labels)
                     + " | " + " | ".join(f"{values[v] / values[base]:.2f}" for v in others)
                     + " |")
    return "\n".join(lines + READING)


def _p95(values: list[float]) -> float:
    return percentile(values, 0.95)


if __name__ == "__main__":
    main()
