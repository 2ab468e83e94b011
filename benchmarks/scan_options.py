"""Issue 23 study: how the default policy could answer in one scan; writes its section of
benchmarks/RESULTS.md.

    python -m benchmarks.scan_options [--rows 1000000] [--repeat 5] [--postgres URL]
                                      [--skip-postgres] [--profile-rounds 20]

On the demo trips (``chorus_py.demo.generate_demo``) in a DuckDB file and the same rows in
Postgres, for the queries of ``benchmarks.run.E2E_QUERIES`` and two more (a grouped SUM behind a
filter, a selective AVG), side by side in one run (medians of ``--repeat`` alternating runs):

raw
    the analyst's SQL sent straight to the database.
today
    what ``Engine.execute`` sends with the demo policy (automatic caps and clipping bounds,
    per-query bounding, choice reuse off), captured by spying on ``engine.backend.run``: the
    EXPLAINs of wall 6, the selection histograms and the answer, each timed on its own; and the
    whole ``Engine.execute`` (ledger, report).  "today, choices reused" is the answer alone.
per-query bounding variants
    today's answer statement at the cap the default chose, its ranking changed: ROW_NUMBER over
    ``random()`` (today), over a keyed hash of the row id (DuckDB ``hash(trip_id, seed)``,
    Postgres ``hashint8extended(trip_id, seed)``), and "light units whole": units with at most c
    filtered rows are kept whole through a hash aggregate and a hash join, only heavier units
    are ranked (no sort of the light units' rows).
one statement (cells)
    ONE statement per query: each filtered row's rank in its unit (ROW_NUMBER over the keyed
    hash) and its unit's count of non-NULL values (the same window partition), grouped by (group
    keys, rank r up to the limit, one bucket above it, magnitude bin of the clipped value) into
    per-cell COUNT(*), COUNT(x), SUM(x), SUM(x^2) and SUM(1 / n_u).  The proxy derives the cap
    histogram and the clipping histogram from the cells, noises them, chooses with the
    production rule (``Selection.choose``, fed the derived histograms), sums the cells at the
    chosen (cap, bound) into the exact answer, and noises and finishes it with the production
    proxy-noise path (``run_analytic``).  The time column includes that post-processing.  Before
    timing, the run asserts that the cells give the same exact answer as today's measurement
    statement (noise = "proxy", same hash ranking) at the chosen cap and bounds.
stored ranks
    a table materialized once with each row's rank in its unit (keyed hash over the whole table)
    and its unit's row count; the answer is today's statement reading it with
    ``WHERE rank <= c``; "stored ranks, cells" is the cell statement over it (per-unit filtered
    counts come from a hash aggregate joined back, which also yields the cap histogram).  Also:
    how many fewer rows ``rank <= c`` keeps than bounding after the filter, for selective
    filters, at the caps the default chose.

Privacy of the one-statement design (part 2 of the study)
---------------------------------------------------------

The cells are exact and never leave the proxy process; what is released is (a) the noisy
selection histograms and (b) the noisy answer at the chosen (cap k, bound B).  Both are made
to be *the same functions of the data* as today's, so today's sensitivities, noise and
accounting carry over unchanged:

- Cap histogram.  Let N_r be the number of filtered rows of rank exactly r (1 <= r <= L, L the
  limit).  A unit with c_u filtered rows has ranks 1..c_u, so N_r = #{u : c_u >= r}, and for
  the bins of ``mechanisms.caps.cap_bins`` (starts s_0 < ... < s_m = L)

      H_b = N_{s_b} - N_{s_{b+1}}  (b < m),   H_m = N_L

  is #{u : s_b <= c_u < s_{b+1}} (the last bin: c_u >= L), exactly today's histogram: each
  unit lies in one bin, so adding or removing a unit changes H by 1 in one bin, L1
  sensitivity 1, whatever the ranking.  The vector (N_r) itself must never be noised and
  released as a histogram: one unit adds 1 to N_1..N_{c_u}, L1 sensitivity up to L (200 here).
  Only the differences at the bin starts have sensitivity 1.
- Clipping histogram.  Each non-NULL row carries w = 1 / n_u (n_u: its unit's non-NULL values
  in the filtered rows, ``COUNT(x) OVER (PARTITION BY unit)``); summing w per magnitude bin
  over all ranks and groups gives today's ``value_histogram`` exactly: a unit's weights add up
  to 1, L1 sensitivity 1.  It can NOT be derived from COUNT per magnitude bin (a unit moves
  up to L rows) nor from the cells at rank <= k (that is a different, cap-dependent
  histogram): the weight must be in the cells.
- Groups-per-unit histogram (keys released by thresholding) is not derivable from these cells
  (they lose which unit a row belongs to).  Derivable with a second rank in the same
  partition, DENSE_RANK() OVER (PARTITION BY unit ORDER BY the keys): rows that start their
  unit's g-th group (g = 1..L) counted per g, differenced at the bin starts as above,
  sensitivity 1.  None of the benchmark queries needs it.
- The answer.  For a cap k and a bound B (B a bin edge M 2^(-t/2), as every candidate is),
  every row of magnitude bin j <= t is at least B and clips to u' = min(u, B) (to
  max(l, -B) when negative: the cells then also need the sign, for l < 0), every row of bin
  j > t keeps its value, so SUM(clip(x)) over rank <= k is a sum of cells, likewise COUNT(x)
  and SUM(clip(x)^2), and the centred sums follow (S - c N, Q - 2 c S + c^2 N).  The exact
  values are those of today's statement at (k, B) (asserted below), so the noise plan (scales
  from k and [l', u']) is today's and the answer's sensitivity is today's.
- Choosing in the proxy is post-processing of the noisy histograms (Dwork and Roth 2014,
  Proposition 2.1); the other candidates' exact aggregates are computed and discarded, never
  released, and the statement's duration does not depend on the choice (it is made after the
  statement finished).  Noise is drawn in the proxy (``noise = "proxy"`` mechanisms: discrete
  Laplace for the cap histogram, snapping for the weights and real-valued sums), as for
  today's histograms.
- Accounting stays exactly today's: the selection's share (``cap_epsilon_share`` of epsilon,
  split equally among the histograms) plus the answer's plan; the claim is consumed before
  the one statement runs, which reads rows, so a failure after it keeps the whole charge
  (selection share included), as ``QueryRun`` rules today.
- Stored ranks.  "stored ranks, cells" takes the cap histogram from a per-unit aggregate of
  the filtered rows (units per bin of c_u: today's histogram, sensitivity 1) and the clipping
  weights 1 / n_u from the same aggregate joined back (today's weights, sensitivity 1).
  "weighted cells" uses the stored size n_u of the unit in the whole table version instead:
  a unit's filtered rows then weigh f_u / n_u <= 1 in all, so every histogram summed from
  those weights (per magnitude bin, per stored-rank bucket and size bin, or any marginal of
  the cells) has L1 sensitivity <= 1 and the same noise as today is enough.  But it is a
  different histogram (units that keep few of their rows weigh less), so the cap rule of
  ``mechanisms.caps`` would need a new estimator of the rows kept at cap k (rows = weight x
  n_u, per size bin); that rule is not written here, only the statement is timed.  Plain
  COUNT per stored-rank bucket must never be noised as a histogram: a unit adds a row to up
  to L buckets (sensitivity L).
- COUNT(DISTINCT unit) alone is answered today at cap 1 (``rank <= 1``).  Per query that is a
  window the answer does not need (the distinct count has sensitivity 1 unbounded); over
  stored ranks it is wrong: it keeps only units whose stored rank-1 row passes the filter
  (83% fewer for ``distance_km > 20``, below; the shipped materialized bounding does the same
  today: 3,313 against 20,545 riders on the 1M demo).  Accuracy, not privacy.
- The ranking.  A keyed hash of the row id instead of ``random()`` changes no sensitivity:
  bounding's stability argument needs only that a unit's kept rows depend on that unit's rows
  alone (a per-unit rank does).  The row id must be unique (ties are broken arbitrarily, still
  per unit) and stable; the seed should be secret and per table so the kept rows are not
  predictable to an analyst (accuracy, not privacy).  With a fixed seed, repeated queries keep
  the same rows (as materialized bounding does): fresh noise each time, accounted each time.

Machines here are shared and noisy: read ratios and medians, not absolute times.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import functools
import itertools
import platform
import pstats
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.results import write_section  # noqa: E402
from benchmarks.run import E2E_QUERIES, QUERIES  # noqa: E402
from chorus_py.backends import SCHEMA, ResultSet  # noqa: E402
from chorus_py.demo import generate_demo  # noqa: E402
from chorus_py.engine import Engine  # noqa: E402
from chorus_py.kinds.analytic import run_analytic  # noqa: E402
from chorus_py.kinds.base import Prepared  # noqa: E402
from chorus_py.kinds.selection import Choices, Selection  # noqa: E402
from chorus_py.statements import QueryRun  # noqa: E402
from mechanisms.caps import cap_bins  # noqa: E402
from mechanisms.clip_bounds import STEPS, magnitude_edges  # noqa: E402
from rewriters.clipping import clipping  # noqa: E402
from rewriters.dialect import dialect as in_dialect  # noqa: E402
from rewriters.safety import safety  # noqa: E402
from rewriters.selection import clipped_arguments  # noqa: E402

#: The benchmark's queries: the end-to-end ones of benchmarks.run, a grouped SUM behind a filter
#: and a selective AVG (fewer rows per unit pass the filter than the stored ranks keep).
SCAN_QUERIES = [*E2E_QUERIES,
                "SELECT city, SUM(fare) FROM trips WHERE fare > 30 GROUP BY city",
                "SELECT COUNT(*), AVG(fare) FROM trips WHERE city = 'SEA'"]

#: Selective filters for the stored-rank comparison (rows kept by WHERE rank <= c).
FILTERS = ["pickup_time >= '2026-03-01' AND fare > 30", "city = 'SEA'", "distance_km > 20"]

#: The key of the row hash (a real deployment keeps a secret per table).
SEED = 20261202

#: Today's per-query bounding block, as the rewriter renders it in both dialects: (unit,
#: alias, FROM ... WHERE ..., cap).
BOUNDING = re.compile(
    r"\(SELECT \* FROM \(SELECT r\.\*, ROW_NUMBER\(\) OVER \(PARTITION BY r\.(\w+) ORDER BY "
    r"r\.__chorus_rand\) AS __chorus_rank FROM \(SELECT (\w+)\.\*, RANDOM\(\) AS __chorus_rand "
    r"(FROM .*?)\) AS r\) AS b WHERE b\.__chorus_rank <= (\d+)\)")

COLUMNS = "trip_id, rider_id, driver_id, city, pickup_time, fare, distance_km"
STORED = f"{SCHEMA}.scan_ranked"


def row_hash(backend: str, alias: str) -> str:
    """The keyed hash of a row id: the random order of a unit's rows, stable under retries."""
    if backend == "postgres":
        return f"hashint8extended({alias}.trip_id, {SEED})"
    return f"hash({alias}.trip_id, {SEED})"


