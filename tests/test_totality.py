"""Wall 2 (totality) and wall 8 (bounded cost): the attacks that read one person's value from
an error or from the run time, on DuckDB and on Postgres.

Each attack is run twice, once with a condition that one trip meets (trip 17 exists) and once
with one no trip meets (trip -17): whatever the outcome (refused or answered), it must be the
same, and a refusal must cost nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from sqlglot import exp, parse_one

from analyses.totality import (
    RowContext,
    check_row,
    check_statement_limits,
    duckdb_constants,
)
from chorus_py.engine import Engine
from chorus_py.errors import ChorusError, QueryRefused
from chorus_py.policy import LimitsConfig
from tests.conftest import nothing_spent

ALICE = {"analyst": "alice", "epsilon": 0.5}
_BACKENDS = ["duckdb", pytest.param("postgres", marks=pytest.mark.postgres)]

# (id, WHERE template over a trip id, whether every backend must refuse it)
ATTACKS = [
    ("interval-of-row-value",
     "CASE WHEN trip_id = {} THEN pickup_time > TIMESTAMP '2026-01-01' - "
     "INTERVAL (fare * 1000000000) SECOND ELSE TRUE END", True),
    ("interval-of-text-column",
     "CASE WHEN trip_id = {} THEN pickup_time > TIMESTAMP '2026-01-01' - INTERVAL (city) DAY "
     "ELSE TRUE END", True),
    ("compact-date-literal",
     "CASE WHEN trip_id = {} THEN pickup_time > '20260101' ELSE TRUE END", False),
    ("iso-week-date-literal",
     "CASE WHEN trip_id = {} THEN pickup_time > '2026-W01-1' ELSE TRUE END", True),
    ("hour-only-timestamp-literal",
     "CASE WHEN trip_id = {} THEN pickup_time > '2026-01-01T10' ELSE TRUE END", True),
    ("float-overflow-chain",
     "CASE WHEN trip_id = {} THEN fare * 1e300 * 1e300 > 1 ELSE TRUE END", False),
    ("float-underflow-chain",
     "CASE WHEN trip_id = {} THEN fare * 1e-300 * 1e-300 > 0 ELSE TRUE END", False),
    ("float-underflow-division",
     "CASE WHEN trip_id = {} THEN fare / 1e300 / 1e300 > 0 ELSE TRUE END", False),
    ("like-trailing-backslash",
     "CASE WHEN trip_id = {} THEN city LIKE 'S\\' ELSE TRUE END", True),
    ("extract-hour-of-a-date-cast",
     "CASE WHEN trip_id = {} THEN EXTRACT(hour FROM CAST(pickup_time AS DATE)) > 0 "
     "ELSE TRUE END", False),
]

_TRIP = ("17", "-17")


def _outcome(engine: Engine, sql: str) -> tuple[str, ...]:
    """Explain and execute ``sql``; only ChorusError may come out.  The error kinds raised."""
    found = []
    for call in (engine.explain, engine.execute):
        try:
            call(sql, **ALICE)
            found.append("answered")
        except ChorusError as err:
            found.append(type(err).__name__)
    return tuple(found)


@pytest.mark.parametrize("backend", _BACKENDS)
@pytest.mark.parametrize(("where", "everywhere"), [(w, e) for _, w, e in ATTACKS],
                         ids=[i for i, _, _ in ATTACKS])
def test_attack_outcome_does_not_depend_on_the_row(request: pytest.FixtureRequest,
                                                   make_engine: Callable[..., Engine],
                                                   backend: str, where: str,
                                                   everywhere: bool) -> None:
    url = request.getfixturevalue(f"{backend}_data")
    outcomes = []
    for value in _TRIP:
        engine = make_engine(url)
        outcome = _outcome(engine, f"SELECT COUNT(*) FROM trips WHERE {where.format(value)}")
        outcomes.append(outcome)
        if "answered" not in outcome:
            assert nothing_spent(engine), "a refusal must cost nothing"
    assert outcomes[0] == outcomes[1]
    if everywhere:
        assert "answered" not in outcomes[0]


@pytest.mark.postgres
@pytest.mark.parametrize("where", [
    "fare * 1e300 * 1e300 > 1", "fare * 1e-300 * 1e-300 > 0", "fare / 1e300 / 1e300 > 0",
    "CAST(trip_id AS DOUBLE) * 1e300 * 1e300 > 0", "distance_km / fare / 1e-10 > 1",
    "EXTRACT(hour FROM CAST(pickup_time AS DATE)) > 0",
])
def test_postgres_refuses_float_overflow_and_underflow(postgres_data: str,
                                                       make_engine: Callable[..., Engine],
                                                       where: str) -> None:
    """Postgres raises on float8 overflow and underflow (DuckDB returns Infinity or 0)."""
    engine = make_engine(postgres_data)
    with pytest.raises(QueryRefused):
        engine.execute(f"SELECT COUNT(*) FROM trips WHERE {where}", **ALICE)
    assert nothing_spent(engine)


@pytest.mark.parametrize("backend", _BACKENDS)
def test_compact_date_follows_the_backend(request: pytest.FixtureRequest,
                                          make_engine: Callable[..., Engine],
                                          backend: str) -> None:
    """'20260101' is a date to Postgres and not to DuckDB: the backend decides, not Python."""
    engine = make_engine(request.getfixturevalue(f"{backend}_data"))
    sql = "SELECT COUNT(*) FROM trips WHERE pickup_time > '20260101'"
    if backend == "postgres":
        assert engine.execute(sql, **ALICE).rows
    else:
        with pytest.raises(QueryRefused, match="20260101"):
            engine.execute(sql, **ALICE)
        assert nothing_spent(engine)


@pytest.mark.parametrize("backend", _BACKENDS)
def test_answered_arithmetic_releases_noisy_aggregates(request: pytest.FixtureRequest,
                                                       make_engine: Callable[..., Engine],
                                                       backend: str) -> None:
    """Safe row arithmetic (small constants, a guarded division) is still answered."""
    engine = make_engine(request.getfixturevalue(f"{backend}_data"))
    result = engine.execute(
        "SELECT COUNT(*) AS n FROM trips WHERE fare / 7 > 1 AND fare * 0.5 < 90 "
        "AND distance_km / 3 < 10 AND trip_id % 3 = 1", **ALICE)
    assert len(result.rows) == 1 and not nothing_spent(engine)
    assert result.report.columns[0].mechanism  # a noisy count, not the exact one


# -- wall 8: bounded cost ------------------------------------------------------------------------

_MEGABYTE = "x" * (1 << 20)


@pytest.mark.parametrize("backend", _BACKENDS)
def test_expensive_branch_is_refused_before_it_runs(request: pytest.FixtureRequest,
                                                    make_engine: Callable[..., Engine],
                                                    backend: str) -> None:
    """A branch one person's row takes that does seconds of string work: refused, free."""
    engine = make_engine(request.getfixturevalue(f"{backend}_data"))
    for literal, key in ((_MEGABYTE, "max_sql_chars"), ("x" * 2000, "max_literal_chars")):
        big = "LOWER(" * 20 + f"'{literal}'" + ")" * 20
        with pytest.raises(QueryRefused, match=rf"limits\.{key}"):
            engine.execute("SELECT COUNT(*) FROM trips WHERE CASE WHEN trip_id = 17 THEN "
                           f"LENGTH({big}) > 0 ELSE TRUE END", **ALICE)
    # Within the size limits (30 literals of 1000 characters), but 4 passes over 30 KB a row.
    small = "LOWER(UPPER(LOWER(" + " || ".join([f"'{'x' * 1000}'"] * 30) + ")))"
    with pytest.raises(QueryRefused, match=r"limits\.max_row_cost"):
        engine.execute("SELECT COUNT(*) FROM trips WHERE CASE WHEN trip_id = 17 THEN "
                       f"LENGTH({small}) > 0 ELSE TRUE END", **ALICE)
    assert nothing_spent(engine)


