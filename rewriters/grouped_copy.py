"""A ranked copy's grouped twin: the copy's rows with each unit's groups already ranked.

Keys released by a threshold with g < k groups per unit (``rewriters.contribution.
ranked_group_parts``) rank every unit's groups in each query: two windows over the rows of the
units of more than g rows, the most expensive part of such a query (a top-10 of drivers over
1M trips: 30x the raw query on DuckDB).  When every row of the copy passes the query's filter
(``whole``: it filters nothing but claimed blocks that cover the copy), those ranks are the same
in every query over the same keys: the middle part scores a unit's groups by the smallest stored
rank of their rows and ranks them with DENSE_RANK on (score, keys), all over the copy's rows.
So the proxy stores them once per copy and key columns (``chorus_py.stores.samples``), in a
relation named ``<copy>_g<digest of the key columns>`` with, beside every column of the copy:

- ``__chorus_gk0``, ``__chorus_gk1``, ...: the key columns' values (the ones ranked);
- ``__chorus_grand``: the row's draw, its stored rank (``rewriters.contribution.group_ranks``);
- ``__chorus_gscore``: the group's score, MIN(``__chorus_rank``) over the unit's rows in it;
- ``__chorus_grank``: ``DENSE_RANK() OVER (PARTITION BY unit ORDER BY __chorus_gscore,
  __chorus_gk0, ...)``, the group's rank among the unit's groups (distinct groups, distinct
  ranks: at most G groups have a rank <= G);
- ``__chorus_gfirst``: 1 on one row of each (unit, group), 0 on the others.

A query then reads its light and middle units (n_u <= k) by a plain scan, ``__chorus_unit_rows
<= k AND __chorus_grank <= g``, exactly the rows the light and middle parts keep (light units
have at most g groups, so all their ranks are <= g), and each group's count of distinct units as
``SUM(__chorus_gfirst)``: the kept groups of these units are kept whole, with the one marked row
of each (unit, group).  The heavy units (n_u > k) keep the per-query path
(``ranked_group_heavy``); the two parts add up (``rewriters.pipeline.combine_branches``).

Thresholded keys with no groups-per-unit bound (g >= k: the k rows reach at most k groups) over
the whole copy read the twin's rows of stored rank <= k, the copy's own kept rows, and count
each group's distinct units by the row whose rank is its (unit, group)'s score
(``first_kept_of_group``) instead of COUNT(DISTINCT unit), the costliest part of such a query.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from sqlglot import exp

from rewriters.contribution import (
    GROUP_KEY,
    GROUP_RANK,
    GROUP_SCORE,
    RANK,
    UNIT_ROWS,
    group_ranks,
)

GROUP_FIRST = "__chorus_gfirst"
#: The grouped twin of ``<copy>``: ``<copy>_g`` and 8 hex digits naming its key columns.
GROUPED_INFIX = "_g"


def grouped_name(copy: str, columns: Sequence[str]) -> str:
    """The name of the grouped twin of the ranked copy ``copy`` over the key ``columns`` (in
    the query's GROUP BY order: the ranks order groups by the keys in that order).

    >>> grouped_name("trips__ranked_0123456789abcdef", ["driver_id"])
    'trips__ranked_0123456789abcdef_g6b190237'
    """
    digest = hashlib.sha256("\0".join(columns).encode()).hexdigest()[:8]
    return f"{copy}{GROUPED_INFIX}{digest}"


def grouped_table(schema: str, copy: str, unit: str, columns: Sequence[str]) -> exp.Select:
    """The rows of the grouped twin (module docstring), built from the copy itself: the same
    rows, stored ranks and unit counts.

    >>> print(grouped_table("p", "trips__ranked_x", "rider_id", ["driver_id"]).sql("duckdb"))
    ... # doctest: +NORMALIZE_WHITESPACE
    SELECT gr.*, CASE WHEN ROW_NUMBER() OVER (PARTITION BY gr.rider_id, gr.__chorus_gk0) = 1
    THEN 1 ELSE 0 END AS __chorus_gfirst FROM (SELECT s.*, DENSE_RANK() OVER (PARTITION BY
    s.rider_id ORDER BY s.__chorus_gscore, s.__chorus_gk0) AS __chorus_grank FROM (SELECT r.*,
    MIN(r.__chorus_grand) OVER (PARTITION BY r.rider_id, r.__chorus_gk0) AS __chorus_gscore
    FROM (SELECT t.*, t.driver_id AS __chorus_gk0, t.__chorus_rank AS __chorus_grand FROM
    p.trips__ranked_x AS t) AS r) AS s) AS gr
    """
    if not columns:
        raise ValueError("a grouped twin needs key columns")
    source = exp.Table(this=exp.to_identifier(copy), db=exp.to_identifier(schema),
                       alias=exp.TableAlias(this=exp.to_identifier("t")))
    rows = exp.select(exp.Column(this=exp.Star(), table=exp.to_identifier("t"))).from_(
        source, copy=False)
    # The middle part's very ranks (ranked_group_parts): the stored rank as each row's draw.
    ranked = group_ranks(rows, unit, [exp.column(c, table="t") for c in columns],
                         draw=exp.column(RANK, table="t"))
    first = exp.Window(this=exp.RowNumber(), partition_by=[
        exp.column(unit, table="gr"),
        *[exp.column(f"{GROUP_KEY}{i}", table="gr") for i in range(len(columns))]])
    return exp.select(
        exp.Column(this=exp.Star(), table=exp.to_identifier("gr")),
        exp.alias_(exp.Case(ifs=[exp.If(this=exp.EQ(this=first, expression=exp.Literal.number(1)),
                                        true=exp.Literal.number(1))],
                            default=exp.Literal.number(0)), GROUP_FIRST, copy=False),
    ).from_(ranked.subquery("gr", copy=False), copy=False)


def stored_group_part(rows: exp.Select, alias: str, g: int, k: int) -> exp.Select:
    """The light and middle units' kept rows from the grouped twin: ``rows`` (``SELECT
    alias.* FROM <grouped twin> AS alias WHERE <claimed blocks>``) of the units of at most
    ``k`` rows, in their groups of rank at most ``g``.  Each unit keeps at most g groups (the
    ranks of distinct groups are distinct) and at most k rows (n_u <= k).

    >>> from sqlglot import parse_one
    >>> print(stored_group_part(parse_one("SELECT t.* FROM p.x_g1 AS t"), "t", 2, 5).sql())
    SELECT t.* FROM p.x_g1 AS t WHERE t.__chorus_unit_rows <= 5 AND t.__chorus_grank <= 2
    """
    if not 1 <= g < k:
        raise ValueError("a grouped twin's part needs 1 <= g < k")
    return rows.where(exp.column(UNIT_ROWS, table=alias) <= exp.Literal.number(k),
                      copy=False).where(
        exp.column(GROUP_RANK, table=alias) <= exp.Literal.number(g), copy=False)


def groups_per_unit(rows: exp.Select, alias: str, unit: str) -> exp.Select:
    """One row per unit of ``rows`` (``SELECT alias.* FROM <grouped twin> AS alias WHERE
    <claimed blocks>``, every row of the copy): its number of distinct groups G_u, the sum of
    its marks (one per group), for the groups histogram (``rewriters.selection.
    units_per_bin``) without grouping the (unit, key) pairs of every row.

    >>> from sqlglot import parse_one
    >>> print(groups_per_unit(parse_one("SELECT t.* FROM p.x_g1 AS t"), "t", "u").sql())
    SELECT SUM(t.__chorus_gfirst) AS c FROM (SELECT t.* FROM p.x_g1 AS t) AS t GROUP BY t.u
    """
    return exp.select(exp.alias_(first_of_group(alias), "c", copy=False)).from_(
        rows.subquery(alias, copy=False), copy=False).group_by(
        exp.column(unit, table=alias), copy=False)


def group_key_column(alias: str, column: str) -> exp.Column:
    """A key column of the grouped twin as a query groups by it: the column itself, whose
    values its ``__chorus_gk<i>`` stores.  The outgoing verifier knows the twin's keys only
    by the digest of their names in its name (``grouped_name``), so a GROUP BY of exactly
    these names, in order, shows that the groups are the stored ones (its marks count each
    unit once per group)."""
    return exp.column(column, table=alias)


def first_of_group(alias: str) -> exp.Sum:
    """``SUM(alias.__chorus_gfirst)``: the distinct units of a group among rows that keep
    their groups whole (``stored_group_part``)."""
    return exp.Sum(this=exp.column(GROUP_FIRST, table=alias))


def first_kept_of_group(alias: str, unit: str) -> exp.Count:
    """``COUNT(CASE WHEN alias.__chorus_rank = alias.__chorus_gscore THEN alias.unit END)``:
    the distinct units of each group among the grouped twin's rows of stored rank <= k (every
    row of the copy read, no groups per unit: ``rewriters.contribution.
    stored_rank_contribution``), with no COUNT(DISTINCT unit).

    ``__chorus_gscore`` is the smallest stored rank of the unit's rows in the group (the MIN
    over its (unit, keys) partition, ``grouped_table``), and a unit's stored ranks are distinct
    (1..n_u), so exactly one row of each (unit, group) has its rank equal to the score: the
    first of the pair in stored-rank order.  The pair has a row of rank <= k exactly when that
    first row's rank is <= k, so among the kept rows each (unit, group) with a kept row counts
    once, and no other: the group's distinct units.  A NULL unit is not counted (the CASE is
    NULL there), as COUNT(DISTINCT unit) skips it; NULL keys are one group in the partition as
    in GROUP BY.  The count is the key-release gate (and any COUNT(DISTINCT unit) of the
    query): the same number, so the same threshold and noise.  (1M demo trips, the top 5 of
    5,000 drivers by AVG(fare) at k = 3: the statement 16.6 -> 7.0 ms on DuckDB, 216 -> 106 ms
    on Postgres; raw 5.2 and 123 ms.)

    >>> print(first_kept_of_group("t", "u").sql())
    COUNT(CASE WHEN t.__chorus_rank = t.__chorus_gscore THEN t.u END)
    """
    return exp.Count(this=exp.Case(ifs=[exp.If(
        this=exp.EQ(this=exp.column(RANK, table=alias),
                    expression=exp.column(GROUP_SCORE, table=alias)),
        true=exp.column(unit, table=alias))]))
