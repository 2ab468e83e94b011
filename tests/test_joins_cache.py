"""Caching of join queries: a repeated query reuses its rewrite and SQL, a new epsilon reuses the
rewrite with new noise scales (exactly the full rendering), and every execution is charged."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import chorus_py.kinds.join as joined
from chorus_py.engine import Engine
from chorus_py.kinds.join import JoinTemplate, discrete_laplace_of_scale
from chorus_py.policy import load_policy
from mechanisms.planning import NoisePlan
from rewriters.pipeline import RewrittenQuery
from tests.conftest import tolerance
from tests.test_joins_engine import joins  # noqa: F401  (the join tables fixture)

SQL = ("SELECT COUNT(*) AS n, SUM(o.amount) AS total FROM j_orders o JOIN j_recs r "
       "ON o.customer_id = r.customer_id WHERE o.day < '2026-01-02'")

scales = st.floats(min_value=1e-6, max_value=1e15, allow_nan=False, allow_infinity=False)


class Calls:
    """Counts calls of the rewrite and of the full SQL rendering (wrapping the real ones)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.pipeline = 0
        self.renders = 0
        real_pipeline, real_render = joined.pipeline, RewrittenQuery.sql_with_noise

        def pipeline(*args: Any, **kwargs: Any) -> RewrittenQuery:
            self.pipeline += 1
            return real_pipeline(*args, **kwargs)

        def render(rewritten: RewrittenQuery, plan: NoisePlan) -> str:
            self.renders += 1
            return real_render(rewritten, plan)

        monkeypatch.setattr(joined, "pipeline", pipeline)
        monkeypatch.setattr(RewrittenQuery, "sql_with_noise", render)


def _template(engine: Engine) -> JoinTemplate:
    """The one join template the engine keeps (its rewrite: the details keep none)."""
    (template,) = engine.join._templates._items.values()
    return template


def _consumed(engine: Engine, block: str) -> float:
    return next(b.epsilon_consumed for b in engine.ledger.blocks() if b.block_id == block)