def bounded(sql: str, backend: str, how: str, cap: int | None = None) -> str:
    """``sql`` with today's bounding block replaced: ``how`` is "hash", "light" or "stored"
    (``cap``: another cap than the one in ``sql``)."""
    def replace(match: re.Match[str]) -> str:
        unit, alias, source, found = match.groups()
        c = cap if cap is not None else int(found)
        rows = f"SELECT {alias}.* {source}"
        if how == "hash":
            return (f"(SELECT * FROM (SELECT r.*, ROW_NUMBER() OVER (PARTITION BY r.{unit} "
                    f"ORDER BY {row_hash(backend, 'r')}) AS __chorus_rank FROM ({rows}) AS r) "
                    f"AS b WHERE b.__chorus_rank <= {c})")
        if how == "light":
            def units(test: str) -> str:
                return (f"SELECT f.* FROM ({rows}) AS f JOIN (SELECT g.{unit} FROM ({rows}) "
                        f"AS g GROUP BY g.{unit} HAVING COUNT(*) {test} {c}) AS u "
                        f"ON f.{unit} = u.{unit}")
            return (f"(SELECT {COLUMNS} FROM ({units('<=')}) AS light UNION ALL "
                    f"SELECT {COLUMNS} FROM (SELECT h.*, ROW_NUMBER() OVER (PARTITION BY "
                    f"h.{unit} ORDER BY {row_hash(backend, 'h')}) AS __chorus_rank FROM "
                    f"({units('>')}) AS h) AS b WHERE b.__chorus_rank <= {c})")
        assert how == "stored"
        stored = _stored_source(source, alias)
        joiner = " AND " if " WHERE " in stored else " WHERE "
        return f"(SELECT {alias}.* {stored}{joiner}{alias}.chorus_rank <= {c})"

    out, n = BOUNDING.subn(replace, sql)
    if n != 1:
        raise ValueError("expected exactly one per-query bounding block")
    return out


