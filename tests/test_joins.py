"""Joins: the elastic stability of analysed queries against hand-derived values, and refusals.

Pure: the queries are analysed against a policy in memory, with max frequencies given by hand.
"""

from __future__ import annotations

import math

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyses.join_groups import groups_per_unit
from analyses.query import AggregateQuery, analyze_query
from analyses.smoothing import resolve
from analyses.validate import parse_statement
from chorus_py.errors import InvalidParameter, NotSupportedError, QueryRefused
from chorus_py.policy import Policy, parse_policy
from chorus_py.stores.frequencies import frequency_sql

COLUMNS = {
    "orders": {"order_id": {"type": "int"}, "customer_id": {"type": "int"},
               "shop_id": {"type": "int"}, "day": {"type": "timestamp"},
               "amount": {"type": "float", "lower": 0, "upper": 100}},
    "recs": {"rec_id": {"type": "int"}, "customer_id": {"type": "int"}},
    "items": {"order_id": {"type": "int"}, "qty": {"type": "float", "lower": 0, "upper": 10}},
    "customers": {"customer_id": {"type": "int", "max_frequency": 1},
                  "region": {"type": "text", "public_values": ["north", "south"]}},
    "riders": {"rider_id": {"type": "int", "private_id": True},
               "city": {"type": "text", "public_values": ["SF", "LA"]}},
    "rides": {"ride_id": {"type": "int"}, "rider_id": {"type": "int", "private_id": True},
              "shop_id": {"type": "int"}, "fare": {"type": "float", "lower": 0, "upper": 50},
              "driver_id": {"type": "int"}},
    "drivers": {"driver_id": {"type": "int"}, "rating": {"type": "float"}},
    "couriers": {"courier_id": {"type": "int"}, "driver_id": {"type": "int"}},
}
PUBLIC = {"shops": {"shop_id": "integer", "city": "text"}}


def _policy() -> Policy:
    tables: dict[str, object] = {name: {"columns": cols} for name, cols in COLUMNS.items()}
    tables["riders"] = {"columns": COLUMNS["riders"], "privacy_unit": "rider_id",
                        "max_rows_per_unit": 1, "contribution": "fixed"}
    tables["rides"] = {"columns": COLUMNS["rides"], "privacy_unit": "rider_id",
                       "max_rows_per_unit": 3}
    tables["couriers"] = {"columns": COLUMNS["couriers"], "privacy_unit": "courier_id",
                          "max_rows_per_unit": 2, "contribution": "fixed"}
    tables["shops"] = {"public": True}
    return parse_policy({"backend": {"url": "duckdb:///:memory:"},
                         "privacy": {"epsilon_per_block": 10.0}, "tables": tables})


POLICY = _policy()


def analyse(sql: str) -> AggregateQuery:
    parsed = parse_statement(sql, "duckdb", frozenset(POLICY.tables))
    query = analyze_query(parsed, POLICY, "duckdb", PUBLIC)
    assert isinstance(query, AggregateQuery) and query.join is not None
    return query


def s_at(sql: str, mf: dict[str, float], *ks: int) -> list[float]:
    query = analyse(sql)
    assert query.join is not None
    return [query.join.stability.at(k, mf) for k in ks]


MF = {"orders.customer_id": 100, "recs.customer_id": 250}


# -- hand-derived stabilities ---------------------------------------------------------------------

def test_worked_join() -> None:
    sql = "SELECT COUNT(*) FROM orders o JOIN recs r ON o.customer_id = r.customer_id"
    assert s_at(sql, MF, 0, 2) == [250, 252]


def test_worked_self_join() -> None:
    sql = "SELECT COUNT(*) FROM orders a JOIN orders b ON a.customer_id = b.customer_id"
    assert s_at(sql, MF, 0, 2, 15) == [201, 205, 231]


def test_comma_join_with_where_equality() -> None:
    sql = ("SELECT COUNT(*) FROM orders o, recs r WHERE o.customer_id = r.customer_id "
           "AND o.amount > 5")
    assert s_at(sql, MF, 0, 2) == [250, 252]


def test_join_inside_cte_that_filters() -> None:
    sql = ("WITH big AS (SELECT * FROM orders WHERE amount > 10) "
           "SELECT COUNT(*) FROM big JOIN recs ON big.customer_id = recs.customer_id")
    assert s_at(sql, MF, 0) == [250]


