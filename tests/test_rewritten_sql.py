"""The rewritten SQL itself: it re-parses in both dialects and carries every protection.

Structural checks rather than golden text: the exact formatting may change with sqlglot, the
protections may not.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import duckdb
import pytest
import sqlglot
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlglot import exp, parse_one

from chorus_py.engine import Engine
from rewriters.clipping import clipping

QUERIES = [
    "SELECT COUNT(*) FROM trips",
    "SELECT city, SUM(fare), AVG(distance_km) FROM trips WHERE fare > 10 GROUP BY city",
    "SELECT driver_id, COUNT(DISTINCT rider_id) FROM trips GROUP BY driver_id",
    "WITH s AS (SELECT * FROM trips WHERE city = 'SF') SELECT STDDEV(fare) FROM s",
    "SELECT page, COUNT(*) FROM visits GROUP BY page HAVING COUNT(*) > 5 ORDER BY 2 LIMIT 2",
]


@pytest.mark.parametrize("sql", QUERIES)
def test_rewritten_sql_reparses_and_is_protected(engine: Engine, sql: str) -> None:
    report = engine.explain(sql, analyst="alice", epsilon=1.0, delta=1e-6)
    text = report.rewritten_sql
    assert text is not None
    for dialect in ("duckdb", "postgres"):
        tree = sqlglot.parse_one(text, dialect=dialect)
        assert isinstance(tree, exp.Select)
    tree = sqlglot.parse_one(text, dialect=engine.dialect)
    # Noise is drawn once, in a MATERIALIZED CTE, and only there.
    (cte,) = tree.args["with_"].expressions
    assert cte.args.get("materialized") and cte.alias == "chorus_noisy"
    assert cte.find(exp.Rand) is not None
    outer = tree.copy()
    outer.set("with_", None)
    assert outer.find(exp.Rand) is None, "no random() outside the noisy CTE"
    # Every table read is a declared table, restricted to the claimed blocks when it has them.
    # (A ranked copy of a table in the proxy's schema reads as the table it copies.)
    tables = {t.name.split("__ranked_")[0] for t in tree.find_all(exp.Table)} - {"chorus_noisy"}
    assert tables <= {"trips", "visits"}
    if "trips" in tables:
        assert "pickup_time" in text and "2026-01-01 00:00:00" in text
        # User-level: rows are bounded per rider before aggregation (ranked per query, or by
        # the stored ranks of the table's ranked copy when every row passes the filter, or
        # a DuckDB twin's first rows of each rider: rewriters.contribution.streamed_rank).
        assert any(isinstance(w.this, exp.RowNumber) for w in tree.find_all(exp.Window)) \
            or re.search(r"__ranked_\w+\"? AS \w+ WHERE .* AND \w+\.__chorus_rank <= \d+", text) \
            or (engine.dialect == "duckdb" and "LAG(trips.__chorus_pos, 1, 0) OVER ()" in text
                and re.search(r"LAG\(trips\.__chorus_run, \d+, 0\) OVER \(\) <> "
                              r"trips\.__chorus_run END", text))
    # Every summed value is clipped (LEAST(GREATEST(...)), or a column's comparisons, or a
    # DuckDB ranked copy's stored clipped value, tests/test_stored_bins.py); on Postgres a
    # ranked copy's branches are summed apart, then their sums added (those sums of
    # chorus_parts' columns are the clipped sums themselves, checked here too).
    for total in cte.find_all(exp.Sum):
        if isinstance(total.this, exp.Column) and total.this.table == "chorus_parts":
            continue
        assert (total.find(exp.Least) is not None and total.find(exp.Greatest) is not None) \
            or any(_clamps_a_column(case) for case in total.find_all(exp.Case)) \
            or (engine.dialect == "duckdb" and any(
                re.fullmatch(r"__chorus_clip\d+", c.name) for c in total.find_all(exp.Column)))


def _clamps_a_column(case: exp.Case) -> bool:
    """``CASE WHEN c < l THEN l WHEN c > u THEN u ELSE c END`` (a NULL c reaches ELSE c)."""
    ifs = case.args.get("ifs") or []
    column = case.args.get("default")
    if len(ifs) != 2 or not isinstance(column, exp.Column):
        return False
    low, high = (i.this for i in ifs)
    return (isinstance(low, exp.LT) and low.this == column
            and low.expression == ifs[0].args["true"]
            and isinstance(high, exp.GT) and high.this == column
            and high.expression == ifs[1].args["true"])


def test_thresholded_keys_are_gated_in_the_outer_query(engine: Engine) -> None:
    report = engine.explain("SELECT driver_id, COUNT(*) FROM trips GROUP BY driver_id",
                            analyst="alice", epsilon=1.0, delta=1e-6)
    tree = sqlglot.parse_one(report.rewritten_sql, dialect=engine.dialect)
    where = tree.args["where"].this
    assert isinstance(where, exp.GT)
    assert float(where.expression.name) == pytest.approx(report.key_release.threshold)


NULLS_POLICY = """
[backend]
url = "{url}"

[privacy]
epsilon_per_block = 1e9
max_epsilon_per_query = 1e8

[tables.readings]

[tables.readings.columns]
value = {{ type = "float", lower = 5, upper = 10 }}

