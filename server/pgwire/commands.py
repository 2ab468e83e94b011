"""What a statement is, before anything runs: split a query string, recognise session commands.

The server answers some statements itself (``SET``, ``SHOW``, ``BEGIN``..., catalog queries)
and hands every other one to the engine.  This module decides which, from the text alone:

- :func:`split_statements` cuts a simple-protocol query string at its top-level semicolons
  (quotes, dollar quotes and comments respected);
- :func:`classify` recognises the session commands with a small hand-written parser (they are
  few and sqlglot does not know most of them), and everything else is a query;
- :func:`route` decides whether a query is a catalog query (only ``pg_catalog`` /
  ``information_schema`` relations, or no relation at all) or one for the engine (anything that
  names a policy table, or any other table: the engine refuses what it must).
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass, field
from typing import Literal

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from server.pgwire.catalog import CATALOG_TABLES

Kind = Literal["empty", "query", "explain", "set", "reset", "show", "begin", "commit",
               "rollback", "savepoint", "release", "rollback_to", "discard", "deallocate",
               "noop", "refuse"]


@dataclass(frozen=True)
class Statement:
    """One classified statement."""

    kind: Kind
    sql: str
    name: str = ""  # setting name (SET/SHOW/RESET) or savepoint / discard / deallocate target
    values: tuple[str, ...] = ()  # SET values (strings, unquoted)
    tag: str = ""  # CommandComplete tag for commands answered locally
    explain_format: str = "text"
    reason: str = field(default="", compare=False)  # why a command is refused


def split_statements(sql: str) -> list[str]:
    """Top-level statements of a query string, stripped; comment-only pieces are dropped."""
    out: list[str] = []
    start, i, n = 0, 0, len(sql)
    while i < n:
        c = sql[i]
        if c in ("'", '"'):
            escape = c == "'" and i > 0 and sql[i - 1] in "eE" and (
                i < 2 or not (sql[i - 2].isalnum() or sql[i - 2] == "_"))
            i += 1
            while i < n:
                if escape and sql[i] == "\\":
                    i += 2
                    continue
                if sql[i] == c:
                    if i + 1 < n and sql[i + 1] == c:
                        i += 2
                        continue
                    break
                i += 1
            i += 1
        elif c == "-" and sql.startswith("--", i):
            end = sql.find("\n", i)
            i = n if end < 0 else end + 1
        elif c == "/" and sql.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if sql.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif sql.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c == "$":
            match = re.match(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$", sql[i:])
            if match and not (i > 0 and (sql[i - 1].isalnum() or sql[i - 1] == "_")):
                tag = match.group(0)
                end = sql.find(tag, i + len(tag))
                i = n if end < 0 else end + len(tag)
            else:
                i += 1
        elif c == ";":
            out.append(sql[start:i])
            start = i = i + 1
        else:
            i += 1
    out.append(sql[start:])
    return [s.strip() for s in out if strip_comments(s)]


def strip_comments(sql: str) -> str:
    """The statement without leading/trailing comments, whitespace and semicolons."""
    s = sql.strip()
    while True:
        if s.startswith("--"):
            end = s.find("\n")
            s = "" if end < 0 else s[end + 1:].strip()
        elif s.startswith("/*"):
            end = s.find("*/")
            s = "" if end < 0 else s[end + 2:].strip()
        else:
            break
    return s.rstrip("; \t\r\n")


_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")
_VALUE = re.compile(
    r"""\s*('(?:[^']|'')*'|E'(?:[^'\\]|\\.|'')*'|"(?:[^"]|"")*"|"""
    r"""[-+]?[0-9.]+(?:e[-+]?\d+)?|[A-Za-z_][A-Za-z0-9_$.]*)\s*""", re.IGNORECASE)


def _unquote(token: str) -> str:
    if token.startswith("'"):
        return token[1:-1].replace("''", "'")
    if token[:2].upper() == "E'":
        return re.sub(r"\\(.)", r"\1", token[2:-1].replace("''", "'"))
    if token.startswith('"'):
        return token[1:-1].replace('""', '"')
    return token


