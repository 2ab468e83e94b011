"""Group keys that are public without being listed: which GROUP BY expressions have a key set
known before any private row is read, and that set.

A GROUP BY over private rows may release its keys without a noisy threshold only when the set
of released keys is fixed by public information (the policy, public tables, the clock): every
key of that set comes back, with a noisy 0 where no private row falls (``rewriters.groups``
LEFT JOINs the exact groups onto the grid of keys), and no other key does.  Besides the values
a column declares (``public_values``), two kinds of keys are public:

- **Calendar buckets of a block column** (:class:`CalendarKeys`): ``DATE_TRUNC(unit, c)``,
  ``EXTRACT(field FROM c)`` (``date_part`` in Postgres) and ``CAST(c AS DATE)``, c the policy's
  block column of a time-cut table.  The query reads only rows of the blocks it was charged for
  (``rewriters.blocks``), windows of the policy's public schedule cut by the query's literal
  filters: every row's bucket is a bucket of those windows, which :func:`calendar_values`
  enumerates in the proxy.  So a time series needs no threshold.  Grids beyond
  :data:`MAX_KEYS` keys are refused, naming the fix.
- **Columns of a public table** (:class:`TableKeys`): a key whose columns all belong to one
  public table of a join.  Every row of the (inner) join carries a row of that table, so its
  key is one of the table's distinct values, which are public data: the grid is ``SELECT
  DISTINCT <key> FROM <public table> WHERE <the query's conditions on that table alone>``, run
  by the database with the query.  What the join does to the sensitivity (a join on a column
  that is not unique in the public table repeats each private row once per match) is the
  join's stability, derived by ``analyses.joins``: each repeated row lands in one group, so the
  L1 change over all groups stays within S(k).
- **Keys spelled out by the query** (:func:`literal_values`): a CASE whose every result is a
  literal (``CASE WHEN fare > 50 THEN 'high' ELSE 'low' END``) takes only those values, and a
  condition (``fare > 50``) only TRUE and FALSE: the set comes from the query's text, so it is
  listed like declared values (a NULL result, e.g. a CASE without ELSE, is not a listed key:
  its rows are left out, as a column's values outside its ``public_values`` are).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Literal

from sqlglot import exp

from analyses.trees import copy_tree
from chorus_py.blockgrid import is_time_size
from chorus_py.errors import QueryRefused
from chorus_py.policy import TablePolicy

#: The most keys a grid of calendar buckets may have (the product over all group keys).
MAX_KEYS = 10_000

# DATE_TRUNC units: the bucket's start (a timestamp).  EXTRACT fields: an integer with the
# size of its cycle (None: not cyclic) and the step at which the field is constant.
TRUNC_UNITS = ("year", "quarter", "month", "week", "day", "hour")
FIELDS: dict[str, tuple[int | None, str]] = {
    "year": (None, "month"), "isoyear": (None, "day"), "quarter": (4, "month"),
    "month": (12, "month"), "week": (53, "day"), "day": (31, "day"), "doy": (366, "day"),
    "dow": (7, "day"), "isodow": (7, "day"), "hour": (24, "hour"),
}
# sqlglot's spellings of the same fields.
_ALIASES = {"dayofweek": "dow", "dayofyear": "doy", "dayofweekiso": "isodow",
            "weekofyear": "week", "yearofweek": "isoyear", "yearofweekiso": "isoyear"}


# Other spellings of EXTRACT (DuckDB's YEAR(ts), HOUR(ts), DAYOFWEEK(ts)...; DATE_PART('hour',
# ts)), with the field each extracts: ``as_extract`` writes them as EXTRACT, which the
# validator, the totality analysis and the key analysis know.  Each has DuckDB's meaning, which
# is EXTRACT's there (DAYOFWEEK counts from Sunday = 0, WEEK is the ISO week).
_SPELLINGS: dict[type[exp.Expr], str] = {
    exp.Year: "year", exp.Quarter: "quarter", exp.Month: "month", exp.Day: "day",
    exp.DayOfMonth: "day", exp.Hour: "hour", exp.Minute: "minute", exp.Second: "second",
    exp.DayOfWeek: "dow", exp.DayOfWeekIso: "isodow", exp.DayOfYear: "doy", exp.Week: "week",
    exp.WeekOfYear: "week",
}
_PART_FIELDS = frozenset({*FIELDS, "minute", "second"})


def as_extract(tree: exp.Expr) -> exp.Expr:
    """``tree`` with the other spellings of EXTRACT written as EXTRACT (a new tree).

    Only fields named in a fixed list are rewritten (the field becomes SQL text).

    >>> from sqlglot import parse_one
    >>> as_extract(parse_one("SELECT HOUR(ts), DATE_PART('dow', ts) FROM t", "duckdb")).sql()
    'SELECT EXTRACT(HOUR FROM ts), EXTRACT(DOW FROM ts) FROM t'
    """
    def visit(node: exp.Expr) -> exp.Expr:
        field = _SPELLINGS.get(type(node))
        if field is not None and [k for k, v in node.args.items() if v] == ["this"]:
            return exp.Extract(this=exp.var(field.upper()), expression=node.this)
        if isinstance(node, exp.Anonymous) and node.name.upper() == "DATE_PART" \
                and len(node.expressions) == 2 and isinstance(node.expressions[0], exp.Literal) \
                and node.expressions[0].is_string \
                and node.expressions[0].name.lower() in _PART_FIELDS:
            return exp.Extract(this=exp.var(node.expressions[0].name.upper()),
                               expression=node.expressions[1])
        return node

    return copy_tree(tree).transform(visit, copy=False)


@dataclass(frozen=True)
class CalendarKeys:
    """Buckets of a block column: ``kind`` "trunc" (DATE_TRUNC to ``unit``), "field"
    (EXTRACT of ``unit``) or "date" (CAST AS DATE: days).  ``alias`` is the column's table
    alias (the block restriction of that table sets the range)."""

    alias: str
    column: str
    kind: Literal["trunc", "field", "date"]
    unit: str

    def describe(self) -> str:
        """For the report: where the keys come from."""
        what = {"trunc": f"every {self.unit} of", "field":
                f"every value of EXTRACT({self.unit}) over", "date": "every day of"}[self.kind]
        return f"{what} the blocks read (the public schedule of {self.column})"


@dataclass(frozen=True)
class TableKeys:
    """Distinct values of an expression over one public table of a join."""

    alias: str
    table: str

    def describe(self) -> str:
        """For the report: where the keys come from."""
        return f"every distinct value in the public table {self.table}"


KeyDomain = CalendarKeys | TableKeys


# Conditions whose value is TRUE, FALSE or NULL, whatever they compare.
_CONDITIONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Is, exp.In, exp.Between,
               exp.Like, exp.ILike, exp.Not, exp.And, exp.Or)


def literal_values(key: exp.Expr) -> tuple[object, ...] | None:
    """The values a GROUP BY expression can take, when its text alone fixes them; else None.

    >>> from sqlglot import parse_one
    >>> literal_values(parse_one("CASE WHEN fare > 50 THEN 'high' WHEN fare > 20 THEN 'mid' "
    ...                          "ELSE 'low' END"))
    ('high', 'mid', 'low')
    >>> literal_values(parse_one("CASE WHEN x THEN 1 WHEN y THEN 1 END"))
    (1,)
    >>> literal_values(parse_one("fare > 50"))
    (False, True)
    >>> literal_values(parse_one("CASE WHEN x THEN 'a' ELSE city END")) is None
    True
    >>> literal_values(parse_one("CASE WHEN x THEN 'a' ELSE 1 END")) is None  # mixed types
    True
    """
    node = key.unnest()
    if isinstance(node, _CONDITIONS):
        return (False, True)
    if not isinstance(node, exp.Case):
        return None
    # CASE WHEN c THEN r ... and CASE x WHEN v THEN r ...: the results r are the values.
    results = [i.args.get("true") for i in node.args.get("ifs") or []]
    results.append(node.args.get("default") or exp.Null())
    values: list[object] = []
    for result in results:
        value = _literal_value(result.unnest() if result is not None else exp.Null())
        if value is _NOT_LITERAL:
            return None
        if value is not None and value not in values:
            values.append(value)
    kinds = {type(v) is str for v in values}
    return tuple(values) if values and len(kinds) == 1 else None


_NOT_LITERAL = object()


def _literal_value(node: exp.Expr) -> object:
    """The value of a string or number literal (negated too), None for NULL, else
    ``_NOT_LITERAL``."""
    if isinstance(node, exp.Null):
        return None
    if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) and not node.this.is_string:
        inner = _literal_value(node.this)
        return _NOT_LITERAL if inner is _NOT_LITERAL else -inner  # type: ignore[operator]
    if isinstance(node, exp.Literal):
        if node.is_string:
            return node.this
        text = node.this
        try:
            return int(text)
        except ValueError:
            try:
                return float(text)
            except ValueError:
                return _NOT_LITERAL
    return _NOT_LITERAL


def key_domain(key: exp.Expr, tables: Mapping[str, tuple[str, TablePolicy]],
               column_type: Mapping[tuple[str, str], str]) -> KeyDomain | None:
    """The public key set of a GROUP BY expression (qualified columns), or None.

    ``tables``: the (table name, policy) of each table alias of the query; ``column_type``:
    the declared type of (alias, column).

    >>> from chorus_py.policy import TablePolicy
    >>> cities = TablePolicy(public=True)
    >>> key_domain(exp.column("country", table="c"), {"c": ("cities", cities),
    ...            "t": ("trips", TablePolicy(columns={"city": {"type": "text"}}))}, {})
    TableKeys(alias='c', table='cities')
    """
    calendar = _calendar(key, tables, column_type)
    if calendar is not None:
        return calendar
    aliases = {c.table for c in key.find_all(exp.Column)}
    if len(aliases) == 1 and len(tables) > 1:
        alias = aliases.pop()
        found = tables.get(alias)
        if found is not None and found[1].public:
            return TableKeys(alias, found[0])
    return None


def _calendar(key: exp.Expr, tables: Mapping[str, tuple[str, TablePolicy]],
              column_type: Mapping[tuple[str, str], str]) -> CalendarKeys | None:
    node = key.unnest()
    kind: Literal["trunc", "field", "date"]
    if isinstance(node, exp.TimestampTrunc | exp.DateTrunc):
        arg, unit = node.this, node.args.get("unit")
        kind = "trunc"
    elif isinstance(node, exp.Extract):
        arg, unit = node.expression, node.this
        kind = "field"
    elif isinstance(node, exp.Cast) and node.to.is_type(exp.DType.DATE):
        arg, unit, kind = node.this, None, "date"
    else:
        return None
    arg = arg.unnest() if arg is not None else None
    if not isinstance(arg, exp.Column):
        return None
    found = tables.get(arg.table)
    block = found[1].block if found is not None and not found[1].public else None
    if block is None or block.column != arg.name or not is_time_size(block.size):
        return None
    typ = column_type.get((arg.table, arg.name))
    if typ not in ("date", "timestamp"):
        return None
    name = ""
    if unit is not None:
        name = unit.name.lower() if isinstance(unit, exp.Literal | exp.Var) else ""
        name = _ALIASES.get(name, name[:-1] if name.endswith("s") else name)
    if kind == "trunc" and name not in TRUNC_UNITS:
        return None
    if kind == "field" and name not in FIELDS:
        return None
    return CalendarKeys(arg.table, arg.name, kind, name or "day")


def calendar_values(domain: CalendarKeys,
                    runs: Sequence[tuple[datetime | date, datetime | date]],
                    limit: int = MAX_KEYS) -> tuple[object, ...]:
    """Every value ``domain`` takes on rows whose block column lies in one of ``runs``
    ([start, end) each, the windows the query was charged for), in order.

    Each run is walked at the step where the bucket is constant (hours for the hour, days for
    day-level fields, months for months and years), and a cyclic field stops once it has all
    of its values.  Raises QueryRefused past ``limit`` values.

    >>> calendar_values(CalendarKeys("t", "ts", "trunc", "month"),
    ...                 [(datetime(2026, 1, 15), datetime(2026, 3, 1))])
    (datetime.datetime(2026, 1, 1, 0, 0), datetime.datetime(2026, 2, 1, 0, 0))
    >>> calendar_values(CalendarKeys("t", "ts", "field", "dow"),
    ...                 [(datetime(2026, 1, 1), datetime(2026, 4, 1))])
    (0, 1, 2, 3, 4, 5, 6)
    """
    step = domain.unit if domain.kind == "trunc" else (
        "day" if domain.kind == "date" else FIELDS[domain.unit][1])
    cycle = FIELDS[domain.unit][0] if domain.kind == "field" else None
    found: set[object] = set()
    for start, end in runs:
        for moment in _steps(_as_datetime(start), _as_datetime(end), step):
            found.add(_value(domain, moment))
            if cycle is not None and len(found) >= cycle:
                break
            if len(found) > limit:
                raise QueryRefused(
                    f"GROUP BY {_show(domain)} has more than {limit:,} keys over the blocks "
                    "this query reads: too many to list every one",
                    hint="group by a coarser bucket (e.g. DATE_TRUNC('month', ...)), or "
                    f"restrict {domain.column} in WHERE to a shorter range")
    return tuple(sorted(found))  # type: ignore[type-var]


def check_grid_size(sizes: Iterable[int], limit: int = MAX_KEYS) -> None:
    """Refuse a grid (the product of every key's count) of more than ``limit`` keys."""
    total = math.prod(sizes)
    if total > limit:
        raise QueryRefused(
            f"the group keys make {total:,} combinations, more than {limit:,}: too many to "
            "list every one", hint="group by fewer or coarser keys, or restrict the time "
            "range in WHERE")


def _show(domain: CalendarKeys) -> str:
    if domain.kind == "trunc":
        return f"DATE_TRUNC('{domain.unit}', {domain.column})"
    if domain.kind == "field":
        return f"EXTRACT({domain.unit} FROM {domain.column})"
    return f"CAST({domain.column} AS DATE)"


def _as_datetime(value: datetime | date) -> datetime:
    if isinstance(value, datetime):
        return value.replace(tzinfo=None)
    return datetime(value.year, value.month, value.day)


def _floor(moment: datetime, unit: str) -> datetime:
    """DATE_TRUNC(unit, moment), as both databases compute it (weeks start on Monday)."""
    if unit == "hour":
        return moment.replace(minute=0, second=0, microsecond=0)
    day = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    if unit == "day":
        return day
    if unit == "week":
        return day - timedelta(days=day.weekday())
    if unit == "month":
        return day.replace(day=1)
    if unit == "quarter":
        return day.replace(month=(day.month - 1) // 3 * 3 + 1, day=1)
    return day.replace(month=1, day=1)


def _next(moment: datetime, unit: str) -> datetime:
    if unit in ("hour", "day", "week"):
        return moment + {"hour": timedelta(hours=1), "day": timedelta(days=1),
                         "week": timedelta(weeks=1)}[unit]
    months = {"month": 1, "quarter": 3, "year": 12}[unit]
    index = moment.year * 12 + moment.month - 1 + months
    return moment.replace(year=index // 12, month=index % 12 + 1)


def _steps(start: datetime, end: datetime, unit: str) -> Iterator[datetime]:
    """The starts of the ``unit`` buckets that meet [start, end)."""
    moment = _floor(start, unit)
    while moment < end:
        yield moment
        moment = _next(moment, unit)


def _value(domain: CalendarKeys, moment: datetime) -> object:
    """The bucket of ``moment``: what the database computes for a row at that instant."""
    if domain.kind == "trunc":
        return _floor(moment, domain.unit)
    if domain.kind == "date":
        return moment.date()
    unit = domain.unit
    iso = moment.isocalendar()
    return {
        "year": moment.year, "isoyear": iso[0], "quarter": (moment.month - 1) // 3 + 1,
        "month": moment.month, "week": iso[1], "day": moment.day,
        "doy": moment.timetuple().tm_yday, "dow": moment.isoweekday() % 7,
        "isodow": moment.isoweekday(), "hour": moment.hour,
    }[unit]
