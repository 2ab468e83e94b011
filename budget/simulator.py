"""The PrivateKube microbenchmark (section 6.1 of the paper), run on the real ledger code.

Claims arrive as a Poisson process; 75% are "mice" demanding 0.01 epsilon^G, 25% "elephants"
demanding 0.1 epsilon^G; a claim not granted within 300 s times out.

- single block: one block, 1 claim per second;
- multi block: a new block every 10 s; a claim asks for the last block (probability 0.75) or the
  last 10 (0.25); 12.8 claims per second (the paper's load: new demand is 13.5x new budget).

Policies: ``fcfs`` and ``dpf-n`` run on :class:`budget.ledger.Ledger` itself (in memory, with a
simulated clock); ``rr-n`` is the round-robin baseline of the paper, built here from the same
block state and transitions: budget unlocks as for DPF-N (epsilon^G / N per arrival) and is split
equally (max-min fair) among the waiting claims demanding it; a claim is granted once it holds
its whole demand; a claim that times out gives back what it held.  Granted claims are consumed at
once.  Everything is deterministic for a given seed.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from budget import scheduler as sched
from budget.accounting import BasicAccountant, Event
from budget.ledger import Claim, Ledger
from budget.scheduler import BlockState, SchedulerSettings
from budget.store import MemoryStore
from chorus_py.errors import BudgetExhausted

__all__ = ["Arrival", "Result", "Workload", "arrivals", "plot", "simulate", "sweep"]


@dataclass(frozen=True)
class Workload:
    """The microbenchmark's parameters (defaults: the paper's single-block experiment)."""

    rate: float = 1.0                 # claims per second
    duration: float = 600.0           # seconds of arrivals
    mice_share: float = 0.75
    mice_epsilon: float = 0.01        # fractions of epsilon^G
    elephant_epsilon: float = 0.1
    timeout: float = 300.0
    block_interval: float | None = None   # None: a single block
    wide_share: float = 0.25          # multi block: claims asking for the last ``wide`` blocks
    wide: int = 10
    seed: int = 0

    @classmethod
    def single_block(cls, **kw: float) -> Workload:
        """The paper's single-block experiment."""
        return cls(**kw)  # type: ignore[arg-type]

    @classmethod
    def multi_block(cls, **kw: float) -> Workload:
        """The paper's multi-block experiment (basic composition load)."""
        defaults: dict[str, float] = {"rate": 12.8, "duration": 150.0, "block_interval": 10.0}
        return cls(**{**defaults, **kw})  # type: ignore[arg-type]


@dataclass(frozen=True)
class Arrival:
    """One claim: when, how much (fraction of epsilon^G), which blocks (indices)."""

    time: float
    epsilon: float
    blocks: tuple[int, ...]
    mouse: bool


@dataclass(frozen=True)
class Result:
    """Granted claims of one run."""

    policy: str
    n: int | None
    arrived: int
    granted: int
    granted_mice: int
    granted_elephants: int