def _values(rest: str) -> tuple[str, ...] | None:
    values, pos = [], 0
    while pos < len(rest):
        match = _VALUE.match(rest, pos)
        if not match:
            return None
        values.append(_unquote(match.group(1)))
        pos = match.end()
        if pos < len(rest):
            if rest[pos] != ",":
                return None
            pos += 1
    return tuple(values) if values else None


_SETTING = r"([A-Za-z_][A-Za-z0-9_$]*(?:\.[A-Za-z_][A-Za-z0-9_$]*)?|\"[^\"]+\")"
_SET_RE = re.compile(r"^SET\s+(?:(SESSION|LOCAL)\s+)?" + _SETTING + r"(?:\s*=\s*|\s+TO\s+)(.*)$",
                     re.IGNORECASE | re.DOTALL)
_SET_TZ_RE = re.compile(r"^SET\s+(?:(?:SESSION|LOCAL)\s+)?TIME\s+ZONE\s+(.*)$",
                        re.IGNORECASE | re.DOTALL)


@functools.lru_cache(maxsize=4096)
def classify(sql: str) -> Statement:
    """Classify one statement (already split)."""
    s = strip_comments(sql)
    if not s:
        return Statement("empty", sql)
    first = _WORD.match(s)
    word = first.group(0).upper() if first else ""
    words = s.split()
    upper = [w.upper() for w in words]
    if word == "SET":
        return _classify_set(s)
    if word == "RESET":
        name = s[5:].strip()
        if name.upper() == "ALL":
            return Statement("reset", sql, "all", tag="RESET")
        if not re.fullmatch(_SETTING, name):
            return Statement("refuse", sql, reason="syntax error in RESET")
        return Statement("reset", sql, name.strip('"').lower(), tag="RESET")
    if word == "SHOW":
        name = " ".join(upper[1:]).lower()
        aliases = {"transaction isolation level": "transaction_isolation",
                   "time zone": "timezone", "session authorization": "session_authorization"}
        name = aliases.get(name, name.strip('"'))
        if not re.fullmatch(r"[a-z_][a-z0-9_$]*(\.[a-z_][a-z0-9_$]*)?", name):
            return Statement("refuse", sql, reason="syntax error in SHOW")
        return Statement("show", sql, name, tag="SHOW")
    if word in ("BEGIN", "START"):
        if word == "START" and (len(upper) < 2 or upper[1] != "TRANSACTION"):
            return Statement("query", sql)
        return Statement("begin", sql, tag="BEGIN")
    if word in ("COMMIT", "END"):
        if len(upper) > 1 and upper[1] == "PREPARED":
            return Statement("refuse", sql, reason="two-phase commit is not supported")
        return Statement("commit", sql, tag="COMMIT")
    if word in ("ROLLBACK", "ABORT"):
        if len(upper) > 1 and upper[1] == "PREPARED":
            return Statement("refuse", sql, reason="two-phase commit is not supported")
        if len(upper) > 1 and upper[1] == "TO":
            return Statement("rollback_to", sql, words[-1], tag="ROLLBACK")
        return Statement("rollback", sql, tag="ROLLBACK")
    if word == "SAVEPOINT":
        return Statement("savepoint", sql, words[-1] if len(words) > 1 else "",
                         tag="SAVEPOINT")
    if word == "RELEASE":
        return Statement("release", sql, words[-1] if len(words) > 1 else "", tag="RELEASE")
    if word == "PREPARE" and len(upper) > 1 and upper[1] == "TRANSACTION":
        return Statement("refuse", sql, reason="two-phase commit is not supported")
    if word == "DISCARD":
        target = upper[1] if len(upper) > 1 else ""
        return Statement("discard", sql, target.lower(), tag=f"DISCARD {target}".strip())
    if word == "DEALLOCATE":
        rest = [w for w in words[1:] if w.upper() != "PREPARE"]
        target = rest[0] if rest else ""
        return Statement("deallocate", sql, target.strip('"'),
                         tag="DEALLOCATE ALL" if target.upper() == "ALL" else "DEALLOCATE")
    if word == "UNLISTEN":
        return Statement("noop", sql, tag="UNLISTEN")
    if word == "CLOSE" and len(upper) > 1 and upper[1] == "ALL":
        return Statement("noop", sql, tag="CLOSE CURSOR ALL")
    if word in ("LISTEN", "NOTIFY"):
        return Statement("refuse", sql, reason=f"{word} is not supported by the proxy")
    if word == "EXPLAIN":
        return _classify_explain(s, sql)
    return Statement("query", sql)


