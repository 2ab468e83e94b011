"""DP quantiles on the demo trips: rank error against the true quantile, exponential mechanism
(analytic, the default) side by side with sensitivity sampling (random DP, opt-in).

    python -m benchmarks.quantiles [--rows 1000000] [--runs 25] [--joint | --caps]

For MEDIAN(fare), PERCENTILE_CONT(0.9) of fare, MEDIAN(distance_km) and MIN(fare) (the DP 1st
percentile) at epsilon 0.1, 0.5 and 1, each run asks the query through ``Engine.execute`` and
takes the answer's *rank error* |F(answer) - p|, F the empirical CDF of the column over every
trip (the truth, before the cap of rows per rider), and its value error |answer - true
p-quantile|.  The table shows medians over --runs runs.  Both modes see the same neighbours (one
rider's rows, at most the policy's limit k = 200 of them) and the same declared bounds; the
sampled mode draws its sensitivity from the sampling distribution P declared below (fares and
distances uniform on their bounds: the owner knows no more), gamma 0.05.

The demo policy is used as generated, with a budget large enough for every run and the noise
drawn by the proxy (the quantile kind always draws in the proxy).  Writes the "quantiles"
section of benchmarks/RESULTS.md; with --joint, the "quantiles-joint" section instead: several
quantiles of fare in one query, the joint exponential mechanism against independent draws;
with --caps, the "quantiles-caps-<rows>" section: the automatic row cap (contribution = "auto",
``mechanisms.quantile_cap``) against the policy's limit k = 200 (contribution = "fixed"), for
a city median, MIN and MAX, and medians grouped by keys without public values.
"""

from __future__ import annotations

import argparse
import bisect
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.results import write_section  # noqa: E402
from chorus_py.demo import generate_demo  # noqa: E402
from chorus_py.engine import Engine  # noqa: E402
from chorus_py.errors import ChorusError  # noqa: E402
from chorus_py.policy import load_policy  # noqa: E402

# (label, column, p, query)
QUERIES = [
    ("MEDIAN(fare)", "fare", 0.5, "SELECT MEDIAN(fare) FROM trips"),
    ("PERCENTILE_CONT(0.9) fare", "fare", 0.9,
     "SELECT PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY fare) FROM trips"),
    ("MEDIAN(distance_km)", "distance_km", 0.5, "SELECT MEDIAN(distance_km) FROM trips"),
    ("MIN(fare) = 1st percentile", "fare", 0.01, "SELECT MIN(fare) FROM trips"),
]
EPSILONS = (0.1, 0.5, 1.0)
#: n of the sampled databases: m (n + k) = 2000 x 20,200 rows stays under the proxy's 50 million
#: per query.  Smaller than the table, so the sampled sensitivity is if anything too large (a
#: quantile of fewer rows moves more): in the sampled mode's favour on privacy, not accuracy.
SAMPLED_ROWS = 20_000
SAMPLING = """
[tables.trips.sampling]
rows = {rows}
columns.fare = {{ distribution = "uniform", lower = 0, upper = 200 }}
columns.distance_km = {{ distribution = "uniform", lower = 0, upper = 100 }}
"""


def engine_for(directory: Path, rows: int) -> Engine:
    """The demo policy with a budget for every run, proxy noise and a sampling P for trips."""
    path = directory / "policy.toml"
    text = path.read_text()
    text = re.sub(r"(?m)^epsilon_per_block = .*$", "epsilon_per_block = 1e9", text)
    text = re.sub(r"(?m)^max_epsilon_per_query = .*$", "max_epsilon_per_query = 10.0", text)
    text = re.sub(r'(?m)^noise = "sql"', 'noise = "proxy"', text)
    text = re.sub(r'(?m)^ledger = .*$', 'ledger = "sqlite:///:memory:"', text)
    text = text.replace("[tables.trips.columns]", SAMPLING.format(rows=rows).strip()
                        + "\n\n[tables.trips.columns]", 1)
    bench = directory / "quantiles-policy.toml"
    bench.write_text(text)
    return Engine(load_policy(bench))