def _stored_source(source: str, alias: str) -> str:
    """``FROM <schema>.trips AS trips WHERE ...`` reading the stored-rank table instead."""
    return re.sub(r'FROM "\w+"\.trips AS', f"FROM {STORED} AS", source, count=1)


def cap_of(sql: str) -> int:
    """The cap of today's bounding block in ``sql``."""
    match = BOUNDING.search(sql)
    assert match is not None
    return int(match.group(4))


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """(milliseconds, result) of one call."""
    start = time.perf_counter()
    result = fn()
    return (time.perf_counter() - start) * 1000, result


# -- the one-statement design -------------------------------------------------------------------


@dataclasses.dataclass
class CellPlan:
    """What the cell statement of one query groups by and how the proxy reads it back."""

    sql: str
    limit: int
    keys: tuple[tuple[Any, ...], ...]   # every group's key values (public keys), () ungrouped
    edges: tuple[float, ...]            # magnitude bin edges of the clipped value (or ())
    lower: float
    upper: float


def cell_plan(prepared: Prepared, backend: str, stored: bool = False,
              weighted: bool = False) -> CellPlan:
    """The cell statement of a query prepared (at the limit and declared bounds) by the
    proxy-noise engine: one scan, one window partition (or, over stored ranks, none).

    ``weighted`` (with ``stored``): no per-unit aggregate at all; the weights are 1 / the
    unit's stored row count and the cells are also grouped by the cap bin of that count (the
    cap histogram the current rule reads cannot be derived from them: a new rule would)."""
    detail = prepared.detail
    query = detail.query
    unit = query.privacy_unit
    alias = query.alias
    limit = query.table_policy.contribution_bound
    match = BOUNDING.search(detail.sql)
    assert match is not None and unit is not None
    source = match.group(3)
    if any(k.public_values is None for k in query.keys):
        raise ValueError("cells for thresholded keys need the groups-per-unit rank too")
    keys = [f"{in_dialect(k.expr.copy(), backend).sql(backend)} AS k{i}"
            for i, k in enumerate(query.keys)]
    clipped = clipped_arguments(query)
    if len(clipped) > 1:
        raise ValueError("one clipped argument per query in this study (more: GROUPING SETS)")
    double = "DOUBLE PRECISION" if backend == "postgres" else "DOUBLE"
    rows = f"SELECT {alias}.* {_stored_source(source, alias) if stored else source}"
    columns = list(keys)
    edges: tuple[float, ...] = ()
    lower = upper = 0.0
    value_sql = None
    if clipped:
        arg = clipped[0]
        if arg.lower < 0:
            raise ValueError("values below 0 need the sign in the cells too")
        lower, upper = arg.lower, arg.upper
        value = clipping(safety(arg.argument), arg.lower, arg.upper)
        value_sql = in_dialect(value, backend).sql(backend)
        columns.append(f"{value_sql} AS x")
        edges = magnitude_edges(max(abs(arg.lower), abs(arg.upper)))
    if weighted:  # the rank and the unit's size are stored: one plain scan
        columns += [f"{alias}.chorus_rank AS r", f"{alias}.chorus_unit_rows AS n"]
        f = f"SELECT {', '.join(columns)} FROM ({rows}) AS {alias}"
    elif stored:  # the rank is stored; per-unit counts of the filtered rows: a hash aggregate
        columns.append(f"{alias}.chorus_rank AS r")
        source_rows = f"({rows}) AS {alias}"
        if value_sql is not None:
            columns.append("u.n AS n")
            source_rows += (f" JOIN (SELECT {alias}.{unit}, COUNT({value_sql}) AS n FROM "
                            f"({rows}) AS {alias} GROUP BY {alias}.{unit}) AS u "
                            f"ON u.{unit} = {alias}.{unit}")
        f = f"SELECT {', '.join(columns)} FROM {source_rows}"
    else:  # one window partition: the rank and the unit's count of non-NULL values
        columns += [f"{alias}.{unit}", f"{alias}.trip_id"]
        windows = [f"ROW_NUMBER() OVER (PARTITION BY t.{unit} ORDER BY "
                   f"{row_hash(backend, 't')}) AS r"]
        if value_sql is not None:
            windows.append(f"COUNT(t.x) OVER (PARTITION BY t.{unit}) AS n")
        f = (f"SELECT t.*, {', '.join(windows)} FROM (SELECT {', '.join(columns)} "
             f"FROM ({rows}) AS {alias}) AS t")
    n_keys = len(keys)
    outer = [f"k{i}" for i in range(n_keys)]
    outer.append(f"CASE WHEN r > {limit} THEN {limit + 1} ELSE r END AS rb")
    if value_sql is not None:
        ifs = " ".join(f"WHEN x >= {edge!r} THEN {j}" for j, edge in enumerate(edges))
        outer.append(f"CASE {ifs} WHEN x IS NOT NULL THEN {len(edges)} END AS j")
        measures = ["COUNT(*) AS c", "COUNT(x) AS cx", "SUM(x) AS s", "SUM(x * x) AS q",
                    f"SUM(CAST(1 AS {double}) / n) AS w"]
    else:
        outer.append("NULL AS j")
        measures = ["COUNT(*) AS c", "0 AS cx", "0 AS s", "0 AS q", "0 AS w"]
    n_groups = n_keys + 2
    if weighted:
        starts = cap_bins(limit)
        ifs = " ".join(f"WHEN n >= {s} THEN {i}" for i, s in reversed(list(enumerate(starts))))
        outer.append(f"CASE {ifs} END AS a")
        n_groups += 1
        if value_sql is None:
            measures[-1] = f"SUM(CAST(1 AS {double}) / n) AS w"
    sql = (f"SELECT {', '.join(outer)}, {', '.join(measures)} FROM ({f}) AS f "
           f"GROUP BY {', '.join(str(i) for i in range(1, n_groups + 1))}")
    if stored and not weighted:  # the cap histogram: units per bin of filtered rows (-1 - bin)
        starts = cap_bins(limit)
        ifs = " ".join(f"WHEN c >= {s} THEN {i}" for i, s in reversed(list(enumerate(starts))))
        nulls = "".join(f"NULL AS k{i}, " for i in range(n_keys))
        sql += (f" UNION ALL SELECT {nulls}-1 - b AS rb, NULL AS j, COUNT(*) AS c, 0 AS cx, "
                f"0 AS s, 0 AS q, 0 AS w FROM (SELECT CASE {ifs} END AS b FROM (SELECT "
                f"COUNT(*) AS c FROM ({rows}) AS {alias} GROUP BY {alias}.{unit}) AS h) AS hb "
                "GROUP BY b")
    group_values = tuple(itertools.product(*(k.public_values or () for k in query.keys)))
    return CellPlan(sql, limit, group_values, edges, lower, upper)


