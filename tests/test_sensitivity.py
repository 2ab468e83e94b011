"""Hand-computed sensitivities, epsilon splits, scales and thresholds (through ``explain``).

Every case derives its numbers in the comment next to it.  Policy (tests/conftest.py): trips is
user-level with k = max_rows_per_unit = 10, fare in [0, 200], distance_km in [0, 100], city has 5
public values; visits is event-level (k = 1), seconds in [0, 600].

Scales: discrete Laplace b = Delta / epsilon_i.  Snapping b = Delta * (1 + r) / epsilon_i with the
inflation r = 1e-3 that pays for its clamp (Mironov 2012, Thm 1; see mechanisms/snapping.py).
"""

from __future__ import annotations

import math

import pytest

from chorus_py.engine import Engine

R = 1e-3  # snapping inflation


def _measurements(engine: Engine, sql: str, epsilon: float, delta: float = 1e-8) -> dict:
    report = engine.explain(sql, analyst="alice", epsilon=epsilon, delta=delta)
    return {m.aggregate: m for m in report.measurements}


CASES = [
    # 1. COUNT(*) at user level: a unit adds <= 10 rows -> Delta = 10; eps 0.5 -> b = 20.
    ("SELECT COUNT(*) FROM trips", 0.5, {"COUNT(*)": (10, "discrete_laplace", 20.0)}),
    # 2. COUNT(*) at event level: Delta = 1; eps 2 -> b = 0.5.
    ("SELECT COUNT(*) FROM visits", 2.0, {"COUNT(*)": (1, "discrete_laplace", 0.5)}),
    # 3. SUM(fare), clip [0, 200], k = 10: Delta = 10 * 200 = 2000; eps 0.5 -> 4000 * 1.001.
    ("SELECT SUM(fare) FROM trips", 0.5, {"SUM(trips.fare)": (2000, "snapping", 4004.0)}),
    # 4. AVG(fare) = c + SUM(fare - c) / COUNT(fare), c = (0 + 200) / 2 = 100: eps 1 in halves.
    #    SUM(fare - 100): values in [-100, 100], Delta 10 * 100 = 1000, b = 1000 * 1.001 / 0.5
    #    = 2002;  COUNT(fare): Delta 10, b = 20.
    ("SELECT AVG(fare) FROM trips", 1.0,
     {"SUM(trips.fare - 100)": (1000, "snapping", 2002.0),
      "COUNT(trips.fare)": (10, "discrete_laplace", 20.0)}),
    # 5. COUNT(DISTINCT rider_id) without GROUP BY: a unit moves one count by 1 -> Delta 1.
    ("SELECT COUNT(DISTINCT rider_id) FROM trips", 1.0,
     {"COUNT(DISTINCT rider_id)": (1, "discrete_laplace", 1.0)}),
    # 6. ... grouped by city (5 public values): the unit's <= 10 rows reach <= min(10, 5) = 5
    #    groups -> Delta 5; eps 1 -> b = 5.
    ("SELECT city, COUNT(DISTINCT rider_id) FROM trips GROUP BY city", 1.0,
     {"COUNT(DISTINCT rider_id)": (5, "discrete_laplace", 5.0)}),
    # 7. SUM(fare * 2 - 1): interval [0*2-1, 200*2-1] = [-1, 399] -> Delta = 10 * 399 = 3990.
    ("SELECT SUM(fare * 2 - 1) FROM trips", 1.0,
     {"SUM(trips.fare * 2 - 1)": (3990, "snapping", 3990 * (1 + R))}),
    # 8. SUM(ABS(fare - 100)): fare - 100 in [-100, 100], ABS -> [0, 100] -> Delta = 1000.
    ("SELECT SUM(ABS(fare - 100)) FROM trips", 1.0,
     {"SUM(ABS(trips.fare - 100))": (1000, "snapping", 1000 * (1 + R))}),
    # 9. VARIANCE(distance_km), [0, 100], centred on c = 50: SUM(x - 50) (Delta 10 * 50 = 500),
    #    COUNT x (10), SUM((x - 50)^2) (Delta 10 * 50^2 = 25000); eps 0.9 -> 0.3 each.
    ("SELECT VARIANCE(distance_km) FROM trips", 0.9,
     {"SUM(trips.distance_km - 50)": (500, "snapping", 500 * (1 + R) / 0.3),
      "COUNT(trips.distance_km)": (10, "discrete_laplace", 10 / 0.3),
      "SUM of squares(trips.distance_km - 50)": (25000, "snapping", 25000 * (1 + R) / 0.3)}),
    # 10. Two aggregates share epsilon: COUNT(*) and SUM(seconds) at event level, eps 1:
    #     COUNT Delta 1, b = 2; SUM Delta 600, b = 600 * 1.001 / 0.5 = 1201.2.
    ("SELECT COUNT(*), SUM(seconds) FROM visits", 1.0,
     {"COUNT(*)": (1, "discrete_laplace", 2.0),
      "SUM(visits.seconds)": (600, "snapping", 1201.2)}),
    # 11. Measurements are shared: AVG(fare) and COUNT(fare) use the same COUNT(fare); with
    #     SUM(fare) there are 3 measurements, eps 0.75 / 3 = 0.25 each:
    #     SUM(fare) Delta 2000, b = 8008; SUM(fare - 100) Delta 1000, b = 4004; COUNT b = 40.
    ("SELECT SUM(fare), AVG(fare), COUNT(fare) FROM trips", 0.75,
     {"SUM(trips.fare)": (2000, "snapping", 8008.0),
      "SUM(trips.fare - 100)": (1000, "snapping", 4004.0),
      "COUNT(trips.fare)": (10, "discrete_laplace", 40.0)}),
    # 12. A filter through a CTE keeps stability 10: COUNT Delta 10, eps 0.25 -> b = 40.
    ("WITH long AS (SELECT * FROM trips WHERE distance_km > 10) SELECT COUNT(*) FROM long", 0.25,
     {"COUNT(*)": (10, "discrete_laplace", 40.0)}),
    # 13. SUM(LEAST(fare, 50)): [min(0,50), min(200,50)] = [0, 50] -> Delta 500.
    ("SELECT SUM(LEAST(fare, 50)) FROM trips", 1.0,
     {"SUM(LEAST(trips.fare, 50))": (500, "snapping", 500 * (1 + R))}),
]