def rank_error(sorted_values: list[float], answer: float, p: float) -> float:
    """|F(answer) - p|, F the empirical CDF (mid-rank for ties)."""
    below = bisect.bisect_left(sorted_values, answer)
    upto = bisect.bisect_right(sorted_values, answer)
    return abs((below + upto) / 2 / len(sorted_values) - p)


def measure(engine: Engine, runs: int) -> list[dict[str, object]]:
    """Median rank and value errors per (query, epsilon, mode)."""
    columns = {c: sorted(float(r[0]) for r in engine.backend.run(
        f"SELECT {c} FROM trips WHERE {c} IS NOT NULL").rows) for c in ("fare", "distance_km")}
    out = []
    for label, column, p, sql in QUERIES:
        values = columns[column]
        truth = values[min(int(p * len(values)), len(values) - 1)]
        for eps in EPSILONS:
            for mode in ("analytic", "sampled"):
                ranks, errors, seconds = [], [], []
                refused = None
                for _ in range(runs):
                    started = time.monotonic()
                    try:
                        result = engine.execute(sql, analyst=None, epsilon=eps,
                                                sensitivity=mode)
                    except ChorusError as err:
                        refused = str(err)
                        break
                    seconds.append(time.monotonic() - started)
                    answer = float(result.rows[0][0])
                    ranks.append(rank_error(values, answer, p))
                    errors.append(abs(answer - truth))
                out.append({"query": label, "epsilon": eps, "mode": mode, "truth": truth,
                            "rank": statistics.median(ranks) if ranks else None,
                            "value": statistics.median(errors) if errors else None,
                            "seconds": statistics.median(seconds) if seconds else None,
                            "refused": refused})
                print(out[-1], flush=True)
    return out


# Several quantiles of fare in one query: (label, ps, SQL).  Each is answered through
# ``Engine.execute`` (the joint exponential mechanism) and, side by side on the same exact
# histogram, by one exponential mechanism per quantile at epsilon / m (what the kind did before).
SETS = [
    ("MEDIAN, 90th", (0.5, 0.9)),
    ("quartiles", (0.25, 0.5, 0.75)),
    ("MIN, MEDIAN, MAX", (0.01, 0.5, 0.99)),
    ("5 percentiles", (0.1, 0.25, 0.5, 0.75, 0.9)),
    ("deciles", tuple(i / 10 for i in range(1, 10))),
]
K = 200  # the demo's max_rows_per_unit (no rider has more trips: the cap never binds)


def _set_sql(ps: tuple[float, ...]) -> str:
    return "SELECT " + ", ".join(f"PERCENTILE_CONT({p:g}) WITHIN GROUP (ORDER BY fare)"
                                 for p in ps) + " FROM trips"


def measure_joint(engine: Engine, runs: int) -> list[dict[str, object]]:
    """Median (over runs and the set's quantiles) rank error of joint and independent draws."""
    import numpy as np

    from chorus_py.kinds.quantile import BINS
    from mechanisms.exponential import (
        ExponentialMechanism,
        bin_value,
        rank_sensitivity,
        rank_utility,
    )

    values = sorted(float(r[0]) for r in engine.backend.run(
        "SELECT fare FROM trips WHERE fare IS NOT NULL").rows)
    lower, upper = 0.0, 200.0  # the demo policy's bounds of fare
    counts = np.histogram(np.clip(values, lower, upper), bins=BINS, range=(lower, upper))[0]
    counts = counts.astype(float)
    out = []
    for label, ps in SETS:
        for eps in EPSILONS:
            joint, independent, seconds = [], [], []
            for _ in range(runs):
                started = time.monotonic()
                result = engine.execute(_set_sql(ps), analyst=None, epsilon=eps)
                seconds.append(time.monotonic() - started)
                assert result.report.measurements[0].mechanism["name"] == "joint_exponential"
                joint += [rank_error(values, float(a), p)
                          for a, p in zip(result.rows[0], ps, strict=True)]
                for p in ps:
                    mechanism = ExponentialMechanism(eps / len(ps), rank_sensitivity(p, K))
                    drawn = mechanism.sample(rank_utility(counts, p))
                    answer = bin_value(drawn, BINS, lower, upper, False)
                    independent.append(rank_error(values, answer, p))
            out.append({"set": label, "m": len(ps), "epsilon": eps,
                        "joint": statistics.median(joint),
                        "independent": statistics.median(independent),
                        "seconds": statistics.median(seconds)})
            print(out[-1], flush=True)
    return out


