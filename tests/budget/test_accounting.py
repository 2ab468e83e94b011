"""budget.accounting: events, basic and Rényi demands computed by hand, the shared contract."""

from __future__ import annotations

import math

import pytest

from budget.accounting import (
    ORDERS,
    Accountant,
    BasicAccountant,
    Event,
    RenyiAccountant,
    accountant_for,
    events_for_plan,
)
from mechanisms import DiscreteLaplace, Laplace, Snapping, laplace_rdp, pure_dp_rdp
from mechanisms.planning import NoiseRequest, ThresholdRequest, plan_noise

ACCOUNTANTS = [BasicAccountant(), RenyiAccountant(0.5)]


def test_events_round_trip_and_rebuild_their_mechanism() -> None:
    mech = Snapping.from_sensitivity(200.0, 0.25)
    event = Event.from_mechanism(mech)
    assert (event.kind, event.epsilon, event.sensitivity) == ("snapping", 0.25, 200.0)
    again = Event.from_dict(event.to_dict())
    assert again == event
    assert again.mechanism() == mech


def test_a_tampered_event_cannot_under_report() -> None:
    event = Event.from_mechanism(Laplace.from_sensitivity(1.0, 0.5))
    cheap = Event(event.kind, 0.01, 0.0, event.scale, 1.0, {**event.params, "epsilon": 0.01})
    with pytest.raises(ValueError):
        cheap.mechanism()  # the constructor re-checks the calibration
    with pytest.raises(ValueError, match="not a known mechanism"):
        Event("mystery", 0.1).mechanism()


def test_events_of_a_plan_with_a_separate_threshold() -> None:
    plan = plan_noise([NoiseRequest("m0", 10.0, True), NoiseRequest("m1", 2000.0, False)], 1.0,
                      1e-6, ThresholdRequest(None, 10), 0.2)
    events = events_for_plan(plan)
    # 0.2 for the key-release count, 0.4 + 0.4 for the two measurements, delta for the keys.
    assert sorted((e.kind, round(e.epsilon, 12)) for e in events) == [
        ("discrete_laplace", 0.2), ("discrete_laplace", 0.4), ("key_release", 0.0),
        ("snapping", 0.4)]
    basic, delta = BasicAccountant().demand(events)
    assert basic[0] == pytest.approx(1.0) and delta == 1e-6


def test_reused_threshold_count_is_not_charged_twice() -> None:
    plan = plan_noise([NoiseRequest("m0", 1.0, True)], 1.0, 1e-6, ThresholdRequest("m0", 1))
    kinds = [e.kind for e in events_for_plan(plan)]
    assert kinds == ["discrete_laplace", "key_release"]


def test_basic_demand_by_hand() -> None:
    events = [Event.epsilon_delta(0.25, 1e-7), Event.epsilon_delta(0.5), Event.key_release(2e-7)]
    assert BasicAccountant().demand(events) == ((0.75,), pytest.approx(3e-7))


def test_renyi_demand_by_hand() -> None:
    acc = RenyiAccountant(0.5)
    lap = Laplace.from_sensitivity(2.0, 0.5)   # scale 4, i.e. 4 / 2 = 2 at sensitivity 1
    dl = DiscreteLaplace.from_sensitivity(1.0, 0.5)
    demand, delta = acc.demand([Event.from_mechanism(lap), Event.from_mechanism(dl),
                                Event.epsilon_delta(0.1, 1e-8), Event.key_release(1e-8)])
    for i, a in enumerate(ORDERS):
        # Mironov Prop. 6 at b = 2: (1/(a-1)) ln(a/(2a-1) e^{(a-1)/2} + (a-1)/(2a-1) e^{-a/2})
        by_hand = math.log(a / (2 * a - 1) * math.exp((a - 1) / 2)
                           + (a - 1) / (2 * a - 1) * math.exp(-a / 2)) / (a - 1)
        assert laplace_rdp(a, 2.0) == pytest.approx(by_hand)
        assert demand[i] == pytest.approx(by_hand + dl.rdp(a) + pure_dp_rdp(a, 0.1))
    assert delta == pytest.approx(2e-8)


def test_renyi_capacity_formula() -> None:
    acc = RenyiAccountant(0.25)
    cap, pool = acc.capacity(10.0, 1e-6)
    delta_c = 0.75e-6
    for a, c in zip(ORDERS, cap, strict=True):
        assert c == pytest.approx(max(0.0, 10.0 - math.log(1 / delta_c) / (a - 1)))
    assert cap[0] == 0.0  # 10 - ln(1/7.5e-7)/0.5 = 10 - 28.2 < 0
    assert pool == pytest.approx(0.25e-6)
    with pytest.raises(ValueError, match="delta_per_block > 0"):
        acc.capacity(10.0, 0.0)


def test_renyi_guarantee_converts_at_the_best_order() -> None:
    acc = RenyiAccountant(0.5, orders=(2.0, 11.0))
    # used (1, 2): eps(2) = 1 + ln(1/5e-7)/1 = 15.51, eps(11) = 2 + ln(2e6)/10 = 3.451
    eps, delta, index = acc.guarantee((1.0, 2.0), 1e-7, 10.0, 1e-6)
    assert index == 1 and eps == pytest.approx(2 + math.log(2e6) / 10)
    assert delta == pytest.approx(5e-7 + 1e-7)


@pytest.mark.parametrize("acc", ACCOUNTANTS, ids=lambda a: a.name)
def test_contract_bad_events_are_refused(acc: Accountant) -> None:
    with pytest.raises(ValueError, match="at least one"):
        acc.demand([])
    for bad in (Event.epsilon_delta(math.nan), Event.epsilon_delta(-1.0),
                Event.epsilon_delta(0.1, math.inf), Event.epsilon_delta(0.1, 1.0)):
        with pytest.raises(ValueError):
            acc.demand([bad])


@pytest.mark.parametrize("acc", ACCOUNTANTS, ids=lambda a: a.name)
def test_contract_demands_add_up(acc: Accountant) -> None:
    # Composition: the demand of two events is the sum of their demands (both accountants).
    one = [Event.from_mechanism(Laplace.from_sensitivity(1.0, 0.3))]
    two = [Event.epsilon_delta(0.2, 1e-9)]
    d1, x1 = acc.demand(one)
    d2, x2 = acc.demand(two)
    d12, x12 = acc.demand(one + two)
    assert d12 == pytest.approx(tuple(a + b for a, b in zip(d1, d2, strict=True)))
    assert x12 == pytest.approx(x1 + x2)


@pytest.mark.parametrize("acc", ACCOUNTANTS, ids=lambda a: a.name)
def test_contract_an_epsilon_dp_release_never_costs_more_than_epsilon(acc: Accountant) -> None:
    demand, _ = acc.demand([Event.epsilon_delta(0.7)])
    assert max(demand) <= 0.7 + 1e-12


def test_accountant_for() -> None:
    assert accountant_for("basic").name == "basic"
    assert accountant_for("renyi", 0.1).delta_share == 0.1  # type: ignore[attr-defined]
    with pytest.raises(ValueError):
        accountant_for("zcdp")