def arrivals(w: Workload) -> list[Arrival]:
    """The claims of a workload, in arrival order (deterministic for ``w.seed``)."""
    rng = random.Random(w.seed)
    out, t = [], 0.0
    while True:
        t += rng.expovariate(w.rate)
        if t >= w.duration:
            return out
        mouse = rng.random() < w.mice_share
        eps = w.mice_epsilon if mouse else w.elephant_epsilon
        if w.block_interval is None:
            blocks: tuple[int, ...] = (0,)
        else:
            last = int(t // w.block_interval)
            first = last - w.wide + 1 if rng.random() < w.wide_share else last
            blocks = tuple(range(max(0, first), last + 1))
        out.append(Arrival(t, eps, blocks, mouse))


def simulate(w: Workload, policy: str, n: int | None = None) -> Result:
    """Run one policy (``fcfs``, ``dpf-n`` or ``rr-n``) on a workload."""
    trace = arrivals(w)
    if policy == "rr-n":
        assert n is not None
        return _round_robin(w, trace, n)
    now = [0.0]
    granted: list[int] = []
    ledger = Ledger(1.0, 0.0, store=MemoryStore(), accountant=BasicAccountant(),
                    scheduler=SchedulerSettings(policy, n=n, wait_seconds=w.timeout,  # type: ignore[arg-type]
                                                max_wait_seconds=w.timeout),
                    clock=lambda: now[0], on_grant=granted.append)
    mice: dict[int, bool] = {}
    done = {"mice": 0, "elephants": 0}

    def settle() -> None:
        for claim_id in granted:
            ledger.consume(Claim(claim_id, "", (), 0.0, 0.0))
            done["mice" if mice[claim_id] else "elephants"] += 1
        granted.clear()

    created = -1
    for a in trace:
        now[0] = a.time
        newest = max(a.blocks)
        if newest > created:
            ledger.ensure_blocks(_name(i) for i in range(created + 1, newest + 1))
            created = newest
        names = [_name(i) for i in a.blocks]
        try:
            claim = ledger.submit("sim", names, a.epsilon, 0.0,
                                  events=(Event.epsilon_delta(a.epsilon),))
            mice[claim.claim_id] = a.mouse
        except BudgetExhausted:
            pass
        # Grants made while submitting may include this claim: record its kind first.
        for claim_id in granted:
            mice.setdefault(claim_id, a.mouse)
        settle()
    now[0] = w.duration + w.timeout + 1.0
    ledger.schedule()
    settle()
    return Result(policy, n, len(trace), done["mice"] + done["elephants"], done["mice"],
                  done["elephants"])


def _name(i: int) -> str:
    return f"block/{i:05d}"


class _Pending:
    __slots__ = ("arrival", "deadline", "held")

    def __init__(self, arrival: Arrival, deadline: float) -> None:
        self.arrival = arrival
        self.deadline = deadline
        self.held = dict.fromkeys(arrival.blocks, 0.0)


def _round_robin(w: Workload, trace: Sequence[Arrival], n: int) -> Result:
    acc = BasicAccountant()
    blocks: dict[int, BlockState] = {}
    waiting: list[_Pending] = []
    done = {"mice": 0, "elephants": 0}
    for a in trace:
        for i in range(len(blocks), max(a.blocks) + 1):
            blocks[i] = BlockState.new(_name(i), a.time, 1.0, 0.0, acc, locked=True)
        dirty = set(a.blocks)
        keep = []
        for p in waiting:  # time-outs give back what they held
            if p.deadline < a.time:
                for b, x in p.held.items():
                    sched.release(blocks[b], (x,), 0.0)
                    dirty.add(b)
            else:
                keep.append(p)
        waiting = keep
        if all(blocks[b].global_[0] - blocks[b].consumed[0] >= a.epsilon - 1e-12
               for b in a.blocks):
            for b in a.blocks:
                sched.unlock_on_arrival(blocks[b], n)
            waiting.append(_Pending(a, a.time + w.timeout))
        # else: could never be granted, refused at once and unlocks nothing (as in DPF)
        by_block: dict[int, list[_Pending]] = {}
        for p in waiting:
            for b in p.held:
                if b in dirty:
                    by_block.setdefault(b, []).append(p)
        for b in sorted(dirty):
            block = blocks[b]
            short = [p for p in by_block.get(b, ()) if p.held[b] < p.arrival.epsilon - 1e-15]
            # max-min fair split of the unlocked budget among the claims still short on it
            while short and block.unlocked[0] > 1e-15:
                share = block.unlocked[0] / len(short)
                still = []
                for p in short:
                    give = min(share, p.arrival.epsilon - p.held[b])
                    sched.allocate(block, (give,), 0.0)
                    p.held[b] += give
                    if p.held[b] < p.arrival.epsilon - 1e-15:
                        still.append(p)
                if len(still) == len(short):
                    break
                short = still
        keep = []
        for p in waiting:
            if all(x >= p.arrival.epsilon - 1e-12 for x in p.held.values()):
                for b, x in p.held.items():
                    sched.consume(blocks[b], (x,), 0.0)
                done["mice" if p.arrival.mouse else "elephants"] += 1
            else:
                keep.append(p)
        waiting = keep
    for block in blocks.values():
        block.check("basic")
    return Result("rr-n", n, len(trace), done["mice"] + done["elephants"], done["mice"],
                  done["elephants"])


def sweep(w: Workload, ns: Sequence[int]) -> list[Result]:
    """FCFS once, and DPF-N and RR-N for every N."""
    out = [simulate(w, "fcfs")]
    for n in ns:
        out.append(simulate(w, "rr-n", n))
        out.append(simulate(w, "dpf-n", n))
    return out


def plot(results: Sequence[Result], path: str | Path, title: str = "") -> None:
    """Granted claims against N, one line per policy (FCFS flat); saved as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=120)
    ns = sorted({r.n for r in results if r.n is not None})
    for policy, label, style in (("dpf-n", "DPF-N", "o-"), ("rr-n", "round-robin (RR-N)", "s--")):
        pts = sorted((r.n, r.granted) for r in results if r.policy == policy)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)
    fcfs = [r.granted for r in results if r.policy == "fcfs"]
    if fcfs and ns:
        ax.plot([ns[0], ns[-1]], [fcfs[0], fcfs[0]], ":", color="grey", label="FCFS")
    ax.set_xlabel("N (claims sharing a block's budget)")
    ax.set_ylabel("claims granted")
    ax.set_title(title or "PrivateKube microbenchmark")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