def test_join_of_subquery_that_projects() -> None:
    sql = ("SELECT COUNT(*) FROM (SELECT customer_id FROM recs WHERE rec_id > 3) AS r "
           "JOIN orders o ON o.customer_id = r.customer_id")
    assert s_at(sql, MF, 0) == [250]


def test_nested_ands_in_on_are_flattened() -> None:
    """Uber's elastic-sensitivity tests write ``ON (a AND (b AND (x.k = y.k)))``: the same
    join and stability as the flat form, the non-join parts kept as filters."""
    flat = ("SELECT COUNT(*) FROM orders o JOIN recs r ON o.customer_id = r.customer_id "
            "AND o.amount > 5 AND r.rec_id > 3")
    nested = ("SELECT COUNT(*) FROM orders o JOIN recs r ON (o.amount > 5 AND (r.rec_id > 3 "
              "AND ((o.customer_id = r.customer_id))))")
    assert s_at(nested, MF, 0, 2) == s_at(flat, MF, 0, 2) == [250, 252]


def test_three_table_join() -> None:
    # R = o JOIN r: S_R = max(4 + k, 3 + k); mf_k(o.order_id, R) = (1 + k)(3 + k).
    # R JOIN i ON i.order_id = o.order_id: S = max((1+k)(3+k) * 1, (5 + k) * S_R):
    # k=0: max(3, 5 * 4) = 20; k=1: max(2 * 4, 6 * 5) = 30; k=10: max(11*13, 15*14) = 210.
    sql = ("SELECT COUNT(*) FROM orders o JOIN recs r ON o.customer_id = r.customer_id "
           "JOIN items i ON i.order_id = o.order_id")
    mf = {"orders.customer_id": 4, "recs.customer_id": 3, "items.order_id": 5,
          "orders.order_id": 1}
    assert s_at(sql, mf, 0, 1, 10) == [20, 30, 210]


def test_join_to_public_table() -> None:
    # S = max(mf_k(o.shop_id) * 0, mf(shops.shop_id) * 1) = mf(shops.shop_id), at every k.
    sql = "SELECT COUNT(*) FROM orders o JOIN shops s ON o.shop_id = s.shop_id"
    mf = {"orders.shop_id": 40, "shops.shop_id": 2}
    assert s_at(sql, mf, 0, 50) == [2, 2]
    query = analyse(sql)
    assert query.join is not None
    # mf(orders.shop_id) was multiplied by the public table's stability 0: it is neither read
    # nor does it make the scale data-dependent.
    sources = {m.name: m.source for m in query.join.metrics}
    assert sources == {"shops.shop_id": "public"}
    assert not query.join.data_dependent


def test_compound_key_smallest_wins() -> None:
    # ON customer_id (max(10 + k, 20 + k)) AND order_id = rec_id (max(1 + k, 1 + k)): 1 + k.
    sql = ("SELECT COUNT(*) FROM orders o JOIN recs r ON o.customer_id = r.customer_id "
           "AND o.order_id = r.rec_id")
    mf = {"orders.customer_id": 10, "recs.customer_id": 20, "orders.order_id": 1,
          "recs.rec_id": 1}
    assert s_at(sql, mf, 0, 2) == [1, 3]


def test_self_join_on_unique_pinned_key() -> None:
    # mf pinned to 1: 1 + 1 + 1 = 3 at k = 0; nothing is read from the data.
    sql = ("SELECT COUNT(*) FROM customers a JOIN customers b "
           "ON a.customer_id = b.customer_id")
    query = analyse(sql)
    assert query.join is not None and not query.join.data_dependent
    mf = {"customers.customer_id": 1}
    assert [query.join.stability.at(k, mf) for k in (0, 1)] == [3, 5]


