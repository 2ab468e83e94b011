"""MIN / MAX questions with the default policy (issue 23): DP / raw time before and after a
mixed query (quantiles next to COUNT/SUM/AVG) reuses its parts' private choices, and after the
proxy's finish over the released values became one statement, side by side in one run, with
where the time goes.

    python -m benchmarks.minmax [--rows 1000000] [--repeat 7] [--postgres URL]
                                [--database NAME] [--skip-postgres] [--skip-duckdb]
                                [--out RESULTS.md]

The questions: the held-out corpus's MIN/MAX ones (``benchmarks.corpus.HELDOUT``: "max
distance", "per city: average and max", "count, average, min, max of one city") and the
corpus's "MIN and MAX, filtered".  Per backend, one engine on the demo's policy
(``demo_data.open_engine``: the default policy, a budget no run exhausts) and rounds alternating
the raw query and the three DP variants (in rotating order), at the policy's default epsilon;
medians.

The variants, in the same engine (:class:`Variant`): *before*, the behaviour before both
changes: a mixed query never finds its parts' choices (``Engine.choices.get`` answers nothing
for ``kinds.mixed.part_key`` keys), so it makes them again on every run, as the code did (its
choices were kept under a key nothing looked up), and every finish fills its scratch table
first (``kinds.quantile.finish_rows`` with no rows sent as one statement); *reuse*: each part
of a mixed query reuses its choices when they may be reused (kept by an earlier run of any
variant within ``privacy.choice_reuse_seconds``), a part without reusable choices choosing
afresh; *after*: that, and finishes of up to ``FINISH_VALUES_ROWS`` rows sent as one
statement.  A query of one kind reuses its choices in every variant.  The phases are
``benchmarks.phases``': choices (their statements in parentheses), the answer statements, the
proxy's rest (the draws, the finishes, the rules).  Shared 2-core machine: read the ratios;
the load average is in the results.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Hashable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import corpus  # noqa: E402
from benchmarks.demo_data import demo_engines, demo_options  # noqa: E402
from benchmarks.phases import Phases, Recorder, timed  # noqa: E402
from benchmarks.results import write_section  # noqa: E402
from chorus_py.engine import Engine  # noqa: E402
from chorus_py.kinds import quantile  # noqa: E402

#: (set, name) of the questions measured.
QUESTIONS = (("heldout", "max distance"), ("heldout", "per city: average and max"),
             ("heldout", "count, average, min, max of one city"),
             ("corpus", "MIN and MAX, filtered"))
VARIANTS = ("before", "reuse", "after")


def sql_of(questions: str, name: str) -> str:
    """The text of question ``name`` of the set ``questions``."""
    (query,) = [q for q in corpus.QUESTIONS[questions] if q.name == name]
    return query.sql


class Variant:
    """Switches ``engine`` to a variant of the module docstring for the calls inside the
    block: "before" finds no mixed part's choices, "before" and "reuse" send no finish as one
    statement, "after" is the code as it is."""

    def __init__(self, engine: Engine, variant: str) -> None:
        self.choices, self.variant = engine.choices, variant
        self.get = engine.choices.get
        self.values_rows = quantile.FINISH_VALUES_ROWS

    def __enter__(self) -> None:
        real = self.get

        def get(analyst: str, key: Hashable) -> Any:
            if isinstance(key, tuple) and key[:1] == ("mixed",):
                return None
            return real(analyst, key)

        if self.variant == "before":
            self.choices.get = get  # type: ignore[method-assign]
        if self.variant != "after":
            quantile.FINISH_VALUES_ROWS = 0

    def __exit__(self, *exc: object) -> None:
        self.choices.get = self.get  # type: ignore[method-assign]
        quantile.FINISH_VALUES_ROWS = self.values_rows


def bench(engine: Engine, recorder: Recorder, repeat: int
          ) -> dict[str, tuple[list[float], dict[str, list[Phases]]]]:
    """Per question: the raw times and each variant's phases, ``repeat`` rounds after a first
    DP run of each variant (not kept)."""
    out = {}
    for questions, name in QUESTIONS:
        sql = sql_of(questions, name)
        engine.backend.run(sql)
        for variant in VARIANTS:
            with Variant(engine, variant):
                engine.execute(sql, remaining=False)
        raw: list[float] = []
        runs: dict[str, list[Phases]] = {v: [] for v in VARIANTS}
        for done in range(repeat):
            raw.append(timed(engine.backend.run, sql))
            shift = done % len(VARIANTS)
            for variant in VARIANTS[shift:] + VARIANTS[:shift]:
                with Variant(engine, variant), recorder.measure() as phases:
                    engine.execute(sql, remaining=False)
                runs[variant].append(phases)
        out[name] = (raw, runs)
        print(f"{name}: raw {ms(raw):.1f} ms, " + ", ".join(
            f"{v} {ms([p.total for p in runs[v]]):.1f}" for v in VARIANTS), file=sys.stderr)
    return out


def ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def rows(label: str, results: dict[str, tuple[list[float], dict[str, list[Phases]]]]
         ) -> list[str]:
    """The table's rows of one backend: per question, each variant's value, "->" between."""
    lines = []
    for name, (raw, runs) in results.items():
        raw_ms = ms(raw)

        def part(what: str, runs: dict[str, list[Phases]] = runs) -> str:
            return " -> ".join(f"{ms([getattr(p, what) for p in runs[v]]):.1f}"
                               for v in VARIANTS)

        ratios = " -> ".join(f"{ms([p.total for p in runs[v]]) / raw_ms:.2f}" for v in VARIANTS)
        chose = " -> ".join(f"{sum(p.chose for p in runs[v])}/{len(runs[v])}" for v in VARIANTS)
        lines.append(f"| {label} | {name} | {raw_ms:.1f} | {part('total')} | {ratios} | "
                     f"{part('choices')} ({part('histograms')}); {chose} | {part('answer')} | "
                     f"{part('proxy')} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=7, help="rounds per question")
    demo_options(parser, "minmax_bench")
    args = parser.parse_args()
    load = [os.getloadavg()[0]]
    started = datetime.now(UTC)
    work = Path(tempfile.mkdtemp(prefix="chorus-minmax-"))
    lines = ["| backend | question | raw ms | DP ms (before -> reuse -> after) | DP / raw | "
             "choices ms (their statements ms); runs that chose | answer ms | proxy rest ms |",
             "|---|---|---|---|---|---|---|---|"]
    try:
        began = time.perf_counter()
        for label, engine in demo_engines(args, work, ("Postgres", "DuckDB")):
            print(f"{label}: ready in {time.perf_counter() - began:.0f} s", file=sys.stderr)
            recorder = Recorder()
            recorder.attach(engine)
            lines += rows(label, bench(engine, recorder, args.repeat))
            load.append(os.getloadavg()[0])
            began = time.perf_counter()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = ("## MIN / MAX with the default policy: mixed queries reuse their parts' choices, "
            "finishes in one statement (issue 23)\n\n"
            f"`python -m benchmarks.minmax --rows {args.rows} --repeat {args.repeat}` on "
            f"{started:%Y-%m-%d %H:%M} UTC: medians of {args.repeat} rounds (raw, then the DP "
            "variants before, reuse, after in rotating order) at the default epsilon, 1 engine "
            f"per backend; load average {' -> '.join(f'{x:.1f}' for x in load)} (start, after "
            "each backend) on the shared 2-core machine.\n\n" + "\n".join(lines))
    write_section("minmax", text, args.out)
    print(text)


if __name__ == "__main__":
    main()
