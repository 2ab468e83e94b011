"""Property tests of the quantile parser (``analyses.quantiles``): every spelling of a quantile,
in both dialects, gives back its fraction (the complement under ORDER BY ... DESC), and the
substitution leaves one marked SUM per quantile."""

from __future__ import annotations

import pytest
import sqlglot
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from sqlglot import exp

from analyses.mixed import asks_mixed, plain_percentile, split_mixed
from analyses.quantiles import MAX_P, MIN_P, asks_quantiles, substitute
from chorus_py.errors import NotSupportedError, QueryRefused

FRACTIONS = st.integers(0, 1000).map(lambda i: i / 1000)


@settings(max_examples=60, deadline=None)
@given(p=FRACTIONS, dialect=st.sampled_from(["duckdb", "postgres"]),
       desc=st.booleans())
def test_within_group_fraction(p: float, dialect: str, desc: bool) -> None:
    sql = (f"SELECT PERCENTILE_DISC({p}) WITHIN GROUP (ORDER BY x{' DESC' if desc else ''}) "
           "FROM t")
    assert asks_quantiles(sql, dialect)
    tree, found = substitute(sqlglot.parse_one(sql, read=dialect))
    ((got, name, _),) = found
    assert got == pytest.approx(1 - p if desc else p) and name == "PERCENTILE_DISC"
    assert len(list(tree.find_all(exp.Sum))) == 1
    assert not any(isinstance(n, exp.WithinGroup) for n in tree.walk())


@settings(max_examples=60, deadline=None)
@given(p=FRACTIONS, spelling=st.sampled_from(["QUANTILE_CONT", "QUANTILE_DISC", "QUANTILE",
                                              "APPROX_QUANTILE"]))
def test_duckdb_function_fraction(p: float, spelling: str) -> None:
    # (p equal to one of the others may be the same release: asked once, tested elsewhere)
    assume(p not in (0.5, MIN_P, MAX_P))
    sql = f"SELECT {spelling}(x, {p}), MEDIAN(x), MIN(x), MAX(x) FROM t"
    _, found = substitute(sqlglot.parse_one(sql, read="duckdb"))
    assert [f[0] for f in found] == pytest.approx([p, 0.5, MIN_P, MAX_P])


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM t", "SELECT LEAST(a, b) FROM t", "SELEC broken",
    "SELECT SUM(x) FROM t WHERE y > 1",
])
def test_not_quantiles(sql: str) -> None:
    assert not asks_quantiles(sql, "duckdb")


@pytest.mark.parametrize("sql", [
    "SELECT QUANTILE_CONT(x, -0.1) FROM t", "SELECT QUANTILE_CONT(x, y) FROM t",
    "SELECT PERCENTILE_CONT('0.5') WITHIN GROUP (ORDER BY x) FROM t",
])
def test_bad_fractions(sql: str) -> None:
    with pytest.raises(QueryRefused):
        substitute(sqlglot.parse_one(sql, read="duckdb"))


# -- the split of a query mixing quantiles and other aggregates (analyses.mixed) ---------------
KEYS = ["g", "DATE_TRUNC('month', t) AS m"]
QUANTILES = ["MEDIAN(x)", "MIN(x) AS lo", "PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY y)"]
OTHERS = ["COUNT(*)", "AVG(x) AS a", "SUM(y)"]


@settings(max_examples=60, deadline=None)
@given(items=st.permutations([*KEYS, *QUANTILES, *OTHERS]).flatmap(
           lambda p: st.integers(2, len(p)).map(lambda n: p[:n])),
       dialect=st.sampled_from(["duckdb", "postgres"]))