@dataclasses.dataclass
class Cells:
    """The cell statement's rows as arrays [group, rank bucket 0..limit + 1, bin + 1 (0: NULL)]."""

    rows: np.ndarray
    count_x: np.ndarray
    sums: np.ndarray
    squares: np.ndarray
    weights: np.ndarray
    cap_histogram: np.ndarray | None   # stored ranks: units per cap bin, straight from the data


def read_cells(plan: CellPlan, rows: list[tuple[Any, ...]]) -> Cells:
    """Arrange the cell rows (keys, rank bucket, bin, c, cx, s, q, w) into arrays."""
    n_keys = len(plan.keys[0]) if plan.keys and plan.keys[0] else 0
    index = {k: i for i, k in enumerate(plan.keys)} if n_keys else {(): 0}
    shape = (len(index), plan.limit + 2, STEPS + 3)
    starts = cap_bins(plan.limit)
    histogram = None
    columns = list(zip(*rows, strict=True)) if rows else [()] * (n_keys + 7)
    rank = np.asarray(columns[n_keys], dtype=np.int64)
    if (rank < 0).any():  # stored ranks: cap-histogram rows (rank -1 - bin, units in c)
        histogram = np.zeros(len(starts))
        units = np.asarray(columns[n_keys + 2], dtype=float)
        np.add.at(histogram, -1 - rank[rank < 0], units[rank < 0])
    # A key outside the public values (-1) is never released: dropped with the histogram rows.
    group = np.fromiter((index.get(k, -1) for k in zip(*columns[:n_keys], strict=True)),
                        dtype=np.int64, count=len(rows)) if n_keys else np.zeros(len(rows), int)
    keep = (rank >= 0) & (group >= 0)
    j = np.fromiter((-1 if v is None else v for v in columns[n_keys + 1]), dtype=np.int64,
                    count=len(rows)) + 1
    at = (group[keep], rank[keep], j[keep])
    arrays = []
    for column in columns[n_keys + 2:]:
        values = np.fromiter((0.0 if v is None else float(v) for v in column), dtype=float,
                             count=len(rows))
        array = np.zeros(shape)
        np.add.at(array, at, values[keep])
        arrays.append(array)
    return Cells(*arrays, cap_histogram=histogram)


