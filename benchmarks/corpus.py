"""A corpus of 36 typical analyst questions on the demo's ride-sharing data: DP / raw time per
query with the policy a user gets by default, on Postgres and DuckDB.  Writes the ``corpus``
section of benchmarks/RESULTS.md.

    python -m benchmarks.corpus [--questions corpus|heldout] [--rows 1000000] [--repeat 5]
                                [--min-repeat 3] [--query-seconds 12] [--postgres URL]
                                [--database NAME] [--skip-postgres] [--skip-duckdb] [--out FILE]

Issue 23's held-out check reruns a corpus of 36 ride-sharing queries and compares the default
policy's end-to-end DP / raw ratio with other DP SQL tools'; benchmarks/run.py covers six
queries.  This one covers what analysts ask first: totals, filters on fare, distance, time and
city, GROUP BY city and calendar buckets, HAVING / ORDER BY / LIMIT, CASE bands, quantiles,
MIN/MAX, joins with riders and cities, per-rider questions and distinct drivers (``CORPUS``).
``--questions heldout`` asks 30 other questions kept out of the tuning (``HELDOUT``; section
``corpus-heldout``): a gain on the corpus that does not carry over shows there.

1. The demo (``generate_demo``) at ``--rows`` trips, in a DuckDB file and in a Postgres
   database ``--database`` created next to ``--postgres`` and dropped at the end.
2. Per backend one engine on the demo's own policy, unchanged but for a budget per block that
   no run exhausts (the default policy: automatic caps <= 200 and clipping bounds, per-query
   bounding from the ranked copy, choices reused for 10 minutes when not dominated by noise),
   warmed up as ``chorus serve`` starts (the ranked copy built).
3. Per query: a first run at the default epsilon (never-seen text: cold prepare, join
   frequencies, the private choices; shown apart), then rounds alternating the analyst's SQL
   straight to the database (raw), ``Engine.execute`` at the policy's default epsilon (what a
   user gets: an identical query reuses its choices when they were not dominated by noise) and
   at epsilon 0.01 (a noisier histogram: its choices are more often dominated by noise, then
   made again each run; how many runs made choices is in the results).  The rounds start once
   what the first run started building in the background (a grouped twin) is built: they
   measure the steady state, the first run the way there.  ``--repeat`` rounds,
   or ``--min-repeat`` once a query's rounds took ``--query-seconds`` (keeps the 1M run
   short).  Medians.  ``remaining=False``, as the wire protocol asks.
4. Where the time of a DP query goes (the worst ratios): the private choices (their histogram
   statements and the rules), the answer statement(s), other statements (plans checked once
   per shape, public keys, join frequencies), the ledger (the claim's decision and the wait
   for its durable commit, which overlaps the statements) and the proxy's own rest; the
   process's CPU time beside it.

Queries refused on a backend are listed with the refusal (run again, so the list says what the
proxy answers today) and replaced by the nearest form the proxy answers (``REFUSED``).
Shared, noisy machine: read ratios and medians; the load average is in the results.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.demo_data import (  # noqa: E402
    RawQueries,
    demo_on,
    demo_options,
    drop_database,
    open_engine,
)
from benchmarks.phases import Phases, Recorder, timed  # noqa: E402
from benchmarks.results import write_section  # noqa: E402
from benchmarks.run import percentile  # noqa: E402
from chorus_py.engine import Engine  # noqa: E402
from chorus_py.errors import ChorusError  # noqa: E402

LOW_EPSILON = 0.01


@dataclass(frozen=True)
class Query:
    """One analyst question, the same text on both backends."""

    name: str
    sql: str


CORPUS: tuple[Query, ...] = (
    # totals
    Query("count", "SELECT COUNT(*) FROM trips"),
    Query("sum", "SELECT SUM(fare) FROM trips"),
    Query("average", "SELECT AVG(fare) FROM trips"),
    Query("average and stddev", "SELECT AVG(distance_km), STDDEV(distance_km) FROM trips"),
    Query("distinct riders", "SELECT COUNT(DISTINCT rider_id) FROM trips"),
    # filters on fare, distance, time, city
    Query("count, fare filter", "SELECT COUNT(*) FROM trips WHERE fare > 50"),
    Query("average, distance range",
          "SELECT AVG(fare) FROM trips WHERE distance_km BETWEEN 5 AND 10"),
    Query("sum, city and month",
          "SELECT SUM(fare) FROM trips WHERE city = 'NYC' "
          "AND pickup_time >= '2026-02-01' AND pickup_time < '2026-03-01'"),
    Query("count, hours of the day",
          "SELECT COUNT(*) FROM trips WHERE EXTRACT(hour FROM pickup_time) BETWEEN 7 AND 9"),
    # GROUP BY a public column
    Query("per city: count", "SELECT city, COUNT(*) FROM trips GROUP BY city"),
    Query("per city: sum, ordered",
          "SELECT city, SUM(fare) AS revenue FROM trips GROUP BY city ORDER BY revenue DESC"),
    Query("per city: distinct riders",
          "SELECT city, COUNT(DISTINCT rider_id) FROM trips GROUP BY city"),
    Query("per city: variance, filtered",
          "SELECT city, VARIANCE(fare) FROM trips WHERE pickup_time >= '2026-03-01' "
          "GROUP BY city"),
    # GROUP BY calendar buckets
    Query("per month: count and sum",
          "SELECT DATE_TRUNC('month', pickup_time) AS month, COUNT(*), SUM(fare) "
          "FROM trips GROUP BY 1 ORDER BY 1"),
    Query("per hour: count",
          "SELECT EXTRACT(hour FROM pickup_time) AS hour, COUNT(*) FROM trips "
          "GROUP BY 1 ORDER BY 1"),
    Query("per weekday: average",
          "SELECT EXTRACT(dow FROM pickup_time) AS dow, AVG(fare) FROM trips "
          "GROUP BY 1 ORDER BY 1"),
    Query("per day of March: count",
          "SELECT CAST(pickup_time AS DATE) AS day, COUNT(*) FROM trips "
          "WHERE pickup_time >= '2026-03-01' GROUP BY 1 ORDER BY 1"),
    Query("per city and month: average",
          "SELECT city, DATE_TRUNC('month', pickup_time) AS month, AVG(fare) "
          "FROM trips GROUP BY 1, 2 ORDER BY 1, 2"),
    # HAVING, ORDER BY, top-N
    Query("HAVING count",
          "SELECT city, COUNT(*) AS n FROM trips GROUP BY city HAVING COUNT(*) > 50000 "
          "ORDER BY n DESC"),
    Query("top 3 cities by average, filtered",
          "SELECT city, AVG(fare) AS avg_fare FROM trips WHERE distance_km > 10 "
          "GROUP BY city HAVING AVG(fare) > 20 ORDER BY avg_fare DESC LIMIT 3"),
    Query("top 5 hours",
          "SELECT EXTRACT(hour FROM pickup_time) AS hour, COUNT(*) AS n FROM trips "
          "GROUP BY 1 ORDER BY n DESC LIMIT 5"),
    Query("top 10 drivers (thresholded keys)",
          "SELECT driver_id, COUNT(*) AS n FROM trips GROUP BY driver_id "
          "ORDER BY n DESC LIMIT 10"),
    # CASE
    Query("CASE bands",
          "SELECT CASE WHEN distance_km < 2 THEN 'short' WHEN distance_km < 10 THEN 'medium' "
          "ELSE 'long' END AS band, COUNT(*), AVG(fare) FROM trips GROUP BY 1"),
    Query("CASE conditional count",
          "SELECT SUM(CASE WHEN fare > 30 THEN 1 ELSE 0 END) AS expensive, COUNT(*) "
          "FROM trips"),
    Query("per city: CASE conditional sum",
          "SELECT city, SUM(CASE WHEN distance_km > 10 THEN fare ELSE 0 END) AS long_revenue "
          "FROM trips GROUP BY city"),
    # quantiles, MIN, MAX
    Query("median", "SELECT PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY fare) FROM trips"),
    Query("per city: 90th percentile",
          "SELECT city, PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY distance_km) AS p90 "
          "FROM trips GROUP BY city"),
    Query("MIN and MAX, filtered", "SELECT MIN(fare), MAX(fare) FROM trips WHERE city = 'SF'"),
    Query("per city: median and count",
          "SELECT city, PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY fare) AS median_fare, "
          "COUNT(*) FROM trips GROUP BY city"),
    # joins
    Query("join riders: per membership",
          "SELECT r.membership, COUNT(*), AVG(t.fare) FROM trips t "
          "JOIN riders r ON t.rider_id = r.rider_id GROUP BY r.membership"),
    Query("join riders: filter on signup",
          "SELECT COUNT(*) FROM trips t JOIN riders r ON t.rider_id = r.rider_id "
          "WHERE r.signup_date < DATE '2025-01-01'"),
    Query("join riders: distinct riders per home city",
          "SELECT r.home_city, COUNT(DISTINCT t.rider_id) FROM trips t "
          "JOIN riders r ON t.rider_id = r.rider_id GROUP BY r.home_city"),
    Query("join cities: per state",
          "SELECT c.state, SUM(t.fare) FROM trips t JOIN cities c ON t.city = c.city "
          "WHERE c.population > 1000000 GROUP BY c.state"),
    # per person
    Query("per rider: average trips",
          "WITH per AS (SELECT rider_id, COUNT(*) AS n FROM trips GROUP BY rider_id) "
          "SELECT AVG(n) FROM per"),
    Query("per rider: big spenders",
          "WITH per AS (SELECT rider_id, SUM(fare) AS spend FROM trips GROUP BY rider_id) "
          "SELECT COUNT(*) FROM per WHERE spend > 500"),
    # distinct values of a column other than the privacy unit
    Query("distinct drivers", "SELECT COUNT(DISTINCT driver_id) FROM trips"),
)

#: (backends, the analyst's first text, the corpus query answering instead, why): queries the
#: proxy refused while the corpus was written.  Each is run again (``refusals``) so the
#: results show the message given today.
#: (Empty today: ``SELECT COUNT(DISTINCT driver_id) FROM trips``, refused at first, is answered
#: since, and is back in the corpus as "distinct drivers".)
REFUSED: tuple[tuple[tuple[str, ...], str, str, str], ...] = ()

#: A second set, written after the corpus above had been used to tune the engine (2026-12-03,
#: night), and kept out of that tuning: each change is judged on ``CORPUS`` and then checked
#: here, so that a gain on the first set that does not carry over shows.  The same kinds of
#: question in other words and shapes: other filters and columns, a ratio of aggregates,
#: weeks, weekends, aggregate FILTER clauses, MAX of an unfiltered column, joins filtered on
#: the private side, a thresholded key with AVG.  ``--questions heldout``.
HELDOUT: tuple[Query, ...] = (
    Query("count, two cities", "SELECT COUNT(*) FROM trips WHERE city IN ('SF', 'LA')"),
    Query("average distance, fare range",
          "SELECT AVG(distance_km) FROM trips WHERE fare BETWEEN 10 AND 20"),
    Query("per city: average and max",
          "SELECT city, AVG(distance_km), MAX(fare) FROM trips GROUP BY city"),
    Query("ratio of sums", "SELECT SUM(fare) / COUNT(*) FROM trips"),
    Query("per city: fare per km",
          "SELECT city, SUM(fare) / SUM(distance_km) AS per_km FROM trips GROUP BY city"),
    Query("per week: count",
          "SELECT DATE_TRUNC('week', pickup_time) AS wk, COUNT(*) FROM trips "
          "GROUP BY 1 ORDER BY 1"),
    Query("per month: average",
          "SELECT EXTRACT(month FROM pickup_time) AS m, AVG(fare) FROM trips GROUP BY 1"),
    Query("count, two conditions",
          "SELECT COUNT(*) FROM trips WHERE fare > 20 AND distance_km < 3"),
    Query("per city: weekend count",
          "SELECT city, COUNT(*) FROM trips WHERE EXTRACT(dow FROM pickup_time) IN (0, 6) "
          "GROUP BY city"),
    Query("stddev, one city", "SELECT STDDEV(fare) FROM trips WHERE city = 'NYC'"),
    Query("per city: 25th percentile",
          "SELECT city, PERCENTILE_CONT(0.25) WITHIN GROUP (ORDER BY fare) FROM trips "
          "GROUP BY city"),
    Query("max distance", "SELECT MAX(distance_km) FROM trips"),
    Query("join riders: SF by membership",
          "SELECT r.membership, AVG(t.distance_km) FROM trips t JOIN riders r "
          "ON t.rider_id = r.rider_id WHERE t.city = 'SF' GROUP BY 1"),
    Query("distinct riders, late March",
          "SELECT COUNT(DISTINCT rider_id) FROM trips WHERE pickup_time >= '2026-03-15'"),
    Query("HAVING sum",
          "SELECT city, COUNT(*) AS n, SUM(fare) AS s FROM trips GROUP BY city "
          "HAVING SUM(fare) > 100000"),
    Query("CASE band by city",
          "SELECT CASE WHEN fare < 10 THEN 'cheap' ELSE 'pricey' END AS b, city, COUNT(*) "
          "FROM trips GROUP BY 1, 2"),
    Query("CASE conditional average",
          "SELECT AVG(CASE WHEN city = 'SF' THEN fare END) FROM trips"),
    Query("FILTER clause", "SELECT COUNT(*) FILTER (WHERE fare > 30), COUNT(*) FROM trips"),
    Query("per city, January: average",
          "SELECT city, AVG(fare) FROM trips WHERE pickup_time BETWEEN '2026-01-01' "
          "AND '2026-01-31' GROUP BY city"),
    Query("join cities: count in a state",
          "SELECT COUNT(*) FROM trips t JOIN cities c ON t.city = c.city WHERE c.state = 'CA'"),
    Query("join cities: distinct riders per state",
          "SELECT c.state, COUNT(DISTINCT t.rider_id) FROM trips t JOIN cities c "
          "ON t.city = c.city GROUP BY 1"),
    Query("top 5 drivers by average (thresholded keys)",
          "SELECT driver_id, AVG(fare) FROM trips GROUP BY driver_id ORDER BY 2 DESC LIMIT 5"),
    Query("per rider: average of averages",
          "WITH per AS (SELECT rider_id, AVG(fare) AS a FROM trips GROUP BY rider_id) "
          "SELECT AVG(a) FROM per"),
    Query("count, average, min, max of one city",
          "SELECT COUNT(*), AVG(fare), MIN(fare), MAX(fare) FROM trips WHERE city = 'LA'"),
    Query("per hour in SF: average distance",
          "SELECT EXTRACT(hour FROM pickup_time) AS h, AVG(distance_km) FROM trips "
          "WHERE city = 'SF' GROUP BY 1"),
    Query("average, two conditions",
          "SELECT AVG(fare) FROM trips WHERE city <> 'NYC' AND fare IS NOT NULL"),
    Query("per city: expensive trips, ordered",
          "SELECT city, COUNT(*) FROM trips WHERE fare > 100 GROUP BY city ORDER BY 2 DESC"),
    Query("one day", "SELECT COUNT(*) FROM trips WHERE CAST(pickup_time AS DATE) = "
          "DATE '2026-02-14'"),
    Query("sum, late hours in one city",
          "SELECT SUM(distance_km) FROM trips WHERE city = 'SEA' "
          "AND EXTRACT(hour FROM pickup_time) >= 22"),
    Query("two averages and a count, filtered",
          "SELECT AVG(fare), AVG(distance_km), COUNT(*) FROM trips WHERE distance_km > 0"),
)

QUESTIONS = {"corpus": CORPUS, "heldout": HELDOUT}
TITLES = {
    "corpus": "## A corpus of 36 analyst questions: DP / raw time with the default policy",
    "heldout": "## Held-out questions (30, kept out of tuning): DP / raw time with the default "
               "policy",
}


# -- the runs -------------------------------------------------------------------------------


@dataclass
class Cell:
    """One query on one backend: the first DP run (not in the medians) and the rounds."""

    first: Phases
    raw: list[float] = field(default_factory=list)
    dp: list[Phases] = field(default_factory=list)
    low: list[Phases] = field(default_factory=list)  # at LOW_EPSILON

    @property
    def raw_ms(self) -> float:
        return statistics.median(self.raw) * 1000

    def dp_ms(self, low: bool = False) -> float:
        return median_ms([p.total for p in (self.low if low else self.dp)])

    def ratio(self, low: bool = False) -> float:
        return self.dp_ms(low) / self.raw_ms


def median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def bench(label: str, engine: Engine, recorder: Recorder, args: argparse.Namespace,
          refused: list[str]) -> dict[str, Cell]:
    """Every question of the set on one backend: a first run, then alternating rounds (a
    refused question is added to ``refused`` and left out)."""
    cells: dict[str, Cell] = {}
    with contextlib.closing(RawQueries(engine)) as raw:
        for query in QUESTIONS[args.questions]:
            _bench_query(label, engine, recorder, args, refused, raw, query, cells)
    return cells


def _bench_query(label: str, engine: Engine, recorder: Recorder, args: argparse.Namespace,
                 refused: list[str], raw: RawQueries, query: Query,
                 cells: dict[str, Cell]) -> None:
    """``bench`` of one question: its cell added to ``cells``, or its refusal to ``refused``."""
    sql = query.sql
    raw.run(sql)  # the raw query's buffers and plan, as the DP run's
    try:
        with recorder.measure() as first:
            engine.execute(sql, remaining=False)
    except ChorusError as err:
        refused.append(f"- {label}: `{sql}`: refused: {type(err).__name__}: {err}.")
        return
    # (No first run at LOW_EPSILON: a median of >= 3 rounds absorbs its one new rewrite,
    # and the 1M run stays short.)
    cell = cells[query.name] = Cell(first)
    # The rounds measure the steady state: a stored relation the first run asked for (a
    # grouped twin, built in the background: seconds on 1M rows) is built before them, as
    # a server would have built it by the time the query is asked again a while later.
    engine.samples.wait()
    started = time.perf_counter()
    for done in range(1, args.repeat + 1):
        cell.raw.append(timed(raw.run, sql))
        with recorder.measure() as phases:
            engine.execute(sql, remaining=False)
        cell.dp.append(phases)
        with recorder.measure() as phases:
            engine.execute(sql, epsilon=LOW_EPSILON, remaining=False)
        cell.low.append(phases)
        if done >= args.min_repeat and time.perf_counter() - started > args.query_seconds:
            break
    print(f"{label} {query.name}: raw {cell.raw_ms:.1f} ms, DP {cell.dp_ms():.1f} "
          f"({cell.ratio():.2f}x), at {LOW_EPSILON} {cell.dp_ms(True):.1f} ms "
          f"({cell.ratio(True):.2f}x), {len(cell.raw)} rounds", file=sys.stderr)


def refusals(label: str, engine: Engine) -> list[str]:
    """Each refused text of ``REFUSED`` for this backend, run again: its message today."""
    lines = []
    for backends, sql, instead, why in REFUSED:
        if label not in backends:
            continue
        try:
            engine.execute(sql, remaining=False)
            outcome = "**answered now** (the corpus could use it again)"
        except ChorusError as err:
            outcome = f"refused: {type(err).__name__}: {err}"
        lines.append(f"- {label}: `{sql}`: {outcome}. Replaced by \"{instead}\": {why}.")
    return lines


# -- the report -----------------------------------------------------------------------------


def summary(label: str, cells: dict[str, Cell]) -> list[str]:
    """Median, p90 and max ratio of one backend, at the default epsilon, at LOW_EPSILON and
    on the first run."""
    lines = []
    for what, ratios in (
            ("default epsilon (choices reused when allowed)",
             [c.ratio() for c in cells.values()]),
            (f"epsilon {LOW_EPSILON}",
             [c.ratio(True) for c in cells.values()]),
            ("first run (never-seen text: cold prepare and the choices)",
             [c.first.total * 1000 / c.raw_ms for c in cells.values()])):
        lines.append(f"| {label} | {what} | {statistics.median(ratios):.2f} | "
                     f"{percentile(ratios, 0.9):.2f} | {max(ratios):.2f} |")
    return lines


def cause(cell: Cell) -> str:
    """The largest part of the DP run's time beyond the raw query's."""
    dp = cell.dp
    parts = {
        "choices": median_ms([p.choices for p in dp]),
        "answer beyond raw": median_ms([p.answer for p in dp]) - cell.raw_ms,
        "other statements": median_ms([p.other for p in dp]),
        "ledger": median_ms([p.ledger for p in dp]),
        "proxy": median_ms([p.proxy for p in dp]),
    }
    return max(parts, key=lambda k: parts[k])


def choices(runs: list[Phases]) -> str:
    """The median time making choices (and in their statements on the database), and in how
    many of the runs the query made its choices rather than reusing an earlier query's."""
    return (f"{median_ms([p.choices for p in runs]):.1f} "
            f"({median_ms([p.histograms for p in runs]):.1f}), "
            f"{sum(p.chose for p in runs)}/{len(runs)}")