# The automatic cap against the fixed limit: (label, SQL, p per quantile column, per city).
CAP_QUERIES = [
    ("MEDIAN(fare) per city", "SELECT city, MEDIAN(fare) FROM trips GROUP BY city", (0.5,), True),
    ("MIN(fare), MAX(fare)", "SELECT MIN(fare), MAX(fare) FROM trips", (0.01, 0.99), False),
]
# Keys without public values: (label, SQL, whether city loses its public values).
GATED = [
    ("MEDIAN(fare) per driver_id", "SELECT driver_id, MEDIAN(fare) FROM trips GROUP BY driver_id",
     False),
    ("MEDIAN(fare) per city, city without public_values",
     "SELECT city, MEDIAN(fare) FROM trips GROUP BY city", True),
]
CAP_EPSILONS = (0.5, 1.0)
#: The reading of the "quantiles-caps" sections (from the runs of 2026-12-03).
READING_CAPS = ("Reading it: at k = 200 a median's 95% rank bound is 2 k max(p, 1 - p) ln(B / "
                "beta) / epsilon = 4,882 trips at epsilon 0.5, more than a small city's trips "
                'on 20,000 rows. The automatic cap trades that for the trips of heavy riders: '
                'on 20,000 trips (about 2,200 riders, median 5 trips) it keeps 6 to 20 trips '
                'per rider and the bound falls 10 to 30 fold; on 1,000,000 trips (110,000 '
                'riders) many more riders lie above any small k, so k stays near 100 and the '
                'bound halves. The selection is one more scan (the auto seconds). Drivers '
                '(about 200 trips each) stay below every threshold at these epsilons; a key '
                'with few large groups (city declared without public values) is released '
                'through the distinct-rider gate where the row gate at k = 200 releases '
                'nothing on 20,000 trips.')
CAP_DELTA = 1e-8


def caps_engine(directory: Path, contribution: str, public_city: bool = True) -> Engine:
    """The demo policy with a budget for every run, the trips' cap mode ``contribution``, and
    (``public_city`` False) city declared without its public values."""
    path = directory / "policy.toml"
    text = path.read_text()
    text = re.sub(r"(?m)^epsilon_per_block = .*$", "epsilon_per_block = 1e9", text)
    text = re.sub(r"(?m)^delta_per_block = .*$", "delta_per_block = 0.01", text)
    text = re.sub(r"(?m)^max_epsilon_per_query = .*$", "max_epsilon_per_query = 10.0", text)
    text = re.sub(r'(?m)^ledger = .*$', 'ledger = "sqlite:///:memory:"', text)
    text = re.sub(r'(?m)^contribution = "auto"', f'contribution = "{contribution}"', text,
                  count=1)  # the trips table's (the first declared)
    if not public_city:
        text = re.sub(r'(?m)^city(\s*)= \{ type = "text", public_values = \[[^]]*\] \}',
                      r'city\1= { type = "text" }', text, count=1)
    bench = directory / f"caps-{contribution}-{public_city}.toml"
    bench.write_text(text)
    return Engine(load_policy(bench))


