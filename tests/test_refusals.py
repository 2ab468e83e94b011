"""Refusals: every query or parameter the engine must not answer gets a clear error, costs nothing.

Each refusal case runs on DuckDB and on Postgres (the ``engine`` fixture) and checks that
``execute`` and ``explain`` both raise the expected ``chorus_py.errors`` class with a message that
names the problem, and that no budget was charged.  Positive controls prove that close variants are
answered and charged, so the refusal tests can fail.  The analyst-attack tests at the end check
that tricky SQL is refused or answered safely, and never escapes as a raw Python, sqlglot, DuckDB or
psycopg exception.  Several cases are regression tests of leaks these tests once found
(data-dependent errors through casts, types, overflow and interval arithmetic).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

from chorus_py.engine import Engine
from chorus_py.errors import (
    ChorusError,
    InvalidParameter,
    NotSupportedError,
    ProgrammingError,
    QueryRefused,
    QuerySyntaxError,
    UndefinedColumn,
    UndefinedTable,
)
from tests.conftest import nothing_spent

ALICE: dict[str, Any] = {"analyst": "alice", "epsilon": 1.0, "delta": 1e-6}

# Fragments of raw driver errors that must never reach an analyst.
_RAW_ERROR_MARKERS = ("Conversion Error", "Binder Error", "Catalog Error", "Parser Error",
                      "Traceback", "psycopg", "_duckdb", "sqlglot.errors", "LINE 1:")


def case(sql: str, error: type[ChorusError], *needles: str, id: str, **kwargs: Any) -> Any:
    """One refusal: ``sql`` with ``kwargs`` (over ALICE's defaults) raises ``error`` naming
    every needle (case-insensitive)."""
    return pytest.param(sql, kwargs, error, needles, id=id)


def _check_message(err: ChorusError, needles: tuple[str, ...]) -> None:
    text = str(err)
    assert type(err).__module__ == "chorus_py.errors", type(err)
    assert err.message, "an error must carry a message"
    for needle in needles:
        assert needle.lower() in text.lower(), f"{needle!r} not in {text!r}"
    for marker in _RAW_ERROR_MARKERS:
        assert marker not in text, f"raw driver error leaked: {text!r}"


REFUSALS = [
    # -- raw rows ------------------------------------------------------------------------------
    case("SELECT * FROM trips", QueryRefused, "SELECT *", "raw", id="select-star"),
    case("SELECT fare FROM trips", QueryRefused, "fare", "neither aggregated", id="raw-column"),
    case("SELECT city, COUNT(*) FROM trips", QueryRefused, "city", "GROUP BY",
         id="column-next-to-aggregate"),
    case("SELECT COUNT(*) FROM trips ORDER BY fare", QueryRefused, "fare", "ORDER BY",
         id="raw-column-in-order-by"),
    case("SELECT COUNT(*) FROM trips GROUP BY city HAVING fare > 1", QueryRefused, "fare",
         "HAVING", id="raw-column-in-having"),
    case("SELECT DISTINCT city FROM trips", QueryRefused, "DISTINCT", id="select-distinct"),
    # -- writes, DDL, commands -----------------------------------------------------------------
    case("INSERT INTO trips (trip_id) VALUES (1)", QueryRefused, "INSERT", id="insert"),
    case("UPDATE trips SET fare = 0", QueryRefused, "UPDATE", id="update"),
    case("DELETE FROM trips", QueryRefused, "DELETE", id="delete"),
    case("DROP TABLE trips", QueryRefused, "DROP", id="drop-table"),
    case("CREATE TABLE stolen (a INT)", QueryRefused, "CREATE", id="create-table"),
    case("CREATE TEMP VIEW v AS SELECT * FROM trips", QueryRefused, "CREATE", id="create-view"),
    case("ALTER TABLE trips ADD COLUMN y INT", QueryRefused, "ALTER", id="alter"),
    case("TRUNCATE trips", QueryRefused, "TRUNCATE", id="truncate"),
    case("COPY trips TO '/tmp/chorus-stolen.csv'", QueryRefused, "COPY", id="copy-to"),
    case("COPY trips FROM '/tmp/chorus-planted.csv'", QueryRefused, "COPY", id="copy-from"),
    case("SET search_path = pg_catalog", QueryRefused, "SET", id="set"),
    case("GRANT ALL ON trips TO bob", QueryRefused, "GRANT", id="grant"),
    case("BEGIN", QueryRefused, "only SELECT", id="begin"),
    case("VACUUM", QueryRefused, "only SELECT", id="vacuum"),
    case("EXPLAIN SELECT COUNT(*) FROM trips", QueryRefused, "only SELECT", id="sql-explain"),
    case("VALUES (1)", QueryRefused, "VALUES", id="values"),
    case("WITH x AS (DELETE FROM trips RETURNING *) SELECT COUNT(*) FROM x", QueryRefused,
         "Delete", id="delete-in-cte"),
    case("SELECT COUNT(*) INTO stolen FROM trips", QueryRefused, "INTO", id="select-into"),
    case("SELECT COUNT(*) FROM trips FOR UPDATE", QueryRefused, "FOR UPDATE", id="for-update"),
    # -- several statements, empty, malformed ----------------------------------------------------
    case("SELECT COUNT(*) FROM trips; SELECT COUNT(*) FROM trips", QueryRefused, "2 statements",
         id="two-selects"),
    case("SELECT COUNT(*) FROM trips; DROP TABLE trips", QueryRefused, "2 statements",
         id="select-then-drop"),
    case("SELECT COUNT(*) FROM trips /* x */; DROP TABLE trips", QueryRefused, "2 statements",
         id="comment-then-drop"),
    case("SELECT COUNT(*) /* */ ; DROP TABLE trips; -- */ FROM trips", QueryRefused,
         "statements", id="comment-hiding-drop"),
    case("", QuerySyntaxError, "empty", id="empty"),
    case("   \n\t ", QuerySyntaxError, "empty", id="blank"),
    case("-- only a comment", QueryRefused, "0 statements", id="only-comment"),
    case(" ;; ", QueryRefused, "0 statements", id="only-semicolons"),
    case("SELECT COUNT(* FROM trips", QuerySyntaxError, "syntax error", id="unbalanced-paren"),
    case("SELEC COUNT(*) FROM trips", QuerySyntaxError, "syntax error", id="misspelt-select"),
    case("SELECT COUNT(*) FROM trips WHERE", QuerySyntaxError, "syntax error",
         id="dangling-where"),
    # -- unknown names, missing bounds ------------------------------------------------------------
    case("SELECT COUNT(*) FROM nope", UndefinedTable, "nope", id="unknown-table"),
    case("SELECT SUM(nope) FROM trips", UndefinedColumn, "nope", id="unknown-column"),
    case("SELECT COUNT(*) FROM trips WHERE nope = 1", UndefinedColumn, "nope",
         id="unknown-column-in-where"),
    case("SELECT SUM(driver_id) FROM trips", QueryRefused, "driver_id", "lower and upper",
         id="sum-unbounded"),
    case("SELECT AVG(driver_id) FROM trips", QueryRefused, "driver_id", "lower and upper",
         id="avg-unbounded"),
    case("SELECT SUM(fare + driver_id) FROM trips", QueryRefused, "driver_id", "lower and upper",
         id="sum-expression-unbounded"),
    case("SELECT SUM(rider_id) FROM trips", QueryRefused, "rider_id", "lower and upper",
         id="sum-privacy-unit"),
    # -- system catalogs, table functions, side effects ------------------------------------------
    case("SELECT COUNT(*) FROM pg_catalog.pg_class", QueryRefused, "system catalog",
         id="pg-class"),
    case("SELECT COUNT(*) FROM pg_class", QueryRefused, "system catalog", id="pg-class-bare"),
    case("SELECT COUNT(*) FROM information_schema.tables", QueryRefused, "system catalog",
         id="information-schema"),
    case("SELECT COUNT(*) FROM pg_stats", QueryRefused, "system catalog", id="pg-stats"),
    case("SELECT COUNT(*) FROM sqlite_master", QueryRefused, "system catalog",
         id="sqlite-master"),
    case("SELECT COUNT(*) FROM duckdb_tables()", QueryRefused, "table function",
         id="duckdb-tables"),
    case("SELECT COUNT(*) FROM read_csv('/etc/passwd')", QueryRefused, "table function",
         id="read-csv"),
    case("SELECT COUNT(*) FROM read_parquet('/tmp/x.parquet')", QueryRefused, "table function",
         id="read-parquet"),
    case("SELECT COUNT(*) FROM generate_series(1, 10)", QueryRefused, "table function",
         id="generate-series"),
    case("SELECT COUNT(*) FROM trips WHERE pg_sleep(1) IS NULL", QueryRefused, "PG_SLEEP",
         id="pg-sleep"),
    case("SELECT setseed(0.5), COUNT(*) FROM trips", QueryRefused, "SETSEED", id="setseed"),
    case("SELECT COUNT(*) FROM trips WHERE random() < 0.5", QueryRefused, "RAND", id="random"),
    case("SELECT current_setting('server_version'), COUNT(*) FROM trips", QueryRefused,
         "CURRENT_SETTING", id="current-setting"),
    case("SELECT COUNT(*) FROM trips WHERE city = current_user", QueryRefused, "CURRENT_USER",
         id="current-user"),
    case("SELECT pg_read_file('/etc/passwd'), COUNT(*) FROM trips", QueryRefused,
         "PG_READ_FILE", id="pg-read-file"),
    case("SELECT version(), COUNT(*) FROM trips", QueryRefused, "VERSION", id="version"),
    case("SELECT COUNT(*) FROM trips WHERE fare > $1", QueryRefused, "parameter",
         id="unbound-parameter"),
    case("SELECT COUNT(*) FROM trips TABLESAMPLE 10%", QueryRefused, "TableSample",
         id="tablesample"),
    # -- joins and subqueries ----------------------------------------------------------------------
    case("SELECT COUNT(*) FROM trips JOIN cities ON trips.city < cities.city", NotSupportedError,
         "non-equijoin", id="join"),
    case("SELECT COUNT(*) FROM trips, cities", NotSupportedError, "join", id="comma-join"),
    case("SELECT COUNT(*) FROM trips AS t, LATERAL (SELECT 1) AS x", NotSupportedError, "join",
         id="lateral"),
    case("SELECT COUNT(*) FROM trips WHERE city IN (SELECT name FROM cities)", NotSupportedError,
         "join", id="subquery-in-where"),
    case("SELECT COUNT(*) FROM trips WHERE fare > (SELECT 1)", NotSupportedError, "subquer",
         id="scalar-subquery-in-where"),
    case("SELECT (SELECT COUNT(*) FROM trips) FROM cities", NotSupportedError, "subquer",
         id="scalar-subquery-over-public"),
    case("SELECT COUNT(*) FROM trips WHERE fare > 1 AND NOT EXISTS (SELECT 1 FROM cities)",
         QueryRefused, "EXISTS", id="exists"),
    case("SELECT COUNT(*) FROM (SELECT * FROM trips LIMIT 10) AS t", NotSupportedError, "LIMIT",
         id="subquery-with-limit"),
    case("SELECT COUNT(*) FROM (SELECT DISTINCT rider_id FROM trips) AS t", NotSupportedError,
         "DISTINCT", id="subquery-with-distinct"),
    case("SELECT COUNT(*) FROM trips UNION SELECT COUNT(*) FROM trips", QueryRefused, "UNION",
         id="union"),
    case("SELECT COUNT(*) FROM (SELECT fare FROM trips UNION ALL SELECT fare FROM trips) AS t",
         NotSupportedError, "UNION", id="union-in-subquery"),
    # -- aggregates the engine cannot protect -----------------------------------------------------
    case("SELECT COUNT(*) OVER () FROM trips", NotSupportedError, "window", id="window"),
    case("SELECT SUM(fare) OVER (PARTITION BY city) FROM trips", NotSupportedError, "window",
         id="window-partition"),
    # Quantiles, MIN and MAX are answered (tests/test_quantiles.py); what stays refused names
    # the mode that answers it.
    case("SELECT driver_id % 7, MIN(fare) FROM trips GROUP BY driver_id % 7",
         NotSupportedError, "MIN", "public_values", "COUNT/SUM/AVG grouped by",
         id="min-thresholded-expression"),
    case("SELECT MAX(fare) - SUM(COUNT(*)) OVER () FROM trips", NotSupportedError, "window",
         id="max-with-window"),
    case("SELECT driver_id, MAX(fare), COUNT(*) FROM trips GROUP BY driver_id",
         NotSupportedError, "without public_values", "separate queries",
         id="max-with-count-thresholded"),
    case("SELECT MEDIAN(t.fare) FROM trips t JOIN trips u ON t.city = u.city",
         NotSupportedError, "join", "private data", "chorus.sensitivity = 'sampled'",
         id="median-join"),
    case("SELECT quantile(fare, 'x') FROM trips", QueryRefused, "number literal",
         id="quantile-string-fraction"),
    case("SELECT string_agg(city, ',') FROM trips", NotSupportedError, "STRING_AGG",
         id="string-agg"),
    case("SELECT array_agg(fare) FROM trips", NotSupportedError, "ARRAY_AGG", id="array-agg"),
    case("SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY pickup_time) FROM trips",
         QueryRefused, "declared bounds", id="percentile-cont-unbounded"),
    case("SELECT COUNT(DISTINCT city, fare) FROM trips", NotSupportedError, "one column",
         id="count-distinct-two-columns"),
    case("SELECT COUNT(DISTINCT LN(fare)) FROM trips", QueryRefused, "LN", "rows",
         id="count-distinct-of-a-failing-expression"),
    case("SELECT SUM(DISTINCT fare) FROM trips", NotSupportedError, "DISTINCT",
         id="sum-distinct"),
    case("SELECT COUNT(*) FROM trips GROUP BY 1", QueryRefused, "GROUP BY",
         id="group-by-aggregate"),
    # -- row-level expressions that can fail on some values ---------------------------------------
    case("SELECT SUM(LN(fare)) FROM trips", QueryRefused, "LN", "rows", id="ln-in-sum"),
    case("SELECT COUNT(*) FROM trips WHERE SQRT(fare - 10) > 1", QueryRefused, "SQRT",
         id="sqrt-in-where"),
    case("SELECT COUNT(*) FROM trips WHERE fare ^ 2 > 1", QueryRefused, "POWER",
         id="power-in-where"),
    case("SELECT COUNT(*) FROM trips WHERE CAST(city AS INT) > 3", QueryRefused, "cast",
         id="cast-text-to-int"),
    case("SELECT COUNT(*) FROM trips WHERE city::INT > 3", QueryRefused, "cast",
         id="pg-cast-text-to-int"),
    case("SELECT COUNT(*) FROM trips WHERE CAST(fare AS INT) = 1", QueryRefused, "cast",
         id="narrowing-cast"),
    case("SELECT COUNT(*) FROM trips WHERE city = 3", QueryRefused, "city", "number",
         id="text-vs-number"),
    case("SELECT COUNT(*) FROM trips WHERE city IN ('SF', 3)", QueryRefused, "city", "number",
         id="text-in-numbers"),
    case("SELECT COUNT(*) FROM trips WHERE fare = '12'", QueryRefused, "fare", "text",
         id="number-vs-text"),
    case("SELECT COUNT(*) FROM trips WHERE city LIKE city", QueryRefused, "LIKE",
         id="like-non-literal"),
    case("SELECT COUNT(*) FROM trips WHERE ROUND(fare, trip_id) > 1", QueryRefused, "ROUND",
         id="round-non-literal-digits"),
    # DuckDB: no bound on the value; Postgres refuses it sooner, as the division can overflow.
    case("SELECT SUM(fare / (fare - 10)) FROM trips", QueryRefused, "fare", "- 10",
         id="sum-unbounded-division"),
    case("SELECT COUNT(*) FROM trips WHERE CASE WHEN trip_id = 17 THEN CAST('x' AS INT) "
         "ELSE 1 END = 1", QueryRefused, "cast", id="failing-literal-cast-in-case"),
    case("SELECT COUNT(*) FROM trips WHERE city = -3", QueryRefused, "city", "number",
         id="text-vs-negative-number"),
    case("SELECT COUNT(*) FROM trips WHERE pickup_time = 5", QueryRefused, "pickup_time",
         id="timestamp-vs-number"),
    case("SELECT COUNT(*) FROM trips WHERE CASE WHEN trip_id = 17 THEN city ELSE '1' END = 1",
         ProgrammingError, id="text-case-vs-number"),
    case("SELECT COUNT(*) FROM trips WHERE CASE WHEN trip_id = 17 THEN city ELSE 'true' END",
         ProgrammingError, id="text-case-as-predicate"),
    case("SELECT COUNT(*) FROM trips WHERE 'x'", ProgrammingError, id="string-as-predicate"),
    case("SELECT COUNT(*) FROM trips WHERE LENGTH(fare) > 0", ProgrammingError, "LENGTH",
         id="length-of-number"),
    case("SELECT COUNT(*) FROM trips WHERE city * 2 > 0", ProgrammingError, "city",
         id="text-arithmetic"),
    case("SELECT COUNT(*) FROM trips WHERE pickup_time > 'notadate'", QueryRefused,
         "pickup_time", id="invalid-timestamp-literal"),
    case("SELECT COUNT(*) FROM trips WHERE date_trunc(city, pickup_time) IS NULL",
         QueryRefused, "DATE_TRUNC", id="date-trunc-column-unit"),
    case("SELECT COUNT(*) FROM trips WHERE pickup_time + INTERVAL '292221' YEAR > pickup_time",
         QueryRefused, "interval", id="timestamp-overflow"),
    # -- LIMIT / OFFSET ---------------------------------------------------------------------------
    case("SELECT COUNT(*) FROM trips LIMIT 1+1", QueryRefused, "LIMIT", id="limit-expression"),
    case("SELECT COUNT(*) FROM trips LIMIT (SELECT 1)", NotSupportedError, "subquer",
         id="limit-subquery"),
    case("SELECT COUNT(*) FROM trips LIMIT -1", QueryRefused, "LIMIT", id="limit-negative"),
    case("SELECT COUNT(*) FROM trips OFFSET city", QueryRefused, "OFFSET", id="offset-column"),
    case("SELECT COUNT(*) FROM trips LIMIT ALL", QueryRefused, "LIMIT", id="limit-all"),
    case("SELECT COUNT(*) FROM trips LIMIT 99999999999999999999999", QueryRefused, "LIMIT",
         id="limit-overflow"),
    # -- privacy parameters -----------------------------------------------------------------------
    case("SELECT COUNT(*) FROM trips", InvalidParameter, "epsilon", id="epsilon-zero",
         epsilon=0),
    case("SELECT COUNT(*) FROM trips", InvalidParameter, "epsilon", id="epsilon-negative",
         epsilon=-1),
    case("SELECT COUNT(*) FROM trips", InvalidParameter, "epsilon", id="epsilon-nan",
         epsilon=math.nan),
    case("SELECT COUNT(*) FROM trips", InvalidParameter, "epsilon", id="epsilon-inf",
         epsilon=math.inf),
    case("SELECT COUNT(*) FROM trips", InvalidParameter, "epsilon", id="epsilon-string",
         epsilon="1"),
    case("SELECT COUNT(*) FROM trips", InvalidParameter, "epsilon", "maximum", "500",
         id="epsilon-above-max", epsilon=1000),
    case("SELECT COUNT(*) FROM trips", InvalidParameter, "epsilon", "maximum", "0.5",
         id="epsilon-above-analyst-max", analyst="bob", epsilon=0.6),
    case("SELECT COUNT(*) FROM trips", InvalidParameter, "epsilon", id="epsilon-tiny",
         epsilon=1e-300),
    case("SELECT COUNT(*) FROM trips", InvalidParameter, "minimum", "0.001",
         "min_epsilon_per_query", id="epsilon-below-floor", epsilon=1e-12),
    case("SELECT SUM(fare) FROM trips", InvalidParameter, "epsilon", id="epsilon-tiny-sum",
         epsilon=1e-300),
    case("SELECT COUNT(*) FROM trips", InvalidParameter, "delta", id="delta-negative",
         delta=-1e-9),
    case("SELECT COUNT(*) FROM trips", InvalidParameter, "delta", id="delta-one", delta=1.0),
    case("SELECT COUNT(*) FROM trips", InvalidParameter, "delta", id="delta-nan",
         delta=math.nan),
    case("SELECT COUNT(*) FROM trips", InvalidParameter, "delta", "maximum",
         id="delta-above-max", delta=1e-3),
    case("SELECT COUNT(*) FROM trips", InvalidParameter, "unknown analyst", "mallory",
         id="unknown-analyst", analyst="mallory"),
    case("SELECT COUNT(*) FROM trips", InvalidParameter, "unknown analyst", id="empty-analyst",
         analyst=""),
    case("SELECT COUNT(*) FROM trips", InvalidParameter, "no analyst", id="no-analyst",
         analyst=None),
    case("SELECT driver_id, COUNT(*) FROM trips GROUP BY driver_id", InvalidParameter, "delta",
         id="threshold-needs-delta", delta=0.0),
    case("SELECT page, COUNT(*) FROM visits GROUP BY page", InvalidParameter, "delta",
         id="threshold-needs-delta-event-level", delta=0.0),
    # -- CTE shadowing a policy table --------------------------------------------------------------
    case("WITH trips AS (SELECT 1 AS fare) SELECT SUM(fare) FROM trips", QueryRefused,
         "no table", id="cte-shadows-trips-constant"),
    case("WITH trips AS (SELECT * FROM trips) SELECT fare FROM trips", QueryRefused,
         id="cte-shadows-trips-raw"),
    case("WITH cities AS (SELECT fare AS name FROM trips) SELECT name FROM cities", QueryRefused,
         "fare", "neither aggregated", id="cte-shadows-public-table-raw"),
    case("WITH cities AS (SELECT fare AS name FROM trips) SELECT * FROM cities", QueryRefused,
         "SELECT *", id="cte-shadows-public-table-star"),
    # -- quoted and qualified names ----------------------------------------------------------------
    case('SELECT COUNT(*) FROM "pg_catalog"."pg_class"', QueryRefused, "system catalog",
         id="quoted-pg-class"),
    case('SELECT COUNT(*) FROM "PG_CATALOG"."PG_CLASS"', QueryRefused, "system catalog",
         id="quoted-upper-pg-class"),
    case('SELECT COUNT(*) FROM "PG_STATS"', QueryRefused, "system catalog",
         id="quoted-pg-stats"),
    case('SELECT COUNT(*) FROM "information_schema"."tables"', QueryRefused, "system catalog",
         id="quoted-information-schema"),
    case("SELECT COUNT(*) FROM public.trips", QueryRefused, "schema-qualified", id="public-trips"),
    case("SELECT COUNT(*) FROM main.trips", QueryRefused, "schema-qualified", id="main-trips"),
    case('SELECT COUNT(*) FROM "public"."trips"', QueryRefused, "schema-qualified",
         id="quoted-public-trips"),
    case("SELECT COUNT(*) FROM test.public.trips", QueryRefused, "schema-qualified",
         id="catalog-qualified-trips"),
    # -- functions hidden in a CTE -----------------------------------------------------------------
    case("WITH t AS (SELECT pg_sleep(1) AS x, fare FROM trips) SELECT SUM(fare) FROM t",
         QueryRefused, "PG_SLEEP", id="pg-sleep-in-cte"),
    case("WITH t AS (SELECT setseed(0.5) AS s, fare FROM trips) SELECT SUM(fare) FROM t",
         QueryRefused, "SETSEED", id="setseed-in-cte"),
    case("WITH t AS (SELECT * FROM read_csv('/etc/passwd')) SELECT COUNT(*) FROM t",
         QueryRefused, "table function", id="read-csv-in-cte"),
    case("WITH t AS (SELECT fare FROM trips WHERE current_setting('x') = 'a') "
         "SELECT SUM(fare) FROM t", QueryRefused, "CURRENT_SETTING", id="current-setting-in-cte"),
]


@pytest.mark.parametrize(("sql", "kwargs", "error", "needles"), REFUSALS)
def test_refused(engine: Engine, sql: str, kwargs: dict[str, Any], error: type[ChorusError],
                 needles: tuple[str, ...]) -> None:
    args = {**ALICE, **kwargs}
    with pytest.raises(error) as executed:
        engine.execute(sql, **args)
    _check_message(executed.value, needles)
    with pytest.raises(error) as explained:
        engine.explain(sql, **args)
    _check_message(explained.value, needles)
    assert nothing_spent(engine)


def test_epsilon_missing(engine: Engine) -> None:
    """Without a default epsilon in the policy, epsilon=None is refused (the loader always sets
    one, so the policy is edited in memory)."""
    privacy = engine.policy.privacy.model_copy(update={"default_epsilon": None})
    engine.policy = engine.policy.model_copy(update={"privacy": privacy})
    for call in (engine.execute, engine.explain):
        with pytest.raises(InvalidParameter, match="epsilon is missing"):
            call("SELECT COUNT(*) FROM trips", analyst="alice", epsilon=None)
    assert nothing_spent(engine)


# -- positive controls: close variants are answered and charged ------------------------------------
CONTROLS = [
    pytest.param("SELECT COUNT(*) FROM trips", {}, id="count"),
    pytest.param("SELECT COUNT(*) FROM trips;", {}, id="trailing-semicolon"),
    pytest.param("SELECT COUNT(*) FROM trips", {"epsilon": None}, id="default-epsilon"),
    pytest.param("SELECT COUNT(*) FROM trips", {"analyst": "bob", "epsilon": 0.5},
                 id="bob-at-his-max"),
    pytest.param("SELECT COUNT(*) FROM trips", {"epsilon": 500}, id="epsilon-at-max"),
    pytest.param("SELECT COUNT(*) FROM trips", {"delta": 1e-4}, id="delta-at-max"),
    pytest.param("SELECT SUM(fare) FROM trips", {}, id="sum-bounded"),
    pytest.param("SELECT AVG(fare), STDDEV(distance_km) FROM trips", {}, id="avg-stddev"),
    pytest.param("SELECT SUM(1) FROM trips", {}, id="sum-constant"),
    pytest.param("SELECT SQRT(SUM(fare)) FROM trips", {}, id="sqrt-of-sum"),
    pytest.param("SELECT LN(COUNT(*) + 1) FROM trips", {}, id="ln-of-count"),
    pytest.param("SELECT city, COUNT(*) FROM trips GROUP BY city", {}, id="group-by-public"),
    pytest.param("SELECT city AS c, COUNT(*) FROM trips GROUP BY c", {}, id="group-by-alias"),
    pytest.param("SELECT driver_id, COUNT(*) FROM trips GROUP BY driver_id", {"delta": 1e-6},
                 id="group-by-thresholded"),
    pytest.param("SELECT COUNT(DISTINCT rider_id) FROM trips", {}, id="count-distinct-unit"),
    pytest.param("SELECT COUNT(DISTINCT city) FROM trips", {}, id="count-distinct-other"),
    pytest.param("SELECT COUNT(DISTINCT visit_id) FROM visits", {},
                 id="count-distinct-event-level"),
    pytest.param("SELECT COUNT(*) FROM trips WHERE city LIKE 'S%'", {}, id="like-literal"),
    pytest.param("SELECT COUNT(*) FROM trips WHERE city = 'SF' AND fare BETWEEN 10 AND 50", {},
                 id="filters"),
    pytest.param("SELECT COUNT(*) FROM trips WHERE CAST(city AS TEXT) = 'SF' "
                 "AND CAST(fare AS DOUBLE) > 1", {}, id="total-casts"),
    pytest.param("SELECT COUNT(*) FROM trips WHERE pickup_time < CURRENT_TIMESTAMP", {},
                 id="current-timestamp"),
    pytest.param("SELECT COUNT(*) FROM trips WHERE pickup_time >= '2026-02-01 12:00:00'", {},
                 id="string-timestamp-literal"),
    pytest.param("SELECT COUNT(*) FROM trips WHERE CAST(pickup_time AS DATE) = DATE '2026-01-31'",
                 {}, id="typed-date-literal"),
    pytest.param("SELECT COUNT(*) FROM trips WHERE pickup_time >= CURRENT_DATE - INTERVAL '1' "
                 "YEAR", {}, id="current-date-interval"),
    pytest.param("SELECT COUNT(*) AS n FROM trips GROUP BY city ORDER BY n DESC LIMIT 3", {},
                 id="order-limit"),
    pytest.param("WITH t AS (SELECT fare FROM trips WHERE fare > 10) SELECT SUM(fare) FROM t",
                 {}, id="filtering-cte"),
    pytest.param("SELECT COUNT(*) FROM (SELECT fare FROM trips WHERE fare > 10) AS t", {},
                 id="filtering-subquery"),
    pytest.param('SELECT COUNT(*) FROM "trips"', {}, id="quoted-table"),
    pytest.param("SELECT COUNT(*) FROM trips -- ; DROP TABLE trips", {},
                 id="line-comment"),
    pytest.param("SELECT SUM(seconds) FROM visits", {}, id="event-level-sum"),
]


@pytest.mark.parametrize(("sql", "kwargs"), CONTROLS)
def test_answered_and_charged(engine: Engine, sql: str, kwargs: dict[str, Any]) -> None:
    args = {**ALICE, **kwargs}
    report = engine.explain(sql, **args)
    assert report.epsilon > 0 and not report.charged
    assert nothing_spent(engine), "explain must not charge"
    result = engine.execute(sql, **args)
    assert result.report.charged and result.report.epsilon == report.epsilon
    assert len(result.columns) >= 1
    assert not nothing_spent(engine), "a private query must charge the budget"


@pytest.mark.parametrize("backend", [
    pytest.param("duckdb"),
    pytest.param("postgres", marks=pytest.mark.postgres),
])
def test_typed_timestamp_literal_is_answered(request: pytest.FixtureRequest,
                                             make_engine: Callable[..., Engine],
                                             backend: str) -> None:
    engine = make_engine(request.getfixturevalue(f"{backend}_data"))
    sql = "SELECT COUNT(*) FROM trips WHERE pickup_time >= TIMESTAMP '2026-02-01'"
    assert engine.explain(sql, **ALICE).epsilon > 0
    assert engine.execute(sql, **ALICE).report.charged


def test_public_table_is_free(engine: Engine) -> None:
    result = engine.execute("SELECT COUNT(*) FROM cities", **ALICE)
    assert result.rows == [(5,)] and not result.report.charged
    assert nothing_spent(engine)


# -- analyst attacks ------------------------------------------------------------------------------
def _refused_or_answered(engine: Engine, sql: str, **kwargs: Any) -> list[ChorusError]:
    """Run explain and execute; only ChorusError may come out.  Returns the errors raised."""
    errors = []
    for call in (engine.explain, engine.execute):
        try:
            call(sql, **{**ALICE, **kwargs})
        except ChorusError as err:
            _check_message(err, ())
            errors.append(err)
    return errors


def _nested(depth: int) -> str:
    return "SELECT COUNT(*) FROM trips WHERE " + "(" * depth + "fare > 1" + ")" * depth


ATTACKS = [
    pytest.param(_nested(30), id="30-nested-parens"),
    pytest.param("SELECT COUNT(*) FROM trips WHERE trip_id IN ("
                 + ", ".join(str(i) for i in range(1000, 3000)) + ")", id="10k-char-in-list"),
    pytest.param("SELECT COUNT(*) FROM trips WHERE city IN ("
                 + ", ".join(f"'c{i}'" for i in range(1000)) + ")", id="text-in-list"),
    pytest.param("SELECT COUNT(*) FROM trips WHERE " + " AND ".join(["fare > 1"] * 300),
                 id="300-conjuncts"),
    pytest.param("SELECT COUNT(*) FROM trips WHERE " + " + ".join(["fare"] * 300) + " > 1",
                 id="300-term-sum"),
    pytest.param("SELECT COUNT(*) FROM trips WHERE city = '" + "x" * 20000 + "'",
                 id="20k-char-literal"),
    pytest.param("SELECT COUNT(*) FROM trips WHERE city = 'S\x00F'", id="nul-in-literal"),
    pytest.param("SELECT COUNT(*) FROM trips WHERE city = 'S' -- \x00", id="nul-in-comment"),
    pytest.param("SELECT COUNT(*) FROM trips\x00", id="nul-after-table"),
    pytest.param("SELECT COUNT(*) FROM trips WHERE city = 'Zürich ☃ 北京 \U0001f600'",
                 id="unicode-literal"),
    pytest.param("SELECT COUNT(*) FROM trips WHERE city = E'\\x00'", id="escape-string"),
    pytest.param("SELECT COUNT(*) FROM trips WHERE city = $$SF$$", id="dollar-quoted"),
    pytest.param("SELECT COUNT(*) FROM trips WHERE city = 'it''s'", id="doubled-quote"),
    pytest.param("SELECT COUNT(*) FROM trips WHERE city = 'a\\' OR 1=1 --'",
                 id="backslash-quote"),
    pytest.param("SELECT COUNT(*) FROM trips -- */ ; DROP TABLE trips", id="comment-closer"),
    pytest.param('SELECT COUNT(*) FROM "TRIPS"', id="quoted-upper-table"),
    pytest.param('SELECT COUNT(*) FROM "trips" AS "pg_class"', id="alias-named-catalog"),
    pytest.param("SELECT COUNT(*) FROM trips WHERE city = 'SF' UNION SELECT 1", id="union-tail"),
    pytest.param("SELECT SUM(fare * 0) FROM trips", id="sum-times-zero"),
    pytest.param("SELECT SUM(fare * 1e308) FROM trips", id="sum-infinite-bound"),
    pytest.param("SELECT VARIANCE(fare * 1e200) FROM trips", id="variance-overflow"),
    pytest.param(_nested(200), id="200-nested-parens"),
    pytest.param("SELECT COUNT(*) FROM trips WHERE " + "ABS(" * 200 + "fare" + ")" * 200 + " > 1",
                 id="200-nested-calls"),
    pytest.param("SELECT COUNT(*) FROM trips WHERE " + "NOT " * 500 + "fare > 1",
                 id="500-nots"),
    pytest.param("SELECT COUNT(*) FROM trips WHERE city = '\ud800'", id="lone-surrogate"),
    pytest.param("SELECT COUNT(*) FROM trips WHERE city = 'S\udcffF'", id="lone-low-surrogate"),
]


@pytest.mark.parametrize("sql", ATTACKS)
def test_attack_refused_or_answered(engine: Engine, sql: str) -> None:
    _refused_or_answered(engine, sql)


def test_comment_payload_never_reaches_the_database(engine: Engine) -> None:
    for sql in ("SELECT COUNT(*) FROM trips -- ; DROP TABLE trips",
                "SELECT COUNT(*) FROM trips -- */ ; DROP TABLE trips",
                "SELECT COUNT(*) /* ; DROP TABLE trips */ FROM trips"):
        report = engine.explain(sql, **ALICE)
        assert "DROP" not in (report.rewritten_sql or "").upper()
        engine.execute(sql, **ALICE)
    # trips is still there
    assert engine.execute("SELECT COUNT(*) FROM trips", **ALICE).rows


def test_cte_named_like_a_public_table_is_still_private(engine: Engine) -> None:
    report = engine.explain(
        "WITH cities AS (SELECT fare AS name FROM trips) SELECT COUNT(*) FROM cities", **ALICE)
    assert report.tables == ("trips",) and report.epsilon > 0
    assert report.privacy_unit == "rider_id"


def test_cte_named_like_another_private_table_uses_the_real_bounds(engine: Engine) -> None:
    # visits is event-level with seconds in [0, 600]; the CTE reads trips (k = 10, fare <= 200).
    report = engine.explain(
        "WITH visits AS (SELECT fare AS seconds FROM trips) SELECT SUM(seconds) FROM visits",
        **ALICE)
    assert report.tables == ("trips",) and report.privacy_unit == "rider_id"
    assert [m.sensitivity for m in report.measurements] == [10 * 200]


def test_quoted_table_is_the_private_table(engine: Engine) -> None:
    for sql in ('SELECT COUNT(*) FROM "TRIPS"', 'SELECT COUNT(*) FROM "trips"'):
        try:
            result = engine.execute(sql, **ALICE)
        except ChorusError as err:
            _check_message(err, ())
            continue
        assert result.report.charged and result.report.tables == ("trips",)


def test_backend_error_message_holds_no_data_value(engine: Engine) -> None:
    # DuckDB's own errors would say "Could not convert string 'home' to INT32" (a page value)
    # or "... string '22.39x' ..." (a fare): the analyst must see neither.
    pages = [row[0] for row in engine.backend.run("SELECT DISTINCT page FROM visits").rows]
    fares = [row[0] for row in engine.backend.run("SELECT DISTINCT fare FROM trips").rows]
    assert pages and fares
    fare_text = "CASE WHEN fare > 0 THEN CAST(fare AS TEXT) || 'x'"
    for sql in ("SELECT COUNT(*) FROM visits WHERE page = -3",
                "SELECT COUNT(*) FROM visits WHERE CASE WHEN visit_id > 0 THEN page ELSE '1' END "
                "= 1",
                f"SELECT COUNT(*) FROM trips WHERE {fare_text} ELSE '1' END = 1",
                f"SELECT COUNT(*) FROM trips WHERE {fare_text} ELSE 'true' END"):
        for err in _refused_or_answered(engine, sql):
            text = str(err)
            assert not any(p in text for p in pages), text
            assert not any(f"{f}" in text or f"{f:g}" in text for f in fares if f >= 10), text


def _pairs(template: str, values: tuple[str, str], id: str) -> list[Any]:
    """One query shape run twice (first value matches rows, second matches none), per backend."""
    params = []
    for backend in ("duckdb", "postgres"):
        marks = [pytest.mark.postgres] if backend == "postgres" else []
        params.append(pytest.param(backend, template, values, id=f"{backend}-{id}", marks=marks))
    return params


_TRIP = ("17", "-17")  # trip 17 exists, trip -17 does not
DATA_DEPENDENT_ERRORS = [
    *_pairs("SELECT COUNT(*) FROM trips WHERE CASE WHEN trip_id = {} THEN CAST('x' AS INT) "
            "ELSE 1 END = 1", _TRIP, "literal-cast-in-case"),
    *_pairs("SELECT COUNT(*) FROM trips WHERE pickup_time {} AND pickup_time + INTERVAL '292221' "
            "YEAR > pickup_time", (">= TIMESTAMP '2026-03-01'", "< TIMESTAMP '2026-01-05'"),
            "timestamp-overflow"),
    *_pairs("SELECT COUNT(*) FROM trips WHERE CASE WHEN trip_id = {} THEN LN(fare - 500) "
            "ELSE 1 END = 1", _TRIP, "ln-in-case"),
    *_pairs("SELECT COUNT(*) FROM trips WHERE CASE WHEN trip_id = {} THEN fare / 0 ELSE 1 END = 1",
            _TRIP, "division-by-zero-in-case"),
    *_pairs("SELECT COUNT(*) FROM trips WHERE CASE WHEN trip_id = {} THEN trip_id * "
            "9223372036854775807 ELSE 1 END = 1", _TRIP, "column-overflow-in-case"),
    *_pairs("SELECT COUNT(*) FROM trips WHERE CASE WHEN trip_id = {} THEN city ELSE '1' END = 1",
            _TRIP, "text-case-vs-number"),
    *_pairs("SELECT COUNT(*) FROM trips WHERE CASE WHEN trip_id = {} THEN city ELSE 'true' END",
            _TRIP, "text-case-as-predicate"),
    *_pairs("SELECT COUNT(*) FROM trips WHERE COALESCE(CASE WHEN trip_id = {} THEN city END, '1')"
            " = 1", _TRIP, "coalesce-text-vs-number"),
    *_pairs("SELECT COUNT(*) FROM trips WHERE CASE WHEN trip_id = {} THEN pickup_time END",
            _TRIP, "timestamp-as-predicate"),
    *_pairs("SELECT COUNT(*) FROM trips WHERE CASE WHEN trip_id = {} THEN -9223372036854775807 - 2"
            " ELSE 1 END > 0", _TRIP, "literal-overflow-in-case"),
    *_pairs("SELECT COUNT(*) FROM trips WHERE ABS(CASE WHEN trip_id = {} THEN "
            "-9223372036854775808 ELSE 1 END) > 0", _TRIP, "abs-of-bigint-min-in-case"),
]


@pytest.mark.parametrize(("backend", "template", "values"), DATA_DEPENDENT_ERRORS)
def test_errors_do_not_depend_on_the_data(request: pytest.FixtureRequest,
                                          make_engine: Callable[..., Engine], backend: str,
                                          template: str, values: tuple[str, str]) -> None:
    """The same query shape, once matching rows (first value) and once matching none: whether
    it fails, and how, must not depend on the rows (an error raised by one row would reveal that
    row, whatever the noise)."""
    url = request.getfixturevalue(f"{backend}_data")
    outcomes = []
    for value in values:
        engine = make_engine(url)
        outcomes.append(tuple(type(e).__name__ for e in
                              _refused_or_answered(engine, template.format(value))))
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize(("sql", "sensitivity"), [
    # A unit's <= k = 7 kept rows may each bring a driver no other row has: Delta = k = 7.
    ("SELECT COUNT(DISTINCT driver_id) FROM trips", 7),
    ("SELECT city, COUNT(DISTINCT driver_id) FROM trips GROUP BY city", 7),
    # Event level: a neighbour is one row, one value: Delta = 1.
    ("SELECT COUNT(DISTINCT page) FROM visits", 1),
])
def test_a_distinct_count_of_another_column_has_the_sensitivity_of_a_count(
        backend_url: str, make_engine: Callable[..., Engine], sql: str,
        sensitivity: int) -> None:
    engine = make_engine(backend_url, k=7)
    report = engine.explain(sql, **ALICE)
    assert [m.sensitivity for m in report.measurements] == [sensitivity]