def _classify_set(s: str) -> Statement:
    tz = _SET_TZ_RE.match(s)
    if tz:
        values = _values(tz.group(1).strip())
        if values is None:
            return Statement("refuse", s, reason="syntax error in SET TIME ZONE")
        return Statement("set", s, "timezone", values, tag="SET")
    upper = s.upper().split()
    if (len(upper) > 1 and upper[1] in ("TRANSACTION", "CONSTRAINTS")) or (
            len(upper) > 2 and upper[1] == "SESSION" and upper[2] == "CHARACTERISTICS"):
        return Statement("noop", s, tag="SET")
    if (len(upper) > 1 and upper[1] in ("ROLE", "AUTHORIZATION")) or (
            len(upper) > 2 and upper[2] in ("ROLE", "AUTHORIZATION")):
        return Statement("refuse", s, reason="changing the role is not allowed: one "
                         "connection is one analyst")
    match = _SET_RE.match(s)
    if not match:
        return Statement("refuse", s, reason="syntax error in SET: expected SET name = value")
    name = match.group(2).strip('"').lower()
    rest = match.group(3).strip()
    if rest.upper() == "DEFAULT":
        return Statement("reset", s, name, tag="SET")
    values = _values(rest)
    if values is None:
        return Statement("refuse", s, reason=f"syntax error in SET {name}")
    return Statement("set", s, name, values, tag="SET")


_EXPLAIN_RE = re.compile(r"^EXPLAIN\s+(\((?P<opts>[^)]*)\)\s*)?(?P<flags>((ANALYZE|ANALYSE|VERBOSE)"
                         r"\s+)*)(?P<body>.*)$", re.IGNORECASE | re.DOTALL)


def _classify_explain(s: str, sql: str) -> Statement:
    match = _EXPLAIN_RE.match(s)
    if not match or not match.group("body").strip():
        return Statement("refuse", sql, reason="syntax error in EXPLAIN")
    options = (match.group("opts") or "").lower()
    flags = (match.group("flags") or "").lower()
    if "analy" in flags or re.search(r"\banaly[sz]e\b(?!\s+(false|off|0))", options):
        return Statement("refuse", sql, reason="EXPLAIN ANALYZE would run the query; EXPLAIN "
                         "shows what it would cost without running it")
    fmt = "json" if re.search(r"\bformat\s+json\b", options) else "text"
    return Statement("explain", match.group("body").strip(), explain_format=fmt,
                     tag="EXPLAIN")


# -- routing ------------------------------------------------------------------------------------

_log = logging.getLogger("chorus.pgwire")


@dataclass(frozen=True)
class Route:
    """Where a query goes, with its parse tree (Postgres dialect) when it parsed."""

    target: Literal["catalog", "engine"]
    tree: exp.Expr | None


def parse_postgres(sql: str) -> exp.Expr | None:
    """Parse one statement as Postgres; None when sqlglot cannot."""
    try:
        trees = sqlglot.parse(sql, read="postgres")
    except (ParseError, TokenError, RecursionError, ValueError):
        return None
    if len(trees) != 1 or trees[0] is None:
        return None
    return trees[0]


@functools.lru_cache(maxsize=4096)
def route(sql: str, policy_tables: frozenset[str]) -> Route:
    """Catalog or engine? (see the module docstring).  Callers must not change the tree."""
    tree = parse_postgres(sql)
    if tree is None or not isinstance(tree, exp.Query):
        return Route("engine", tree)
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    catalog_only = True
    for table in tree.find_all(exp.Table):
        name, db = table.name.lower(), table.db.lower()
        if isinstance(table.this, exp.Func) or not name:
            continue  # a table function: the catalog's evaluator decides
        if not db and name in ctes:
            continue
        if db in ("", "public") and name in policy_tables:
            return Route("engine", tree)
        if db == "pg_catalog" or db == "information_schema" or (
                not db and (name in CATALOG_TABLES or name == "pg_database")):
            continue
        catalog_only = False
    return Route("catalog" if catalog_only else "engine", tree)
