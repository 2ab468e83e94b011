"""Contribution bounding: keep at most k random rows of every privacy unit, in SQL.

After it, adding or removing one unit changes at most k rows of the relation, which is what the
sensitivities in ``analyses.sensitivity`` assume.  The rows kept are chosen by a random rank that
is independent of the row contents.  The random number is computed in an inner projection because
DuckDB refuses a volatile expression inside a window's ORDER BY.
"""

from __future__ import annotations

from sqlglot import exp

RAND = "__chorus_rand"
RANK = "__chorus_rank"


def contribution(rows: exp.Select, unit: str, k: int) -> exp.Select:
    """Wrap ``rows`` (a SELECT of one table's rows) so each ``unit`` keeps at most ``k`` rows.

    >>> from sqlglot import parse_one
    >>> contribution(parse_one("SELECT t.* FROM trips AS t"), "rider_id", 3).sql("duckdb")
    'SELECT * FROM (SELECT r.*, ROW_NUMBER() OVER (PARTITION BY r.rider_id ORDER BY r.__chorus_rand) AS __chorus_rank FROM (SELECT t.*, RANDOM() AS __chorus_rand FROM trips AS t) AS r) AS b WHERE b.__chorus_rank <= 3'
    """
    if k < 1:
        raise ValueError("k must be >= 1")
    randomised = rows.copy().select(exp.alias_(exp.Rand(), RAND))
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
    ).from_(randomised.subquery("r"))
    return (
        exp.select("*")
        .from_(ranked.subquery("b"))
        .where(exp.column(RANK, table="b") <= exp.Literal.number(k))
    )


def sample_table(table: str, unit: str, k: int) -> exp.Select:
    """The rows of ``table`` that contribution bounding keeps, for the proxy to store once.

    >>> sample_table("trips", "rider_id", 2).sql("duckdb")
    'SELECT * FROM (SELECT r.*, ROW_NUMBER() OVER (PARTITION BY r.rider_id ORDER BY r.__chorus_rand) AS __chorus_rank FROM (SELECT t.*, RANDOM() AS __chorus_rand FROM trips AS t) AS r) AS b WHERE b.__chorus_rank <= 2'
    """
    rows = exp.select(exp.Column(this=exp.Star(), table=exp.to_identifier("t"))).from_(
        exp.Table(this=exp.to_identifier(table), alias=exp.TableAlias(this=exp.to_identifier("t"))))
    return contribution(rows, unit, k)
