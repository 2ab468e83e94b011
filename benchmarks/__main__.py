"""Run every benchmark, one after the other; each writes its section of benchmarks/RESULTS.md.

    python -m benchmarks                 # all of them (about an hour on 2 cores, half of it spark)
    python -m benchmarks joins sampling  # only these
    python -m benchmarks peers           # an opt-in one (OPT_IN): run only when named

Each benchmark is its own process (its own interpreter, as the proxy runs in production) with its
default arguments; run one directly for its options (``python -m benchmarks.pgwire --help``).
Postgres must be up for ``run``, ``corpus``, ``floors``, ``pgwire`` and ``rest``
(``CHORUS_TEST_PG``, default ``postgresql://postgres@127.0.0.1:5432/test``); ``spark`` needs
pyspark and Java 17 (the ``spark`` extra) and makes its 10M-trip Parquet demo once, under the
system's temp directory. ``peers`` (opt-in: about 15 minutes more, and its first run installs
SmartNoise SQL and Qrlew in ``.venv-peers``) also needs Postgres.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: name -> what it measures (the order they run in).
BENCHMARKS = {
    "run": "engine: analyse + rewrite latency, DP / raw query time",
    "accuracy": "automatic caps and clipping bounds against fixed ones",
    "pgwire": "wire protocol: latency and throughput against raw Postgres",
    "workers": "chorus serve --workers 2 against 1: throughput over the wire",
    "spark": "Spark backend on 10M demo trips as Parquet: DP / raw, bounding, where time goes",
    "rest": "REST front door: queries per second and latency",
    "ledger": "budget ledger: claims per second, DPF simulations",
    "joins": "joins: analyse + rewrite time, max-frequency metrics",
    "attribution": "multi-attribution bounding: speed, distance from optimal",
    "sampling": "sensitivity sampling: time, convergence",
    "quantiles": "DP quantiles: rank error, exponential mechanism vs sensitivity sampling",
    "scan_options": "issue 23 study: one-scan designs for the default policy, cold prepares",
    "one_statement": "issue 23: a SUM/AVG query's private choices from one statement",
    "cold": "issue 23: proxy CPU of never-seen queries, by phase",
    "gc_serve": "issue 23: the garbage collector settings of `chorus serve`, through the server",
    "corpus": "issue 23: 36 analyst questions, DP / raw with the default policy",
    "noise_location": "issue 23: DuckDB's noise drawn in SQL or by the proxy, side by side",
    "streamed": "issue 23: DuckDB's heavy branch streamed against the window it replaced",
    "month_twin": "issue 23: queries over one month with and without the copy's month twin",
    "fixed_costs": "issue 23: a warm query's fixed costs on DuckDB, against main",
    "group_parts": "issue 23: thresholded keys in two parts of the ranked copy against three",
    "grouped_twin": "issue 23: thresholded keys with and without the copy's grouped twin",
    "stored_bins": "issue 23: quantile histograms, the copy's stored bins against computed",
    "floors": "issue 23: what no statement removes (DuckDB fixed costs, Postgres windows)",
    "choice_cells": "issue 23: a filtered query's choices statement in its forms, side by side",
}
#: Run only when named: too long for the default sweep, or needing more than the project's
#: own environment.
OPT_IN = {
    "peers": "issue 23: DP / raw of chorus, SmartNoise SQL and Qrlew on the corpus (makes "
             ".venv-peers)",
}


def main(argv: list[str]) -> int:
    """Run the named benchmarks (all by default); the exit code of the first that fails."""
    known = {**BENCHMARKS, **OPT_IN}
    unknown = [name for name in argv if name not in known]
    if unknown or any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        for name, what in BENCHMARKS.items():
            print(f"  {name:12s} {what}")
        for name, what in OPT_IN.items():
            print(f"  {name:12s} (opt-in) {what}")
        return 2 if unknown else 0
    for i, name in enumerate(argv or list(BENCHMARKS), 1):
        print(f"[{i}/{len(argv or BENCHMARKS)}] {name}: {known[name]}", flush=True)
        started = time.monotonic()
        code = subprocess.call([sys.executable, "-m", f"benchmarks.{name}"], cwd=ROOT)
        print(f"[{name}] {'done' if code == 0 else f'failed ({code})'} in "
              f"{time.monotonic() - started:.0f} s", flush=True)
        if code:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
