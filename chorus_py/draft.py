"""``chorus init``: draft a policy from a live database's schema and data, for the owner to edit.

Everything here is a *guess* the data owner must confirm; the draft says so next to each one
(``TODO`` comments) and says why it guessed.  The heuristics:

- **Privacy unit** (who is protected): an identifier column (``*_id``, ``id``, or a name such as
  ``user``, ``patient``) that *repeats* (fewer distinct values than rows: a person with several
  rows; a column unique per row is a row key, not a person), preferring names of people
  (``user``, ``customer``, ``patient``...) and columns that appear in several tables (the same
  person across tables).  The highest score wins; ties go to the earlier column.
- **Rows per unit**: the 99th percentile of rows per unit, rounded up; with ``contribution =
  "auto"`` each query chooses its own cap below it privately.
- **Block column**: the first date or timestamp column, preferring names of when something
  happened (``*_at``, ``*time*``, ``*date*``); daily blocks (calendar months beyond two years
  of data), starting on the grid boundary at or before the earliest value.
- **Public tables**: small tables (at most :data:`PUBLIC_MAX_ROWS` rows) with no unit column and
  no column or table name like a person's: lookup tables (cities, products).  Public means every
  row is readable exactly, with no noise, so a table that might be about people stays private.
- **Bounds** of numeric columns: from the 1st and 99th percentiles, rounded outwards to two
  significant digits.  Read from the data, they are a privacy decision the owner must make:
  analysts see them, and a bound taken from the data tells a little about it.

The owner-only numbers it reads (counts, quantiles, the values of categorical columns) go into
the draft and on the terminal, never to analysts.  The draft is validated with the policy
loader and against the database before it is written.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import secrets
import tomllib
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

from chorus_py.backends import Backend
from chorus_py.policy import parse_policy

#: Tables with at most this many rows and no unit column are drafted public.
PUBLIC_MAX_ROWS = 1000
#: Text columns with at most this many distinct values are offered as public_values.
CATEGORY_MAX = 20

_TYPES = {"integer": "int", "float": "float", "text": "text", "boolean": "bool",
          "date": "date", "timestamp": "timestamp"}
_PEOPLE = re.compile(r"(user|person|people|patient|customer|client|member|rider|driver|"
                     r"employee|student|account|subscriber|visitor|citizen|author|owner|"
                     r"buyer|seller|voter|respondent|participant|household|staff|doctor|"
                     r"nurse|^(first_|last_|full_)?name$|email|phone|birth|address|ssn)")
_ID = re.compile(r"(^id$|_id$|^uid$|_uid$|_key$)")
_WHEN = re.compile(r"(_at$|time|date|^ts$|_ts$|day|created|when)")
_EPOCH = datetime(1970, 1, 1)


@dataclass
class ColumnStats:
    """What the draft knows of one column (owner-only numbers)."""

    type: str
    distinct: int = 0
    low: float | None = None  # 1st percentile (numbers)
    high: float | None = None  # 99th percentile (numbers)
    first: datetime | None = None  # earliest value (dates, timestamps)
    last: datetime | None = None
    values: list[Any] = field(default_factory=list)  # categories, most frequent first


@dataclass
class TableStats:
    """Rows and column statistics of one table."""

    rows: int
    columns: dict[str, ColumnStats]
    skipped: dict[str, str]  # column -> why it is left out


@dataclass(frozen=True)
class Draft:
    """The drafted policy text, its analyst's token (shown once) and what to tell the owner."""

    text: str
    token: str
    analyst: str
    messages: list[str]


def _quantiles(dialect: str, col: str) -> str:
    if dialect == "duckdb":
        return f"quantile_cont({col}, 0.01), quantile_cont({col}, 0.99)"
    return (f"percentile_cont(0.01) WITHIN GROUP (ORDER BY {col}), "
            f"percentile_cont(0.99) WITHIN GROUP (ORDER BY {col})")


