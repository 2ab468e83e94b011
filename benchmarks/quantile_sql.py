"""DP / raw time of the corpus's quantile and MIN/MAX questions (benchmarks/corpus.py, #26-#29),
with where the time goes: the histogram statement, the proxy's rest.  Issue 23's quantile
statements before and after a change, side by side.

    python -m benchmarks.quantile_sql [--rows 1000000] [--repeat 5] [--postgres URL]
                                      [--database NAME] [--skip-postgres] [--skip-duckdb]
                                      [--json FILE]
    python -m benchmarks.quantile_sql --before B1.json [B2.json ...] --after A1.json [...]
                                      [--out RESULTS.md]

The first form runs ``benchmarks.corpus``'s rounds (raw, DP at the default epsilon, DP at
0.01, alternating; medians) on the four questions and prints them (``--json``: kept for a
comparison).  Run it once on the code before a change and once after (``PYTHONPATH`` of each
checkout), alternating, as many times as the machine's noise asks; then ``--before`` and
``--after`` write the section ``quantile-sql`` of benchmarks/RESULTS.md with both side by side
(per question, the median of each time over the runs).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import corpus  # noqa: E402
from benchmarks.phases import Phases, Recorder  # noqa: E402
from benchmarks.results import write_section  # noqa: E402

#: The corpus's quantile questions (#26-#29): median, per-city 90th percentile, MIN and MAX
#: of a filtered column, per-city median and count.
NAMES = ("median", "per city: 90th percentile", "MIN and MAX, filtered",
         "per city: median and count")


#: {backend: {question: {time: ms}}}.
Medians = dict[str, dict[str, dict[str, float]]]


def ms(runs: list[Phases], part: str) -> float:
    """The median of one part of the runs' times (``total``, ``answer``, ``proxy``), in ms."""
    return statistics.median(getattr(p, part) for p in runs) * 1000


def measure(args: argparse.Namespace) -> Medians:
    """{backend: {question: medians}} of the corpus's rounds on the quantile questions."""
    corpus.QUESTIONS["quantiles"] = tuple(q for q in corpus.CORPUS if q.name in NAMES)
    args.questions = "quantiles"
    out: Medians = {}
    work = Path(tempfile.mkdtemp(prefix="chorus-quantile-sql-"))
    try:
        for label, skip in (("Postgres", args.skip_postgres), ("DuckDB", args.skip_duckdb)):
            if skip:
                continue
            policy = corpus.demo_policy(label, args, work)
            engine = corpus.open_engine(policy)
            recorder = Recorder()
            recorder.attach(engine)
            try:
                cells = corpus.bench(label, engine, recorder, args, [])
            finally:
                engine.close()
                if label == "Postgres":
                    corpus.drop_database(args)
            out[label] = {name: {
                "raw": cell.raw_ms, "dp": cell.dp_ms(), "low": cell.dp_ms(True),
                "answer": ms(cell.dp, "answer"), "proxy": ms(cell.dp, "proxy"),
                "low_answer": ms(cell.low, "answer"), "low_proxy": ms(cell.low, "proxy"),
            } for name, cell in cells.items()}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def merged(runs: list[Medians]) -> Medians:
    """Per backend, question and time, the median over ``runs`` (those that measured it);
    ``ratio`` and ``low_ratio``: the median of each run's DP / raw (a run's load moves both)."""
    values: dict[tuple[str, str, str], list[float]] = {}
    for run in runs:
        for label, questions in run.items():
            for name, times in questions.items():
                ratios = {"ratio": times["dp"] / times["raw"],
                          "low_ratio": times["low"] / times["raw"]}
                for what, value in {**times, **ratios}.items():
                    values.setdefault((label, name, what), []).append(value)
    out: Medians = {}
    for (label, name, what), found in values.items():
        out.setdefault(label, {}).setdefault(name, {})[what] = statistics.median(found)
    return out


def compare(before: Medians, after: Medians) -> str:
    """The side-by-side table: per backend and question, raw ms, DP / raw at the default
    epsilon and at 0.01 (medians of the runs' ratios), the histogram statement's ms and the
    proxy's rest, before -> after."""
    lines = ["| backend | question | raw ms (before / after) | DP / raw | DP / raw at 0.01 | "
             "answer statement ms | at 0.01 | proxy rest ms |",
             "|---|---|---|---|---|---|---|---|"]
    for label, questions in after.items():
        for name, a in questions.items():
            b = before.get(label, {}).get(name)
            if b is None:
                continue
            lines.append(
                f"| {label} | {name} | {b['raw']:.1f} / {a['raw']:.1f} | "
                f"{b['ratio']:.2f} -> **{a['ratio']:.2f}** | "
                f"{b['low_ratio']:.2f} -> **{a['low_ratio']:.2f}** | "
                f"{b['answer']:.1f} -> {a['answer']:.1f} | "
                f"{b['low_answer']:.1f} -> {a['low_answer']:.1f} | "
                f"{b['proxy']:.1f} -> {a['proxy']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5, help="rounds per question")
    parser.add_argument("--min-repeat", type=int, default=5)
    parser.add_argument("--query-seconds", type=float, default=60.0)
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--database", default="quantile_sql_bench")
    parser.add_argument("--skip-postgres", action="store_true")
    parser.add_argument("--skip-duckdb", action="store_true")
    parser.add_argument("--json", type=Path, help="write the medians here")
    parser.add_argument("--before", type=Path, nargs="+", help="runs' --json before")
    parser.add_argument("--after", type=Path, nargs="+", help="runs' --json after")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "RESULTS.md")
    args = parser.parse_args()
    if args.before or args.after:
        if not (args.before and args.after):
            parser.error("--before and --after go together")
        text = compare(merged([json.loads(p.read_text()) for p in args.before]),
                       merged([json.loads(p.read_text()) for p in args.after]))
        write_section("quantile-sql", text, args.out)
        print(text)
        return
    result = measure(args)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
