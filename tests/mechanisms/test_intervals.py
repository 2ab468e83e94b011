"""Intervals of output columns (``mechanisms.intervals``): hand-computed cases, the evaluator's
enclosure property against DuckDB, bias, post-processing and presentation.

The coverage of the intervals over repeated releases is tested in ``test_interval_coverage.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import duckdb
import numpy as np
import pytest
import sqlglot
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from sqlglot import exp

from mechanisms import DiscreteLaplace, Gaussian, Laplace, Mechanism, Snapping
from mechanisms.intervals import (
    DEFAULT_DRAWS,
    UNBOUNDED_DENOMINATOR,
    WORK_BUDGET,
    Bias,
    Interval,
    NoInterval,
    _noise,
    clamp_count,
    draws_for,
    format_interval,
    output_interval,
    output_intervals,
    postprocessed,
    with_bias,
)
from tests.mechanisms.stats import check_moments, discrete_laplace_moments

COUNT = DiscreteLaplace.from_sensitivity(1, 0.5)   # scale 2, 95% bound 6
SUM = Snapping.from_sensitivity(100, 0.5)


def parse(sql: str) -> exp.Expr:
    return sqlglot.parse_one(sql, read="duckdb")


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


# -- exact intervals: one measurement --------------------------------------------------------------


def test_count_is_the_mechanisms_own_bound() -> None:
    assert COUNT.error_bound(0.95) == 6.0
    iv = output_interval(parse("m0"), {"m0": 1000}, {"m0": COUNT})
    assert isinstance(iv, Interval)
    assert (iv.estimate, iv.lower, iv.upper, iv.method, iv.half_width) == (
        1000.0, 994.0, 1006.0, "exact", 6.0)


def test_sum_is_the_snapping_bound() -> None:
    t = SUM.error_bound(0.95)  # b ln 20 + Lambda / 2
    assert t == pytest.approx(SUM.scale * math.log(20.0) + SUM.Lambda / 2)
    iv = output_interval(parse("m0"), {"m0": 5120.0}, {"m0": SUM})
    assert isinstance(iv, Interval)
    assert (iv.lower, iv.upper) == (5120.0 - t, 5120.0 + t)


def test_a_join_sum_on_its_grid_scales_the_bound() -> None:
    iv = output_interval(parse("(m0 * 0.25)"), {"m0": 400}, {"m0": COUNT})
    assert isinstance(iv, Interval)
    assert (iv.estimate, iv.lower, iv.upper) == (100.0, 98.5, 101.5)


@pytest.mark.parametrize(("sql", "value", "lower", "upper"), [
    ("2 * m0 + 10", 100, 2 * 94 + 10, 2 * 106 + 10),
    ("-m0", 100, -106, -94),
    ("ABS(m0)", 2, 0, 8),
    ("ABS(m0)", -10, 4, 16),
    ("m0 * m0", 2, -32, 64),               # encloses x**2 on [-4, 8], loosely (x read twice)
    ("POWER(m0, 2)", 2, 0, 64),            # the even power is tight
    ("POWER(m0, 3)", 2, -64, 512),
    ("SQRT(m0)", 100, math.sqrt(94), math.sqrt(106)),
    ("SQRT(m0)", 2, 0, math.sqrt(8)),      # the truth is in SQRT's domain
    ("LN(m0)", 100, math.log(94), math.log(106)),
    ("LOG(m0)", 100, math.log10(94), math.log10(106)),
    ("LOG(2, m0)", 100, math.log2(94), math.log2(106)),
    ("EXP(m0 / 100.0)", 100, math.exp(0.94), math.exp(1.06)),
    ("FLOOR(m0 / 4.0)", 100, 23, 26),
    ("CEIL(m0 / 4.0)", 100, 24, 27),
    ("ROUND(m0 / 3.0, 1)", 100, 31.3, 35.3),
    ("CAST(m0 / 4.0 AS BIGINT)", 100, 24, 26),   # 23.5 and 26.5 are ties: to even
    ("CAST(m0 / 8.0 AS DECIMAL(10, 1))", 100, 11.7, 13.3),
    ("SIGN(m0)", 3, -1, 1),
    ("LEAST(GREATEST(m0, 0), 100)", 97, 91, 100),
    ("GREATEST(m0, 1000)", 100, 1000, 1000),
    ("CASE WHEN m0 > 200 THEN 1 ELSE 0 END", 100, 0, 0),
    ("CASE WHEN m0 > 103 THEN 1 ELSE 0 END", 100, 0, 1),
    ("CASE WHEN m0 BETWEEN 0 AND 200 THEN m0 ELSE -1 END", 100, 94, 106),
    ("CASE WHEN NOT (m0 < 10 OR m0 > 1000) AND TRUE THEN 2 ELSE 3 END", 100, 2, 2),
    ("IF(m0 = 100, 1, 2)", 100, 1, 2),
    ("COALESCE(m0, 0)", 100, 94, 106),
    ("100.0 / m0", 100, 100 / 106, 100 / 94),
    ("100.0 / NULLIF(m0, 0)", 100, 100 / 106, 100 / 94),
    ("7 % 3 + m0", 100, 95, 107),
])
def test_expressions_of_one_measurement(sql: str, value: float, lower: float,
                                        upper: float) -> None:
    iv = output_interval(parse(sql), {"m0": value}, {"m0": COUNT})
    assert isinstance(iv, Interval), iv
    assert iv.method == "exact"
    assert iv.lower == pytest.approx(lower)
    assert iv.upper == pytest.approx(upper)


def test_a_constant_output_is_exact() -> None:
    iv = output_interval(parse("1 + 2"), {}, {})
    assert isinstance(iv, Interval)
    assert (iv.estimate, iv.lower, iv.upper) == (3.0, 3.0, 3.0)


def test_numeric_group_keys_are_exact_values() -> None:
    (a, b) = output_intervals(parse("m0 / k0"), {"m0": [100, 100]}, {"m0": COUNT},
                              keys={"k0": [2, 4]})
    assert isinstance(a, Interval) and isinstance(b, Interval)
    assert (a.lower, a.upper, b.lower, b.upper) == (47.0, 53.0, 23.5, 26.5)


# -- division near 0 -------------------------------------------------------------------------------


def test_a_ratio_whose_denominator_reaches_zero_is_unbounded() -> None:
    iv = output_interval(parse("m1 / m0"), {"m0": 4, "m1": 500.0}, {"m0": COUNT, "m1": SUM},
                         rng=rng())
    assert isinstance(iv, Interval)
    assert not iv.bounded and (iv.lower, iv.upper) == (-math.inf, math.inf)
    assert iv.notes == (UNBOUNDED_DENOMINATOR,)
    assert iv.estimate == 125.0
    assert format_interval(iv) == "125, no error bound, " + UNBOUNDED_DENOMINATOR


def test_the_guard_of_avg_does_not_hide_a_count_near_zero() -> None:
    # AVG = c + S / GREATEST(n, 1), clamped into [l, u]: the count's interval reaches 0, so the
    # honest answer is the whole declared range, never a narrow interval around a noisy ratio.
    avg = parse("LEAST(GREATEST(50.0 + m1 / GREATEST(m0, 1.0), 0.0), 100.0)")
    iv = output_interval(avg, {"m0": 3, "m1": -30.0}, {"m0": COUNT, "m1": SUM}, rng=rng())
    assert isinstance(iv, Interval)
    assert (iv.lower, iv.upper) == (0.0, 100.0)
    assert iv.notes == (UNBOUNDED_DENOMINATOR,)
    large = output_interval(avg, {"m0": 5000, "m1": -30000.0}, {"m0": COUNT, "m1": SUM},
                            rng=rng())
    assert isinstance(large, Interval) and large.notes == ()
    assert 40 < large.lower < 44 < large.upper < 48


def test_the_released_null_of_a_zero_denominator() -> None:
    iv = output_interval(parse("m1 / NULLIF(m0, 0)"), {"m0": 0, "m1": 5.0},
                         {"m0": COUNT, "m1": SUM}, rng=rng())
    assert isinstance(iv, Interval)
    assert iv.estimate is None and not iv.bounded
    assert format_interval(iv).startswith("NULL")


def test_rows_are_independent() -> None:
    ivs = output_intervals(parse("m1 / m0"), {"m0": [4, 4000], "m1": [500.0, 500.0]},
                           {"m0": COUNT, "m1": SUM}, rng=rng())
    assert [isinstance(iv, Interval) and iv.bounded for iv in ivs] == [False, True]


# -- refusals --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("sql", "why"), [
    ("m0 || 'x'", "DPIPE"),
    ("CASE WHEN m0 > 1 THEN 1 END", "without ELSE"),
    ("m0 % 7", "modulo of a noisy value"),
    ("NULL", "NULL"),
    ("'a'", "string"),
    ("NULLIF(m0, 3)", "NULLIF"),
    ("k0 + m0", "k0"),
    ("CAST(m0 AS TEXT)", "not a number"),
    ("ROUND(m0, m0)", "noisy number of decimals"),
    ("LOG(m0, 2)", "base"),
    ("CASE m0 WHEN 1 THEN 1 ELSE 2 END", "CASE x WHEN"),
])
def test_unknown_or_unboundable_expressions_get_no_interval(sql: str, why: str) -> None:
    (iv,) = output_intervals(parse(sql), {"m0": [100]}, {"m0": COUNT}, keys={"k0": ["SF"]})
    assert isinstance(iv, NoInterval)
    assert why in iv.reason
    assert format_interval(iv) == iv.reason


@dataclass(frozen=True, kw_only=True)
class _Uniform(Mechanism):
    """A mechanism the intervals module has no noise model for (not a real mechanism)."""

    name: ClassVar[str] = "uniform"

    def _check_calibration(self) -> None:
        return None

    def error_bound(self, confidence: float = 0.95) -> float:
        return self.scale * confidence

    def variance(self) -> float:
        return self.scale * self.scale / 3

    def render_sql(self, value: exp.Expr, dialect: str) -> exp.Expr:
        raise NotImplementedError

    def sample(self, values: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def rdp(self, alpha: float) -> float:
        raise NotImplementedError


def test_a_mechanism_without_a_noise_model_gets_no_interval() -> None:
    odd = _Uniform(sensitivity=1.0, epsilon=1.0, scale=1.0)
    # Alone, its own error bound suffices; combined, its distribution is needed.
    assert isinstance(output_interval(parse("m0"), {"m0": 5.0}, {"m0": odd}), Interval)
    iv = output_interval(parse("m0 + m1"), {"m0": 5.0, "m1": 1}, {"m0": odd, "m1": COUNT})
    assert isinstance(iv, NoInterval) and "uniform" in iv.reason


def test_caller_errors_raise() -> None:
    with pytest.raises(ValueError, match="need both"):
        output_intervals(parse("m0 + m1"), {"m0": [1]}, {"m0": COUNT, "m1": COUNT})
    with pytest.raises(ValueError, match="unequal"):
        output_intervals(parse("m0 + m1"), {"m0": [1], "m1": [1, 2]}, {"m0": COUNT, "m1": COUNT})
    with pytest.raises(ValueError, match="NaN"):
        output_intervals(parse("m0"), {"m0": [math.nan]}, {"m0": COUNT})
    with pytest.raises(ValueError, match="too few"):
        output_intervals(parse("m0 + m1"), {"m0": [1], "m1": [1]}, {"m0": COUNT, "m1": COUNT},
                         draws=20)
    with pytest.raises(ValueError, match="confidence"):
        output_intervals(parse("m0"), {"m0": [1]}, {"m0": COUNT}, confidence=1.0)


# -- simulation ------------------------------------------------------------------------------------


def _laplace_sum_quantile(b: float, tail: float) -> float:
    """t with P(L1 + L2 > t) = tail, L1, L2 i.i.d. Laplace(b): 0.5 e**(-t/b) (1 + t/(2b))."""
    lo, hi = 0.0, 100.0 * b
    for _ in range(200):
        mid = (lo + hi) / 2
        if 0.5 * math.exp(-mid / b) * (1 + mid / (2 * b)) > tail:
            lo = mid
        else:
            hi = mid
    return hi


def test_a_sum_of_two_laplace_measurements_matches_the_closed_form() -> None:
    lap = Laplace.from_sensitivity(1.0, 0.1)  # b = 10
    t = _laplace_sum_quantile(10.0, 0.025)
    iv = output_interval(parse("m0 + m1"), {"m0": 500.0, "m1": 300.0}, {"m0": lap, "m1": lap},
                         draws=200_000, rng=rng(1))
    assert isinstance(iv, Interval) and iv.method == "simulation"
    assert iv.lower == pytest.approx(800.0 - t, rel=0, abs=0.02 * t)
    assert iv.upper == pytest.approx(800.0 + t, rel=0, abs=0.02 * t)
    # The difference has the same distribution (the noise is symmetric).
    diff = output_interval(parse("m0 - m1"), {"m0": 500.0, "m1": 300.0},
                           {"m0": lap, "m1": lap}, draws=200_000, rng=rng(2))
    assert isinstance(diff, Interval)
    assert diff.upper - diff.lower == pytest.approx(2 * t, rel=0.02)


def test_a_snapped_measurement_is_simulated_as_a_box() -> None:
    # Two snapped sums: the draws carry +-Lambda/2 each, so the interval is wider than the one of
    # the Laplace parts alone by about Lambda (one half-step on each side, from each measurement).
    snap = Snapping.from_sensitivity(1.0, 0.1)
    lap = Laplace(sensitivity=1.0, epsilon=0.1, scale=snap.scale)
    args = (parse("m0 + m1"), {"m0": 0.0, "m1": 0.0})
    boxed = output_interval(*args, {"m0": snap, "m1": snap}, draws=200_000, rng=rng(3))
    plain = output_interval(*args, {"m0": lap, "m1": lap}, draws=200_000, rng=rng(3))
    assert isinstance(boxed, Interval) and isinstance(plain, Interval)
    assert boxed.upper - plain.upper == pytest.approx(snap.Lambda, rel=1e-9)
    assert plain.lower - boxed.lower == pytest.approx(snap.Lambda, rel=1e-9)


@pytest.mark.parametrize("mech", [
    DiscreteLaplace.from_sensitivity(1, 0.5), DiscreteLaplace.from_sensitivity(3, 0.01),
    Laplace.from_sensitivity(2.0, 0.3), Gaussian.from_sensitivity(1.0, 0.5, 1e-6),
    Snapping.from_sensitivity(10.0, 0.2),
])
def test_the_noise_models_have_the_mechanisms_moments(mech: Mechanism) -> None:
    n = 200_000
    noise, half = _noise(mech, (1, n), rng(4))
    if isinstance(mech, DiscreteLaplace):
        var, mu4 = discrete_laplace_moments(mech.scale)
        assert np.all(noise == np.round(noise))
    elif isinstance(mech, Gaussian):
        var, mu4 = mech.variance(), 3 * mech.variance() ** 2
    else:  # Laplace, and the Laplace part of snapping
        var, mu4 = 2 * mech.scale**2, 24 * mech.scale**4
    check_moments(noise.reshape(-1), 0.0, var, mu4, mech.name)
    assert half == (mech.Lambda / 2 if isinstance(mech, Snapping) else 0.0)


def test_the_default_generator_is_fresh_each_time() -> None:
    args = (parse("m0 + m1"), {"m0": 0, "m1": 0}, {"m0": COUNT, "m1": COUNT})
    seen = {(iv.lower, iv.upper) for iv in (output_interval(*args, draws=39) for _ in range(30))
            if isinstance(iv, Interval)}
    assert len(seen) > 1


# -- the evaluator encloses what DuckDB computes ---------------------------------------------------

_DUCK = duckdb.connect()


def _leaf() -> st.SearchStrategy[str]:
    return st.one_of(st.just("m0"), st.just("m1"),
                     st.integers(-20, 20).map(lambda v: f"CAST({v} AS DOUBLE)"))


def _grow(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    pairs = st.tuples(inner, inner)
    return st.one_of(
        pairs.map(lambda p: f"({p[0]} + {p[1]})"),
        pairs.map(lambda p: f"({p[0]} - {p[1]})"),
        pairs.map(lambda p: f"({p[0]} * {p[1]})"),
        pairs.map(lambda p: f"({p[0]} / NULLIF({p[1]}, 0))"),
        inner.map(lambda a: f"ABS({a})"),
        inner.map(lambda a: f"(-{a})"),
        inner.map(lambda a: f"ROUND({a})"),
        inner.map(lambda a: f"ROUND({a}, 1)"),
        inner.map(lambda a: f"FLOOR({a})"),
        inner.map(lambda a: f"CEIL({a})"),
        inner.map(lambda a: f"SIGN({a})"),
        inner.map(lambda a: f"SQRT(ABS({a}))"),
        inner.map(lambda a: f"LN(ABS({a}) + 1)"),
        inner.map(lambda a: f"CAST({a} AS BIGINT)"),
        inner.map(lambda a: f"CAST({a} AS DECIMAL(18, 1))"),
        inner.map(lambda a: f"POWER(ABS({a}), 0.5)"),
        inner.map(lambda a: f"POWER({a}, 3)"),
        inner.map(lambda a: f"POWER({a}, -2)"),
        inner.map(lambda a: f"EXP({a} / 20.0)"),
        pairs.map(lambda p: f"LEAST({p[0]}, {p[1]})"),
        pairs.map(lambda p: f"GREATEST({p[0]}, {p[1]})"),
        st.tuples(inner, inner, inner, inner).map(
            lambda p: f"CASE WHEN {p[0]} > {p[1]} THEN {p[2]} ELSE {p[3]} END"),
    )


_EXPRESSIONS = st.recursive(_leaf(), _grow, max_leaves=6)
_VALUES = st.floats(-50, 50, allow_nan=False).map(lambda v: round(v, 3))


def _duck_value(sql: str, m0: float, m1: float) -> float | None:
    try:
        row = _DUCK.execute(
            f"SELECT CAST({sql} AS DOUBLE) FROM (SELECT CAST(? AS DOUBLE) AS m0, "
            "CAST(? AS DOUBLE) AS m1)", [m0, m1]).fetchone()
    except duckdb.Error:  # e.g. a DECIMAL cast out of range: SQL fails, nothing to enclose
        assume(False)
        raise
    assert row is not None
    return None if row[0] is None or math.isnan(row[0]) else float(row[0])


@settings(max_examples=300, deadline=None, derandomize=True)
@given(_EXPRESSIONS, _VALUES, _VALUES, st.floats(0, 1))
def test_the_exact_interval_holds_the_expression_anywhere_in_the_box(
        sql: str, y0: float, y1: float, u0: float) -> None:
    # One measurement (m1 becomes a constant), so the module takes its exact path: the result
    # must hold the value DuckDB computes at any point of the box [y0 - t, y0 + t].
    tree = parse(sql)
    assume(any(c.name == "m0" for c in tree.find_all(exp.Column)))
    one = tree.transform(lambda n: exp.Literal.number(y1) if isinstance(n, exp.Column) and
                         n.name == "m1" else n)
    iv = output_interval(one, {"m0": y0}, {"m0": COUNT})
    assert isinstance(iv, Interval), iv
    t = COUNT.error_bound()
    x0 = y0 - t + 2 * t * u0
    got = _duck_value(one.sql("duckdb"), x0, 0.0)
    if got is not None:
        assert iv.lower - 1e-9 * (1 + abs(got)) <= got <= iv.upper + 1e-9 * (1 + abs(got)), (
            sql, y0, x0, got, iv)
    estimate = _duck_value(one.sql("duckdb"), y0, 0.0)
    if iv.estimate is not None and estimate is not None:
        assert iv.estimate == pytest.approx(estimate, rel=1e-9, abs=1e-9), (one.sql(), y0)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(_EXPRESSIONS, _VALUES, _VALUES)
def test_the_estimate_is_what_duckdb_computes(sql: str, y0: float, y1: float) -> None:
    tree = parse(sql)
    iv = output_interval(tree, {"m0": y0, "m1": y1}, {"m0": COUNT, "m1": COUNT}, draws=39,
                         rng=rng())
    assert isinstance(iv, Interval), iv
    expected = _duck_value(sql, y0, y1)
    if expected is None or iv.estimate is None:
        return  # NULL in SQL; the module gives no estimate (or an enclosure of both)
    assert iv.estimate == pytest.approx(expected, rel=1e-9, abs=1e-9), (sql, y0, y1)
    assert iv.lower <= iv.estimate <= iv.upper


# -- bias, post-processing, presentation -----------------------------------------------------------


def _interval(estimate: float, lower: float, upper: float) -> Interval:
    return Interval(estimate, lower, upper, lower, upper, 0.95, "exact")


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.floats(-1e6, 1e6), st.floats(0, 0.99), st.floats(0, 1), st.floats(0, 1e4),
       st.floats(0, 1e4), st.sampled_from(["low", "high"]))
def test_a_widened_interval_holds_the_truth(truth: float, f: float, share: float,
                                            below: float, above: float,
                                            direction: str) -> None:
    # The measured value is off by at most f |truth| in the stated direction; the noise interval
    # holds the measured value; then the widened interval holds the truth.
    off = share * f * abs(truth)
    measured = truth - off if direction == "low" else truth + off
    iv = with_bias(_interval(measured, measured - below, measured + above),
                   Bias(direction, f, "why"))  # type: ignore[arg-type]
    slack = 1e-9 * (1 + abs(truth))
    assert iv.lower - slack <= truth <= iv.upper + slack
    assert (iv.noise_lower, iv.noise_upper) == (measured - below, measured + above)


def test_bias_widens_one_side_only() -> None:
    iv = with_bias(_interval(100.0, 90.0, 110.0), Bias("low", 0.1, "rows above the cap"))
    assert (iv.lower, iv.upper) == (90.0, pytest.approx(110.0 / 0.9))
    high = with_bias(_interval(-100.0, -110.0, -90.0), Bias("high", 0.1, "clipped"))
    assert (high.lower, high.upper) == (pytest.approx(-110.0 / 0.9), -90.0)
    with pytest.raises(ValueError):
        Bias("low", 1.0, "x")
    with pytest.raises(ValueError):
        Bias("sideways", 0.1, "x")  # type: ignore[arg-type]


def test_counts_are_clamped_and_rounded() -> None:
    assert [clamp_count(v) for v in (-305, -0.4, 0, 2.5, 41.4, 7)] == [0, 0, 0, 3, 41, 7]
    with pytest.raises(ValueError):
        clamp_count(math.inf)
    iv = postprocessed(_interval(-3.0, -9.0, 3.0), lower=0.0, integral=True)
    assert (iv.estimate, iv.lower, iv.upper) == (0.0, 0.0, 3.0)
    avg = postprocessed(_interval(101.0, 95.5, 106.5), lower=0.0, upper=100.0)
    assert (avg.estimate, avg.lower, avg.upper) == (100.0, 95.5, 100.0)
    # No integer inside: kept, rounded outwards, rather than invented.
    odd = postprocessed(_interval(2.5, 2.2, 2.8), integral=True)
    assert (odd.lower, odd.upper) == (2.0, 3.0)
    with pytest.raises(ValueError):
        postprocessed(_interval(1.0, 0.0, 2.0), lower=5.0, upper=1.0)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.integers(0, 10_000), st.floats(-1e4, 1e4), st.floats(0, 1e3), st.floats(0, 1e3))
def test_postprocessing_keeps_an_integer_truth(truth: int, estimate: float, below: float,
                                               above: float) -> None:
    raw = _interval(estimate, estimate - below, estimate + above)
    iv = postprocessed(raw, lower=0.0, integral=True)
    if raw.lower <= truth <= raw.upper:
        assert iv.lower <= truth <= iv.upper
    assert iv.lower >= 0 and iv.upper - iv.lower <= raw.upper - raw.lower + 1


@pytest.mark.parametrize(("iv", "text"), [
    (_interval(5112.0, 4972.0, 5252.0), "5,112 ± 140 (noise)"),
    (_interval(47.0123, 46.21, 47.80), "47.01 ± 0.80 (noise)"),
    (_interval(0.4123, 0.378, 0.446), "0.412 ± 0.034 (noise)"),
    (_interval(1204.0, 1150.0, 1290.0), "1,204 -54/+86 (noise)"),
    (_interval(0.0, 0.0, 6.0), "0 +6 (noise)"),
    (_interval(100.0, 95.5, 100.0), "100.0 -4.5 (noise)"),
    (_interval(-0.001, -0.3, 0.3), "0.00 ± 0.30 (noise)"),
])
def test_format(iv: Interval, text: str) -> None:
    assert format_interval(iv) == text


def test_format_with_bias_and_notes() -> None:
    iv = with_bias(_interval(5112.0, 4972.0, 5252.0), Bias("low", 0.03, "trips above the cap"))
    iv = with_bias(iv, Bias("high", 0.005, "fares clipped"))
    assert format_interval(iv) == ("5,112 ± 140 (noise), up to 3% low (trips above the cap), "
                                   "up to 0.5% high (fares clipped)")


def test_many_rows_get_fewer_draws_but_keep_their_coverage_bound() -> None:
    assert draws_for(1) == DEFAULT_DRAWS
    assert draws_for(WORK_BUDGET // 500) == 500
    assert draws_for(10**7) == 199 and draws_for(10**7, 0.9) == 100  # 1 - 0.9 is just below 0.1
    ivs = output_intervals(parse("m0 + m1"), {"m0": [0] * 20_000, "m1": [0] * 20_000},
                           {"m0": COUNT, "m1": COUNT}, rng=rng())
    assert {iv.draws for iv in ivs if isinstance(iv, Interval)} == {199}


def test_an_empty_result_has_no_intervals() -> None:
    assert output_intervals(parse("m0 + m1"), {"m0": [], "m1": []},
                            {"m0": COUNT, "m1": COUNT}) == ()