def test_repeated_join_hits_the_cache_and_is_charged_each_time(
        joins: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    engine = joins()
    calls = Calls(monkeypatch)
    query = engine._analyse(SQL)
    first = engine.join.prepare(query, "a", 1.0, 1e-8).detail
    assert (calls.pipeline, calls.renders) == (1, 1)
    again = engine.join.prepare(query, "a", 1.0, 1e-8).detail
    assert (calls.pipeline, calls.renders) == (1, 1)  # no rewrite, no rendering
    assert again.sql is first.sql and again.plan is first.plan
    for i in (1, 2):
        result = engine.execute(SQL, epsilon=1.0, delta=1e-8)
        assert result.report.charged
        assert _consumed(engine, "j_orders/2026-01-01") == pytest.approx(i)
        assert _consumed(engine, "j_recs") == pytest.approx(i)
    assert (calls.pipeline, calls.renders) == (1, 1)
    assert engine._analyse(SQL) is query


def test_new_epsilon_reuses_the_rewrite_with_exact_scales(
        joins: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    engine = joins()
    query = engine._analyse(SQL)
    engine.join.prepare(query, "a", 1.0, 1e-8)
    calls = Calls(monkeypatch)
    seen = set()
    for epsilon, delta in ((2.0, 1e-8), (3.7, 1e-8), (1.0, 1e-6), (0.31, 1e-7)):
        prepared = engine.join.prepare(query, "a", epsilon, delta).detail
        assert calls.pipeline == 0 and calls.renders == 0
        # The substituted text is character for character the full rendering of this plan.
        assert prepared.sql == _template(engine).rewritten.sql_with_noise(prepared.plan)
        calls.renders = 0
        seen.add(prepared.sql)
    assert len(seen) == 4  # the scales differ, and so does the SQL
    proxy = joins(noise="proxy")
    q = proxy._analyse(SQL)
    for epsilon in (1.0, 2.0):
        prepared = proxy.join.prepare(q, "a", epsilon, 1e-8).detail
        assert prepared.sql == _template(proxy).rewritten.measure_sql()
        assert prepared.proxied is _template(proxy).proxied  # its finish rendered once


def test_template_equals_full_rendering_for_any_scales(
        joins: Callable[..., Engine]) -> None:  # noqa: F811
    engine = joins()
    engine.join.prepare(engine._analyse(SQL), "a", 1.0, 1e-8)
    rewritten = _template(engine).rewritten
    template = JoinTemplate.build(rewritten, with_noise=True)
    assert template._holes is not None
    ids = rewritten.measure_ids

    @settings(max_examples=60, deadline=None)
    @given(st.lists(scales, min_size=len(ids), max_size=len(ids)))
    def check(bs: list[float]) -> None:
        plan = NoisePlan({m: discrete_laplace_of_scale(b) for m, b in zip(ids, bs, strict=True)},
                         None, 1.0, 1e-8)
        assert template.sql(plan) == rewritten.sql_with_noise(plan)

    check()


def test_analyst_literal_equal_to_a_placeholder_falls_back_to_full_rendering(
        joins: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    engine = joins()
    sql = ("SELECT COUNT(*) FROM j_rides r JOIN j_shops s ON r.shop_id = s.shop_id "
           "WHERE s.city <> '1234567.5'")
    prepared = engine.join.prepare(engine._analyse(sql), "a", 1.0, 1e-8).detail
    draws = iter([1234567.5, 2234567.5, 3234567.5])
    monkeypatch.setattr(joined.secrets.SystemRandom, "uniform", lambda self, a, b: next(draws))
    rewritten = _template(engine).rewritten
    template = JoinTemplate.build(rewritten, with_noise=True)
    assert template._holes is None  # the analyst's '1234567.5' would be replaced too
    assert template.sql(prepared.plan) == rewritten.sql_with_noise(prepared.plan)
    assert template.renders == 1
    assert "'1234567.5'" in prepared.sql  # the analyst's literal is intact


@settings(max_examples=500, deadline=None)
@given(scales)
def test_discrete_laplace_of_any_scale(b: float) -> None:
    # 1 / (1 / b) > b for about 6% of floats: the mechanism must still be built, at exactly b.
    mechanism = discrete_laplace_of_scale(b)
    assert mechanism.scale == b
    assert mechanism.sensitivity / mechanism.epsilon <= b
    assert mechanism.epsilon == pytest.approx(1 / b, rel=1e-12)
    assert math.isfinite(mechanism.epsilon)


def test_materialized_bounding_reads_the_stored_sample(
        joins: Callable[..., Engine], tmp_path: Path) -> None:  # noqa: F811
    from tests.test_joins_engine import POLICY
    base = joins()  # creates the tables
    text = POLICY.format(url=base.policy.backend.url, noise="sql").replace(
        "max_rows_per_unit = 3\n", 'max_rows_per_unit = 3\nbounding = "materialized"\n')
    path = tmp_path / "materialized.toml"
    path.write_text(text)
    with Engine(load_policy(path), block_ttl_seconds=0) as engine:
        sql = ("SELECT ri.city, COUNT(*) AS n FROM j_rides r JOIN j_riders ri "
               "ON r.rider_id = ri.rider_id GROUP BY ri.city ORDER BY ri.city")
        result = engine.execute(sql, epsilon=100, delta=1e-6)
        name = engine.samples.relation("j_rides", engine.policy.tables["j_rides"])
        rewritten = result.report.rewritten_sql
        assert rewritten is not None and f'chorus_private."{name}" AS r' in rewritten
        # j_riders (per-query bounding, unfiltered) keeps its ranked copy's stored ranks <= 1;
        # j_rides is not ranked again: no row is ranked by this query.
        assert "j_riders__ranked_" in rewritten and "ri.__chorus_rank <= 1" in rewritten
        assert "ROW_NUMBER()" not in rewritten
        assert any("stored random sample" in n for n in result.report.notes)
        # Joined on the unit, caps 3 and 1: S = 3 * 1 = 3, scale 2 * 3 / 100.  Every rider
        # keeps 3 rides of its 3 or 4 in the sample: 300 per city.
        scale = result.report.columns[1].scale
        assert scale == pytest.approx(2 * 3 / 100)
        for city, n in result.rows:
            assert abs(n - 300) <= tolerance(result.report.columns[1]), city
