"""budget.ledger.InMemoryLedger: claim states, all-or-nothing, exact accounting, threads.

Accounting is checked against the claims themselves: on every block, ``allocated`` must equal the
sum of the epsilons of the claims still allocated there, ``consumed`` the sum of those consumed,
and ``global = remaining + allocated + consumed`` with nothing negative.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import threading
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from budget.ledger import BlockBudget, Claim, InMemoryLedger, Viewer
from chorus_py.errors import BudgetExhausted, OperationalError

TOL = 1e-12


def check_invariants(ledger: InMemoryLedger, tol: float = TOL) -> None:
    """global = remaining + allocated + consumed, and allocated/consumed match the claims."""
    claims = ledger.claims()
    for b in ledger.blocks():
        assert b.epsilon_global == ledger.epsilon_per_block
        assert b.delta_global == ledger.delta_per_block
        assert math.isclose(b.epsilon_global,
                            b.epsilon_remaining + b.epsilon_allocated + b.epsilon_consumed,
                            abs_tol=tol)
        assert math.isclose(b.delta_global,
                            b.delta_remaining + b.delta_allocated + b.delta_consumed,
                            abs_tol=tol)
        for value in (b.epsilon_remaining, b.epsilon_allocated, b.epsilon_consumed,
                      b.delta_remaining, b.delta_allocated, b.delta_consumed):
            assert value >= -tol, b
        mine = [c for c in claims if b.block_id in c.blocks]
        for state, eps_field, delta_field in (("allocated", b.epsilon_allocated, b.delta_allocated),
                                              ("consumed", b.epsilon_consumed, b.delta_consumed)):
            assert math.isclose(eps_field, sum(c.epsilon for c in mine if c.state == state),
                                abs_tol=tol), (state, b)
            assert math.isclose(delta_field, sum(c.delta for c in mine if c.state == state),
                                abs_tol=tol), (state, b)


def block(ledger: InMemoryLedger, block_id: str) -> BlockBudget:
    return next(b for b in ledger.blocks() if b.block_id == block_id)


@pytest.fixture
def ledger() -> InMemoryLedger:
    led = InMemoryLedger(1.0, 1e-6)
    led.ensure_blocks(["a", "b", "c"])
    return led


# -- state transitions ------------------------------------------------------------------------
def test_claim_allocates_on_every_block(ledger: InMemoryLedger) -> None:
    claim = ledger.claim("alice", ["a", "b"], 0.25, 1e-7, description="SELECT 1")
    assert isinstance(claim, Claim)
    assert claim.state == "allocated"
    assert (claim.analyst, claim.blocks, claim.epsilon, claim.delta, claim.description) == (
        "alice", ("a", "b"), 0.25, 1e-7, "SELECT 1")
    for name in ("a", "b"):
        b = block(ledger, name)
        assert (b.epsilon_allocated, b.epsilon_consumed, b.epsilon_remaining) == (0.25, 0.0, 0.75)
        assert (b.delta_allocated, b.delta_consumed) == (1e-7, 0.0)
    assert block(ledger, "c").epsilon_allocated == 0.0
    assert ledger.claims() == [claim]
    check_invariants(ledger)


def test_claim_then_consume(ledger: InMemoryLedger) -> None:
    claim = ledger.claim("alice", ["a", "b"], 0.25, 1e-7)
    ledger.consume(claim)
    assert claim.state == "consumed"
    for name in ("a", "b"):
        b = block(ledger, name)
        assert (b.epsilon_allocated, b.epsilon_consumed, b.epsilon_remaining) == (0.0, 0.25, 0.75)
        assert (b.delta_allocated, b.delta_consumed) == (0.0, 1e-7)
    check_invariants(ledger)


def test_claim_then_release_gives_everything_back(ledger: InMemoryLedger) -> None:
    claim = ledger.claim("alice", ["a", "b"], 0.25, 1e-7)
    ledger.release(claim)
    assert claim.state == "released"
    for name in ("a", "b"):
        b = block(ledger, name)
        assert (b.epsilon_allocated, b.epsilon_consumed, b.epsilon_remaining) == (0.0, 0.0, 1.0)
        assert (b.delta_allocated, b.delta_consumed, b.delta_remaining) == (0.0, 0.0, 1e-6)
    check_invariants(ledger)


@pytest.mark.parametrize(("first", "second"), [
    ("consume", "consume"), ("consume", "release"), ("release", "release"),
    ("release", "consume"),
])
def test_settling_twice_raises_and_changes_nothing(ledger: InMemoryLedger, first: str,
                                                   second: str) -> None:
    claim = ledger.claim("alice", ["a"], 0.5, 0.0)
    getattr(ledger, first)(claim)
    state, before = claim.state, ledger.blocks()
    with pytest.raises(ValueError, match=f"claim {claim.claim_id} is already {state}"):
        getattr(ledger, second)(claim)
    assert claim.state == state
    assert ledger.blocks() == before
    check_invariants(ledger)


def test_claim_ids_are_unique_and_claims_listed_oldest_first(ledger: InMemoryLedger) -> None:
    made = [ledger.claim("alice", ["a"], 0.1, 0.0) for _ in range(5)]
    assert len({c.claim_id for c in made}) == 5
    assert [c.claim_id for c in ledger.claims()] == [c.claim_id for c in made]


# -- all or nothing ---------------------------------------------------------------------------
def test_claim_short_on_one_block_allocates_nothing_anywhere() -> None:
    led = InMemoryLedger(1.0, 0.0)
    names = ["trips/2026-01-01", "trips/2026-01-02", "trips/2026-01-03"]
    led.ensure_blocks(names)
    led.consume(led.claim("bob", [names[1]], 0.8, 0.0))
    before, claims_before = led.blocks(), led.claims()
    with pytest.raises(BudgetExhausted) as info:
        led.claim("alice", names, 0.5, 0.0)
    message = str(info.value)
    assert "trips/2026-01-02" in message
    assert "trips/2026-01-01" not in message and "trips/2026-01-03" not in message
    assert "nothing was spent" in message
    assert info.value.hint
    assert led.blocks() == before
    # The refused claim is recorded (for the audit trail) but took nothing.
    *kept, refused = led.claims()
    assert kept == claims_before and refused.state == "refused"
    assert block(led, names[0]).epsilon_allocated == 0.0
    assert block(led, names[2]).epsilon_allocated == 0.0
    check_invariants(led)
    # The same claim without the short block fits.
    led.claim("alice", [names[0], names[2]], 0.5, 0.0)
    check_invariants(led)


def test_budget_exhausted_is_an_operational_error_with_sqlstate_53400() -> None:
    led = InMemoryLedger(1.0, 0.0)
    led.ensure_blocks(["a"])
    with pytest.raises(OperationalError) as info:
        led.claim("alice", ["a"], 1.5, 0.0)
    assert isinstance(info.value, BudgetExhausted)
    assert info.value.sqlstate == "53400"


def test_many_short_blocks_are_summarised() -> None:
    led = InMemoryLedger(1.0, 0.0)
    names = [f"blk{i}" for i in range(8)]
    led.ensure_blocks(names)
    with pytest.raises(BudgetExhausted) as info:
        led.claim("alice", names, 2.0, 0.0)
    message = str(info.value)
    assert all(n in message for n in names[:5])
    assert "blk5" not in message and "and 3 more" in message


# -- exact accounting --------------------------------------------------------------------------
def test_epsilon_accounting_by_hand() -> None:
    led = InMemoryLedger(1.0, 0.0)
    led.ensure_blocks(["a"])
    for _ in range(3):
        led.consume(led.claim("alice", ["a"], 0.3, 0.0))
        check_invariants(led)
    assert block(led, "a").epsilon_consumed == pytest.approx(0.9)
    assert block(led, "a").epsilon_remaining == pytest.approx(0.1)
    with pytest.raises(BudgetExhausted, match="block\\(s\\) a "):
        led.claim("alice", ["a"], 0.3, 0.0)
    check_invariants(led)
    led.consume(led.claim("alice", ["a"], 0.1, 0.0))  # exactly what is left fits
    assert block(led, "a").epsilon_consumed == pytest.approx(1.0)
    assert block(led, "a").epsilon_remaining == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(BudgetExhausted):
        led.claim("alice", ["a"], 0.001, 0.0)
    check_invariants(led)


def test_allocated_budget_counts_before_it_is_consumed() -> None:
    led = InMemoryLedger(1.0, 0.0)
    led.ensure_blocks(["a"])
    pending = led.claim("alice", ["a"], 0.75, 0.0)
    with pytest.raises(BudgetExhausted):
        led.claim("bob", ["a"], 0.5, 0.0)
    led.claim("bob", ["a"], 0.25, 0.0)
    assert block(led, "a").epsilon_remaining == 0.0
    led.release(pending)
    assert block(led, "a").epsilon_remaining == 0.75
    check_invariants(led)


def test_delta_accounting_by_hand() -> None:
    led = InMemoryLedger(10.0, 1e-6)
    led.ensure_blocks(["a"])
    led.consume(led.claim("alice", ["a"], 0.1, 4e-7))
    led.consume(led.claim("alice", ["a"], 0.1, 4e-7))
    assert block(led, "a").delta_consumed == pytest.approx(8e-7)
    assert block(led, "a").delta_remaining == pytest.approx(2e-7)
    # Epsilon would fit easily; delta does not.
    with pytest.raises(BudgetExhausted, match="delta=4e-07"):
        led.claim("alice", ["a"], 0.1, 4e-7)
    led.consume(led.claim("alice", ["a"], 0.1, 2e-7))
    with pytest.raises(BudgetExhausted):
        led.claim("alice", ["a"], 0.1, 1e-9)
    led.claim("alice", ["a"], 0.1, 0.0)  # pure epsilon still fits
    check_invariants(led)


def test_zero_delta_budget_allows_only_pure_claims() -> None:
    led = InMemoryLedger(1.0, 0.0)
    led.ensure_blocks(["a"])
    led.claim("alice", ["a"], 0.1, 0.0)
    with pytest.raises(BudgetExhausted):
        led.claim("alice", ["a"], 0.1, 1e-12)
    check_invariants(led)


def test_released_budget_is_reusable() -> None:
    led = InMemoryLedger(1.0, 1e-6)
    led.ensure_blocks(["a", "b"])
    first = led.claim("alice", ["a", "b"], 1.0, 1e-6)
    with pytest.raises(BudgetExhausted):
        led.claim("bob", ["a"], 0.01, 0.0)
    led.release(first)
    second = led.claim("bob", ["a", "b"], 1.0, 1e-6)
    led.consume(second)
    assert block(led, "a").epsilon_consumed == 1.0
    assert block(led, "a").delta_consumed == 1e-6
    check_invariants(led)


def test_ensure_blocks_creates_fresh_budget_and_keeps_existing() -> None:
    led = InMemoryLedger(2.0, 1e-6)
    led.ensure_blocks(["a"])
    led.consume(led.claim("alice", ["a"], 2.0, 0.0))
    led.ensure_blocks(iter(["a", "b", "b"]))  # any iterable; a known block keeps its spending
    assert [b.block_id for b in led.blocks()] == ["a", "b"]
    fresh = block(led, "b")
    assert (fresh.epsilon_global, fresh.epsilon_remaining, fresh.delta_remaining) == (
        2.0, 2.0, 1e-6)
    assert (fresh.epsilon_allocated, fresh.epsilon_consumed) == (0.0, 0.0)
    assert block(led, "a").epsilon_remaining == 0.0
    with pytest.raises(BudgetExhausted, match="block\\(s\\) a "):
        led.claim("alice", ["a", "b"], 0.5, 0.0)
    led.claim("alice", ["b"], 2.0, 0.0)
    check_invariants(led)


def test_blocks_are_sorted_snapshots(ledger: InMemoryLedger) -> None:
    ledger.ensure_blocks(["0"])
    snapshot = ledger.blocks()
    assert [b.block_id for b in snapshot] == ["0", "a", "b", "c"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        snapshot[1].block_id = "x"  # type: ignore[misc]
    ledger.consume(ledger.claim("alice", ["a"], 1.0, 0.0))
    assert snapshot[1].epsilon_consumed == 0.0  # a snapshot, not a live view
    assert block(ledger, "a").as_dict(Viewer.owner())["epsilon_remaining"] == 0.0


def test_can_claim_changes_nothing(ledger: InMemoryLedger) -> None:
    ledger.consume(ledger.claim("alice", ["b"], 0.9, 0.0))
    before, claims_before = ledger.blocks(), ledger.claims()
    assert ledger.can_claim(["a", "c"], 0.5, 1e-7) == []
    assert ledger.can_claim(["a", "b", "c"], 0.5, 0.0) == ["b"]
    assert ledger.can_claim(["a", "b", "c"], 0.05, 2e-6) == ["a", "b", "c"]
    assert ledger.blocks() == before
    assert ledger.claims() == claims_before
    # ... and its answer is right: what it says fits, fits.
    ledger.claim("alice", ["a", "c"], 0.5, 1e-7)
    check_invariants(ledger)


# -- bad inputs --------------------------------------------------------------------------------
@pytest.mark.parametrize(("epsilon", "delta"), [(0.0, 0.0), (-1.0, 0.0), (1.0, -1e-9)])
def test_bad_ledger_budgets(epsilon: float, delta: float) -> None:
    with pytest.raises(ValueError, match="positive"):
        InMemoryLedger(epsilon, delta)


@pytest.mark.parametrize(("epsilon", "delta"), [(0.0, 0.0), (-0.1, 0.0), (0.1, -1e-9)])
def test_bad_claim_parameters_raise_and_change_nothing(ledger: InMemoryLedger, epsilon: float,
                                                       delta: float) -> None:
    before = ledger.blocks()
    with pytest.raises(ValueError, match=r"epsilon > 0 and .*delta >= 0"):
        ledger.claim("alice", ["a"], epsilon, delta)
    assert ledger.blocks() == before and ledger.claims() == []


def test_claim_without_blocks_raises(ledger: InMemoryLedger) -> None:
    with pytest.raises(ValueError, match="at least one block"):
        ledger.claim("alice", [], 0.1, 0.0)
    assert ledger.claims() == []


def test_unknown_block_raises_and_allocates_nothing(ledger: InMemoryLedger) -> None:
    before = ledger.blocks()
    with pytest.raises(KeyError, match="unknown block zzz"):
        ledger.claim("alice", ["a", "zzz"], 0.1, 0.0)
    with pytest.raises(KeyError, match="zzz"):
        ledger.can_claim(["zzz"], 0.1, 0.0)
    assert ledger.blocks() == before and ledger.claims() == []


@pytest.mark.parametrize(("epsilon", "delta"), [
    (math.inf, 0.0), (math.nan, 0.0), (0.1, math.inf), (0.1, math.nan), (-math.inf, 0.0),
])
def test_non_finite_claims_are_refused(ledger: InMemoryLedger, epsilon: float,
                                       delta: float) -> None:
    before = ledger.blocks()
    with pytest.raises(ValueError, match="finite"):
        ledger.claim("alice", ["a"], epsilon, delta)
    assert ledger.blocks() == before and ledger.claims() == []


def test_nan_delta_cannot_poison_a_block(ledger: InMemoryLedger) -> None:
    # Regression: NaN < 0 and NaN > remaining are both False, so a NaN delta used to be granted,
    # turning the block's delta accounting into NaN, after which every delta fitted.
    with pytest.raises(ValueError):
        ledger.claim("alice", ["a"], 0.1, math.nan)
    assert ledger.can_claim(["a"], 0.1, 0.5) == ["a"]  # delta 0.5 > delta_per_block 1e-6
    check_invariants(ledger)


def test_a_block_named_twice_is_charged_once() -> None:
    # Regression: each occurrence was checked against the untouched remaining budget but
    # allocated separately, so 2 x 0.6 on a 1.0 block raised RuntimeError and left
    # epsilon_allocated = 1.2 with no claim to release it.
    led = InMemoryLedger(1.0, 0.0)
    led.ensure_blocks(["a", "b"])
    claim = led.claim("alice", ["a", "b", "a"], 0.6, 0.0)
    assert claim.blocks == ("a", "b")
    assert block(led, "a").epsilon_allocated == 0.6
    check_invariants(led)
    led.consume(claim)
    assert block(led, "a").epsilon_consumed == 0.6
    with pytest.raises(BudgetExhausted):
        led.claim("alice", ["a", "a"], 0.6, 0.0)
    check_invariants(led)


# -- concurrency -------------------------------------------------------------------------------
def _race(led: InMemoryLedger, n_threads: int, attempts: int,
          blocks_for: list[list[str]], epsilon: float) -> list[int]:
    barrier = threading.Barrier(n_threads)
    wins = [0] * n_threads
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            barrier.wait()
            blocks = blocks_for[i % len(blocks_for)]
            for _ in range(attempts):
                try:
                    claim = led.claim(f"t{i}", blocks, epsilon, 0.0)
                except BudgetExhausted:
                    continue
                led.consume(claim)
                wins[i] += 1
        except BaseException as err:  # surfaced in the main thread
            errors.append(err)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert not errors, errors
    return wins


def test_threads_racing_for_one_block_never_overspend() -> None:
    led = InMemoryLedger(1.0, 0.0)
    led.ensure_blocks(["day"])
    wins = _race(led, n_threads=16, attempts=250, blocks_for=[["day"]], epsilon=0.01)
    assert sum(wins) == 100
    b = block(led, "day")
    assert b.epsilon_consumed <= 1.0 + 1e-12
    assert b.epsilon_consumed == pytest.approx(1.0)
    assert b.epsilon_allocated == pytest.approx(0.0, abs=1e-12)
    states = [c.state for c in led.claims()]
    assert states.count("consumed") == 100
    assert set(states) == {"consumed", "refused"}
    check_invariants(led)


def test_threads_racing_over_overlapping_blocks_stay_all_or_nothing() -> None:
    led = InMemoryLedger(1.0, 0.0)
    led.ensure_blocks(["x", "y", "z"])
    _race(led, n_threads=12, attempts=150,
          blocks_for=[["x", "y"], ["y", "z"], ["z", "x"], ["y"]], epsilon=0.03)
    check_invariants(led, tol=1e-9)
    for b in led.blocks():
        assert b.epsilon_consumed <= 1.0 + 1e-12
    # Every thread kept trying until its claim no longer fitted.
    for blocks in (["x", "y"], ["y", "z"], ["z", "x"], ["y"]):
        assert led.can_claim(blocks, 0.03, 0.0) != []


# -- arbitrary interleavings (hypothesis) -----------------------------------------------------
BLOCK_NAMES = ["b0", "b1", "b2", "b3"]
# Dyadic numbers: float sums are exact, so a model in Fractions predicts every grant exactly.
EPS_GLOBAL, DELTA_GLOBAL = 2.0, 2.0**-20
DYADIC_EPS = [0.125, 0.25, 0.375, 0.5, 0.75, 1.0, 2.0, 2.5]
DYADIC_DELTA = [0.0, 2.0**-23, 2.0**-22, 2.0**-21]


class LedgerMachine(RuleBasedStateMachine):
    """claim / consume / release in any order, against an exact model."""

    def __init__(self) -> None:
        super().__init__()
        self.ledger = InMemoryLedger(EPS_GLOBAL, DELTA_GLOBAL)
        self.known: set[str] = set()
        self.claims: list[Claim] = []
        # block -> [eps allocated, eps consumed, delta allocated, delta consumed]
        self.model: dict[str, list[Fraction]] = {}

    @initialize(ids=st.lists(st.sampled_from(BLOCK_NAMES), min_size=1, max_size=2))
    def first_blocks(self, ids: list[str]) -> None:
        self.add_blocks(ids)

    @rule(ids=st.lists(st.sampled_from(BLOCK_NAMES), max_size=3))
    def add_blocks(self, ids: list[str]) -> None:
        self.ledger.ensure_blocks(ids)
        for i in ids:
            if i not in self.known:
                self.known.add(i)
                self.model[i] = [Fraction(0)] * 4

    def _fits(self, ids: list[str], eps: float, delta: float) -> bool:
        return all(Fraction(EPS_GLOBAL) - m[0] - m[1] >= Fraction(eps)
                   and Fraction(DELTA_GLOBAL) - m[2] - m[3] >= Fraction(delta)
                   for m in (self.model[i] for i in ids))

    @rule(ids=st.lists(st.sampled_from(BLOCK_NAMES), min_size=1, max_size=3, unique=True),
          eps=st.sampled_from(DYADIC_EPS), delta=st.sampled_from(DYADIC_DELTA),
          probe=st.booleans())
    def claim(self, ids: list[str], eps: float, delta: float, probe: bool) -> None:
        if not set(ids) <= self.known:
            with pytest.raises(KeyError):
                self.ledger.claim("a", ids, eps, delta)
            return
        fits = self._fits(ids, eps, delta)
        if probe:
            before = self.ledger.blocks()
            assert (self.ledger.can_claim(ids, eps, delta) == []) == fits
            assert self.ledger.blocks() == before
        if not fits:
            with pytest.raises(BudgetExhausted):
                self.ledger.claim("a", ids, eps, delta)
            return
        self.claims.append(self.ledger.claim("a", ids, eps, delta))
        for i in ids:
            self.model[i][0] += Fraction(eps)
            self.model[i][2] += Fraction(delta)

    def _settle(self, index: int, action: str) -> None:
        claim = self.claims[index % len(self.claims)]
        if claim.state != "allocated":
            with pytest.raises(ValueError):
                getattr(self.ledger, action)(claim)
            return
        getattr(self.ledger, action)(claim)
        for i in claim.blocks:
            m = self.model[i]
            m[0] -= Fraction(claim.epsilon)
            m[2] -= Fraction(claim.delta)
            if action == "consume":
                m[1] += Fraction(claim.epsilon)
                m[3] += Fraction(claim.delta)

    @precondition(lambda self: self.claims)
    @rule(index=st.integers(min_value=0, max_value=50))
    def consume(self, index: int) -> None:
        self._settle(index, "consume")

    @precondition(lambda self: self.claims)
    @rule(index=st.integers(min_value=0, max_value=50))
    def release(self, index: int) -> None:
        self._settle(index, "release")

    @invariant()
    def accounting_holds(self) -> None:
        check_invariants(self.ledger, tol=0.0)
        for b in self.ledger.blocks():
            m = self.model[b.block_id]
            assert (Fraction(b.epsilon_allocated), Fraction(b.epsilon_consumed),
                    Fraction(b.delta_allocated), Fraction(b.delta_consumed)) == tuple(m)
        assert {b.block_id for b in self.ledger.blocks()} == self.known


LedgerMachine.TestCase.settings = settings(
    max_examples=120, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestLedgerMachine = LedgerMachine.TestCase


class FloatLedgerMachine(RuleBasedStateMachine):
    """Arbitrary float epsilons: no exact model, but never an overspend or a drift."""

    def __init__(self) -> None:
        super().__init__()
        self.ledger = InMemoryLedger(1.0, 1e-6)
        self.ledger.ensure_blocks(BLOCK_NAMES)
        self.claims: list[Claim] = []

    @rule(ids=st.lists(st.sampled_from(BLOCK_NAMES), min_size=1, max_size=4, unique=True),
          eps=st.floats(min_value=1e-6, max_value=0.6),
          delta=st.floats(min_value=0.0, max_value=6e-7))
    def claim(self, ids: list[str], eps: float, delta: float) -> None:
        short = self.ledger.can_claim(ids, eps, delta)
        before = self.ledger.blocks()
        try:
            claim = self.ledger.claim("a", ids, eps, delta)
        except BudgetExhausted:
            assert short
            assert self.ledger.blocks() == before
            return
        assert short == []
        self.claims.append(claim)

    @precondition(lambda self: self.claims)
    @rule(index=st.integers(min_value=0, max_value=50), consume=st.booleans())
    def settle(self, index: int, consume: bool) -> None:
        claim = self.claims[index % len(self.claims)]
        action = self.ledger.consume if consume else self.ledger.release
        if claim.state == "allocated":
            action(claim)
            assert claim.state == ("consumed" if consume else "released")
        else:
            with pytest.raises(ValueError):
                action(claim)

    @invariant()
    def accounting_holds(self) -> None:
        check_invariants(self.ledger, tol=1e-9)
        for b in self.ledger.blocks():
            assert b.epsilon_allocated + b.epsilon_consumed <= 1.0 + 1e-12
            assert b.delta_allocated + b.delta_consumed <= 1e-6 * (1 + 1e-12)


FloatLedgerMachine.TestCase.settings = settings(
    max_examples=80, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestFloatLedgerMachine = FloatLedgerMachine.TestCase


class SQLiteLedgerMachine(LedgerMachine):
    """The same exact model, on the durable SQLite store (a fresh file per example)."""

    def __init__(self) -> None:
        import tempfile

        from budget.ledger import Ledger
        from budget.store import SQLiteStore

        super().__init__()
        self._dir = tempfile.TemporaryDirectory()
        store = SQLiteStore(f"{self._dir.name}/ledger.sqlite3", synchronous="NORMAL")
        self.ledger = Ledger(EPS_GLOBAL, DELTA_GLOBAL, store=store)

    def teardown(self) -> None:
        self.ledger.close()
        self._dir.cleanup()


SQLiteLedgerMachine.TestCase.settings = settings(
    max_examples=25, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestSQLiteLedgerMachine = SQLiteLedgerMachine.TestCase


def test_block_budget_of_equals_the_dataclass_constructor() -> None:
    values = ("d1", "active", "basic", (), 1.0, 1e-6, (1.0,), (0.0,), (0.5,), (0.25,),
              (0.25,), 1e-6, 0.0, 0.0, 3, 0.5, 0.0, 0, {"a": 0.5})
    fast, slow = BlockBudget.of(*values), BlockBudget(*values)
    assert fast == slow and fast.epsilon_left == slow.epsilon_left == 0.5
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.state = "retired"  # type: ignore[misc]
    with pytest.raises(ValueError):
        BlockBudget.of(*values[:-1])  # every field, or none
