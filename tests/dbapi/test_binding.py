"""Parameters become literals in the parsed statement: never SQL text, in both dialects."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
import sqlglot
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlglot import exp

from chorus_py.clients import dbapi
from chorus_py.clients.dbapi import bind_parameters

DIALECTS = ["duckdb", "postgres"]


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize(("value", "sql"), [
    (None, "NULL"), (True, "TRUE"), (7, "7"), (-7, "-7"), (0.25, "0.25"),
    (Decimal("1.50"), "1.50"), ("O'Hare", "'O''Hare'"),
    (dt.date(2026, 1, 2), "CAST('2026-01-02' AS DATE)"),
    (dt.datetime(2026, 1, 2, 3, 4, 5), "CAST('2026-01-02 03:04:05' AS TIMESTAMP)"),
])
def test_literals(dialect: str, value: object, sql: str) -> None:
    bound = bind_parameters("SELECT COUNT(*) FROM t WHERE x = :v", {"v": value}, dialect)
    assert bound == f"SELECT COUNT(*) FROM t WHERE x = {sql}"


@pytest.mark.parametrize("dialect", DIALECTS)
@settings(max_examples=200, deadline=None)
@given(value=st.text())
def test_any_string_stays_one_literal(dialect: str, value: str) -> None:
    """Whatever the text (quotes, comments, semicolons, placeholders), it is one string."""
    if "\x00" in value:
        with pytest.raises(dbapi.DataError):
            bind_parameters("SELECT COUNT(*) FROM t WHERE x = :v", {"v": value}, dialect)
        return
    bound = bind_parameters("SELECT COUNT(*) FROM t WHERE x = :v AND y = ':v'", {"v": value},
                            dialect)
    statements = sqlglot.parse(bound, read=dialect)
    assert len(statements) == 1
    where = statements[0].find(exp.Where)
    literals = [lit for lit in where.find_all(exp.Literal) if lit.is_string]
    assert [lit.this for lit in literals] == [value, ":v"]


def test_no_parameters_leave_the_sql_alone() -> None:
    sql = "SELECT  COUNT(*) FROM t WHERE note = ':x'  -- as written"
    assert bind_parameters(sql, None, "duckdb") == sql
    assert bind_parameters(sql, {}, "duckdb") == sql
    assert bind_parameters(sql, (), "duckdb") == sql


def test_refusals() -> None:
    with pytest.raises(dbapi.ProgrammingError, match=":b"):
        bind_parameters("SELECT COUNT(*) FROM t WHERE a = :a AND b = :b", {"a": 1}, "duckdb")
    with pytest.raises(dbapi.ProgrammingError, match="named"):
        bind_parameters("SELECT COUNT(*) FROM t WHERE a = ?", {"a": 1}, "duckdb")
    with pytest.raises(dbapi.ProgrammingError, match="mapping"):
        bind_parameters("SELECT COUNT(*) FROM t WHERE a = :a", [1], "duckdb")
    with pytest.raises(dbapi.ProgrammingError, match="mapping"):
        bind_parameters("SELECT COUNT(*) FROM t WHERE a = :a", "1", "duckdb")  # type: ignore
    with pytest.raises(dbapi.DataError):
        bind_parameters("SELECT COUNT(*) FROM t WHERE a = :a", {"a": float("inf")}, "duckdb")
    with pytest.raises(dbapi.ProgrammingError, match="type"):
        bind_parameters("SELECT COUNT(*) FROM t WHERE a = :a", {"a": object()}, "duckdb")
    with pytest.raises(dbapi.ProgrammingError):
        bind_parameters("SELECT COUNT(* FROM t WHERE a = :a", {"a": 1}, "duckdb")
