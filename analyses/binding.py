"""Binding: which relation every table name of a query denotes (DESIGN.md section 11, wall 1).

A name in FROM or JOIN is either a CTE *visible at that point* or a base table.  A CTE is visible
in the SELECT that carries its WITH (and everything nested in it), and to the CTEs after it in
the same WITH list; never to earlier siblings, never outside its SELECT.  Names compare under the
backend's own identifier rules (``Dialect.normalize_identifier``): on Postgres an unquoted name
folds to lower case and a quoted one keeps its case, on DuckDB both compare case-insensitively.

Matching a name against "every CTE of the statement" (as an earlier version did) let
``SELECT x.fare FROM trips x, (WITH trips AS (SELECT 1 AS a FROM cities) SELECT a FROM trips) s``
pass as a public-only query.  Here the binding is computed once, by scope, and then *made part of
the tree*: every CTE gets a fresh name (``chorus_cte_N``) and every reference to it is renamed,
so after binding a table name that equals a policy table can only denote that base table, and
every later pass (sqlglot ``qualify``, the rewriter, the generated SQL) sees the same binding.

Independently, sqlglot's own scope analysis (``sqlglot.optimizer.scope``) is run on the same
normalised tree; a disagreement between the two refuses the query (fail closed).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp
from sqlglot.errors import OptimizeError
from sqlglot.optimizer.normalize_identifiers import normalize_identifiers
from sqlglot.optimizer.scope import Scope, traverse_scope

from analyses.trees import copy_tree, dialect_named, sql_text
from chorus_py.errors import QueryRefused, UndefinedTable

CTE_PREFIX = "chorus_cte_"

# Names that mark a system catalog, to give a more helpful message than "unknown table".
_CATALOG_PREFIXES = ("pg_", "information_schema", "duckdb_", "sqlite_", "sys")


@dataclass(frozen=True)
class Bound:
    """A statement after binding: CTEs renamed to fresh names, base tables named as the policy
    names them; ``tables`` are the base tables it reads, in order of first reference."""

    tree: exp.Select
    tables: tuple[str, ...]


def bind_tables(tree: exp.Select, dialect: str, known: frozenset[str]) -> Bound:
    """Resolve every table reference of ``tree`` by scope (``tree`` itself is not changed).

    Raises UndefinedTable for a base table the policy does not declare and QueryRefused for a
    schema-qualified name, a system catalog, WITH RECURSIVE or a statement that reads no table.

    >>> import sqlglot
    >>> q = sqlglot.parse_one("SELECT COUNT(*) FROM trips x, "
    ...     "(WITH trips AS (SELECT 1 AS a FROM cities) SELECT a FROM trips) s")
    >>> bind_tables(q, "duckdb", frozenset({"trips", "cities"})).tables
    ('trips', 'cities')
    """
    dialect_ = dialect_named(dialect)
    normal = normalize_identifiers(copy_tree(tree), dialect=dialect_)
    assert isinstance(normal, exp.Select)
    # Policy names are stored as the database spells them; compare the normalised forms.
    declared = {dialect_.normalize_identifier(exp.to_identifier(name)).name: name
                for name in known}
    resolver = _Resolver(declared)
    resolver.visit(normal, {})
    _cross_check(normal, resolver.targets)
    out = copy_tree(tree)
    originals = list(out.find_all(exp.Table))
    normalised = list(normal.find_all(exp.Table))
    ctes = list(out.find_all(exp.CTE))
    fresh_names = [resolver.fresh.get(id(c)) for c in normal.find_all(exp.CTE)]
    if len(originals) != len(normalised) or len(ctes) != len(fresh_names) \
            or None in fresh_names:
        # Both walks see copies of one tree: never expected, refused rather than guessed.
        raise QueryRefused("the query's table references could not be bound",
                           hint="simplify the query")
    for cte, fresh in zip(ctes, fresh_names, strict=True):
        alias = cte.args["alias"]
        alias.set("this", exp.to_identifier(fresh))
    for table, norm in zip(originals, normalised, strict=True):
        kind, name = resolver.targets[id(norm)]
        original = table.this.copy()
        if kind == "cte":
            table.set("this", exp.to_identifier(name))
        else:
            table.set("this", exp.to_identifier(name, quoted=name != name.lower()))
        if table.args.get("alias") is None:
            # Column qualifiers written with the old name keep resolving to this reference.
            table.set("alias", exp.TableAlias(this=original))
    if not resolver.tables:
        raise QueryRefused("the query reads no table", hint="add FROM <table>")
    return Bound(out, tuple(resolver.tables))


def is_cte_name(name: str) -> bool:
    """Whether ``name`` is one binding gave a CTE (never a base table)."""
    return name.startswith(CTE_PREFIX)


class _Resolver:
    """One walk of the normalised tree with the CTEs visible at each node."""

    def __init__(self, declared: dict[str, str]) -> None:
        self.declared = declared
        self.tables: list[str] = []
        # id(exp.Table) -> ("cte", fresh name) or ("base", policy name)
        self.targets: dict[int, tuple[str, str]] = {}
        self.fresh: dict[int, str] = {}  # id(exp.CTE) -> its fresh name

    def visit(self, node: exp.Expr, env: dict[str, str]) -> None:
        with_ = node.args.get("with_")
        if isinstance(with_, exp.With):
            if with_.args.get("recursive"):
                raise QueryRefused("WITH RECURSIVE is not supported",
                                   hint="use plain (non-recursive) CTEs")
            env = dict(env)
            for cte in with_.expressions:
                # The body sees the enclosing CTEs and the earlier siblings, not itself.
                self.visit(cte.this, env)
                fresh = f"{CTE_PREFIX}{len(self.fresh)}"
                self.fresh[id(cte)] = fresh
                env[cte.alias_or_name] = fresh
        if isinstance(node, exp.Table):
            self._table(node, env)
            return
        for key, value in node.args.items():
            if key == "with_":
                continue
            for child in value if isinstance(value, list) else [value]:
                if isinstance(child, exp.Expr):
                    self.visit(child, env)

    def _table(self, table: exp.Table, env: dict[str, str]) -> None:
        name = table.name
        qualifier = table.args.get("db") or table.args.get("catalog")
        if qualifier is not None or name.lower().startswith(_CATALOG_PREFIXES):
            full = sql_text(table)
            if name.lower().startswith(_CATALOG_PREFIXES) or "catalog" in full.lower() or (
                qualifier is not None and qualifier.name.lower().startswith(_CATALOG_PREFIXES)
            ):
                raise QueryRefused(
                    f"system catalogs are not available ({full})",
                    hint="the proxy exposes only the tables of its policy",
                )
            raise QueryRefused(
                f"schema-qualified table names are not allowed ({full})",
                hint=f"use the bare name '{name}'",
            )
        if not isinstance(table.this, exp.Identifier):
            raise QueryRefused(f"table functions are not allowed ({sql_text(table)})",
                               hint="query the tables the policy declares")
        if name in env:
            self.targets[id(table)] = ("cte", env[name])
            return
        policy_name = self.declared.get(name)
        if policy_name is None or is_cte_name(policy_name):
            raise UndefinedTable(
                f"unknown table '{name}'",
                hint="the policy declares: " + ", ".join(sorted(self.declared.values())),
            )
        self.targets[id(table)] = ("base", policy_name)
        if policy_name not in self.tables:
            self.tables.append(policy_name)


def _cross_check(normal: exp.Select, targets: dict[int, tuple[str, str]]) -> None:
    """sqlglot's scope analysis must classify every table reference as the resolver did."""
    try:
        scopes = traverse_scope(normal)
    except (OptimizeError, RecursionError):
        raise QueryRefused("the query's table references could not be bound",
                           hint="give every table and subquery its own alias") from None
    seen = 0
    for scope in scopes:
        for table in scope.tables:
            source = scope.sources.get(table.alias_or_name)
            sqlglot_cte = isinstance(source, Scope)
            ours = targets.get(id(table))
            if ours is None or (ours[0] == "cte") != sqlglot_cte:
                raise QueryRefused(
                    f"the table reference '{table.name}' is ambiguous",
                    hint="give CTEs names that differ from the tables they read, and every "
                    "table its own alias")
            seen += 1
    if seen != len(targets):
        raise QueryRefused("the query's table references could not be bound",
                           hint="simplify the query")


def generated_sql(tree: exp.Select, tables: tuple[str, ...], dialect: str, schema: str) -> str:
    """The SQL that runs for a bound statement: generated from its tree, never the analyst's
    text, with every base table qualified by the schema the proxy reads (``schema``), so a
    name can denote nothing but what the binding said.  ``tree`` is ``Bound.tree`` and
    ``tables`` its ``Bound.tables``."""
    out = copy_tree(tree)
    for table in out.find_all(exp.Table):
        if is_cte_name(table.name):
            continue
        if table.name not in tables:  # binding named every base table: never expected
            raise QueryRefused(f"the table reference '{table.name}' was not bound")
        table.set("db", exp.to_identifier(schema, quoted=True))
    return out.sql(dialect_named(dialect))
