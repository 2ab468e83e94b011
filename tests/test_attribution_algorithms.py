"""The selection algorithms of ``rewriters.attribution`` (no database)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewriters.attribution import (
    Attribution,
    balanced_order,
    greedy,
    greedy_balanced,
    greedy_in_order,
    greedy_loop,
    greedy_sparse,
    ilp,
    random_order,
    select,
    sparse_first_order,
)


@st.composite
def hypergraphs(draw: st.DrawFn) -> Attribution:
    """Up to 40 rows, each with 0..5 units drawn from up to 15 (duplicates allowed)."""
    n = draw(st.integers(1, 40))
    n_units = draw(st.integers(1, 15))
    rows = [draw(st.lists(st.integers(0, n_units - 1), max_size=5)) for _ in range(n)]
    pair_rows = np.array([i for i, units in enumerate(rows) for _ in units], dtype=np.int64)
    pair_units = np.array([u for units in rows for u in units], dtype=np.int64)
    return Attribution.from_pairs(np.arange(n) * 10 + 7, pair_rows * 10 + 7, pair_units)


@settings(max_examples=200, deadline=None)
@given(hypergraphs(), st.integers(1, 4), st.integers(0, 2**32))
def test_vectorised_greedy_is_the_sequential_greedy(att: Attribution, k: int, seed: int) -> None:
    position = random_order(att.n_rows, seed)
    keep, _ = greedy_in_order(att, position, k)
    assert np.array_equal(keep, greedy_loop(att, position, k))


@settings(max_examples=100, deadline=None)
@given(hypergraphs(), st.integers(1, 3), st.integers(0, 1000))
def test_every_method_respects_the_bound(att: Attribution, k: int, seed: int) -> None:
    for method in ("greedy", "greedy-sparse", "greedy-balanced", "ilp"):
        keep = select(att, method, k, seed).keep
        assert att.rows_per_unit(keep).max(initial=0) <= k
        assert not keep[att.degrees() == 0].any()  # a row of nobody is never kept


@settings(max_examples=60, deadline=None)
@given(hypergraphs(), st.integers(1, 3), st.integers(0, 1000))
def test_ilp_never_keeps_fewer_rows_than_greedy(att: Attribution, k: int, seed: int) -> None:
    first = greedy(att, k, seed).keep
    sparse = greedy_sparse(att, k, seed).keep
    best = ilp(att, k, 10.0)
    assert best.optimal
    assert best.keep.sum() >= max(first.sum(), sparse.sum())
    assert ilp(att, k, 10.0, start=first).keep.sum() >= first.sum()


def test_greedy_is_maximal() -> None:
    # No row left out could be added: one of its units is already at k (greedy's invariant).
    rng = np.random.default_rng(5)
    pr = rng.integers(0, 500, 1500)
    att = Attribution.from_pairs(np.arange(500), pr, rng.integers(0, 80, 1500))
    keep = greedy(att, 2, seed=1).keep
    full = att.rows_per_unit(keep) >= 2
    left_out = np.flatnonzero(~keep & (att.degrees() > 0))
    blocked = np.bincount(att.pair_row, weights=full[att.pair_unit], minlength=500) > 0
    assert blocked[left_out].all()


def test_ilp_finds_the_optimum_greedy_can_miss() -> None:
    # Row 0 holds authors 1, 2, 3; rows 1-3 one author each; k = 1.  The optimum keeps rows 1-3
    # (3 rows); greedy keeps only row 0 whenever it comes first.
    att = Attribution.from_pairs(np.arange(4), np.array([0, 0, 0, 1, 2, 3]),
                                 np.array([1, 2, 3, 1, 2, 3]))
    assert ilp(att, 1).keep.tolist() == [False, True, True, True]
    assert ilp(att, 1).optimal
    first_is_zero = next(s for s in range(100) if random_order(4, s)[0] == 0)
    assert greedy(att, 1, first_is_zero).keep.sum() == 1


def test_selection_is_deterministic_given_a_seed() -> None:
    rng = np.random.default_rng(0)
    att = Attribution.from_pairs(np.arange(300), rng.integers(0, 300, 900),
                                 rng.integers(0, 60, 900))
    for method in ("greedy", "greedy-sparse", "greedy-balanced"):
        a, b = select(att, method, 2, seed=42).keep, select(att, method, 2, seed=42).keep
        assert np.array_equal(a, b)
        assert not np.array_equal(a, select(att, method, 2, seed=43).keep)


def test_balanced_order_alternates_c1_small_and_c2_large_rows() -> None:
    # Rows 0-5 have one unit (small for u = 1), rows 6-11 two units (large).
    pr = np.r_[np.arange(6), np.repeat(np.arange(6, 12), 2)]
    att = Attribution.from_pairs(np.arange(12), pr, np.arange(len(pr)))
    position = balanced_order(att, seed=3, u=1, c1=2, c2=1)
    sequence = np.argsort(position)
    pattern = ["s" if r < 6 else "l" for r in sequence]
    assert "".join(pattern) == "sslsslssllll"


def test_balanced_with_a_large_u_is_plain_random_order_greedy() -> None:
    rng = np.random.default_rng(2)
    att = Attribution.from_pairs(np.arange(200), rng.integers(0, 200, 600),
                                 rng.integers(0, 40, 600))
    kept = greedy_balanced(att, 2, seed=9, u=100, c1=1, c2=1).keep
    assert att.rows_per_unit(kept).max() <= 2 and kept.sum() > 0


def test_pairs_count_once_and_unknown_rows_are_ignored() -> None:
    # Row 5 names unit 9 twice (one row for that unit); pair for row 99 names no known row.
    att = Attribution.from_pairs(np.array([5, 6]), np.array([5, 5, 6, 99]),
                                 np.array([9, 9, 9, 9]))
    assert att.degrees().tolist() == [1, 1]
    assert att.n_units == 1
    assert greedy(att, 2, seed=0).keep.tolist() == [True, True]


def test_row_ids_must_be_unique() -> None:
    with pytest.raises(ValueError, match="not unique"):
        Attribution.from_pairs(np.array([3, 1, 3]), np.array([1]), np.array([1]))


def test_text_units_work_like_integers() -> None:
    att = Attribution.from_columns(np.arange(4), [np.array(["a", "a", "b", "b"]),
                                                 np.array(["x", "y", "x", "y"])],
                                   [np.zeros(4, bool), np.array([False, False, False, True])])
    assert att.n_units == 4
    assert att.degrees().tolist() == [2, 2, 2, 1]
    assert att.rows_per_unit(greedy(att, 1, seed=0).keep).max() <= 1


def test_sparse_first_puts_rows_of_rarely_seen_units_first() -> None:
    # Unit 1 has 3 rows, unit 2 one row: row 3 (unit 2, key 1) goes first, then the others.
    att = Attribution.from_pairs(np.arange(4), np.array([0, 1, 2, 3]), np.array([1, 1, 1, 2]))
    position = sparse_first_order(att, seed=0)
    assert position[3] == 0 and sorted(position[:3].tolist()) == [1, 2, 3]
    # Row 0 holds authors 1-3, rows 1-3 one each (k = 1): sparse-first finds the optimum.
    star = Attribution.from_pairs(np.arange(4), np.array([0, 0, 0, 1, 2, 3]),
                                  np.array([1, 2, 3, 1, 2, 3]))
    assert greedy_sparse(star, 1, seed=0).keep.tolist() == [False, True, True, True]


def brute_force_optimum(att: Attribution, k: int) -> int:
    """The most rows any S within the bound keeps, by enumerating every subset of the rows
    that have units (an independent check of the ILP: no solver involved)."""
    candidates = np.flatnonzero(att.degrees() > 0)
    best = 0
    for mask in range(1 << len(candidates)):
        keep = np.zeros(att.n_rows, dtype=bool)
        chosen = [candidates[i] for i in range(len(candidates)) if mask >> i & 1]
        if len(chosen) <= best:
            continue
        keep[chosen] = True
        if att.rows_per_unit(keep).max(initial=0) <= k:
            best = len(chosen)
    return best


@st.composite
def small_hypergraphs(draw: st.DrawFn) -> Attribution:
    """Up to 12 rows (2^12 subsets to enumerate), each with 1..3 of up to 6 units."""
    n = draw(st.integers(1, 12))
    n_units = draw(st.integers(1, 6))
    rows = [draw(st.lists(st.integers(0, n_units - 1), min_size=1, max_size=3))
            for _ in range(n)]
    pair_rows = np.array([i for i, units in enumerate(rows) for _ in units], dtype=np.int64)
    pair_units = np.array([u for units in rows for u in units], dtype=np.int64)
    return Attribution.from_pairs(np.arange(n), pair_rows, pair_units)


@settings(max_examples=150, deadline=None)
@given(small_hypergraphs(), st.integers(1, 3), st.integers(0, 1000))
def test_ilp_with_a_warm_start_reaches_the_brute_force_optimum(
        att: Attribution, k: int, seed: int) -> None:
    """``select(..., "ilp")`` starts HiGHS from the greedy's S; what it returns as optimal must
    keep as many rows as the best subset found by enumeration."""
    result = select(att, "ilp", k, seed)
    assert result.optimal
    assert result.keep.sum() == brute_force_optimum(att, k)


def test_ilp_reads_the_optimum_not_the_start() -> None:
    """An instance where HiGHS 1.16, given the greedy's 14 rows as a start, reported an optimal
    objective of 15 while returning the start's values: the 15 rows must come back."""
    rng = np.random.default_rng(0)
    for _ in range(293):  # the 293rd instance of this seeded stream
        n, units, k = int(rng.integers(5, 60)), int(rng.integers(3, 12)), int(rng.integers(1, 4))
        pairs = [(r, u) for r in range(n)
                 for u in rng.choice(units, size=int(rng.integers(1, 4)), replace=False)]
    att = Attribution.from_pairs(np.arange(n), np.array([p[0] for p in pairs]),
                                 np.array([p[1] for p in pairs]))
    start = greedy_sparse(att, k, seed=292).keep
    cold = ilp(att, k, 10.0)
    warm = ilp(att, k, 10.0, start=start)
    assert cold.optimal and warm.optimal
    assert warm.keep.sum() == cold.keep.sum() > start.sum()
