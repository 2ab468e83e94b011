"""Cancelling a running statement from another thread: a client's cancel request, a front door's
timeout, or the watchdog of ``backend.statement_timeout_seconds``, whichever backend runs it."""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

log = logging.getLogger("chorus.backends")


class Stop:
    """One running statement's cancel: sends it at most while the statement runs."""

    __slots__ = ("_cancel", "_lock", "over", "reason")

    def __init__(self, cancel: Callable[[], object]) -> None:
        self._cancel = cancel
        self._lock = threading.Lock()
        self.over = False
        self.reason: str | None = None  # why it was cancelled: "statement timeout"...

    def cancel(self, reason: str) -> bool:
        """Cancel the statement unless it is over; the first reason given is kept."""
        # The lock makes "still running?" and "send the cancel" one step against the
        # statement's end: sent late, a cancel would stop whatever that connection runs next
        # (a Postgres cancel request targets the backend process, not a statement), e.g. the
        # next query of another analyst.
        with self._lock:
            if self.over:
                return False
            self.reason = self.reason or reason
            self._cancel()
            return True

    def end(self) -> None:
        with self._lock:
            self.over = True


class _Watchdog:
    """Fires statement timeouts: one thread for the process and a heap of deadlines (a timer
    thread per statement would start a thread per query).  A fired statement is interrupted
    again every 0.2 s until it returns: an interrupt that lands before the engine started
    executing would otherwise be lost."""

    RETRY = 0.2

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Stop]] = []
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._ended = 0  # finished statements still in the heap

    def watch(self, stop: Stop, seconds: float) -> None:
        with self._cond:
            heapq.heappush(self._heap, (time.monotonic() + seconds, next(self._seq), stop))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True,
                                                name="chorus-statement-timeouts")
                self._thread.start()
            elif self._heap[0][2] is stop:
                self._cond.notify()

    def ended(self) -> None:
        """A watched statement is over: drop finished ones once they are half the heap, so
        a busy proxy does not keep every statement of the last timeout period."""
        with self._cond:
            self._ended += 1
            if self._ended > 64 and 2 * self._ended > len(self._heap):
                self._heap = [entry for entry in self._heap if not entry[2].over]
                heapq.heapify(self._heap)
                self._ended = 0

    def _loop(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                due: list[Stop] = []
                while self._heap and self._heap[0][0] <= now:
                    stop = heapq.heappop(self._heap)[2]
                    if stop.over:
                        self._ended = max(self._ended - 1, 0)
                    else:
                        due.append(stop)
                if not due:
                    self._cond.wait(self._heap[0][0] - now if self._heap else None)
                    continue
            for stop in due:  # outside the lock: a cancel may be a network round trip
                try:
                    stop.cancel("statement timeout")
                except Exception:
                    log.debug("interrupting a statement at its timeout failed", exc_info=True)
                if not stop.over:
                    self.watch(stop, self.RETRY)


_WATCHDOG = _Watchdog()
# The statement each thread is running (a thread runs one at a time): a cancel request or a
# timeout of any front door reaches it by thread, whichever engine runs it (backend, catalog).
_RUNNING: dict[int, Stop] = {}


@contextmanager
def cancellable(cancel: Callable[[], object],
                timeout_seconds: float | None = None) -> Iterator[Stop]:
    """Register how to cancel the current thread's statement while the block runs.

    :func:`interrupt` (another thread: a cancel request, a front door's timeout) reaches it;
    with ``timeout_seconds`` it is also cancelled when it runs longer, with the reason
    "statement timeout".  The yielded handle's ``reason`` says why it was cancelled (None: it
    was not), so the caller can name it in its error.
    """
    stop = Stop(cancel)
    me = threading.get_ident()
    _RUNNING[me] = stop
    if timeout_seconds is not None:
        _WATCHDOG.watch(stop, timeout_seconds)
    try:
        yield stop
    finally:
        stop.end()
        if _RUNNING.get(me) is stop:
            del _RUNNING[me]
        if timeout_seconds is not None:
            _WATCHDOG.ended()


def interrupt(thread_id: int, reason: str = "user request") -> bool:
    """Cancel the statement thread ``thread_id`` is running in a :func:`cancellable` block.

    Called from another thread (a client's cancel request, a statement timeout).  The
    statement then fails in its own thread like any backend error once it started, so the
    engine charges its claim.  Returns False when that thread runs no statement.
    """
    stop = _RUNNING.get(thread_id)
    return stop is not None and stop.cancel(reason)
