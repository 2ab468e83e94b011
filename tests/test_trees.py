"""``analyses.trees``: a copy that shares type annotations is sqlglot's copy in every other way.

What must hold for the rewriters to use ``copy_tree`` where they used ``Expr.copy``: the copy is
equal to the original and renders the same text in every dialect; every node is a new object
with the original's class, args, comments and metadata, and the same parent, key and position
in the copy as in the original; the copies of the types are the original objects (the one
difference, which sqlglot's own type annotation already makes between a node and its
operand); changing the copy changes nothing of the original.  On analysed trees (qualified and
type-annotated, as the analysis leaves them), on trees as parsed (with their positions), and
on random arithmetic.  ``sql_text`` renders what ``sql()`` renders and leaves its tree as it
was, even where the generator rewrites the tree it renders.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlglot
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlglot import exp
from sqlglot.optimizer.annotate_types import annotate_types
from sqlglot.optimizer.qualify import qualify

from analyses.trees import copy_tree, sql_text

DIALECTS = ("duckdb", "postgres", "spark")
SCHEMA = {"trips": {"fare": "double", "city": "text", "rider_id": "int",
                    "pickup_time": "timestamp", "distance": "decimal(10, 2)"},
          "riders": {"rider_id": "int", "membership": "text"}}
QUERIES = (
    "SELECT COUNT(*) FROM trips",
    "SELECT city, AVG(fare * 2 - 1) AS a, VARIANCE(fare) FROM trips WHERE city = 'LA' "
    "GROUP BY city HAVING COUNT(*) > 3 ORDER BY a DESC",
    "SELECT SUM(CASE WHEN fare > 3 THEN LEAST(GREATEST(fare, 0), 10) ELSE 0 END) / 2 "
    "FROM trips WHERE pickup_time < '2026-02-01' AND distance BETWEEN 1 AND 5",
    "SELECT r.membership, COUNT(*), SUM(t.fare) FROM trips AS t JOIN riders AS r "
    "ON t.rider_id = r.rider_id /* a comment */ GROUP BY r.membership",
    "WITH x AS (SELECT rider_id, fare FROM trips) SELECT EXTRACT(YEAR FROM CURRENT_DATE), "
    "MAX(fare) FROM x WHERE rider_id IN (1, 2, 3)",
)


def analysed(sql: str) -> exp.Expr:
    """``sql`` qualified and type-annotated, its positions dropped (as the analysis leaves
    it)."""
    tree = annotate_types(qualify(sqlglot.parse_one(sql, dialect="duckdb"), schema=SCHEMA,
                                  dialect="duckdb"), schema=SCHEMA)
    for node in tree.walk():
        node._meta = None
    return tree


def pairs(a: exp.Expr, b: exp.Expr) -> Iterator[tuple[exp.Expr, exp.Expr]]:
    """The nodes of two trees of the same shape, side by side (fails on another shape)."""
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        yield x, y
        assert x.args.keys() == y.args.keys()
        for key, value in x.args.items():
            other = y.args[key]
            if isinstance(value, exp.Expr):
                stack.append((value, other))
            elif isinstance(value, list):
                assert isinstance(other, list) and len(other) == len(value)
                stack += [(v, o) for v, o in zip(value, other, strict=True)
                          if isinstance(v, exp.Expr)]
            else:
                assert other == value


def assert_copy(original: exp.Expr, twin: exp.Expr) -> None:
    """``twin`` is ``original``'s copy: as ``Expr.copy`` makes it, but for the shared types."""
    assert twin == original == original.copy()
    for dialect in DIALECTS:
        assert twin.sql(dialect) == original.sql(dialect)
    assert twin.parent is None
    for x, y in pairs(original, twin):
        assert y is not x and type(y) is type(x)
        assert y.type is x.type  # shared, not copied
        assert y.comments == x.comments and (y.comments is None or y.comments is not x.comments)
        assert y._meta == x._meta and (y._meta is None or y._meta is not x._meta)
        if x is not original:
            assert (y.arg_key, y.index) == (x.arg_key, x.index)
            # The copy's parent is the copy of the original's parent.
            assert y.parent is not None and y.parent is not x.parent
            assert y.parent.args[y.arg_key] is y if y.index is None \
                else y.parent.args[y.arg_key][y.index] is y


@pytest.mark.parametrize("sql", QUERIES)
def test_an_analysed_tree_copies_with_its_types_shared(sql: str) -> None:
    tree = analysed(sql)
    assert any(node.type is not None for node in tree.walk())
    assert_copy(tree, copy_tree(tree))


@pytest.mark.parametrize("sql", QUERIES)
def test_a_parsed_tree_copies_with_its_positions(sql: str) -> None:
    tree = sqlglot.parse_one(sql, dialect="duckdb")
    assert any(node._meta for node in tree.walk())
    assert_copy(tree, copy_tree(tree))


def test_a_subtree_copies_as_a_root() -> None:
    tree = analysed(QUERIES[1])
    where = tree.args["where"].this
    twin = copy_tree(where)
    assert twin.parent is None and twin.arg_key is None
    assert_copy(where, twin)


def test_changing_the_copy_leaves_the_original() -> None:
    tree = analysed(QUERIES[1])
    before = tree.sql("duckdb")
    twin = copy_tree(tree)
    twin.find(exp.Column).set("this", exp.to_identifier("changed"))
    twin.args["expressions"].append(exp.Literal.number(1))
    twin.set("where", None)
    twin.find(exp.Literal).replace(exp.Literal.number(99))
    assert tree.sql("duckdb") == before
    assert "changed" in twin.sql("duckdb") and twin != tree


def test_the_copy_hashes_as_the_original() -> None:
    tree = analysed(QUERIES[2])
    hash(tree)  # cached on the original's nodes
    assert hash(copy_tree(tree)) == hash(tree)


# Random arithmetic over columns and literals, typed, as the rewriters' values are.
_leaves = st.one_of(st.sampled_from(["fare", "distance", "rider_id"]),
                    st.integers(-5, 5).map(str), st.sampled_from(["1.5", "NULL"]))
_arith = st.recursive(_leaves, lambda inner: st.one_of(
    st.tuples(inner, st.sampled_from(["+", "-", "*", "/", "%"]), inner).map(
        lambda t: f"({t[0]} {t[1]} {t[2]})"),
    inner.map(lambda e: f"ABS({e})"),
    st.tuples(inner, inner).map(lambda t: f"CASE WHEN {t[0]} > 0 THEN {t[1]} END"),
    st.tuples(inner, inner).map(lambda t: f"COALESCE({t[0]}, {t[1]})"),
), max_leaves=12)


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(_arith)
def test_random_arithmetic_copies_alike(expression: str) -> None:
    tree = analysed(f"SELECT SUM({expression}) AS s FROM trips WHERE {expression} > 0")
    assert_copy(tree, copy_tree(tree))


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("sql", [*QUERIES,
                                 # The generator lifts a nested WITH to the top, in the tree
                                 # it renders: the copy, not this one.
                                 "SELECT * FROM (WITH y AS (SELECT 1 AS a) SELECT a FROM y) AS z"])
def test_sql_text_renders_as_sql_and_leaves_the_tree(sql: str, dialect: str) -> None:
    tree = analysed(sql)
    before = tree.copy()
    assert sql_text(tree, dialect) == tree.sql(dialect)
    assert sql_text(tree, dialect, pretty=True) == tree.sql(dialect, pretty=True)
    assert tree == before and tree.sql(dialect) == before.sql(dialect)
    assert all(x.type is y.type or x.type == y.type for x, y in pairs(tree, before))