def test_user_level_same_unit_grouped() -> None:
    # rides (<= 3 rows per rider) JOIN riders (<= 1) on the unit: removing a rider removes its
    # <= 3 rides and its 1 rider row, and only their pairs join: S = 3 * 1 = 3 at every k,
    # data-independent (the shared rule without the unit gave 3 * 1 + 1 * 3 + 3 * 1 = 9).
    sql = ("SELECT ri.city, COUNT(*) FROM rides r JOIN riders ri ON r.rider_id = ri.rider_id "
           "GROUP BY ri.city")
    query = analyse(sql)
    assert query.join is not None and query.join.metrics == ()
    assert [query.join.stability.at(k, {}) for k in (0, 7)] == [3, 3]
    assert query.keys[0].public_values == ("SF", "LA")


def test_user_level_join_to_public() -> None:
    # rides, 3 rows per rider, to a public table: S = 3 * mf(shops.shop_id) = 6.
    sql = "SELECT COUNT(*) FROM rides r JOIN shops s ON r.shop_id = s.shop_id"
    assert s_at(sql, {"rides.shop_id": 50, "shops.shop_id": 2}, 0, 9) == [6, 6]


def test_user_level_join_on_other_column_grows_by_cap() -> None:
    # rides self-join on shop_id, S1 = S2 = 3, mf_k = mf + 3k: S = mf_k * 3 + mf_k * 3 + 3 * 3;
    # mf 4: 12 + 12 + 9 = 33 at k = 0, 21 + 21 + 9 = 51 at k = 1.
    sql = "SELECT COUNT(*) FROM rides a JOIN rides b ON a.shop_id = b.shop_id"
    assert s_at(sql, {"rides.shop_id": 4}, 0, 1) == [33, 51]


def test_sum_and_avg_sensitivity() -> None:
    sql = ("SELECT SUM(o.amount), AVG(o.amount) FROM orders o JOIN recs r "
           "ON o.customer_id = r.customer_id")
    query = analyse(sql)
    assert all(math.isinf(m.sensitivity) for m in query.measurements)  # until resolved
    resolved, info = resolve(query, 0.3, 3e-8, MF)
    # 3 measurements: epsilon_i 0.1, delta_i 1e-8: S(k) = 250 + k gives S* = 270.459.
    assert info.epsilon_each == pytest.approx(0.1) and info.delta_each == pytest.approx(1e-8)
    assert info.bound.value == pytest.approx(270.459, abs=1e-3) and info.bound.peak_k == 132
    by_kind = {(m.kind, m.center): m for m in resolved.measurements}
    total = by_kind[("sum", 0.0)]
    # SUM: grid steps of 100 / 4096, 4096 steps per row: 2 S* * 4096 steps, i.e. 2 S* * 100.
    assert total.grid == pytest.approx(100 / 4096)
    assert total.sensitivity * total.grid == pytest.approx(2 * 270.459 * 100, abs=0.5)
    # AVG: centred on 50, |v - 50| <= 50; the count: 2 S*.
    centred = by_kind[("sum", 50.0)]
    assert centred.sensitivity * centred.grid == pytest.approx(2 * 270.459 * 50, abs=0.5)
    assert by_kind[("count", 0.0)].sensitivity == pytest.approx(2 * 270.459, abs=1e-3)


def test_delta_required() -> None:
    query = analyse("SELECT COUNT(*) FROM orders o JOIN recs r ON o.customer_id = r.customer_id")
    with pytest.raises(InvalidParameter, match="delta > 0"):
        resolve(query, 1.0, 0.0, MF)


