"""The choices' cells statement of a filtered query (issue 23): its forms side by side.
Writes the ``choice-cells`` section of benchmarks/RESULTS.md.

    python -m benchmarks.choice_cells [--rows 1000000] [--repeat 5] [--postgres URL]
                                      [--database NAME] [--skip-postgres] [--skip-duckdb]

A query with automatic caps and clipping bounds runs one statement for its private choices
the first time its text is seen (``rewriters.selection.choice_histogram``): over the query's
filtered rows, each unit's row count, a mark on one of its rows and its values' weights, by
windows partitioned by the unit, and each value's magnitude digit.  Its result is remembered
by its text, so this is the first run's cost (corpus: "first run").  Per backend, the demo
at ``--rows`` trips and one engine on the demo's policy; per query (filters over the whole
schedule down to its last week), ``--repeat`` rounds alternating the analyst's SQL straight
to the database (raw) and the statement in each form, medians:

- table: over the table's rows, each unit's rows numbered (``ROW_NUMBER() = 1`` marks one),
  the digits computed per row (the form a filter on the current date still takes);
- copy, digits computed: over the ranked copy, the mark on the unit's least stored rank;
- copy: the same, reading the magnitude digits the copy stores
  (``rewriters.selection.stored_digit_columns``);
- twin: the same over the copy's twin in unit order, partitioned by the stored unit row
  count then the unit (``kinds.single.cells_twin_pays`` picks it from half of the schedule);
- twin, two parts (Postgres): the same cut at the twin's middle stored count
  (``BoundedSamples.middle``) into the units of at most that many rows and the others, the two
  statements run side by side on two connections (``PostgresBackend.run_side_by_side``;
  picked from a quarter of the schedule).

Every form gives the same marginals (tests/test_choice_histogram.py,
tests/test_cells_parts.py); the engine runs the last form that applies.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
from collections.abc import Callable
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.demo_data import (  # noqa: E402
    RawQueries,
    demo_engines,
    demo_options,
    ranked_copy,
)
from benchmarks.phases import timed  # noqa: E402
from benchmarks.results import write_section  # noqa: E402
from chorus_py.backends import SCHEMA  # noqa: E402
from chorus_py.engine import Engine  # noqa: E402
from chorus_py.kinds.selection import CELLS, histogram_builders  # noqa: E402
from chorus_py.kinds.single import cells_twin_pays  # noqa: E402
from rewriters.contribution import UNIT_ORDER  # noqa: E402
from rewriters.dialect import dialect  # noqa: E402

#: (label, share of the schedule's 90 days read, SQL): filtered AVGs, whole quarter to a week.
QUERIES = [
    ("two averages, all", 90, "SELECT AVG(fare), AVG(distance_km), COUNT(*) FROM trips "
                              "WHERE distance_km > 0"),
    ("fare range, all", 90, "SELECT AVG(distance_km) FROM trips WHERE fare BETWEEN 10 AND 20"),
    ("February-March", 59, "SELECT AVG(fare) FROM trips WHERE pickup_time >= '2026-02-01' "
                           "AND distance_km > 1"),
    ("from mid-February", 45, "SELECT AVG(fare) FROM trips WHERE pickup_time >= '2026-02-15' "
                              "AND distance_km > 1"),
    ("March", 31, "SELECT AVG(fare) FROM trips WHERE pickup_time >= '2026-03-01' "
                  "AND distance_km > 1"),
    ("last week", 7, "SELECT AVG(fare) FROM trips WHERE pickup_time >= '2026-03-25' "
                     "AND distance_km > 1"),
]
FORMS = ("table", "copy, digits computed", "copy", "twin", "twin, two parts")
SPLIT = "twin, two parts"


def statements(engine: Engine, sql: str) -> dict[str, list[str]]:
    """The cells statement of ``sql`` in each form of ``FORMS`` (the last: its two parts, on
    Postgres only)."""
    _, prepared = engine.prepare(sql, "demo", 0.5, 1e-8)
    detail = prepared.detail
    copy = ranked_copy(engine, "trips")
    twin = (SCHEMA, copy + UNIT_ORDER)
    middle = engine.samples.middle(copy)
    sources: dict[str, tuple[tuple[str, str] | None, bool, list[tuple[bool, int] | None]]] = {
        "table": (None, False, [None]), "copy, digits computed": ((SCHEMA, copy), False, [None]),
        "copy": ((SCHEMA, copy), True, [None]), "twin": (twin, True, [None])}
    if middle is not None:
        sources[SPLIT] = (twin, True, [(False, middle), (True, middle)])
    out = {}
    for form, (source, digits, cuts) in sources.items():
        out[form] = []
        for part in cuts:
            (build,) = [b for what, _, b in histogram_builders(
                detail.query, detail.restriction, None, one_statement=True, copy=source,
                digits=digits, part=part) if what == CELLS]
            out[form].append(dialect(build(), engine.dialect).sql(engine.dialect))
    return out


def bench(engine: Engine, repeat: int) -> list[tuple[str, int, float, dict[str, float]]]:
    """Per query: (label, days read, raw ms, ms per form), medians."""
    results = []
    with closing(RawQueries(engine)) as raw_queries:
        for label, days, sql in QUERIES:
            forms = statements(engine, sql)
            runs: dict[str, Callable[[], object]] = {
                form: (lambda texts=texts: engine.backend.run_side_by_side(texts))
                for form, texts in forms.items()}
            raw_queries.run(sql)
            for run in runs.values():  # planned and cached once
                run()
            raw: list[float] = []
            times: dict[str, list[float]] = {form: [] for form in runs}
            for _ in range(repeat):
                raw.append(timed(raw_queries.run, sql))
                for form, run in runs.items():
                    times[form].append(timed(run))
            found = {form: statistics.median(t) * 1000 for form, t in times.items()}
            results.append((label, days, statistics.median(raw) * 1000, found))
            print(f"{label}: raw {results[-1][2]:.1f} ms, " + ", ".join(
                f"{form} {ms:.1f}" for form, ms in found.items()), file=sys.stderr)
    return results


def report(results: dict[str, list[tuple[str, int, float, dict[str, float]]]],
           args: argparse.Namespace, load: tuple[float, float], when: str) -> str:
    lines = [
        "## The choices' cells statement of a filtered query (issue 23): its forms side by "
        "side",
        "",
        f"Written by `python -m benchmarks.choice_cells --rows {args.rows} --repeat "
        f"{args.repeat}` on {when} UTC; {platform.machine()}, {os.cpu_count()} cores shared "
        f"with other jobs (load average {load[0]:.1f} at the start, {load[1]:.1f} at the end), "
        f"{args.rows:,} demo trips, the demo's default policy.  Medians of {args.repeat} "
        "rounds alternating the raw query and each form of the statement (the module's "
        "docstring says what each is); the engine runs the form in bold.",
        "",
        "| backend | query | days of 90 | raw ms | " + " | ".join(f"{f} ms" for f in FORMS)
        + " | engine's / table |",
        "|---|---|---|---|" + "---|" * len(FORMS) + "---|",
    ]
    for backend, rows in results.items():
        for label, days, raw, found in rows:
            chosen = ("twin" if SPLIT not in found else SPLIT) \
                if cells_twin_pays(days, 90, halves=SPLIT in found) else "copy"
            cells = ["-" if f not in found else f"**{found[f]:.1f}**" if f == chosen
                     else f"{found[f]:.1f}" for f in FORMS]
            lines.append(f"| {backend} | {label} | {days} | {raw:.1f} | " + " | ".join(cells)
                         + f" | {found[chosen] / found['table']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    demo_options(parser, "choice_cells_bench")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M")
    with tempfile.TemporaryDirectory() as tmp:
        results = {label: bench(engine, args.repeat)
                   for label, engine in demo_engines(args, Path(tmp))}
    write_section("choice-cells", report(results, args, (load, os.getloadavg()[0]), when),
                  args.out)

if __name__ == "__main__":
    main()
