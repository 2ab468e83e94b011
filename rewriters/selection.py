"""SQL for the private selection of clipping bounds (``mechanisms.clip_bounds``) and of the
groups-per-unit bound g (``mechanisms.caps.choose_groups``).

``value_histogram`` returns, per magnitude bin of a summed expression, the total weight of the
rows in it, each row of a privacy unit weighing 1 / (the unit's non-NULL rows in the query's
filtered relation), so each unit adds exactly 1 (sensitivity 1).  ``group_histogram`` returns
the units per bin of their number of distinct groups; each unit falls in one bin (sensitivity
1).  Their results are exact and stay inside the proxy: the engine adds noise before using them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlglot import exp

from analyses.query import AggregateQuery
from analyses.trees import copy_tree
from chorus_py.policy import TablePolicy
from mechanisms.clip_bounds import magnitude_edges
from rewriters.bins import stored_bins, stored_column
from rewriters.blocks import BlockRestriction
from rewriters.clipping import clipping
from rewriters.contribution import RANK, UNIT_ORDER, UNIT_ROWS
from rewriters.pipeline import filtered_rows
from rewriters.safety import safety


@dataclass(frozen=True)
class ClippedArgument:
    """A summed expression of the query and its declared bounds [lower, upper]."""

    key: str             # its SQL, the key of ``AggregateQuery.with_bounds``
    argument: exp.Expr
    lower: float
    upper: float


def clipped_arguments(query: AggregateQuery) -> tuple[ClippedArgument, ...]:
    """Every distinct expression the query sums (SUM, AVG, VARIANCE, STDDEV), in order."""
    found: dict[str, ClippedArgument] = {}
    for m in query.measurements:
        if m.kind in ("sum", "sum_squares") and m.argument is not None \
                and m.lower is not None and m.upper is not None:
            key = m.argument_sql
            if key is not None and key not in found:
                found[key] = ClippedArgument(key, m.argument, m.lower, m.upper)
    return tuple(found.values())


def value_histogram(query: AggregateQuery, argument: exp.Expr, lower: float, upper: float,
                    edges: Sequence[float], restriction: BlockRestriction | None,
                    sample: tuple[str, str] | None) -> exp.Select:
    """Rows (bin index, weight) of |clip(argument, lower, upper)| over ``edges`` (largest first).

    Bin 0: magnitude >= edges[0]; bin j: edges[j] <= magnitude < edges[j - 1]; bin len(edges):
    below the last edge.  Bins without rows are absent.

    >>> from sqlglot import parse_one
    >>> from chorus_py.policy import TablePolicy
    >>> tp = TablePolicy(privacy_unit="u", max_rows_per_unit=5,
    ...                  columns={"u": {"type": "int"}, "x": {"type": "float"}})
    >>> q = AggregateQuery("t", "t", tp, None, (), (), (), None, (), None, None, 5, False, None)
    >>> print(value_histogram(q, parse_one("t.x"), 0, 10, (10.0, 5.0), None, None)
    ...       .sql())  # doctest: +NORMALIZE_WHITESPACE
    SELECT v.b AS b, SUM(v.w) AS w FROM (SELECT CASE WHEN r.m >= 10.0 THEN 0 WHEN r.m >= 5.0
    THEN 1 ELSE 2 END AS b, r.w AS w FROM (SELECT ABS(CASE WHEN t.x < 0 THEN 0 WHEN t.x > 10
    THEN 10 ELSE t.x END) AS m, CAST(1 AS DOUBLE) / COUNT(*) OVER
    (PARTITION BY t.u) AS w FROM (SELECT t.* FROM t AS t) AS t WHERE NOT t.x IS NULL) AS r) AS v
    GROUP BY v.b
    """
    alias = query.alias
    rows = filtered_rows(query, restriction, sample)
    value = safety(argument)
    one = exp.cast(exp.Literal.number(1), exp.DType.DOUBLE)
    unit = query.privacy_unit
    if unit is None:
        weight: exp.Expr = one  # event level: every row is its own unit
    else:
        weight = exp.Div(this=one, expression=exp.Window(
            this=exp.Count(this=exp.Star()), partition_by=[exp.column(unit, table=alias)]))
    # The clipped magnitude is computed once per row (m), then binned: written inside every
    # WHEN, it was rendered (and built) once per edge, 26 times.
    # Every tree here is built fresh for this statement: the builders need not copy them.
    # ``value`` goes into the clipped magnitude as it is; the WHERE reads a copy.
    magnitude_of = exp.Abs(this=clipping(value, lower, upper, consume=True))
    per_row = (exp.select(exp.alias_(magnitude_of, "m", copy=False),
                          exp.alias_(weight, "w", copy=False))
               .from_(rows.subquery(alias, copy=False), copy=False)
               .where(exp.Not(this=exp.Is(this=value.copy(), expression=exp.Null())),
                      copy=False))
    magnitude = exp.column("m", table="r")
    ifs = [exp.If(this=magnitude.copy() >= exp.Literal.number(edge), true=exp.Literal.number(j))
           for j, edge in enumerate(edges)]
    binned = exp.select(
        exp.alias_(exp.Case(ifs=ifs, default=exp.Literal.number(len(edges))), "b", copy=False),
        exp.alias_(exp.column("w", table="r"), "w", copy=False)).from_(per_row.subquery("r", copy=False),
                                                            copy=False)
    return (exp.select(exp.alias_(exp.column("b", table="v"), "b", copy=False),
                       exp.alias_(exp.Sum(this=exp.column("w", table="v")), "w", copy=False))
            .from_(binned.subquery("v", copy=False), copy=False)
            .group_by(exp.column("b", table="v"), copy=False))


# Where a one-key groups histogram counts each unit's groups in one aggregation per unit
# (``group_histogram``'s ``distinct``): Postgres sorts each unit's few rows for COUNT(DISTINCT)
# faster than it hashes every (unit, key) pair then groups them again (1M demo trips, driver_id,
# medians of 5 on a loaded machine: 3180 -> 1265 ms); DuckDB does not gain (352 -> 413 ms).
DISTINCT_GROUPS_DIALECTS = frozenset({"postgres"})


def group_histogram(query: AggregateQuery, restriction: BlockRestriction | None,
                    sample: tuple[str, str] | None, starts: Sequence[int],
                    distinct: bool = False) -> exp.Select:
    """Rows (bin index, units): units per bin of their distinct groups G_u (bins start at
    ``starts``; a unit with G_u >= starts[i] and < starts[i + 1] is in bin i).  Bins without
    units are absent.  A NULL key is a group of its own, as in GROUP BY.

    ``distinct`` (one key only; several keep the pairs): G_u counted in one aggregation per
    unit, ``COUNT(DISTINCT key) + (1 when COUNT(key) < COUNT(*), a NULL key, else 0)``
    instead of grouping the (unit, key) pairs then counting them per unit: the same G_u (the
    distinct non-NULL keys, plus the NULL group when the unit has a NULL key), so the same
    histogram, each unit still in one bin (sensitivity 1).

    >>> from sqlglot import parse_one
    >>> from chorus_py.policy import TablePolicy
    >>> tp = TablePolicy(privacy_unit="u", max_rows_per_unit=5,
    ...                  columns={"u": {"type": "int"}, "h": {"type": "int"}})
    >>> from analyses.query import GroupKey
    >>> q = AggregateQuery("t", "t", tp, None, (GroupKey("k0", parse_one("t.h"), None),), (),
    ...                    (), None, (), None, None, 5, True, None)
    >>> print(group_histogram(q, None, None, (1, 2, 4)).sql())  # doctest: +NORMALIZE_WHITESPACE
    SELECT CASE WHEN u.c >= 4 THEN 2 WHEN u.c >= 2 THEN 1 ELSE 0 END AS b, COUNT(*) AS n FROM
    (SELECT COUNT(*) AS c FROM (SELECT t.u AS u FROM (SELECT t.* FROM t AS t) AS t GROUP BY t.u,
    t.h) AS p GROUP BY p.u) AS u GROUP BY CASE WHEN u.c >= 4 THEN 2 WHEN u.c >= 2 THEN 1 ELSE 0
    END
    """
    unit = query.privacy_unit
    if unit is None or not query.keys:
        raise ValueError("a groups histogram needs a privacy unit and group keys")
    rows = filtered_rows(query, restriction, sample)
    if distinct and len(query.keys) == 1:
        key = safety(query.keys[0].expr)
        has_null = exp.Case(ifs=[exp.If(
            this=exp.LT(this=exp.Count(this=key.copy()), expression=exp.Count(this=exp.Star())),
            true=exp.Literal.number(1))], default=exp.Literal.number(0))
        groups = exp.Add(this=exp.Count(this=exp.Distinct(expressions=[key])),
                         expression=has_null)
        per_unit = (exp.select(exp.alias_(groups, "c")).from_(rows.subquery(query.alias))
                    .group_by(exp.column(unit, table=query.alias)))
    else:
        pairs = (exp.select(exp.alias_(exp.column(unit, table=query.alias), "u"))
                 .from_(rows.subquery(query.alias))
                 .group_by(exp.column(unit, table=query.alias),
                           *[safety(k.expr) for k in query.keys]))
        per_unit = (exp.select(exp.alias_(exp.Count(this=exp.Star()), "c"))
                    .from_(pairs.subquery("p")).group_by(exp.column("u", table="p")))
    return units_per_bin(per_unit, starts)


def units_per_bin(per_unit: exp.Select, starts: Sequence[int]) -> exp.Select:
    """Rows (bin index, units) of ``per_unit`` (one row per unit, its count ``c`` >= 1): a
    unit with ``c`` >= starts[i] and < starts[i + 1] is in bin i (sensitivity 1)."""
    ifs = [exp.If(this=exp.column("c", table="u") >= exp.Literal.number(start),
                  true=exp.Literal.number(i))
           for i, start in reversed(list(enumerate(starts))) if i > 0]
    bin_index = exp.Case(ifs=ifs, default=exp.Literal.number(0))  # G_u >= 1 always
    return (exp.select(exp.alias_(bin_index, "b"), exp.alias_(exp.Count(this=exp.Star()), "n"))
            .from_(per_unit.subquery("u")).group_by(bin_index.copy()))


# ``choice_histogram``'s rows: the cell's key, the cap weight, then each argument's weight.
CELL, CAP_WEIGHT = "k", "wc"


def value_weight(i: int) -> str:
    """The column of argument i's weight in ``choice_histogram``'s rows."""
    return f"w{i}"


def cell_base(edges: Sequence[float]) -> int:
    """The radix of a magnitude bin in a cell's key: bins 0..len(edges), and len(edges) + 1
    for a NULL value (no bin)."""
    return len(edges) + 2


def choice_histogram(query: AggregateQuery,
                     arguments: Sequence[tuple[ClippedArgument, Sequence[float]]],
                     starts: Sequence[int], restriction: BlockRestriction | None,
                     sample: tuple[str, str] | None,
                     stored: tuple[str, str] | None = None,
                     copy: tuple[str, str] | None = None, digits: bool = True,
                     part: tuple[bool, int] | None = None) -> exp.Select:
    """The cap histogram and the clipping histograms of ``arguments`` (each with its bin edges,
    largest first) in ONE statement: one pass over the query's filtered rows instead of one
    per histogram (issue 23).

    Rows (k, wc, w0, ...), grouped by the cell k (the unit's row count, at most the limit, and
    every argument's magnitude bin): the cells of the joint histogram, which the proxy sums
    into the marginals (``kinds.selection.cells``).  Each unit marks ONE of its rows with
    ``wc`` = 1 (every other row: 0) and each row, when argument i is not NULL, weighs ``w_i``
    = 1 / (the unit's non-NULL values of i) in its magnitude bin, so summed over the cells:

    - the cap marginal, the sum of wc per bin of min(c_u, limit), is the number of units per
      bin of c_u (c_u: the unit's filtered rows): today's ``cap_histogram``.  It is an exact
      integer (a SUM of integers 0 and 1: no floating point, nothing to round), and its L1
      sensitivity is 1: adding or removing a unit adds or removes its one marked row, in the
      one cell of its c_u, and changes no other unit's rows, counts or marks;
    - the clipping marginal of i, the sum of w_i per magnitude bin of i, is today's
      ``value_histogram`` (the same weights, the same bins), L1 sensitivity 1: a unit's
      weights add up to 1 and no other unit's weights depend on its rows.

    The marked row, over the filtered rows: ``ROW_NUMBER() OVER (PARTITION BY unit) = 1``,
    exactly one row of every unit that has a filtered row, whichever order the engine numbers
    them in (the mark says nothing about the row; only the unit's count reaches the key).  The
    windows share one partition (the unit): one sort or hash partition of the filtered rows.
    Equivalent aggregations (GROUP BY unit joined back to the rows, GROUP BY (unit, bin) then
    windows over the pairs) measured no cheaper on both engines taken together
    (benchmarks/RESULTS.md, "aggregation shapes against the window passes").

    ``stored`` names (schema, table) of the ranked copy (``rewriters.contribution.
    ranked_table``) when the query has no filter but its claimed blocks, which hold every row
    of the copy: c_u is then the copy's stored row count n_u (``__chorus_unit_rows``) and the
    marked row its stored rank 1 (``__chorus_rank``, each of 1..n_u once per unit), so no
    window is needed and the statement is one plain scan with a small hash aggregate.  The
    caller must make sure every row of the copy passes the filter; if some did not, a unit
    would add its mark (1, or 0 when its rank-1 row failed) to the cell of n_u: still L1
    sensitivity <= 1, an integer.  One difference from today's clipping histogram, on that
    path only: the weight is 1 / n_u, not 1 / (non-NULL values), so a unit with NULL values of
    i weighs (non-NULL values) / n_u < 1 there instead of 1: less weight, never more, the same
    sensitivity bound 1 and the same noise; identical when i has no NULLs.

    ``copy`` names the ranked copy when the query filters its rows (``stored`` is None): the
    windows then read the filtered rows from the copy instead of the table.  The copy holds
    every scheduled row of the table (``rewriters.contribution.ranked_table``: the table's rows
    with two more columns), and the claimed blocks are scheduled, so the filter and the blocks
    keep exactly the rows they keep in the table: the same cells, the same sensitivity.  What
    it buys is a result that is a function of the copy alone, which never changes under its
    name, so the proxy runs it once per text and copy and reads it from memory after
    (``kinds.selection.cells``; the windowed pass is the choices' whole cost, issue 23).
    Over the copy the windows sit in its direct reader (windows see the rows its WHERE
    keeps) and the mark is on the row of the unit's least stored rank among its filtered rows,
    ``CASE WHEN __chorus_rank = MIN(__chorus_rank) OVER (PARTITION BY unit) THEN 1 ELSE 0
    END``: the ranks 1..n_u are distinct within a unit, so exactly one of its filtered rows
    holds their minimum, and the MIN is a partition-wide aggregate like the counts.  ``copy``
    may name the copy's twin in unit order (the same rows, ``rewriters.contribution.
    unit_ordered``): every window is then partitioned by the copy's own
    ``__chorus_unit_rows`` then the unit, the same partitions in the twin's stored order, which
    Postgres reads from the twin's index without sorting them (``kinds.single.cells_twin_pays``).
    Over the copy or its twin (``stored`` too), an argument that is a plain column at its
    declared bounds reads the magnitude digit the copy stored for it
    (``stored_digit_columns``: the same expression, evaluated when the copy was built);
    ``digits=False`` computes it per row instead (the same cells: ``benchmarks.choice_cells``
    compares the two).

    ``part`` = (above, K): only the units of the copy with ``__chorus_unit_rows > K``
    (``above``) or ``<= K``, a conjunct of the copy's direct reader.  The stored count is the
    same on every row of a unit, so a part keeps or drops whole units: each unit's windows,
    mark and weights are those of the whole statement, and the two parts' cells add up to
    its cells (``kinds.selection.cells``; Postgres runs them side by side, a window being one
    process's work there).  Over the twin each part is one range of its index.

    >>> from sqlglot import parse_one
    >>> from chorus_py.policy import TablePolicy
    >>> tp = TablePolicy(privacy_unit="u", max_rows_per_unit=5,
    ...                  columns={"u": {"type": "int"}, "x": {"type": "float"}})
    >>> q = AggregateQuery("t", "t", tp, None, (), (), (), None, (), None, None, 5, False, None)
    >>> x = ClippedArgument("t.x", parse_one("t.x"), 0, 10)
    >>> print(choice_histogram(q, [(x, (10.0, 5.0))], (1, 2, 4, 5), None, None,
    ...                        ("p", "t__ranked_x")).sql())  # doctest: +NORMALIZE_WHITESPACE
    SELECT c.k AS k, SUM(c.wc) AS wc, SUM(c.w0) AS w0 FROM (SELECT (LEAST(r.n, 5)) * 4 + CASE
    WHEN r.m0 IS NULL THEN 3 ELSE CASE WHEN r.m0 >= 10.0 THEN 0 WHEN r.m0 >= 5.0 THEN 1 ELSE 2
    END END AS k, r.wc, r.w0 FROM (SELECT t.__chorus_unit_rows AS n, CASE WHEN t.__chorus_rank
    = 1 THEN 1 ELSE 0 END AS wc, ABS(CASE WHEN t.x < 0 THEN 0 WHEN t.x > 10 THEN 10 ELSE t.x
    END) AS m0, CASE WHEN t.x IS NULL THEN NULL ELSE CAST(1 AS DOUBLE)
    / t.__chorus_unit_rows END AS w0 FROM p."t__ranked_x" AS t) AS r) AS c GROUP BY c.k
    """
    unit = query.privacy_unit
    if unit is None:
        raise ValueError("a cap histogram needs a privacy unit")
    alias = query.alias
    one = exp.cast(exp.Literal.number(1), exp.DType.DOUBLE)
    values = [safety(a.argument) for a, _ in arguments]
    # The magnitude digit a ranked copy stores for a plain column at its declared bounds
    # (``stored_digit_columns``): read instead of computed per row.
    found = [stored_digit(query.table_policy, a.argument, alias, a.lower, a.upper)
             if digits and (stored is not None or copy is not None) else None
             for a, _ in arguments]
    # Every tree placed below is built here and placed once: no builder needs to copy it.
    magnitudes = [exp.alias_(exp.column(digit, table=alias), f"d{i}", copy=False)
                  if digit is not None else
                  exp.alias_(exp.Abs(this=clipping(copy_tree(v), a.lower, a.upper, consume=True)),
                             f"m{i}", copy=False)
                  for i, (v, (a, _), digit) in enumerate(zip(values, arguments, found,
                                                             strict=True))]
    if stored is not None:
        size: exp.Expr = exp.column(UNIT_ROWS, table=alias)
        per_unit = [exp.alias_(size.copy(), "n", copy=False),
                    exp.alias_(_mark(exp.column(RANK, table=alias)), CAP_WEIGHT, copy=False)]
        weights = [exp.Div(this=one.copy(), expression=size.copy()) for _ in values]
        source = filtered_rows(query, restriction, None, stored)
        # The direct reader of the copy (its WHERE: the claimed blocks) computes every column.
        reader = source.select(*per_unit, *magnitudes, copy=False, append=False)
    else:
        if copy is not None and sample is not None:
            raise ValueError("the cells read a stored sample or the ranked copy, not both")
        # Over the twin in unit order, partitioned by the copy's own row count then the unit:
        # the same partitions (the count is the same on every row of a unit), in the order the
        # twin is stored (Postgres reads its index in that order and sorts nothing).
        partition = [exp.column(unit, table=alias)]
        if copy is not None and copy[1].endswith(UNIT_ORDER):  # the twin (copies: 16 hex)
            partition.insert(0, exp.column(UNIT_ROWS, table=alias))

        def by_unit(agg: exp.Expr) -> exp.Window:
            return exp.Window(this=agg, partition_by=[p.copy() for p in partition])
        if copy is not None:
            # The windows in the copy's direct reader (they see the rows its WHERE keeps), the
            # mark on the row of the unit's least stored rank (one per unit: the ranks 1..n_u
            # are distinct within it), a partition-wide MIN the counts' window computes with
            # them, where ROW_NUMBER numbers the rows one by one (1M demo trips, DuckDB:
            # 128 -> 91 ms; Postgres even).
            least = exp.Window(this=exp.Min(this=exp.column(RANK, table=alias)),
                               partition_by=[p.copy() for p in partition])
            marked = _mark(exp.column(RANK, table=alias), least)
        else:
            # Unordered, the mark shares the counts' window (Spark gets it ordered by the unit,
            # a tie: rewriters.dialect).
            marked = _mark(by_unit(exp.RowNumber()))
        per_unit = [exp.alias_(by_unit(exp.Count(this=exp.Star())), "n", copy=False),
                    exp.alias_(marked, CAP_WEIGHT, copy=False)]
        weights = [exp.Div(this=one.copy(), expression=by_unit(exp.Count(this=copy_tree(v))))
                   for v in values]
        rows = filtered_rows(query, restriction, sample, copy)
        if part is not None:
            if copy is None:
                raise ValueError("a part of the cells reads the ranked copy's stored counts")
            above, middle = part
            size = exp.column(UNIT_ROWS, table=alias)
            middle_literal = exp.Literal.number(middle)
            rows = rows.where(exp.GT(this=size, expression=middle_literal) if above
                              else exp.LTE(this=size, expression=middle_literal), copy=False)
        if copy is not None:
            reader = rows.select(*per_unit, *magnitudes, copy=False, append=False)
        else:
            reader = exp.select(*per_unit, *magnitudes, copy=False).from_(
                rows.subquery(alias, copy=False), copy=False)
    for i, (value, weight) in enumerate(zip(values, weights, strict=True)):
        # A NULL value has no weight (nor bin): its unit's other values share the 1.  The CASE
        # also keeps 1 / COUNT(x) from being evaluated for a unit with no value (0).  The
        # value's last use: placed as it is (``safety`` made it for this statement).
        reader = reader.select(exp.alias_(exp.Case(
            ifs=[exp.If(this=exp.Is(this=value, expression=exp.Null()),
                        true=exp.Null())], default=weight), value_weight(i), copy=False),
            copy=False)
    # One integer key per cell, min(c_u, limit) then each argument's bin as digits (radix
    # cell_base), so the database groups by one column (Postgres then hashes a few thousand
    # groups instead of sorting every row on several keys) and no CASE bins c_u per row: the
    # proxy splits the key (``kinds.selection.cells``).
    # ignore_nulls: LEAST as Postgres has it, without the NULL test sqlglot writes around
    # DuckDB's LEAST per row (n, a count or the copy's stored row count, is never NULL).
    key: exp.Expr = exp.Least(this=exp.column("n", table="r"),
                              expressions=[exp.Literal.number(starts[-1])], ignore_nulls=True)
    for i, (_, edges) in enumerate(arguments):
        if found[i] is not None:  # the copy's own: read as it was stored
            digit: exp.Expr = exp.column(f"d{i}", table="r")
        else:
            digit = magnitude_digit(lambda i=i: exp.column(f"m{i}", table="r"), edges)
        key = exp.Add(this=exp.Mul(this=exp.Paren(this=key),
                                   expression=exp.Literal.number(cell_base(edges))),
                      expression=digit)
    weighted = [CAP_WEIGHT, *[value_weight(i) for i in range(len(arguments))]]
    cells = exp.select(exp.alias_(key, CELL, copy=False),
                       *[exp.column(w, table="r") for w in weighted], copy=False
                       ).from_(reader.subquery("r", copy=False), copy=False)
    return (exp.select(exp.alias_(exp.column(CELL, table="c"), CELL, copy=False),
                       *[exp.alias_(exp.Sum(this=exp.column(w, table="c")), w, copy=False)
                         for w in weighted], copy=False)
            .from_(cells.subquery("c", copy=False), copy=False)
            .group_by(exp.column(CELL, table="c"), copy=False))


def _mark(number: exp.Expr, first: exp.Expr | None = None) -> exp.Case:
    """``CASE WHEN number = first THEN 1 ELSE 0 END`` (``first`` 1 when not given): 1 on the
    one row of its unit whose row number (or stored rank) is the first, 0 on the others
    (``choice_histogram``'s cap weight)."""
    return exp.Case(ifs=[exp.If(this=exp.EQ(
        this=number, expression=exp.Literal.number(1) if first is None else first),
        true=exp.Literal.number(1))], default=exp.Literal.number(0))


def magnitude_digit(magnitude: Callable[[], exp.Expr], edges: Sequence[float]) -> exp.Case:
    """A value's digit in ``choice_histogram``'s cell key: ``len(edges) + 1`` where its
    magnitude (``magnitude()``, a fresh tree each call) is NULL, else its bin over ``edges``
    (largest first, ``_bin_search``)."""
    return exp.Case(ifs=[exp.If(this=exp.Is(this=magnitude(), expression=exp.Null()),
                                true=exp.Literal.number(len(edges) + 1))],
                    default=_bin_search(magnitude, edges, 0, len(edges)))


def _bin_search(magnitude: Callable[[], exp.Expr], edges: Sequence[float], lo: int, hi: int
                ) -> exp.Expr:
    """The first j in [lo, hi) with magnitude >= edges[j] (edges decreasing), else hi: the bin
    of ``value_histogram``'s CASE, found by bisection (about log2(len(edges)) comparisons per
    row instead of up to len(edges)).  ``magnitude()`` makes a fresh tree for each comparison
    (a tree's copy, deepcopy, costs 10 times as much as a fresh column).

    >>> print(_bin_search(lambda: exp.column("m"), (8.0, 4.0, 2.0, 1.0), 0, 4).sql())
    CASE WHEN m >= 2.0 THEN CASE WHEN m >= 8.0 THEN 0 WHEN m >= 4.0 THEN 1 ELSE 2 END ELSE CASE WHEN m >= 1.0 THEN 3 ELSE 4 END END
    """
    def at_least(j: int) -> exp.GTE:
        return exp.GTE(this=magnitude(), expression=exp.Literal.number(edges[j]))

    if hi - lo <= 2:
        return exp.Case(ifs=[exp.If(this=at_least(j), true=exp.Literal.number(j))
                             for j in range(lo, hi)],
                        default=exp.Literal.number(hi))
    mid = (lo + hi) // 2
    # magnitude >= edges[mid]: the answer is at most mid (every later edge is smaller).
    return exp.Case(ifs=[exp.If(this=at_least(mid), true=_bin_search(magnitude, edges, lo, mid))],
                    default=_bin_search(magnitude, edges, mid + 1, hi))


#: The prefix of a ranked copy's stored magnitude digits: ``__chorus_mag<i>`` for the i-th
#: column of ``rewriters.bins.stored_bins``.
STORED_DIGIT = "__chorus_mag"


def stored_digit_columns(policy: TablePolicy, alias: str) -> list[exp.Expr]:
    """The magnitude digits a ranked copy stores, over the table's rows as ``alias``: for each
    bounded numeric column v (``rewriters.bins.stored_bins``, declared [lower, upper]), a
    SMALLINT, ``magnitude_digit`` of ``ABS(clip(v, lower, upper))`` over the edges of the
    declared bounds: the very expression ``choice_histogram`` computes for a plain column at
    those bounds, evaluated by the same database on the same value, so every row's digit,
    NULL, NaN and infinities included, is the one the statement would compute (its cell, and
    with it the histograms and their sensitivity, unchanged).  Computing it was most of a
    filtered query's choices statement after its windows (1M demo trips, two columns: DuckDB
    103-117 -> 72-88 ms).  The copy's name covers them (``chorus_py.stores.samples``)."""
    out: list[exp.Expr] = []
    for i, (name, lower, upper) in enumerate(stored_bins(policy)):
        edges = magnitude_edges(max(abs(lower), abs(upper)))

        def magnitude(name: str = name, lower: float = lower, upper: float = upper
                      ) -> exp.Expr:
            return exp.Abs(this=clipping(exp.column(name, table=alias, quoted=True), lower,
                                         upper, consume=True))
        out.append(exp.alias_(exp.cast(magnitude_digit(magnitude, edges), exp.DType.SMALLINT),
                              f"{STORED_DIGIT}{i}"))
    return out


def stored_digit(policy: TablePolicy, argument: exp.Expr, alias: str, lower: float,
                 upper: float) -> str | None:
    """The name of the ranked copy's stored magnitude digit of ``argument`` when it is a plain
    column of the table (``alias.column``) clipped at its declared bounds, as the copy's was;
    None otherwise (the statement computes the digit)."""
    found = stored_column(policy, argument, alias)
    if found is None or found[1:] != (float(lower), float(upper)):
        return None
    return f"{STORED_DIGIT}{found[0]}"
