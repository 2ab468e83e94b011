"""The scheduling simulator (paper section 6.1) and the `chorus budget` command."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from budget.simulator import Workload, arrivals, simulate
from chorus_py.engine import Engine
from chorus_py.policy import load_policy


def test_single_block_dpf_beats_round_robin_beats_fcfs() -> None:
    w = Workload.single_block()
    fcfs = simulate(w, "fcfs").granted
    rr = max(simulate(w, "rr-n", n).granted for n in (75, 100))
    dpf = max(simulate(w, "dpf-n", n).granted for n in (100, 150))
    assert dpf > rr > fcfs
    # The paper: FCFS 28, DPF up to 100 (= epsilon^G / 0.01: every mouse it can fit).
    assert 25 <= fcfs <= 32 and dpf == 100


def test_workloads_are_deterministic_and_follow_the_paper() -> None:
    single = arrivals(Workload.single_block())
    assert single == arrivals(Workload.single_block())
    assert 0.7 < sum(a.mouse for a in single) / len(single) < 0.8
    assert 550 < len(single) < 650  # 1 claim/s for 600 s
    multi = arrivals(Workload.multi_block(duration=60.0))
    assert all(a.blocks[-1] == int(a.time // 10) for a in multi)
    assert {len(a.blocks) for a in multi} <= set(range(1, 11))


CHORUS = Path(sys.executable).parent / "chorus"  # the console script of the editable install


def chorus(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CHORUS), *args], capture_output=True, text=True, timeout=120,
                          check=False)


def test_budget_command_shows_blocks_and_history(duckdb_data: str,
                                                 write_policy: Callable[..., Path]) -> None:
    path = write_policy(duckdb_data)
    with Engine(load_policy(path)) as engine:
        engine.execute("SELECT COUNT(*) FROM trips WHERE pickup_time >= '2026-03-31'",
                       analyst="alice", epsilon=2.5)
    text = chorus("budget", "--policy", str(path))
    assert text.returncode == 0, text.stderr
    assert "accounting: basic; scheduler: fcfs; 1 block(s)" in text.stdout
    row = next(line for line in text.stdout.splitlines() if "trips/2026-03-31" in line)
    assert row.split()[1:8] == ["active", "1000", "2.5", "0", "997.5", "0", "997.5"]
    as_json = json.loads(chorus("budget", "--policy", str(path), "--json").stdout)
    (block,) = as_json["blocks"]
    assert (block["block"], block["epsilon_consumed"]) == ("trips/2026-03-31", 2.5)
    history = chorus("budget", "--policy", str(path), "history")
    events = [line.split()[2] for line in history.stdout.splitlines()]
    assert events == ["block_created", "claim_arrived", "claim_granted", "claim_consumed"]


def test_budget_command_errors_and_help(tmp_path: Path) -> None:
    missing = chorus("budget")
    assert missing.returncode == 2 and "--policy is required" in missing.stderr
    bad = chorus("budget", "--policy", str(tmp_path / "nope.toml"))
    assert bad.returncode == 1 and "cannot read the policy file" in bad.stderr
    helped = chorus("budget", "--help")
    assert helped.returncode == 0 and "chorus budget --policy demo/policy.toml" in helped.stdout


def test_budget_simulate_command(tmp_path: Path) -> None:
    png = tmp_path / "sim.png"
    out = chorus("budget", "--json", "simulate", "-n", "150", "--plot", str(png))
    assert out.returncode == 0, out.stderr
    results = {r["policy"]: r["granted"] for r in json.loads(out.stdout)}
    assert results["dpf-n"] == 100 and results["fcfs"] < results["rr-n"] < 100
    assert png.stat().st_size > 1000
