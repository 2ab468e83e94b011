"""Contribution bounding: keep at most k random rows of every privacy unit, in SQL.

After it, adding or removing one unit changes at most k rows of the relation, which is what the
sensitivities in ``analyses.sensitivity`` assume.  The rows kept are chosen by a random rank that
is independent of the row contents.  The random number is computed in an inner projection because
DuckDB refuses a volatile expression inside a window's ORDER BY.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlglot import exp

from analyses.trees import copy_tree, select_star

RAND = "__chorus_rand"
RANK = "__chorus_rank"
GROUP_RAND = "__chorus_grand"
GROUP_SCORE = "__chorus_gscore"
GROUP_RANK = "__chorus_grank"
GROUP_KEY = "__chorus_gk"
UNIT_ROWS = "__chorus_unit_rows"  # a ranked copy's count of its unit's rows (ranked_table)
KEPT_RANK = "__chorus_krank"  # a row's rank among its unit's filtered rows (ranked_contribution)
#: A DuckDB ranked copy's row position in its twin's order (unit row count, unit, stored rank).
POSITION = "__chorus_pos"
#: And the position of its unit's first row there: one number per unit's run of rows.
RUN = "__chorus_run"
GROUP_KEPT = "gk"  # the alias of a ranked copy's group-bounded rows (ranked_group_parts)
#: A ranked copy's twin: the same rows and columns stored in unit order, ``<copy name>_u``.
UNIT_ORDER = "_u"
#: A ranked copy's calendar month of its row's block column (``rewriters.blocks.month_sql``).
MONTH = "__chorus_month"
#: Its month twin: the same rows and columns stored by month, then in unit order.
MONTH_ORDER = "_m"


def unit_ordered(copy: str) -> str:
    """The name of the twin of the ranked copy ``copy``: the copy's rows (every column, the
    stored ranks and unit counts included) sorted by the unit's row count, then unit, then
    stored rank (``chorus_py.stores.samples``).  The heavy branch ranks its filtered rows in that very
    order, so the engine meets each unit's rows one after the other instead of scattered over
    the blocks (DuckDB's per-unit top-k state stays hot; Postgres sorts rows nearly sorted).

    >>> unit_ordered("trips__ranked_0123456789abcdef")
    'trips__ranked_0123456789abcdef_u'
    """
    return f"{copy}{UNIT_ORDER}"


def month_ordered(copy: str) -> str:
    """The name of the month twin of the ranked copy ``copy``: the copy's rows (every column)
    sorted by their month (``__chorus_month``), then as the twin, by the unit's row count, unit
    and stored rank (``chorus_py.stores.samples``).  In one month, each unit's rows are one run
    in stored-rank order, as in the twin, and a month's rows lie together: the heavy branch of
    a query over one month's blocks reads only them (``ranked_branches``' ``month``), where
    the twin holds every month's rows of a unit together and is read whole.  On DuckDB its
    ``__chorus_pos`` numbers the rows in its own order (``streamed_rank`` checks it); on
    Postgres it is partitioned by month, each partition in the twin's order and indexed so.

    >>> month_ordered("trips__ranked_0123456789abcdef")
    'trips__ranked_0123456789abcdef_m'
    """
    return f"{copy}{MONTH_ORDER}"


def contribution(rows: exp.Select, unit: str, k: int) -> exp.Select:
    """Wrap ``rows`` (a SELECT of one table's rows) so each ``unit`` keeps at most ``k`` rows.

    >>> from sqlglot import parse_one
    >>> contribution(parse_one("SELECT t.* FROM trips AS t"), "rider_id", 3).sql("duckdb")
    'SELECT * FROM (SELECT r.*, ROW_NUMBER() OVER (PARTITION BY r.rider_id ORDER BY r.__chorus_rand) AS __chorus_rank FROM (SELECT t.*, RANDOM() AS __chorus_rand FROM trips AS t) AS r) AS b WHERE b.__chorus_rank <= 3'
    """
    if k < 1:
        raise ValueError("k must be >= 1")
    # One copy of the caller's rows; every tree after it is this function's own, so the
    # builders below need not copy again.
    randomised = rows.copy().select(exp.alias_(exp.Rand(), RAND), copy=False)
    ranked = exp.select(
        exp.Column(this=exp.Star(), table=exp.to_identifier("r")),
        exp.alias_(
            exp.Window(
                this=exp.RowNumber(),
                partition_by=[exp.column(unit, table="r")],
                order=exp.Order(expressions=[exp.Ordered(this=exp.column(RAND, table="r"))]),
            ),
            RANK,
        ),
    ).from_(randomised.subquery("r", copy=False), copy=False)
    return (
        select_star(ranked.subquery("b", copy=False))
        .where(exp.column(RANK, table="b") <= exp.Literal.number(k), copy=False)
    )


def group_bound(rows: exp.Select, unit: str, keys: Sequence[exp.Expr], g: int,
                draw: exp.Expr | None = None) -> exp.Select:
    """Wrap ``rows`` so each ``unit`` keeps its rows in at most ``g`` of its groups.

    The groups are the distinct values of ``keys`` (expressions over the rows' table alias).
    Every row draws a random number; a (unit, group) pair scores the smallest draw of its rows
    (a MIN window), and the unit's groups are ranked by (score, key values) with DENSE_RANK, so
    the rows of one group share a rank and two groups never do (the keys break ties between
    equal draws).  Rows of a group ranked above g are dropped: the unit's g groups are a random
    choice among its own, independent of every other unit and of the row contents.  After it,
    adding or removing a unit changes rows in at most g groups; applied before the row cap
    (``contribution``), the unit keeps at most k rows within those g groups.  ``draw``: the
    rows' draw instead of a fresh RANDOM() (a ranked copy's stored rank, ``ranked_group_parts``);
    whatever the draw, the DENSE_RANK on (score, keys) gives distinct groups distinct ranks, so
    at most g groups pass.

    >>> from sqlglot import parse_one
    >>> print(group_bound(parse_one("SELECT t.* FROM trips AS t"), "rider_id",
    ...                   [parse_one("t.city")], 2).sql("duckdb"))  # doctest: +NORMALIZE_WHITESPACE
    SELECT * FROM (SELECT s.*, DENSE_RANK() OVER (PARTITION BY s.rider_id ORDER BY
    s.__chorus_gscore, s.__chorus_gk0) AS __chorus_grank FROM (SELECT r.*,
    MIN(r.__chorus_grand) OVER (PARTITION BY r.rider_id, r.__chorus_gk0) AS __chorus_gscore
    FROM (SELECT t.*, t.city AS __chorus_gk0, RANDOM() AS __chorus_grand FROM trips AS t) AS r)
    AS s) AS gb WHERE gb.__chorus_grank <= 2
    """
    if g < 1:
        raise ValueError("g must be >= 1")
    ranked = group_ranks(rows, unit, keys, draw)
    return (select_star(ranked.subquery("gb", copy=False))
            .where(exp.column(GROUP_RANK, table="gb") <= exp.Literal.number(g), copy=False))


def group_ranks(rows: exp.Select, unit: str, keys: Sequence[exp.Expr],
                draw: exp.Expr | None = None) -> exp.Select:
    """Every row of ``rows`` with its group's rank among its unit's groups (``group_bound``
    before its ``<= g``): the keys as ``__chorus_gk<i>``, the draw (fresh RANDOM(), or
    ``draw``), the group's score (the smallest draw of its rows) and ``__chorus_grank``, the
    DENSE_RANK of (score, keys) per unit.  ``rows`` is not changed."""
    if not keys:
        raise ValueError("a groups-per-unit bound needs group keys")
    names = [f"{GROUP_KEY}{i}" for i in range(len(keys))]
    randomised = rows.copy().select(
        *[exp.alias_(key.copy(), name, copy=False)
          for key, name in zip(keys, names, strict=True)],
        exp.alias_(exp.Rand() if draw is None else draw, GROUP_RAND), copy=False)
    scored = exp.select(
        exp.Column(this=exp.Star(), table=exp.to_identifier("r")),
        exp.alias_(exp.Window(
            this=exp.Min(this=exp.column(GROUP_RAND, table="r")),
            partition_by=[exp.column(unit, table="r"), *[exp.column(n, table="r") for n in names]],
        ), GROUP_SCORE),
    ).from_(randomised.subquery("r", copy=False), copy=False)
    return exp.select(
        exp.Column(this=exp.Star(), table=exp.to_identifier("s")),
        exp.alias_(exp.Window(
            this=exp.func("DENSE_RANK"),
            partition_by=[exp.column(unit, table="s")],
            order=exp.Order(expressions=[exp.Ordered(this=exp.column(GROUP_SCORE, table="s")),
                                         *[exp.Ordered(this=exp.column(n, table="s"))
                                           for n in names]]),
        ), GROUP_RANK),
    ).from_(scored.subquery("s", copy=False), copy=False)


def sample_table(table: str, unit: str, k: int, where: exp.Expr | None = None,
                 stored: Sequence[exp.Expr] = ()) -> exp.Select:
    """The rows of ``table`` (those satisfying ``where``, over alias ``t``, if given) that
    contribution bounding keeps, for the proxy to store once; with ``stored`` (over ``t``:
    ``rewriters.clipping.stored_clip_columns``), each row's values of those too.

    >>> sample_table("trips", "rider_id", 2).sql("duckdb")
    'SELECT * FROM (SELECT r.*, ROW_NUMBER() OVER (PARTITION BY r.rider_id ORDER BY r.__chorus_rand) AS __chorus_rank FROM (SELECT t.*, RANDOM() AS __chorus_rand FROM trips AS t) AS r) AS b WHERE b.__chorus_rank <= 2'
    """
    rows = exp.select(exp.Column(this=exp.Star(), table=exp.to_identifier("t"))).from_(
        exp.Table(this=exp.to_identifier(table), alias=exp.TableAlias(this=exp.to_identifier("t"))))
    if where is not None:
        rows = rows.where(where, copy=False)
    if stored:
        rows = rows.select(*stored, copy=False)
    return contribution(rows, unit, k)


def ranked_table(table: str, unit: str, where: exp.Expr | None = None,
                 bins: Sequence[exp.Expr] = (), positions: bool = False,
                 month: exp.Expr | None = None) -> exp.Select:
    """Every row of ``table`` (those satisfying ``where``, over alias ``t``) with its random rank
    in its unit (``__chorus_rank``, 1..n_u, a uniformly random order independent of the row
    contents) and its unit's row count n_u (``__chorus_unit_rows``), for the proxy to store
    once per table version (``chorus_py.stores.samples``, ranked copies); with ``bins``
    (``rewriters.bins.stored_bin_columns`` over ``t``), each row's quantile bins too; with
    ``positions``, each row's position 1..N in the order of the copy's twin (unit row count,
    unit, stored rank: ``__chorus_pos``, distinct) and the position of its unit's first row
    there (``__chorus_run``), which ``streamed_rank`` reads; with
    ``month`` (over ``t``: ``rewriters.blocks.month_sql`` of the block column), each row's
    month as ``__chorus_month``, by which the month twin is stored (``month_ordered``).

    >>> print(ranked_table("trips", "rider_id").sql("duckdb"))  # doctest: +NORMALIZE_WHITESPACE
    SELECT r.*, ROW_NUMBER() OVER (PARTITION BY r.rider_id ORDER BY r.__chorus_rand) AS
    __chorus_rank, COUNT(*) OVER (PARTITION BY r.rider_id) AS __chorus_unit_rows FROM (SELECT
    t.*, RANDOM() AS __chorus_rand FROM trips AS t) AS r
    """
    rows = exp.select(exp.Column(this=exp.Star(), table=exp.to_identifier("t"))).from_(
        exp.Table(this=exp.to_identifier(table), alias=exp.TableAlias(this=exp.to_identifier("t"))))
    if where is not None:
        rows = rows.where(where, copy=False)
    months = [] if month is None else [exp.alias_(month, MONTH)]
    randomised = rows.select(*bins, *months, exp.alias_(exp.Rand(), RAND), copy=False)
    partition = [exp.column(unit, table="r")]
    ranked = exp.select(
        exp.Column(this=exp.Star(), table=exp.to_identifier("r")),
        exp.alias_(exp.Window(this=exp.RowNumber(), partition_by=partition,
                              order=exp.Order(expressions=[
                                  exp.Ordered(this=exp.column(RAND, table="r"))])), RANK,
                   copy=False),
        exp.alias_(exp.Window(this=exp.Count(this=exp.Star()),
                              partition_by=[p.copy() for p in partition]), UNIT_ROWS,
                   copy=False),
    ).from_(randomised.subquery("r", copy=False), copy=False)
    if not positions:
        return ranked
    order = [exp.Ordered(this=exp.column(c, table="s"), nulls_first=False)
             for c in (UNIT_ROWS, unit, RANK)]
    position = exp.Window(this=exp.RowNumber(), order=exp.Order(expressions=order))
    # A unit's rows hold the positions f .. f + n_u - 1 in that order, its stored ranks
    # 1 .. n_u (a ROW_NUMBER over the unit) in the same order: the run's first position is
    # pos - rank + 1 on each of them.
    run = exp.Add(this=exp.Sub(this=position.copy(), expression=exp.column(RANK, table="s")),
                  expression=exp.Literal.number(1))
    return exp.select(
        exp.Column(this=exp.Star(), table=exp.to_identifier("s")),
        exp.alias_(position, POSITION, copy=False),
        exp.alias_(run, RUN, copy=False),
    ).from_(ranked.subquery("s", copy=False), copy=False)


def stored_rank_contribution(rows: exp.Select, alias: str, k: int) -> exp.Select:
    """Keep at most ``k`` rows per unit of ``rows`` (``SELECT alias.* FROM <ranked copy> AS
    alias WHERE <claimed blocks>``) when every row of the copy passes the query's filter: the
    rows of stored rank ``__chorus_rank <= k``, by a plain scan.

    The stored ranks are a uniformly random order of each unit's rows (``ranked_table``), so
    these are k random rows of the unit, or all of its n_u <= k rows: exactly the rows
    ``ranked_contribution`` keeps when no row is filtered out (its heavy branch ranks the
    stored order, its light branch keeps n_u <= k rows), without its UNION ALL and window.
    Each unit has one row of each rank, hence at most k rows here: stability k.

    >>> from sqlglot import parse_one
    >>> print(stored_rank_contribution(parse_one("SELECT t.* FROM p.trips__ranked_x AS t"),
    ...       "t", 5).sql("duckdb"))
    SELECT t.* FROM p.trips__ranked_x AS t WHERE t.__chorus_rank <= 5
    """
    if k < 1:
        raise ValueError("k must be >= 1")
    return rows.where(exp.column(RANK, table=alias) <= exp.Literal.number(k), copy=False)


def counted_pays(dialect: str, k: int, twin: bool) -> bool:
    """Whether the heavy branch of ``ranked_branches`` numbers its rows by a running count
    (``counted``) rather than ``ROW_NUMBER()``: on DuckDB, with a cap 4 <= k <= 20, reading
    the copy (not its twin).

    DuckDB 2.0.1's optimizer ``top_n_window_elimination`` plans ``ROW_NUMBER() OVER (PARTITION
    BY unit ORDER BY rank) ... <= k`` as a per-unit top-k hash aggregate, which the count (a
    plain window: a sort of the heavy rows) escapes.  Measured over the copy, stored in block
    order (``benchmarks.kept_rank``, 1M demo trips, #7's filtered rows, four runs): the
    aggregate is 1.7-2x faster at k = 1, even to 1.4x slower at k = 2, 1.2-2.3x slower at
    k = 4, 9 and 20 in every run, mixed at k = 81 (0.8-1.2x) and even at k = 200 (the heavy
    branch is a few units).  Over the twin, in unit order, and over all rows of the copy (a
    whole-table histogram, which reads the twin), the aggregate is as fast or faster at low
    caps, so there ROW_NUMBER stays.  Postgres and Spark have no such rewrite: ROW_NUMBER.

    >>> counted_pays("duckdb", 9, False), counted_pays("duckdb", 2, False)
    (True, False)
    >>> counted_pays("duckdb", 81, False), counted_pays("duckdb", 9, True)
    (False, False)
    >>> counted_pays("postgres", 9, False)
    False
    """
    return dialect == "duckdb" and 4 <= k <= 20 and not twin


def presorted_pays(dialect: str, twin: bool) -> bool:
    """Whether the heavy branch, reading the ranked copy's ``twin``, partitions its window by
    the unit's row count and the unit (``kept_rank``'s ``size``): on Postgres, whose twin is
    stored and indexed in that very order (unit row count, unit, stored rank), so the planner
    reads the heavy units' rows through the index already in the window's order and sorts
    nothing.  Partitioned by the unit alone, the same rows went through a sort that spilled
    to disk: 1M demo trips, the heavy rows of an AVG over most of the table at cap 9, 181-202
    -> 118-121 ms.  DuckDB's windows sort (or hash) either way.

    >>> presorted_pays("postgres", True), presorted_pays("postgres", False)
    (True, False)
    >>> presorted_pays("duckdb", True)
    False
    """
    return twin and dialect == "postgres"


def positions_stored(dialect: str) -> bool:
    """Whether the ranked copies of ``dialect`` store ``__chorus_pos`` (``ranked_table``'s
    ``positions``), which ``streamed_rank`` checks: DuckDB's.  (Postgres's heavy window
    already reads the twin's index in order; a Postgres seq scan may start mid-table.)"""
    return dialect == "duckdb"


