"""Copies of sqlglot trees that share their type annotations.

``Expr.copy`` deep-copies every node's type annotation (``node.type``, a DataType tree of its
own) through ``copy.deepcopy``: on an analysed, type-annotated tree that is most of a copy's
time (a filtered AVG's rewrite, 61 nodes: 220 us per copy, 101 us with the types shared).
:func:`copy_tree` makes the same copy but for the types, which both trees then share.

Sharing is what sqlglot itself does within one tree: its type annotation hands one DataType
object to many nodes (``_set_type(expression, expression.this.type)``: an operand's type to
the expression), so whatever holds for a node and its operand sharing a type holds for a node
and its copy.  The proxy never edits a type in place either: it sets a node's type (the
``type`` setter) to another object.  Everything else is copied as sqlglot copies it: every
node, its args and lists (non-node values shared, as sqlglot shares them), its comments and
its metadata; the cached structural hash is left to be computed again, when asked.
"""

from __future__ import annotations

import copy
import functools
from typing import TypeVar

from sqlglot import exp
from sqlglot.dialects.dialect import Dialect

E = TypeVar("E", bound=exp.Expr)

_SCALARS = frozenset({int, float, str, bool, type(None)})


def copy_tree(root: E) -> E:
    """A copy of ``root`` (parents, keys and positions set as in ``root.copy()``) whose nodes
    share ``root``'s type annotations.

    >>> from sqlglot import parse_one
    >>> tree = parse_one("SELECT a + 1 AS b FROM t WHERE c > 2")
    >>> tree.find(exp.Add).type = "double"
    >>> twin = copy_tree(tree)
    >>> twin == tree, twin.sql() == tree.sql(), twin.find(exp.Add) is tree.find(exp.Add)
    (True, True, False)
    >>> twin.find(exp.Add).type is tree.find(exp.Add).type
    True
    """
    new_root = _node(root)
    stack: list[tuple[exp.Expr, exp.Expr]] = [(root, new_root)]
    push, pop = stack.append, stack.pop
    while stack:
        node, twin = pop()
        args = twin.args
        for key, value in node.args.items():
            if isinstance(value, exp.Expr):
                child = _node(value)
                child.parent, child.arg_key = twin, key
                args[key] = child
                push((value, child))
            elif type(value) is list:
                items = []
                for index, item in enumerate(value):
                    if isinstance(item, exp.Expr):
                        child = _node(item)
                        child.parent, child.arg_key, child.index = twin, key, index
                        push((item, child))
                        items.append(child)
                    else:
                        items.append(item)
                args[key] = items
            else:
                args[key] = value
    return new_root


def _node(node: E) -> E:
    """A childless node of ``node``'s class with its comments, metadata and (the same) type."""
    twin = node.__class__()
    if node.comments is not None:
        twin.comments = list(node.comments)  # strings: a shallow copy is a deep one
    twin._type = node._type
    meta = node._meta
    if meta is not None:
        # The parser's positions are numbers: a dict of scalars is deep-copied by dict().
        twin._meta = dict(meta) if all(type(v) in _SCALARS for v in meta.values()) \
            else copy.deepcopy(meta)
    return twin


def sql_text(node: exp.Expr, dialect: str | None = None, consume: bool = False,
             **opts: object) -> str:
    """``node.sql(dialect, **opts)``: the generator, which may change the tree it renders,
    renders a :func:`copy_tree` copy instead of a deep one (the same text); ``consume``: the
    caller drops ``node`` after, so it is rendered as it is (a copy costs more than the
    rendering: 90 against 37 us for a finish of 70 nodes).

    >>> from sqlglot import parse_one
    >>> sql_text(parse_one("SELECT a FROM t WHERE b > 1"), "duckdb")
    'SELECT a FROM t WHERE b > 1'
    """
    return (node if consume else copy_tree(node)).sql(
        dialect_named(dialect), copy=False, **opts)  # type: ignore[arg-type]


@functools.cache
def dialect_named(name: str | None) -> Dialect:
    """sqlglot's dialect ``name`` (None: its generic one), made once per process.

    ``Expr.sql("duckdb")`` makes a new Dialect on every call (it parses the name for settings,
    then runs the class's ``__init__``): about 2.5 us, paid by every statement, report line
    and check rendered, 15-35 times per never-seen query.  Given an instance, sqlglot uses
    it as it is; a Dialect keeps no state between calls (each rendering makes its own
    Generator).

    >>> dialect_named("duckdb") is dialect_named("duckdb"), type(dialect_named(None)).__name__
    (True, 'Dialect')
    """
    return Dialect.get_or_raise(name)


def select_star(source: exp.Expr) -> exp.Select:
    """``SELECT * FROM source``, placing ``source`` as it is (the caller's fresh tree).

    ``exp.select("*")`` parses its ``*`` and ``Select.join(..., join_type=...)`` its join
    type, each a run of sqlglot's tokenizer and parser: 5% of a never-seen grouped query's
    proxy CPU, where a constructor costs a microsecond.

    >>> select_star(exp.to_table("t")).sql()
    'SELECT * FROM t'
    """
    return exp.Select(expressions=[exp.Star()], from_=exp.From(this=source))


def join_to(select: exp.Select, source: exp.Expr, *, side: str | None = None,
            kind: str | None = None, on: exp.Expr | None = None) -> exp.Select:
    """``select`` with ``[side] [kind] JOIN source [ON on]`` appended, in place (the caller's
    fresh trees, placed without copies or parsing: :func:`select_star`).

    >>> join_to(select_star(exp.to_table("a")), exp.to_table("b"), kind="CROSS").sql()
    'SELECT * FROM a CROSS JOIN b'
    >>> join_to(select_star(exp.to_table("a")), exp.to_table("b"), side="LEFT",
    ...         on=exp.column("x", table="a").eq(exp.column("x", table="b"))).sql()
    'SELECT * FROM a LEFT JOIN b ON a.x = b.x'
    """
    select.append("joins", exp.Join(this=source, side=side, kind=kind, on=on))
    return select
