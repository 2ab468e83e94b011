"""Property tests of the quantile parser (``analyses.quantiles``): every spelling of a quantile,
in both dialects, gives back its fraction (the complement under ORDER BY ... DESC), and the
substitution leaves one marked SUM per quantile."""

from __future__ import annotations

import pytest
import sqlglot
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from sqlglot import exp

from analyses.quantiles import MAX_P, MIN_P, asks_quantiles, substitute
from chorus_py.errors import QueryRefused

FRACTIONS = st.integers(0, 1000).map(lambda i: i / 1000)


@settings(max_examples=60, deadline=None)
@given(p=FRACTIONS, dialect=st.sampled_from(["duckdb", "postgres"]),
       desc=st.booleans())
def test_within_group_fraction(p: float, dialect: str, desc: bool) -> None:
    sql = (f"SELECT PERCENTILE_DISC({p}) WITHIN GROUP (ORDER BY x{' DESC' if desc else ''}) "
           "FROM t")
    assert asks_quantiles(sql, dialect)
    tree, found = substitute(sqlglot.parse_one(sql, read=dialect))
    ((got, name, _),) = found
    assert got == pytest.approx(1 - p if desc else p) and name == "PERCENTILE_DISC"
    assert len(list(tree.find_all(exp.Sum))) == 1
    assert not any(isinstance(n, exp.WithinGroup) for n in tree.walk())


@settings(max_examples=60, deadline=None)
@given(p=FRACTIONS, spelling=st.sampled_from(["QUANTILE_CONT", "QUANTILE_DISC", "QUANTILE",
                                              "APPROX_QUANTILE"]))
def test_duckdb_function_fraction(p: float, spelling: str) -> None:
    # (p equal to one of the others may be the same release: asked once, tested elsewhere)
    assume(p not in (0.5, MIN_P, MAX_P))
    sql = f"SELECT {spelling}(x, {p}), MEDIAN(x), MIN(x), MAX(x) FROM t"
    _, found = substitute(sqlglot.parse_one(sql, read="duckdb"))
    assert [f[0] for f in found] == pytest.approx([p, 0.5, MIN_P, MAX_P])


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM t", "SELECT LEAST(a, b) FROM t", "SELEC broken",
    "SELECT SUM(x) FROM t WHERE y > 1",
])
def test_not_quantiles(sql: str) -> None:
    assert not asks_quantiles(sql, "duckdb")


@pytest.mark.parametrize("sql", [
    "SELECT QUANTILE_CONT(x, -0.1) FROM t", "SELECT QUANTILE_CONT(x, y) FROM t",
    "SELECT PERCENTILE_CONT('0.5') WITHIN GROUP (ORDER BY x) FROM t",
])
def test_bad_fractions(sql: str) -> None:
    with pytest.raises(QueryRefused):
        substitute(sqlglot.parse_one(sql, read="duckdb"))
