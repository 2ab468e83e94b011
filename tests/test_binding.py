"""Wall 1 (binding by scope) and wall 3 (generated SQL only), on DuckDB and Postgres.

The attack: table names were matched against every CTE name of the statement, whatever its
scope, so a query reading the private ``trips`` next to a CTE named ``trips`` ran as a public
query, exactly and free.  Every query here that reads a private table must be charged and answer
only noisy aggregates, or be refused with nothing charged; a hypothesis generator explores the
class (nested WITH, subqueries, aliases, shadowing names, quoting and case).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import sqlglot
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from analyses.binding import bind_tables, generated_sql
from chorus_py.backends import SCHEMA
from chorus_py.engine import Engine
from chorus_py.errors import ChorusError, QueryRefused, UndefinedTable

KNOWN = frozenset({"trips", "cities", "visits"})
PRIVATE = {"trips", "visits"}

ATTACK = ("SELECT x.rider_id, x.fare FROM trips x, "
          "(WITH trips AS (SELECT 1 AS a FROM cities) SELECT a FROM trips) s")


def _tables(sql: str, dialect: str = "duckdb") -> tuple[str, ...]:
    return bind_tables(sqlglot.parse_one(sql, read=dialect), dialect, KNOWN).tables


@pytest.mark.parametrize("dialect", ["duckdb", "postgres"])
def test_the_attack_binds_the_outer_trips_to_the_table(dialect: str) -> None:
    assert _tables(ATTACK, dialect) == ("trips", "cities")


@pytest.mark.parametrize("dialect", ["duckdb", "postgres"])
@pytest.mark.parametrize(("sql", "tables"), [
    # A CTE is visible in its own SELECT only.
    ("SELECT COUNT(*) FROM (WITH trips AS (SELECT * FROM cities) SELECT * FROM trips) s "
     "JOIN trips t ON TRUE", ("cities", "trips")),
    # An earlier CTE cannot see a later sibling: this 'trips' is the table.
    ("WITH a AS (SELECT * FROM trips), trips AS (SELECT * FROM cities) SELECT COUNT(*) FROM a",
     ("trips", "cities")),
    # A later CTE sees an earlier one.
    ("WITH trips AS (SELECT * FROM cities), a AS (SELECT * FROM trips) SELECT COUNT(*) FROM a",
     ("cities",)),
    # A WITH nested in a CTE is visible inside that CTE only.
    ("WITH x AS (WITH trips AS (SELECT * FROM cities) SELECT * FROM trips) "
     "SELECT COUNT(*) FROM x, trips", ("cities", "trips")),
    ("WITH cities AS (SELECT * FROM trips) SELECT COUNT(*) FROM cities", ("trips",)),
    ("WITH trips AS (SELECT * FROM cities) SELECT COUNT(*) FROM trips", ("cities",)),
    # A scalar subquery in the select list reads tables too.
    ("SELECT (SELECT COUNT(*) FROM trips) FROM cities", ("trips", "cities")),
])
def test_names_bind_by_scope(dialect: str, sql: str, tables: tuple[str, ...]) -> None:
    assert set(_tables(sql, dialect)) == set(tables)


def test_quoted_names_follow_each_backends_rules() -> None:
    sql = 'WITH "TRIPS" AS (SELECT * FROM cities) SELECT COUNT(*) FROM trips'
    # Postgres: "TRIPS" keeps its case, trips folds to lower case: two different names.
    assert _tables(sql, "postgres") == ("cities", "trips")
    # DuckDB compares names case-insensitively, quoted or not.
    assert _tables(sql, "duckdb") == ("cities",)
    with pytest.raises(UndefinedTable):  # Postgres: "TRIPS" is no declared table
        _tables('SELECT COUNT(*) FROM "TRIPS"', "postgres")
    assert _tables('SELECT COUNT(*) FROM "TRIPS"', "duckdb") == ("trips",)


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM users",
    "WITH trips AS (SELECT * FROM users) SELECT COUNT(*) FROM trips",
    "SELECT COUNT(*) FROM (WITH users AS (SELECT * FROM cities) SELECT * FROM cities) s, users",
    "SELECT COUNT(*) FROM chorus_cte_0",
])
def test_undeclared_tables_are_refused_wherever_they_hide(sql: str) -> None:
    with pytest.raises(UndefinedTable):
        _tables(sql)


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM main.trips",
    "WITH x AS (SELECT * FROM public.cities) SELECT COUNT(*) FROM x",
    "WITH RECURSIVE r AS (SELECT 1 AS n FROM cities) SELECT COUNT(*) FROM r",
    "SELECT COUNT(*) FROM pg_catalog.pg_user",
])
def test_qualified_names_and_recursion_are_refused(sql: str) -> None:
    with pytest.raises(QueryRefused):
        _tables(sql)


def test_ctes_are_renamed_apart_and_the_generated_sql_qualifies_base_tables() -> None:
    bound = bind_tables(sqlglot.parse_one(ATTACK), "duckdb", KNOWN)
    text = generated_sql(bound.tree, bound.tables, "duckdb", "main")
    assert '"main".trips AS x' in text and '"main".cities' in text
    assert "WITH chorus_cte_0 AS" in text and "FROM chorus_cte_0 AS trips" in text
    # The analyst's text is not what runs, and no CTE carries a table's name.
    tree = sqlglot.parse_one(text, read="duckdb")
    assert {c.alias for c in tree.find_all(sqlglot.exp.CTE)} == {"chorus_cte_0"}


# -- through the engine, on both backends ------------------------------------------------
def _claims(engine: Engine) -> int:
    return len(engine.ledger.claims())


def _answers_safely(engine: Engine, sql: str, reads_private: bool | None) -> str:
    """Run ``sql``; check the invariant; return what happened ("refused", "public", "noisy")."""
    before = _claims(engine)
    try:
        result = engine.execute(sql, analyst="alice", epsilon=1.0, delta=1e-6)
    except ChorusError:
        assert _claims(engine) == before, f"a refusal charged budget: {sql}"
        return "refused"
    report = result.report
    if report.noise == "none":
        assert report.epsilon == 0 and not report.charged
        assert all(t not in PRIVATE for t in report.tables), sql
        assert reads_private is not True, f"a private read answered exactly: {sql}"
        return "public"
    assert report.charged and report.epsilon > 0 and _claims(engine) == before + 1, sql
    assert report.rewritten_sql and "RANDOM()" in report.rewritten_sql.upper()
    return "noisy"


def test_the_attack_is_never_answered_exactly(engine: Engine) -> None:
    assert _answers_safely(engine, ATTACK, True) == "refused"
    # With an aggregate, the same shape is a (refused) cross join or a noisy answer: never exact.
    for sql in (
        "SELECT COUNT(*), SUM(x.fare) FROM trips x, "
        "(WITH trips AS (SELECT 1 AS a FROM cities) SELECT a FROM trips) s",
        "WITH a AS (SELECT * FROM trips), trips AS (SELECT * FROM cities) SELECT COUNT(*) FROM a",
        "WITH x AS (WITH trips AS (SELECT * FROM cities) SELECT * FROM trips) "
        "SELECT COUNT(*) FROM trips",
        "WITH cities AS (SELECT * FROM trips) SELECT COUNT(*) FROM cities",
    ):
        assert _answers_safely(engine, sql, True) in ("refused", "noisy"), sql


def test_a_cte_named_like_a_private_table_reading_a_public_one_is_public(engine: Engine) -> None:
    sql = "WITH trips AS (SELECT * FROM cities) SELECT COUNT(*) FROM trips"
    assert _answers_safely(engine, sql, False) == "public"
    assert engine.explain(sql, analyst="alice").epsilon == 0
    sql = "WITH cities AS (SELECT * FROM trips) SELECT COUNT(*) FROM cities"
    assert _answers_safely(engine, sql, True) == "noisy"
    report = engine.explain(sql, analyst="alice")
    assert report.tables == ("trips",) and report.epsilon > 0


def test_quoted_case_variant_on_each_backend(engine: Engine) -> None:
    sql = 'WITH "TRIPS" AS (SELECT * FROM cities) SELECT COUNT(*) FROM trips'
    if engine.dialect == "postgres":
        # "TRIPS" is another name: the table trips is read, and the unused CTE is refused.
        assert _answers_safely(engine, sql, True) == "refused"
        used = 'WITH "TRIPS" AS (SELECT * FROM trips) SELECT COUNT(*) FROM "TRIPS"'
        assert _answers_safely(engine, used, True) == "noisy"
    else:  # DuckDB: the CTE shadows trips, and reads cities
        assert _answers_safely(engine, sql, False) == "public"


def test_public_queries_run_generated_sql(engine: Engine) -> None:
    # The analyst's spelling (a quoted alias, a CTE) is not what runs; the answer is the same.
    result = engine.execute('WITH c AS (SELECT * FROM cities) SELECT COUNT(*) AS "N" FROM c',
                            analyst="alice")
    direct = engine.execute("SELECT COUNT(*) FROM cities", analyst="alice")
    assert result.rows == direct.rows and result.columns == ("N",)


# -- the class: random nesting and shadowing ------------------------------------------------
NAMES = ["trips", "cities", "visits", "users", "TRIPS", '"TRIPS"', '"trips"', "Cities", "x", "y"]


@dataclass
class _Gen:
    """Builds a relation expression and knows what it reads (the test's own scope model)."""

    dialect: str
    draw: Callable[..., object]

    def key(self, name: str) -> str:
        if name.startswith('"'):
            inner = name.strip('"')
            return inner.lower() if self.dialect == "duckdb" else inner
        return name.lower()

    def rel(self, env: dict[str, set[str]], depth: int) -> tuple[str, set[str]]:
        kind = self.draw(st.sampled_from(["name", "name", "sub", "with"] if depth < 3
                                         else ["name"]))
        if kind == "name":
            name = self.draw(st.sampled_from(NAMES + sorted(env)))
            key = self.key(name)
            if key in env:
                return name, env[key]
            return name, {key}  # a base table (maybe undeclared, maybe mis-cased)
        if kind == "sub":
            inner, reads = self.rel(env, depth + 1)
            return f"(SELECT * FROM {inner} AS i{depth}) ", reads
        ctes, inner_env, used = [], dict(env), set()
        for _ in range(self.draw(st.integers(1, 2))):
            name = self.draw(st.sampled_from([*NAMES[:8], "c1", "c2"]))
            body, reads = self.rel(inner_env, depth + 1)
            ctes.append(f"{name} AS (SELECT * FROM {body} AS b{depth})")
            inner_env[self.key(name)] = reads
            used |= reads  # an unused CTE body counts as read: the engine refuses it
        body, reads = self.rel(inner_env, depth + 1)
        return f"(WITH {', '.join(ctes)} SELECT * FROM {body} AS w{depth}) ", reads | used


@st.composite
def _queries(draw: Callable[..., object], dialect: str) -> tuple[str, set[str]]:
    gen = _Gen(dialect, draw)
    rel, reads = gen.rel({}, 0)
    shape = draw(st.sampled_from(["count", "raw", "join"]))
    if shape == "count":
        return f"SELECT COUNT(*) FROM {rel} AS q", reads
    if shape == "raw":  # raw rows: exact only if everything read is public
        return f"SELECT * FROM {rel} AS q", reads
    return f"SELECT COUNT(*) FROM trips AS t, {rel} AS q", reads | {"trips"}


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_shadowing_never_answers_a_private_read_exactly(engine: Engine, data: st.DataObject
                                                        ) -> None:
    sql, reads = data.draw(_queries(engine.dialect))
    private = bool(reads & PRIVATE)
    try:  # explain first: it must foresee what execute does, and charge nothing
        report = engine.explain(sql, analyst="alice", epsilon=1.0, delta=1e-6)
        foreseen = "public" if report.noise == "none" else "noisy"
    except ChorusError:
        foreseen = "refused"
    outcome = _answers_safely(engine, sql, private)
    event(f"{outcome}, reads {'private' if private else 'public only'}")
    assert foreseen == outcome, sql
    if outcome == "public":
        assert reads <= {"cities"}, sql
    if outcome == "noisy":
        assert private and set(report.tables) & PRIVATE, sql


@pytest.mark.parametrize("query", [
    "SELECT city, COUNT(*), AVG(fare) FROM trips GROUP BY city",
    "WITH cities AS (SELECT * FROM trips) SELECT COUNT(*) FROM cities",
    "SELECT COUNT(*) FROM trips t JOIN cities c ON t.city = c.city",
])
def test_private_statements_qualify_every_table(engine: Engine, query: str) -> None:
    """Wall 3 on the private path: the rewrite names each table in the proxy's schema."""
    text = engine.explain(query, analyst="alice", epsilon=1.0, delta=1e-6).rewritten_sql
    assert text is not None
    tree = sqlglot.parse_one(text, read=engine.dialect)
    ctes = {c.alias for c in tree.find_all(sqlglot.exp.CTE)}
    bases = [t for t in tree.find_all(sqlglot.exp.Table) if t.name not in ctes]
    # (Or the table's ranked copy in the proxy's own schema, which per-query bounding reads.)
    assert bases and all(t.args.get("db") is not None and (
        t.args["db"].name == engine.schema
        or (t.args["db"].name == SCHEMA and "__ranked_" in t.name)) for t in bases), text
