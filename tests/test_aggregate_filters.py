"""``AGG(x) FILTER (WHERE c)`` answered as ``AGG(CASE WHEN c THEN x END)``
(analyses.aggregate_filters).

The spelling is rewritten before any analysis, so the tests check two things: that the two
forms aggregate the same rows on a real database (raw SQL, random data with NULLs), and that
the engine answers the FILTER form with exactly the statement it sends for the CASE form, on
both backends; forms it does not rewrite stay refused, at no cost.
"""

from __future__ import annotations

import math

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlglot import parse_one

from analyses.aggregate_filters import filters_as_case
from chorus_py.errors import ChorusError
from tests.conftest import nothing_spent, tolerance

_AGGREGATES = ("COUNT(*)", "COUNT(x)", "COUNT(DISTINCT x)", "SUM(x)", "AVG(x)", "MIN(x)",
               "MAX(x)", "VAR_SAMP(x)", "STDDEV(x)", "MEDIAN(x)",
               "PERCENTILE_CONT(0.3) WITHIN GROUP (ORDER BY x)")
_CONDITIONS = ("y > 2", "y IS NULL", "x < y", "NOT (y = 1)", "g = 'a' OR y BETWEEN 1 AND 3",
               "CASE WHEN x > 0 THEN y > 1 END", "FALSE", "x IS NOT NULL AND y <> 2")

_rows = st.lists(st.tuples(st.sampled_from(["a", "b", "c"]),
                           st.one_of(st.none(), st.integers(-3, 5)),
                           st.one_of(st.none(), st.integers(0, 4))), max_size=25)


def _same(left: object, right: object) -> bool:
    if isinstance(left, float) and isinstance(right, float):
        return math.isclose(left, right, rel_tol=1e-9, abs_tol=1e-9) or (
            math.isnan(left) and math.isnan(right))
    return left == right


@settings(max_examples=150, deadline=None)
@given(rows=_rows, aggregate=st.sampled_from(_AGGREGATES),
       condition=st.sampled_from(_CONDITIONS), grouped=st.booleans())
def test_the_case_form_aggregates_the_rows_the_filter_keeps(rows, aggregate, condition, grouped):
    """On DuckDB itself, over random rows with NULLs: every aggregate, every condition,
    grouped or not, the rewritten query returns what the FILTER query returns."""
    con = duckdb.connect()
    con.execute("CREATE TABLE t (g TEXT, x INTEGER, y INTEGER)")
    if rows:
        con.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)
    keys = "g, " if grouped else ""
    sql = (f"SELECT {keys}{aggregate} FILTER (WHERE {condition}) AS v FROM t"
           + (" GROUP BY g ORDER BY g" if grouped else ""))
    rewritten = filters_as_case(parse_one(sql, read="duckdb"))
    assert "FILTER" not in rewritten.sql("duckdb").upper()
    expected = con.execute(sql).fetchall()
    got = con.execute(rewritten.sql("duckdb")).fetchall()
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert all(_same(x, y) for x, y in zip(a, b, strict=True)), (sql, got, expected)


@pytest.mark.parametrize(("filtered", "case"), [
    ("SELECT COUNT(*) FILTER (WHERE fare > 30) FROM trips",
     "SELECT COUNT(CASE WHEN fare > 30 THEN 1 END) FROM trips"),
    ("SELECT city, SUM(fare) FILTER (WHERE distance_km > 5) AS s FROM trips GROUP BY city",
     "SELECT city, SUM(CASE WHEN distance_km > 5 THEN fare END) AS s FROM trips GROUP BY city"),
    ("SELECT AVG(fare) FILTER (WHERE city = 'SF'), COUNT(DISTINCT rider_id) FILTER "
     "(WHERE fare > 10) FROM trips",
     "SELECT AVG(CASE WHEN city = 'SF' THEN fare END), COUNT(DISTINCT CASE WHEN fare > 10 "
     "THEN rider_id END) FROM trips"),
    ("SELECT PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY fare) FILTER (WHERE city = 'LA') "
     "FROM trips",
     "SELECT PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY CASE WHEN city = 'LA' THEN fare END) "
     "FROM trips"),
    ("SELECT city, COUNT(*) FILTER (WHERE fare > 30), MAX(fare) FILTER (WHERE fare < 50) "
     "FROM trips GROUP BY city",
     "SELECT city, COUNT(CASE WHEN fare > 30 THEN 1 END), MAX(CASE WHEN fare < 50 THEN fare "
     "END) FROM trips GROUP BY city"),
])
def test_the_engine_sends_the_case_forms_statement(engine, filtered, case):
    """The FILTER form costs what the CASE form costs and is answered by the same statement."""
    by_filter = engine.explain(filtered, analyst="alice", epsilon=1.0)
    by_case = engine.explain(case, analyst="alice", epsilon=1.0)
    assert by_filter.rewritten_sql == by_case.rewritten_sql
    assert by_filter.epsilon == by_case.epsilon == 1.0
    assert [(m.sensitivity, m.mechanism) for m in by_filter.measurements] == \
        [(m.sensitivity, m.mechanism) for m in by_case.measurements]


def test_a_filtered_count_is_answered_as_its_case_form(engine):
    """Both read the same kept rows (the ranked copy's, at the fixed cap): the answers differ
    by their noise only."""
    by_filter = engine.execute("SELECT COUNT(*) FILTER (WHERE fare > 30) AS n FROM trips",
                               analyst="alice", epsilon=100.0)
    by_case = engine.execute("SELECT COUNT(CASE WHEN fare > 30 THEN 1 END) AS n FROM trips",
                             analyst="alice", epsilon=100.0)
    assert by_filter.columns == by_case.columns == ("n",)
    assert by_filter.rows[0][0] > 0
    assert abs(by_filter.rows[0][0] - by_case.rows[0][0]) <= 2 * tolerance(
        by_filter.report.columns[0])


@pytest.mark.parametrize("sql", [
    "SELECT SUM(fare) FILTER (WHERE fare > 1) OVER () FROM trips",  # a window, not an aggregate
    "SELECT COUNT(*) FILTER (WHERE rider_id IN (SELECT rider_id FROM trips)) FROM trips",
    "SELECT COUNT(*) FILTER (WHERE LN(fare) > 1) FROM trips",  # may fail on a row: refused
    "SELECT SUM(COUNT(*)) FILTER (WHERE fare > 1) FROM trips",
    "SELECT COUNT(*) FILTER (WHERE fare > 1) FROM trips t, LATERAL (SELECT 1) x",
])
def test_forms_it_does_not_rewrite_stay_refused_at_no_cost(engine, sql):
    with pytest.raises(ChorusError):
        engine.execute(sql, analyst="alice", epsilon=1.0)
    assert nothing_spent(engine)
