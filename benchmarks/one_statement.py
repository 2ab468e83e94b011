"""Issue 23, part 1: the private choices of a SUM/AVG query from one statement; writes its
section of benchmarks/RESULTS.md.

    python -m benchmarks.one_statement [--data DIR] [--rows 1000000] [--repeat 7]
                                       [--postgres URL] [--database NAME] [--skip-postgres]

On the demo trips (default policy: automatic caps and clipping bounds, per-query bounding over
the ranked copy), per query and backend, side by side in one process (the variants alternate
within each round, so they see the same machine load; medians of ``--repeat`` rounds), the
database time of the statements a query sends, SQL and fetch only (no ledger, no noise):

raw
    the analyst's SQL sent straight to the database.
answer
    the rewritten answer at the limit cap and declared bounds (what runs after the choices).
separate histograms
    the selection statements as they were before: a GROUP BY unit (the cap) and one window
    statement per clipped column (``histogram_builders(..., one_statement=False)``).
one statement
    what the engine sends now: ``rewriters.selection.choice_histogram``, over the ranked
    copy's stored row counts when the query filters nothing but its blocks ("stored"), else
    windows over one partition ("windowed").

"before" is separate + answer, "now" is one statement + answer.  A design that computed the
choices inside the answer's statement (zero extra scans) could save at most the smaller of
the two statements; the table shows what that bound is worth.

Machines here are shared and noisy: read ratios and medians, not absolute times.
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

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.results import write_section  # noqa: E402
from chorus_py.demo import generate_demo  # noqa: E402
from chorus_py.engine import Engine  # noqa: E402
from chorus_py.kinds.selection import STORED, histogram_builders  # noqa: E402
from rewriters.dialect import dialect  # noqa: E402

QUERIES = [
    "SELECT SUM(fare) FROM trips",
    "SELECT city, COUNT(*), AVG(fare) FROM trips GROUP BY city",
    "SELECT city, SUM(fare) FROM trips WHERE fare > 30 GROUP BY city",
    "SELECT COUNT(*), AVG(fare) FROM trips WHERE city = 'SEA'",
    "SELECT AVG(fare * 2 - 1), VARIANCE(fare) FROM trips WHERE city = 'LA'",
]


def statements(engine: Engine, sql: str) -> tuple[str, str, list[str], str]:
    """(answer, the one selection statement and its shape, today's separate statements)."""
    _, prepared = engine.prepare(sql, "demo", 0.5, 1e-8)
    selection = prepared.selection
    assert selection is not None and len(selection.histograms) == 1, sql
    (_, shape, one), = selection.histograms
    detail = prepared.detail
    separate = [dialect(build(), engine.dialect).sql(engine.dialect)
                for _, _, build in histogram_builders(detail.query, detail.restriction,
                                                      detail.sample)]
    return detail.sql, one, separate, "stored" if shape == STORED else "windowed"


def bench(engine: Engine, label: str, repeat: int) -> list[str]:
    rows = []
    for sql in QUERIES:
        answer, one, separate, shape = statements(engine, sql)
        variants = {"raw": [sql], "answer": [answer], "separate": separate, "one": [one]}
        for texts in variants.values():  # warm the buffer pool and the plans
            for text in texts:
                engine.backend.run(text)
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(repeat):
            for name, texts in variants.items():
                start = time.perf_counter()
                for text in texts:
                    engine.backend.run(text)
                times[name].append((time.perf_counter() - start) * 1000)
        ms = {name: statistics.median(v) for name, v in times.items()}
        before, now = ms["separate"] + ms["answer"], ms["one"] + ms["answer"]
        rows.append(
            f"| {label} | `{sql}` | {shape} | {ms['raw']:.1f} | {ms['answer']:.1f} | "
            f"{ms['separate']:.1f} ({len(separate)}) | {ms['one']:.1f} | "
            f"{before:.1f} ({before / ms['raw']:.1f}x) | {now:.1f} ({now / ms['raw']:.1f}x) | "
            f"{ms['separate'] / ms['one']:.2f}x |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=None,
                        help="a directory generate_demo wrote before (duckdb/ and pg/ in it); "
                             "default: generate the demo anew")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--postgres", default=os.environ.get(
        "CHORUS_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--database", default="chorus_one_statement")
    parser.add_argument("--skip-postgres", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "RESULTS.md")
    args = parser.parse_args()

    policies = {}
    if args.data is not None:
        policies["DuckDB"] = args.data / "duckdb" / "policy.toml"
        if not args.skip_postgres:
            policies["Postgres"] = args.data / "pg" / "policy.toml"
    else:
        work = Path(tempfile.mkdtemp(prefix="chorus-bench-"))
        policies["DuckDB"] = generate_demo(work / "duckdb", rows=args.rows)
        if not args.skip_postgres:
            base = args.postgres.rsplit("/", 1)[0]
            with psycopg.connect(args.postgres, autocommit=True) as con:
                con.execute(f"DROP DATABASE IF EXISTS {args.database} WITH (FORCE)")
                con.execute(f"CREATE DATABASE {args.database}")
            policies["Postgres"] = generate_demo(
                work / "pg", backend_url=f"{base}/{args.database}", rows=args.rows)
    table = []
    for label, path in policies.items():
        engine = Engine.from_policy(path)
        engine.warm_up(wait=True)  # the ranked copy, as `chorus serve` builds it at start
        print(f"{label}", file=sys.stderr)
        table += bench(engine, label, args.repeat)
        engine.close()
    load = os.getloadavg()[0]
    text = "\n".join([
        "## One statement for a query's private choices (issue 23, part 1)",
        "",
        f"Written by `python -m benchmarks.one_statement` on {datetime.now(UTC):%Y-%m-%d %H:%M} "
        f"UTC; {platform.machine()}, Python {platform.python_version()}, {args.rows:,} demo "
        f"trips, medians of {args.repeat} rounds (variants alternating), load average "
        f"{load:.1f} at the end on a shared 2-core machine. Database time (SQL and fetch) in ms; "
        "see the module docstring for the variants.",
        "",
        "| backend | query | selection | raw | answer | separate histograms (statements) "
        "| one statement | before: separate + answer | now: one + answer | "
        "histograms, separate / one |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *table,
        "",
    ])
    write_section("one_statement", text, args.out)
    print(text)


if __name__ == "__main__":
    main()