# -- refusals -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("sql", "error", "words"), [
    ("SELECT COUNT(*) FROM orders o JOIN recs r ON o.customer_id < r.customer_id",
     NotSupportedError, "non-equijoin"),
    ("SELECT COUNT(*) FROM orders o JOIN recs r ON o.customer_id = r.customer_id "
     "OR o.order_id = r.rec_id", NotSupportedError, "OR in a join condition"),
    ("SELECT COUNT(*) FROM orders o LEFT JOIN recs r ON o.customer_id = r.customer_id",
     NotSupportedError, "LEFT OUTER JOIN"),
    ("SELECT COUNT(*) FROM orders o FULL JOIN recs r ON o.customer_id = r.customer_id",
     NotSupportedError, "OUTER JOIN"),
    ("SELECT COUNT(*) FROM orders o JOIN recs r ON o.customer_id + 1 = r.customer_id",
     NotSupportedError, "plain columns"),
    ("SELECT COUNT(*) FROM orders o, recs r WHERE o.customer_id = r.customer_id * 2",
     NotSupportedError, "plain columns"),
    ("SELECT COUNT(*) FROM orders o, recs r", NotSupportedError, "cross join"),
    ("SELECT COUNT(*) FROM orders o CROSS JOIN recs r", NotSupportedError, "CROSS"),
    ("SELECT COUNT(*) FROM (SELECT customer_id, COUNT(*) AS c FROM orders GROUP BY "
     "customer_id) a JOIN recs r ON a.customer_id = r.customer_id", NotSupportedError,
     "aggregation followed by a join"),
    ("SELECT COUNT(*) FROM rides r JOIN couriers c ON r.driver_id = c.driver_id",
     QueryRefused, "different levels"),
    ("SELECT COUNT(*) FROM rides r JOIN drivers d ON r.driver_id = d.driver_id",
     QueryRefused, "different levels"),
    ("SELECT r.customer_id, COUNT(*) FROM orders o JOIN recs r "
     "ON o.customer_id = r.customer_id GROUP BY r.customer_id", NotSupportedError,
     "public_values"),
    ("SELECT COUNT(DISTINCT r.ride_id) FROM rides r JOIN shops s ON r.shop_id = s.shop_id",
     NotSupportedError, r"COUNT\(DISTINCT \.\.\.\) over a join is answered only for the "
     r"privacy unit \(r\.rider_id\)"),
    ("SELECT COUNT(DISTINCT a.rider_id) FROM rides a JOIN rides b ON a.shop_id = b.shop_id",
     NotSupportedError, "not all joined on their privacy unit"),
    ("SELECT VARIANCE(o.amount) FROM orders o JOIN recs r ON o.customer_id = r.customer_id",
     NotSupportedError, "VARIANCE"),
    ("SELECT SUM(d.rating) FROM orders o JOIN drivers d ON o.shop_id = d.driver_id",
     QueryRefused, "needs declared bounds"),
])
def test_refusals_name_the_construct(sql: str, error: type[Exception], words: str) -> None:
    parsed = parse_statement(sql, "duckdb", frozenset(POLICY.tables))
    with pytest.raises(error, match=words):
        analyze_query(parsed, POLICY, "duckdb", PUBLIC)


# -- property: the true change of a join COUNT never exceeds S(0) ----------------------------------

_PROP_POLICY = parse_policy({
    "backend": {"url": "duckdb:///:memory:"}, "privacy": {"epsilon_per_block": 10.0},
    "tables": {"a": {"columns": {"x": {"type": "int"}, "y": {"type": "int"}}},
               "b": {"columns": {"x": {"type": "int"}, "y": {"type": "int"}}},
               "p": {"public": True}}})
_PROP_QUERIES = [
    "SELECT COUNT(*) FROM a JOIN b ON a.x = b.x",
    "SELECT COUNT(*) FROM a t1 JOIN a t2 ON t1.x = t2.x",
    "SELECT COUNT(*) FROM a JOIN b ON a.x = b.x AND a.y = b.y",
    "SELECT COUNT(*) FROM a JOIN b ON a.x = b.x JOIN p ON p.x = b.y",
    "SELECT COUNT(*) FROM a t1 JOIN b ON t1.x = b.x JOIN a t2 ON t2.y = b.y",
]
rows = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), max_size=12)


@settings(max_examples=40, deadline=None)
@given(rows, rows, rows, st.sampled_from(_PROP_QUERIES), st.sampled_from(["a", "b"]),
       st.tuples(st.integers(0, 3), st.integers(0, 3)), st.booleans())