def test_statement_limits_name_their_key() -> None:
    limits = LimitsConfig(max_sql_chars=200, max_expression_nodes=40, max_expression_depth=8)
    with pytest.raises(QueryRefused, match=r"limits\.max_sql_chars"):
        check_statement_limits("SELECT " + "1 + " * 100 + "1", None, limits)
    with pytest.raises(QueryRefused, match=r"limits\.max_expression_nodes"):
        sql = "SELECT " + ", ".join(["1"] * 60)
        check_statement_limits(sql, parse_one(sql), limits)
    with pytest.raises(QueryRefused, match=r"limits\.max_expression_depth"):
        sql = "SELECT " + "ABS(" * 10 + "1" + ")" * 10
        check_statement_limits(sql, parse_one(sql), limits)
    check_statement_limits("SELECT ABS(1)", parse_one("SELECT ABS(1)"), limits)


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="max_literal_chars"):
        LimitsConfig(max_literal_chars=0)


# -- the analysis alone --------------------------------------------------------------------------

def _ctx(dialect: str = "duckdb") -> RowContext:
    types = {"i": "int", "f": "float", "s": "text", "d": "date", "ts": "timestamp"}
    return RowContext(dialect, lambda c: types.get(c.name), duckdb_constants())


def _annotated(where: str) -> exp.Expr:
    from sqlglot.optimizer.annotate_types import annotate_types
    from sqlglot.optimizer.qualify import qualify

    schema = {"t": {"i": "BIGINT", "f": "DOUBLE", "s": "TEXT", "d": "DATE", "ts": "TIMESTAMP"}}
    tree = qualify(parse_one(f"SELECT 1 FROM t WHERE {where}"), schema=schema)
    return annotate_types(tree, schema=schema).args["where"].this