def streamed_pays(dialect: str, twin: bool) -> bool:
    """Whether the heavy branch, reading the ranked copy's ``twin``, keeps each unit's first k
    filtered rows by ``streamed_rank`` (one pass in the twin's order, no per-unit state)
    rather than by a window partitioned by the unit: on DuckDB, whose copies store
    ``__chorus_pos`` (``chorus_py.stores.samples``).  Measured on 1M demo trips, the heavy
    rows of the corpus's filtered AVG / VARIANCE queries (caps 2-4, 340-440k rows): 31-35 ms
    with ROW_NUMBER (DuckDB's per-unit top-k) against 9.6-10.2 ms streamed on a busy
    machine, 14-25 against 10-15 ms (whole statements) on a quiet one
    (``benchmarks.streamed``), the same rows kept.

    >>> streamed_pays("duckdb", True), streamed_pays("duckdb", False)
    (True, False)
    >>> streamed_pays("postgres", True)
    False
    """
    return twin and positions_stored(dialect)


def streamed_rank(position: exp.Column, run: exp.Column, k: int) -> exp.Case:
    """TRUE for a row among the first ``k`` of its unit's run in the order the rows arrive,
    FALSE for the others, provided they arrive in the twin's order; a statement reading them
    in any other order fails:

        CASE WHEN pos <= LAG(pos, 1, 0) OVER () THEN ERROR('...')
             ELSE LAG(run, k, 0) OVER () <> run END

    Why it bounds.  ``pos`` (the copy's ``__chorus_pos``) is each row's place in the order
    (unit row count, unit, stored rank), distinct; ``run`` (``__chorus_run``) the place of
    its unit's first row there, one number per unit, >= 1 (a month twin, ``month_ordered``,
    numbers its own order by ``pos`` and keeps each unit's ``run``).  Both LAGs are of one window, ``OVER ()``: one sequence of
    the rows.  The first WHEN stops the statement unless ``pos`` strictly grows along it,
    i.e. unless the rows come in that order (a subsequence of it after the filter): then each
    unit's rows are one run, in stored-rank order.  In a run, the row k places before the
    i-th row is in the run iff i > k: the first k rows of the run get TRUE, the others FALSE
    (the row k places before a run's first rows belongs to another run, whose number
    differs, or is missing: 0, and runs start at 1).  So at most k rows per unit, the first
    k in stored-rank order: the rows ``kept_rank`` numbers 1..k (NULL units one unit, as a
    partition makes them), without its per-unit state.  DuckDB reads a relation in its
    stored order and runs such a window as a stream; were it ever to read them otherwise,
    the query fails instead of keeping more rows.  (Against comparing the unit itself, the
    row k places before with a presence test, three LAGs: the heavy branch of a filtered
    AVG 13.8 -> 11.1 ms, 255k rows, 1M demo trips.)

    >>> print(streamed_rank(exp.column("p", table="t"), exp.column("r", table="t"), 3).sql(
    ...     "duckdb"))  # doctest: +NORMALIZE_WHITESPACE
    CASE WHEN t.p <= LAG(t.p, 1, 0) OVER () THEN ERROR('chorus: rows out of unit order') ELSE
    LAG(t.r, 3, 0) OVER () <> t.r END
    """
    previous = exp.Window(this=exp.Lag(this=position, offset=exp.Literal.number(1),
                                       default=exp.Literal.number(0)), over="OVER")
    back = exp.Window(this=exp.Lag(this=run, offset=exp.Literal.number(k),
                                   default=exp.Literal.number(0)), over="OVER")
    return exp.Case(ifs=[
        exp.If(this=exp.LTE(this=position.copy(), expression=previous),
               true=exp.Anonymous(this="ERROR", expressions=[
                   exp.Literal.string(STREAM_ORDER_ERROR)]))],
        default=exp.NEQ(this=back, expression=run.copy()))