def test_count_change_never_exceeds_s0(a: list[tuple[int, int]], b: list[tuple[int, int]],
                                       p: list[tuple[int, int]], sql: str, table: str,
                                       row: tuple[int, int], remove: bool) -> None:
    con = duckdb.connect(":memory:")
    data = {"a": list(a), "b": list(b), "p": list(p)}
    parsed = parse_statement(sql, "duckdb", frozenset(_PROP_POLICY.tables))
    query = analyze_query(parsed, _PROP_POLICY, "duckdb", {"p": {"x": "integer", "y": "integer"}})
    assert isinstance(query, AggregateQuery) and query.join is not None

    def load() -> tuple[float, dict[str, float]]:
        for name, values in data.items():
            con.execute(f"CREATE OR REPLACE TABLE {name} (x BIGINT, y BIGINT)")
            if values:
                con.executemany(f"INSERT INTO {name} VALUES (?, ?)", values)
        mf = {m.name: float(con.execute(frequency_sql(m.table, m.column)).fetchone()[0] or 0)
              for m in query.join.metrics}
        (count,) = con.execute(sql).fetchone()
        return float(count), mf

    before, mf = load()
    s0 = query.join.stability.at(0, mf)
    if remove and row in data[table]:
        data[table].remove(row)
    else:
        data[table].append(row)
    after, mf_after = load()
    assert abs(after - before) <= s0
    # Symmetric: the neighbour's own S(0) bounds the change too.
    assert abs(after - before) <= query.join.stability.at(0, mf_after)


# -- property: joins on the privacy unit change by at most S(0) when a unit goes ----------------

_UNIT_POLICY = parse_policy({
    "backend": {"url": "duckdb:///:memory:"}, "privacy": {"epsilon_per_block": 10.0},
    "tables": {"ua": {"privacy_unit": "u", "max_rows_per_unit": 3, "contribution": "fixed",
                      "columns": {"u": {"type": "int"}, "x": {"type": "int"}}},
               "ub": {"privacy_unit": "u", "max_rows_per_unit": 2, "contribution": "fixed",
                      "columns": {"u": {"type": "int"}, "x": {"type": "int"}}},
               "p": {"public": True}}})
_UNIT_QUERIES = [
    ("SELECT COUNT(*) FROM ua JOIN ub ON ua.u = ub.u", 6),                     # 3 * 2
    ("SELECT COUNT(*) FROM ua t1 JOIN ua t2 ON t1.u = t2.u", 9),               # 3 * 3
    ("SELECT COUNT(*) FROM ua JOIN ub ON ua.u = ub.u JOIN p ON p.x = ub.x", None),
    ("SELECT COUNT(*) FROM ua t1 JOIN ub ON t1.u = ub.u JOIN ua t2 ON t2.x = ub.x", None),
    ("SELECT COUNT(*) FROM ua t1 JOIN ua t2 ON t1.x = t2.x JOIN ub ON ub.u = t1.u", None),
]
unit_rows = st.lists(st.integers(0, 2), max_size=3)


@settings(max_examples=60, deadline=None)
@given(st.lists(unit_rows, min_size=1, max_size=4),
       st.lists(st.lists(st.integers(0, 2), max_size=2), min_size=1, max_size=4),
       st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2)), max_size=6),
       st.sampled_from(_UNIT_QUERIES), st.integers(0, 3))
def test_unit_joins_change_by_at_most_s0(a: list[list[int]], b: list[list[int]],
                                         p: list[tuple[int, int]], case: tuple[str, int | None],
                                         gone: int) -> None:
    """Tables that already keep <= 3 (ua) and <= 2 (ub) rows per unit; the neighbour drops every
    row of one unit from both.  The join COUNT moves by at most S(0) (with the frequencies of
    either neighbour), and a join on the unit alone has the hand-derived S = c1 * c2."""
    sql, expected = case
    parsed = parse_statement(sql, "duckdb", frozenset(_UNIT_POLICY.tables))
    query = analyze_query(parsed, _UNIT_POLICY, "duckdb",
                          {"p": {"x": "integer", "y": "integer"}})
    assert isinstance(query, AggregateQuery) and query.join is not None
    con = duckdb.connect(":memory:")

    def load(without: int | None) -> tuple[float, dict[str, float]]:
        for name, per_unit in (("ua", a), ("ub", b)):
            con.execute(f"CREATE OR REPLACE TABLE {name} (u BIGINT, x BIGINT)")
            values = [(u, x) for u, xs in enumerate(per_unit) for x in xs if u != without]
            if values:
                con.executemany(f"INSERT INTO {name} VALUES (?, ?)", values)
        con.execute("CREATE OR REPLACE TABLE p (x BIGINT, y BIGINT)")
        if p:
            con.executemany("INSERT INTO p VALUES (?, ?)", p)
        mf = {m.name: float(con.execute(frequency_sql(m.table, m.column)).fetchone()[0] or 0)
              for m in query.join.metrics}
        (count,) = con.execute(sql).fetchone()
        return float(count), mf

    before, mf = load(None)
    after, mf_after = load(gone)
    if expected is not None:
        assert query.join.stability.at(0, mf) == expected
    assert abs(after - before) <= query.join.stability.at(0, mf)
    assert abs(after - before) <= query.join.stability.at(0, mf_after)


