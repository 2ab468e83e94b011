"""Multi-attribution contribution bounding: speed, distance from optimal, bias trade-off.

    python -m benchmarks.attribution [--rows 1000000] [--papers 50000] [--quick]

1. Rows per second on 1M rows: the demo trips with privacy_unit = ["rider_id", "driver_id"]
   and a 1M-paper co-authorship hypergraph (``chorus_py.demo.papers``): the vectorised greedy,
   the plain Python loop it replaces, and the whole ``chorus bound`` path on DuckDB (read the
   structure, choose, store S, check it in SQL) for greedy and for sql-rank (all in the database).
2. |S_greedy| / |S_ilp| for k = 2 and 3 on co-authorship instances where HiGHS proves the optimum
   (the paper, Section 5.3: about 98.7%).
3. greedy-balanced over a grid of (u, c1, c2) at k = 3: |S| against the mean number of authors
   per kept paper (the paper's Fig. 9), plotted to benchmarks/attribution.png.
Writes the "attribution" section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.results import write_section  # noqa: E402
from chorus_py.demo import generate_demo, generate_trips  # noqa: E402
from chorus_py.demo.papers import generate_papers  # noqa: E402
from chorus_py.engine import Engine  # noqa: E402
from rewriters.attribution import (  # noqa: E402
    Attribution,
    greedy,
    greedy_balanced,
    greedy_loop,
    greedy_sparse,
    ilp,
    random_order,
)

PLOT = Path(__file__).resolve().parent / "attribution.png"

# The demo trips protecting rider and driver (the demo policy itself protects riders only).
TRIPS_POLICY = """
[backend]
url = "duckdb:///demo.duckdb"

[privacy]
epsilon_per_block = 10.0

[tables.trips]
privacy_unit = ["rider_id", "driver_id"]
row_id = "trip_id"
max_rows_per_unit = 3
attribution_method = "greedy"

