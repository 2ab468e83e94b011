"""A differential fuzzer for the totality analysis (DESIGN.md section 11, wall 2).

Hypothesis draws random row-level conditions (arithmetic with huge, tiny and ordinary literals,
casts, CASE, COALESCE, LEAST/GREATEST, string functions, LIKE with random patterns of
backslashes, ``%`` and ``_``, date/time literals in random formats, intervals, DATE_TRUNC and
EXTRACT) over a table whose rows hold the edge values of each column type: the integer limits,
0, -0.0, denormals, the largest doubles, NaN, +/-Infinity, the earliest and latest dates and
timestamps, +/-infinity, and NULL.  Whenever ``analyses.totality`` accepts a condition, its
rewritten form (``rewriters.safety``, ``rewriters.dialect``) is run on every row of that table,
on DuckDB and on Postgres: it must not raise there unless it raises on an empty copy of the
table as well (a plan-time error, which says nothing about any row).

Budget: ``max_examples=N`` with N = 150 per backend, ``derandomize=True`` (the same examples on
every run); about 10-20 s in all on two cores.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import duckdb
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlglot import exp, parse_one
from sqlglot.optimizer.annotate_types import annotate_types
from sqlglot.optimizer.qualify import qualify

from analyses.totality import RowContext, check_row
from chorus_py.errors import ChorusError
from rewriters.dialect import dialect as for_dialect
from rewriters.safety import safety
from tests.conftest import PG_ADMIN_URL

N = 150

_SCHEMA = {"t": {"i": "BIGINT", "f": "DOUBLE", "s": "TEXT", "d": "DATE", "ts": "TIMESTAMP"}}
_TYPES = {"i": "int", "f": "float", "s": "text", "d": "date", "ts": "timestamp"}

_INTS = ["0", "1", "-1", "9223372036854775807", "-9223372036854775808", "NULL", "42"]
_FLOATS = ["0", "'-0'", "'5e-324'", "'-5e-324'", "'2.2250738585072014e-308'", "'1e-300'",
           "'1.7976931348623157e308'", "'-1.7976931348623157e308'", "'NaN'", "'Infinity'",
           "'-Infinity'", "NULL", "'1.5'", "'1e300'"]
_TEXTS = ["''", "'abc'", "'a\\'", "'%_'", "NULL", "'SF'"]
_DATES = {
    "duckdb": ["'2026-01-01'", "'5877642-06-25 (BC)'", "'5881580-07-10'", "'infinity'",
               "'-infinity'", "NULL"],
    "postgres": ["'2026-01-01'", "'4713-01-01 BC'", "'5874897-12-31'", "'infinity'",
                 "'-infinity'", "NULL"],
}
_STAMPS = {
    "duckdb": ["'2026-01-01 10:00'", "'290309-12-22 (BC) 00:00:00'",
               "'294247-01-10 04:00:54.775806'", "'infinity'", "'-infinity'", "NULL"],
    "postgres": ["'2026-01-01 10:00'", "'4713-01-01 00:00:00 BC'",
                 "'294276-12-31 23:59:59.999999'", "'infinity'", "'-infinity'", "NULL"],
}
_ROWS = 24  # row r takes value (r * step) % len of each column's list: many combinations

# -- random expressions ----------------------------------------------------------------------------

_NUM_LITERALS = st.sampled_from([
    "0", "1", "-1", "2", "0.5", "7", "1e300", "1e-300", "1e308", "1e-320", "9223372036854775807",
    "3.25", "1e10", "0.1", "100",
])
_UNITS = st.sampled_from(["day", "hour", "month", "year", "week", "quarter", "minute",
                          "millennium", "epoch", "dow", "isoyear", "microsecond"])
_DATE_TEXT = st.sampled_from([
    "2026-01-01", "20260101", "2026-W01-1", "2026-01-01T10", "2026-01-01 10:00", "2026-02-30",
    "01/02/2026", "2026-1-1", "infinity", "epoch", "2026-01-01 25:00", "294277-01-01",
    "-2026-01-01", "2026-01-01 10:00:00+02", "today", " 2026-01-01 ", "2026-01-01 BC",
])
_PATTERN = st.text(alphabet="ab%_\\", max_size=5)
_STRING_LIT = st.sampled_from(["''", "'abc'", "'SF'", "'x y'"])


def _numbers(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    two = st.tuples(children, children)
    return st.one_of(
        st.builds(lambda p, op: f"({p[0]} {op} {p[1]})", two, st.sampled_from("+-*/%")),
        st.builds(lambda a, f: f"{f}({a})", children,
                  st.sampled_from(["ABS", "FLOOR", "CEIL", "SIGN", "-"])),
        st.builds(lambda a, k: f"ROUND({a}, {k})", children, st.sampled_from(["0", "2", "-3"])),
        st.builds(lambda p, f: f"{f}({p[0]}, {p[1]})", two,
                  st.sampled_from(["LEAST", "GREATEST", "COALESCE", "NULLIF"])),
        st.builds(lambda c, p: f"CASE WHEN {c} THEN {p[0]} ELSE {p[1]} END", _simple_bool, two),
        st.builds(lambda a: f"CAST({a} AS DOUBLE)", children),
    )


_num_leaf = st.one_of(st.sampled_from(["i", "f"]), _NUM_LITERALS,
                      st.builds(lambda u: f"EXTRACT({u} FROM ts)", _UNITS),
                      st.builds(lambda u: f"EXTRACT({u} FROM d)", _UNITS),
                      st.just("LENGTH(s)"))
_time = st.one_of(
    st.sampled_from(["ts", "d", "CAST(d AS TIMESTAMP)", "CAST(ts AS DATE)"]),
    st.builds(lambda u: f"DATE_TRUNC('{u}', ts)", _UNITS),
    st.builds(lambda t: f"CAST('{t}' AS DATE)", _DATE_TEXT),
    st.builds(lambda t: f"CAST('{t}' AS TIMESTAMP)", _DATE_TEXT),
    st.builds(lambda n, u: f"(ts + INTERVAL '{n}' {u})", st.sampled_from(["1", "292000", "-3"]),
              st.sampled_from(["DAY", "YEAR", "HOUR"])),
    st.builds(lambda n: f"(DATE '2026-01-01' + INTERVAL '{n}' DAY)",
              st.sampled_from(["1", "x", "99999999999"])),
)
_text = st.one_of(
    st.just("s"), _STRING_LIT,
    st.builds(lambda f: f"{f}(s)", st.sampled_from(["LOWER", "UPPER", "TRIM"])),
    st.builds(lambda a: f"(s || {a})", _STRING_LIT),
    st.builds(lambda a: f"CAST({a} AS TEXT)", st.sampled_from(["i", "f", "d", "ts"])),
    st.just("COALESCE(s, 'z')"),
)
_simple_bool = st.one_of(
    st.sampled_from(["i > 0", "f < 1", "s IS NULL", "d IS NOT NULL", "TRUE"]),
)
# A column through a chain of operations with literals: where overflow and underflow live.
_chain = st.builds(
    lambda c, ops: "(" * len(ops) + c + "".join(f" {op} {lit})" for op, lit in ops),
    st.sampled_from(["i", "f", "ABS(f)", "CAST(i AS DOUBLE)", "(f - i)", "LEAST(f, i)"]),
    st.lists(st.tuples(st.sampled_from("*/+-"), _NUM_LITERALS), min_size=1, max_size=3))
_number = st.one_of(_chain, st.recursive(_num_leaf | _chain, _numbers, max_leaves=6))
_condition = st.one_of(
    st.builds(lambda a: f"{a} <> 0", _chain),
    st.builds(lambda a, b, op: f"{a} {op} {b}", _number, _number,
              st.sampled_from(["<", ">", "=", "<>", ">="])),
    st.builds(lambda t, v: f"{t} > '{v}'", st.sampled_from(["ts", "d"]), _DATE_TEXT),
    st.builds(lambda a, b: f"{a} < {b}", _time, _time),
    st.builds(lambda a, p, op: f"{a} {op} '{p}'", _text, _PATTERN,
              st.sampled_from(["LIKE", "ILIKE", "NOT LIKE"])),
    st.builds(lambda a, b: f"{a} = {b}", _text, _text),
    st.builds(lambda n, u: f"ts - INTERVAL ({n}) {u} < ts", _number,
              st.sampled_from(["SECOND", "DAY"])),
)
_guarded = st.builds(lambda c, g: f"CASE WHEN {g} THEN {c} ELSE FALSE END", _condition,
                     _simple_bool)


# -- the two backends ------------------------------------------------------------------------------

def _column_values(backend: str) -> dict[str, list[str]]:
    return {"i": _INTS, "f": _FLOATS, "s": _TEXTS, "d": _DATES[backend],
            "ts": _STAMPS[backend]}


def _rows(backend: str) -> list[str]:
    values = _column_values(backend)
    casts = {"i": "BIGINT", "f": "DOUBLE PRECISION", "s": "TEXT", "d": "DATE", "ts": "TIMESTAMP"}
    rows = []
    for r in range(_ROWS):
        cells = [f"CAST({vals[(r * (k + 1)) % len(vals)]} AS {casts[c]})"
                 for k, (c, vals) in enumerate(values.items())]
        rows.append("SELECT " + ", ".join(cells))
    return rows


_DDL = ("CREATE TEMP TABLE t (i BIGINT, f DOUBLE PRECISION, s TEXT, d DATE, ts TIMESTAMP)",
        "CREATE TEMP TABLE t_empty (i BIGINT, f DOUBLE PRECISION, s TEXT, d DATE, ts TIMESTAMP)")


class _Backend:
    def __init__(self, name: str, run: Callable[[str], None]) -> None:
        self.name = name
        self._run = run
        for stmt in _DDL:
            run(stmt)
        for row in _rows(name):
            run(f"INSERT INTO t {row}")

    def ok(self, sql: str) -> bool:
        try:
            self._run(sql)
        except (duckdb.Error, psycopg.Error):
            return False
        return True


@pytest.fixture(scope="module")
def backends() -> Iterator[list[_Backend]]:
    con = duckdb.connect()
    found = [_Backend("duckdb", lambda sql: con.execute(sql).fetchall())]
    try:
        pg = psycopg.connect(PG_ADMIN_URL, autocommit=True)
    except psycopg.OperationalError:
        if os.environ.get("CHORUS_REQUIRE_POSTGRES") == "1":
            raise
        pg = None

    def run_pg(sql: str) -> None:
        assert pg is not None
        with pg.cursor() as cur:
            cur.execute(sql.encode())
            if cur.description:
                cur.fetchall()

    if pg is not None:
        found.append(_Backend("postgres", run_pg))
    yield found
    con.close()
    if pg is not None:
        pg.close()


def _accepted(where: str, backend: _Backend) -> exp.Expr | None:
    """The annotated condition when the analysis accepts it on ``backend``, else None."""
    try:
        tree = parse_one(f"SELECT 1 FROM t WHERE {where}", read=backend.name)
        tree = qualify(tree, schema=_SCHEMA, dialect=backend.name)
        tree = annotate_types(tree, schema=_SCHEMA, dialect=backend.name)
    except Exception:  # not SQL this dialect parses or resolves: nothing to analyse
        return None
    condition = tree.args["where"].this
    ctx = RowContext(backend.name, lambda c: _TYPES.get(c.name), backend.ok)
    try:
        check_row(condition, "WHERE", ctx, boolean=True)
    except ChorusError:
        return None
    return condition


@settings(max_examples=N, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(where=st.one_of(_condition, _guarded))
def test_accepted_conditions_never_raise_on_any_row(backends: list[_Backend], where: str) -> None:
    for backend in backends:
        condition = _accepted(where, backend)
        if condition is None:
            continue
        rewritten = for_dialect(safety(condition), backend.name)
        probe = exp.Is(this=exp.Paren(this=rewritten), expression=exp.Null())
        sql = exp.select(probe).from_("t").sql(backend.name)
        if backend.ok(sql):
            continue
        # Failing on the edge rows: acceptable only if it fails without any row too.
        empty = exp.select(probe.copy()).from_("t_empty AS t").sql(backend.name)
        assert not backend.ok(empty), f"{backend.name}: accepted {where!r} raises on a row: {sql}"
