"""`chorus token add|revoke` edit one key of the policy file in place, keeping the owner's
comments; an analyst may list several token digests; what a reload may change."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chorus_py.errors import PolicyError
from chorus_py.policy import load_policy, parse_policy
from chorus_py.policy_edit import with_token_digests
from chorus_py.reload import reload_differences

CHORUS = Path(sys.executable).parent / "chorus"
A, B, C = "a" * 64, "b" * 64, "c" * 64

BASE = f"""# the owner's comment on top
[backend]
url = "duckdb:///:memory:"

[privacy]
epsilon_per_block = 1  # why 1: the board decided

[tables.t]
public = true

[analysts.alice]
# alice is the statistician
token_sha256 = [
  "{A}",
  "{B}",
]
max_epsilon_per_query = 0.5

[analysts.bob]
token_sha256 = "{C}"
"""


def test_an_analyst_may_hold_several_tokens_each_listed_once() -> None:
    import tomllib

    policy = parse_policy(tomllib.loads(BASE))
    assert policy.analysts["alice"].token_digests == (A, B)
    assert policy.analysts["bob"].token_digests == (C,)
    with pytest.raises(PolicyError, match="once"):
        parse_policy(tomllib.loads(BASE.replace(f'"{B}"', f'"{A}"')))
    with pytest.raises(PolicyError, match="64 hex digits"):
        parse_policy(tomllib.loads(BASE.replace(f'"{B}"', '"not-a-digest"')))


def test_edits_keep_comments_and_touch_only_the_key() -> None:
    one = with_token_digests(BASE, "alice", (B,))
    assert f'token_sha256 = "{B}"\n' in one and A not in one
    assert "# alice is the statistician" in one and "# why 1: the board decided" in one
    assert one.replace(f'token_sha256 = "{B}"\n', "") == BASE.replace(
        f'token_sha256 = [\n  "{A}",\n  "{B}",\n]\n', "")
    none = with_token_digests(BASE, "bob", ())
    assert C not in none and "[analysts.bob]" in none
    new = with_token_digests(BASE, "carol", (C,))
    assert new.startswith(BASE) and new.endswith(f'[analysts.carol]\ntoken_sha256 = "{C}"\n')


def test_a_form_the_edit_does_not_handle_is_refused_untouched() -> None:
    inline = BASE.replace(f'[analysts.bob]\ntoken_sha256 = "{C}"\n',
                          f'[analysts]\nbob = {{ token_sha256 = "{C}" }}\n')
    with pytest.raises(PolicyError, match="edit it by hand"):
        with_token_digests(inline, "bob", (A,))


def test_token_add_then_revoke_on_the_command_line(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(BASE)
    added = subprocess.run([str(CHORUS), "token", "add", "--policy", str(path), "bob"],
                           capture_output=True, text=True, timeout=60, check=False)
    assert added.returncode == 0, added.stderr
    token = added.stdout.strip()
    digest = hashlib.sha256(token.encode()).hexdigest()
    assert load_policy(path).analysts["bob"].token_digests == (C, digest)
    assert token not in path.read_text()
    revoked = subprocess.run([str(CHORUS), "token", "revoke", "--policy", str(path), "bob",
                              "--sha256", C[:8]], capture_output=True, text=True, timeout=60,
                             check=False)
    assert revoked.returncode == 0, revoked.stderr
    assert load_policy(path).analysts["bob"].token_digests == (digest,)
    ambiguous = subprocess.run([str(CHORUS), "token", "revoke", "--policy", str(path), "alice",
                                "--sha256", "abc"], capture_output=True, text=True, timeout=60,
                               check=False)
    assert ambiguous.returncode == 1 and "8 hex digits" in ambiguous.stderr
    # No server runs: --reload says so (exit 1) after writing the file.
    failed = subprocess.run([str(CHORUS), "token", "add", "--policy", str(path), "bob",
                             "--reload"], capture_output=True, text=True, timeout=60,
                            check=False)
    assert failed.returncode == 1 and "no process id" in failed.stderr
    assert len(load_policy(path).analysts["bob"].token_digests) == 2


def test_what_a_reload_may_change() -> None:
    import tomllib

    old = parse_policy(tomllib.loads(BASE))

    def new(text: str) -> list[str]:
        return reload_differences(old, parse_policy(tomllib.loads(text)))

    assert new(BASE.replace("max_epsilon_per_query = 0.5", "max_epsilon_per_query = 0.1")) == []
    assert new(BASE + f'\n[server]\nowner_token_sha256 = "{A}"\n') == []
    assert new(BASE + "\n[analysts.dora]\n") == []
    assert new(BASE.replace("epsilon_per_block = 1", "epsilon_per_block = 2")) == [
        "privacy.epsilon_per_block"]
    assert new(BASE.replace("public = true", "public = true\n\n[tables.u]\npublic = true")) == [
        "tables"]
    assert new(BASE + "\n[server]\nmax_connections = 5\n") == ["server.max_connections"]
    assert new(BASE + "\n[limits]\nmax_sql_chars = 1000\n") == ["limits.max_sql_chars"]


_NAMES = st.from_regex(r"[a-z][a-z0-9_-]{0,11}", fullmatch=True) | st.sampled_from(
    ["alice", "bob", "carol x", "dé"])
_DIGESTS = st.lists(st.sampled_from([A, B, C, "d" * 64, "0123456789abcdef" * 4]),
                    unique=True, max_size=3).map(tuple)


@settings(max_examples=150, deadline=None)
@given(analyst=_NAMES, digests=_DIGESTS, then=_DIGESTS)
def test_any_edit_reads_back_as_written_and_changes_nothing_else(
        analyst: str, digests: tuple[str, ...], then: tuple[str, ...]) -> None:
    import tomllib

    for text in (BASE, with_token_digests(BASE, analyst, digests)):
        edited = with_token_digests(text, analyst, then)
        after = parse_policy(tomllib.loads(edited))
        before = parse_policy(tomllib.loads(text))
        found = after.analysts.get(analyst)
        assert (found.token_digests if found else ()) == then
        assert {n: a for n, a in after.analysts.items() if n != analyst} == {
            n: a for n, a in before.analysts.items() if n != analyst}
        assert after.model_dump(exclude={"analysts"}) == before.model_dump(
            exclude={"analysts"})


def test_a_reload_that_removes_every_analyst_is_refused(tmp_path: Path) -> None:
    import duckdb

    from chorus_py.engine import Engine
    from chorus_py.reload import reload_policy

    duckdb.connect(str(tmp_path / "t.duckdb")).execute("CREATE TABLE t AS SELECT 1 AS x").close()
    text = BASE.replace("duckdb:///:memory:", "duckdb:///t.duckdb")
    path = tmp_path / "policy.toml"
    path.write_text(text)
    with Engine(load_policy(path)) as engine:
        before = engine.policy
        path.write_text(text.split("[analysts.alice]")[0])
        outcome = reload_policy(engine, path)
        assert not outcome.applied and "declares no analyst" in outcome.message
        assert engine.policy is before
        path.write_text(text + "\n[analysts.erin]\nmax_epsilon_per_block = 0.3\n")
        outcome = reload_policy(engine, path)
        assert outcome.applied and outcome.message.endswith("added: erin")
        assert set(engine.policy.analysts) == {"alice", "bob", "erin"}
        assert engine.ledger.analyst_caps == {"erin": 0.3}
