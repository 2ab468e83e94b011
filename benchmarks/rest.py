"""REST throughput and latency on small aggregates; writes the ``rest`` section of RESULTS.md.

    python benchmarks/rest.py [--rows 100000] [--requests 300] [--concurrency 1 8]
                              [--postgres URL] [--out benchmarks/RESULTS.md]

The proxy runs as ``python -m server.rest`` in its own process (uvicorn, one event loop, engine
calls in its thread pool) on demo data; clients are httpx threads in this process, each with a
keep-alive connection, sending bearer-authenticated ``POST /v1/query``.  For each query and
client concurrency: requests per second, and p50 / p95 latency seen by the client.  The same
queries through ``Engine.execute`` in-process (no HTTP) give the REST overhead.  The budget is
large enough never to run out; the ledger is the default SQLite file next to the policy.

Machines here are shared and noisy (2 cores for server and clients together): read the orders
of magnitude.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.results import write_section  # noqa: E402
from chorus_py.demo import generate_demo  # noqa: E402
from chorus_py.engine import Engine  # noqa: E402

TOKEN = "bench-token"

QUERIES = [
    ("public table (no noise, no charge)", "SELECT state, COUNT(*) FROM cities GROUP BY state"),
    ("DP count, one day", "SELECT COUNT(*) FROM trips WHERE pickup_time >= '2026-03-01' "
     "AND pickup_time < '2026-03-02'"),
    ("DP count + avg by city, one week", "SELECT city, COUNT(*), AVG(fare) FROM trips "
     "WHERE pickup_time >= '2026-03-01' AND pickup_time < '2026-03-08' GROUP BY city"),
]

POLICY = """
[backend]
url = "{url}"

[privacy]
epsilon_per_block = 1e9
delta_per_block = 1e-3
default_epsilon = 0.1
default_delta = 1e-8
max_epsilon_per_query = 1.0
max_delta_per_query = 1e-6

[tables.trips]
privacy_unit = "rider_id"
max_rows_per_unit = 10
block = {{ column = "pickup_time", size = "1 day", start = "2026-01-01", end = "2026-04-01" }}

[tables.trips.columns]
rider_id    = {{ type = "int", private_id = true }}
city        = {{ type = "text", public_values = ["SF", "NYC", "LA", "CHI", "SEA"] }}
pickup_time = {{ type = "timestamp" }}
fare        = {{ type = "float", lower = 0, upper = 200 }}

[tables.cities]
public = true