def cap_histogram(cells: Cells, limit: int) -> np.ndarray:
    """Units per cap bin, H_b = N_{s_b} - N_{s_b+1} (module docstring): sensitivity 1."""
    if cells.cap_histogram is not None:
        return cells.cap_histogram
    at_rank = cells.rows.sum(axis=(0, 2))  # N_r: rows of rank exactly r = units with c_u >= r
    starts = cap_bins(limit)
    reach = np.array([at_rank[s] for s in starts])
    return reach - np.append(reach[1:], 0.0)


def value_histogram(cells: Cells) -> np.ndarray:
    """The clipping histogram: each unit's weights 1 / n_u per magnitude bin (sensitivity 1)."""
    return cells.weights.sum(axis=(0, 1))[1:]


def exact_rows(plan: CellPlan, cells: Cells, final: Prepared) -> list[tuple[Any, ...]]:
    """The exact measurement rows of today's statement at the chosen cap and bound, summed from
    the cells (keys, then the measurements in ``proxied.measure_ids`` order)."""
    query = final.detail.query
    rewritten = final.detail.proxied
    assert rewritten is not None
    k = query.stability
    kept = slice(1, k + 1)
    by_id = {m.id: m for m in query.measurements}
    out = []
    for g, key in enumerate(plan.keys or [()]):
        row: list[Any] = list(key)
        for mid in rewritten.measure_ids:
            m = by_id[mid]
            if m.kind == "count_units":
                row.append(int(cells.rows[g, 1, :].sum()))
                continue
            if m.kind == "count":
                array = cells.rows if m.argument is None else cells.count_x
                row.append(round(float(array[g, kept, :].sum())))
                continue
            assert m.lower is not None and m.upper is not None
            bound = max(abs(m.lower), abs(m.upper))
            top = plan.edges.index(bound) if bound < plan.edges[0] else 0
            clip_to = min(m.upper, bound)
            n_bins = cells.count_x[g, kept, :].sum(axis=0)
            s_bins = cells.sums[g, kept, :].sum(axis=0)
            q_bins = cells.squares[g, kept, :].sum(axis=0)
            at_bound = np.arange(STEPS + 3) <= top + 1  # bins 0..top: every value >= B
            at_bound[0] = False  # the NULL column
            n = float(n_bins.sum())
            s = float(np.where(at_bound, n_bins * clip_to, s_bins).sum())
            q = float(np.where(at_bound, n_bins * clip_to * clip_to, q_bins).sum())
            c = m.center or 0.0
            row.append(q - 2 * c * s + c * c * n if m.kind == "sum_squares" else s - c * n)
        out.append(tuple(row))
    return out


class CellStatements:
    """The Statements a selection and the proxy-noise finish read, answered from the cells:
    the production code paths run unchanged over the derived histograms and exact rows."""

    def __init__(self, real: Any, histograms: dict[str, list[tuple[int, float]]]) -> None:
        self.real = real
        self.histograms = histograms
        self.answer: ResultSet | None = None

    def run(self, sql: str, run: QueryRun) -> ResultSet:
        found = self.histograms.get(sql)
        if found is not None:
            return ResultSet(("b", "n"), ("int", "float"), found)
        assert self.answer is not None
        return self.answer

    def scratch(self) -> Any:
        return self.real.scratch()


def one_statement(plan: CellPlan, selection: Selection, statements: Any,
                  run: Callable[[str], ResultSet], types: tuple[str, ...]) -> ResultSet:
    """The one-statement option end to end: the cell statement, then the proxy's work."""
    return answer_from_cells(plan, selection, statements, run(plan.sql).rows, types)[0]


def fetch_cells(plan: CellPlan, run: Callable[[str], ResultSet]) -> np.ndarray:
    """The weighted cell statement and its rows as one array (its rule is not written)."""
    rows = run(plan.sql).rows
    return np.array([[0.0 if v is None or isinstance(v, str) else float(v) for v in row]
                     for row in rows])


def answer_from_cells(plan: CellPlan, selection: Selection, real_statements: Any,
                      rows: list[tuple[Any, ...]], types: tuple[str, ...]
                      ) -> tuple[ResultSet, Choices, list[tuple[Any, ...]]]:
    """The proxy's post-processing of one cell statement: histograms, noise, choice, answer."""
    cells = read_cells(plan, rows)
    histograms = {}
    for what, _, sql in selection.histograms:
        vector = cap_histogram(cells, plan.limit) if what == ("cap",) else value_histogram(cells)
        histograms[sql] = [(i, float(v)) for i, v in enumerate(vector)]
    statements = CellStatements(real_statements, histograms)
    chosen = selection.choose(statements, QueryRun(None))
    final = selection.apply(chosen)
    exact = exact_rows(plan, cells, final)
    rewritten = final.detail.proxied
    assert rewritten is not None
    statements.answer = ResultSet((*rewritten.key_ids, *rewritten.measure_ids), types, exact)
    return run_analytic(statements, final.detail, "proxy", QueryRun(None)), chosen, exact