#: The message of a statement whose heavy rows did not arrive in the twin's order.
STREAM_ORDER_ERROR = "chorus: rows out of unit order"


def kept_rank(unit: exp.Column, rank: exp.Column, counted: bool,
              size: exp.Column | None = None) -> exp.Window:
    """A row's rank among its unit's rows ordered by the stored rank ``rank``: ``ROW_NUMBER()
    OVER (PARTITION BY unit ORDER BY rank)``, or, ``counted``, ``COUNT(*) OVER (PARTITION BY
    unit ORDER BY rank ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)``.  With ``size``
    (the ranked copy's ``__chorus_unit_rows`` of the same rows, ``presorted_pays``) the
    partition is (size, unit): the copy stores one count per unit, the same on all its rows,
    so the partitions are the unit's rows exactly as before, in the order of the twin's index.

    The two are the same number on every row: the running count of the rows from the
    partition's first to the current one, in a ROWS frame, is the current row's position
    1, 2, .., n_u (each once), whatever the ties; the stored ranks of a unit are distinct
    anyway (``ranked_table``: ROW_NUMBER over its rows), so both orders are the same one and
    ``<= k`` keeps the very same rows.  COUNT(*), not COUNT(x): a NULL x would not be counted
    and leave more than k rows at a count <= k.  (A RANGE frame, the default with ORDER BY,
    would count peers together; not used.)  The count is a shape DuckDB's top-N window
    optimizer does not rewrite (``counted_pays``).

    >>> print(kept_rank(exp.column("u", table="t"), exp.column("r", table="t"), True).sql(
    ...     "duckdb"))
    COUNT(*) OVER (PARTITION BY t.u ORDER BY t.r ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
    """
    order = exp.Order(expressions=[exp.Ordered(this=rank)])
    partition = [unit] if size is None else [size, unit]
    if not counted:
        return exp.Window(this=exp.RowNumber(), partition_by=partition, order=order)
    return exp.Window(this=exp.Count(this=exp.Star()), partition_by=partition, order=order,
                      spec=exp.WindowSpec(kind="ROWS", start="UNBOUNDED",
                                          start_side="PRECEDING", end="CURRENT ROW"))