@pytest.mark.parametrize(("where", "needle"), [
    ("REGEXP_MATCHES(s, 'a')", "REGEXP"),
    ("SQRT(f) > 1", "SQRT is not allowed on rows"),
    ("INTERVAL (i) DAY > INTERVAL '1' DAY", "interval amounts must be literals"),
    ("s LIKE s", "LIKE patterns must be string literals"),
    ("s LIKE 'a\\'", "escape character"),
    ("ts > '2026-13-01'", "2026-13-01"),
    ("CASE WHEN i = 1 THEN CAST('x' AS INT) ELSE 1 END = 1", "CAST('x' AS INT)"),
    ("DATE_TRUNC('fortnight', ts) > ts", "unit"),
])
def test_node_rules_refuse(where: str, needle: str) -> None:
    with pytest.raises(QueryRefused, match=re.escape(needle)):
        check_row(_annotated(where), "WHERE", _ctx(), boolean=True)


@pytest.mark.parametrize("where", [
    "f * 1e160 > 1", "f / 1e300 > 0", "i * 1e300 > 0", "f * 1e-300 > 0", "f * f * f > 0",
])
def test_postgres_float_rules(where: str) -> None:
    """On DuckDB these never raise; on Postgres each can (overflow or underflow)."""
    check_row(_annotated(where), "WHERE", _ctx("duckdb"), boolean=True)
    with pytest.raises(QueryRefused, match="flow"):
        check_row(_annotated(where), "WHERE", _ctx("postgres"), boolean=True)


@pytest.mark.parametrize("where", [
    "f * 0.5 > 1", "f / 7 > 0", "i * 2.5 > 0", "f + 1 > 0", "ABS(f) / 7 > 0",
    "i / (i - 3) > 0", "f * 2 > 1", "f + f > 0", "(f - 1) * 2 - 1 > 0", "f * f > 0",
])
def test_postgres_float_rules_accept(where: str) -> None:
    check_row(_annotated(where), "WHERE", _ctx("postgres"), boolean=True)


# -- the sanitised column reads of rewriters.safety ---------------------------------------------