[analysts.bench]
token_sha256 = "{token}"
"""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def in_process(policy: Path, requests: int) -> dict[str, float]:
    """p50 of Engine.execute per query (ms)."""
    out = {}
    with Engine.from_policy(policy) as engine:
        for label, sql in QUERIES:
            for _ in range(5):
                engine.execute(sql, analyst="bench")
            times = []
            for _ in range(requests):
                started = time.perf_counter()
                engine.execute(sql, analyst="bench")
                times.append((time.perf_counter() - started) * 1000)
            out[label] = statistics.median(times)
    return out


def start_server(policy: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as sink:  # a file, not a pipe nobody reads: a full pipe blocks the server
        process = subprocess.Popen(
            [sys.executable, "-m", "server.rest", "--policy", str(policy),
             "--listen", f"127.0.0.1:{port}"],
            cwd=ROOT, stdout=sink, stderr=sink, env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(log.read_text())
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).is_success:
                return process
        except httpx.TransportError:
            time.sleep(0.2)
    process.kill()
    raise RuntimeError("the REST server did not start")


def run_load(url: str, sql: str, requests: int, concurrency: int) -> tuple[float, list[float]]:
    """(requests per second, latencies in ms) for ``requests`` split over ``concurrency``."""
    latencies: list[float] = []
    lock = threading.Lock()
    errors: list[str] = []
    per_worker = max(1, requests // concurrency)

    def worker() -> None:
        mine = []
        with httpx.Client(base_url=url, timeout=60,
                          headers={"Authorization": f"Bearer {TOKEN}"}) as client:
            for _ in range(3):  # warm the connection and the caches
                client.post("/v1/query", json={"sql": sql})
            barrier.wait()
            for _ in range(per_worker):
                started = time.perf_counter()
                response = client.post("/v1/query", json={"sql": sql})
                mine.append((time.perf_counter() - started) * 1000)
                if response.status_code != 200:
                    errors.append(response.text)
        with lock:
            latencies.extend(mine)

    barrier = threading.Barrier(concurrency + 1)
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise RuntimeError(f"{len(errors)} failed requests, e.g. {errors[0]}")
    return len(latencies) / elapsed, latencies


def bench_backend(name: str, url: str, directory: Path, args: argparse.Namespace) -> list[str]:
    policy = directory / f"policy-{name}.toml"
    policy.write_text(POLICY.format(url=url, token=hashlib.sha256(TOKEN.encode()).hexdigest()))
    baseline = in_process(policy, min(args.requests, 100))
    port = args.port
    server = start_server(policy, port, directory / f"server-{name}.log")
    rows = []
    try:
        for label, sql in QUERIES:
            for concurrency in args.concurrency:
                qps, latencies = run_load(f"http://127.0.0.1:{port}", sql, args.requests,
                                          concurrency)
                rows.append(f"| {name} | {label} | {concurrency} | {len(latencies)} | "
                            f"{qps:.0f} | {percentile(latencies, 0.5):.1f} | "
                            f"{percentile(latencies, 0.95):.1f} | {baseline[label]:.1f} |")
                print(rows[-1], flush=True)
    finally:
        server.terminate()
        server.wait(30)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=300,
                        help="requests per query and concurrency level")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--postgres", default=None, metavar="URL",
                        help="also measure on this (existing, empty) Postgres database")
    parser.add_argument("--port", type=int, default=18000)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "RESULTS.md")
    args = parser.parse_args()

    rows: list[str] = []
    overheads: list[str] = []
    with tempfile.TemporaryDirectory(prefix="chorus-bench-rest-") as tmp:
        directory = Path(tmp)
        generate_demo(directory, rows=args.rows)
        rows += bench_backend("DuckDB", f"duckdb:///{directory / 'demo.duckdb'}", directory,
                              args)
        if args.postgres:
            generate_demo(directory / "pg", backend_url=args.postgres, rows=args.rows)
            rows += bench_backend("Postgres", args.postgres, directory, args)
    for row in rows:  # HTTP + auth + validation + JSON: the public query at one client
        cells = [c.strip() for c in row.strip("|").split("|")]
        if cells[1] == QUERIES[0][0] and cells[2] == "1":
            overheads.append(f"{cells[0]} {float(cells[5]) - float(cells[7]):.1f} ms")

    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    text = f"""## REST front door: queries per second and latency

Written by `python benchmarks/rest.py` on {now}; {platform.machine()}, Python \
{platform.python_version()}, {args.rows:,} demo trips, {args.requests} requests per row of the
table. The proxy runs as `python -m server.rest` (uvicorn, engine calls in a thread pool, SQLite
ledger); httpx clients with keep-alive connections run in the benchmark process on the same
2-core machine. Latency is seen by the client; "in-process" is the median of `Engine.execute`
for the same query without HTTP.

| backend | query | clients | requests | queries/s | p50 ms | p95 ms | in-process p50 ms |
|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

Queries: {"; ".join(f"{label}: `{sql}`" for label, sql in QUERIES)}.

Reading: the REST layer adds about {", ".join(overheads)} per request (public-table query, one
client: REST p50 minus in-process p50). DP queries cost what the engine costs (analysis cached,
noise drawn in the database, two ledger transactions per query); more clients raise throughput
only as far as the two cores allow, and their latency grows with the queue.
"""
    write_section("rest", text, args.out)
    print(f"wrote the rest section of {args.out}")


if __name__ == "__main__":
    main()
