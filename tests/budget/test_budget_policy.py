"""The policy keys of the budget: scheduler, accounting, ledger, id-range blocks, analyst caps."""

from __future__ import annotations

import pytest

from chorus_py.errors import PolicyError
from chorus_py.policy import duration_seconds, parse_policy

BASE = {"backend": {"url": "duckdb:///:memory:"},
        "tables": {"t": {"privacy_unit": "uid", "max_rows_per_unit": 1,
                         "columns": {"uid": {"type": "int"}, "ts": {"type": "timestamp"}}}}}


def policy(privacy: dict, block: dict | None = None, analysts: dict | None = None) -> object:
    data = {**BASE, "privacy": {"epsilon_per_block": 10.0, "delta_per_block": 1e-6, **privacy}}
    if block is not None:
        data["tables"] = {"t": {**BASE["tables"]["t"], "block": block}}
    if analysts is not None:
        data["analysts"] = analysts
    return parse_policy(data)


def test_scheduler_policies() -> None:
    p = policy({"scheduler": {"policy": "dpf-n", "n": 100, "wait_seconds": 5}})
    assert p.privacy.scheduler.n == 100  # type: ignore[attr-defined]
    p = policy({"scheduler": {"policy": "dpf-t", "lifetime": "30d", "tick": "1h"}})
    sch = p.privacy.scheduler  # type: ignore[attr-defined]
    assert (sch.lifetime_seconds, sch.tick_seconds) == (30 * 86400, 3600)


@pytest.mark.parametrize(("scheduler", "message"), [
    ({"policy": "dpf-n"}, "needs n"),
    ({"policy": "fcfs", "n": 3}, "n only applies"),
    ({"policy": "dpf-t", "lifetime": "30d"}, "needs lifetime and tick"),
    ({"policy": "dpf-t", "lifetime": "1h", "tick": "1d"}, "tick must not be longer"),
    ({"policy": "dpf-t", "lifetime": "30 fortnights", "tick": "1h"}, "positive duration"),
    ({"policy": "fcfs", "tick": "1h"}, "only apply to policy 'dpf-t'"),
    ({"policy": "fcfs", "wait_seconds": 10, "max_wait_seconds": 5}, "must not exceed"),
    ({"policy": "lottery"}, "scheduler.policy"),
])
def test_bad_scheduler_settings_name_the_key(scheduler: dict, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        policy({"scheduler": scheduler})


def test_accounting_and_ledger_keys() -> None:
    assert policy({"accounting": "renyi"}).privacy.accounting == "renyi"  # type: ignore[attr-defined]
    with pytest.raises(PolicyError, match="needs delta_per_block > 0"):
        policy({"accounting": "renyi", "delta_per_block": 0.0})
    for url in ("memory", "sqlite:///x.sqlite3", "postgresql://u@h/db"):
        assert policy({"ledger": url}).privacy.ledger == url  # type: ignore[attr-defined]
    with pytest.raises(PolicyError, match="ledger must be"):
        policy({"ledger": "redis://x"})


def test_durations() -> None:
    assert [duration_seconds(x) for x in ("30d", "1h", "15 minutes", "2w", "0.5 s")] == [
        2592000, 3600, 900, 1209600, 0.5]
    with pytest.raises(ValueError):
        duration_seconds("0h")


def test_id_range_blocks_are_on_the_privacy_unit() -> None:
    ids = {"size": "1000 ids", "start": 0, "end": 10000}
    p = policy({}, {"column": "uid", **ids})
    assert p.tables["t"].block.ids_per_block == 1000  # type: ignore[attr-defined]
    with pytest.raises(PolicyError, match="on the privacy_unit column"):
        policy({}, {"column": "ts", **ids})
    with pytest.raises(PolicyError, match="date or timestamp"):
        policy({}, {"column": "uid", "size": "1 day", "start": "2026-01-01"})


def test_analyst_limit_per_block() -> None:
    p = policy({}, analysts={"a": {"max_epsilon_per_block": 2.5}})
    assert p.analysts["a"].max_epsilon_per_block == 2.5  # type: ignore[attr-defined]
    with pytest.raises(PolicyError, match="max_epsilon_per_block"):
        policy({}, analysts={"a": {"max_epsilon_per_block": 0}})