def measure_caps(directory: Path, runs: int) -> tuple[list[dict[str, object]],
                                                       list[dict[str, object]]]:
    """Rank errors (median over runs and cities or quantiles) and caps, fixed against auto;
    then the groups released by keys without public values."""
    out, gated = [], []
    for mode in ("fixed", "auto"):
        engine = caps_engine(directory, mode)
        try:
            by_city: dict[object, list[float]] = {}
            for city, fare in engine.backend.run(
                    "SELECT city, fare FROM trips WHERE fare IS NOT NULL").rows:
                by_city.setdefault(city, []).append(float(fare))
            every = sorted(v for values in by_city.values() for v in values)
            for values in by_city.values():
                values.sort()
            for label, sql, ps, per_city in CAP_QUERIES:
                for eps in CAP_EPSILONS:
                    ranks, rows_off, caps, seconds = [], [], [], []
                    for _ in range(runs):
                        started = time.monotonic()
                        result = engine.execute(sql, analyst=None, epsilon=eps)
                        seconds.append(time.monotonic() - started)
                        contribution = result.report.contribution
                        caps.append(contribution.cap if contribution is not None
                                    and contribution.cap is not None else 200)
                        for row in result.rows:
                            values = by_city[row[0]] if per_city else every
                            answers = row[1:] if per_city else row
                            for answer, p in zip(answers, ps, strict=True):
                                error = rank_error(values, float(answer), p)
                                ranks.append(error)
                                rows_off.append(error * len(values))
                    bound = [m.mechanism.get("rank_error_95") for m in result.report.measurements]
                    out.append({"query": label, "epsilon": eps, "mode": mode,
                                "rank": statistics.median(ranks),
                                "rows": statistics.median(rows_off),
                                "cap": statistics.median(caps), "bound": bound[0],
                                "seconds": statistics.median(seconds)})
                    print(out[-1], flush=True)
        finally:
            engine.close()
        for label, sql, private_city in GATED:
            engine = caps_engine(directory, mode, public_city=not private_city)
            try:
                key = sql.split()[1].rstrip(",")
                groups = len(engine.backend.run(f"SELECT DISTINCT {key} FROM trips").rows)
                for eps in CAP_EPSILONS:
                    released, caps = [], []
                    taus: dict[str, list[float]] = {}  # by what the gate counted
                    for _ in range(runs):
                        result = engine.execute(sql, analyst=None, epsilon=eps,
                                                delta=CAP_DELTA)
                        released.append(len(result.rows))
                        release = result.report.key_release
                        gate = next(m for m in result.report.measurements if m.id == "t0")
                        counted = "riders" if "DISTINCT" in gate.aggregate else "rows"
                        assert release is not None and release.threshold is not None
                        taus.setdefault(counted, []).append(release.threshold)
                        contribution = result.report.contribution
                        caps.append(contribution.cap if contribution is not None
                                    and contribution.cap is not None else 200)
                    gated.append({"query": label, "epsilon": eps, "mode": mode,
                                  "groups": groups, "released": statistics.mean(released),
                                  "tau": "; ".join(
                                      f"{statistics.median(t):,.0f} {c} ({len(t)} runs)"
                                      for c, t in sorted(taus.items())),
                                  "cap": statistics.median(caps)})
                    print(gated[-1], flush=True)
            finally:
                engine.close()
    return out, gated


