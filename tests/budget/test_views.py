"""The ledger's views for one viewer (issue 18): an analyst sees every block's totals, the same
as the owner's, and only their own spending; never another analyst's name or amount."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from budget.ledger import InMemoryLedger, Viewer
from chorus_py.errors import BudgetExhausted

# No name is part of another, nor of a block id: a name found in a view is that analyst's.
NAMES = ("xavier", "yolanda", "zeke", "wanda")
BLOCKS = ("b0", "b1", "b2", "b3")

claims = st.lists(
    st.tuples(st.sampled_from(NAMES), st.sets(st.sampled_from(BLOCKS), min_size=1),
              st.sampled_from((0.125, 0.25, 0.5)), st.booleans()),
    max_size=12)


def _totals(view: list[dict]) -> list[dict]:
    return [{k: v for k, v in b.items() if k != "by_analyst"} for b in view]


@settings(max_examples=60, deadline=None)
@given(claims)
def test_an_analyst_sees_totals_and_only_their_own_spending(
        made: list[tuple[str, set[str], float, bool]]) -> None:
    led = InMemoryLedger(1.0, 1e-6)
    led.ensure_blocks(list(BLOCKS))
    for analyst, blocks, epsilon, consume in made:
        try:
            claim = led.claim(analyst, sorted(blocks), epsilon, 0.0)
        except BudgetExhausted:  # a refusal (budget spent) is part of the history
            continue
        if consume:
            led.consume(claim)
    owner = led.budget_view(Viewer.owner())
    spent_by = {n: {b["block"]: b["by_analyst"].get(n, 0.0) for b in owner} for n in NAMES}
    for name in NAMES:
        view = led.budget_view(Viewer.of(name))
        text = json.dumps(view) + json.dumps(led.spending(Viewer.of(name)))
        for other in NAMES:
            if other != name:
                assert other not in text
        assert _totals(view) == _totals(owner)  # block totals are public: the same for all
        assert [b["by_analyst"] for b in view] == [
            {name: spent_by[name][b["block"]]} for b in view]
        assert set(led.spending(Viewer.of(name))) <= {name}
    # the owner sees everyone who holds budget
    holders = {n for b in owner for n, eps in b["by_analyst"].items() if eps > 0}
    assert set(led.spending(Viewer.owner())) == holders


def test_viewer_needs_a_name_and_views_need_a_viewer() -> None:
    with pytest.raises(ValueError, match="analyst's name"):
        Viewer.of("")
    led = InMemoryLedger(1.0, 0.0)
    led.ensure_blocks(["a"])
    led.consume(led.claim("xavier", ["a"], 0.25, 0.0))
    (block,) = led.blocks()
    with pytest.raises(TypeError):
        block.as_dict()  # type: ignore[call-arg]  # no default viewer: a caller must choose
    assert block.as_dict(Viewer.of("zeke"))["by_analyst"] == {"zeke": 0.0}
    assert block.as_dict(Viewer.owner())["by_analyst"] == {"xavier": 0.25}
