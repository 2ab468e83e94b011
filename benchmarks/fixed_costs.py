"""The fixed cost of a warm DP query on DuckDB (issue 23): this tree against another revision,
side by side.  Writes the ``fixed-costs`` section of benchmarks/RESULTS.md.

    python -m benchmarks.fixed_costs [--before main] [--rows 1000000] [--rounds 40] [--out FILE]

The cheapest questions of the corpus (``COUNT(*)``, ``SUM``, ``AVG``, a day of March, a CASE
count) take 1-4 ms raw on DuckDB with 1M trips, so a few fixed milliseconds per DP query put
them over 4x.  A warm query is the same text run again: its rewrite comes from the caches and
its private choices are reused, so what it costs beyond its statement is fixed.

1. The demo (``generate_demo``) at ``--rows`` trips in a DuckDB file; the revision ``--before``
   exported from git (``git archive``) beside this tree.
2. Two worker processes, each on its own copy of the demo (DuckDB lets one process write a
   file) and its policy (a budget per block no run exhausts; its own SQLite ledger): one
   imports ``chorus_py`` from the export (before), one from this tree (after).  Each is
   warmed up as ``chorus serve`` starts and runs every query once (cold prepare, choices).
3. Rounds, the two workers alternating (which goes first alternates too, so the machine's
   load falls on both alike): each runs the analyst's SQL straight to the database (raw,
   ``Backend.run``) then ``Engine.execute`` (DP, ``remaining=False`` as the wire protocol
   asks), timing within it the statements (``Backend.run``), the ledger (the claim until its
   decision, and the wait for its durable commit) and the rest (the proxy's Python), then the
   answer statement alone (its text run again by ``Backend.run``).  Medians.

Shared, noisy machine: read the ratios, and before against after within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

QUERIES: tuple[tuple[str, str], ...] = (
    ("count (#1)", "SELECT COUNT(*) FROM trips"),
    ("sum (#2)", "SELECT SUM(fare) FROM trips"),
    ("average (#3)", "SELECT AVG(fare) FROM trips"),
    ("per day of March (#17)",
     "SELECT CAST(pickup_time AS DATE) AS day, COUNT(*) FROM trips "
     "WHERE pickup_time >= '2026-03-01' GROUP BY 1 ORDER BY 1"),
    ("CASE count (#24)",
     "SELECT SUM(CASE WHEN fare > 30 THEN 1 ELSE 0 END) AS expensive, COUNT(*) FROM trips"),
)
PARTS = ("raw", "dp", "statements", "ledger", "rest", "answer_alone")


# -- worker: one engine, from the tree on sys.path -------------------------------------------


def worker(policy: Path) -> None:
    """Answer rounds read from stdin (one JSON query text a line) with one JSON line of
    milliseconds (``PARTS``) each; the engine is imported from the tree first on sys.path."""
    import chorus_py
    from chorus_py.engine import Engine

    print(f"worker: chorus_py from {Path(chorus_py.__file__).parent}", file=sys.stderr)
    engine = Engine.from_policy(policy)
    engine.warm_up(wait=True)
    backend, ledger = engine.backend, engine.ledger
    spent = {"statements": 0.0, "ledger": 0.0}
    texts: list[str] = []

    def timed(name: str, call: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - started
        return wrapper

    run_statement = backend.run

    def statement(sql: str) -> Any:
        texts.append(sql)
        return run_statement(sql)

    backend.run = timed("statements", statement)
    backend.run_integers = timed("statements", backend.run_integers)
    claim = ledger.claim_overlapped

    def overlapped(*args: Any, **kwargs: Any) -> Any:
        got, durable = timed("ledger", claim)(*args, **kwargs)
        return got, timed("ledger", durable)

    ledger.claim_overlapped = overlapped
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        sql = json.loads(line)
        started = time.perf_counter()
        run_statement(sql)
        raw = time.perf_counter() - started
        spent.update(statements=0.0, ledger=0.0)
        texts.clear()
        started = time.perf_counter()
        engine.execute(sql, remaining=False)
        dp = time.perf_counter() - started
        parts = dict(spent)
        answer = texts[-1]
        started = time.perf_counter()
        run_statement(answer)
        alone = time.perf_counter() - started
        out = {"raw": raw, "dp": dp, "statements": parts["statements"],
               "ledger": parts["ledger"],
               "rest": dp - parts["statements"] - parts["ledger"], "answer_alone": alone}
        print(json.dumps({k: v * 1000 for k, v in out.items()}), flush=True)


# -- driver ------------------------------------------------------------------------------------


class Worker:
    """A worker process on one tree."""

    def __init__(self, tree: Path, policy: Path) -> None:
        env = dict(os.environ, PYTHONPATH=str(tree))
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--worker", str(policy)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=tree)
        self._read()

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"a worker ended early (exit {self.proc.wait()})")
        return json.loads(line)

    def ask(self, sql: str) -> dict[str, float]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(sql) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()


def export(revision: str, into: Path) -> Path:
    """The tree of ``revision`` of this repository, written under ``into``."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def policy_copy(policy: Path) -> Path:
    """The demo's policy with a budget per block that no run exhausts."""
    text = policy.read_text()
    if text.count("epsilon_per_block = 10.0") != 1:
        raise SystemExit(f"{policy}: epsilon_per_block = 10.0 not found once")
    text = text.replace("epsilon_per_block = 10.0", "epsilon_per_block = 1e9")
    out = policy.with_name("policy-fixed-costs.toml")
    out.write_text(text)
    return out


