"""The finish of a proxy-noised answer computed in Python (``chorus_py.kinds.finish``) gives
what DuckDB gives over the same released values, or steps aside (None) and DuckDB computes it."""

from __future__ import annotations

import inspect
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

import duckdb
import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from sqlglot import exp

from chorus_py.engine import Engine
from chorus_py.kinds import finish as finish_module
from chorus_py.kinds.finish import PYTHON_ROWS, PythonFinish, finish_columns
from rewriters.pipeline import NOISY

COLUMNS = [("k0", "VARCHAR"), ("m0", "BIGINT"), ("m1", "DOUBLE"), ("m2", "DOUBLE"),
           ("t0", "BIGINT")]
NAMES = [n for n, _ in COLUMNS]
ALICE = {"analyst": "alice"}
_DB = duckdb.connect(":memory:")


def _scratch() -> Any:
    return _DB.cursor()


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        # A decimal literal becomes a double in the last bit otherwise than Python's float().
        return a == b or math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-300)
    return type(a) is type(b) and a == b


def _both(finish: exp.Select, values: Sequence[Sequence[Any]]) -> tuple[Any, Any]:
    compiled = PythonFinish.of(finish.sql("duckdb"), NAMES)
    python = compiled.run(COLUMNS, values, _scratch) if compiled is not None else None
    try:
        duck = finish_columns(_scratch(), COLUMNS, finish.sql("duckdb"), values)
    except Exception:
        duck = None
    return python, duck


def _assert_same(python: Any, duck: Any, ordered: bool) -> None:
    """The same columns, types and rows; in the same order when the finish orders them (a SQL
    result without ORDER BY has none: DuckDB's and Python's may differ)."""
    assert duck is not None, "Python computed a finish DuckDB fails on"
    assert python.columns == duck.columns
    assert python.types == duck.types
    assert len(python.rows) == len(duck.rows)
    p_rows, d_rows = python.rows, duck.rows
    if not ordered:
        p_rows, d_rows = (sorted(rows, key=repr) for rows in (p_rows, d_rows))
    for p, d in zip(p_rows, d_rows, strict=True):
        d = tuple(float(v) if type(v).__name__ == "Decimal" else v for v in d)
        assert all(_same(a, b) for a, b in zip(p, d, strict=True)), (p, d)


# -- expressions over the released values -------------------------------------------------------
_LITERALS = st.sampled_from(["0", "1", "2", "0.5", "100.0", "1.0", "0.0244140625",
                             "7021.5702293802915", "1e3", "2.0"])


def _expressions() -> st.SearchStrategy[exp.Expr]:
    leaves = st.one_of(st.sampled_from(["m0", "m1", "m2", "t0"]).map(exp.column),
                       _LITERALS.map(exp.Literal.number))

    def grow(inner: st.SearchStrategy[exp.Expr]) -> st.SearchStrategy[exp.Expr]:
        two = st.tuples(inner, inner)
        return st.one_of(
            two.map(lambda p: exp.Add(this=p[0], expression=p[1])),
            two.map(lambda p: exp.Sub(this=p[0], expression=p[1])),
            two.map(lambda p: exp.Mul(this=p[0], expression=p[1])),
            two.map(lambda p: exp.Div(this=p[0], expression=exp.Nullif(
                this=p[1], expression=exp.Literal.number(0)))),
            two.map(lambda p: exp.Div(this=p[0], expression=p[1])),
            inner.map(lambda e: exp.Neg(this=exp.Paren(this=e))),
            inner.map(lambda e: exp.Paren(this=e)),
            inner.map(lambda e: exp.Sqrt(this=e)),
            inner.map(lambda e: exp.cast(e, exp.DType.DOUBLE)),
            st.lists(inner, min_size=2, max_size=3).map(
                lambda es: exp.Greatest(this=es[0], expressions=es[1:])),
            st.lists(inner, min_size=2, max_size=3).map(
                lambda es: exp.Least(this=es[0], expressions=es[1:])),
        )

    return st.recursive(leaves, grow, max_leaves=6)


def _conditions() -> st.SearchStrategy[exp.Expr]:
    comparisons = st.tuples(st.sampled_from([exp.GT, exp.GTE, exp.LT, exp.LTE, exp.EQ, exp.NEQ]),
                            _expressions(), _expressions()).map(
        lambda t: t[0](this=t[1], expression=t[2]))

    def grow(inner: st.SearchStrategy[exp.Expr]) -> st.SearchStrategy[exp.Expr]:
        return st.one_of(st.tuples(inner, inner).map(lambda p: exp.and_(*p)),
                         st.tuples(inner, inner).map(lambda p: exp.or_(*p)),
                         inner.map(exp.not_))

    return st.recursive(comparisons, grow, max_leaves=3)