def ranked_contribution(rows: exp.Select, alias: str, unit: str, k: int,
                        twin: bool = False, counted: bool = False,
                        light_twin: bool = False, presorted: bool = False,
                        streamed: bool = False, month: int | None = None) -> exp.Union:
    """Keep at most ``k`` rows per ``unit`` of ``rows`` (``SELECT alias.* FROM <ranked copy> AS
    alias WHERE <filter>``, a copy made by ``ranked_table``) without sorting the light units.

    A unit with n_u <= k rows in the whole copy has at most k rows after any filter: they are
    all kept, by a plain scan (the light branch).  Only the rows of heavier units are ranked
    after the filter, in their stored random order, and the first k kept (the heavy branch).
    The stored order restricted to the filtered rows is a uniformly random order of them, so
    the kept rows have the same distribution as ``contribution``'s (k random rows among the
    unit's filtered rows, or all of them when there are at most k): the same function of the
    data, the same stability k.  The branches are disjoint (n_u <= k, n_u > k) and both output
    the copy's columns and a rank (1 in the light branch; a streamed heavy branch's TRUE
    flag, and TRUE in the light branch), so UNION ALL lines them up.
    ``twin``: the heavy branch reads the copy's unit-ordered twin (``ranked_branches``);
    ``counted``: it numbers its rows by a running count (``kept_rank``, the same numbers);
    ``light_twin``: the light branch reads the twin too; ``presorted``: the heavy branch's
    window is partitioned by the unit's row count and the unit (``presorted_pays``);
    ``streamed``: the heavy branch keeps its rows by ``streamed_rank`` (``streamed_pays``);
    ``month``: it reads the month twin's rows of that month (``ranked_branches``).

    >>> from sqlglot import parse_one
    >>> print(ranked_contribution(parse_one("SELECT t.* FROM p.trips__ranked_x AS t WHERE t.fare > 3"),
    ...       "t", "rider_id", 5).sql("duckdb"))  # doctest: +NORMALIZE_WHITESPACE
    SELECT t.*, 1 AS __chorus_krank FROM p.trips__ranked_x AS t WHERE t.fare > 3 AND
    t.__chorus_unit_rows <= 5 UNION ALL SELECT * FROM (SELECT t.*, ROW_NUMBER() OVER
    (PARTITION BY t.rider_id ORDER BY t.__chorus_rank) AS __chorus_krank FROM p.trips__ranked_x
    AS t WHERE t.fare > 3 AND t.__chorus_unit_rows > 5) AS b WHERE b.__chorus_krank <= 5
    """
    light, heavy = ranked_branches(rows, alias, unit, k, twin, counted, light_twin, presorted,
                                   streamed, month)
    return exp.union(light, heavy, distinct=False, copy=False)