def read_stats(backend: Backend, dialect: str) -> dict[str, TableStats]:
    """Every table of the backend's schema, with its rows and column statistics."""
    out: dict[str, TableStats] = {}
    double = "DOUBLE" if dialect == "spark" else "DOUBLE PRECISION"  # Spark has no PRECISION
    for table, columns in sorted(backend.table_columns().items()):
        if table != table.lower():  # the policy names tables in lower case
            continue
        kept: dict[str, ColumnStats] = {}
        skipped: dict[str, str] = {}
        for name, portable in columns.items():
            if name != name.lower():
                skipped[name] = "not a lower-case name"
            elif portable not in _TYPES:
                skipped[name] = f"type {portable} is not one the proxy declares"
            else:
                kept[name] = ColumnStats(_TYPES[portable])
        parts = ["COUNT(*)"]
        for name, cs in kept.items():
            col = f'"{name}"'
            parts.append(f"COUNT(DISTINCT {col})")
            if cs.type in ("int", "float"):
                parts.append(_quantiles(dialect, f"CAST({col} AS {double})"))
            elif cs.type in ("date", "timestamp"):
                parts.append(f"MIN({col}), MAX({col})")
        row = list(backend.run(f'SELECT {", ".join(parts)} FROM "{table}"').rows[0])
        stats = TableStats(int(row.pop(0)), kept, skipped)
        for name, cs in kept.items():
            cs.distinct = int(row.pop(0))
            if cs.type in ("int", "float"):
                cs.low, cs.high = (None if v is None else float(v) for v in (row.pop(0),
                                                                              row.pop(0)))
            elif cs.type in ("date", "timestamp"):
                cs.first, cs.last = (_as_datetime(row.pop(0)), _as_datetime(row.pop(0)))
            if cs.type == "text" and 0 < cs.distinct <= CATEGORY_MAX \
                    and stats.rows >= 5 * cs.distinct:
                cs.values = [v for v, _ in backend.run(
                    f'SELECT "{name}", COUNT(*) FROM "{table}" WHERE "{name}" IS NOT NULL '
                    f'GROUP BY 1 ORDER BY 2 DESC, 1').rows]
        out[table] = stats
    return out


def _as_datetime(value: Any) -> datetime | None:
    if isinstance(value, datetime):  # naive UTC, the block schedule's convention
        return value.astimezone(UTC).replace(tzinfo=None) if value.tzinfo else value
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day)
    return None


def guess_unit(stats: dict[str, TableStats]) -> tuple[str | None, str]:
    """The privacy unit column name (shared by the tables that have it), and why."""
    appears: dict[str, int] = {}
    for ts in stats.values():
        for name in ts.columns:
            appears[name] = appears.get(name, 0) + 1
    best: tuple[int, str] | None = None
    for ts in stats.values():
        for name, cs in ts.columns.items():
            if cs.type not in ("int", "text") or not (_ID.search(name) or _PEOPLE.search(name)):
                continue
            repeats = 0 < cs.distinct < ts.rows
            score = 4 * bool(_PEOPLE.search(name)) + 2 * repeats + (appears[name] > 1)
            if repeats and (best is None or score > best[0]):
                best = (score, name)
    if best is None:
        return None, ("no identifier column repeats across rows, so no table looks like "
                      "several rows per person")
    name = best[1]
    reasons = ["an identifier that repeats (several rows per value)"]
    if _PEOPLE.search(name):
        reasons.append("named like a person")
    if appears[name] > 1:
        reasons.append(f"in {appears[name]} tables")
    return name, ", ".join(reasons)


def _rows_per_unit(backend: Backend, dialect: str, table: str, unit: str) -> int:
    inner = f'SELECT COUNT(*) AS n FROM "{table}" WHERE "{unit}" IS NOT NULL GROUP BY "{unit}"'
    q = "quantile_cont(n, 0.99)" if dialect == "duckdb" else \
        "percentile_cont(0.99) WITHIN GROUP (ORDER BY n)"
    value = backend.run(f"SELECT {q} FROM ({inner}) AS per_unit").rows[0][0]
    return max(1, _nice_up(float(value or 1)))


def _nice_up(x: float) -> int:
    """Rounded up to two significant digits (37 -> 37, 1234 -> 1300)."""
    if x <= 10:
        return math.ceil(x)
    step = 10 ** (math.floor(math.log10(x)) - 1)
    return int(math.ceil(x / step) * step)


def _nice_bound(x: float, up: bool) -> float:
    """Rounded outwards to two significant digits; 0 stays 0."""
    if x == 0:
        return 0.0
    step = 10 ** (math.floor(math.log10(abs(x))) - 1)
    rounded = (math.ceil if up else math.floor)(x / step) * step
    return float(f"{rounded:.12g}")