def same_rows(a: list[tuple[Any, ...]], b: list[tuple[Any, ...]]) -> bool:
    """Equal up to float summation order (counts exactly, sums to 1e-9 relative)."""
    def norm(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        return sorted(rows, key=lambda r: tuple(str(v) for v in r[:1]))
    for x, y in zip(norm(a), norm(b), strict=True):
        for u, v in zip(x, y, strict=True):
            exact = isinstance(u, str) or isinstance(v, str) or (
                isinstance(u, int) and isinstance(v, int))
            if exact:
                if u != v:
                    return False
            elif not np.isclose(float(u or 0), float(v or 0), rtol=1e-9, atol=1e-6):
                return False
    return len(a) == len(b)


# -- the run ------------------------------------------------------------------------------------


def policy_variant(path: Path, name: str, noise: str) -> Path:
    """The demo policy with an endless budget, a memory ledger, no choice reuse."""
    text = (path.read_text().replace("epsilon_per_block = 10.0", "epsilon_per_block = 1e9")
            .replace("choice_reuse_seconds = 600", "choice_reuse_seconds = 0")
            .replace('noise = "sql"', f'noise = "{noise}"'))
    out = path.with_name(f"{name}.toml")
    out.write_text(text)
    return out


def capture(engine: Engine, sql: str) -> list[str]:
    """The statements ``Engine.execute`` sends for ``sql`` (spying on the backend)."""
    sent: list[str] = []
    original = engine.backend.run

    def spy(statement: str, *args: Any, **kwargs: Any) -> Any:
        sent.append(statement)
        return original(statement, *args, **kwargs)

    engine.backend.run = spy  # type: ignore[method-assign]
    try:
        engine.execute(sql, epsilon=0.5, delta=1e-8)
    finally:
        engine.backend.run = original  # type: ignore[method-assign]
    return sent


def build_stored(engine: Engine, backend: str) -> float:
    """Materialize the stored-rank table once (in the proxy's schema); its build time in ms."""
    select = (f"SELECT t.*, ROW_NUMBER() OVER (PARTITION BY t.rider_id ORDER BY "
              f"{row_hash(backend, 't')}) AS chorus_rank, COUNT(*) OVER (PARTITION BY "
              "t.rider_id) AS chorus_unit_rows FROM trips AS t")
    statements = [f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}", f"DROP TABLE IF EXISTS {STORED}",
                  f"CREATE TABLE {STORED} AS {select}"]
    if backend == "postgres":
        statements.append(f"ANALYZE {STORED}")
    ms, _ = timed(lambda: engine.backend.run_owned(statements))
    return ms


def kept_rows(engine: Engine, where: str, cap: int) -> tuple[int, int, int]:
    """(rows passing ``where``, kept by bounding after the filter, kept by stored rank <= cap)."""
    rows = engine.backend.run(
        f"SELECT SUM(n), SUM(LEAST(n, {cap})), SUM(s) FROM (SELECT rider_id, COUNT(*) AS n, "
        f"SUM(CASE WHEN chorus_rank <= {cap} THEN 1 ELSE 0 END) AS s FROM {STORED} "
        f"WHERE {where} GROUP BY rider_id) AS u").rows[0]
    return int(rows[0]), int(rows[1]), int(rows[2])


@dataclasses.dataclass
class Measured:
    """Per option, the milliseconds of every repetition."""

    times: dict[str, list[float]] = dataclasses.field(default_factory=dict)

    def add(self, option: str, ms: float) -> None:
        self.times.setdefault(option, []).append(ms)

    def median(self, option: str) -> float:
        return statistics.median(self.times[option])


OPTIONS = ["raw", "today (histograms + answer)", "today, choices reused (answer)",
           "today, Engine.execute", "answer, ROW_NUMBER over hash",
           "answer, light units whole", "one statement (cells) + proxy",
           "stored ranks, rank <= c", "stored ranks, cells + proxy",
           "stored ranks + sizes, weighted cells (SQL + fetch only)"]

WEIGHTED = OPTIONS[-1]


