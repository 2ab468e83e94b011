"""Where a DP query's time goes, for the benchmarks that split it (benchmarks/corpus.py,
benchmarks/spark.py): the statements an engine sends, by phase (its private choices'
histograms, its answer, other statements), its ledger calls, and the proxy's own time."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from chorus_py.engine import Engine
from chorus_py.kinds.mixed import PartSelections
from chorus_py.kinds.quantile_selection import QuantileSelection
from chorus_py.kinds.selection import Selection


@dataclass
class Phases:
    """Where one DP query's time went (seconds; ``cpu``: the proxy process's CPU time)."""

    total: float = 0.0
    choices: float = 0.0  # making the private choices: their histograms and the rules
    chose: int = 0  # 1 when the query made its choices (0: none, or an earlier query's reused)
    histograms: float = 0.0  # the part of ``choices`` spent in statements on the database
    histogram_count: int = 0
    answer: float = 0.0
    other: float = 0.0  # EXPLAIN (once per shape), public keys, join frequencies, stores
    ledger: float = 0.0
    cpu: float = 0.0
    # Every statement sent: (phase, SQL, seconds), phase "histogram", "answer" or "other".
    statements: list[tuple[str, str, float]] = field(default_factory=list)

    @property
    def proxy(self) -> float:
        """The proxy's own time beside its choices: what no statement, choice or the
        ledger took."""
        return self.total - self.choices - self.answer - self.other - self.ledger

    @property
    def beside_statements(self) -> float:
        """The proxy's own time, its choice rules included: what no statement or the ledger
        took."""
        return self.total - self.histograms - self.answer - self.other - self.ledger


class Recorder:
    """Times the statements engines send and their ledger calls, by phase.

    A statement of a query (``Statements.run`` or ``run_integers``) sent while a
    private-choice step runs (``choose`` of the analytic, quantile or mixed selection) is a
    selection histogram, any other statement of the query its answer; statements sent outside
    those (plans, freshness checks, join frequencies) are "other".  The ledger's share is the claim
    until its decision plus the wait for its durable commit (``Ledger.claim_overlapped``: the
    commit overlaps the statements, so only the wait is on the query's path)."""

    def __init__(self) -> None:
        self._local = threading.local()
        self.current: Phases | None = None
        for cls in (Selection, QuantileSelection, PartSelections):
            self._mark_choose(cls)

    def _mark_choose(self, cls: type) -> None:
        choose = cls.choose

        def marked(selection: Any, *args: Any) -> Any:
            # A depth, not a flag: a mixed query's choose calls its parts' choose.
            depth = getattr(self._local, "selecting", 0)
            self._local.selecting = depth + 1
            started = time.perf_counter()
            try:
                return choose(selection, *args)
            finally:
                self._local.selecting = depth
                if depth == 0 and self.current is not None:
                    self.current.choices += time.perf_counter() - started
                    self.current.chose = 1

        cls.choose = marked  # type: ignore[attr-defined]

    def attach(self, engine: Engine) -> None:
        """Time ``engine``'s backend statements and ledger calls (instance attributes: the
        engine's Statements, kinds and stores call them through the same objects)."""
        backend, statements, ledger = engine.backend, engine.statements, engine.ledger
        # run_integers: a histogram read column-wise (quantiles, MIN/MAX); untimed, its
        # statement was counted as the proxy's own time.
        # run_side_by_side: a statement's parts at once (Postgres's halves of the choices'
        # cells), timed as one statement; their runs in its helper threads are inside it.
        for name in ("run", "run_public", "run_integers", "run_side_by_side"):
            self._time_backend(backend, name)
        for name in ("run", "run_integers", "run_parts"):
            self._mark_query(statements, name)
        ensure = ledger.ensure_blocks
        overlapped = ledger.claim_overlapped

        def timed_ensure(*args: Any, **kwargs: Any) -> Any:
            with self._ledger():
                return ensure(*args, **kwargs)

        def timed_claim(*args: Any, **kwargs: Any) -> Any:
            with self._ledger():
                claim, durable = overlapped(*args, **kwargs)

            def timed_durable() -> None:
                with self._ledger():
                    durable()

            return claim, timed_durable

        ledger.ensure_blocks = timed_ensure  # type: ignore[method-assign]
        ledger.claim_overlapped = timed_claim  # type: ignore[method-assign]

    def _mark_query(self, statements: Any, name: str) -> None:
        """Statements sent through ``statements.<name>`` are a query's (choices or answer)."""
        call = getattr(statements, name)

        def marked(*args: Any, **kwargs: Any) -> Any:
            self._local.in_query = True
            try:
                return call(*args, **kwargs)
            finally:
                self._local.in_query = False

        setattr(statements, name, marked)

    def _time_backend(self, backend: Any, name: str) -> None:
        call = getattr(backend, name)

        def timed(sql: Any) -> Any:
            # Only the outermost call is timed: a backend's run_integers may call its run, and
            # run_side_by_side its run, here and in its helper threads.
            depth = getattr(self._local, "sending", 0)
            helper = threading.current_thread().name.startswith("chorus-side-by-side")
            self._local.sending = depth + 1
            started = time.perf_counter()
            try:
                return call(sql)
            finally:
                self._local.sending = depth
                if depth == 0 and not helper:
                    text = sql if isinstance(sql, str) else " UNION ALL ".join(sql)
                    self._statement(text, time.perf_counter() - started)

        setattr(backend, name, timed)

    @contextmanager
    def _ledger(self) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            if self.current is not None:
                self.current.ledger += time.perf_counter() - started

    def _statement(self, sql: str, seconds: float) -> None:
        phases = self.current
        if phases is None:
            return
        if not getattr(self._local, "in_query", False) or sql.startswith("EXPLAIN "):
            phase = "other"
            phases.other += seconds
        elif getattr(self._local, "selecting", 0):
            phase = "histogram"
            phases.histograms += seconds
            phases.histogram_count += 1
        else:
            phase = "answer"
            phases.answer += seconds
        phases.statements.append((phase, sql, seconds))

    @contextmanager
    def measure(self) -> Iterator[Phases]:
        """The phases of the calls made inside the block."""
        phases = Phases()
        self.current = phases
        cpu = time.process_time()
        started = time.perf_counter()
        try:
            yield phases
        finally:
            phases.total = time.perf_counter() - started
            phases.cpu = time.process_time() - cpu
            self.current = None


def timed(call: Callable[..., Any], *args: Any) -> float:
    """Seconds ``call(*args)`` took."""
    started = time.perf_counter()
    call(*args)
    return time.perf_counter() - started