def _block(cs: ColumnStats) -> tuple[str, datetime] | None:
    if cs.first is None or cs.last is None:
        return None
    if cs.last - cs.first <= timedelta(days=730):
        day = timedelta(days=1)
        return "1 day", cs.first - (cs.first - _EPOCH) % day  # on the grid, as required
    # Longer histories: calendar months, starting on the first of the earliest one.
    return "1 month", datetime(cs.first.year, cs.first.month, 1)


def _key(name: str) -> str:
    """A TOML key: bare when it can be, quoted otherwise."""
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else _literal(name)


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return f"{value:g}" if isinstance(value, float) else str(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def draft_policy(url: str, backend: Backend, dialect: str, policy_dir: Path,
                 analyst: str = "analyst", warehouse: Path | None = None) -> Draft:
    """Draft a policy for the database at ``url`` (already opened as ``backend``); on a local
    Spark, ``warehouse`` is the directory of ``<table>.parquet`` entries it reads."""
    stats = read_stats(backend, dialect)
    unit, why_unit = guess_unit(stats)
    messages: list[str] = []
    token = secrets.token_urlsafe(32)
    digest = hashlib.sha256(token.encode()).hexdigest()
    lines = [
        "# Drafted by `chorus init`: every value below is a guess to confirm.  Lines marked TODO",
        "# need a decision of the data owner.  Then: `chorus check --policy <this file>`.",
        "",
        "[backend]",
    ]
    if warehouse is None:
        lines += [
            "# TODO: connect as a role that can only SELECT the declared tables",
            "# (docs/owner-guide.md, 'Least privilege'); `chorus check` tells what this one "
            "can do.",
            f"url = {_literal(_policy_url(url, policy_dir))}",
        ]
    else:
        lines += [
            "# A local Spark over Parquet files (docs/owner-guide.md, 'When one machine is not",
            "# enough'): its session reads the tables declared below, nothing else.",
            f"url = {_literal(url)}",
            "",
            "[backend.spark]",
            "# Every <name>.parquet in this directory is the table <name> (relative to this "
            "file).",
            f"warehouse = {_literal(os.path.relpath(warehouse.resolve(), policy_dir.resolve()))}",
        ]
    lines += [
        "",
        "[privacy]",
        "# TODO: the total privacy loss each block of data may suffer, over every query of every",
        "# analyst; raising it later needs `chorus budget reconcile` for existing blocks.",
        "epsilon_per_block = 1.0",
        "max_epsilon_per_query = 0.5",
        "default_epsilon = 0.1",
        "# A small delta lets GROUP BY release keys without public_values (a noisy threshold).",
        "delta_per_block = 1e-5",
        "default_delta = 1e-8",
        "",
    ]
    if unit is None:
        messages.append(f"no privacy unit guessed ({why_unit}): private tables are drafted "
                        "event-level (one row = one person); name the unit column if rows "
                        "belong to people")
    else:
        messages.append(f"privacy unit: '{unit}' ({why_unit})")
    for table, ts in stats.items():
        lines += _table_lines(backend, dialect, table, ts, unit, why_unit, messages)
    for table in sorted(set(backend.table_columns()) - set(stats)):
        messages.append(f"{table}: left out (the policy names tables in lower case: rename it "
                        "or make a lower-case view)")
    lines += [
        f"[analysts.{analyst}]",
        "# The SHA-256 of a REST token printed once by `chorus init`; add a password for the",
        "# wire protocol with `chorus passwd`, rotate tokens with `chorus token add|revoke`.",
        "# TODO: max_epsilon_per_block = ... (this analyst's share of each block's budget).",
        f'token_sha256 = "{digest}"',
        "",
    ]
    text = "\n".join(lines)
    policy = parse_policy(tomllib.loads(text), "<draft>")
    policy.check_against(backend.table_columns())
    return Draft(text, token, analyst, messages)


def _policy_url(url: str, policy_dir: Path) -> str:
    """DuckDB files relative to the policy's directory (the loader's convention), so the policy
    travels with its data; other URLs as given."""
    if url.startswith("duckdb:///") and not url.startswith("duckdb:///:memory:"):
        path = Path(url.removeprefix("duckdb:///")).resolve()
        return "duckdb:///" + os.path.relpath(path, policy_dir.resolve())
    return url


def _table_lines(backend: Backend, dialect: str, table: str, ts: TableStats, unit: str | None,
                 why_unit: str, messages: list[str]) -> list[str]:
    has_unit = unit is not None and unit in ts.columns
    people = [c for c in ts.columns if _PEOPLE.search(c)]
    if not has_unit and not people and not _PEOPLE.search(table) \
            and ts.rows <= PUBLIC_MAX_ROWS:
        messages.append(f"{table}: public ({ts.rows} rows, no '{unit or 'unit'}' column)")
        return [f"[tables.{_key(table)}]",
                f"# {ts.rows} rows and no privacy unit column: drafted as a public lookup "
                "table (small tables",
                "# without a person column usually describe things: cities, products).  "
                "Public means",
                "# analysts read every row exactly, with no noise and no budget.  TODO: "
                "confirm it holds",
                "# nothing about people, or make it private (remove this line).",
                "public = true", ""]
    if not ts.columns:
        messages.append(f"{table}: left out (no column of a type the proxy declares)")
        return [f"# {table}: left out, no column of a type the proxy declares "
                f"({', '.join(ts.skipped)})", ""]
    out = [f"[tables.{_key(table)}]", f"# {ts.rows:,} rows."]
    if has_unit:
        assert unit is not None
        k = _rows_per_unit(backend, dialect, table, unit)
        out += [f"# privacy_unit guessed: {why_unit}.  TODO: confirm it names one person.",
                f'privacy_unit = "{unit}"',
                f"# 99% of the {unit} values have at most {k} rows here (rounded up): the most "
                "one person",
                "# may contribute; each query chooses its own cap below it, privately.",
                f"max_rows_per_unit = {k}"]
    else:
        out += ["# TODO: no privacy unit column found: each row is protected as one event.  If "
                "rows belong to",
                "# people, set privacy_unit = \"<column>\" and max_rows_per_unit."]
        if people:
            chosen = f"not the unit '{unit}'" if unit else "no unit was guessed"
            out.append(f"# ({', '.join(people)}: named like a person, {chosen}; a table "
                       "about people is drafted private, never public.)")
    # When something happened, not a person's attribute (a birth date is no event time).
    when = sorted((name for name, cs in ts.columns.items() if cs.type in ("date", "timestamp")
                   and not _PEOPLE.search(name)), key=lambda n: not _WHEN.search(n))
    block = _block(ts.columns[when[0]]) if when else None
    if block is not None:
        size, start = block
        shown = start.date().isoformat() if start == datetime(start.year, start.month,
                                                              start.day) else start.isoformat()
        out += [f"# Blocks: each {size} of '{when[0]}' has its own budget, from the earliest "
                "value (on the",
                "# block grid).  TODO: confirm the column and the start; add end = \"...\" "
                "for data that stops.",
                f'block = {{ column = "{when[0]}", size = "{size}", start = "{shown}" }}']
    out += ["", f"[tables.{_key(table)}.columns]"]
    for name, cs in ts.columns.items():
        out += _column_lines(table, name, cs, name == unit, messages)
    for name, why in ts.skipped.items():
        out.append(f"# {name}: left out ({why})")
    out.append("")
    return out


def _column_lines(table: str, name: str, cs: ColumnStats, is_unit: bool,
                  messages: list[str]) -> list[str]:
    entry = f"type = {_literal(cs.type)}"
    notes: list[str] = []
    if cs.type in ("int", "float") and not is_unit and not _ID.search(name) \
            and cs.low is not None and cs.high is not None:
        lower, upper = _nice_bound(cs.low, up=False), _nice_bound(cs.high, up=True)
        if cs.low >= 0:
            lower = 0.0
        if upper <= lower:
            upper = lower + 1
        entry += f", lower = {lower:g}, upper = {upper:g}"
        notes.append(f"# TODO bounds: from the data's 1st and 99th percentiles ({cs.low:.4g}, "
                     f"{cs.high:.4g}), rounded out. A privacy decision: analysts see them, "
                     "prefer domain knowledge.")
        messages.append(f"WARNING {table}.{name}: suggested bounds [{lower:g}, {upper:g}] come "
                        "from the data's 1st/99th percentiles; bounds are a privacy decision "
                        "(analysts see them): replace them with values you would publish")
    elif cs.type in ("int", "float") and not is_unit:
        notes.append("# an identifier: no bounds (summing it means nothing)")
    if cs.values:
        shown = ", ".join(_literal(v) for v in cs.values)
        notes.append(f"# TODO: the {len(cs.values)} values in the data; uncomment to release "
                     "them as groups without a threshold, only if the list itself is public:")
        notes.append(f"# {_key(name)} = {{ {entry}, public_values = [{shown}] }}")
    return [*notes, f"{_key(name)} = {{ {entry} }}"]