def bench_backend(label: str, backend: str, policy: Path, repeat: int
                  ) -> tuple[dict[str, Measured], dict[str, Any]]:
    """Every option for every query on one backend, alternating within each repetition."""
    sql_engine = Engine.from_policy(policy_variant(policy, "scan-sql", "sql"))
    proxy_engine = Engine.from_policy(policy_variant(policy, "scan-proxy", "proxy"))
    run = sql_engine.backend.run
    notes: dict[str, Any] = {"stored_ms": build_stored(sql_engine, backend), "caps": {},
                             "checks": [], "kept": []}
    results: dict[str, Measured] = {}
    for sql in SCAN_QUERIES:
        print(f"  {label}: {sql}", file=sys.stderr)
        sent = capture(sql_engine, sql)
        histograms = [s for s in sent if not s.startswith(("EXPLAIN", "SELECT (")) and
                      BOUNDING.search(s) is None]
        answer = next(s for s in sent if BOUNDING.search(s) is not None
                      and not s.startswith("EXPLAIN"))
        explains = [s for s in sent if s.startswith("EXPLAIN")]
        cap = cap_of(answer)
        notes["caps"][sql] = cap
        _, prepared = proxy_engine.prepare(sql, "demo", 0.5, 1e-8)
        selection = prepared.selection
        statements = proxy_engine.statements
        plans = {}
        if selection is not None:
            plans = {"one statement (cells) + proxy": cell_plan(prepared, backend),
                     "stored ranks, cells + proxy": cell_plan(prepared, backend, stored=True)}
            weighted = cell_plan(prepared, backend, stored=True, weighted=True)
            # The check: the cells' exact answer equals today's measurement statement (same
            # hash ranking) at the cap and bounds chosen from the cells' histograms.
            plan = plans["one statement (cells) + proxy"]
            cells_rows = run(plan.sql).rows
            _, chosen, exact = answer_from_cells(plan, selection, statements, cells_rows,
                                                 ("text",) * 8)
            final = selection.apply(chosen)
            reference = run(bounded(final.detail.sql, backend, "hash"))
            if not same_rows(exact, reference.rows):
                raise AssertionError(f"cells differ from today's statement for {sql}: "
                                     f"{exact} != {reference.rows}")
            notes["checks"].append((label, sql, chosen.cap, chosen.bounds))
            types = reference.types
        variants: dict[str, Callable[[], Any]] = {
            "raw": lambda sql=sql: run(sql),
            "today (histograms + answer)":
                lambda h=histograms, a=answer: [run(s) for s in (*h, a)],
            "today, choices reused (answer)": lambda a=answer: run(a),
            "today, Engine.execute": lambda sql=sql: sql_engine.execute(
                sql, epsilon=0.5, delta=1e-8, remaining=False),
        }
        for option, how in (("answer, ROW_NUMBER over hash", "hash"),
                            ("answer, light units whole", "light"),
                            ("stored ranks, rank <= c", "stored")):
            variants[option] = functools.partial(run, bounded(answer, backend, how))
        if selection is not None:
            variants[WEIGHTED] = functools.partial(fetch_cells, weighted, run)
        for option, plan in plans.items():
            assert selection is not None
            variants[option] = functools.partial(one_statement, plan, selection, statements,
                                                 run, types)
        if selection is None:  # nothing to choose: the one statement is the hash-ranked answer
            variants["one statement (cells) + proxy"] = variants["answer, ROW_NUMBER over hash"]
            variants["stored ranks, cells + proxy"] = variants["stored ranks, rank <= c"]
            variants[WEIGHTED] = variants["stored ranks, rank <= c"]
        measured = results[sql] = Measured()
        measured.times["explains (wall 6, once per query text)"] = [
            timed(lambda s=s: run(s))[0] for s in explains]
        for fn in variants.values():  # warm the buffer pool and every cache
            fn()
        for _ in range(repeat):
            for option, fn in variants.items():
                measured.add(option, timed(fn)[0])
        for where in FILTERS:
            if where in sql:
                notes["kept"].append((label, where, cap, *kept_rows(sql_engine, where, cap)))
    for where in FILTERS:  # also at smaller caps, where the two bounding models part
        for cap in (10, 50):
            notes["kept"].append((label, where, cap, *kept_rows(sql_engine, where, cap)))
    sql_engine.backend.run_owned([f"DROP TABLE IF EXISTS {STORED}"])
    sql_engine.close()
    proxy_engine.close()
    return results, notes


# -- cold queries -------------------------------------------------------------------------------


#: The steps of a cold prepare the profile reports (cumulative time, by function name).
PROFILED = frozenset({
    "_analyse", "parse_statement", "analyze_query", "qualify", "annotate_types",
    "qualify_columns", "_prepare_uncached", "_plan", "one_table_sql", "build", "pipeline",
    "sql_with_noise", "noise", "_selection_statements", "value_histogram", "cap_histogram",
    "generate", "deepcopy", "dialect", "safety", "plan_noise", "aggregate_report",
    "with_contribution", "verify_outgoing", "render_sql", "with_bounds", "with_cap"})


