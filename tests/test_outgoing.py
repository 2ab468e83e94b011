"""Wall 4, the outgoing verifier: real rewriter outputs pass, tampered ones are refused.

Each mutation takes a statement the engine really produced (on DuckDB and on Postgres) and breaks
one part of the bounding-and-noise structure; the verifier must name it.  The engine's own hook
is exercised on the same statements: a refusal is an InternalError and charges nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import sqlglot
from sqlglot import exp

from analyses.outgoing import Refused, check_outgoing, literal_shape, tokens, verify
from chorus_py import statements
from chorus_py.engine import Engine
from chorus_py.errors import InternalError
from chorus_py.kinds import quantile as quantile_kind
from chorus_py.kinds.selection import Choices
from rewriters import pipeline

GROUPED = "SELECT city, COUNT(*), AVG(fare) FROM trips GROUP BY city"      # public keys
# Filtered: a ranked copy is read as light UNION ALL heavy (GROUPED keeps its stored ranks).
FILTERED = "SELECT city, COUNT(*), AVG(fare) FROM trips WHERE fare > 1 GROUP BY city"
THRESHOLDED = "SELECT driver_id, COUNT(*) FROM trips GROUP BY driver_id"   # keys from rows
EVENT = "SELECT page, SUM(seconds) FROM visits GROUP BY page"               # no unit, no block
JOIN = ("SELECT COUNT(*) FROM trips t JOIN cities c ON t.city = c.city "
        "WHERE t.fare > 1")


def _sql(engine: Engine, query: str) -> str:
    report = engine.explain(query, analyst="alice", epsilon=1.0, delta=1e-6)
    assert report.rewritten_sql
    return report.rewritten_sql


def _check(engine: Engine, sql: str, release: str = "noised_in_sql",
           tables: frozenset[str] = frozenset({"trips"})) -> None:
    verify(sql, engine.dialect, engine.statements.outgoing, release, tables)  # type: ignore[arg-type]


def _tree(engine: Engine, sql: str) -> exp.Select:
    tree = sqlglot.parse_one(sql, read=engine.dialect)
    assert isinstance(tree, exp.Select)
    return tree


def _barrier(tree: exp.Select) -> exp.Select:
    """The select that aggregates the private rows (the measure; of the split ranked copy,
    the light branch's: the first aggregation with no aggregation inside it)."""
    def aggregates(s: exp.Select) -> bool:
        return s.args.get("group") is not None or any(
            isinstance(a.parent, exp.Alias) for a in s.find_all(exp.Count)
            if a.parent_select is s)

    return next(s for s in tree.find_all(exp.Select) if aggregates(s) and not any(
        aggregates(inner) for inner in s.find_all(exp.Select) if inner is not s))


@pytest.mark.parametrize("query", [GROUPED, THRESHOLDED, EVENT])
def test_real_rewrites_pass(engine: Engine, query: str) -> None:
    table = "visits" if "visits" in query else "trips"
    _check(engine, _sql(engine, query), tables=frozenset({table}))


def test_a_real_join_rewrite_passes(engine: Engine) -> None:
    _check(engine, _sql(engine, JOIN))


Mutation = Callable[[Engine, str], str]


def _drop_bounding(engine: Engine, sql: str) -> str:
    """Without the rank filter (of a ranked copy's heavy branch or stored ranks, or of
    per-query bounding)."""
    out = re.sub(r" WHERE b\.__chorus_k?rank(?: <= \d+)?", "", sql)
    out = re.sub(r" AND (\w+\.__chorus_rank <= \d+)", r" AND (\1 OR TRUE)", out)
    assert out != sql
    return out


def _stored_rank_elsewhere(engine: Engine, sql: str) -> str:
    """The stored-rank filter of a ranked copy moved out of the SELECT reading it (to the
    outside of a SUM of all the copy's rows): no longer a bound on the rows aggregated."""
    out = re.sub(r" AND (\w+)\.__chorus_rank <= (\d+)", r" AND \1.__chorus_rank >= \2", sql)
    assert out != sql
    return out


def _drop_light_cap(engine: Engine, sql: str) -> str:
    """A ranked copy's light branch with its test n_u <= k made void: every unit kept whole."""
    out = re.sub(r" AND (\w+\.__chorus_unit_rows <= \d+)", r" AND (\1 OR TRUE)", sql)
    assert out != sql
    return out


def _drop_blocks(engine: Engine, sql: str) -> str:
    tree = _tree(engine, sql)
    for where in tree.find_all(exp.Where):
        if "pickup_time" in where.sql():
            where.pop()
            return tree.sql(engine.dialect)
    raise AssertionError("no block restriction found")


def _raw_column_out(engine: Engine, sql: str) -> str:
    tree = _tree(engine, sql)
    leak = sqlglot.parse_one("(SELECT t.fare FROM trips AS t LIMIT 1)", read=engine.dialect)
    return tree.select(exp.alias_(leak, "leak")).sql(engine.dialect)


def _raw_column_in_measure(engine: Engine, sql: str) -> str:
    tree = _tree(engine, sql)
    barrier = _barrier(tree)
    source = barrier.args["from_"].this
    barrier.select(exp.column("fare", table=source.alias_or_name), copy=False)
    return tree.sql(engine.dialect)


def _extra_private_table(engine: Engine, sql: str) -> str:
    tree = _tree(engine, sql)
    _barrier(tree).join("visits AS v", on="TRUE", copy=False)
    return tree.sql(engine.dialect)


def _private_for_public(engine: Engine, sql: str) -> str:
    return re.sub(r"VALUES \('SF'\)", "SELECT t.city FROM trips AS t UNION ALL VALUES ('SF')",
                  sql, count=1)


def _cte_shadowing(engine: Engine, sql: str) -> str:
    return sql.replace("chorus_noisy", "cities")


def _drop_noise(engine: Engine, sql: str) -> str:
    tree = _tree(engine, sql)
    noisy = tree.args["with_"].expressions[0].this
    for item in noisy.expressions:
        if item.alias == "m0":
            item.set("this", exp.column("m0", table="chorus_exact"))
            return tree.sql(engine.dialect)
    raise AssertionError("no m0")


def _not_materialized(engine: Engine, sql: str) -> str:
    tree = _tree(engine, sql)
    tree.args["with_"].expressions[0].set("materialized", None)
    return tree.sql(engine.dialect)


def _max_instead_of_count(engine: Engine, sql: str) -> str:
    tree = _tree(engine, sql)
    barrier = _barrier(tree)
    count = next(c for c in barrier.find_all(exp.Count) if c.parent_select is barrier)
    count.replace(exp.Max(this=exp.column("fare", table=barrier.args["from_"].this.alias_or_name)))
    return tree.sql(engine.dialect)


def _drop_threshold(engine: Engine, sql: str) -> str:
    tree = _tree(engine, sql)
    assert tree.args.get("where") is not None
    tree.set("where", None)
    return tree.sql(engine.dialect)


def _limit_in_measure(engine: Engine, sql: str) -> str:
    tree = _tree(engine, sql)
    _barrier(tree).limit(1, copy=False)
    return tree.sql(engine.dialect)


@pytest.mark.parametrize("mutation", [
    _drop_bounding, _drop_light_cap, _drop_blocks, _raw_column_out, _raw_column_in_measure,
    _extra_private_table, _cte_shadowing, _drop_noise, _not_materialized, _max_instead_of_count,
    _limit_in_measure,
])
@pytest.mark.parametrize("query", [GROUPED, FILTERED])
def test_tampered_rewrites_are_refused(engine: Engine, mutation: Mutation, query: str) -> None:
    sql = _sql(engine, query)
    if mutation is _drop_light_cap and query is GROUPED:
        # Every row passes: the copy is read by its stored ranks, with no light branch.
        assert "__chorus_unit_rows" not in sql and "UNION" not in sql
        return
    _check(engine, sql)
    with pytest.raises(Refused):
        _check(engine, mutation(engine, sql))


def test_stored_ranks_bound_only_as_rank_at_most_k(engine: Engine) -> None:
    """An unfiltered query reads the ranked copy's rows of stored rank <= k by a plain scan;
    the same read with the comparison turned around bounds nothing and is refused."""
    sql = _sql(engine, GROUPED)
    assert re.search(r"\.__chorus_rank <= \d+", sql) and "UNION" not in sql
    _check(engine, sql)
    with pytest.raises(Refused, match="contribution bounding"):
        _check(engine, _stored_rank_elsewhere(engine, sql))


def test_a_private_grid_and_a_missing_threshold_are_refused(engine: Engine) -> None:
    grouped = _sql(engine, GROUPED)
    with pytest.raises(Refused):
        _check(engine, _private_for_public(engine, grouped))
    thresholded = _sql(engine, THRESHOLDED)
    _check(engine, thresholded)
    with pytest.raises(Refused, match="threshold"):
        _check(engine, _drop_threshold(engine, thresholded))


def test_proxy_noise_statements_need_the_barrier(make_engine: Callable[..., Engine],
                                                  backend_url: str) -> None:
    engine = make_engine(backend_url, noise="proxy")
    sql = _sql(engine, GROUPED)  # the exact measurements: the proxy adds the noise
    _check(engine, sql, "noised_by_proxy")
    with pytest.raises(Refused):
        _check(engine, _drop_bounding(engine, sql), "noised_by_proxy")
    with pytest.raises(Refused):
        _check(engine, _raw_column_in_measure(engine, sql), "noised_by_proxy")
    with pytest.raises(Refused):  # never released exactly
        _check(engine, sql, "exact")


def test_public_statements(engine: Engine) -> None:
    schema = engine.schema
    _check(engine, f'SELECT COUNT(*) FROM "{schema}".cities AS c', "exact", frozenset({"cities"}))
    for bad in (
        f'SELECT COUNT(*) FROM "{schema}".trips AS c',                       # private, exact
        "WITH trips AS (SELECT * FROM cities) SELECT COUNT(*) FROM trips",   # shadowing
        "SELECT COUNT(*) FROM users",                                        # undeclared
        "SELECT COUNT(*) FROM other.cities",                                 # another schema
        "SELECT COUNT(*) FROM cities",                                       # not qualified
        "SELECT * FROM read_csv('/etc/passwd')",                             # table function
    ):
        with pytest.raises(Refused):
            _check(engine, bad, "exact", frozenset({"cities"}))


def test_the_engine_hook_refuses_and_charges_nothing(engine: Engine) -> None:
    sql = _drop_bounding(engine, _sql(engine, GROUPED))
    before = len(engine.ledger.claims())
    with pytest.raises(InternalError, match="refused by the outgoing check"):
        engine.statements.verify_outgoing(sql, "noised_in_sql", ("trips",))
    assert len(engine.ledger.claims()) == before


def test_an_empty_key_list_passes_only_as_where_false(engine: Engine) -> None:
    """A WHERE that leaves no declared key renders the aggregation under WHERE FALSE (no row,
    rewriters.groups.complete_groups): it passes; the same shape with the FALSE gone does not."""
    sql = _sql(engine, "SELECT city, COUNT(*) FROM trips WHERE city = 'ZZZ' GROUP BY city")
    _check(engine, sql)
    tree = _tree(engine, sql)
    empty = next(w for w in tree.find_all(exp.Where)
                 if isinstance(w.this, exp.Boolean) and w.this.this is False)
    empty.set("this", exp.true())
    with pytest.raises(Refused):
        _check(engine, tree.sql(engine.dialect))


def test_the_attack_text_would_be_stopped_even_without_binding(engine: Engine) -> None:
    """Were the CTE attack run as a public query (the old behaviour), the verifier would
    refuse it on its own: a CTE carries a table's name, it reads trips, and (as the analyst
    wrote it) its names are not qualified."""
    schema = f'"{engine.schema}"'
    attack = (f"SELECT x.rider_id, x.fare FROM {schema}.trips x, "
              f"(WITH trips AS (SELECT 1 AS a FROM {schema}.cities) SELECT a FROM trips) s")
    with pytest.raises(Refused, match="CTE is named like a table"):
        _check(engine, attack, "exact", frozenset({"cities"}))
    renamed = attack.replace("WITH trips", "WITH c").replace("FROM trips) s", "FROM c) s")
    with pytest.raises(Refused, match="private table 'trips'"):
        _check(engine, renamed, "exact", frozenset({"cities"}))
    bare = ("SELECT x.rider_id, x.fare FROM trips x, "
            "(WITH c AS (SELECT 1 AS a FROM cities) SELECT a FROM c) s")
    with pytest.raises(Refused, match="not qualified"):
        _check(engine, bare, "exact", frozenset({"cities"}))


# -- the ranked copy's branches aggregated apart and added (rewriters.pipeline.combine_branches)
def _parts(engine: Engine, sql: str) -> tuple[exp.Select, exp.Union, list[exp.Select]]:
    """The combining SELECT, its UNION ALL and the two branch aggregations (light first)."""
    tree = _tree(engine, sql)
    union = next(u for u in tree.find_all(exp.Union))
    return tree, union, [union.this, union.expression]


def _split_mutation(edit: Callable[[exp.Select, exp.Union, list[exp.Select]], None]) -> Mutation:
    def mutate(engine: Engine, sql: str) -> str:
        tree, union, branches = _parts(engine, sql)
        edit(tree, union, branches)
        return tree.sql(engine.dialect)
    mutate.__name__ = edit.__name__
    return mutate


def _heavy_without_its_test(engine: Engine, sql: str) -> str:
    """The heavy branch ranks every unit (no n_u > k): a light unit's rows in both branches."""
    out = re.sub(r" AND (\w+\.__chorus_unit_rows > \d+)", r" AND (\1 OR TRUE)", sql)
    assert out != sql
    return out


def _heavy_cap_below_k(engine: Engine, sql: str) -> str:
    """Light n_u <= k, heavy n_u > k - 1: each still bounded (k rows at most), but a unit of
    k rows is in both branches.  (A light cap above k, the other overlap, is refused before:
    rule 4 bounds it by the statement's cap and the limit, test_a_cap_above_the_limit...)"""
    k = int(re.search(r"__chorus_unit_rows > (\d+)", sql).group(1))
    assert k > 1
    out = sql.replace(f"__chorus_unit_rows > {k}", f"__chorus_unit_rows > {k - 1}")
    assert out != sql
    return out


def _light_twice(tree: exp.Select, union: exp.Union, branches: list[exp.Select]) -> None:
    union.set("expression", branches[0].copy())  # light UNION ALL light: every light unit twice


def _third_branch(tree: exp.Select, union: exp.Union, branches: list[exp.Select]) -> None:
    union.replace(exp.union(union.copy(), branches[0].copy(), distinct=False))


def _union_distinct(tree: exp.Select, union: exp.Union, branches: list[exp.Select]) -> None:
    union.set("distinct", True)


def _max_of_parts(tree: exp.Select, union: exp.Union, branches: list[exp.Select]) -> None:
    combiner = union.parent_select
    total = next(t for t in combiner.find_all(exp.Sum) if t.parent_select is combiner)
    total.replace(exp.Max(this=total.this.copy()))


def _raw_column_of_parts(tree: exp.Select, union: exp.Union, branches: list[exp.Select]) -> None:
    combiner = union.parent_select
    combiner.select(exp.column("m0", table="chorus_parts"), copy=False)


def _parts_filtered(tree: exp.Select, union: exp.Union, branches: list[exp.Select]) -> None:
    union.parent_select.where("chorus_parts.m0 > 1", copy=False)


SPLIT_MUTATIONS = [_heavy_without_its_test, _heavy_cap_below_k, *[_split_mutation(m) for m in (
    _light_twice, _third_branch, _union_distinct, _max_of_parts, _raw_column_of_parts,
    _parts_filtered)]]
SPLIT_QUERIES = [FILTERED, "SELECT COUNT(*), SUM(fare) FROM trips WHERE fare > 1",
                 # (COUNT(DISTINCT rider_id) alone with a filter is a per-person question:
                 # analyses.per_person._distinct_units)
                 "SELECT COUNT(DISTINCT rider_id), COUNT(*) FROM trips WHERE fare > 1"]


@pytest.fixture
def split(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> Engine:
    """The engine with the ranked copy's branches aggregated apart on its backend too (the
    default on Postgres only: the shape must pass and its near misses fail on both)."""
    monkeypatch.setattr(pipeline, "SPLIT_DIALECTS", frozenset({engine.dialect}))
    return engine


@pytest.mark.parametrize("query", SPLIT_QUERIES)
def test_the_split_branches_pass(split: Engine, query: str) -> None:
    sql = _sql(split, query)
    assert "chorus_parts" in sql and "UNION ALL" in sql
    _check(split, sql)


@pytest.mark.parametrize("mutation", SPLIT_MUTATIONS, ids=lambda m: m.__name__)
@pytest.mark.parametrize("query", SPLIT_QUERIES)
def test_near_misses_of_the_split_branches_are_refused(split: Engine, mutation: Mutation,
                                                       query: str) -> None:
    sql = _sql(split, query)
    _check(split, sql)
    with pytest.raises(Refused):
        _check(split, mutation(split, sql))


def test_the_split_disjointness_is_what_refuses(split: Engine) -> None:
    """Each branch alone is bounded (rule 4 passes): the refusal is the missing disjointness."""
    sql = _sql(split, FILTERED)
    for mutation in (_heavy_without_its_test, _heavy_cap_below_k,
                     _split_mutation(_light_twice)):
        with pytest.raises(Refused, match="not disjoint"):
            _check(split, mutation(split, sql))


def test_proxy_noise_needs_the_split_branches_disjoint(make_engine: Callable[..., Engine],
                                                       backend_url: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The exact measurements the proxy noises: the same sum of the two branches, and the
    same refusal when a unit could be in both (the noise assumes k rows per unit)."""
    engine = make_engine(backend_url, noise="proxy")
    monkeypatch.setattr(pipeline, "SPLIT_DIALECTS", frozenset({engine.dialect}))
    sql = _sql(engine, FILTERED)
    assert "chorus_parts" in sql
    _check(engine, sql, "noised_by_proxy")
    for mutation in (_heavy_without_its_test, _split_mutation(_light_twice),
                     _split_mutation(_third_branch)):
        with pytest.raises(Refused):
            _check(engine, mutation(engine, sql), "noised_by_proxy")


def test_a_weight_counts_the_whole_unit(engine: Engine) -> None:
    """A selection histogram's weight 1 / COUNT(x) OVER (PARTITION BY unit) passes; over a
    running count (ORDER BY, or a frame) a unit's weights add up to H_n ~ ln n, not 1: refused."""
    blocks = ("CAST('2026-01-01 00:00:00' AS TIMESTAMP) <= t.pickup_time AND t.pickup_time < "
              "CAST('2026-02-01 00:00:00' AS TIMESTAMP)")

    def histogram(window: str) -> str:
        return (f"SELECT SUM(r.w) AS w FROM (SELECT CASE WHEN t.fare IS NULL THEN NULL ELSE "
                f"CAST(1 AS DOUBLE PRECISION) / COUNT(t.fare) OVER (PARTITION BY t.rider_id"
                f"{window}) END AS w FROM \"{engine.schema}\".trips AS t WHERE {blocks}) AS r")

    _check(engine, histogram(""), "noised_by_proxy")
    for running in (" ORDER BY t.fare", " ORDER BY t.fare ROWS BETWEEN UNBOUNDED PRECEDING "
                    "AND CURRENT ROW", " ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW"):
        with pytest.raises(Refused, match="contribution bounding"):
            _check(engine, histogram(running), "noised_by_proxy")


@pytest.mark.parametrize("mutation", [_heavy_without_its_test, _heavy_cap_below_k],
                         ids=lambda m: m.__name__)
def test_one_aggregate_over_overlapping_branches_is_refused(
        make_engine: Callable[..., Engine], backend_url: str, mutation: Mutation,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The unsplit shape (DuckDB's and Spark's): one aggregation over light UNION ALL heavy
    is refused too when a unit could be in both branches (k rows in each, 2k in the sum)."""
    monkeypatch.setattr(pipeline, "SPLIT_DIALECTS", frozenset())
    engine = make_engine(backend_url)
    sql = _sql(engine, FILTERED)
    assert "UNION ALL" in sql and "chorus_parts" not in sql
    _check(engine, sql)
    with pytest.raises(Refused, match="not disjoint"):
        _check(engine, mutation(engine, sql))


# -- a verdict carried over to the same statement with other numbers ---------------------------
def same_but_literals(verified: str, sql: str, dialect: str) -> bool:
    """Whether the verifier carries the verdict of ``verified`` over to ``sql``: the same
    literal shape (``analyses.outgoing.literal_shape``)."""
    before, after = tokens(verified, dialect), tokens(sql, dialect)
    return before is not None and after is not None \
        and literal_shape(before) == literal_shape(after)


def _heavy_threshold_moved(engine: Engine, sql: str) -> str:
    """The heavy branch's ``__chorus_unit_rows > K`` with another K than the light one's
    ``<= K``: a unit between the two is read by both (only numbers changed)."""
    out = re.sub(r"__chorus_unit_rows > (\d+)",
                 lambda m: f"__chorus_unit_rows > {int(m.group(1)) + 4}", sql)
    assert out != sql
    return out


def _limit_and_final(make_engine: Callable[..., Engine], url: str, query: str
                     ) -> tuple[Engine, str, str]:
    """An automatic-cap query's statement at the limit and its final statement at cap 3."""
    engine = make_engine(url, contribution="auto")
    _, prepared = engine.prepare(query, "alice", 1.0, 1e-6)
    assert prepared.selection is not None
    final = prepared.selection.apply(Choices(cap=3, bounds=(), groups=None))
    return engine, prepared.statements[0], final.statements[0]


def _literals(tree: exp.Expr) -> list[exp.Literal]:
    return list(tree.find_all(exp.Literal, bfs=False))


@pytest.mark.parametrize("query", [GROUPED, FILTERED])
def test_the_final_statement_is_the_limit_one_with_other_numbers(
        make_engine: Callable[..., Engine], backend_url: str, query: str) -> None:
    engine, limit, final = _limit_and_final(make_engine, backend_url, query)
    assert limit != final
    assert same_but_literals(limit, final, engine.dialect)
    # What same_but_literals concludes from the tokens, on the trees: the final statement's
    # parse is the limit's with only the values of literals changed, none of them a 0 or 1
    # turned into another value nor, compared to a column, an integer into a fraction.
    before, after = _tree(engine, limit), _tree(engine, final)
    changed = 0
    for a, b in zip(_literals(before), _literals(after), strict=True):
        if a.this != b.this:
            changed += 1
            assert a.is_string == b.is_string
            if isinstance(a.parent, exp.LT | exp.LTE | exp.GT | exp.GTE | exp.EQ | exp.NEQ):
                assert a.is_int == b.is_int
            assert a.this not in ("0", "1") and b.this not in ("0", "1")
            a.set("this", b.this)
    assert changed and before == after


@pytest.mark.parametrize("mutation", [
    _drop_bounding, _drop_blocks, _raw_column_out, _raw_column_in_measure,
    _extra_private_table, _cte_shadowing, _drop_noise, _not_materialized, _max_instead_of_count,
    _limit_in_measure, _heavy_threshold_moved,
])
def test_a_tampered_final_statement_is_refused_after_its_limit_one_passed(
        make_engine: Callable[..., Engine], backend_url: str, mutation: Mutation,
        monkeypatch: pytest.MonkeyPatch) -> None:
    engine, limit, final = _limit_and_final(make_engine, backend_url, FILTERED)
    full: list[str] = []
    monkeypatch.setattr(statements, "check_outgoing",
                        lambda sql, *args: (full.append(sql), check_outgoing(sql, *args)))
    # Fresh verdicts (preparing the query verified both already).
    fresh = statements.Statements(engine.backend, engine.ledger, engine.dialect,
                                  engine.statements.outgoing)
    fresh.verify_outgoing(limit, "noised_in_sql", ("trips",), variants=True)
    fresh.verify_outgoing(final, "noised_in_sql", ("trips",), variants=True)
    assert full == [limit]  # the final statement passed by its tokens
    tampered = mutation(engine, final)
    assert not same_but_literals(limit, tampered, engine.dialect)
    with pytest.raises(InternalError, match="refused by the outgoing check"):
        fresh.verify_outgoing(tampered, "noised_in_sql", ("trips",), variants=True)
    assert full[-1] == tampered


def _raise_cap(sql: str, cap: int, column: str) -> str:
    """``column <= cap`` raised to ``<= cap + 1`` (only numbers change); for the heavy branch
    streamed on DuckDB (``rewriters.contribution.streamed_rank``: its rows flagged by the run
    number ``cap`` rows back), the LAG's offset raised so."""
    out = sql.replace(f"{column} <= {cap}", f"{column} <= {cap + 1}")
    if out == sql and column == "__chorus_krank":
        out = sql.replace(f"__chorus_run, {cap}, 0)", f"__chorus_run, {cap + 1}, 0)")
    assert out != sql
    return out


@pytest.mark.parametrize("column", ["__chorus_krank", "__chorus_unit_rows"])
def test_a_final_statement_capped_above_its_cap_is_refused(
        make_engine: Callable[..., Engine], backend_url: str, column: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The final statement at the chosen cap 3 keeps 4 rows of a unit (the heavy branch's
    row number, or the light units' row count, raised by one; the limit is higher): every
    other rule passes it, and it passes at cap 4, but the noise assumes 3, so it is refused,
    also after the statement at the limit passed with the same literal shape otherwise."""
    engine, limit, final = _limit_and_final(make_engine, backend_url, FILTERED)
    most = engine.policy.tables["trips"].contribution_bound
    assert most > 4
    raised = _raise_cap(final, 3, column)
    if column == "__chorus_unit_rows":  # the heavy branch moves with it: still disjoint
        raised = raised.replace("__chorus_unit_rows > 3", "__chorus_unit_rows > 4")
    verify(raised, engine.dialect, engine.statements.outgoing, "noised_in_sql",
           frozenset({"trips"}), cap=4)
    with pytest.raises(Refused, match="at most 3 rows"):
        verify(raised, engine.dialect, engine.statements.outgoing, "noised_in_sql",
               frozenset({"trips"}), cap=3)
    full: list[str] = []
    monkeypatch.setattr(statements, "check_outgoing",
                        lambda sql, *args: (full.append(sql), check_outgoing(sql, *args)))
    fresh = statements.Statements(engine.backend, engine.ledger, engine.dialect,
                                  engine.statements.outgoing)
    fresh.verify_outgoing(limit, "noised_in_sql", ("trips",), variants=True, cap=most)
    fresh.verify_outgoing(final, "noised_in_sql", ("trips",), variants=True, cap=3)
    assert full == [limit]  # the final statement passed by its tokens, at its own cap
    with pytest.raises(InternalError, match="refused by the outgoing check"):
        fresh.verify_outgoing(raised, "noised_in_sql", ("trips",), variants=True, cap=3)
    assert full[-1] == raised


def test_a_cap_above_the_limit_is_refused(engine: Engine) -> None:
    """Whatever cap the caller passes (or none), no statement keeps more rows of a unit than
    the policy's limit: the light branch's ``<= K`` and the heavy branch's row number."""
    sql = _sql(engine, FILTERED)
    most = engine.policy.tables["trips"].contribution_bound
    _check(engine, sql)
    for column in ("__chorus_unit_rows", "__chorus_krank"):
        raised = _raise_cap(sql, most, column)
        if column == "__chorus_unit_rows":
            raised = raised.replace(f"__chorus_unit_rows > {most}",
                                    f"__chorus_unit_rows > {most + 1}")
        for cap in (None, most + 1):
            with pytest.raises(Refused, match=f"at most {most} rows"):
                verify(raised, engine.dialect, engine.statements.outgoing, "noised_in_sql",
                       frozenset({"trips"}), cap=cap)


def test_the_engine_verifies_the_final_statement_at_its_cap(
        make_engine: Callable[..., Engine], backend_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The one-table kind passes the cap its noise assumes: the limit's for the statement at
    the limit, the chosen one for the final statement."""
    engine = make_engine(backend_url, contribution="auto")
    seen: list[tuple[str, int | None]] = []
    check = engine.statements.verify_outgoing

    def record(sql: str, *args: object, **kwargs: object) -> None:
        seen.append((sql, kwargs.get("cap")))  # type: ignore[arg-type]
        check(sql, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(engine.statements, "verify_outgoing", record)
    _, prepared = engine.prepare(FILTERED, "alice", 1.0, 1e-6)
    assert prepared.selection is not None
    final = prepared.selection.apply(Choices(cap=3, bounds=(), groups=None))
    caps = dict(seen)
    assert caps[prepared.statements[0]] == engine.policy.tables["trips"].contribution_bound
    assert caps[final.statements[0]] == 3


@pytest.mark.parametrize(("verified", "verified_caps", "other", "other_caps", "same"), [
    # A family at its own caps: the statement at the limit 20, the final one at 3.
    ("SELECT a FROM t WHERE r <= 20", (20, 20), "SELECT a FROM t WHERE r <= 3", (3, 20), True),
    # A cap above the statement's own, or above the limit: another shape.
    ("SELECT a FROM t WHERE r <= 20", (20, 20), "SELECT a FROM t WHERE r <= 4", (3, 20), False),
    ("SELECT a FROM t WHERE r <= 20", (20, 20), "SELECT a FROM t WHERE r <= 21", (21, 20),
     False),
    # Only a literal right after <= is compared with the caps (rule 4 reads no other).
    ("SELECT a FROM t WHERE x > 10", (20, 20), "SELECT a FROM t WHERE x > 10", (3, 20), True),
    ("SELECT a FROM t WHERE x <= 10", (20, 20), "SELECT a FROM t WHERE x <= 10", (3, 20), False),
])
def test_the_literal_shape_compares_caps(verified: str, verified_caps: tuple[int, ...],
                                         other: str, other_caps: tuple[int, ...],
                                         same: bool) -> None:
    before, after = tokens(verified, "duckdb"), tokens(other, "duckdb")
    assert before is not None and after is not None
    assert (literal_shape(before, None, verified_caps)
            == literal_shape(after, None, other_caps)) is same


@pytest.mark.parametrize(("verified", "other", "same"), [
    ("SELECT a FROM t WHERE r <= 200", "SELECT a FROM t WHERE r <= 3", True),
    ("SELECT CAST('0.5' AS DOUBLE) * x", "SELECT CAST('1e-05' AS DOUBLE) * x", True),
    ("SELECT 2.5 * x", "SELECT 0.125 * x", True),
    ("SELECT LEAST(x, 399)", "SELECT LEAST(x, 199.5)", True),  # no rule asks: integral?
    # What a rule reads of a literal: integral (r <= k), 0, 1 (weights, marks), finite.
    ("SELECT a FROM t WHERE r <= 200", "SELECT a FROM t WHERE r <= 200.5", False),
    ("SELECT SUM(1 / n) FROM t", "SELECT SUM(2 / n) FROM t", False),
    ("SELECT SUM(4 / n) FROM t", "SELECT SUM(1 / n) FROM t", False),
    ("SELECT CASE WHEN r = 1 THEN 1 ELSE 0 END", "SELECT CASE WHEN r = 1 THEN 1 ELSE 5 END",
     False),
    ("SELECT CASE WHEN r = 1 THEN 1 END", "SELECT CASE WHEN r = 1.0 THEN 1 END", False),
    ("SELECT LEAST(x, 5)", "SELECT LEAST(x, 1" + "0" * 400 + ")", False),
    ("SELECT LEAST(x, 5)", "SELECT LEAST(x, 5e3)", False),
    # Anything else: signs, names, strings that are not numbers, comments, keywords.
    ("SELECT 5 * x", "SELECT -5 * x", False),
    ("SELECT a1 FROM t", "SELECT a2 FROM t", False),
    ("SELECT 'x1' FROM t", "SELECT 'x2' FROM t", False),
    ("SELECT 'inf' FROM t", "SELECT 'nan' FROM t", False),
    ("SELECT '0.5' FROM t", "SELECT 'float' FROM t", False),
    ("SELECT 5 /* a */ FROM t", "SELECT 5 /* b */ FROM t", False),
    ("SELECT a FROM t WHERE r <= 5", "SELECT a FROM t WHERE r >= 5", False),
    ("SELECT a FROM t", "SELECT a FROM t, u", False),
    # The Ks of __chorus_unit_rows keep which of them are equal (the branches' one K).
    ("SELECT a FROM t WHERE x.__chorus_unit_rows <= 200 AND y.__chorus_unit_rows > 200",
     "SELECT a FROM t WHERE x.__chorus_unit_rows <= 3 AND y.__chorus_unit_rows > 3", True),
    ("SELECT a FROM t WHERE x.__chorus_unit_rows <= 200 AND y.__chorus_unit_rows > 200",
     "SELECT a FROM t WHERE x.__chorus_unit_rows <= 3 AND y.__chorus_unit_rows > 7", False),
    ("SELECT a FROM t WHERE __chorus_unit_rows <= 3 AND __chorus_unit_rows > 7",
     "SELECT a FROM t WHERE __chorus_unit_rows <= 5 AND __chorus_unit_rows > 5", False),
    ("SELECT a FROM t WHERE n <= 200 AND m > 200", "SELECT a FROM t WHERE n <= 3 AND m > 7",
     True),
])
def test_same_but_literals(verified: str, other: str, same: bool) -> None:
    assert same_but_literals(verified, other, "duckdb") is same
    assert same_but_literals(verified, other, "postgres") is same


# -- DP quantile histograms over the ranked copy (rewriters.quantiles, issue 23) ---------------
QUANTILE_QUERIES = [
    "SELECT MEDIAN(fare) FROM trips",
    "SELECT city, PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY distance_km) FROM trips "
    "GROUP BY city",
    "SELECT MIN(fare), MAX(fare) FROM trips WHERE city = 'SF'",
]


@pytest.fixture(params=["union", "split"])
def quantiles(engine: Engine, request: pytest.FixtureRequest,
              monkeypatch: pytest.MonkeyPatch) -> Engine:
    """The engine with the quantile histograms' ranked-copy branches counted in one
    aggregation (DuckDB's default) or apart and added (Postgres's): both shapes must pass and
    their near misses fail on both backends."""
    monkeypatch.setattr(quantile_kind, "SPLIT_DIALECTS",
                        frozenset({engine.dialect} if request.param == "split" else ()))
    return engine


def _bins_filtered(tree: exp.Select, union: exp.Union, branches: list[exp.Select]) -> None:
    union.parent_select.where("chorus_parts.n > 1", copy=False)


def _raw_bin_count(tree: exp.Select, union: exp.Union, branches: list[exp.Select]) -> None:
    union.parent_select.select(exp.column("n", table="chorus_parts"), copy=False)


QUANTILE_MUTATIONS = [
    _drop_bounding, _drop_light_cap, _drop_blocks, _heavy_without_its_test, _heavy_cap_below_k,
    _raw_column_out, _raw_column_in_measure, _extra_private_table, _max_instead_of_count,
    _limit_in_measure]
QUANTILE_SPLIT_MUTATIONS = [_split_mutation(m) for m in (
    _light_twice, _third_branch, _union_distinct, _max_of_parts, _bins_filtered,
    _raw_bin_count)]


@pytest.mark.parametrize("query", QUANTILE_QUERIES)
def test_quantile_histograms_over_the_ranked_copy_pass(quantiles: Engine, query: str) -> None:
    sql = _sql(quantiles, query)
    assert "__ranked_" in sql and "__chorus_unit_rows" in sql and "UNION ALL" in sql
    _check(quantiles, sql, "noised_by_proxy")


@pytest.mark.parametrize("mutation", QUANTILE_MUTATIONS + QUANTILE_SPLIT_MUTATIONS,
                         ids=lambda m: m.__name__)
@pytest.mark.parametrize("query", QUANTILE_QUERIES)
def test_near_misses_of_quantile_histograms_are_refused(quantiles: Engine, mutation: Mutation,
                                                       query: str) -> None:
    sql = _sql(quantiles, query)
    if mutation in QUANTILE_SPLIT_MUTATIONS and "chorus_parts" not in sql:
        return  # one aggregation over the union: no sum of parts to tamper with
    with pytest.raises(Refused):
        _check(quantiles, mutation(quantiles, sql), "noised_by_proxy")


def test_quantile_branches_must_be_disjoint(quantiles: Engine) -> None:
    """Each branch alone is bounded: the refusal is the missing disjointness (a unit of
    k + 1 rows counted in both, 2k rows in the histogram)."""
    sql = _sql(quantiles, QUANTILE_QUERIES[1])
    for mutation in (_heavy_without_its_test, _heavy_cap_below_k):
        with pytest.raises(Refused, match="not disjoint"):
            _check(quantiles, mutation(quantiles, sql), "noised_by_proxy")


@pytest.mark.parametrize("mutation", [_drop_bounding, _drop_light_cap, _drop_blocks,
                                      _heavy_without_its_test, _heavy_cap_below_k],
                         ids=lambda m: m.__name__)
def test_group_bounded_quantile_histograms_over_the_copy(
        quantiles: Engine, make_engine: Callable[..., Engine], backend_url: str,
        mutation: Mutation) -> None:
    """Keys released by a threshold with g < k groups per unit chosen: the histogram reads the
    copy's light units (n_u <= g) and the heavy ones' g groups then k rows; it passes, and its
    near misses are refused."""
    engine = make_engine(backend_url, contribution="auto")
    _, prepared = engine.prepare("SELECT driver_id, MEDIAN(fare) FROM trips GROUP BY driver_id",
                                 "alice", 1.0, 1e-6)
    assert prepared.selection is not None
    final = prepared.selection.apply(Choices(cap=5, bounds=(), groups=2))
    (sql,) = [s for _, s in final.detail.histograms]
    assert "__ranked_" in sql and "__chorus_grank <= 2" in sql
    _check(engine, sql, "noised_by_proxy")
    with pytest.raises(Refused):
        _check(engine, mutation(engine, sql), "noised_by_proxy")