[analysts.alice]
"""


def test_null_values_stay_null_when_clipped(scratch: Callable[..., Engine],
                                            backend_url: str) -> None:
    """Postgres's GREATEST(NULL, 5) is 5: clipping must not turn NULL rows into the lower bound.

    100 rows of 7 and 100 NULLs: SUM 700 and AVG 7 (not 1200 and 6) at a huge epsilon.
    """
    double = "DOUBLE" if backend_url.startswith("duckdb") else "DOUBLE PRECISION"
    engine = scratch("readings", [
        f"CREATE TABLE readings AS SELECT CASE WHEN i % 2 = 0 THEN CAST(7 AS {double}) END AS "
        "value FROM generate_series(1, 200) AS g(i)"], NULLS_POLICY)
    result = engine.execute("SELECT SUM(value), AVG(value), COUNT(value) FROM readings",
                            epsilon=1e6, analyst="alice")
    total, mean, count = result.rows[0]
    assert total == pytest.approx(700, abs=1)
    assert mean == pytest.approx(7, abs=0.01)
    assert count == pytest.approx(100, abs=1)


SPECIAL = ["'NaN'", "'Infinity'", "'-Infinity'", "NULL", "-5", "0", "3.5", "200", "1e308",
           "-1e-320"]


def test_a_column_clamp_agrees_with_least_greatest_on_every_value(engine: Engine) -> None:
    """The two clip forms (``rewriters.clipping``) give the same value for every double,
    NaN and infinities included, on the backend itself: NaN sorts above every number there.
    Comparisons for a column and for arithmetic, LEAST/GREATEST around a CASE."""
    flavour = engine.dialect
    column = exp.column("x", table="v")
    by_case = clipping(column, -1, 200).sql(flavour)
    compound = clipping(parse_one("v.x * 1"), -1, 200).sql(flavour)
    by_least = clipping(parse_one("COALESCE(CASE WHEN TRUE THEN v.x END, v.x)"), -1,
                        200).sql(flavour)
    assert "LEAST" not in by_case and "LEAST" not in compound and "LEAST" in by_least
    rows = ", ".join(f"(CAST({v} AS DOUBLE PRECISION))" for v in SPECIAL)
    got = engine.backend.run(f"SELECT {by_case}, {compound}, {by_least} FROM (VALUES {rows}) "
                             "AS v(x)").rows
    expected = [200.0, 200.0, -1.0, None, -1.0, 0.0, 3.5, 200.0, 200.0, -1e-320]
    assert [list(r) for r in got] == [[e, e, e] for e in expected]


#: CASEs of a double x and a condition c (each a NULL now and then), as an analyst writes them.
CASES = [
    "CASE WHEN v.c THEN v.x END",
    "CASE WHEN v.c THEN v.x ELSE 0 END",
    "CASE WHEN v.c THEN 1 ELSE 0 END",
    "CASE WHEN v.c THEN 500 ELSE -7 END",
    "CASE WHEN v.c THEN 0.25 WHEN NOT v.c THEN NULL END",
    "CASE WHEN v.c THEN v.x / 2 WHEN v.x > 3 THEN NULL ELSE v.x END",
    "CASE v.x WHEN 0 THEN 1 WHEN 3.5 THEN 250 ELSE v.x END",
    "CASE WHEN v.c THEN CASE WHEN v.x > 0 THEN v.x ELSE -9 END ELSE 2.5 END",
    "(CASE WHEN NOT v.c THEN v.x END)",
]


@pytest.mark.parametrize("case", CASES)
def test_a_case_clipped_branch_by_branch_is_the_case_clipped_whole(engine: Engine,
                                                                   case: str) -> None:
    """A CASE of constants is clipped in each of its branches (``rewriters.clipping``), any
    other around it: on the backend itself, every row gets the value of the whole CASE
    clipped (NULL kept NULL, NaN and infinities included), each value within the bounds."""
    flavour = engine.dialect
    lower, upper = -1, 200
    tree = parse_one(case)
    branchwise = clipping(tree, lower, upper).sql(flavour)
    # Only a CASE of constants is clipped in its branches (a column's stays around it).
    assert branchwise.startswith("CASE WHEN v.c THEN CASE") == ("v.x" not in case)
    whole = tree.sql(flavour)
    by_hand = (f"CASE WHEN ({whole}) IS NULL THEN NULL ELSE LEAST(GREATEST(({whole}), {lower}), "
               f"{upper}) END")
    rows = ", ".join(f"(CAST({v} AS DOUBLE PRECISION), {c})" for v in SPECIAL
                     for c in ("TRUE", "FALSE", "CAST(NULL AS BOOLEAN)"))
    got = engine.backend.run(f"SELECT {branchwise}, {by_hand} FROM (VALUES {rows}) AS v(x, c)"
                             ).rows
    assert all(a == b or (a != a and b != b) for a, b in got), got
    assert all(a is None or lower <= a <= upper for a, _ in got)


@given(st.floats(allow_nan=True, allow_infinity=True) | st.none(),
       st.floats(-1e6, 1e6), st.floats(0, 1e6))
@settings(max_examples=200, deadline=None)
def test_the_column_clamp_is_within_its_bounds(value: float | None, lower: float,
                                               width: float) -> None:
    upper = lower + width
    con = duckdb.connect()
    clamp = clipping(exp.column("x"), lower, upper).sql("duckdb")
    got = con.execute(f"SELECT {clamp} FROM (SELECT CAST(? AS DOUBLE) AS x)", [value]).fetchone()[0]
    if value is None:
        assert got is None
    else:
        assert lower <= got <= upper
        assert got == (upper if math.isnan(value) else min(max(value, lower), upper))