_INTS = st.one_of(st.integers(-50, 50), st.sampled_from([2 ** 62, -(2 ** 62), 2 ** 40]))
_FLOATS = st.one_of(st.floats(-1e6, 1e6, allow_nan=False, width=64),
                    st.sampled_from([0.0, -0.0, float("inf"), float("-inf"), float("nan"),
                                     1e300, 5e-324]))


@st.composite
def _values(draw: st.DrawFn) -> list[Sequence[Any]]:
    n = draw(st.integers(0, 12))
    keys = [f"g{i:02d}" if draw(st.integers(0, 9)) else None for i in range(n)]
    return [keys,
            np.array([draw(_INTS) for _ in range(n)], dtype=np.int64),
            np.array([draw(_FLOATS) for _ in range(n)], dtype=np.float64),
            np.array([draw(_FLOATS) for _ in range(n)], dtype=np.float64),
            np.array([draw(st.integers(0, 40)) for _ in range(n)], dtype=np.int64)]


@st.composite
def _finishes(draw: st.DrawFn) -> exp.Select:
    outputs = [exp.alias_(draw(_expressions()), f"o{i}", quoted=True)
               for i in range(draw(st.integers(1, 3)))]
    picks = [exp.alias_(exp.column(c), f"chorus_{c}") for c in draw(
        st.lists(st.sampled_from(NAMES), max_size=3))]
    finish = exp.select(*outputs, *picks).from_(NOISY)
    conditions = []
    if draw(st.booleans()):
        conditions.append(exp.column("t0") > exp.Literal.number(draw(st.sampled_from(
            ["12", "7.5", "20.25"]))))
    if draw(st.booleans()):
        conditions.append(draw(_conditions()))
    if conditions:
        finish = finish.where(exp.and_(*conditions))
    if draw(st.booleans()):
        keys = draw(st.lists(st.one_of(st.sampled_from(NAMES).map(exp.column), _expressions(),
                                       st.just(exp.column("o0", quoted=True)),  # an alias
                                       st.just(exp.Literal.number(1))),  # a position
                             min_size=1, max_size=2))
        # A last key that no two rows share: the order is total, on both sides.
        keys.append(exp.column("k0"))
        finish = finish.order_by(*[exp.Ordered(this=k, desc=draw(st.booleans())) for k in keys])
        if draw(st.booleans()):
            finish = finish.limit(draw(st.integers(0, 5)))
        if draw(st.booleans()):
            finish = finish.offset(draw(st.integers(0, 3)))
    return finish


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(finish=_finishes(), values=_values())
def test_the_python_finish_is_duckdbs(finish: exp.Select, values: list[Sequence[Any]]) -> None:
    """Random arithmetic outputs (NULLIF-guarded or bare divisions, GREATEST / LEAST, SQRT,
    casts), WHERE clauses with the key-release gate, ORDER BY (columns, expressions, an
    output's alias or position), LIMIT and OFFSET over values
    with NULL keys, huge integers, zeros, infinities and NaN: wherever Python computes the
    finish, it is what DuckDB computes."""
    note(finish.sql("duckdb"))
    note(repr(values))
    python, duck = _both(finish, values)
    if python is not None:
        _assert_same(python, duck, ordered=finish.args.get("order") is not None)