def test_mixed_split_keeps_every_item_in_its_part(items: list[str], dialect: str) -> None:
    """Each part selects the group keys first, then its own aggregates (without their
    aliases), in order; the parts keep FROM, WHERE and GROUP BY; each output is the scratch
    column of its key or aggregate (k<i>, q<i>, a<j>)."""
    keys = [i for i in items if i in KEYS]
    assume(any(i in QUANTILES for i in items) and any(i in OTHERS for i in items))
    group = " GROUP BY " + ", ".join(k.split(" AS ")[-1] for k in keys) if keys else ""
    sql = f"SELECT {', '.join(items)} FROM t WHERE x > 1{group}"
    assert asks_mixed(sql, dialect)
    split = split_mixed(sql, dialect)
    parts = {"quantile": sqlglot.parse_one(split.quantile_sql, read=dialect),
             "analytic": sqlglot.parse_one(split.analytic_sql, read=dialect)}

    def bare(item: str) -> str:
        node = sqlglot.parse_one(f"SELECT {item}", read=dialect).expressions[0]
        node = node.this if isinstance(node, exp.Alias) else node
        if dialect == "duckdb":  # the spelling that parses back on DuckDB (plain_percentile)
            node = node.transform(plain_percentile)
        return node.sql(dialect)

    for name, tree in parts.items():
        assert tree.args["where"] is not None and bool(tree.args.get("group")) == bool(keys)
        assert tree.args.get("having") is None and tree.args.get("order") is None
        selected = [e.sql(dialect) for e in tree.expressions]
        mine = [i for i in items if i in (QUANTILES if name == "quantile" else OTHERS)]
        assert selected == [bare(i) for i in (*keys, *mine)]
    for item, source in zip(items, split.sources, strict=True):
        assert source is not None
        pool = {"k": keys, "q": [i for i in items if i in QUANTILES],
                "a": [i for i in items if i in OTHERS]}[source[0]]
        assert pool[int(source[1:])] == item


def test_mixed_finish_reads_released_values_only() -> None:
    """Outputs, HAVING and ORDER BY over the scratch columns: an aggregate named twice is one
    column, an aggregate only in HAVING or ORDER BY is one more measurement of its part."""
    split = split_mixed("SELECT g, MAX(x) - MIN(x) AS spread, COUNT(*) FROM t GROUP BY g "
                        "HAVING COUNT(*) > 5 AND AVG(x) < MEDIAN(x) ORDER BY spread / SUM(x) "
                        "DESC LIMIT 3", "postgres")
    # Postgres sorts NULLs first under DESC: the DuckDB finish says so explicitly.
    assert split.finish == (
        'SELECT k0 AS "g", q0 - q1 AS "spread", a0 AS "count", chorus_row FROM chorus_noisy '
        'WHERE a0 > 5 AND a1 < q2 ORDER BY "spread" / a2 DESC NULLS FIRST LIMIT 3')
    assert split.quantiles == ("MAX(x)", "MIN(x)", "MEDIAN(x)")
    assert split.analytic == ("COUNT(*)", "AVG(x)", "SUM(x)")
    assert split.counts == (True, False, False)
    assert split.sources == ("k0", None, "a0")


def test_mixed_split_refuses_what_it_cannot_compute_from_released_values() -> None:
    for sql, words in [
        ("SELECT g, MEDIAN(x), COUNT(*) FROM t GROUP BY g HAVING SUM(MAX(x)) > 1",
         "inside another"),
        ("SELECT MEDIAN(x), SUM(COUNT(*)) OVER () FROM t", "window"),
        ("SELECT g, MEDIAN(x) FROM t GROUP BY g HAVING COUNT(*) > (SELECT COUNT(*) FROM t)",
         "subquery"),
        ("SELECT MEDIAN(x) + y, COUNT(*) FROM t", "neither a group key"),
        ("SELECT DISTINCT MEDIAN(x), COUNT(*) FROM t", "DISTINCT"),
        ("SELECT MEDIAN(x), COUNT(*) FROM t LIMIT ALL", "LIMIT"),
    ]:
        with pytest.raises(NotSupportedError) as raised:
            split_mixed(sql, "postgres")
        assert words in str(raised.value) + (raised.value.hint or "")