def ranked_branches(rows: exp.Select, alias: str, unit: str, k: int, twin: bool = False,
                    counted: bool = False, light_twin: bool = False, presorted: bool = False,
                    streamed: bool = False, month: int | None = None
                    ) -> tuple[exp.Select, exp.Select]:
    """The light and the heavy branch of ``ranked_contribution``, apart: the rows of the units
    with n_u <= k in the copy, and the first k filtered rows of each heavier unit.  Each unit
    is in exactly one of them, so aggregates of the two can be combined group by group
    (``rewriters.pipeline``, Postgres: each branch aggregated on its own).

    ``twin``: the heavy branch reads the copy's twin in unit order (``unit_ordered``) with the
    same filter.  It holds the copy's very rows, ranks and unit counts, so the heavy branch
    keeps the same rows (the first k filtered rows of each unit in the stored order, the same
    stability k); only the order in which the engine reads them changes.  The light branch
    reads the copy, stored in block order, so a query over a few blocks skips the others,
    unless ``light_twin``: then it reads the twin too, whose units are stored by their row
    counts, so its ``__chorus_unit_rows <= k`` skips the heavier units' rows (``kinds.single.
    light_twin_pays`` says when).  The same rows either way.  ``counted``: the heavy branch
    numbers its rows by a running count instead of ROW_NUMBER (``kept_rank``: the same
    numbers, so the same rows are kept).  ``presorted``: its window is partitioned by the
    unit's row count and the unit (``presorted_pays``: the same partitions, in the order of
    the twin's index).  ``streamed``: the heavy branch reads the twin in its stored order and
    keeps the first k rows of each unit's run (``streamed_rank``: the same rows, no window
    partitioned by the unit).  ``month`` (with ``twin``): every row the query may read lies
    in that calendar month (``rewriters.blocks.BlockRestriction.month``), so the heavy branch
    (and the light one with ``light_twin``) reads the month twin (``month_ordered``) with
    ``__chorus_month = month``: the month's rows only, in the twin's order within it (a
    filter the claimed blocks already imply: the same rows).

    >>> from sqlglot import parse_one
    >>> light, heavy = ranked_branches(parse_one("SELECT t.* FROM p.trips__ranked_x AS t "
    ...                                          "WHERE t.fare > 3"), "t", "rider_id", 2, True)
    >>> print(heavy.sql("duckdb"))  # doctest: +NORMALIZE_WHITESPACE
    SELECT * FROM (SELECT t.*, ROW_NUMBER() OVER (PARTITION BY t.rider_id ORDER BY
    t.__chorus_rank) AS __chorus_krank FROM p.trips__ranked_x_u AS t WHERE t.fare > 3 AND
    t.__chorus_unit_rows > 2) AS b WHERE b.__chorus_krank <= 2
    """
    if k < 1:
        raise ValueError("k must be >= 1")
    size = exp.column(UNIT_ROWS, table=alias)
    cap = exp.Literal.number(k)
    if (light_twin or presorted or streamed) and not twin:
        raise ValueError("the light branch reads the twin, and the window is presorted or "
                         "streamed, only when the heavy branch reads the twin")
    if streamed and (counted or presorted):
        raise ValueError("a streamed heavy branch numbers its rows by no window")
    if month is not None and not twin:
        raise ValueError("the heavy branch reads the month twin only where it reads a twin")
    # A streamed heavy branch flags its kept rows TRUE; the light branch keeps all its rows.
    kept_all = exp.Boolean(this=True) if streamed else exp.Literal.number(1)
    light = copy_tree(rows).select(exp.alias_(kept_all, KEPT_RANK), copy=False).where(
        exp.LTE(this=size, expression=cap), copy=False)
    heavy = copy_tree(rows)
    on_twin = [heavy, light] if light_twin else [heavy] if twin else []
    for branch in on_twin:
        source = branch.args["from_"].this
        ordered = month_ordered if month is not None else unit_ordered
        source.set("this", exp.to_identifier(ordered(source.name), quoted=source.this.quoted))
        if month is not None:
            branch.where(exp.EQ(this=exp.column(MONTH, table=alias),
                                expression=exp.Literal.number(month)), copy=False)
    numbered: exp.Expr
    if streamed:
        numbered = streamed_rank(exp.column(POSITION, table=alias), exp.column(RUN, table=alias),
                                 k)
    else:
        numbered = kept_rank(exp.column(unit, table=alias), exp.column(RANK, table=alias),
                             counted, exp.column(UNIT_ROWS, table=alias) if presorted else None)
    heavy = heavy.select(exp.alias_(numbered, KEPT_RANK), copy=False).where(
        exp.GT(this=size.copy(), expression=cap.copy()), copy=False)
    flag = exp.column(KEPT_RANK, table="b")
    kept = (select_star(heavy.subquery("b", copy=False))
            .where(flag if streamed else flag <= cap.copy(), copy=False))
    return light, kept