def _rewritten(select: str, schema: dict[str, str], dialect: str) -> str:
    from sqlglot.optimizer.annotate_types import annotate_types
    from sqlglot.optimizer.qualify import qualify

    from rewriters.dialect import dialect as for_dialect
    from rewriters.safety import safety

    tables = {"r": schema}
    tree = annotate_types(qualify(parse_one(select, read=dialect), schema=tables,
                                  dialect=dialect), schema=tables, dialect=dialect)
    tree.set("expressions", [for_dialect(safety(e), dialect) for e in tree.expressions])
    return tree.sql(dialect)


@pytest.mark.parametrize("backend", _BACKENDS)
def test_sanitised_reads_cannot_fail(request: pytest.FixtureRequest, backend: str) -> None:
    """Under arithmetic, floats below 1e-150 in magnitude read as 0 and above 1e150 (infinities
    and NaN too) as +/-1e150, so f * 2 and f + f cannot overflow on the largest doubles; dates
    and timestamps under DATE_TRUNC, EXTRACT and casts are clamped into years 1-9999 (the
    earliest DuckDB timestamp would otherwise make DATE_TRUNC('month', ...) fail); NULL stays
    NULL."""
    import duckdb
    import psycopg

    from tests.conftest import PG_ADMIN_URL

    earliest = {"duckdb": "290309-12-22 (BC) 00:00:00", "postgres": "4713-01-01 00:00:00 BC"}
    rows = (f"(CAST('5e-324' AS DOUBLE PRECISION), CAST('{earliest[backend]}' AS TIMESTAMP)), "
            "(NULL, NULL), (CAST('1.5' AS DOUBLE PRECISION), CAST('infinity' AS TIMESTAMP)), "
            "(CAST('1.7976931348623157e308' AS DOUBLE PRECISION), NULL), "
            "(CAST('-1.7976931348623157e308' AS DOUBLE PRECISION), NULL), "
            "(CAST('Infinity' AS DOUBLE PRECISION), NULL), (CAST('NaN' AS DOUBLE PRECISION), NULL)")
    select = _rewritten("SELECT f * 0.5, f / 3, DATE_TRUNC('month', ts), EXTRACT(year FROM ts), "
                        "CAST(ts AS DATE), f * 2, f + f, f * f FROM r",
                        {"f": "DOUBLE", "ts": "TIMESTAMP"}, backend)
    ddl = "CREATE TEMP TABLE r (f DOUBLE PRECISION, ts TIMESTAMP)"
    if backend == "duckdb":
        con = duckdb.connect()
        con.execute(ddl)
        con.execute(f"INSERT INTO r VALUES {rows}")
        found = con.execute(select).fetchall()
    else:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as con:
            con.execute(ddl)
            con.execute(f"INSERT INTO r VALUES {rows}")
            found = con.execute(select).fetchall()
    assert found[0][0] == 0 and found[0][1] == 0  # the denormal read as 0
    assert found[0][2].year == 1 and int(found[0][3]) == 1
    assert found[1] == (None,) * 8
    assert found[2][2].year == 9999 and int(found[2][3]) == 9999
    assert found[2][5] == 3.0  # real values are read as they are
    for row in found[3:]:  # the largest doubles, infinity and NaN: tamed to +/-1e150
        assert abs(row[5]) == 2e150 and abs(row[6]) == 2e150
        assert row[7] == pytest.approx(1e300)


@pytest.mark.postgres
def test_join_condition_is_checked_for_totality(postgres_data: str,
                                                make_engine: Callable[..., Engine]) -> None:
    """ON is evaluated per pair of rows too: its expressions are held to the same rules."""
    engine = make_engine(postgres_data)
    with pytest.raises(QueryRefused, match="JOIN ON"):
        engine.execute("SELECT COUNT(*) FROM trips JOIN cities ON trips.city = cities.city "
                       "AND trips.fare * 1e300 * 1e300 > 0", **ALICE)
    assert nothing_spent(engine)