# -- property: over a join on the unit, one unit's rows reach at most D groups -----------------

_GROUPED = [
    ("SELECT ua.x, COUNT(DISTINCT ua.u) FROM ua JOIN ub ON ua.u = ub.u GROUP BY ua.x", 3),
    ("SELECT ub.x, COUNT(DISTINCT ua.u) FROM ua JOIN ub ON ua.u = ub.u GROUP BY ub.x", 2),
    ("SELECT ua.x, ub.x, COUNT(DISTINCT ub.u) FROM ua JOIN ub ON ua.u = ub.u "
     "GROUP BY ua.x, ub.x", 6),                                                # 3 * 2
    ("SELECT t1.x, t2.x, COUNT(DISTINCT t1.u) FROM ua t1 JOIN ua t2 ON t1.u = t2.u "
     "GROUP BY t1.x, t2.x", 9),                                                # 3 * 3
    # A key of the public table: D = S(0) = mf(p.x) * 3 join rows of one unit.
    ("SELECT p.y, COUNT(DISTINCT ua.u) FROM ua JOIN p ON p.x = ua.x GROUP BY p.y", None),
]


@settings(max_examples=40, deadline=None)
@given(st.lists(unit_rows, min_size=1, max_size=4),
       st.lists(st.lists(st.integers(0, 2), max_size=2), min_size=1, max_size=4),
       st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2)), max_size=6),
       st.sampled_from(_GROUPED), st.integers(0, 3))
def test_a_unit_reaches_at_most_d_groups(a: list[list[int]], b: list[list[int]],
                                         p: list[tuple[int, int]], case: tuple[str, int | None],
                                         gone: int) -> None:
    """Tables keeping <= 3 (ua) and <= 2 (ub) rows per unit; the neighbour drops one unit.  The
    distinct-unit count moves by at most 1 in each group and in at most D groups, D as
    ``analyses.join_groups`` derives it (by hand for the joins on the unit)."""
    sql, expected = case
    parsed = parse_statement(sql, "duckdb", frozenset(_UNIT_POLICY.tables))
    query = analyze_query(parsed, _UNIT_POLICY, "duckdb",
                          {"p": {"x": "integer", "y": "integer"}})
    assert isinstance(query, AggregateQuery) and query.join is not None
    # Thresholded keys, except p.y: the public table's values (its distinct-unit count still
    # has Delta = D, G being unknown to the analysis).
    assert query.thresholded == (expected is not None)
    con = duckdb.connect(":memory:")

    def load(without: int | None) -> tuple[dict[tuple[object, ...], int], dict[str, float]]:
        for name, per_unit in (("ua", a), ("ub", b)):
            con.execute(f"CREATE OR REPLACE TABLE {name} (u BIGINT, x BIGINT)")
            values = [(u, x) for u, xs in enumerate(per_unit) for x in xs if u != without]
            if values:
                con.executemany(f"INSERT INTO {name} VALUES (?, ?)", values)
        con.execute("CREATE OR REPLACE TABLE p (x BIGINT, y BIGINT)")
        if p:
            con.executemany("INSERT INTO p VALUES (?, ?)", p)
        mf = {m.name: float(con.execute(frequency_sql(m.table, m.column)).fetchone()[0] or 0)
              for m in query.join.metrics}
        return {tuple(row[:-1]): row[-1] for row in con.execute(sql).fetchall()}, mf

    before, mf = load(None)
    after, _ = load(gone)
    d = groups_per_unit(query.join, [k.expr for k in query.keys], mf)
    if expected is not None:
        assert d == expected
    changed = [g for g in before.keys() | after.keys() if before.get(g, 0) != after.get(g, 0)]
    assert len(changed) <= d
    assert all(abs(before.get(g, 0) - after.get(g, 0)) <= 1 for g in changed)
