"""``chorus serve --workers N``: N proxy processes on the same ports, sharing the durable ledger.

The parent reserves the wire protocol and REST addresses (a socket bound with ``SO_REUSEPORT``
that never listens: a taken port is one error before any worker starts, and port 0 becomes one
port for all), then starts N workers (``python -m server.workers``).  Each binds a listening
socket of its own to the same address with ``SO_REUSEPORT`` and runs
:func:`server.serve.serve` on it with its own engine; the kernel spreads new connections over
the workers' sockets (:func:`server.listen.bind_socket` says why not one shared socket).
Connections waiting in the queue of a worker that dies are reset; new ones go to the others
until its replacement listens.

What the workers share, and how each guarantee holds across them:

- the budget ledger (SQLite file or Postgres): every change is one transaction serialised
  across processes (``budget.store``: ``BEGIN IMMEDIATE`` / a row lock), so two workers racing
  for the last budget of a block run one after the other; claims of a worker that died are
  settled (charged) by the worker started in its place (``Ledger.recover``);
- what the proxy keeps in the database (stored samples, kept sets, the naming key): built
  under a database lock (``chorus_py.stores.owned``);
- cancel requests: one may reach another worker than the session's, which relays it
  (``server.pgwire.cancels``, through a private directory the parent makes);
- nothing else: each worker has its own answer cache and choice reuse (an identical query
  answered by another worker is charged again: never less than it costs), its own metrics
  and its own connection limit (``[server] max_connections`` is per worker).

So N > 1 is refused for what one process alone may hold: an in-memory ledger (each worker would
have a budget of its own) and an embedded DuckDB file (one process opens it).

Signals: SIGTERM or SIGINT stop every worker (each closes its doors as ``chorus serve`` does),
then the parent exits 0.  SIGHUP (``chorus reload``: the pid file is the parent's) is passed on
to every worker.  A worker that exits unexpectedly after it served is restarted; a worker that
fails before it ever served at start-up (bad database URL...) stops the server with exit 1, as
does a crash loop (more than ``MAX_RESTARTS`` restarts within ``RESTART_WINDOW`` seconds).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from chorus_py.errors import PolicyError
from chorus_py.policy import Policy, load_policy
from server.listen import ListenError, bind_socket

log = logging.getLogger("chorus.serve.workers")

#: More restarts than this within RESTART_WINDOW seconds: the parent gives up (exit 1).
MAX_RESTARTS = 5
RESTART_WINDOW = 60.0
#: How long workers get to finish open requests after SIGTERM before they are killed.
STOP_SECONDS = 30.0
_POLL = 0.1
_BACKLOG = 100  # asyncio's and uvicorn's default


def shareable(policy: Policy) -> None:
    """Refuse (PolicyError) a policy whose state one process alone may hold."""
    url = policy.backend.url
    if url.startswith("duckdb:"):
        raise PolicyError(
            "--workers above 1 needs a database several processes can share; backend.url is "
            "an embedded DuckDB, which one process opens at a time",
            hint="serve it with --workers 1, or move the data to Postgres")
    if url.startswith("sc:"):
        raise PolicyError(
            "--workers above 1 needs a backend several processes can share; on Spark Connect "
            "the stored samples and copies in the private directory are replaced by one "
            "proxy process without telling another that may be reading them",
            hint="serve it with --workers 1 (the cluster spreads a query over its cores)")
    if url.startswith("spark:"):
        raise PolicyError(
            "--workers above 1 needs a backend several processes can share; backend.url is an "
            "in-process local Spark, whose private directory (stored samples and copies) one "
            "process owns",
            hint="serve it with --workers 1 (Spark itself spreads a query over the cores)")
    if policy.privacy.ledger == "memory":
        raise PolicyError(
            "--workers above 1 needs a durable ledger; privacy.ledger = \"memory\" would give "
            "every worker a budget of its own (each block could be spent once per worker)",
            hint="set privacy.ledger to \"sqlite:///FILE\" or a postgresql:// URL")


@dataclass
class _Worker:
    """One worker process and what the parent knows of it."""

    index: int
    proc: subprocess.Popen[bytes]
    ready_fd: int
    started: float
    ready: bool = False


@dataclass
class Supervisor:
    """Starts, watches, restarts and stops the workers (see the module docstring)."""

    policy_path: Path
    listen: str
    rest: str | None
    count: int
    log_format: str = "text"
    sockets: tuple[socket.socket, socket.socket | None] | None = None
    # Where the workers relay cancel requests (server.pgwire.cancels): a private directory.
    cancels: Path | None = None
    workers: list[_Worker] = field(default_factory=list)
    _stop: int | None = None  # the signal that asked to stop
    _reload: bool = False
    _restarts: deque[float] = field(default_factory=deque)

    def bind(self) -> None:
        """Reserve both doors' addresses (``ListenError`` if one cannot be bound)."""
        from server.pgwire.server import parse_listen
        from server.rest.listener import parse_listen as parse_rest

        host, port = parse_listen(self.listen)
        try:
            wire = bind_socket(host, port, reuse_port=True)
        except OSError as err:
            raise ListenError("Postgres wire protocol", self.listen, "--listen", err) from None
        self.listen = _address(wire)
        rest = None
        if self.rest:
            host, port = parse_rest(self.rest)
            try:
                rest = bind_socket(host, port, reuse_port=True)
            except OSError as err:
                wire.close()
                raise ListenError("REST API and dashboard", self.rest, "--rest", err) from None
            self.rest = _address(rest)
        self.sockets = (wire, rest)

    def run(self) -> int:
        """Serve until SIGTERM/SIGINT (0) or until the workers cannot be kept running (1)."""
        assert self.sockets is not None, "bind() first"
        previous = {sig: signal.signal(sig, self._on_signal)
                    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
        self.cancels = Path(tempfile.mkdtemp(prefix="chorus-serve-"))  # mode 0700
        try:
            self.workers = [self._spawn(i) for i in range(self.count)]
            status = self._watch()
        finally:
            self._stop_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            for sock in self.sockets:
                if sock is not None:
                    sock.close()
            shutil.rmtree(self.cancels, ignore_errors=True)
        return status

    # -- internals ------------------------------------------------------------------------------
    def _on_signal(self, signum: int, _frame: object) -> None:
        if signum == signal.SIGHUP:
            self._reload = True
        else:
            self._stop = signum

    def _spawn(self, index: int) -> _Worker:
        read, write = os.pipe()  # the worker writes a line once it serves
        command = [sys.executable, "-m", "server.workers", "--policy", str(self.policy_path),
                   "--listen", self.listen, "--rest", self.rest or "",
                   "--ready-fd", str(write), "--parent", str(os.getpid()),
                   "--cancel-dir", str(self.cancels),
                   "--index", str(index), "--count", str(self.count),
                   "--log-format", self.log_format,
                   "--log-level", str(logging.getLogger().getEffectiveLevel())]
        try:
            proc = subprocess.Popen(command, pass_fds=[write], stdin=subprocess.DEVNULL)
        finally:
            os.close(write)
        os.set_blocking(read, False)
        return _Worker(index, proc, read, time.monotonic())

    def _watch(self) -> int:
        announced = False
        while self._stop is None:
            if self._reload:
                self._reload = False
                for w in self.workers:
                    with contextlib.suppress(ProcessLookupError):
                        w.proc.send_signal(signal.SIGHUP)
            for i, w in enumerate(self.workers):
                self._check_ready(w)
                code = w.proc.poll()
                if code is None or self._stop is not None:
                    continue
                os.close(w.ready_fd)
                if not announced:
                    # Failed while starting: the worker printed why (as `chorus serve` would).
                    log.error("worker %d (pid %d) exited with status %d while starting: "
                              "stopping", w.index, w.proc.pid, code)
                    return 1
                now = time.monotonic()
                self._restarts.append(now)
                while self._restarts and now - self._restarts[0] > RESTART_WINDOW:
                    self._restarts.popleft()
                if len(self._restarts) > MAX_RESTARTS:
                    log.error("workers exited %d times within %g s (last: worker %d, status "
                              "%d): stopping", len(self._restarts), RESTART_WINDOW, w.index,
                              code)
                    return 1
                log.warning("worker %d (pid %d) exited with status %d: starting another",
                            w.index, w.proc.pid, code)
                self.workers[i] = self._spawn(w.index)
            if not announced and all(w.ready for w in self.workers):
                announced = True
                log.info("%d workers serving (pids %s); parent pid %d", self.count,
                         ", ".join(str(w.proc.pid) for w in self.workers), os.getpid())
            time.sleep(_POLL)
        log.info("stopping %d workers (%s)", self.count, signal.Signals(self._stop).name)
        return 0

    def _check_ready(self, w: _Worker) -> None:
        if w.ready:
            return
        with contextlib.suppress(BlockingIOError, OSError):
            if os.read(w.ready_fd, 64):
                w.ready = True

    def _stop_all(self) -> None:
        """SIGTERM every worker, wait for them, SIGKILL any still running after STOP_SECONDS."""
        for w in self.workers:
            if w.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    w.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_SECONDS
        for w in self.workers:
            try:
                w.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("worker %d (pid %d) did not stop in %g s: killed", w.index,
                            w.proc.pid, STOP_SECONDS)
                w.proc.kill()
                w.proc.wait()
            with contextlib.suppress(OSError):
                os.close(w.ready_fd)


def serve_workers(policy_path: Path, listen: str, rest: str | None, count: int,
                  pid_file: Path | None = None, log_format: str = "text") -> int:
    """``chorus serve --workers count``: the exit status (0 after SIGTERM/SIGINT).

    Raises PolicyError for a policy that cannot be served by several processes and
    ListenError for an address that cannot be bound, before any worker starts.
    """
    shareable(load_policy(policy_path))
    supervisor = Supervisor(policy_path, listen, rest, count, log_format)
    supervisor.bind()
    from server.serve import remove_pid, write_pid

    written = write_pid(pid_file)
    try:
        return supervisor.run()
    finally:
        remove_pid(written)


def _address(sock: socket.socket) -> str:
    """HOST:PORT of a bound socket (the port chosen, when 0 was asked)."""
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _worker_main(argv: list[str] | None = None) -> None:
    """One worker (started by :class:`Supervisor`): listen with SO_REUSEPORT, serve."""
    parser = argparse.ArgumentParser(prog="python -m server.workers")
    for name in ("--policy", "--listen", "--rest", "--log-format", "--cancel-dir"):
        parser.add_argument(name, required=True)
    for name in ("--ready-fd", "--parent", "--index", "--count", "--log-level"):
        parser.add_argument(name, type=int, required=True)
    args = parser.parse_args(argv)

    from chorus_py.activity import configure_logging
    from chorus_py.errors import ChorusError
    from server.pgwire.cancels import CancelRelay
    from server.pgwire.server import parse_listen
    from server.rest.listener import parse_listen as parse_rest
    from server.serve import serve

    configure_logging("json" if args.log_format == "json" else "text")
    logging.getLogger().setLevel(args.log_level)

    def ready() -> None:
        log.info("worker %d of %d serving (pid %d)", args.index, args.count, os.getpid())
        with contextlib.suppress(OSError):
            os.write(args.ready_fd, b"ready\n")
            os.close(args.ready_fd)

    try:
        # Bound here, in the worker: each worker has its own socket in the SO_REUSEPORT group.
        wire = bind_socket(*parse_listen(args.listen), _BACKLOG, reuse_port=True)
        rest = (bind_socket(*parse_rest(args.rest), _BACKLOG, reuse_port=True)
                if args.rest else None)
        serve(args.policy, args.listen, args.rest or None, None, sockets=(wire, rest),
              parent=args.parent, on_ready=ready,
              relay=CancelRelay(Path(args.cancel_dir), args.index, args.count))
    except ChorusError as err:
        sys.stderr.write(f"error: {err.message}\n" + (f"hint: {err.hint}\n" if err.hint else ""))
        sys.exit(1)
    except OSError as err:
        sys.stderr.write(f"error: worker {args.index} cannot listen: {err}\n")
        sys.exit(1)


if __name__ == "__main__":
    _worker_main()