def ranked_group_contribution(rows: exp.Select, alias: str, unit: str,
                              keys: Sequence[exp.Expr], g: int, k: int) -> exp.Union:
    """``group_bound`` to ``g`` groups then ``contribution`` to ``k`` rows per ``unit`` of
    ``rows`` (``SELECT alias.* FROM <ranked copy> AS alias WHERE <filter>``): the three parts
    of ``ranked_group_parts`` as one relation, light UNION ALL middle UNION ALL heavy.  Every
    part outputs the copy's columns, then the group keys, the draw, the group score, the group
    rank and the kept rank, in that order: the light part carries NULLs and ranks of 1, the
    middle part a kept rank of 1, so UNION ALL lines them up by position (and by name).

    >>> from sqlglot import parse_one
    >>> print(ranked_group_contribution(parse_one("SELECT t.* FROM p.trips__ranked_x AS t "
    ...       "WHERE t.fare > 3"), "t", "rider_id", [parse_one("t.city")], 2, 5).sql("duckdb"))
    ... # doctest: +NORMALIZE_WHITESPACE
    SELECT t.*, NULL AS __chorus_gk0, NULL AS __chorus_grand, NULL AS __chorus_gscore,
    1 AS __chorus_grank, 1 AS __chorus_krank FROM p.trips__ranked_x AS t WHERE t.fare > 3 AND
    t.__chorus_unit_rows <= 2 UNION ALL SELECT gk.*, 1 AS __chorus_krank FROM (SELECT * FROM
    (SELECT s.*, DENSE_RANK() OVER (PARTITION BY s.rider_id ORDER BY s.__chorus_gscore,
    s.__chorus_gk0) AS __chorus_grank FROM (SELECT r.*, MIN(r.__chorus_grand) OVER (PARTITION
    BY r.rider_id, r.__chorus_gk0) AS __chorus_gscore FROM (SELECT t.*, t.city AS
    __chorus_gk0, t.__chorus_rank AS __chorus_grand FROM p.trips__ranked_x AS t WHERE (t.fare >
    3 AND t.__chorus_unit_rows > 2) AND t.__chorus_unit_rows <= 5) AS r) AS s) AS gb WHERE
    gb.__chorus_grank <= 2) AS gk UNION ALL SELECT * FROM (SELECT gk.*, ROW_NUMBER() OVER
    (PARTITION BY gk.rider_id ORDER BY gk.__chorus_rank) AS __chorus_krank FROM (SELECT * FROM
    (SELECT s.*, DENSE_RANK() OVER (PARTITION BY s.rider_id ORDER BY s.__chorus_gscore,
    s.__chorus_gk0) AS __chorus_grank FROM (SELECT r.*, MIN(r.__chorus_grand) OVER (PARTITION
    BY r.rider_id, r.__chorus_gk0) AS __chorus_gscore FROM (SELECT t.*, t.city AS
    __chorus_gk0, RANDOM() AS __chorus_grand FROM p.trips__ranked_x AS t WHERE t.fare > 3 AND
    t.__chorus_unit_rows > 5) AS r) AS s) AS gb WHERE gb.__chorus_grank <= 2) AS gk) AS b
    WHERE b.__chorus_krank <= 5
    """
    light, middle, heavy = ranked_group_parts(rows, alias, unit, keys, g, k)
    padding = [exp.alias_(exp.null(), f"{GROUP_KEY}{i}") for i in range(len(keys))]
    padding += [exp.alias_(exp.null(), GROUP_RAND), exp.alias_(exp.null(), GROUP_SCORE),
                exp.alias_(exp.Literal.number(1), GROUP_RANK),
                exp.alias_(exp.Literal.number(1), KEPT_RANK)]
    light = light.select(*padding, copy=False)
    middle = exp.select(exp.Column(this=exp.Star(), table=exp.to_identifier(GROUP_KEPT)),
                        exp.alias_(exp.Literal.number(1), KEPT_RANK)).from_(
        middle.subquery(GROUP_KEPT, copy=False), copy=False)
    return exp.union(exp.union(light, middle, distinct=False, copy=False), heavy,
                     distinct=False, copy=False)