def worst(label: str, cells: dict[str, Cell], sql: dict[str, str], count: int = 5
          ) -> list[str]:
    rows = []
    for name, cell in sorted(cells.items(), key=lambda kv: -kv[1].ratio())[:count]:
        dp, low, first = cell.dp, cell.low, cell.first
        rows.append(
            f"| {label} | {name}: `{sql[name]}` | {cell.raw_ms:.1f} | "
            f"{first.total * 1000:.1f} ({first.choices * 1000:.1f}; "
            f"{first.histograms * 1000:.1f}, {first.histogram_count}) | "
            f"{cell.dp_ms():.1f} | {cell.ratio():.2f} | {choices(dp)} | "
            f"{median_ms([p.answer for p in dp]):.1f} | "
            f"{median_ms([p.other for p in dp]):.1f} | {median_ms([p.ledger for p in dp]):.1f} | "
            f"{median_ms([p.proxy for p in dp]):.1f} | {median_ms([p.cpu for p in dp]):.1f} | "
            f"{choices(low)} | {cause(cell)} |")
    return rows


def report(args: argparse.Namespace, results: dict[str, dict[str, Cell]],
           refused: list[str], setup: list[str], load: tuple[float, float], made: str) -> str:
    labels = list(results)
    head = "| # | query | " + " | ".join(
        f"{b} raw ms | {b} first DP ms | {b} DP ms | {b} DP / raw | {b} DP ms at {LOW_EPSILON} "
        f"| {b} DP / raw at {LOW_EPSILON}" for b in labels) + " |"
    table = [head, "|---|---|" + "---|" * (6 * len(labels))]
    questions = QUESTIONS[args.questions]
    for i, query in enumerate(questions, 1):
        if any(query.name not in results[b] for b in labels):
            continue  # refused (listed below)
        cells = [results[b][query.name] for b in labels]
        table.append(f"| {i} | {query.name}: `{query.sql}` | " + " | ".join(
            f"{c.raw_ms:.1f} | {c.first.total * 1000:.1f} | {c.dp_ms():.1f} | {c.ratio():.2f} | "
            f"{c.dp_ms(True):.1f} | {c.ratio(True):.2f}" for c in cells) + " |")
    sums = ["| backend | DP / raw | median | p90 | max |", "|---|---|---|---|---|"]
    for label in labels:
        sums += summary(label, results[label])
    where = ["| backend | query | raw ms | first run ms (choices ms; their statements ms, n) "
             "| DP ms | DP / raw | choices ms (statements ms), runs that chose | answer ms | "
             "other statements ms | ledger ms | proxy rest ms | process CPU ms | "
             f"at {LOW_EPSILON}: choices ms (statements ms), runs that chose | largest part |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for label in labels:
        where += worst(label, results[label], {q.name: q.sql for q in questions})
    rounds = sorted({len(c.raw) for cells in results.values() for c in cells.values()})
    return "\n".join([
        TITLES[args.questions],
        "",
        f"Written by `python -m benchmarks.corpus --questions {args.questions} --rows "
        f"{args.rows} --repeat {args.repeat} "
        f"--min-repeat {args.min_repeat} --query-seconds {args.query_seconds:g}` on {made} "
        f"UTC; {platform.machine()}, {os.cpu_count()} cores shared with other engineers' jobs "
        f"(load average {load[0]:.1f} at the start, {load[1]:.1f} at the end), Python "
        f"{platform.python_version()}, {args.rows:,} demo trips. The demo's policy as "
        "`chorus demo` writes it (automatic caps <= 200 and clipping bounds, per-query "
        "bounding from the ranked copy, choices of an identical query reused for 10 minutes "
        "unless dominated by noise, noise drawn by the proxy on DuckDB and by the database on "
        "Postgres), the budget per block raised so that no run exhausts it. Raw: the "
        "analyst's SQL sent straight to the database. "
        "DP: `Engine.execute` at the policy's default epsilon (0.5; what a user gets), and at "
        f"epsilon {LOW_EPSILON} (noisier histograms: choices dominated by noise are made "
        "again by every run). Medians of "
        f"{'/'.join(str(r) for r in rounds)} alternating rounds (raw, DP, DP at "
        f"{LOW_EPSILON}) after a first run at the default epsilon, which is shown apart, and "
        "after what it started building in the background (a grouped twin) is built. "
        "Read the ratios.",
        "",
        *setup,
        "",
        "### Summary",
        "",
        *sums,
        "",
        "### Per query",
        "",
        *table,
        "",
        "### The worst five per backend: where the time goes",
        "",
        "First run: the query's first DP run (never-seen text: cold prepare, join "
        "frequencies, the private choices). "
        "Choices: making the private choices (automatic cap, clipping bounds, groups per "
        "rider): their histogram statements on the database (in parentheses; a histogram of "
        "the ranked copy's stored counts is run once and then read from memory, "
        "`Statements.run_stored`) and the choice rules in the proxy; none in a run that reused "
        "an identical earlier query's choices (not dominated by noise). Answer: the answer "
        "statement(s). Other statements: plans checked once per shape, public keys, join "
        "frequencies. Ledger: the claim until its decision plus the wait for its durable "
        "commit (which overlaps the statements). Proxy rest: everything else (prepare from "
        "the caches, the noise, the finish). Process CPU: the proxy process's CPU time, which "
        "on DuckDB includes the database's (in-process) threads. Largest part: the largest of "
        "these beyond the raw query's time (the answer counts only its excess over raw).",
        "",
        *where,
        "",
        "### Refused queries, and what replaced them",
        "",
        *(refused or ["None: every question of the corpus is answered as the analyst wrote it."]),
        "",
    ])


# -- main -----------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", choices=sorted(QUESTIONS), default="corpus",
                        help="corpus: the 36 questions the engine was tuned on (section "
                             "'corpus'); heldout: 30 questions kept out of that tuning "
                             "(section 'corpus-heldout')")
    demo_options(parser, "corpus_bench")
    parser.add_argument("--repeat", type=int, default=5, help="rounds per query")
    parser.add_argument("--min-repeat", type=int, default=3,
                        help="rounds per query once its rounds took --query-seconds")
    parser.add_argument("--query-seconds", type=float, default=12.0)
    args = parser.parse_args()
    if args.min_repeat < 1 or args.repeat < args.min_repeat:
        parser.error("need 1 <= --min-repeat <= --repeat")

    load_start = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="chorus-corpus-"))
    recorder = Recorder()
    results: dict[str, dict[str, Cell]] = {}
    refused: list[str] = []
    setup: list[str] = []
    text = ""
    backends = [b for b, skip in (("Postgres", args.skip_postgres),
                                  ("DuckDB", args.skip_duckdb)) if not skip]
    try:
        for label in backends:
            started = time.perf_counter()
            policy = demo_on(label, work, args)
            made = time.perf_counter() - started
            started = time.perf_counter()
            engine = open_engine(policy)
            warm = time.perf_counter() - started
            recorder.attach(engine)
            print(f"{label}: demo made in {made:.0f} s, engine opened and warmed up in "
                  f"{warm:.1f} s", file=sys.stderr)
            setup.append(f"- {label}: demo made in {made:.0f} s; engine opened and its ranked "
                         f"copy built in {warm:.1f} s.")
            try:
                results[label] = bench(label, engine, recorder, args, refused)
                refused += refusals(label, engine)
            finally:
                engine.close()
                if label == "Postgres":
                    drop_database(args)
            # Written after each backend, so that a run cut short keeps what it measured.
            load = (load_start, os.getloadavg()[0])
            text = report(args, results, refused, setup, load,
                          f"{datetime.now(UTC):%Y-%m-%d %H:%M}")
            write_section("corpus" if args.questions == "corpus" else "corpus-heldout", text,
                          args.out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if not args.skip_postgres:
            drop_database(args)
    print(text)


if __name__ == "__main__":
    main()