def test_python_steps_aside_where_duckdb_differs() -> None:
    """Each value Python would compute otherwise than DuckDB sends the finish to SQL."""
    def run(sql_finish: exp.Select, values: list[Sequence[Any]]) -> Any:
        compiled = PythonFinish.of(sql_finish.sql("duckdb"), NAMES)
        assert compiled is not None
        return compiled.run(COLUMNS, values, _scratch)

    def values(m0: list[int], m1: list[float], keys: list[Any] | None = None
               ) -> list[Sequence[Any]]:
        n = len(m0)
        return [keys or [f"g{i}" for i in range(n)], np.array(m0, dtype=np.int64),
                np.array(m1), np.zeros(n), np.full(n, 30, dtype=np.int64)]

    base = exp.select(exp.alias_(exp.column("m1"), "x")).from_(NOISY)
    # a NaN sort key (DuckDB puts it last; Python cannot compare it)
    assert run(base.order_by("m1"), values([1, 2], [float("nan"), 1.0])) is None
    # a NULL sort key (its place depends on NULLS FIRST / LAST)
    assert run(base.order_by("k0"), values([1, 2], [1.0, 2.0], [None, "a"])) is None
    # a BIGINT overflow (DuckDB raises it)
    big = exp.select(exp.alias_(exp.column("m0") * exp.column("m0"), "x")).from_(NOISY)
    assert run(big, values([2 ** 40], [1.0])) is None
    # a division by zero (IEEE infinities in DuckDB)
    zero = exp.select(exp.alias_(exp.column("m1") / exp.column("m0"), "x")).from_(NOISY)
    assert run(zero, values([0], [1.0])) is None
    # a literal beyond a double
    huge = exp.select(exp.alias_(exp.column("m1") * exp.Literal.number("1" + "0" * 400),
                                 "x")).from_(NOISY)
    assert run(huge, values([1], [1.0])) is None
    # a NaN compared
    where = base.where(exp.column("m1") > exp.Literal.number(1))
    assert run(where, values([1], [float("nan")])) is None
    # more rows than Python computes quickly
    many = PYTHON_ROWS + 1
    assert run(base, values(list(range(many)), [1.0] * many)) is None
    # ... also after the key-release gate, unless it leaves few of them
    gated = base.where(exp.column("t0") > exp.Literal.number(29))
    assert run(gated, values(list(range(many)), [1.0] * many)) is None
    gated = base.where(exp.column("m0") > exp.Literal.number(many - 3))
    assert run(gated, values(list(range(many)), [1.0] * many)).rows == [(1.0,), (1.0,)]
    # nested deeper than Python recurses (an owner may allow deep expressions): never raises
    too_deep = "SELECT " + "(" * 5000 + "m1" + " + 1)" * 5000 + " AS x FROM chorus_noisy"
    assert PythonFinish.of(too_deep, NAMES) is None  # its parse recurses too deep
    deep = "SELECT " + "(" * 150 + "m1" + " + 1)" * 150 + " AS x FROM chorus_noisy"
    compiled = PythonFinish.of(deep, NAMES)
    assert compiled is not None
    assert compiled.run(COLUMNS, values([1], [1.0]), _scratch).rows == [(151.0,)]
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack()) + 100)  # its evaluation recurses too deep
    try:
        assert compiled.run(COLUMNS, values([1], [1.0]), _scratch) is None
    finally:
        sys.setrecursionlimit(limit)
    # a key whose cast changes it (an int in a VARCHAR column)
    key = exp.select(exp.alias_(exp.column("k0"), "k")).from_(NOISY)
    assert run(key, values([1], [1.0], [5])) is None


@pytest.mark.parametrize("sql", [
    "SELECT DISTINCT m0 FROM chorus_noisy",
    "SELECT ROUND(m1) AS r FROM chorus_noisy",
    "SELECT m0 FROM chorus_noisy GROUP BY m0",
    "SELECT k0 || 'x' AS s FROM chorus_noisy",
    "SELECT m0 FROM other",
    "SELECT n.m0 FROM chorus_noisy AS n",
    "SELECT m0 FROM chorus_noisy WHERE k0 = 'a'",
    "SELECT CASE WHEN m0 > 1 THEN 1 ELSE 0 END AS c FROM chorus_noisy",
    "SELECT m0 FROM chorus_noisy LIMIT m0",
])
def test_a_finish_python_does_not_compute_is_left_to_duckdb(sql: str) -> None:
    assert PythonFinish.of(sql, NAMES) is None


def test_the_sql_finish_takes_any_number_of_rows_and_its_own_ctes() -> None:
    """The SQL finish reads the values unnested from one list parameter per column, in their
    order, also under a finish that has a WITH of its own, and with no rows."""
    for n in (0, 1, 1000):
        values = [[f"g{i}" for i in range(n)], np.arange(n, dtype=np.int64),
                  np.arange(n, dtype=np.float64) / 2, np.zeros(n), np.zeros(n, dtype=np.int64)]
        plain = finish_columns(_scratch(), COLUMNS, "SELECT k0, m0 FROM chorus_noisy", values)
        assert plain.rows == [(f"g{i}", i) for i in range(n)]
        own = finish_columns(_scratch(), COLUMNS, "WITH w AS (SELECT 2 AS two) SELECT m1 * two "
                             "AS x FROM chorus_noisy, w", values)
        assert own.rows == [(float(i),) for i in range(n)]


