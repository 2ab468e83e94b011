"""``chorus check``: the data owner's lint of a policy against the live data.

The policy loader already refuses what is wrong on its face (unknown keys, bad types, a table or
column the database does not have).  This reads the data itself, with the owner's connection
(the policy's backend URL), to find what only the data can show:

- a ``public_values`` entry no row has (a typo such as "Emergncy" would be released as a noisy
  category of its own), and values the rows have that the list misses (those rows never appear
  in a GROUP BY on the column: they are left out of every answer);
- numeric bounds that clip much of a column (more than ``clip_warning`` of its non-NULL rows lie
  outside ``[lower, upper]``, so SUM and AVG are biased towards the bounds).

It is an owner-side tool, like ``chorus bound``: its findings quote data (counts, values) and are
never shown to analysts.  Each statement is a plain aggregate over one declared column.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from sqlglot import exp

from chorus_py.backends import Backend
from chorus_py.policy import Policy

#: Share of a column's rows outside its bounds above which ``check`` warns.
CLIP_WARNING = 0.01


@dataclass(frozen=True)
class Finding:
    """One thing the owner should look at: where (``table.column``), what, and the fix."""

    severity: Literal["error", "warning"]
    where: str
    problem: str
    fix: str


def check_policy(policy: Policy, backend: Backend,
                 clip_warning: float = CLIP_WARNING) -> list[Finding]:
    """Every finding of ``policy`` against the data ``backend`` reaches, table by table."""
    findings: list[Finding] = []
    for name, table in policy.tables.items():
        for column, cp in table.columns.items():
            where = f"tables.{name}.columns.{column}"
            if cp.public_values is not None:
                findings += _public_values(backend, policy.backend.dialect, name, column,
                                           cp.public_values, where)
            if cp.lower is not None and cp.upper is not None:
                findings += _bounds(backend, policy.backend.dialect, name, column, cp.lower,
                                    cp.upper, where, clip_warning)
    return findings


def _column(table: str, column: str) -> tuple[exp.Table, exp.Column]:
    return exp.to_table(f'"{table}"'), exp.column(column, quoted=True)


def _public_values(backend: Backend, dialect: str, table: str, column: str,
                   declared: tuple[Any, ...], where: str) -> list[Finding]:
    source, col = _column(table, column)
    sql = exp.select(col, exp.Count(this=exp.Star())).from_(source).group_by(col).sql(dialect)
    counts = {_key(v): int(n) for v, n in backend.run(sql).rows if v is not None}
    wanted = {_key(v) for v in declared}
    out = []
    missing = [v for v in declared if _key(v) not in counts]
    if missing:
        out.append(Finding(
            "error", where, f"public_values lists {_quoted(missing)}, which no row has: a typo "
            "is released as a category of its own (always near 0, plus noise)",
            "correct or remove them; the values the data has: " + _quoted(
                sorted(counts, key=lambda v: -counts[v])[:10])))
    extra = {v: n for v, n in counts.items() if v not in wanted}
    if extra:
        rows = sum(extra.values())
        out.append(Finding(
            "warning", where, f"{rows:,} row(s) have values public_values does not list "
            f"({_quoted(sorted(extra, key=lambda v: -extra[v])[:10])}): a GROUP BY on "
            f"{column} leaves them out of every answer",
            "add the values to public_values if they are public, or accept that they are "
            "left out"))
    return out


def _bounds(backend: Backend, dialect: str, table: str, column: str, lower: float,
            upper: float, where: str, clip_warning: float) -> list[Finding]:
    source, col = _column(table, column)
    outside = exp.or_(col < exp.Literal.number(lower), col > exp.Literal.number(upper))
    sql = exp.select(
        exp.Count(this=col),
        exp.Sum(this=exp.Case(ifs=[exp.If(this=outside, true=exp.Literal.number(1))],
                              default=exp.Literal.number(0))),
    ).from_(source).sql(dialect)
    total, clipped = backend.run(sql).rows[0]
    total, clipped = int(total or 0), int(clipped or 0)
    if total == 0 or clipped / total <= clip_warning:
        return []
    return [Finding(
        "warning", where, f"{clipped / total:.1%} of the {total:,} non-NULL rows lie outside "
        f"[{lower:g}, {upper:g}]: SUM and AVG are biased towards the bounds",
        "widen the bounds if the values are plausible (a wider bound costs noise: bounds are a "
        "privacy decision, the proxy never reads them from the data)")]


def _key(value: Any) -> Any:
    """Declared values and database values compare as text, numbers as floats."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | float):
        return float(value)
    return str(value)


def _quoted(values: list[Any]) -> str:
    return ", ".join(repr(v) if isinstance(v, str) else f"{v:g}" if isinstance(v, float)
                     else str(v) for v in values)