def profile_cold(policy: Path, rounds: int) -> list[str]:
    """cProfile of ``Engine.prepare`` for never-seen query texts (every cache cleared)."""
    engine = Engine.from_policy(policy_variant(policy, "scan-profile", "sql"))
    for sql in QUERIES:  # block windows, schema: warm, as in a running proxy
        engine.prepare(sql, "demo", 0.5, 1e-8)

    def clear(templates: bool = True) -> None:
        engine._analyses.clear()
        engine.single._prepared.clear()
        engine.join._prepared.clear()
        if templates:  # a never-seen text is a new shape: its templates and histogram SQL
            engine.single._templates.clear()  # are built too (both keyed by the query's text)
            engine.single._histograms.clear()

    per_query: dict[str, list[float]] = {sql: [] for sql in QUERIES}
    kept: dict[str, list[float]] = {sql: [] for sql in QUERIES}
    for _ in range(rounds):  # plain timing, outside the profiler
        for sql in QUERIES:
            clear()
            per_query[sql].append(timed(lambda sql=sql: engine.prepare(
                sql, "demo", 0.5, 1e-8))[0])
            clear(templates=False)
            kept[sql].append(timed(lambda sql=sql: engine.prepare(
                sql, "demo", 0.5, 1e-8))[0])
    profiler = cProfile.Profile()
    for _ in range(rounds):
        for sql in QUERIES:
            clear()
            profiler.enable()
            engine.prepare(sql, "demo", 0.5, 1e-8)
            profiler.disable()
    engine.close()
    stats = pstats.Stats(profiler)
    calls = rounds * len(QUERIES)
    entries = stats.stats  # type: ignore[attr-defined]
    total = sum(tt for (_, _, tt, _, _) in entries.values()) * 1000 / calls

    def where(func: tuple[str, int, str]) -> str:
        path, line, name = func
        short = path.split("site-packages/")[-1].split(str(ROOT) + "/")[-1]
        return f"{short}:{line} {name}"

    cumulative = sorted(entries.items(), key=lambda kv: -kv[1][3])
    lines = ["| function | ms per query (cumulative) | calls per query |", "|---|---|---|"]
    for func, (_, nc, _, ct, _) in cumulative:
        if func[2] in PROFILED and ct * 1000 / calls >= 0.1:
            lines.append(f"| `{where(func)}` | {ct * 1000 / calls:.2f} | {nc / calls:.1f} |")
    own = sorted(entries.items(), key=lambda kv: -kv[1][2])[:15]
    lines += ["", "| function (own time) | ms per query | calls per query |", "|---|---|---|"]
    lines += [f"| `{where(func)}` | {tt * 1000 / calls:.3f} | {nc / calls:.1f} |"
              for func, (_, nc, tt, _, _) in own]
    timing = ["| query | never-seen text p50 ms | text template kept (benchmarks.run's cold) |",
              "|---|---|---|"]
    timing += [f"| `{sql}` | {statistics.median(times):.2f} | {statistics.median(kept[sql]):.2f} |"
               for sql, times in per_query.items()]
    return [*timing, "", f"Profiled: {calls} cold prepares, {total:.2f} ms per query under "
            "cProfile (its overhead inflates small calls).", "", *lines]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test",
                        help="an admin URL; a database chorus_scan is (re)created next to it")
    parser.add_argument("--skip-postgres", action="store_true")
    parser.add_argument("--profile-rounds", type=int, default=20)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "RESULTS.md")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="chorus-scan-"))
    print(f"generating {args.rows:,} demo trips in {work}", file=sys.stderr)
    policies = {"DuckDB": ("duckdb", generate_demo(work / "duckdb", rows=args.rows))}
    if not args.skip_postgres:
        base = args.postgres.rsplit("/", 1)[0]
        with psycopg.connect(args.postgres, autocommit=True) as con:
            con.execute("DROP DATABASE IF EXISTS chorus_scan WITH (FORCE)")
            con.execute("CREATE DATABASE chorus_scan")
        policies["Postgres"] = ("postgres", generate_demo(
            work / "pg", backend_url=f"{base}/chorus_scan", rows=args.rows))

    print("cold prepare profile", file=sys.stderr)
    profile = profile_cold(policies["DuckDB"][1], args.profile_rounds)
    tables: list[str] = []
    summary: list[str] = []
    kept: list[str] = []
    checks: list[str] = []
    stored_build: list[str] = []
    for label, (backend, policy) in policies.items():
        print(f"options on {label}", file=sys.stderr)
        results, notes = bench_backend(label, backend, policy, args.repeat)
        stored_build.append(f"{label} {notes['stored_ms']:.0f} ms")
        tables += [f"#### {label}", "",
                   "| query | cap today | " + " | ".join(OPTIONS) + " |",
                   "|---|---|" + "---|" * len(OPTIONS)]
        ratios: dict[str, list[float]] = {o: [] for o in OPTIONS[1:]}
        for sql, measured in results.items():
            raw = measured.median("raw")
            cells = [f"{raw:.1f}"]
            for option in OPTIONS[1:]:
                ms = measured.median(option)
                ratios[option].append(ms / raw)
                cells.append(f"{ms:.1f} ({ms / raw:.1f}x)")
            tables.append(f"| `{sql}` | {notes['caps'][sql]} | " + " | ".join(cells) + " |")
        tables.append("")
        summary += [f"| {label} | {option} | {statistics.median(r):.1f}x | {max(r):.1f}x |"
                    for option, r in ratios.items()]
        kept += [f"| {lab} | `{where}` | {cap} | {n:,} | {after:,} | {stored:,} | "
                 f"{100 * (after - stored) / max(after, 1):.1f}% |"
                 for lab, where, cap, n, after, stored in notes["kept"]]
        checks += [f"- {lab}: `{sql}`: equal at cap {cap}, bounds {list(bounds)}"
                   for lab, sql, cap, bounds in notes["checks"]]

    text = "\n".join([
        "## Scan options for the default policy (issue 23 study)",
        "",
        f"Written by `python -m benchmarks.scan_options` on {datetime.now(UTC):%Y-%m-%d %H:%M} "
        f"UTC; {platform.machine()}, Python {platform.python_version()}, {args.rows:,} demo "
        f"trips, medians of {args.repeat} alternating runs, epsilon 0.5. Shared, noisy machine: "
        "read the ratios. Options: see the module docstring of `benchmarks/scan_options.py`.",
        "",
        "### Milliseconds (and over raw) per query and option",
        "",
        *tables,
        "### DP / raw per option (median and worst over the queries)",
        "",
        "| backend | option | median | max |",
        "|---|---|---|---|",
        *summary,
        "",
        "### The one statement computes today's exact answers",
        "",
        "Before timing, the cells' exact answer at the cap and bounds chosen from the cells' "
        "histograms was compared with today's measurement statement at those choices (same "
        "hash ranking): counts equal, sums within 1e-9 relative.",
        "",
        *checks,
        "",
        "### Stored ranks: rows kept by `rank <= c` against bounding after the filter",
        "",
        f"Stored-rank table built once in {', '.join(stored_build)}.",
        "",
        "| backend | filter | cap | rows passing | kept, bounding after the filter | "
        "kept, stored rank <= c | fewer |",
        "|---|---|---|---|---|---|---|",
        *kept,
        "",
        "### Cold prepare (never-seen query text) on DuckDB",
        "",
        *profile,
        "",
    ])
    write_section("scan_options", text, args.out)
    print(text)


if __name__ == "__main__":
    main()
