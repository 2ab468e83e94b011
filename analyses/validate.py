"""Is this statement allowed at all?  Parsing, the node and function allowlists, table lookup.

Everything here runs before any budget is touched, so a refusal costs nothing.  The checks are
allowlists, never denylists: a node type or function sqlglot learns in a later release is refused
until someone decides it is safe.

Row-level expressions (WHERE, GROUP BY keys, aggregate arguments, join ON) are held to a
stricter standard than post-processing expressions (arithmetic on the noisy aggregates): they must
be proven total by ``analyses.totality``, since an error raised by one row would reveal it.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from analyses.aggregate_filters import filters_as_case
from analyses.binding import bind_tables
from analyses.keys import as_extract
from analyses.trees import dialect_named, sql_text
from chorus_py.errors import NotSupportedError, QueryRefused, QuerySyntaxError

# Structural nodes any accepted query may contain.
_STRUCTURE: tuple[type[exp.Expr], ...] = (
    exp.Select, exp.From, exp.Where, exp.Group, exp.Having, exp.Order, exp.Ordered, exp.Limit,
    exp.Offset, exp.With, exp.CTE, exp.TableAlias, exp.Subquery, exp.Table, exp.Identifier,
    exp.Column, exp.Star, exp.Alias, exp.Literal, exp.Boolean, exp.Null, exp.Paren, exp.Neg,
    exp.Not, exp.And, exp.Or, exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Is, exp.In,
    exp.Between, exp.Like, exp.ILike, exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod, exp.Cast,
    exp.DataType, exp.DataTypeParam, exp.Case, exp.If, exp.Interval, exp.Var, exp.Distinct,
    exp.Tuple, exp.DPipe, exp.Concat, exp.Join,
)

# Aggregates the engine can answer with a derived sensitivity (others are refused by name).
AGGREGATES: tuple[type[exp.Expr], ...] = (
    exp.Count, exp.Sum, exp.Avg, exp.Variance, exp.VariancePop, exp.Stddev, exp.StddevPop,
    exp.StddevSamp,
)

# Deterministic functions that cannot fail on any row value, so they are safe on raw rows.
ROW_FUNCTIONS: tuple[type[exp.Expr], ...] = (
    exp.Abs, exp.Round, exp.Floor, exp.Ceil, exp.Least, exp.Greatest, exp.Coalesce, exp.Nullif,
    exp.Lower, exp.Upper, exp.Length, exp.Trim, exp.TimestampTrunc, exp.DateTrunc, exp.Extract,
    exp.CurrentDate, exp.CurrentTimestamp, exp.Sign,
)

# Functions allowed only on noisy aggregates (post-processing): an error there depends on noisy
# values alone, never on a row.
POST_FUNCTIONS: tuple[type[exp.Expr], ...] = (exp.Sqrt, exp.Ln, exp.Log, exp.Exp, exp.Pow)

_ALLOWED = _STRUCTURE + AGGREGATES + ROW_FUNCTIONS + POST_FUNCTIONS

_REFUSED_AGGREGATES = {
    "Min": "MIN", "Max": "MAX", "Median": "MEDIAN", "PercentileCont": "PERCENTILE_CONT",
    "PercentileDisc": "PERCENTILE_DISC", "Quantile": "QUANTILE", "ApproxQuantile": "QUANTILE",
    "ArrayAgg": "ARRAY_AGG", "GroupConcat": "STRING_AGG", "Mode": "MODE",
}

_QUANTILE_AGGREGATES = frozenset({"Min", "Max", "Median", "PercentileCont", "PercentileDisc",
                                  "Quantile", "ApproxQuantile"})

TOO_DEEP = "the query nests too deeply to analyse"


@dataclass(frozen=True)
class ParsedStatement:
    """A single SELECT that passed the allowlists, bound (``analyses.binding``: its CTEs
    renamed apart from every table), and the base tables it reads."""

    tree: exp.Select
    tables: tuple[str, ...]


def parse_statement(sql: str, dialect: str, known_tables: frozenset[str]) -> ParsedStatement:
    """Parse ``sql`` in ``dialect`` and refuse anything but one allowed SELECT.

    >>> parse_statement("SELECT COUNT(*) FROM trips", "duckdb", frozenset({"trips"})).tables
    ('trips',)
    """
    if not sql or not sql.strip():
        raise QuerySyntaxError("the query is empty", hint="send one SELECT statement")
    try:
        sql.encode("utf-8")
    except UnicodeEncodeError:
        raise QuerySyntaxError("the query is not valid Unicode text (a lone surrogate)") from None
    if "\x00" in sql:
        raise QuerySyntaxError("the query contains a NUL character")
    try:
        parsed = sqlglot.parse(sql, dialect=dialect_named(dialect))
        statements = [s for s in parsed if s is not None]
    except (ParseError, TokenError) as err:
        raise QuerySyntaxError(f"syntax error: {_first_line(err)}") from None
    except RecursionError:
        raise QueryRefused(TOO_DEEP, hint="simplify the query") from None
    if len(statements) != 1:
        raise QueryRefused(
            f"the query holds {len(statements)} statements",
            hint="send exactly one SELECT per query",
        )
    tree = statements[0]
    if not isinstance(tree, exp.Select):
        raise QueryRefused(
            f"only SELECT queries are allowed, not {_statement_kind(tree)}",
            hint="the proxy answers aggregate SELECT queries; writes, DDL and COPY are refused",
        )
    tree = as_extract(tree)  # HOUR(ts), DATE_PART('hour', ts): EXTRACT(HOUR FROM ts)
    tree = filters_as_case(tree)  # AGG(x) FILTER (WHERE c): AGG(CASE WHEN c THEN x END)
    for node in tree.walk():
        check_node(node)
        meta = node._meta
        if meta:
            # The parser's positions (line, column) of names and literals serve only its own
            # error messages (raised above): every copy of the tree would copy them per node.
            for position in ("line", "col", "start", "end"):
                meta.pop(position, None)
            if not meta:
                node._meta = None
    # Names are bound by scope, and the binding is written into the tree (CTEs renamed), so
    # every later pass reads the same tables (analyses.binding).
    bound = bind_tables(tree, dialect, known_tables)
    return ParsedStatement(tree=bound.tree, tables=bound.tables)


def check_node(node: exp.Expr) -> None:
    """Refuse one node of a parsed statement unless the allowlists accept it.

    The node only, not its children: callers walk the tree (:func:`parse_statement` every node,
    ``analyses.sampling`` every node but the aggregates only sampled mode accepts).  Raises
    :class:`QueryRefused` or :class:`NotSupportedError` naming the construct and the fix.
    """
    if isinstance(node, _ALLOWED):
        if isinstance(node, exp.Join) and isinstance(node.this, exp.Lateral | exp.Unnest):
            # Other joins are analysed by analyses.joins (inner equijoins only).
            raise NotSupportedError(f"{type(node.this).__name__.upper()} joins are not "
                                    "supported", hint="join tables with ON a.key = b.key")
        if isinstance(node, exp.Table) and not isinstance(node.this, exp.Identifier):
            raise QueryRefused(
                f"table functions are not allowed ({sql_text(node)})",
                hint="query the tables the policy declares",
            )
        if isinstance(node, exp.Select) and node.args.get("into") is not None:
            raise QueryRefused("SELECT INTO writes a table and is refused")
        if isinstance(node, exp.Select) and node.args.get("locks"):
            raise QueryRefused("locking clauses (FOR UPDATE/SHARE) are refused")
        if isinstance(node, exp.Subquery) and isinstance(node.parent, exp.Where | exp.In | exp.EQ):
            raise NotSupportedError(
                "a subquery inside WHERE (IN, =, EXISTS) is not supported",
                hint="write it as a join: FROM a JOIN b ON a.key = b.key WHERE <b's condition>",
            )
        return
    name = type(node).__name__
    if name in _QUANTILE_AGGREGATES:
        # Reached only where the quantile kind (analyses.quantiles) did not take the query.
        raise NotSupportedError(
            f"{_REFUSED_AGGREGATES[name]} is not supported here: plain Laplace noise cannot "
            "protect a statistic with unbounded sensitivity",
            hint="a quantile, MIN or MAX is answered as an outermost aggregate of one table (or "
            "of a join whose rows per person are publicly bounded) by "
            "the exponential mechanism, in the default (analytic) mode"
            + ("" if name in ("Min", "Max") else
               "; percentiles also by sensitivity sampling: SET chorus.sensitivity = "
               "'sampled'"))
    if name in _REFUSED_AGGREGATES:
        raise NotSupportedError(
            f"{_REFUSED_AGGREGATES[name]} is not supported: plain Laplace noise cannot protect "
            "a statistic with unbounded sensitivity",
            hint="use COUNT, SUM, AVG, VARIANCE or STDDEV",
        )
    if isinstance(node, exp.WithinGroup):
        inner = type(node.this).__name__
        if inner in _REFUSED_AGGREGATES:
            check_node(node.this)
    if isinstance(node, exp.Window):
        raise NotSupportedError("window functions are not supported")
    if isinstance(node, exp.Union | exp.Intersect | exp.Except):
        raise NotSupportedError("UNION, INTERSECT and EXCEPT are not supported")
    if isinstance(node, exp.Placeholder | exp.Parameter):
        raise QueryRefused("unbound parameter in the query", hint="bind all parameters")
    if isinstance(node, exp.Func):
        fname = node.sql_name() if not isinstance(node, exp.Anonymous) else node.name.upper()
        raise QueryRefused(
            f"function {fname} is not allowed",
            hint="allowed: COUNT, SUM, AVG, VARIANCE, STDDEV, arithmetic, ABS, ROUND, FLOOR, CEIL, "
            "LEAST, GREATEST, COALESCE, NULLIF, LOWER, UPPER, LENGTH, TRIM, DATE_TRUNC, EXTRACT "
            "(or DATE_PART, YEAR, MONTH, HOUR...), CAST, CASE; SQRT/LN/LOG/EXP/POWER on "
            "aggregates only",
        )
    raise QueryRefused(f"SQL construct {name} is not allowed", hint="see the allowed SQL in README")


def _statement_kind(tree: exp.Expr) -> str:
    key = tree.key.upper()
    return {"COMMAND": "a command", "COPY": "COPY", "SET": "SET"}.get(key, key)


def _first_line(err: Exception) -> str:
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    return text.replace("\x1b[4m", "").replace("\x1b[0m", "")
