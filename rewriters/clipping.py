"""Clipping: every summed value is forced into its declared [lower, upper] by the database."""

from __future__ import annotations

from sqlglot import exp

from analyses.trees import copy_tree
from chorus_py.policy import TablePolicy
from rewriters.bins import stored_bins, stored_column

#: The prefix of a ranked copy's stored clipped values: ``__chorus_clip<i>``, the i-th bounded
#: numeric column of ``rewriters.bins.stored_bins`` clipped at its declared bounds.
STORED_CLIP = "__chorus_clip"


def clipping(value: exp.Expr, lower: float, upper: float, consume: bool = False) -> exp.Expr:
    """Return ``CASE WHEN v < lower THEN lower WHEN v > upper THEN upper ELSE v END`` for a
    value ``v`` without a CASE, an aggregate or a window in it (a column, or arithmetic of
    columns), else ``CASE WHEN v IS NULL THEN NULL ELSE LEAST(GREATEST(v, lower), upper)
    END``.

    A NULL value stays NULL (SUM and AVG skip it) on every backend: Postgres's GREATEST and
    LEAST ignore NULL arguments, so ``GREATEST(NULL, 0)`` is 0 there and every NULL row would
    add ``lower`` to a SUM (DuckDB returns NULL): the CASE returns NULL first.  The
    comparisons are NULL (not true) for a NULL, which so reaches ``ELSE v``: NULL, without a
    test of its own (DuckDB: 1M doubles clamped in 7.3 ms instead of 10.5 with ``WHEN c IS
    NULL THEN NULL`` first; raw SUM 2.9 ms).

    Comparisons, which DuckDB runs faster than its GREATEST and LEAST (a column 18.6 -> 7.3 ms,
    ``fare * 2 - 1`` 4.9 -> 3.4 ms on 1M demo trips; Postgres alike either way), give the same
    result for every value, NaN and infinities included, because the three backends order NaN
    above every number (NaN > upper holds: NaN becomes upper, as LEAST(NaN, upper) gives); an
    expression is named three times instead of twice (it has no RANDOM(): the same value each
    time).  A value with a CASE in it keeps LEAST/GREATEST: DuckDB ran the comparisons around
    ``CASE WHEN city = 'SF' THEN fare END`` slower (6.1 -> 8.4 ms; Postgres 55 -> 67).  So
    does an aggregate (a unit's SUM or row count, ``kinds.per_person`` and the distinct-unit
    counts): the outgoing verifier reads a per-unit value as bounded by LEAST/GREATEST with a
    literal, not by comparisons (``analyses.outgoing``, rule 3').

    >>> from sqlglot import parse_one
    >>> clipping(parse_one("t.fare * 2"), 0, 200).sql()
    'CASE WHEN (t.fare * 2) < 0 THEN 0 WHEN (t.fare * 2) > 200 THEN 200 ELSE t.fare * 2 END'
    >>> clipping(parse_one("t.fare"), -1, 200).sql()
    'CASE WHEN t.fare < -1 THEN -1 WHEN t.fare > 200 THEN 200 ELSE t.fare END'
    >>> clipping(parse_one("COALESCE(CASE WHEN t.c THEN t.fare END, 0)"), 0, 200).sql()
    'CASE WHEN COALESCE(CASE WHEN t.c THEN t.fare END, 0) IS NULL THEN NULL ELSE \
LEAST(GREATEST(COALESCE(CASE WHEN t.c THEN t.fare END, 0), 0), 200) END'

    A CASE whose every branch is a number or NULL (a conditional count, ``SUM(CASE WHEN fare
    > 30 THEN 1 ELSE 0 END)``) is clipped branch by branch, ``CASE WHEN c THEN clip(1) ELSE
    clip(0) END``: the value a row gets is the one branch the CASE picks for it, clipped, so
    every row's result is the same as clipping the whole CASE (a missing ELSE is NULL, which
    stays NULL either way), and each branch is now a constant expression, which the database
    computes once per statement instead of per row.  Its structure does not depend on the
    bounds' values, as text templates need (``kinds.templates``).  (1M demo trips, that SUM
    over the ranked copy, [0, 1]: DuckDB 6.4 -> 2.5 ms, raw 2.1; Postgres 92 -> 76 ms, raw
    50.)  A CASE with a column branch keeps the clip around it: DuckDB ran the comparisons
    nested in a CASE branch slower than LEAST and GREATEST around the CASE (``AVG(CASE WHEN
    city = 'SF' THEN fare END)``'s sum 7.7 -> 8.6 ms).

    >>> clipping(parse_one("CASE WHEN t.c THEN 1 END"), 0, 0.5).sql()
    'CASE WHEN t.c THEN CASE WHEN 1 < 0 THEN 0 WHEN 1 > 0.5 THEN 0.5 ELSE 1 END END'

    ``consume``: ``value`` is the caller's fresh tree, placed in the result as it is (one copy
    fewer of what may be a large expression).
    """
    if lower > upper:
        raise ValueError("lower must be <= upper")
    inner = value.this if isinstance(value, exp.Paren) else value  # (CASE ... END) alike
    if isinstance(inner, exp.Case) and _constant_branches(inner):
        case = inner if consume else copy_tree(inner)
        for branch in case.args.get("ifs") or []:
            branch.set("true", _clipped_branch(branch.args["true"], lower, upper))
        if case.args.get("default") is not None:
            case.set("default", _clipped_branch(case.args["default"], lower, upper))
        return case
    if value.find(exp.Case, exp.AggFunc, exp.Window) is None:
        def compared() -> exp.Expr:  # a compound value in parentheses: no precedence to get wrong
            return copy_tree(value) if isinstance(value, exp.Column | exp.Literal) else \
                exp.Paren(this=copy_tree(value))
        return exp.Case(ifs=[
            exp.If(this=exp.LT(this=compared(), expression=bound_literal(lower)),
                   true=bound_literal(lower)),
            exp.If(this=exp.GT(this=compared(), expression=bound_literal(upper)),
                   true=bound_literal(upper)),
        ], default=value if consume else copy_tree(value))
    # ignore_nulls: the backends' own GREATEST and LEAST.  Both arguments are non-NULL where
    # they run (the CASE returns NULL first; the bounds are literals), so NULL handling never
    # arises; without the flag sqlglot renders each for DuckDB as CASE WHEN <arg> IS NULL ...
    # ELSE GREATEST(<arg>, l) END, which repeats the argument: 4 copies of the value per clip,
    # 16 for a clip inside a clip, each parsed again by the outgoing verifier.
    low = exp.Greatest(this=value if consume else copy_tree(value),
                       expressions=[bound_literal(lower)], ignore_nulls=True)
    clipped = exp.Least(this=low, expressions=[bound_literal(upper)], ignore_nulls=True)
    return exp.Case(ifs=[exp.If(this=exp.Is(this=copy_tree(value), expression=exp.Null()),
                                true=exp.Null())], default=clipped)


