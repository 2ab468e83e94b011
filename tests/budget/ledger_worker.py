"""A separate process using a durable ledger, driven by tests/budget/test_durable.py.

    python -m tests.budget.ledger_worker race  STORE THREADS EPSILON GO_FILE
    python -m tests.budget.ledger_worker crash STORE COMMIT_NUMBER
    python -m tests.budget.ledger_worker hold  STORE STATE

STORE is ``sqlite:///path`` or a ``postgresql://`` URL.  Every ledger is basic/FCFS with
epsilon^G = 1 and delta^G = 0 (as the tests create it).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

from budget.ledger import Ledger
from budget.scheduler import SchedulerSettings
from budget.store import PostgresStore, SQLiteStore, Store
from chorus_py.errors import BudgetExhausted

BLOCKS = ["a", "b", "c"]


def open_store(url: str) -> Store:
    if url.startswith("sqlite:///"):
        return SQLiteStore(url.removeprefix("sqlite:///"))
    return PostgresStore(url)


def ledger(url: str, wait: float = 0.0) -> Ledger:
    return Ledger(1.0, 0.0, store=open_store(url),
                  scheduler=SchedulerSettings("fcfs", wait_seconds=wait, max_wait_seconds=wait))


def race(url: str, threads: int, epsilon: float, go_file: str) -> None:
    """Threads claim and consume ``epsilon`` on block "day" until refused; print the wins."""
    led = ledger(url)
    wins = [0] * threads
    errors: list[str] = []
    print("READY", flush=True)  # the ledger is open: the test may say go
    while not Path(go_file).exists():  # both processes start together
        time.sleep(0.001)

    def work(i: int) -> None:
        try:
            while True:
                try:
                    claim = led.claim(f"p{i}", ["day"], epsilon, 0.0)
                except BudgetExhausted:
                    return
                led.consume(claim)
                wins[i] += 1
        except BaseException as err:  # reported to the test
            errors.append(repr(err))

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    print(json.dumps({"wins": sum(wins), "errors": errors}), flush=True)


def crash(url: str, commit_number: int) -> None:
    """Claim and consume 0.01 on a, b, c in a loop; freeze inside the N-th commit."""
    led = ledger(url)
    count = [0]

    def before_commit() -> None:
        count[0] += 1
        if count[0] == commit_number:
            print("IN_COMMIT", flush=True)
            time.sleep(3600)  # killed here, inside the transaction, before COMMIT

    led.store.before_commit = before_commit  # type: ignore[attr-defined]
    led.ensure_blocks(BLOCKS)
    while True:
        claim = led.claim("crash", BLOCKS, 0.01, 0.0)
        print(f"ALLOCATED {claim.claim_id}", flush=True)
        led.consume(claim)
        print(f"CONSUMED {claim.claim_id}", flush=True)


def hold(url: str, state: str) -> None:
    """Leave one claim allocated (or waiting) and wait to be killed."""
    led = ledger(url, wait=3600.0)
    led.ensure_blocks(BLOCKS)
    claim = led.submit("hold", BLOCKS, 0.25 if state == "allocated" else 5.0 / 8, 0.0)
    print(f"{claim.state.upper()} {claim.claim_id}", flush=True)
    time.sleep(3600)


if __name__ == "__main__":
    mode, store, *args = sys.argv[1:]
    if mode == "race":
        race(store, int(args[0]), float(args[1]), args[2])
    elif mode == "crash":
        crash(store, int(args[0]))
    else:
        hold(store, args[0])
