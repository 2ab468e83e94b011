"""Property tests of the front of the pipeline: parsing/validation never crashes, bounds are sound.

(a) ``Engine.explain`` on arbitrary text either returns a report or raises a ``ChorusError``
    subclass (never a raw sqlglot/DuckDB/Python exception) and never charges any budget.
(b) ``analyses.bounds.expression_bounds`` is sound: for random arithmetic over a column ``x`` in
    [l, u], the value at any x in [l, u] lies in the returned interval.

DuckDB only (explain never reaches the database for refused SQL).  Examples are derandomised so
the runs are reproducible and no example database is written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import duckdb
import pytest
import sqlglot
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlglot import exp

from analyses.bounds import expression_bounds
from chorus_py.engine import Engine
from chorus_py.errors import ChorusError
from tests.conftest import nothing_spent

SETTINGS = settings(suppress_health_check=[HealthCheck.function_scoped_fixture],
                    max_examples=200, deadline=None, derandomize=True, database=None)

# -- (a) explain is total -------------------------------------------------------------------------

TOKENS = [
    "SELECT", "FROM", "WHERE", "GROUP BY", "HAVING", "ORDER BY", "LIMIT", "OFFSET", "WITH", "AS",
    "JOIN", "ON", "UNION", "DISTINCT", "INTO", "FOR UPDATE", "OVER", "PARTITION BY", "VALUES",
    "INSERT", "UPDATE", "DELETE", "SET", "DROP", "COPY", "EXPLAIN", "LATERAL", "EXISTS",
    "COUNT", "SUM", "AVG", "VARIANCE", "STDDEV", "MIN", "MEDIAN", "ABS", "LN", "SQRT", "POWER",
    "ROUND", "LEAST", "GREATEST", "COALESCE", "NULLIF", "LOWER", "LENGTH", "TRIM", "DATE_TRUNC",
    "EXTRACT", "epoch", "CAST", "TRY_CAST", "INT", "TEXT", "DOUBLE", "DATE", "TIMESTAMP",
    "CASE", "WHEN", "THEN", "ELSE", "END", "AND", "OR", "NOT", "IN", "BETWEEN", "LIKE", "IS",
    "NULL", "TRUE", "ALL", "ANY", "INTERVAL", "'1' DAY", "CURRENT_DATE", "RANDOM()", "NOW()",
    "read_csv", "pg_sleep", "setseed", "pg_catalog.pg_class", "information_schema.tables",
    "trips", "visits", "cities", "t", "fare", "city", "rider_id", "driver_id", "pickup_time",
    "seconds", "page", "*", "(", ")", ",", ";", ".", "+", "-", "/", "%", "=", "<", ">", "||",
    "::", "'SF'", "'x'", "'2026-01-01'", "'day'", "0", "1", "2.5", "1e308", "-1", "--", "/*",
    "*/", '"', "'", "$1", "?", ":x", "\x00", "☃", "\\",
]
SPLICED = st.lists(st.sampled_from(TOKENS), max_size=40).map(" ".join)
# The same, after a valid prefix, so the analysis (not only the parser) sees the noise.
SPLICED_AFTER_QUERY = st.tuples(
    st.sampled_from(["SELECT COUNT(*) FROM trips", "SELECT SUM(fare) FROM trips",
                     "SELECT city, AVG(fare) FROM trips", "SELECT COUNT(*) FROM visits",
                     "SELECT COUNT(*) FROM cities"]),
    SPLICED,
).map(" ".join)


@pytest.fixture
def duck_engine(make_engine: Callable[..., Engine], duckdb_data: str) -> Engine:
    return make_engine(duckdb_data)


def _explain_is_total(engine: Engine, sql: str) -> None:
    try:
        report = engine.explain(sql, analyst="alice", epsilon=1.0, delta=1e-6)
    except ChorusError as err:
        assert type(err).__module__ == "chorus_py.errors"
        assert str(err)
    else:
        assert report.verdict == "allowed" and not report.charged
    assert nothing_spent(engine)


@pytest.mark.parametrize("strategy", [
    pytest.param(st.text(max_size=300), id="text"),
    pytest.param(SPLICED, id="spliced-tokens"),
    pytest.param(SPLICED_AFTER_QUERY, id="spliced-after-query"),
])
def test_explain_returns_a_report_or_a_chorus_error(duck_engine: Engine,
                                                    strategy: st.SearchStrategy[str]) -> None:
    @SETTINGS
    @given(sql=strategy)
    def check(sql: str) -> None:
        _explain_is_total(duck_engine, sql)

    check()


# Well-formed aggregate queries over random row expressions: deeper into the analysis.
_LEAVES = st.sampled_from([
    "fare", "distance_km", "trip_id", "driver_id", "city", "pickup_time", "0", "1", "-2", "2.5",
    "1e308", "'SF'", "NULL", "TRUE", "CURRENT_DATE", "INTERVAL '1' DAY",
])
_ROW_EXPR = st.recursive(_LEAVES, lambda sub: st.one_of(
    st.tuples(sub, st.sampled_from(["+", "-", "*", "/", "%", "||", "=", "<", "AND", "OR"]), sub)
    .map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
    st.tuples(st.sampled_from(["ABS", "ROUND", "FLOOR", "SIGN", "LOWER", "LENGTH", "COALESCE",
                               "NULLIF", "LEAST", "GREATEST", "SQRT", "LN"]),
              st.lists(sub, min_size=1, max_size=2))
    .map(lambda t: f"{t[0]}({', '.join(t[1])})"),
    st.tuples(sub, st.sampled_from(["INT", "DOUBLE", "TEXT", "DATE", "DECIMAL(4,1)"]))
    .map(lambda t: f"CAST({t[0]} AS {t[1]})"),
    st.tuples(sub, sub, sub).map(lambda t: f"CASE WHEN {t[0]} THEN {t[1]} ELSE {t[2]} END"),
), max_leaves=6)
AGGREGATE_QUERIES = st.builds(
    lambda agg, arg, where: f"SELECT {agg}({arg}) FROM trips" + (f" WHERE {where}" if where
                                                                 else ""),
    st.sampled_from(["SUM", "AVG", "COUNT", "VARIANCE", "STDDEV"]), _ROW_EXPR,
    st.one_of(st.none(), _ROW_EXPR),
)


def test_explain_of_aggregate_queries_is_total(duck_engine: Engine) -> None:
    @SETTINGS
    @given(sql=AGGREGATE_QUERIES)
    def check(sql: str) -> None:
        _explain_is_total(duck_engine, sql)

    check()


# -- (b) expression_bounds is sound ---------------------------------------------------------------

_CONSTANT = st.integers(-1000, 1000).map(lambda i: i / 100)
_NONZERO = _CONSTANT.filter(lambda c: c != 0)


def _lit(c: float) -> str:
    return f"({c!r})" if c < 0 else repr(c)


def _binary(sub: st.SearchStrategy[str], op: str) -> st.SearchStrategy[str]:
    return st.tuples(sub, sub).map(lambda t: f"({t[0]} {op} {t[1]})")


_ARITHMETIC = st.recursive(
    st.one_of(st.just("x"), st.just("x"), _CONSTANT.map(_lit)),
    lambda sub: st.one_of(
        _binary(sub, "+"), _binary(sub, "-"), _binary(sub, "*"), _binary(sub, "*"),
        st.tuples(sub, _NONZERO).map(lambda t: f"({t[0]} / {_lit(t[1])})"),
        sub.map(lambda s: f"(-{s})"),
        sub.map(lambda s: f"ABS({s})"),
        st.tuples(st.sampled_from(["LEAST", "GREATEST"]), st.lists(sub, min_size=2, max_size=3))
        .map(lambda t: f"{t[0]}({', '.join(t[1])})"),
    ),
    max_leaves=8,
)
# Mostly proper intervals (l < u), often straddling zero.
_BOUNDS = st.lists(st.integers(-10_000, 10_000), min_size=2, max_size=2, unique=True).map(
    lambda t: (min(t) / 100, max(t) / 100))


def _evaluate(node: exp.Expr, x: float, seen: list[float]) -> float:
    """A small evaluator of the arithmetic sqlglot trees above (records every intermediate)."""
    if isinstance(node, exp.Paren):
        value = _evaluate(node.this, x, seen)
    elif isinstance(node, exp.Column):
        value = x
    elif isinstance(node, exp.Literal):
        value = float(node.this)
    elif isinstance(node, exp.Neg):
        value = -_evaluate(node.this, x, seen)
    elif isinstance(node, exp.Abs):
        value = abs(_evaluate(node.this, x, seen))
    elif isinstance(node, exp.Add | exp.Sub | exp.Mul | exp.Div):
        a, b = _evaluate(node.this, x, seen), _evaluate(node.expression, x, seen)
        if isinstance(node, exp.Add):
            value = a + b
        elif isinstance(node, exp.Sub):
            value = a - b
        elif isinstance(node, exp.Mul):
            value = a * b
        else:
            value = a / b
    elif isinstance(node, exp.Least | exp.Greatest):
        parts = [_evaluate(p, x, seen) for p in [node.this, *node.expressions]]
        value = min(parts) if isinstance(node, exp.Least) else max(parts)
    else:  # pragma: no cover - the strategy builds nothing else
        raise AssertionError(f"unexpected node {type(node).__name__}")
    seen.append(value)
    return value


@pytest.fixture(scope="module")
def duck() -> Iterator[duckdb.DuckDBPyConnection]:
    con = duckdb.connect(":memory:")
    yield con
    con.close()


def _assert_inside(value: float, interval: tuple[float, float], scale: float, what: str) -> None:
    lo, hi = interval
    tol = 1e-9 * max(1.0, abs(lo), abs(hi), scale)
    assert lo - tol <= value <= hi + tol, f"{what} = {value!r} outside [{lo!r}, {hi!r}]"


@SETTINGS
@given(text=_ARITHMETIC, bounds=_BOUNDS, fractions=st.lists(st.floats(0, 1), max_size=5))
# Shapes where a wrong rule is easy to miss: anti-correlated terms, signs, products across zero.
@example(text="(1.5 - x)", bounds=(-2.0, 3.0), fractions=[])
@example(text="((x * 2.0) - (x * (-1.0)))", bounds=(-2.0, 3.0), fractions=[])
@example(text="(x * (-2.0))", bounds=(1.0, 3.0), fractions=[])
@example(text="(x * x)", bounds=(-2.0, 3.0), fractions=[])
@example(text="(x / (-4.0))", bounds=(-2.0, 3.0), fractions=[])
@example(text="ABS((x - 1.0))", bounds=(-5.0, 3.0), fractions=[0.75])
@example(text="LEAST((-x), GREATEST(x, 0.5))", bounds=(-5.0, 3.0), fractions=[0.2])
def test_expression_bounds_contain_every_value(duck: duckdb.DuckDBPyConnection, text: str,
                                               bounds: tuple[float, float],
                                               fractions: list[float]) -> None:
    lo, hi = bounds
    tree = sqlglot.parse_one(text, dialect="duckdb")
    interval = expression_bounds(tree, lambda c: (lo, hi) if c.name == "x" else None)
    assert interval is not None, f"no bound for {text}"
    assert interval[0] <= interval[1]
    xs = [lo, hi, (lo + hi) / 2] + [min(hi, max(lo, lo + f * (hi - lo))) for f in fractions]
    rows = duck.execute(
        f"SELECT x, {text} FROM (SELECT CAST(v AS DOUBLE) AS x FROM "
        f"(VALUES {', '.join(f'({x!r})' for x in xs)}) AS t(v))"
    ).fetchall()
    for x, in_duckdb in rows:
        seen: list[float] = []
        in_python = _evaluate(tree, x, seen)
        scale = max(abs(v) for v in seen)
        _assert_inside(in_python, interval, scale, f"{text} at x={x!r} (Python)")
        _assert_inside(float(in_duckdb), interval, scale, f"{text} at x={x!r} (DuckDB)")


def test_expression_bounds_of_the_column_is_its_declared_range() -> None:
    tree = sqlglot.parse_one("x", dialect="duckdb")
    assert expression_bounds(tree, lambda c: (-3.0, 7.5)) == (-3.0, 7.5)
    assert expression_bounds(sqlglot.parse_one("x / 0"), lambda c: (0.0, 1.0)) is None
    assert expression_bounds(sqlglot.parse_one("x / x"), lambda c: (1.0, 2.0)) is None


def test_integer_cast_bounds_contain_the_rounded_value(duck: duckdb.DuckDBPyConnection) -> None:
    for text, x in (("CAST(2.5 AS INT)", 0.0), ("CAST(x AS INT)", 0.6)):
        tree = sqlglot.parse_one(text, dialect="duckdb")
        interval = expression_bounds(tree, lambda c: (0.4, 0.6))
        assert interval is not None
        value = duck.execute(f"SELECT {text} FROM (SELECT CAST({x!r} AS DOUBLE) AS x)").fetchone()
        assert value is not None
        _assert_inside(float(value[0]), interval, 1.0, text)
