"""Quantiles next to other aggregates with HAVING and outputs that combine them
(``analyses.mixed``, ``chorus_py.kinds.mixed``) on DuckDB and Postgres: every aggregate is one
noisy measurement, charged; the outputs, HAVING and ORDER BY are computed over the released
values only (an exact count never filters), the report's epsilon parts add up to the charge."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from chorus_py.engine import Engine
from tests.test_quantiles import ALICE, CREATE, POLICY, _values


@pytest.fixture
def skew(scratch: Callable[..., Engine]) -> Iterator[Engine]:
    """The skewed table of tests/test_quantiles.py: groups a (300 rows), b (101), c (none)."""
    engine = scratch("skew", CREATE, POLICY)
    yield engine
    engine.backend.run_owned(["DROP TABLE IF EXISTS quant_other"])


def _exact_count(engine: Engine, where: str) -> int:
    return int(engine.backend.run(f"SELECT COUNT(*) FROM skew WHERE {where}").rows[0][0])


def _charged(engine: Engine) -> float:
    (claim,) = engine.ledger.claims()
    return claim.epsilon


def _parts_add_up(result: object, epsilon: float) -> None:
    """Each distinct mechanism's epsilon (a joint draw once) and the row cap's choice (the
    analytic part's, ``report.contribution``) add up to the query's."""
    seen = {}
    for m in result.report.measurements:
        joint = m.mechanism.get("quantiles")  # one joint draw serves several quantiles
        key = tuple(joint) if joint else m.id
        seen[key] = m.mechanism["epsilon"]
    chosen = result.report.contribution.epsilon if result.report.contribution else 0.0
    assert sum(seen.values()) + chosen == pytest.approx(epsilon)


def test_having_filters_on_the_noisy_count_it_shows(skew: Engine) -> None:
    """COUNT(*) in SELECT and in HAVING is one measurement: eps 20 split 1/2 to the median
    (Delta = 3 * 0.5 = 1.5), 1/2 to the count (Delta = k = 3).  Group a holds 300 rows, b about
    100, c none: at a scale of 0.3 only a clears 150."""
    sql = ("SELECT g, MEDIAN(v) AS med, COUNT(*) AS n FROM skew GROUP BY g "
           "HAVING COUNT(*) > 150 ORDER BY g")
    result = skew.execute(sql, epsilon=20.0, **ALICE)
    q0, m0 = result.report.measurements
    assert (q0.sensitivity, q0.mechanism["epsilon"]) == (1.5, 10.0)
    assert (m0.sensitivity, m0.mechanism["epsilon"]) == (3.0, 10.0)
    assert [r[0] for r in result.rows] == ["a"]
    assert result.columns == ("g", "med", "n") and result.types == ("text", "float", "integer")
    assert abs(result.rows[0][2] - _exact_count(skew, "g = 'a'")) <= 10
    assert _charged(skew) == pytest.approx(20.0)
    _parts_add_up(result, 20.0)


def test_having_on_an_aggregate_not_selected_is_measured_and_charged(skew: Engine) -> None:
    """HAVING COUNT(*) names a count the SELECT does not: it is a measurement all the same
    (its noisy value filters), so the split is 1 quantile + 1 count, 10 each."""
    sql = "SELECT g, MEDIAN(v) AS med FROM skew GROUP BY g HAVING COUNT(*) > 150"
    explained = skew.explain(sql, epsilon=20.0, **ALICE)  # runs and charges nothing
    assert [m.id for m in explained.measurements] == ["q0", "m0"]
    assert not skew.ledger.claims()
    result = skew.execute(sql, epsilon=20.0, **ALICE)
    assert result.columns == ("g", "med")
    assert [r[0] for r in result.rows] == ["a"]
    _, m0 = result.report.measurements
    assert m0.aggregate.startswith("COUNT") and m0.mechanism["epsilon"] == 10.0
    assert _charged(skew) == pytest.approx(20.0)


@pytest.mark.parametrize("attempt", range(4))
def test_an_exact_count_never_filters(skew: Engine, attempt: int) -> None:
    """HAVING COUNT(*) = <the exact count of a>: filtering on the exact count would always
    keep a, with a noisy count (scale 3 / 0.25 = 12) that is rarely exact.  Filtering on the
    released count keeps a row only when the count it shows is that number."""
    exact = _exact_count(skew, "g = 'a'")
    result = skew.execute(f"SELECT g, COUNT(*) AS n, MEDIAN(v) FROM skew GROUP BY g "
                          f"HAVING COUNT(*) = {exact}", epsilon=0.5, **ALICE)
    assert all(n == exact for _, n, _ in result.rows)


def test_outputs_combining_quantiles_and_aggregates(skew: Engine) -> None:
    """MAX - MIN and AVG / MEDIAN: quantiles MAX, MIN, MEDIAN of v (n_q = 3, drawn jointly),
    AVG = a sum and a count (n_a = 2): at eps 50, 30 to the quantiles (Delta 2k = 6), 20 to
    the AVG.  The outputs are derived columns without an interval."""
    values = _values(skew, "SELECT v FROM skew")
    sql = "SELECT MAX(v) - MIN(v) AS spread, AVG(v) / MEDIAN(v) AS ratio FROM skew"
    result = skew.execute(sql, epsilon=50.0, **ALICE)
    quantiles = [m for m in result.report.measurements if m.id.startswith("q")]
    assert len(quantiles) == 3 and {m.sensitivity for m in quantiles} == {6.0}
    assert {m.mechanism["epsilon"] for m in quantiles} == {30.0}
    assert [c.role for c in result.report.columns] == ["derived", "derived"]
    assert "post-processing" in result.report.columns[0].note
    _parts_add_up(result, 50.0)
    assert _charged(skew) == pytest.approx(50.0)
    spread, ratio = result.rows[0]
    assert 80 <= spread <= 100
    mean, median = sum(values) / len(values), values[len(values) // 2]
    assert ratio == pytest.approx(mean / median, rel=0.5)
    bars = result.error_bars.intervals()[0]
    assert "several noisy values" in bars[0].reason


def test_one_release_per_aggregate_whatever_the_outputs(skew: Engine) -> None:
    """The same aggregate named in several outputs is drawn once: each output is a function of
    the values shown next to it, exactly."""
    result = skew.execute("SELECT g, MEDIAN(v) AS med, COUNT(*) AS n, MEDIAN(v) * 2 AS twice, "
                          "COUNT(*) + 1 AS n1 FROM skew GROUP BY g ORDER BY SUM(v) DESC",
                          epsilon=30.0, **ALICE)
    assert len(result.report.measurements) == 3  # MEDIAN, COUNT, the SUM that orders
    for _, med, n, twice, n1 in result.rows:
        assert twice == pytest.approx(2 * med) and n1 == n + 1
    assert [r[0] for r in result.rows] == ["b", "a", "c"]  # sums 7838, 5662, 0


@pytest.mark.parametrize("spelling, p", [
    ("PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY v)", 0.5),
    ("PERCENTILE_DISC(0.9) WITHIN GROUP (ORDER BY v)", 0.9),
    ("PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY v DESC)", 0.1)])
def test_the_within_group_spelling_next_to_a_count(skew: Engine, spelling: str,
                                                   p: float) -> None:
    """The SQL-standard spelling next to another aggregate: answered on both backends (on
    DuckDB it was refused: sqlglot wrote its part as QUANTILE_CONT(v, p ORDER BY v), which
    parses back with the ORDER BY in the fraction's place), near the true p-quantile."""
    values = _values(skew, "SELECT v FROM skew")
    result = skew.execute(f"SELECT {spelling} AS q, COUNT(*) AS n FROM skew", epsilon=20.0,
                          **ALICE)
    (q, n), = result.rows
    rank = sum(1 for x in values if x < q)
    assert abs(rank - p * len(values)) <= 0.1 * len(values)
    assert abs(n - len(values)) <= 10
    _parts_add_up(result, 20.0)
