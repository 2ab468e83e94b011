"""Every policy option is documented in the example policy (datasette's test_docs habit)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from chorus_py import policy

EXAMPLE = (Path(__file__).resolve().parent.parent / "examples" / "policy.toml").read_text()

# Documented elsewhere: the analyst password (the wire server); ``source`` is internal.
_NOT_YET = {"password", "source"}


def _fields(model: type[BaseModel]) -> set[str]:
    return set(model.model_fields)


def test_every_policy_option_appears_in_the_example() -> None:
    models = [policy.BackendConfig, policy.PrivacyConfig, policy.SchedulerConfig,
              policy.ColumnPolicy, policy.BlockConfig, policy.TablePolicy,
              policy.AnalystPolicy, policy.ServerConfig, policy.LimitsConfig, policy.Policy]
    missing = sorted(
        f"{m.__name__}.{name}" for m in models for name in _fields(m) - _NOT_YET
        if name not in EXAMPLE
    )
    assert not missing, f"document these options in examples/policy.toml: {missing}"