def render_caps(rows: list[dict[str, object]], gated: list[dict[str, object]], n_rows: int,
                runs: int, load: str) -> str:
    """The "quantiles-caps" section."""
    lines = [
        "## DP quantiles: the automatic row cap against the fixed limit (issue 24)",
        "",
        f"`python -m benchmarks.quantiles --caps --rows {n_rows} --runs {runs}` on "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: the demo trips ({n_rows:,} "
        "rows, DuckDB, load average " + load + " on the shared 2-core machine). *Fixed*: "
        "contribution = \"fixed\", every quantile at the limit k = 200 trips per rider (the "
        "behaviour before). *Auto*: contribution = \"auto\", 10% of epsilon "
        "(privacy.cap_epsilon_share) on a noisy histogram of trips per rider, k chosen to "
        "minimise rows dropped + the exponential mechanism's rank error "
        "(mechanisms.quantile_cap), the quantiles drawn at Delta of that k. Rank error: "
        "|F(answer) - p|, F the empirical CDF of fare over every trip (of the city, per city); "
        "*rows off*: the same in rows (times the trips of the city, or of all). Medians over "
        f"{runs} runs (and the 5 cities, or MIN and MAX). *95% bound*: the report's rank bound "
        "of the mechanism (rows) in the last run; cap: median chosen cap.",
        "",
        "| query | epsilon | fixed rank error | auto rank error | fixed rows off | "
        "auto rows off | fixed 95% bound | auto 95% bound | auto cap | fixed s | auto s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    by = {(r["query"], r["epsilon"], r["mode"]): r for r in rows}
    for label, _, _, _ in CAP_QUERIES:
        for eps in CAP_EPSILONS:
            f, a = by[(label, eps, "fixed")], by[(label, eps, "auto")]
            lines.append(
                f"| {label} | {eps:g} | {float(f['rank']):.3%} | {float(a['rank']):.3%} | "
                f"{float(f['rows']):,.0f} | {float(a['rows']):,.0f} | "
                f"{float(f['bound']):,.0f} | {float(a['bound']):,.0f} | {a['cap']:g} | "
                f"{float(f['seconds']):.2g} | {float(a['seconds']):.2g} |")
    lines += ["", "Keys without public values (delta 1e-8): groups released (mean over runs), "
              "the median threshold tau by what the gate counted (kinds.quantile.KeyGate: "
              "rows at the fixed limit; distinct riders when the automatic selection bounds "
              "the groups per rider below the cap, rows otherwise) and in how many runs.", "",
              "| query | epsilon | groups | fixed released | auto released | fixed tau | "
              "auto tau | auto cap |",
              "|---|---:|---:|---:|---:|---|---|---:|"]
    by = {(r["query"], r["epsilon"], r["mode"]): r for r in gated}
    for label, _, _ in GATED:
        for eps in CAP_EPSILONS:
            f, a = by[(label, eps, "fixed")], by[(label, eps, "auto")]
            lines.append(f"| {label} | {eps:g} | {f['groups']} | {float(f['released']):.1f} | "
                         f"{float(a['released']):.1f} | {f['tau']} | {a['tau']} | "
                         f"{a['cap']:g} |")
    lines += ["", READING_CAPS]
    return "\n".join(lines)


def render_joint(rows: list[dict[str, object]], n_rows: int, runs: int) -> str:
    """The "quantiles-joint" section."""
    lines = [
        "## Several quantiles of one column: joint against independent draws (issue 24)",
        "",
        f"`python -m benchmarks.quantiles --joint --rows {n_rows} --runs {runs}` on "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: PERCENTILE_CONT of fare "
        f"(bounds [0, 200], 10,000 bins) on the demo trips ({n_rows:,} rows, k = 200 trips per "
        "rider, DuckDB). *Joint*: the query through `Engine.execute`, all quantiles drawn by "
        "the joint exponential mechanism at epsilon (Delta = 2k = 400). *Independent*: the same "
        "exact histogram, each quantile by its own exponential mechanism at epsilon / m "
        "(Delta = k max(p, 1 - p)), as before this change. Median rank error |F(answer) - p| "
        f"over {runs} runs and the set's m quantiles. Seconds: one joint query.",
        "",
        "| quantiles | m | epsilon | joint rank error | independent rank error | joint s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['set']} | {r['m']} | {r['epsilon']:g} | {float(r['joint']):.3%} | "
                     f"{float(r['independent']):.3%} | {float(r['seconds']):.2g} |")
    wins = sum(float(r["joint"]) < float(r["independent"]) for r in rows)
    lines += ["", f"The joint draw has the lower median rank error in {wins} of {len(rows)} "
              "rows.", "", "Reading it: one cut off by r ranks costs the joint utility 2r, so each "
              "quantile's weight falls like exp(-epsilon r / 2k), against exp(-epsilon r / (2 m k "
              "max(p, 1 - p))) for one of m independent draws: the joint draw concentrates as "
              "well for m = 2 medians and better from there on, while its output space (every "
              "non-decreasing sequence of cuts) only grows like B^m / m!.  The kind draws the 2 "
              "to 16 quantiles of one column jointly (mechanisms.joint_quantiles) and a lone "
              "quantile as before."]
    return "\n".join(lines)


def render(rows: list[dict[str, object]], n_rows: int, runs: int) -> str:
    lines = [
        "## DP quantiles: rank error against the true quantile (issue 24)",
        "",
        f"`python -m benchmarks.quantiles --rows {n_rows} --runs {runs}` on "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: the demo trips ({n_rows:,} "
        "rows, at most k = 200 trips per rider), DuckDB. *Rank error*: |F(answer) - p|, F the "
        "empirical CDF of the column over every trip; *value error*: |answer - true "
        f"quantile|. Medians over {runs} runs. Analytic: the exponential mechanism over 10,000 "
        "bins of the declared bounds (pure epsilon-DP, the default, no option). Sampled: "
        "sensitivity sampling (random DP, gamma = 0.05, P uniform on the declared bounds), "
        "opt-in. Seconds: median time of one query (shared 2-core machine).",
        "",
        "| query | true value | epsilon | analytic rank error | sampled rank error | "
        "analytic value error | sampled value error | analytic s | sampled s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def fmt(v: object, pct: bool = False) -> str:
        if v is None:
            return "refused"
        return f"{float(v):.2%}" if pct else f"{float(v):.3g}"

    by = {(r["query"], r["epsilon"], r["mode"]): r for r in rows}
    for label, _, _, _ in QUERIES:
        for eps in EPSILONS:
            a, s = by[(label, eps, "analytic")], by[(label, eps, "sampled")]
            lines.append(f"| {label} | {fmt(a['truth'])} | {eps:g} | {fmt(a['rank'], True)} | "
                         f"{fmt(s['rank'], True)} | {fmt(a['value'])} | {fmt(s['value'])} | "
                         f"{fmt(a['seconds'])} | {fmt(s['seconds'])} |")
    refusals = {r["refused"] for r in rows if r["refused"]}
    if refusals:
        lines += ["", "Refused: " + "; ".join(sorted(str(x) for x in refusals))]
    lines += ["", "Reading it: the exponential mechanism's error is in ranks, (2 Delta / epsilon) "
              "ln(B / beta) values at most with probability 1 - beta, Delta = k max(p, 1 - p) = "
              "100 at the median with k = 200; over about a million trips that is a fraction "
              "of a percent of the ranks even at epsilon 0.1. Sensitivity sampling adds Laplace "
              "noise scaled to how far one rider's 200 rows move the quantile in samples of P: "
              "its error is in values, and its guarantee is the weaker random DP. Its answers "
              "are snapped to a power-of-two grid (the snapping mechanism), so once the noise "
              "is small its error is the distance from the truth to the nearest grid point "
              "(the same at epsilon 0.5 and 1). The sampled mode has no MIN or MAX. Both modes "
              "read at most 200 trips per rider: part of each error is that cap, not noise."]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=25)
    parser.add_argument("--joint", action="store_true",
                        help="only the joint-against-independent comparison (its own section)")
    parser.add_argument("--caps", action="store_true",
                        help="only the automatic cap against the fixed limit (its own section)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        generate_demo(directory, rows=args.rows)
        if args.caps:
            import os

            rows, gated = measure_caps(directory, args.runs)
            load = f"{os.getloadavg()[0]:.1f}"
            # One section per table size (20,000 and 1,000,000 trips side by side).
            write_section(f"quantiles-caps-{args.rows}",
                          render_caps(rows, gated, args.rows, args.runs, load))
            return 0
        engine = engine_for(directory, min(args.rows, SAMPLED_ROWS))
        try:
            if args.joint:
                write_section("quantiles-joint", render_joint(
                    measure_joint(engine, args.runs), args.rows, args.runs))
                return 0
            rows = measure(engine, args.runs)
        finally:
            engine.close()
    write_section("quantiles", render(rows, args.rows, args.runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