def median(rounds: list[dict[str, float]], part: str) -> float:
    return statistics.median(r[part] for r in rounds)


def report(args: argparse.Namespace, results: dict[str, dict[str, list[dict[str, float]]]],
           load: tuple[float, float]) -> str:
    lines = [
        "## Fixed cost of a warm DP query on DuckDB (issue 23)",
        "",
        f"Written by `python -m benchmarks.fixed_costs --before {args.before} --rows "
        f"{args.rows} --rounds {args.rounds}` on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; "
        f"{platform.machine()}, 2 cores shared with other jobs (load average {load[0]:.1f} "
        f"at the start, {load[1]:.1f} at the end), Python {platform.python_version()}, "
        f"{args.rows:,} demo trips, DuckDB.  Before: `{args.before}`; after: this tree.  "
        "Two worker processes alternating round by round; medians of the rounds, ms; the "
        "ratios over the median raw time of both.  "
        "Statements: every `Backend.run` of the DP query; ledger: the claim until its "
        "decision plus the wait for its durable commit; rest: the proxy's Python; answer "
        "alone: the answer statement run again by itself.",
        "",
        "| query | raw before / after | DP before | DP after | DP / raw before | "
        "DP / raw after | statements before / after | ledger before / after | "
        "rest before / after | answer alone before / after | DP - answer alone before / "
        "after |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, _ in QUERIES:
        before, after = results[name]["before"], results[name]["after"]
        # One raw time for both ratios: the same query straight to the same data (the
        # backend's own way of running it differs between the revisions).
        raw = median(before + after, "raw")
        cells = [name, f"{median(before, 'raw'):.2f} / {median(after, 'raw'):.2f}",
                 f"{median(before, 'dp'):.2f}", f"{median(after, 'dp'):.2f}",
                 f"{median(before, 'dp') / raw:.2f}", f"{median(after, 'dp') / raw:.2f}"]
        cells += [f"{median(before, p):.2f} / {median(after, p):.2f}"
                  for p in ("statements", "ledger", "rest", "answer_alone")]
        fixed = [statistics.median(r["dp"] - r["answer_alone"] for r in side)
                 for side in (before, after)]
        cells.append(f"{fixed[0]:.2f} / {fixed[1]:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--before", default="main", help="git revision to compare against")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--out", type=Path, default=None,
                        help="results file (default benchmarks/RESULTS.md)")
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker)
        return
    sys.path.insert(0, str(ROOT))
    from benchmarks.results import RESULTS, write_section
    from chorus_py.demo import generate_demo

    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="chorus-fixed-costs-") as tmp:
        work = Path(tmp)
        policy = generate_demo(work / "demo", rows=args.rows)
        (work / "tree").mkdir()
        trees = {"before": export(args.before, work / "tree"), "after": ROOT}
        workers = {}
        for label, tree in trees.items():
            # DuckDB lets one process write a file (the engine stores its ranked copy in it).
            shutil.copytree(work / "demo", work / label)
            workers[label] = Worker(tree, policy_copy(work / label / policy.name))
        results: dict[str, dict[str, list[dict[str, float]]]] = {}
        try:
            for name, sql in QUERIES:
                for w in workers.values():
                    w.ask(sql)  # the first run: cold prepare, the private choices
                rounds: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
                for i in range(args.rounds):
                    order = ("before", "after") if i % 2 == 0 else ("after", "before")
                    for label in order:
                        rounds[label].append(workers[label].ask(sql))
                results[name] = rounds
                print(f"{name}: DP before {median(rounds['before'], 'dp'):.2f} ms, after "
                      f"{median(rounds['after'], 'dp'):.2f} ms", file=sys.stderr)
        finally:
            for w in workers.values():
                w.close()
    text = report(args, results, (load_start, os.getloadavg()[0]))
    print(text)
    write_section("fixed-costs", text, args.out or RESULTS)


if __name__ == "__main__":
    main()