def _constant_branches(case: exp.Case) -> bool:
    """Whether every value ``case`` may take is a number literal (negated or not) or NULL."""
    values = [branch.args["true"] for branch in case.args.get("ifs") or []]
    if case.args.get("default") is not None:
        values.append(case.args["default"])
    return all(isinstance(v, exp.Null) or (isinstance(v, exp.Literal) and v.is_number)
               or (isinstance(v, exp.Neg) and isinstance(v.this, exp.Literal)
                   and v.this.is_number) for v in values)


def _clipped_branch(value: exp.Expr, lower: float, upper: float) -> exp.Expr:
    """A CASE branch's value clipped (a NULL stays as it is: it is NULL clipped)."""
    if isinstance(value, exp.Null):
        return value
    return clipping(value, lower, upper, consume=True)


def bound_literal(value: float) -> exp.Expr:
    """A clipping bound as SQL: integral values print without a fraction, negative ones as a
    negation (``kinds.templates`` relies on this exact form to fill its holes)."""
    literal = exp.Literal.number(int(value) if float(value).is_integer() else value)
    return exp.Neg(this=exp.Literal.number(-value)) if value < 0 else literal


def clips_stored(dialect: str) -> bool:
    """Whether the ranked copies of ``dialect`` store their bounded columns clipped at the
    declared bounds (:func:`stored_clip_columns`): DuckDB's, where the clip is most of a SUM's
    cost (1M demo trips, prepared statements, medians of 40: ``SUM`` over the copy 1.72 ms,
    with the clip's CASE 3.38, raw 1.39).  Postgres runs the CASE at no measurable cost
    beside its per-row overhead (``Clipping a column by comparisons``, benchmarks/RESULTS.md),
    where a wider copy would cost reading it; Spark compiles the CASE into its scan."""
    return dialect == "duckdb"


def stored_clip_columns(policy: TablePolicy, alias: str) -> list[exp.Expr]:
    """The clipped values a ranked copy stores, over the table's rows as ``alias``: for each
    bounded numeric column v (``rewriters.bins.stored_bins``, declared [lower, upper]),
    :func:`clipping` of v at those bounds as ``__chorus_clip<i>``: the very expression an
    answer clips a plain column with at its declared bounds, evaluated by the same database on
    the same value, so every row's stored value (NULL, NaN and the infinities included) is the
    one the answer would compute, and so is every sum of them.  The copy's name covers them
    (``chorus_py.stores.samples``)."""
    return [exp.alias_(clipping(exp.column(name, table=alias, quoted=True), lower, upper,
                                consume=True), f"{STORED_CLIP}{i}")
            for i, (name, lower, upper) in enumerate(stored_bins(policy))]


def stored_clip(policy: TablePolicy, argument: exp.Expr, alias: str, lower: float,
                upper: float) -> exp.Expr | None:
    """The ranked copy's stored clipped value of ``argument`` (``alias.__chorus_clip<i>``)
    when it is a plain column of the table clipped at its declared bounds, as the copy's
    was; None otherwise (the statement clips it per row).

    At other bounds inside the declared ones, clipping the stored value at the bounds that
    differ would give the same values with one comparison fewer (a whole-table ``SUM`` at [0,
    100] on 1M demo trips: 3.7 ms clipped per row, 3.0 from the stored value; at the declared
    [0, 200] 1.7, raw 1.5), but which comparisons are left would be part of a text template's
    structure (``kinds.templates``), whose random stand-ins for the other bound cannot always
    keep their order beside a declared one: not done."""
    found = stored_column(policy, argument, alias)
    if found is None or found[1:] != (float(lower), float(upper)):
        return None
    return exp.column(f"{STORED_CLIP}{found[0]}", table=alias)
