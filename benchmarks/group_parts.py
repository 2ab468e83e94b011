"""Thresholded keys over the ranked copy: the answer's exact measurements of the corpus's worst
query (#22, ``SELECT driver_id, COUNT(*) AS n FROM trips GROUP BY driver_id ORDER BY n DESC
LIMIT 10``) in two parts (before: ``ranked_group_branches``, light n_u <= g and heavy n_u > g,
every heavy unit's groups scored by fresh draws, then a row cap) and in three
(``ranked_group_parts``: the middle units g < n_u <= k scored by their stored ranks, no fresh
draw and no row cap), sent straight to each database, side by side.  Writes the
``group-parts`` section of benchmarks/RESULTS.md.

    python -m benchmarks.group_parts [--rows 1000000] [--repeat 7] [--groups 13] [--cap 200]
                                     [--postgres URL] [--database NAME] [--out FILE]

g and k are fixed (the demo's choices at the default epsilon: 13 groups, 200 rows) so that
both shapes bound the same rows; the noise and the release, the same in both, are left out.
Raw: the analyst's SQL.  Rounds alternate raw, before, after;
medians.  Postgres aggregates the parts apart (``rewriters.pipeline.SPLIT_DIALECTS``), DuckDB
reads their UNION ALL under one aggregate; each backend is timed in the shape it runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from sqlglot import exp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from analyses.query import AggregateQuery  # noqa: E402
from benchmarks.demo_data import demo_on, demo_options, drop_database, open_engine  # noqa: E402
from benchmarks.results import write_section  # noqa: E402
from chorus_py.backends import SCHEMA  # noqa: E402
from chorus_py.engine import Engine  # noqa: E402
from rewriters.contribution import (  # noqa: E402
    GROUP_KEY,
    GROUP_RAND,
    GROUP_RANK,
    GROUP_SCORE,
    KEPT_RANK,
    ranked_group_branches,
)
from rewriters.dialect import dialect  # noqa: E402
from rewriters.pipeline import SPLIT_DIALECTS, combine_branches, filtered_rows, pipeline  # noqa: E402
from rewriters.safety import safety  # noqa: E402

QUERY = "SELECT driver_id, COUNT(*) AS n FROM trips GROUP BY driver_id ORDER BY n DESC LIMIT 10"


def statements(engine: Engine, g: int, k: int) -> tuple[str, str, str]:
    """(raw, before, after): the analyst's SQL, and the exact
    measurements at g groups and k rows per rider in two parts and in three."""
    query = engine._analyse(QUERY)
    assert isinstance(query, AggregateQuery)
    query = query.with_cap(k).with_groups(g)
    plan = engine.single._noise_plan(query, 0.5, 1e-7)
    restriction = engine.single._blocks(query)[1]
    copy = engine.single.services.samples.ranked(query.table, query.table_policy)
    assert copy is not None
    ranked = (SCHEMA, copy)
    after = pipeline(query, plan, restriction, engine.dialect, ranked=ranked).measure_sql()
    return QUERY, _before(query, plan, restriction, ranked, engine.dialect), after


def _before(query: AggregateQuery, plan: object, restriction: object,
            ranked: tuple[str, str], name: str) -> str:
    """The measurements as the pipeline wrote them before the middle part: light (n_u <= g)
    and heavy (n_u > g, fresh draws then the row cap), apart on Postgres, one UNION ALL on
    DuckDB (the light branch padded to the heavy one's columns)."""
    assert query.max_groups is not None and isinstance(query.table_policy.privacy_unit, str)
    rows = filtered_rows(query, restriction, None, ranked)  # type: ignore[arg-type]
    keys = [safety(key.expr) for key in query.keys]
    light, heavy = ranked_group_branches(rows, query.alias, query.table_policy.privacy_unit,
                                         keys, query.max_groups, query.stability)
    columns: list[exp.Expr] = [exp.alias_(safety(key.expr), key.id) for key in query.keys]
    columns += [exp.alias_(exp.Count(this=exp.Star()), m.id) for m in query.measurements]
    columns.append(exp.alias_(exp.Count(this=exp.Distinct(expressions=[
        exp.column(query.table_policy.privacy_unit, table=query.alias)])), "t0"))
    group = [safety(key.expr) for key in query.keys]

    def measure(branch: exp.Query) -> exp.Select:
        return exp.select(*[c.copy() for c in columns]).from_(
            branch.subquery(query.alias), copy=False).group_by(*[g.copy() for g in group])

    if name in SPLIT_DIALECTS:
        tree = combine_branches([measure(light), measure(heavy)],
                                [key.id for key in query.keys],
                                [(m.id, True) for m in query.measurements] + [("t0", True)])
    else:
        padding = [exp.alias_(exp.null(), f"{GROUP_KEY}{i}") for i in range(len(keys))]
        padding += [exp.alias_(exp.null(), GROUP_RAND), exp.alias_(exp.null(), GROUP_SCORE),
                    exp.alias_(exp.Literal.number(1), GROUP_RANK),
                    exp.alias_(exp.Literal.number(1), KEPT_RANK)]
        tree = measure(exp.union(light.select(*padding), heavy, distinct=False))
    return dialect(tree, name).sql(name)


def timed(run: Callable[[str], object], sql: str) -> float:
    started = time.perf_counter()
    run(sql)
    return (time.perf_counter() - started) * 1000


def bench(label: str, engine: Engine, run: Callable[[str], object], args: argparse.Namespace
          ) -> list[str]:
    raw, before, after = statements(engine, args.groups, args.cap)
    times: dict[str, list[float]] = {"raw": [], "before": [], "after": []}
    for sql in (raw, before, after):  # a first run of each, not counted (caches, plans)
        run(sql)
    for _ in range(args.repeat):
        for name, sql in (("raw", raw), ("before", before), ("after", after)):
            times[name].append(timed(run, sql))
    med = {name: statistics.median(values) for name, values in times.items()}
    print(f"{label}: {med}", file=sys.stderr)
    return [f"| {label} | {med['raw']:.1f} | {med['before']:.1f} | "
            f"{med['before'] / med['raw']:.2f} | {med['after']:.1f} | "
            f"{med['after'] / med['raw']:.2f} | {med['after'] / med['before']:.2f} |"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    demo_options(parser, "group_parts_bench", skips=False)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--groups", type=int, default=13, help="g, groups per rider")
    parser.add_argument("--cap", type=int, default=200, help="k, rows per rider")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="chorus-group-parts-"))
    lines: list[str] = []
    try:
        for label in ("Postgres", "DuckDB"):
            policy = demo_on(label, work, args)
            engine = open_engine(policy)
            try:
                lines += bench(label, engine, lambda sql, e=engine: e.backend.run(sql), args)
            finally:
                engine.close()
    finally:
        drop_database(args)
    text = "\n".join([
        "## Thresholded keys in three parts of the ranked copy (issue 23, corpus query 22)",
        "",
        f"Written by `python -m benchmarks.group_parts --rows {args.rows} --repeat "
        f"{args.repeat}` on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC (load average {load:.1f} "
        f"at the start, {os.getloadavg()[0]:.1f} at the end; 2 cores shared with other "
        "jobs: read the ratios).  The exact measurements of the top-10 drivers query at "
        f"g = {args.groups} groups and k = {args.cap} rows per rider, sent straight to the "
        "database: before, two parts (light n_u <= g; heavy n_u > g: groups scored by fresh "
        "draws, a row cap); after, three (the middle g < n_u <= k: groups scored by the "
        "stored ranks, no fresh draw, no row cap; heavy n_u > k as before).  Raw: the "
        "analyst's SQL on the table.  Medians of alternating rounds.",
        "",
        "| backend | raw ms | before ms | before / raw | after ms | after / raw | after / "
        "before |",
        "|---|---|---|---|---|---|---|",
        *lines,
    ])
    write_section("group-parts", text, args.out)


if __name__ == "__main__":
    main()