def ranked_group_parts(rows: exp.Select, alias: str, unit: str, keys: Sequence[exp.Expr],
                       g: int, k: int) -> tuple[exp.Select, exp.Select, exp.Select]:
    """The rows ``group_bound`` (``g`` groups) then ``contribution`` (``k`` rows) keep of each
    ``unit`` of ``rows`` (``SELECT alias.* FROM <ranked copy> AS alias WHERE <filter>``), in
    three parts by the unit's row count n_u in the copy (``__chorus_unit_rows``, the same on
    all its rows): light (n_u <= g), middle (g < n_u <= k) and heavy (n_u > k).  Each unit is
    in exactly one part, so their aggregates add up group by group
    (``rewriters.pipeline.combine_branches``).

    Light: ``ranked_group_branches``'s light branch (n_u <= g rows: at most g groups, g < k
    rows, all kept by a plain scan).  Heavy: its heavy branch restricted to n_u > k (groups
    scored by fresh draws, then the first k kept rows in stored order).

    Middle: a unit of n_u <= k rows keeps at most k rows after any filter, so the row cap
    keeps them all and only the groups need choosing: ``group_bound`` with the stored rank as
    each row's draw, no fresh RANDOM() and no ROW_NUMBER.  The stored ranks of a unit are a
    uniformly random order of its rows, drawn once independently of the row contents
    (``ranked_table``), and restricted to the filtered rows a uniformly random order of them.
    A group's score is its first row in that order (MIN of its ranks), so the groups are
    ranked by their first appearance in a uniformly random order of the unit's rows; fresh
    draws rank them by the smallest of i.i.d. continuous uniforms, which orders the rows
    uniformly at random too: the kept g groups have the same distribution as
    ``group_bound``'s.  (Drawn once per copy, not per query: the same groups come back for
    the same rows, as the stored ranks' k rows already do.)  The ranks of a unit are distinct,
    so two of its groups never tie; the keys in the ORDER BY break ties anyway, so at most g
    groups pass whatever the draws.  (The heavy part may not score its groups by the stored
    ranks: its row cap reads the same order, ``ranked_group_branches``.)

    Every part keeps rows of a unit in at most g groups and at most k rows (light: n_u <= g;
    middle: DENSE_RANK <= g and n_u <= k; heavy: DENSE_RANK <= g and ROW_NUMBER <= k), chosen
    from its own rows and randomness independent of the data: the same stability k and g
    groups per unit as ``group_bound`` then ``contribution``.
    """
    if not 1 <= g < k:
        raise ValueError("a ranked copy's group bound needs 1 <= g < k")
    size = exp.column(UNIT_ROWS, table=alias)
    light = rows.copy().where(exp.LTE(this=size, expression=exp.Literal.number(g)), copy=False)
    middle_rows = rows.copy().where(
        exp.GT(this=size.copy(), expression=exp.Literal.number(g)), copy=False).where(
        exp.LTE(this=size.copy(), expression=exp.Literal.number(k)), copy=False)
    middle = group_bound(middle_rows, unit, keys, g, draw=exp.column(RANK, table=alias))
    return light, middle, ranked_group_heavy(rows, alias, unit, keys, g, k)