# Each ORDER BY ends with the city: two noisy values may tie (a variance clamped to 0), and
# SQL leaves the order of ties, and so what a LIMIT keeps, to the engine.
QUERIES = [
    "SELECT COUNT(*) FROM trips",
    "SELECT AVG(fare) FROM trips",
    "SELECT city, COUNT(*) AS n, AVG(fare) AS f FROM trips GROUP BY city ORDER BY n DESC, city",
    "SELECT city, SUM(fare) / COUNT(*) AS r FROM trips GROUP BY city",
    "SELECT city, STDDEV(fare) FROM trips GROUP BY city ORDER BY 2 DESC, 1 LIMIT 2",
    "SELECT city, VARIANCE(fare) AS v FROM trips GROUP BY city HAVING COUNT(*) > 5",
    "SELECT city, COUNT(*) AS n FROM trips GROUP BY city HAVING SUM(fare) > 10 "
    "ORDER BY n, city",
    "SELECT -SUM(fare) AS s, COUNT(*) * 2 AS c FROM trips",
    # quantiles (their own finish) and a quantile with other aggregates (three finishes)
    "SELECT city, PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY fare) AS m FROM trips "
    "GROUP BY city ORDER BY m DESC, city",
    "SELECT city, COUNT(*) AS n, MAX(fare) AS top FROM trips GROUP BY city ORDER BY n, city",
]


def test_every_answer_computed_in_python_is_duckdbs(
        backend_url: str, make_engine: Callable[..., Engine],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the engine (proxy noise, each backend): each query's finishes (its outputs from
    the noisy values; a quantile's, and the merge of a quantile with other aggregates) are
    computed in Python, and DuckDB computes the same from the same noisy values."""
    computed: list[str] = []
    python_run = PythonFinish.run

    def both(self: PythonFinish, columns: Any, values: Any, scratch: Any) -> Any:
        python = python_run(self, columns, values, scratch)
        assert python is not None, self.sql
        _assert_same(python, finish_columns(scratch(), columns, self.sql, values),
                     ordered=" ORDER BY " in self.sql)
        computed.append(self.sql)
        return python

    monkeypatch.setattr(finish_module.PythonFinish, "run", both)
    engine = make_engine(backend_url, noise="proxy", k=200, epsilon_per_block=1e6,
                         max_epsilon=1e5)
    for sql in QUERIES:
        before = len(computed)
        result = engine.execute(sql, epsilon=5.0, **ALICE)
        assert result.rows, sql
        assert len(computed) == before + (3 if "MAX" in sql else 1), computed[before:]


def test_the_gate_draws_other_measurements_for_released_groups_only(
        backend_url: str, make_engine: Callable[..., Engine],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys released by a threshold: the proxy draws the gate's noisy counts for every group,
    and the other measurements' noise for the groups above tau only; the released groups are
    exactly those (here with the noise taken away: those whose exact count is above tau)."""
    from mechanisms.discrete_laplace import DiscreteLaplace
    from mechanisms.snapping import Snapping

    sizes: list[int] = []

    def exact_counts(self: DiscreteLaplace, values: np.ndarray) -> np.ndarray:
        sizes.append(len(values))
        return np.rint(values).astype(np.int64)

    def exact_sums(self: Snapping, values: np.ndarray) -> np.ndarray:
        sizes.append(len(values))
        return np.asarray(values, dtype=float)

    monkeypatch.setattr(DiscreteLaplace, "sample", exact_counts)
    monkeypatch.setattr(Snapping, "sample", exact_sums)
    engine = make_engine(backend_url, noise="proxy")
    sql = "SELECT visit_id, COUNT(*), SUM(seconds) FROM visits GROUP BY visit_id"
    _, prepared = engine.prepare(sql, epsilon=1.0, delta=1e-8, **ALICE)
    tau = prepared.detail.plan.threshold.threshold
    result = engine.execute(sql, epsilon=1.0, delta=1e-8, **ALICE)
    assert result.rows == []  # one visit per id: no group above tau
    # the gate's count for the 1000 groups, then the SUM (and a separate gate's count, if
    # any) for none
    assert tau > 1 and sizes[0] == 1000 and len(sizes) >= 2 and set(sizes[1:]) == {0}
    sizes.clear()
    pages = engine.execute("SELECT page, COUNT(*), SUM(seconds) FROM visits GROUP BY page",
                           epsilon=1.0, delta=1e-8, **ALICE)
    assert sorted(r[0] for r in pages.rows) == ["about", "blog", "home"]
    assert sizes[0] == 3 and set(sizes[1:]) == {3}
