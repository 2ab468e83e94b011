"""Reading the join tree of a flat (normalised) SELECT: which tables, which equijoins, and the
elastic stability S(k) of the joined relation (DESIGN.md section 5, ``analyses.elastic``).

Supported: inner equijoins ``JOIN ... ON a = b`` (several joins, AND-ed equalities), comma joins
with the equality in WHERE, and the same inside CTEs or subqueries that only filter or project
(they were merged away by the normaliser).  Inner joins commute, so the tables are joined in a
left-deep order chosen greedily: start from the first table of FROM, repeatedly add a table that
some equality connects to the tables joined so far.

The elastic rules, for relations r1 (joined so far) and r2 (the next table) and an equality
a = b, a of r1 and b of r2:

- no table (or privacy unit) shared: S(k) = max(mf_k(a, r1) * S_r2(k), mf_k(b, r2) * S_r1(k));
- shared (a self-join, or two tables of the same privacy unit, which change together):
  S(k) = mf_k(a, r1) * S_r2(k) + mf_k(b, r2) * S_r1(k) + S_r1(k) * S_r2(k);
- after the join, mf_k of a column of r1 is multiplied by mf_k(b, r2), of r2 by mf_k(a, r1);
- shared, and the equality joins the privacy unit columns of both sides, each side "unit-keyed"
  (a table with a privacy unit, or a join of such tables on the unit, or of one with public
  tables): a neighbour removes or adds every row whose key is its unit u on both sides, and no
  other row has key u, so only the pairs of u's rows change: S(k) = S_r1(k) * S_r2(k) (trips
  with c rows per rider JOIN riders with one: S = c, where the shared rule gives 3c);
- several equalities between r1 and r2: every one gives a valid bound, so the smallest (pointwise
  min) is used, for S and for the frequencies.

Base relations:

- a private table at event level: S = 1, mf_k(c) = mf(c) + k;
- a private table with a privacy unit and at most c rows per unit after contribution bounding:
  one neighbour adds or removes one unit, i.e. at most c rows, so S = c and
  mf_k(col) = mf(col) + c k (mf of the raw table bounds that of the bounded one: bounding only
  drops rows); the unit column itself has at most c rows per value after bounding, at any
  distance: mf_k = c;
- a public table: S = 0, mf_k = mf (its rows never change).

User-level DP across joins (the rule implemented): two private tables may be joined only when
both are at event level (each neighbour changes one row of one table), or both have the same
privacy unit column (a neighbour changes up to c rows of each, and the shared-table rule above
bounds the change of the join); a table with a privacy unit joined to an event-level private
table, or to a table of another privacy unit, is refused, since one neighbour notion does not
bound the other.  Joins of any private table to public tables are always allowed.

The smooth bound of S(k) for the query's (epsilon, delta), and with it the sensitivity of each
measurement, is set later by :mod:`analyses.smoothing`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from sqlglot import exp

from analyses.elastic import (
    Const,
    Freq,
    Term,
    maximum,
    minimum,
    mul,
)
from analyses.elastic import add as add_terms
from analyses.trees import sql_text
from chorus_py.errors import NotSupportedError, QueryRefused
from chorus_py.policy import Policy, TablePolicy

FrequencySource = Literal["pinned", "data", "public"]


@dataclass(frozen=True)
class JoinSource:
    """One table occurrence of the join: alias, table, its policy, and its cap c (0: public)."""

    alias: str
    table: str
    policy: TablePolicy
    cap: int

    @property
    def public(self) -> bool:
        """A public table: free, never changes between neighbours."""
        return self.policy.public

    @property
    def origin(self) -> str:
        """What a neighbour changes: the table (event level) or its privacy unit (user level)."""
        unit = self.policy.privacy_unit
        return f"unit:{unit}" if unit else f"table:{self.table}"


@dataclass(frozen=True)
class FrequencyMetric:
    """A max frequency the stability needs: mf(column) of a table, and where its value comes
    from (``pinned`` in the policy, read from the ``data`` of a private table, or from a
    ``public`` table, whose data is public)."""

    name: str
    table: str
    column: str
    source: FrequencySource
    pinned: float | None = None


@dataclass(frozen=True)
class JoinInfo:
    """The join part of an analysed query: sources, equalities and the stability S(k)."""

    tree: exp.Select
    sources: tuple[JoinSource, ...]
    equalities: tuple[str, ...]
    stability: Term
    metrics: tuple[FrequencyMetric, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)
    # Every private occurrence has the same privacy unit and is joined to the others on it
    # (public tables on anything): a unit's join rows are exactly the rows that carry it, so
    # what one unit changes is confined to its own rows (``_Relation.unit_keyed``).
    unit_keyed: bool = False

    @property
    def private_sources(self) -> tuple[JoinSource, ...]:
        """The occurrences of private tables."""
        return tuple(s for s in self.sources if not s.public)

    @property
    def data_dependent(self) -> bool:
        """True when some max frequency is read from private data (then S* must stay hidden)."""
        return any(m.source == "data" for m in self.metrics)


@dataclass
class _Relation:
    aliases: set[str]
    stability: Term
    origins: set[str]
    # mf_k(column, relation) = base mf_k(column) * multiplier[alias of the column]
    multiplier: dict[str, Term]
    # Every row a neighbour changes carries the changed unit's value in the unit column of
    # every private alias (a table with a privacy unit, joined only on its unit or to public
    # tables): then a join on the unit pairs only the changed unit's rows (module docstring).
    unit_keyed: bool = False


def _conjuncts(node: exp.Expr | None) -> list[exp.Expr]:
    """The AND-ed parts of ``node``, through any parentheses: ``a AND (b AND (c))`` is
    [a, b, c] (sqlglot's ``flatten`` stops at a parenthesised AND)."""
    if node is None:
        return []
    node = node.unnest()
    if isinstance(node, exp.And):
        return [part for child in (node.this, node.expression) for part in _conjuncts(child)]
    return [node]


def _aliases(node: exp.Expr) -> set[str]:
    return {c.table for c in node.find_all(exp.Column)}


def _equality(node: exp.Expr) -> tuple[exp.Column, exp.Column] | None:
    """(a, b) for ``a = b`` between columns of two different tables; None for a filter.

    Raises when a comparison connects two tables through anything but two plain columns."""
    if isinstance(node, exp.EQ):
        left, right = node.this.unnest(), node.expression.unnest()
        la, ra = _aliases(left), _aliases(right)
        if len(la | ra) < 2:
            return None
        if isinstance(left, exp.Column) and isinstance(right, exp.Column) and la != ra:
            return left, right
        raise NotSupportedError(
            f"join keys must be plain columns, not expressions ({_show(node)}): a computed key "
            "has no known max frequency",
            hint="join on columns, e.g. ON a.customer_id = b.customer_id; compute values in "
            "the SELECT list instead")
    if len(_aliases(node)) > 1 and isinstance(node, exp.Or):
        raise NotSupportedError(
            f"OR in a join condition is not supported ({_show(node)})",
            hint="join with AND-ed equalities; an OR between tables is not an equijoin")
    return None


def _show(node: exp.Expr) -> str:
    plain = node.copy()
    for ident in plain.find_all(exp.Identifier):
        ident.set("quoted", False)
    return sql_text(plain)


def analyze_joins(flat: exp.Select, policy: Policy) -> JoinInfo:
    """The join tree of a normalised SELECT over several table occurrences (pure)."""
    sources: dict[str, JoinSource] = {}
    first = flat.args["from_"].this
    items = [first] + [j.this for j in flat.args.get("joins") or []]
    for join in flat.args.get("joins") or []:
        side, kind = join.args.get("side"), (join.args.get("kind") or "").upper()
        if side:
            raise NotSupportedError(
                f"{side.upper()} OUTER JOIN is not supported: the rows it pads with NULLs have "
                "no bounded sensitivity in this proxy",
                hint="use an inner JOIN, or count the two tables separately")
        if kind and kind not in ("INNER",):
            raise NotSupportedError(
                f"{kind} JOIN is not supported (only inner equijoins)",
                hint="use JOIN ... ON a = b")
        if join.args.get("using"):
            raise NotSupportedError("JOIN ... USING was not resolved; write ON a = b")
        on = join.args.get("on")
        if on is not None and any(isinstance(n, exp.Or) for n in on.find_all(exp.Or)):
            raise NotSupportedError(
                f"OR in a join condition is not supported ({_show(on)})",
                hint="join with AND-ed equalities, and move other conditions to WHERE")
    for item in items:
        if not isinstance(item, exp.Table):
            raise NotSupportedError(
                "a join may only read tables, or subqueries and CTEs that only filter or "
                "project one table", hint="move the aggregation to the outermost SELECT")
        name = item.name
        tp = policy.tables[name]
        cap = 0 if tp.public else tp.contribution_bound
        sources[item.alias_or_name] = JoinSource(item.alias_or_name, name, tp, cap)
    _check_origins(list(sources.values()))

    conditions = _conjuncts(flat.args["where"].this if flat.args.get("where") else None)
    for join in flat.args.get("joins") or []:
        on_parts = _conjuncts(join.args.get("on"))
        target = join.this.alias_or_name
        if on_parts and not any(
                (eq := _equality(c)) is not None and target in (eq[0].table, eq[1].table)
                for c in on_parts):
            raise NotSupportedError(
                f"non-equijoin: the join condition {_show(join.args['on'])} has no equality "
                f"between two columns of {target} and the tables before it",
                hint="join with ON a.key = b.key")
        conditions += on_parts
    equalities = [eq for c in conditions if (eq := _equality(c)) is not None]

    metrics: dict[str, FrequencyMetric] = {}

    def base_mf(col: exp.Column) -> Term:
        src = sources[col.table]
        unit = src.policy.privacy_unit
        if unit is not None and col.name == unit:
            return Const(float(src.cap))  # <= c rows per unit value after bounding, any k
        name = f"{src.table}.{col.name}"
        if src.public:
            metrics.setdefault(name, FrequencyMetric(name, src.table, col.name, "public"))
            return Freq(name, 0.0)
        cp = src.policy.columns[col.name]
        pinned = cp.max_frequency
        metrics.setdefault(name, FrequencyMetric(
            name, src.table, col.name, "pinned" if pinned is not None else "data",
            float(pinned) if pinned is not None else None))
        return Freq(name, float(src.cap))

    def base(alias: str) -> _Relation:
        src = sources[alias]
        return _Relation({alias}, Const(float(src.cap)),
                         set() if src.public else {src.origin}, {alias: Const(1.0)},
                         unit_keyed=src.policy.privacy_unit is not None and not src.public)

    def is_unit(col: exp.Column) -> bool:
        src = sources[col.table]
        return not src.public and col.name == src.policy.privacy_unit

    def mf_in(rel: _Relation, col: exp.Column) -> Term:
        return mul(base_mf(col), rel.multiplier[col.table])

    order = list(sources)
    rel = base(order[0])
    pending = order[1:]
    used: list[str] = []
    while pending:
        nxt = next((a for a in pending if any(
            {x.table, y.table} & {a} and ({x.table, y.table} - {a}) <= rel.aliases
            for x, y in equalities)), None)
        if nxt is None:
            raise NotSupportedError(
                f"non-equijoin: {sources[pending[0]].table} is joined without an equality "
                "between its columns and the other tables (a cross join)",
                hint="join with ON a.key = b.key, or WHERE a.key = b.key for comma joins")
        other = base(nxt)
        shared = bool(rel.origins & other.origins)
        candidates: list[Term] = []
        left_factor: list[Term] = []
        right_factor: list[Term] = []
        for x, y in equalities:
            if {x.table, y.table} & {nxt} and ({x.table, y.table} - {nxt}) <= rel.aliases:
                a, b = (x, y) if y.table == nxt else (y, x)
                mf_a, mf_b = mf_in(rel, a), mf_in(other, b)
                on_unit = shared and rel.unit_keyed and other.unit_keyed and is_unit(a) \
                    and is_unit(b)
                if on_unit:
                    # Both sides keyed by the unit: the rows with key u are exactly the changed
                    # unit's (all of them change), so only their pairs change: S = S1 * S2.
                    s = mul(rel.stability, other.stability)
                elif shared:
                    s = add_terms(mul(mf_a, other.stability), mul(mf_b, rel.stability),
                                  mul(rel.stability, other.stability))
                else:
                    s = maximum(mul(mf_a, other.stability), mul(mf_b, rel.stability))
                candidates.append(s)
                left_factor.append(mf_b)
                right_factor.append(mf_a)
                used.append(f"{_show(a)} = {_show(b)}")
        stability = minimum(*candidates)
        # Unit-keyed after the join: every equality used was on the unit (a public table's
        # rows never change, so joining one keeps the property).
        keyed = rel.unit_keyed and (other.unit_keyed or sources[nxt].public) and all(
            sources[nxt].public or (is_unit(x) and is_unit(y)) for x, y in equalities
            if {x.table, y.table} & {nxt} and ({x.table, y.table} - {nxt}) <= rel.aliases)
        grow_left, grow_right = minimum(*left_factor), minimum(*right_factor)
        multiplier = {al: mul(t, grow_left) for al, t in rel.multiplier.items()}
        multiplier[nxt] = mul(other.multiplier[nxt], grow_right)
        rel = _Relation(rel.aliases | {nxt}, stability, rel.origins | other.origins, multiplier,
                        keyed)
        pending.remove(nxt)
    notes = []
    for src in sources.values():
        if src.policy.privacy_unit and src.policy.contribution == "auto":
            notes.append(f"{src.table}: contribution = 'auto' is not chosen per query in a "
                         f"join; the limit of {src.cap} rows per {src.policy.privacy_unit} is "
                         "used")
    # Only the frequencies left in S(k) matter: one multiplied by a public table's stability 0
    # folded away (drivers JOIN cities ON city: S = mf(cities.city) * 1, whatever
    # mf(drivers.city) is), and neither needs reading nor makes the scale data-dependent.
    needed = {leaf.name for leaf in rel.stability.leaves()}
    return JoinInfo(flat, tuple(sources.values()), tuple(used), rel.stability,
                    tuple(m for m in metrics.values() if m.name in needed), tuple(notes),
                    rel.unit_keyed)


def _check_origins(sources: list[JoinSource]) -> None:
    """Which private tables may be joined (the user-level rule in the module docstring)."""
    private = [s for s in sources if not s.public]
    for s in private:
        if s.policy.multi_attribution:
            raise NotSupportedError(
                f"joins of {s.table}, a table with several privacy units per row, are not "
                "supported", hint="query it alone")
    units = {s.policy.privacy_unit for s in private}
    if len(units) > 1:
        names = ", ".join(sorted(f"{s.table} ({s.policy.privacy_unit or 'event level'})"
                                 for s in private))
        raise QueryRefused(
            f"cannot join private tables protected at different levels: {names}",
            hint="a join of private tables needs the same privacy unit on both (or event level "
            "on both); join a table with a privacy unit to public tables only")
