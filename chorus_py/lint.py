"""``chorus check``: the data owner's lint of a policy against the live data.

The policy loader already refuses what is wrong on its face (unknown keys, bad types, a table or
column the database does not have).  This reads the data itself, with the owner's connection
(the policy's backend URL), to find what only the data can show:

- a ``public_values`` entry no row has (a typo such as "Emergncy" would be released as a noisy
  category of its own), and values the rows have that the list misses (those rows never appear
  in a GROUP BY on the column: they are left out of every answer);
- numeric bounds that clip much of a column (more than ``clip_warning`` of its non-NULL rows lie
  outside ``[lower, upper]``, so SUM and AVG are biased towards the bounds).

With the live database and the ledger (:func:`check_all`, what ``chorus check`` runs) it also
finds:

- names: declared tables or columns the database lacks (errors: the server would not start),
  and what the policy leaves unused (database tables and columns it does not declare: notes,
  analysts cannot query them; analysts with neither a password nor a token: they cannot log in);
- the ledger: blocks whose budget differs from ``epsilon_per_block`` / ``delta_per_block``
  (blocks keep the budget they were created with, so raising it in the policy changes nothing
  for them until ``chorus budget --policy P reconcile`` raises them, journaled);
- the proxy's database role (Postgres): a superuser or a role that can write the declared tables
  (errors), or one that can create tables or read undeclared ones, or public queries on the
  main connection (warnings), as ``chorus serve`` warns at start; and a role that can neither
  create nor use the proxy's schema when a table needs stored samples (an error).

It is an owner-side tool, like ``chorus bound``: its findings quote data (counts, values) and are
never shown to analysts.  Each statement is a plain aggregate over one declared column.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from sqlglot import exp

from chorus_py.backends import SCHEMA, Backend
from chorus_py.errors import ChorusError
from chorus_py.policy import LIVE_TYPES, AttributionTable, Policy

#: Share of a column's rows outside its bounds above which ``check`` warns.
CLIP_WARNING = 0.01


@dataclass(frozen=True)
class Finding:
    """One thing the owner should look at: where (``table.column``), what, and the fix."""

    severity: Literal["error", "warning", "note"]
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


def check_all(policy: Policy, backend: Backend, ledger: Any | None,
              clip_warning: float = CLIP_WARNING) -> list[Finding]:
    """What ``chorus check`` reports: names, the role, the ledger (when given), then the data
    of every table whose declared columns all exist."""
    live = backend.table_columns()
    findings = check_names(policy, live)
    # The other checks read only what exists: a missing name is reported once, above.
    present = policy.model_copy(update={"tables": {
        name: table for name, table in policy.tables.items()
        if name in live and all(live[name].get(c) in LIVE_TYPES[cp.type]
                                for c, cp in table.columns.items())}})
    findings += check_role(present, backend)
    if ledger is not None:
        findings += check_ledger(policy, ledger)
    findings += check_policy(present, backend, clip_warning)
    return findings


def check_names(policy: Policy, live: dict[str, dict[str, str]]) -> list[Finding]:
    """Declared names the database lacks (errors) and what the policy leaves unused (notes)."""
    out: list[Finding] = []
    for name, table in policy.tables.items():
        where = f"tables.{name}"
        if name not in live:
            out.append(Finding("error", where, f"the database has no table '{name}'",
                               "create the table, or remove it from the policy; tables: "
                               + ", ".join(sorted(live)[:20])))
            continue
        for column, cp in table.columns.items():
            actual = live[name].get(column)
            if actual is None:
                out.append(Finding("error", f"{where}.columns.{column}",
                                   f"the table '{name}' has no column '{column}'",
                                   "columns in the database: " + ", ".join(live[name])))
            elif actual not in LIVE_TYPES[cp.type]:
                out.append(Finding("error", f"{where}.columns.{column}.type",
                                   f"declared '{cp.type}' but the database column is {actual}",
                                   "declare the type the database has"))
        unit = table.privacy_unit
        if isinstance(unit, AttributionTable) and not {unit.row_id, unit.unit_id} <= set(
                live.get(unit.table, {})):
            out.append(Finding("error", f"{where}.privacy_unit",
                               f"the attribution table '{unit.table}' is missing or lacks "
                               f"'{unit.row_id}' / '{unit.unit_id}'",
                               "create it with one row per (row id, unit id) pair"))
        unused = [c for c in live[name] if c not in table.columns]
        if unused and not table.public:
            out.append(Finding("note", where, f"columns not declared, so no query can read "
                               f"them: {', '.join(unused)}",
                               "declare those analysts need (with bounds for numbers)"))
    attribution = {t.privacy_unit.table for t in policy.tables.values()
                   if isinstance(t.privacy_unit, AttributionTable)}
    undeclared = sorted(set(live) - set(policy.tables) - attribution)
    if undeclared:
        out.append(Finding("note", "tables", "database tables the policy does not declare "
                           f"(invisible to analysts): {', '.join(undeclared)}",
                           "declare the ones analysts need (`chorus init` drafts them)"))
    for name, analyst in policy.analysts.items():
        if analyst.password is None and not analyst.token_digests:
            out.append(Finding("warning", f"analysts.{name}", "neither a password nor a token: "
                               "this analyst cannot log in over the wire protocol or REST",
                               f"`chorus passwd` for a password, `chorus token add --policy P "
                               f"{name}` for a REST token"))
    return out


def check_role(policy: Policy, backend: Backend) -> list[Finding]:
    """What the proxy's database role can do beyond reading the declared tables (the start-up
    checks of ``chorus serve``): writing is an error, the rest warnings."""
    public = [t for t, tp in policy.tables.items() if tp.public]
    private = [t for t, tp in policy.tables.items() if not tp.public]
    try:
        warnings = backend.restrict_public(public, private, policy.backend.public_url)
    except ChorusError as err:  # backend.public_url's role can read a private table
        return [Finding("error", "backend.public_url", err.message, err.hint or "")]
    out = []
    for text in warnings:
        severe = "superuser" in text or " can write " in text
        problem, _, fix = text.partition(": ")
        out.append(Finding("error" if severe else "warning", "backend.url", problem,
                           fix or "see docs/owner-guide.md, 'Least privilege'"))
    return out + _private_schema(policy, backend)


def _private_schema(policy: Policy, backend: Backend) -> list[Finding]:
    """Postgres: tables the proxy keeps samples of (``bounding = "materialized"``, several
    units per row) need its schema, which a least-privilege role cannot create itself."""
    needing = [name for name, t in policy.tables.items() if t.bounding == "materialized"]
    if policy.backend.dialect != "postgres" or not needing:
        return []
    exists, create_db, role = backend.run(
        f"SELECT to_regnamespace('{SCHEMA}') IS NOT NULL, "
        "has_database_privilege(current_database(), 'CREATE'), current_user::text").rows[0]
    if not exists:
        if create_db:
            return []  # created on first use (a warning above already says CREATE is too much)
        return [Finding("error", "backend.url", f"the proxy's role {role} cannot create its "
                        f"schema {SCHEMA}, which {', '.join(needing)} need(s) for stored "
                        "samples", f"as the owner: CREATE SCHEMA {SCHEMA} AUTHORIZATION {role}")]
    (usable,) = backend.run(f"SELECT has_schema_privilege('{SCHEMA}', 'USAGE, CREATE')").rows[0]
    if usable:
        return []
    return [Finding("error", "backend.url", f"the proxy's role {role} cannot create tables in "
                    f"its schema {SCHEMA}, which {', '.join(needing)} need(s)",
                    f"GRANT USAGE, CREATE ON SCHEMA {SCHEMA} TO {role}")]


def check_ledger(policy: Policy, ledger: Any) -> list[Finding]:
    """Blocks whose budget is not the policy's ``epsilon_per_block`` / ``delta_per_block``."""
    privacy = policy.privacy
    target = (privacy.epsilon_per_block, privacy.delta_per_block)
    below, above = [], []
    for block in ledger.blocks():
        have = (block.epsilon_global, block.delta_global)
        if have == target:
            continue
        (below if have[0] <= target[0] and have[1] <= target[1] else above).append(block)
    out = []
    if below:
        out.append(Finding(
            "error", "privacy.epsilon_per_block",
            f"{len(below)} block(s) of the ledger ({_span(below)}) have a budget of epsilon "
            f"{below[0].epsilon_global:g}, delta {below[0].delta_global:g}, below the policy's "
            f"{target[0]:g}, {target[1]:g}: a block keeps the budget it was created with, so "
            "only new blocks get the new value",
            f"`chorus budget --policy {policy.source} reconcile` raises them to the policy's "
            "value (journaled; more budget for the same rows is a privacy decision), or set "
            "the policy back"))
    if above:
        out.append(Finding(
            "warning", "privacy.epsilon_per_block",
            f"{len(above)} block(s) of the ledger ({_span(above)}) have more budget than the "
            f"policy's epsilon {target[0]:g}, delta {target[1]:g} (it was lowered): they keep "
            "it, as what was spent cannot be taken back",
            "nothing to run; new blocks get the policy's value"))
    return out


def _span(blocks: list[Any]) -> str:
    ids = [b.block_id for b in blocks]
    return ids[0] if len(ids) == 1 else f"{ids[0]} .. {ids[-1]}"


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
