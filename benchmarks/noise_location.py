"""Where DuckDB's noise is drawn (issue 23): in SQL by DuckDB, or by the proxy, side by side.

    python -m benchmarks.noise_location [--rows 1000000] [--rounds 7] [--out FILE]

DuckDB runs inside the proxy's process, so its exact aggregates are in that process's memory
wherever the noise is drawn; the policy's default there is ``privacy.noise = "proxy"``.  This
measures what it costs: one DuckDB demo, two engines on it that differ only in
``privacy.noise`` ("sql": the answer statement draws the noise, its outputs finished in the
same statement; "proxy": the statement returns the exact measurements, the proxy draws the
noise from os.urandom and computes the outputs, ``chorus_py.kinds.finish``), and the
analyst's SQL straight to DuckDB (raw).  Every question of ``benchmarks.corpus`` (both sets)
at the policy's default epsilon; rounds alternate raw, SQL noise and proxy noise, after three
runs of each (choices made and reused, statements prepared).  Medians; read the ratios.
Writes the ``noise-location`` section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.corpus import QUESTIONS  # noqa: E402
from benchmarks.demo_data import demo_options, open_engine  # noqa: E402
from benchmarks.results import write_section  # noqa: E402
from chorus_py.demo import generate_demo  # noqa: E402
from chorus_py.engine import Engine  # noqa: E402


def _engine(policy: Path, noise: str) -> Engine:
    """An engine on a copy of the demo policy whose noise is drawn by ``noise``."""
    text = policy.read_text()
    line = '\nnoise = "proxy"\n'
    if text.count(line) != 1:
        raise SystemExit(f'{policy}: the line noise = "proxy" not found once')
    ledger = 'ledger = "sqlite:///budget.sqlite3"'
    if text.count(ledger) != 1:
        raise SystemExit(f"{policy}: {ledger} not found once")
    variant = policy.with_name(f"policy-{noise}.toml")
    # A ledger of its own: the two engines do not spend each other's budget (delta, above all).
    variant.write_text(text.replace(line, f'\nnoise = "{noise}"\n').replace(
        ledger, f'ledger = "sqlite:///budget-{noise}.sqlite3"'))
    return open_engine(variant)


def _timed(call: object) -> float:
    started = time.perf_counter()
    call()  # type: ignore[operator]
    return (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    demo_options(parser, None)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    rows: list[str] = []
    ratios: dict[str, list[float]] = {"sql": [], "proxy": []}
    with tempfile.TemporaryDirectory() as work:
        policy = generate_demo(Path(work) / "duckdb", rows=args.rows)
        engines = {noise: _engine(policy, noise) for noise in ("sql", "proxy")}
        raw = engines["sql"].backend.run
        for questions in QUESTIONS.values():
            for question in questions:
                for engine in engines.values():
                    for _ in range(3):
                        engine.execute(question.sql, remaining=False)
                    engine.samples.wait()
                times: dict[str, list[float]] = {"raw": [], "sql": [], "proxy": []}
                for _ in range(args.rounds):
                    times["raw"].append(_timed(lambda q=question.sql: raw(q)))
                    for noise, engine in engines.items():
                        times[noise].append(_timed(
                            lambda e=engine, q=question.sql: e.execute(q, remaining=False)))
                m = {k: statistics.median(v) for k, v in times.items()}
                for noise in ratios:
                    ratios[noise].append(m[noise] / m["raw"])
                rows.append(f"| {question.name} | {m['raw']:.2f} | {m['sql']:.2f} | "
                            f"{m['sql'] / m['raw']:.2f} | {m['proxy']:.2f} | "
                            f"{m['proxy'] / m['raw']:.2f} | {m['proxy'] / m['sql']:.2f} |")
                print(rows[-1], flush=True)
        for engine in engines.values():
            engine.close()
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    load = os.getloadavg()[0]

    def line(noise: str) -> str:
        values = sorted(ratios[noise])
        return (f"| {noise} | {statistics.median(values):.2f} | "
                f"{values[int(0.9 * (len(values) - 1))]:.2f} | {values[-1]:.2f} |")

    text = "\n".join([
        "## Where DuckDB's noise is drawn: in SQL or by the proxy (issue 23)",
        "",
        f"Written by `python -m benchmarks.noise_location --rows {args.rows} --rounds "
        f"{args.rounds}` on {when}; {platform.machine()}, {os.cpu_count()} cores shared "
        f"with other jobs (load average {load:.1f} at the end), Python "
        f"{platform.python_version()}, {args.rows:,} demo trips in DuckDB.  One demo, two "
        "engines differing only in `privacy.noise`, the analyst's SQL straight to DuckDB as "
        "raw; rounds alternate raw, SQL noise, proxy noise after three runs of each.  Medians "
        "of the rounds (ms); every question of `benchmarks.corpus` (36, then the 30 "
        "held-out ones).",
        "",
        "| noise | DP / raw median | p90 | max |",
        "|---|---|---|---|",
        line("sql"), line("proxy"),
        "",
        "| question | raw ms | SQL noise ms | / raw | proxy noise ms | / raw | proxy / SQL |",
        "|---|---|---|---|---|---|---|",
        *rows,
    ])
    write_section("noise-location", text, args.out)
    print(text)


if __name__ == "__main__":
    main()
