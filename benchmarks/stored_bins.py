"""Quantile histograms with the ranked copy's stored bins against bins computed per row (issue
23, ``rewriters.bins``), side by side in one run, and the questions' DP / raw time now.

    python -m benchmarks.stored_bins [--rows 1000000] [--repeat 9] [--postgres URL]
                                     [--database NAME] [--skip-postgres] [--skip-duckdb]
                                     [--out RESULTS.md]

The questions: every quantile, MIN and MAX question of ``benchmarks.corpus`` (both sets).  Per
backend, one engine on the demo's policy (``demo_data.open_engine``) answers each question
once, at the policy's default epsilon, and its histogram statements are kept.  Each statement
reads the copy's stored bin (``alias.__chorus_binI AS b``); its twin with the bin computed per
row puts the histogram's own CASE over the column there instead (``rewriters.bins.bin_of``,
what the statement was before).  Then rounds alternate: the raw query, each histogram
statement stored and computed (their order alternating), and the DP query end to end;
medians.  Both statements read the same copy and count the same cells (checked once).

DuckDB's connection runs with ``perfect_ht_threshold`` 14 in both columns (a process-wide
setting of the database file, ``chorus_py.backends.duckdb.PERFECT_HASH``), so its part is not
in this table: by hand it took the 1M-row MAX(distance_km) histogram from 22-29 to 13-15 ms
with the stored bin, 29-36 to 21-22 ms computing it (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlglot import exp  # noqa: E402

from benchmarks import corpus  # noqa: E402
from benchmarks.demo_data import demo_engines, demo_options  # noqa: E402
from benchmarks.results import write_section  # noqa: E402
from chorus_py.engine import Engine  # noqa: E402
from rewriters.bins import BINS, bin_of, stored_bins  # noqa: E402

_QUANTILE = re.compile(r"PERCENTILE|MEDIAN|\bMIN\(|\bMAX\(", re.IGNORECASE)
# How a histogram names its stored bin: ``alias.__chorus_bin<i> AS b`` (rewriters.quantiles).
_STORED = re.compile(r'("?\w+"?)\.__chorus_bin(\d+) AS b')


def questions() -> list[tuple[str, str]]:
    """(label, SQL) of every quantile, MIN and MAX question of both corpus sets."""
    return [(f"{name} #{i}", q.sql) for name, qs in corpus.QUESTIONS.items()
            for i, q in enumerate(qs, 1) if _QUANTILE.search(q.sql)]


def computed_twin(statement: str, engine: Engine, dialect: str) -> str:
    """``statement`` with each stored bin replaced by the bin computed from its column."""
    binned = stored_bins(engine.policy.tables["trips"])

    def computed(found: re.Match[str]) -> str:
        name, lower, upper = binned[int(found.group(2))]
        value = exp.cast(exp.column(name, table=found.group(1).strip('"'), quoted=True),
                         exp.DType.DOUBLE)
        return f"{bin_of(value, lower, upper, BINS).sql(dialect)} AS b"

    return _STORED.sub(computed, statement)


def histograms(engine: Engine, sql: str) -> list[str]:
    """The histogram statements (``Backend.run_integers``) of one DP run of ``sql``."""
    seen: list[str] = []
    real = engine.backend.run_integers

    def keep(statement: str):  # type: ignore[no-untyped-def]
        seen.append(statement)
        return real(statement)

    engine.backend.run_integers = keep  # type: ignore[method-assign]
    try:
        engine.execute(sql, "demo")
    finally:
        engine.backend.run_integers = real  # type: ignore[method-assign]
    return [s for s in seen if "__chorus_bin" in s]


def ms(run) -> float:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    run()
    return (time.perf_counter() - started) * 1000


def bench(label: str, engine: Engine, repeat: int) -> list[str]:
    """The table rows of one backend."""
    dialect = engine.dialect
    rows = []
    raw_con = engine.backend
    for name, sql in questions():
        for _ in range(2):  # choices made and kept, plans prepared: a warm query
            engine.execute(sql, "demo")
        stored = histograms(engine, sql)
        computed = [computed_twin(s, engine, dialect) for s in stored]
        for s, c in zip(stored, computed, strict=True):
            assert sorted(map(tuple, zip(*raw_con.run_integers(s), strict=True))) == sorted(
                map(tuple, zip(*raw_con.run_integers(c), strict=True))), name
        times: dict[str, list[float]] = {"raw": [], "stored": [], "computed": [], "dp": []}
        for r in range(repeat):
            times["raw"].append(ms(lambda sql=sql: raw_con.run(sql)))
            order = ("stored", "computed") if r % 2 else ("computed", "stored")
            for variant in order:
                texts = stored if variant == "stored" else computed
                times[variant].append(sum(ms(lambda t=t: raw_con.run_integers(t))
                                          for t in texts))
            times["dp"].append(ms(lambda sql=sql: engine.execute(sql, "demo")))
        med = {k: statistics.median(v) for k, v in times.items()}
        rows.append(f"| {label} | {name}: `{sql}` | {len(stored)} | {med['raw']:.1f} | "
                    f"{med['computed']:.1f} | {med['stored']:.1f} | "
                    f"{med['stored'] / med['computed']:.2f} | {med['dp']:.1f} | "
                    f"{med['dp'] / med['raw']:.2f} |")
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    demo_options(parser, "chorus_stored_bins")
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="chorus-bins-"))
    load = os.getloadavg()[0]
    rows: list[str] = []
    try:
        for label, engine in demo_engines(args, work):
            rows += bench(label, engine, args.repeat)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = "\n".join([
        "## Stored quantile bins against bins computed per row (issue 23, `rewriters.bins`)",
        "",
        f"Written by `python -m benchmarks.stored_bins --rows {args.rows} --repeat "
        f"{args.repeat}` on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; x86_64, 2 cores shared "
        f"with other jobs (load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at "
        f"the end), {args.rows:,} demo trips, the demo's default policy, epsilon 0.5.  "
        "Histogram statements: the question's histogram statements sent straight to the "
        "database, reading the ranked copy's stored bin or computing each row's bin (the "
        "same cells, checked); medians of alternating rounds, ms.  DP: the question end to "
        "end now (choices reused as the default allows).",
        "",
        "| backend | question | histograms | raw ms | histograms computed ms | "
        "histograms stored ms | stored / computed | DP ms | DP / raw |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
    ])
    write_section("stored-bins", text, args.out)


if __name__ == "__main__":
    main()
