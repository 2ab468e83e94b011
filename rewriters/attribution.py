"""Contribution bounding when a row belongs to several privacy units (multi-attribution).

A trip belongs to its rider and its driver, a paper to all its authors.  The proxy keeps a subset
S of the rows such that every unit has at most k rows in S; queries then read S only.  Maximising
|S| is NP-hard ("It's My Data Too: Private ML for Datasets with Multi-User Training Examples",
Section 4; ../shared/papers/002), so this module ships the paper's greedy baseline, its
bias-mitigating variant, a pure-SQL variant that needs no data to leave the database, a greedy
whose order puts rows of rarely seen units first (much closer to the optimum), and the exact
integer program for small inputs (to measure how far the others are from optimal).

Privacy argument (the paper's "fixed-graph" DP, Section 3.2): every algorithm here reads only the
attribution structure (which units each row belongs to, and the row ids) and a seeded random
order, never a row's contents.  So S is a function of the structure alone, treated as fixed: the
mechanism protects the *contents* of each unit's rows, and a neighbouring database adds or removes
the rows of S attributed to one unit, at most k of them.  That is stability k, and every
sensitivity of ``analyses.sensitivity`` applies with s = k.  S must therefore be chosen once, on
the whole table, before any filter (a per-query selection on filtered rows would depend on row
contents), which is why it is materialised (``chorus_py.stores.attribution``).  It is not node-level
DP: removing a unit from the *structure* can change which rows of other units the greedy keeps (a
kept row of the removed unit frees a slot, the freed slot admits another row, and so on), so
neither |S| nor S is released to analysts; the structure stays confidential.

Semantics shared by all methods: a (row, unit) pair counts once even if the unit appears in two
columns of the row; NULL units are ignored; a row with no unit at all belongs to nobody the
guarantee could protect, so it is never kept (fail closed: it is most likely missing data).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from sqlglot import exp

Method = Literal["greedy", "greedy-sparse", "sql-rank", "greedy-balanced", "ilp"]
METHODS: tuple[Method, ...] = ("greedy", "greedy-sparse", "sql-rank", "greedy-balanced", "ilp")

Progress = Callable[[float], None]


def _no_progress(fraction: float) -> None:
    return None


@dataclass(frozen=True)
class Attribution:
    """The attribution structure: n rows, their units, as (row index, unit index) pairs.

    ``row_ids[i]`` is the database id of row i; ``pair_row``/``pair_unit`` list each distinct
    (row, unit) pair once; units are numbered 0..n_units-1.
    """

    row_ids: np.ndarray
    pair_row: np.ndarray
    pair_unit: np.ndarray
    n_units: int

    @property
    def n_rows(self) -> int:
        """Number of rows (with or without units)."""
        return len(self.row_ids)

    @classmethod
    def from_pairs(cls, row_ids: np.ndarray, pair_row_ids: np.ndarray,
                   pair_units: np.ndarray) -> Attribution:
        """Build from row ids and (row id, unit value) pairs (duplicates and unknown rows dropped).

        ``row_ids`` must be unique; pairs naming a row id that is not among them are ignored
        (an attribution of a row that does not exist).
        """
        row_ids = np.asarray(row_ids, dtype=np.int64)
        ascending = len(row_ids) < 2 or bool(np.all(row_ids[1:] > row_ids[:-1]))
        order = np.arange(len(row_ids)) if ascending else np.argsort(row_ids, kind="stable")
        sorted_ids = row_ids[order]
        if not ascending and len(sorted_ids) > 1 and np.any(sorted_ids[1:] == sorted_ids[:-1]):
            raise ValueError("row ids are not unique")
        pair_row_ids = np.asarray(pair_row_ids, dtype=np.int64)
        where = np.searchsorted(sorted_ids, pair_row_ids)
        where = np.minimum(where, max(len(sorted_ids) - 1, 0))
        known = (sorted_ids[where] == pair_row_ids) if len(sorted_ids) else \
            np.zeros(len(pair_row_ids), dtype=bool)
        rows = order[where[known]].astype(np.int64)
        units = _dense_codes(np.asarray(pair_units)[known])
        n_units = int(units.max()) + 1 if len(units) else 0
        # One pair per (row, unit): a unit named twice on a row contributes that row once.
        # (A sort and a neighbour comparison: np.unique is several times slower here.)
        width = max(n_units, 1)
        key = np.sort(rows * width + units)
        key = key[np.r_[True, key[1:] != key[:-1]]] if len(key) else key
        return cls(row_ids, key // width, key % width, n_units)

    @classmethod
    def from_columns(cls, row_ids: np.ndarray, units: list[np.ndarray],
                     nulls: list[np.ndarray]) -> Attribution:
        """Build from one unit column per entry of ``units`` (``nulls[j]`` marks NULL units)."""
        pair_rows = np.concatenate([np.asarray(row_ids)[~m] for m in nulls]) if units else \
            np.empty(0, np.int64)
        pair_units = np.concatenate([np.asarray(u)[~m] for u, m in zip(units, nulls,
                                                                        strict=True)]) \
            if units else np.empty(0, np.int64)
        return cls.from_pairs(row_ids, pair_rows, pair_units)

    def degrees(self) -> np.ndarray:
        """Units per row."""
        return np.bincount(self.pair_row, minlength=self.n_rows)

    def rows_per_unit(self, keep: np.ndarray) -> np.ndarray:
        """Kept rows of every unit."""
        return np.bincount(self.pair_unit, weights=keep[self.pair_row].astype(np.int64),
                           minlength=self.n_units).astype(np.int64)


@dataclass(frozen=True)
class Selection:
    """The kept set S as a mask over the rows, and how it was found."""

    keep: np.ndarray
    method: Method
    optimal: bool = False   # ilp only: proven optimal within the time limit
    rounds: int = 0         # greedy: vectorised rounds needed


def random_order(n: int, seed: int | None) -> np.ndarray:
    """A uniformly random position for each of n rows (a permutation), seeded when asked."""
    rng = np.random.default_rng(seed)
    return rng.permutation(n).astype(np.int64)


def greedy(att: Attribution, k: int, seed: int | None = None,
           progress: Progress = _no_progress) -> Selection:
    """The paper's greedy: rows in random order, keep one when all its units are below k.

    >>> att = Attribution.from_pairs(np.array([1, 2, 3]), np.array([1, 1, 2, 2, 3]),
    ...                              np.array([7, 8, 7, 9, 9]))
    >>> greedy(att, 1, seed=0).keep.sum() in (1, 2)
    True
    """
    keep, rounds = greedy_in_order(att, random_order(att.n_rows, seed), k, progress)
    return Selection(keep, "greedy", rounds=rounds)


def sparse_first_order(att: Attribution, seed: int | None) -> np.ndarray:
    """Rows whose units have the fewest rows in total first (random order among equals).

    The key of a row is the sum, over its units, of the unit's row count: a row of rarely seen
    units blocks little.  It reads only the structure, like the random order.  On skewed
    co-authorship graphs greedy in this order keeps 98-99.5% of the optimum where the random
    order keeps 80-93% (``benchmarks/attribution.py``), at the price of more bias towards rows
    with few, rarely seen units.
    """
    unit_rows = np.bincount(att.pair_unit, minlength=att.n_units)
    key = np.bincount(att.pair_row, weights=unit_rows[att.pair_unit],
                      minlength=att.n_rows).astype(np.int64)
    tie = random_order(att.n_rows, seed)
    rank = np.lexsort((tie, key))
    position = np.empty(att.n_rows, dtype=np.int64)
    position[rank] = np.arange(att.n_rows)
    return position


def greedy_sparse(att: Attribution, k: int, seed: int | None = None,
                  progress: Progress = _no_progress) -> Selection:
    """Greedy over :func:`sparse_first_order`: a larger S than the random order."""
    keep, rounds = greedy_in_order(att, sparse_first_order(att, seed), k, progress)
    return Selection(keep, "greedy-sparse", rounds=rounds)


def balanced_order(att: Attribution, seed: int | None, u: int, c1: int, c2: int) -> np.ndarray:
    """The paper's bias mitigation: c1 rows with <= u units, then c2 with > u units, repeat.

    Each group is in random order; once a group runs out, the rest of the other follows.
    """
    if u < 1 or c1 < 1 or c2 < 1:
        raise ValueError("u, c1 and c2 must be >= 1")
    rng = np.random.default_rng(seed)
    small = att.degrees() <= u
    key = np.empty(att.n_rows, dtype=np.int64)
    period = c1 + c2
    for mask, take, offset in ((small, c1, 0), (~small, c2, c1)):
        idx = np.flatnonzero(mask)
        rank = rng.permutation(len(idx)).astype(np.int64)
        key[idx] = (rank // take) * period + offset + rank % take
    return np.argsort(np.argsort(key, kind="stable"), kind="stable").astype(np.int64)


def greedy_balanced(att: Attribution, k: int, seed: int | None = None, u: int = 2,
                    c1: int = 1, c2: int = 1, progress: Progress = _no_progress) -> Selection:
    """Greedy over the interleaved order of :func:`balanced_order`."""
    keep, rounds = greedy_in_order(att, balanced_order(att, seed, u, c1, c2), k, progress)
    return Selection(keep, "greedy-balanced", rounds=rounds)


def greedy_in_order(att: Attribution, position: np.ndarray, k: int,
                    progress: Progress = _no_progress) -> tuple[np.ndarray, int]:
    """Sequential greedy over rows sorted by ``position``, computed in vectorised rounds.

    Same result as :func:`greedy_loop`, without a Python loop per row.  In each round, for every
    (row, unit) pair ordered by unit then position, two segmented prefix counts over the
    earlier rows of the same unit decide undecided rows for sure:

    - *reject* when some unit already has >= k kept earlier rows (kept rows are final);
    - *keep* when for every unit the earlier rows that are kept or still undecided number < k
      (even if all of them end up kept, this row fits).

    The earliest undecided row always has both counts equal (everything before it is decided),
    so each round decides at least one row; in practice a handful of rounds decide all (the
    dependency chains of a random order are short, as for parallel greedy independent sets).
    Decided units drop out of later rounds.
    """
    if k < 1:
        raise ValueError("k must be >= 1")
    n = att.n_rows
    state = np.zeros(n, dtype=np.int8)          # 0 undecided, 1 kept, 2 rejected
    degree = att.degrees()
    state[degree == 0] = 2                      # no unit: never kept (see the module docstring)
    # Pairs sorted by (unit, position of the row).
    # (One argsort of a combined key: about twice as fast as np.lexsort.)
    order = np.argsort(att.pair_unit * max(n, 1) + position[att.pair_row], kind="stable")
    p_row = att.pair_row[order]
    p_unit = att.pair_unit[order]
    rounds = 0
    undecided_total = int(np.count_nonzero(state == 0))
    # Kept rows of each unit that precede all its undecided rows are folded into a count, so
    # later rounds only walk the pairs still in play.
    base = np.zeros(att.n_units, dtype=np.int64)
    while len(p_row):
        rounds += 1
        st = state[p_row]
        kept = (st == 1).astype(np.int64)
        start = np.flatnonzero(np.r_[True, p_unit[1:] != p_unit[:-1]])
        seg = np.repeat(start, np.diff(np.r_[start, len(p_unit)]))
        # Rejected pairs were dropped, so every pair left is kept or undecided ("live").
        kept_before = base[p_unit] + _exclusive_segment_cumsum(kept, seg)
        live_before = base[p_unit] + np.arange(len(p_unit)) - seg
        undecided = st == 0
        blocked = np.bincount(p_row, weights=undecided & (kept_before >= k), minlength=n) > 0
        crowded = np.bincount(p_row, weights=undecided & (live_before >= k), minlength=n) > 0
        open_rows = state == 0
        state[open_rows & blocked] = 2
        state[open_rows & ~blocked & ~crowded] = 1
        # Drop rejected pairs; fold each unit's decided prefix (kept rows) into base.
        st = state[p_row]
        still = (st == 0).astype(np.int64)
        in_prefix = (_exclusive_segment_cumsum(still, seg) + still) == 0
        base += np.bincount(p_unit[in_prefix & (st == 1)], minlength=att.n_units)
        stay = ~in_prefix & (st != 2)
        p_row, p_unit = p_row[stay], p_unit[stay]
        left = int(np.count_nonzero(state == 0))
        progress(1.0 - left / undecided_total if undecided_total else 1.0)
        if left == 0:
            break
    return state == 1, rounds


def _exclusive_segment_cumsum(values: np.ndarray, seg_start: np.ndarray) -> np.ndarray:
    """Sum of ``values`` before each position within its segment (segments start at seg_start)."""
    total = np.cumsum(values)
    before = total - values
    return before - before[seg_start]


def greedy_loop(att: Attribution, position: np.ndarray, k: int) -> np.ndarray:
    """The sequential greedy as a plain loop: the reference :func:`greedy_in_order` must match."""
    starts = np.r_[0, np.cumsum(np.bincount(att.pair_row, minlength=att.n_rows))]
    by_row = att.pair_unit[np.argsort(att.pair_row, kind="stable")]
    count = [0] * att.n_units
    keep = np.zeros(att.n_rows, dtype=bool)
    for row in np.argsort(position, kind="stable").tolist():
        units = by_row[starts[row]:starts[row + 1]].tolist()
        if units and all(count[x] < k for x in units):
            keep[row] = True
            for x in units:
                count[x] += 1
    return keep


def ilp(att: Attribution, k: int, time_limit_seconds: float = 60.0,
        start: np.ndarray | None = None) -> Selection:
    """The largest S (max sum x_i s.t. sum_{i in rows of u} x_i <= k for every unit u), by HiGHS.

    Rows none of whose units has more than k rows are kept outright and units with at most k rows
    need no constraint, which shrinks the program.  ``start`` (e.g. the greedy's S) is given to
    the solver as a first feasible solution, so the result is never smaller than it.  When the
    time limit stops the solver, the best feasible S found is returned (``optimal`` False).
    """
    import highspy  # imported here: only the owner's `chorus bound --method ilp` needs it

    if k < 1:
        raise ValueError("k must be >= 1")
    with _HIGHS_LOCK:
        return _ilp(highspy, _highs(), att, k, time_limit_seconds, start)


_HIGHS_LOCK = threading.Lock()
_HIGHS: list[object] = []


def _highs() -> Any:
    """One solver per process, reused (HiGHS prints a banner on stdout when it is created)."""
    if not _HIGHS:
        import highspy

        sys.stdout.flush()
        saved = os.dup(1)
        try:
            with open(os.devnull, "wb") as null:
                os.dup2(null.fileno(), 1)
                _HIGHS.append(highspy.Highs())
        finally:
            os.dup2(saved, 1)
            os.close(saved)
    return _HIGHS[0]


def _ilp(highspy: Any, h: Any, att: Attribution, k: int, time_limit_seconds: float,
         start: np.ndarray | None) -> Selection:
    n = att.n_rows
    unit_degree = np.bincount(att.pair_unit, minlength=att.n_units)
    tight_pair = unit_degree[att.pair_unit] > k
    has_units = att.degrees() > 0
    tight_row = np.bincount(att.pair_row, weights=tight_pair, minlength=n) > 0
    keep = has_units & ~tight_row
    rows = np.flatnonzero(tight_row)
    if len(rows) == 0:
        return Selection(keep, "ilp", optimal=True)
    col_of = np.full(n, -1, dtype=np.int64)
    col_of[rows] = np.arange(len(rows))
    tight_units = np.flatnonzero(unit_degree > k)
    row_of_unit = np.full(att.n_units, -1, dtype=np.int64)
    row_of_unit[tight_units] = np.arange(len(tight_units))
    pu = att.pair_unit[tight_pair]
    pr = att.pair_row[tight_pair]
    order = np.lexsort((col_of[pr], row_of_unit[pu]))
    cons, cols = row_of_unit[pu][order], col_of[pr][order]
    starts = np.searchsorted(cons, np.arange(len(tight_units))).astype(np.int32)

    h.clear()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit_seconds))
    h.setOptionValue("threads", 1)
    m = len(rows)
    inf = highspy.kHighsInf
    h.addCols(m, np.ones(m), np.zeros(m), np.ones(m), 0, np.array([], np.int32),
              np.array([], np.int32), np.array([], np.double))
    h.changeColsIntegrality(m, np.arange(m, dtype=np.int32),
                            np.full(m, highspy.HighsVarType.kInteger))
    h.addRows(len(tight_units), np.full(len(tight_units), -inf),
              np.full(len(tight_units), float(k)), len(cols), starts,
              cols.astype(np.int32), np.ones(len(cols)))
    h.changeObjectiveSense(highspy.ObjSense.kMaximize)
    if start is not None:
        sol = highspy.HighsSolution()
        sol.col_value = start[rows].astype(np.double).tolist()
        h.setSolution(sol)
    h.run()
    status = h.getModelStatus()
    values = np.asarray(h.getSolution().col_value)
    chosen = values > 0.5 if len(values) == m else np.zeros(m, dtype=bool)
    # The objective HiGHS reports is that of its best solution, but with a start it can
    # return the start's values beside an optimum's objective (seen: 14 rows kept, objective
    # 15, "optimal").  Only values that reach the reported objective are called optimal; when
    # they fall short, the program is solved again without the start.
    objective = h.getInfo().objective_function_value
    reached = int(chosen.sum()) >= objective - 0.5
    if start is not None and not reached:
        again = _ilp(highspy, h, att, k, time_limit_seconds, None)
        if again.keep.sum() >= keep.sum() + start[rows].sum():
            return again
    if start is not None and chosen.sum() < start[rows].sum():  # no better incumbent reported
        chosen = start[rows].astype(bool)
    keep[rows] = chosen
    return Selection(keep, "ilp",
                     optimal=status == highspy.HighsModelStatus.kOptimal and reached)


def _dense_codes(values: np.ndarray) -> np.ndarray:
    """Number the distinct values 0..m-1 (the inverse of np.unique, by one argsort)."""
    if len(values) == 0:
        return np.empty(0, dtype=np.int64)
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    codes = np.empty(len(values), dtype=np.int64)
    codes[order] = np.cumsum(np.r_[True, ordered[1:] != ordered[:-1]]) - 1
    return codes


def check_bound(att: Attribution, keep: np.ndarray, k: int) -> None:
    """Raise ``AssertionError`` unless every unit has at most k kept rows (a cheap safety net)."""
    worst = int(att.rows_per_unit(keep).max()) if att.n_units else 0
    if worst > k:
        raise AssertionError(f"selection keeps {worst} rows of one unit, above k = {k}")


# -- the same selection in SQL ------------------------------------------------------------------

def sql_rank(pairs: exp.Select, k: int, seed: int, dialect: str) -> exp.Select:
    """Row ids kept by *sql-rank*: a row stays when its random rank is <= k in every unit.

    ``pairs`` selects the distinct (row_id, unit) pairs, columns named ``row_id`` and ``unit``.
    The random number is a seeded hash of the row id (``hash`` in DuckDB, ``hashtextextended`` in
    Postgres, ``xxhash64`` in Spark), so the result is deterministic for a seed and independent of row contents.  Every
    unit keeps its k lowest-ranked rows at most, and fewer when some of them are dropped by another
    unit: valid, smaller than the greedy's S, but it runs entirely inside the database.

    >>> p = exp.select("row_id", "unit").from_("pairs")
    >>> "ROW_NUMBER() OVER (PARTITION BY" in sql_rank(p, 2, 1, "duckdb").sql("duckdb")
    True
    """
    if k < 1:
        raise ValueError("k must be >= 1")
    h = _row_hash(exp.column("row_id", table="p"), seed, dialect)
    ranked = exp.select(
        exp.column("row_id", table="p"),
        exp.alias_(exp.Window(
            this=exp.RowNumber(), partition_by=[exp.column("unit", table="p")],
            order=exp.Order(expressions=[exp.Ordered(this=h),
                                         exp.Ordered(this=exp.column("row_id", table="p"))])),
            "rk"),
    ).from_(pairs.subquery("p"))
    return (exp.select(exp.column("row_id", table="r")).from_(ranked.subquery("r"))
            .group_by(exp.column("row_id", table="r"))
            .having(exp.Max(this=exp.column("rk", table="r")) <= exp.Literal.number(k)))


def _row_hash(row_id: exp.Expr, seed: int, dialect: str) -> exp.Expr:
    if dialect == "spark":  # xxhash64 chains its arguments: the seed first keys the hash
        return exp.func("XXHASH64", exp.Literal.number(int(seed) % 2**62), row_id)
    if dialect == "postgres":
        return exp.Anonymous(this="hashtextextended", expressions=[
            exp.cast(row_id, exp.DType.TEXT), exp.Literal.number(int(seed) % 2**62)])
    return exp.Anonymous(this="hash", expressions=[row_id, exp.Literal.number(int(seed) % 2**62)])


def select(att: Attribution, method: Method, k: int, seed: int | None = None, *,
           u: int = 2, c1: int = 1, c2: int = 1, time_limit_seconds: float = 60.0,
           progress: Progress = _no_progress) -> Selection:
    """Run one of the in-memory methods (sql-rank runs in the database, see :func:`sql_rank`)."""
    started = time.perf_counter()
    if method == "greedy":
        result = greedy(att, k, seed, progress)
    elif method == "greedy-sparse":
        result = greedy_sparse(att, k, seed, progress)
    elif method == "greedy-balanced":
        result = greedy_balanced(att, k, seed, u, c1, c2, progress)
    elif method == "ilp":
        first = greedy_sparse(att, k, seed)
        progress(0.1)
        remaining = max(1.0, time_limit_seconds - (time.perf_counter() - started))
        result = ilp(att, k, remaining, start=first.keep)
        progress(1.0)
    else:
        raise ValueError(f"method {method!r} does not run in memory")
    check_bound(att, result.keep, k)
    return result