def ranked_group_heavy(rows: exp.Select, alias: str, unit: str, keys: Sequence[exp.Expr],
                       g: int, k: int) -> exp.Select:
    """``ranked_group_parts``' heavy part: the units of ``rows`` with n_u > ``k`` rows in the
    copy, bounded to ``g`` groups scored by fresh draws, then to their first ``k`` kept rows
    in the stored order (``rows`` itself is not changed)."""
    size = exp.column(UNIT_ROWS, table=alias)
    heavy = rows.copy().where(exp.GT(this=size, expression=exp.Literal.number(k)), copy=False)
    return _row_capped(group_bound(heavy, unit, keys, g), unit, k)


def ranked_group_branches(rows: exp.Select, alias: str, unit: str, keys: Sequence[exp.Expr],
                          g: int, k: int) -> tuple[exp.Select, exp.Select]:
    """The rows ``group_bound`` (``g`` groups) then ``contribution`` (``k`` rows) keep of each
    ``unit`` of ``rows`` (``SELECT alias.* FROM <ranked copy> AS alias WHERE <filter>``), in
    two branches (a quantile's histograms, ``rewriters.quantiles``; the answers read the three
    parts of ``ranked_group_parts``): the light one, the rows of the units with n_u <= g rows in the copy, and the
    heavy one, the kept rows of the others.  Each unit is in exactly one of them (n_u <= g,
    n_u > g: one literal), so their aggregates can be combined group by group
    (``rewriters.pipeline.combine_branches``); the light branch has only the copy's columns.

    Light: a unit with n_u <= g rows has at most g filtered rows, hence at most g groups and
    g < k rows: ``group_bound`` and ``contribution`` would keep them all, and so does a plain
    scan.  Heavy: ``group_bound`` as on the base table (each group scored by the smallest of
    fresh RANDOM() draws of its filtered rows, its g best kept), then the first k kept rows in
    the stored random order (``ROW_NUMBER() ... ORDER BY __chorus_rank <= k``).  The stored
    ranks are drawn independently of the fresh draws, and restricted to any set of rows they
    are a uniformly random order of it, so given the kept groups the first k of their rows are
    k uniformly random ones: the same distribution as ``contribution``'s fresh order.  (The
    stored rank must not also score the groups: the kept groups then depend on the same order,
    and the first kept row would be the unit's first filtered row, uniform over all its rows
    instead of over its kept groups' rows; a unit of rows a | b1 b2 b3 | c, g = 2, k = 1 keeps
    a with probability 1/5 instead of 13/80.)  Either way a unit keeps rows in at most g
    groups and at most k rows, and they depend on its own rows only: the same stability k and
    g groups per unit as ``group_bound`` then ``contribution``.
    """
    if not 1 <= g < k:
        raise ValueError("a ranked copy's group bound needs 1 <= g < k")
    size = exp.column(UNIT_ROWS, table=alias)
    light = rows.copy().where(exp.LTE(this=size, expression=exp.Literal.number(g)), copy=False)
    heavy = rows.copy().where(exp.GT(this=size.copy(), expression=exp.Literal.number(g)),
                              copy=False)
    return light, _row_capped(group_bound(heavy, unit, keys, g), unit, k)


def _row_capped(grouped: exp.Select, unit: str, k: int) -> exp.Select:
    """The first ``k`` rows of each ``unit`` of ``grouped`` (``group_bound``'s kept rows) in
    the copy's stored order."""
    order = exp.Order(expressions=[exp.Ordered(this=exp.column(RANK, table=GROUP_KEPT))])
    capped = exp.select(
        exp.Column(this=exp.Star(), table=exp.to_identifier(GROUP_KEPT)),
        exp.alias_(exp.Window(this=exp.RowNumber(),
                              partition_by=[exp.column(unit, table=GROUP_KEPT)], order=order),
                   KEPT_RANK, copy=False),
    ).from_(grouped.subquery(GROUP_KEPT, copy=False), copy=False)
    return (select_star(capped.subquery("b", copy=False))
            .where(exp.column(KEPT_RANK, table="b") <= exp.Literal.number(k), copy=False))
