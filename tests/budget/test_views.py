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


def test_no_front_door_reads_per_analyst_spending_around_the_viewer() -> None:
    """The wall by construction: outside the ledger, no code of the front doors (server/,
    chorus_py/) reads a block's ``by_analyst``; they get blocks only through ``budget_view`` /
    ``as_dict``, which take a Viewer, and claims through a named list of fields (never their
    block snapshots).  A new door that reads around it fails here."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    found = []
    for package in ("server", "chorus_py"):
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Attribute) and node.attr == "by_analyst":
                    found.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not found, f"read the ledger through budget_view(viewer), not by_analyst: {found}"


def test_claim_views_never_carry_block_snapshots() -> None:
    """A claim can carry its blocks as they were after it (``after``: every analyst's spending
    on them); the claim view the REST app builds shows none of it."""
    import dataclasses

    from server.metrics import claim_dict

    led = InMemoryLedger(1.0, 0.0)
    led.ensure_blocks(["a"])
    led.consume(led.claim("xavier", ["a"], 0.25, 0.0))
    led.consume(led.claim("zeke", ["a"], 0.125, 0.0))
    (mine,) = led.claims("zeke")
    with_snapshots = dataclasses.replace(mine, after=tuple(led.blocks()))
    assert "xavier" in repr(with_snapshots.after)  # what a generic dump would show
    seen = claim_dict(with_snapshots)
    assert seen == {"claim_id": mine.claim_id, "analyst": "zeke", "blocks": ["a"],
                    "epsilon": 0.125, "delta": 0.0, "state": "consumed"}