[tables.trips.columns]
trip_id   = { type = "int" }
rider_id  = { type = "int", private_id = true }
driver_id = { type = "int", private_id = true }
fare      = { type = "float", lower = 0, upper = 200 }
"""


def papers_structure(papers: int, seed: int, pool: float = 0.8,
                     sigma: float = 1.4) -> Attribution:
    table, pairs = generate_papers(papers, seed, pool, sigma)
    return Attribution.from_pairs(table["paper_id"], pairs["paper_id"], pairs["author_id"])


def trips_structure(rows: int, seed: int) -> Attribution:
    trips = generate_trips(rows, seed)
    # Riders and drivers share one id space in the policy (a value names one unit): offset
    # the drivers so the benchmark measures two disjoint kinds of units.
    ids = trips["trip_id"]
    return Attribution.from_columns(ids, [trips["rider_id"], trips["driver_id"] + 10**9],
                                    [np.zeros(len(ids), bool)] * 2)


def sql_rank_in_memory(att: Attribution, k: int, seed: int) -> np.ndarray:
    """What sql-rank keeps (rank <= k in every unit), computed in numpy for the ratio table."""
    position = random_order(att.n_rows, seed)
    order = np.lexsort((position[att.pair_row], att.pair_unit))
    unit = att.pair_unit[order]
    start = np.flatnonzero(np.r_[True, unit[1:] != unit[:-1]])
    rank = np.arange(len(unit)) - np.repeat(start, np.diff(np.r_[start, len(unit)]))
    worst = np.zeros(att.n_rows, dtype=np.int64)
    np.maximum.at(worst, att.pair_row[order], rank)
    return (worst < k) & (att.degrees() > 0)


def timed(fn, repeat: int = 3) -> tuple[float, object]:  # type: ignore[no-untyped-def]
    best, out = float("inf"), None
    for _ in range(repeat):
        started = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - started)
    return best, out


def throughput(rows: int, quick: bool) -> list[str]:
    lines = ["| data (1 row = 1 trip or paper) | method | rows | seconds | rows / s | kept |",
             "|---|---|---|---|---|---|"]
    for label, att in (("trips: rider + driver", trips_structure(rows, 1)),
                       ("papers: 1-10 authors", papers_structure(rows, 1))):
        for k in (3,):
            t, sel = timed(lambda att=att, k=k: greedy(att, k, seed=1), 1 if quick else 3)
            lines.append(f"| {label} ({len(att.pair_row) / att.n_rows:.2f} units/row) | "
                         f"greedy, vectorised, k={k} | {att.n_rows:,} | {t:.2f} | "
                         f"{att.n_rows / t:,.0f} | {sel.keep.sum():,} ({sel.rounds} rounds) |")
            position = random_order(att.n_rows, 1)
            t, keep = timed(lambda att=att, k=k, p=position: greedy_loop(att, p, k), 1)
            lines.append(f"| {label} | greedy, Python loop, k={k} | {att.n_rows:,} | {t:.2f} | "
                         f"{att.n_rows / t:,.0f} | {keep.sum():,} |")
    with tempfile.TemporaryDirectory() as tmp:
        policy = generate_demo(Path(tmp), rows=rows)
        policy.write_text(TRIPS_POLICY)
        with Engine.from_policy(policy) as engine:
            tp = engine.policy.tables["trips"]
            store = engine.attribution
            for method in ("greedy", "sql-rank"):
                # What the proxy does when the table changed: choose, store S, check it in SQL.
                t, _ = timed(lambda m=method: store._build("trips", tp, "trips__attr_bench", m,
                                                           1), 1)
                (kept,) = engine.backend.run(
                    'SELECT COUNT(*) FROM chorus_private."trips__attr_bench"').rows[0]
                lines.append(f"| trips, DuckDB, proxy rebuild of S (read, choose, store, check) "
                             f"| {method}, k=3 | {rows:,} | {t:.2f} | {rows / t:,.0f} | "
                             f"{kept:,} |")
                # `chorus bound` also reads the structure back for the owner's summary.
                t, summary = timed(lambda m=method: store.bound("trips", tp, m, seed=1), 1)
                lines.append(f"| trips, DuckDB, `chorus bound` (the above + owner summary) | "
                             f"{method}, k=3 | {rows:,} | {t:.2f} | {rows / t:,.0f} | "
                             f"{summary.kept:,} |")  # type: ignore[attr-defined]
    return lines


def optimality(sizes: list[int], seeds: int,
               time_limit: float) -> tuple[list[str], dict[str, list[float]]]:
    lines = ["| instance | k | ILP |S| (optimal) | greedy |S| (median of 5 orders) | greedy / ILP "
             "| greedy-sparse / ILP | sql-rank / ILP | ILP seconds |",
             "|---|---|---|---|---|---|---|---|"]
    ratios: dict[str, list[float]] = {}
    # The demo's co-authorship (0.8 authors per paper, productivity sigma 1.4), a sparser one
    # (4 authors per paper, sigma 1.0: fewer conflicts), and the trips' rider + driver.
    cases = [(f"{n:,} papers", lambda n=n, s=s: papers_structure(n, 100 + s))
             for n in sizes for s in range(seeds)]
    cases += [(f"{n:,} papers, sparse", lambda n=n: papers_structure(n, 200, 4.0, 1.0))
              for n in sizes]
    cases += [(f"{n:,} trips", lambda n=n: trips_structure(n, 300)) for n in (sizes[-1],)]
    for label, make in cases:
        att = make()
        for k in (2, 3):
            started = time.perf_counter()
            best = ilp(att, k, time_limit)
            seconds = time.perf_counter() - started
            if not best.optimal:
                lines.append(f"| {label} | {k} | time limit hit | | | | | {seconds:.1f} |")
                continue
            opt = int(best.keep.sum())
            kept = statistics.median(int(greedy(att, k, s).keep.sum()) for s in range(5))
            sparse = statistics.median(int(greedy_sparse(att, k, s).keep.sum())
                                       for s in range(5))
            rank = statistics.median(int(sql_rank_in_memory(att, k, s).sum())
                                     for s in range(5))
            family = label.split(" ", 1)[1]
            ratios.setdefault(f"greedy on {family}", []).append(kept / opt)
            ratios.setdefault(f"greedy-sparse on {family}", []).append(sparse / opt)
            lines.append(f"| {label} | {k} | {opt:,} | {kept:,.0f} | {kept / opt:.2%} | "
                         f"{sparse / opt:.2%} | {rank / opt:.2%} | {seconds:.1f} |")
    return lines, ratios


def balanced_grid(papers: int) -> tuple[list[str], list[tuple[str, int, float]]]:
    att = papers_structure(papers, 7)
    degree = att.degrees()
    points = []
    plain = greedy(att, 3, seed=1).keep
    points.append(("greedy", int(plain.sum()), float(degree[plain].mean())))
    sparse = greedy_sparse(att, 3, seed=1).keep
    points.append(("greedy-sparse", int(sparse.sum()), float(degree[sparse].mean())))
    settings = [(u, 1, c2) for u in (1, 2, 3, 4) for c2 in (1, 2, 5, 10)] + \
        [(u, c1, 1) for u in (1, 2, 3, 4) for c1 in (2, 5, 10)]
    for u, c1, c2 in settings:
        keep = greedy_balanced(att, 3, seed=1, u=u, c1=c1, c2=c2).keep
        points.append((f"u={u} c1={c1} c2={c2}", int(keep.sum()), float(degree[keep].mean())))
    front = _pareto(points)
    lines = [f"{papers:,} papers, mean {degree.mean():.2f} authors per paper in the table; "
             f"k = 3; {len(settings)} settings. Pareto-optimal ones (no other setting keeps more "
             "papers *and* more authors per paper):", "",
             "| setting | |S| | |S| / greedy | mean authors per kept paper |", "|---|---|---|---|"]
    for name, size, mean in sorted(front, key=lambda p: -p[1]):
        lines.append(f"| {name} | {size:,} | {size / points[0][1]:.1%} | {mean:.2f} |")
    _plot(points, front)
    return lines, points


def _pareto(points: list[tuple[str, int, float]]) -> list[tuple[str, int, float]]:
    return [p for p in points if not any(q[1] >= p[1] and q[2] >= p[2] and q != p
                                         and (q[1] > p[1] or q[2] > p[2]) for q in points)]


def _plot(points: list[tuple[str, int, float]], front: list[tuple[str, int, float]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter([p[1] for p in points[2:]], [p[2] for p in points[2:]], s=18, color="0.6",
               label="greedy-balanced (u, c1, c2)")
    ordered = sorted(front, key=lambda p: p[1])
    ax.plot([p[1] for p in ordered], [p[2] for p in ordered], "-o", color="tab:blue", ms=4,
            label="Pareto front")
    ax.scatter([points[0][1]], [points[0][2]], marker="*", s=140, color="tab:red",
               label="greedy (random order)", zorder=3)
    ax.scatter([points[1][1]], [points[1][2]], marker="D", s=50, color="tab:green",
               label="greedy-sparse", zorder=3)
    ax.set_xlabel("|S|: papers kept (k = 3)")
    ax.set_ylabel("mean authors per kept paper")
    ax.set_title("Size against bias: greedy-balanced on the co-authorship hypergraph")
    ax.legend()
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--papers", type=int, default=50_000)
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    args = parser.parse_args()
    rows = 50_000 if args.quick else args.rows
    sizes = [1000] if args.quick else [2000, 10000, 50000]
    seeds = 1 if args.quick else 2

    speed = throughput(rows, args.quick)
    print("\n".join(speed))
    ratio_lines, ratios = optimality(sizes, seeds, 30.0 if args.quick else 60.0)
    print("\n".join(ratio_lines))
    grid_lines, _ = balanced_grid(5000 if args.quick else args.papers)
    print("\n".join(grid_lines))
    summary = "; ".join(
        f"{name}: median {statistics.median(r):.2%} (min {min(r):.2%}, {len(r)} instances)"
        for name, r in ratios.items() if r) or \
        "the ILP finished on no instance"
    write_section("attribution", "\n".join([
        "## Multi-attribution bounding: speed, distance from optimal, bias trade-off",
        "",
        "`python -m benchmarks.attribution` (machine: 2 shared cores). Rows per second (best of "
        "3 runs for the in-memory greedy, one run otherwise):",
        "",
        *speed,
        "",
        "|S| against the exact optimum (HiGHS proves it; the paper reports about 98.7% for "
        f"its random-order greedy on arXiv, our target is >= 98%): {summary}.",
        "",
        *ratio_lines,
        "",
        "Reading: the paper's random-order greedy stays well below 98% on our synthetic "
        "co-authorship, whose skewed author productivity makes many papers compete for the "
        "same authors' k slots (the sparser variant gets closer; on trips, drivers are the "
        "bottleneck and every method is optimal). Putting rows of rarely seen units first "
        "(`greedy-sparse`) meets the target on every instance, and HiGHS itself proves the "
        "optimum in seconds up to 50,000 papers, so `ilp` is usable there. sql-rank keeps "
        "much less: a row needs rank <= k in *every* unit. The vectorised greedy is "
        "1.2-3x faster than the plain loop (fewer rounds on trips than on papers); reading "
        "the structure out of the database dominates the proxy's rebuild, which sql-rank "
        "avoids.",
        "",
        "greedy-balanced (the paper's bias mitigation):",
        "",
        *grid_lines,
        "",
        "![size against mean authors per paper](attribution.png)",
    ]))


if __name__ == "__main__":
    main()
