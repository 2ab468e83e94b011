"""Single-table SQL templates (chorus_py.kinds.templates): a filled template equals the full
rendering
character for character, for any cap, bounds and epsilon; a new cap costs no rewrite."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import chorus_py.kinds.single as engine_module
from analyses.query import AggregateQuery, analyze_query
from analyses.validate import parse_statement
from chorus_py.engine import Engine
from chorus_py.kinds.selection import Choices, Selection
from chorus_py.kinds.templates import OneTableTemplate, signature
from chorus_py.policy import load_policy
from mechanisms.planning import NoisePlan, NoiseRequest, ThresholdRequest, plan_noise
from rewriters.contribution import counted_pays
from rewriters.pipeline import pipeline

SHAPES = [
    "SELECT COUNT(*) FROM trips WHERE city = 'SF'",
    "SELECT SUM(fare) AS s FROM trips",
    "SELECT AVG(fare) AS a FROM trips WHERE distance_km > 10",
    "SELECT STDDEV(fare) AS sd, AVG(fare) AS a FROM trips",
    "SELECT city, COUNT(*) AS n, SUM(distance_km) AS d FROM trips GROUP BY city",
    "SELECT driver_id, COUNT(*) AS n FROM trips GROUP BY driver_id",
    "SELECT city, AVG(fare) AS a FROM trips GROUP BY city HAVING AVG(fare) > 20 "
    "ORDER BY AVG(fare) DESC",
    # Negative and non-integral declared bounds (table readings below): centres of any sign.
    "SELECT AVG(temp) AS t, SUM(dip) AS d, VARIANCE(dip) AS v FROM readings",
    "SELECT site, AVG(temp) AS t FROM readings GROUP BY site HAVING AVG(temp) < 0 "
    "ORDER BY -AVG(temp)",
]
READINGS = """
[tables.readings]
privacy_unit = "sensor_id"
max_rows_per_unit = 10
contribution = "auto"
[tables.readings.columns]
sensor_id = { type = "int", private_id = true }
site = { type = "text" }
temp = { type = "float", lower = -40.5, upper = 50 }
dip = { type = "float", lower = -30, upper = -2 }
"""
# The clipped arguments and their declared intervals.
BOUNDS = {'"trips"."fare"': (0, 200), '"trips"."distance_km"': (0, 100),
          '"readings"."temp"': (-40.5, 50), '"readings"."dip"': (-30, -2)}


@pytest.fixture(scope="module")
def analysed(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], AggregateQuery]:
    from tests.conftest import POLICY_TEMPLATE
    path = Path(tmp_path_factory.mktemp("tpl")) / "policy.toml"
    path.write_text(POLICY_TEMPLATE.format(
        url="duckdb:///unused.duckdb", noise="sql", k=10, epsilon_per_block=1000.0,
        max_epsilon=500.0, contribution="auto") + READINGS)
    policy = load_policy(path)
    out = {}
    # Constants are judged by the backend that runs them (analyses.totality): a real Postgres.
    import psycopg

    from tests.conftest import PG_ADMIN_URL

    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as pg:
        def on_postgres(sql: str) -> bool:
            try:
                pg.execute(sql).fetchall()
            except psycopg.Error:
                return False
            return True

        for dialect in ("duckdb", "postgres"):
            for sql in SHAPES:
                parsed = parse_statement(sql, dialect, frozenset(policy.tables))
                out[(dialect, sql)] = analyze_query(
                    parsed, policy, dialect, {"cities": {}},
                    on_postgres if dialect == "postgres" else None)
    return out


def _plan(query: AggregateQuery, epsilon: float) -> NoisePlan:
    """As Engine._prepare_uncached plans it."""
    requests = [NoiseRequest(m.id, m.sensitivity, m.integral) for m in query.measurements]
    threshold = ThresholdRequest(query.threshold_source, query.groups_per_unit) \
        if query.thresholded else None
    return plan_noise(requests, epsilon, 1e-8, threshold, 0.2)


def _render(dialect: str, sample: tuple[str, str] | None = None,
            ranked: tuple[str, str] | None = None, counted: bool | None = None
            ) -> Callable[[AggregateQuery, NoisePlan], str]:
    """As the engine renders: over a ranked copy, the heavy branch's shape fixed by the real
    cap (``counted``, as ``kinds.single`` fixes it for a template's probes)."""
    return lambda q, p: pipeline(q, p, None, dialect, sample, ranked=ranked,
                                 counted=counted).sql_with_noise(p)


_TEMPLATES: dict[tuple[object, ...], OneTableTemplate] = {}
_TEMPLATES_USED: set[tuple[object, ...]] = set()


@st.composite
def _bounds(draw: Any, lower: float, upper: float) -> tuple[float, float]:
    value = st.one_of(st.integers(math.ceil(lower), int(upper)).map(float),
                      st.floats(lower, upper, allow_nan=False))
    if draw(st.booleans()):  # the declared bounds: a ranked copy's stored clipped value
        return float(lower), float(upper)
    a, b = draw(value), draw(value)
    assume(abs(a - b) > 1e-6)  # a (near) zero-width interval has sensitivity 0: refused
    return min(a, b), max(a, b)


@settings(max_examples=300, deadline=None)
@given(shape=st.sampled_from(SHAPES), dialect=st.sampled_from(["duckdb", "postgres"]),
       k=st.integers(1, 10), g=st.integers(1, 10),
       source=st.sampled_from(["table", "sample", "ranked"]),
       bounds=st.fixed_dictionaries({key: _bounds(*b) for key, b in BOUNDS.items()}),
       epsilon=st.floats(1e-3, 100.0))
def test_filled_template_equals_full_rendering(
        analysed: dict[tuple[str, str], AggregateQuery], shape: str, dialect: str, k: int,
        g: int, source: str, bounds: dict[str, tuple[float, float]], epsilon: float) -> None:
    """COUNT, SUM, AVG, STDDEV, VARIANCE, public and thresholded keys (with and without a
    groups bound), HAVING and ORDER BY on AVG, on the table, a stored sample or a ranked copy
    (DuckDB's reads its stored clipped values at the declared bounds), both dialects."""
    base = analysed[(dialect, shape)]
    query = base.with_cap(k).with_bounds(bounds)
    if query.thresholded:
        query = query.with_groups(g)
    plan = _plan(query, epsilon)
    sampled = source == "sample"
    ranked = source == "ranked"
    render = _render(dialect, ("chorus", "s_sample") if sampled else None,
                     ("chorus", "t__ranked_0123456789abcdef") if ranked else None,
                     counted_pays(dialect, k, False) if ranked else None)
    full = render(query, plan)
    key = (dialect, shape, source, ranked and counted_pays(dialect, k, False),
           signature(query, plan, sampled))
    template = _TEMPLATES.get(key)
    if template is None:
        template = OneTableTemplate.build(query, plan, render, dialect, sampled, full)
        assert template is not None, "every one of these shapes can be templated"
        _TEMPLATES[key] = template
    assert template.sql(query, plan) == full
    _TEMPLATES_USED.add(key)


def test_a_template_that_does_not_reproduce_falls_back(
        analysed: dict[tuple[str, str], AggregateQuery], monkeypatch: pytest.MonkeyPatch) -> None:
    """If the filled text ever differs from a full rendering (here: a wrong printer for the
    clipping bounds), no template is kept and every call renders in full."""
    import chorus_py.kinds.templates as templates

    class Cache(dict):  # type: ignore[type-arg]
        def put(self, key: object, value: object) -> None:
            self[key] = value

    # Bounds other than the declared ones: at the declared bounds the template keeps them as
    # fixed text (a ranked copy reads its stored clipped column there), no hole to misprint.
    query = analysed[("duckdb", SHAPES[2])].with_cap(3).with_bounds(
        {'"trips"."fare"': (0, 150)})
    plan = _plan(query, 1.0)
    render = _render("duckdb")
    monkeypatch.setattr(templates, "_bound_text", lambda value, dialect: f"{value!r}")
    assert OneTableTemplate.build(query, plan, render, "duckdb", False,
                                  render(query, plan)) is None
    cache = Cache()
    for k in (3, 4):
        other = analysed[("duckdb", SHAPES[2])].with_cap(k).with_bounds(
            {'"trips"."fare"': (0, 150)})
        assert templates.one_table_sql(cache, ("q",), other, plan, "duckdb", False, render) \
            == render(other, plan)


class _Pipelines:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = engine_module.pipeline

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(engine_module, "pipeline", counted)


@pytest.mark.parametrize("noise", ["sql", "proxy"])  # proxy: its statement and finish as one
def test_new_cap_costs_no_rewrite(backend_url: str, make_engine: Callable[..., Engine],
                                  monkeypatch: pytest.MonkeyPatch, noise: str) -> None:
    engine = make_engine(backend_url, contribution="auto", noise=noise)
    sql = "SELECT COUNT(*) AS n, AVG(fare) AS a FROM trips WHERE pickup_time < '2026-01-03'"
    calls = _Pipelines(monkeypatch)
    # Caps of one shape of the row cap: on DuckDB the caps 4..20 number the kept rows with a
    # running COUNT(*), other caps with ROW_NUMBER (``rewriters.contribution.counted_pays``),
    # each shape a template of its own; the template's probes (other caps) keep the query's.
    chosen = iter([Choices(5, (('"trips"."fare"', 0.0, 120.0),), None),
                   Choices(6, (('"trips"."fare"', 0.0, 140.0),), None),
                   Choices(7, (('"trips"."fare"', 0.0, 150.0),), None)])
    monkeypatch.setattr(Selection, "choose", lambda self, statements, run: next(chosen))
    first = engine.execute(sql, "alice", epsilon=50.0)
    after_first = calls.calls
    # The statement at the limit that comes before the choice is not a sighting of the shape:
    # the first run renders its final statement once, the second builds the template.
    engine.execute(sql, "alice", epsilon=50.0)
    assert calls.calls > after_first
    after_second = calls.calls
    spent = sum(b.epsilon_consumed for b in engine.ledger.blocks())
    third = engine.execute(sql, "alice", epsilon=50.0)
    assert calls.calls == after_second  # the cap 7, bounds and scales were filled in
    assert third.report.contribution is not None and third.report.contribution.cap == 7
    assert first.report.contribution is not None and first.report.contribution.cap == 5
    assert sum(b.epsilon_consumed for b in engine.ledger.blocks()) == pytest.approx(1.5 * spent)
    assert "__chorus_krank <= 7" in (third.report.rewritten_sql or "")
    n, a = third.rows[0]
    assert n > 0 and 0 <= a <= 200


def test_text_template_replaces_whole_tokens_only() -> None:
    from chorus_py.kinds.templates import TextTemplate
    cut = TextTemplate("SELECT 12, 0.125, x12, 12.5, -12, '12.0' FROM t WHERE 12 < k", ["12"])
    assert cut.count("12") == 3
    assert cut.fill({"12": "7"}) == "SELECT 7, 0.125, x12, 12.5, -7, '12.0' FROM t WHERE 7 < k"


def test_a_rescaled_measurement_keeps_its_rendered_argument(
        analysed: dict[tuple[str, str], AggregateQuery]) -> None:
    """A cap, bounds or key values copy each measurement (``dataclasses.replace``): the text of
    its argument, the key of its clipping bounds and a function of the argument alone, is
    carried to the copy, not rendered again, and still equals a fresh rendering."""
    from analyses.trees import sql_text

    query = analysed[("duckdb", SHAPES[3])]  # STDDEV(fare) and AVG(fare)
    assert all(m.argument_sql for m in query.measurements if m.argument is not None)
    moved = query.with_cap(3).with_bounds({'"trips"."fare"': (1.0, 50.0)})
    assert {m.upper for m in moved.measurements if m.upper is not None} == {50.0}
    for m in moved.measurements:
        if m.argument is not None:
            assert "argument_sql" in m.__dict__  # carried over, not computed on this read
            assert m.argument_sql == sql_text(m.argument) == '"trips"."fare"'