@pytest.mark.parametrize(("sql", "epsilon", "expected"), CASES, ids=[c[0] for c in CASES])
def test_hand_computed_sensitivity_and_scale(
    engine: Engine, sql: str, epsilon: float, expected: dict
) -> None:
    found = _measurements(engine, sql, epsilon)
    assert set(found) == set(expected)
    for name, (sensitivity, mechanism, scale) in expected.items():
        m = found[name]
        assert m.sensitivity == pytest.approx(sensitivity)
        assert m.mechanism["name"] == mechanism
        assert m.mechanism["scale"] == pytest.approx(scale, rel=1e-9)
    total = sum(m.mechanism["epsilon"] for m in found.values())
    assert total == pytest.approx(epsilon, rel=1e-12)


def test_threshold_with_separate_count(engine: Engine) -> None:
    # GROUP BY driver_id (no public values) needs a key-release count: 20% of eps = 0.2 on
    # COUNT(DISTINCT rider_id) with D = 10 groups per unit: b = 10 / 0.2 = 50;
    # tau = 1 + 50 ln(10 / 1e-8) = 1 + 50 * 20.7232658 = 1037.16329.  COUNT(*) gets 0.8: b = 12.5.
    report = engine.explain("SELECT driver_id, COUNT(*) FROM trips GROUP BY driver_id",
                            analyst="alice", epsilon=1.0, delta=1e-8)
    assert report.key_release is not None
    assert report.key_release.threshold == pytest.approx(1 + 50 * math.log(1e9))
    assert report.key_release.threshold == pytest.approx(1037.16329, rel=1e-8)
    (count,) = report.measurements
    assert count.mechanism["scale"] == pytest.approx(12.5)
    assert report.delta == 1e-8 and report.epsilon == 1.0


def test_threshold_reuses_distinct_unit_count(engine: Engine) -> None:
    # COUNT(DISTINCT rider_id) is itself the gate: all of eps = 1 on it, D = 10, b = 10,
    # tau = 1 + 10 ln(10 / 1e-6) = 1 + 10 * 16.1180957 = 162.180957.
    report = engine.explain(
        "SELECT driver_id, COUNT(DISTINCT rider_id) FROM trips GROUP BY driver_id",
        analyst="alice", epsilon=1.0, delta=1e-6)
    assert report.key_release is not None
    assert report.key_release.gate == "m0"
    assert report.key_release.threshold == pytest.approx(162.180957, rel=1e-8)
    assert report.measurements[0].mechanism["epsilon"] == pytest.approx(1.0)


def test_threshold_event_level_reuses_count(engine: Engine) -> None:
    # Event level: COUNT(*) per page is the gate, D = 1, eps 0.5 -> b = 2,
    # tau = 1 + 2 ln(1 / 1e-5) = 1 + 2 * 11.5129255 = 24.025851.
    report = engine.explain("SELECT page, COUNT(*) FROM visits GROUP BY page",
                            analyst="alice", epsilon=0.5, delta=1e-5)
    assert report.key_release is not None
    assert report.key_release.threshold == pytest.approx(24.025851, rel=1e-8)
    assert report.measurements[0].mechanism["scale"] == pytest.approx(2.0)


def test_public_keys_cost_no_delta(engine: Engine) -> None:
    report = engine.explain("SELECT city, SUM(fare) FROM trips GROUP BY city", analyst="alice",
                            epsilon=1.0, delta=1e-6)
    assert report.delta == 0.0
    assert report.key_release is not None and report.key_release.method == "public_values"


def test_error_bound_of_count_column(engine: Engine) -> None:
    # Discrete Laplace b = 10 (Delta 10, eps 1): P(|X| >= t) = 2 a^t / (1 + a), a = e^-0.1.
    # The smallest t with P(|X| > t) <= 5% : P(|X| >= t+1) <= 0.05.
    report = engine.explain("SELECT COUNT(*) FROM trips", analyst="alice", epsilon=1.0)
    a = math.exp(-0.1)
    t = next(t for t in range(1000) if 2 * a ** (t + 1) / (1 + a) <= 0.05)
    assert report.columns[0].error_bound_95 == pytest.approx(t)
