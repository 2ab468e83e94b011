"""``chorus serve``: build the engine once, then run the front doors on it until stopped.

The front doors each own a folder: the Postgres wire protocol (:mod:`server.pgwire`), REST
(:mod:`server.rest`) and the dashboard it serves (:mod:`server.dashboard`).  Each offers a
*listener* (:mod:`server.listen`): an async function that starts serving and returns an object
with an async ``close()``.  :func:`serve` starts the wire protocol listener and, unless turned
off, the REST one, and :func:`run_listeners` runs them on one event loop until SIGINT/SIGTERM.
This module imports the doors; none of them imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from chorus_py.engine import Engine
from chorus_py.reload import reload_policy
from server.heap import ENV, settle_heap
from server.listen import Listener, StartListener
from server.pgwire.cancels import CancelRelay
from server.pgwire.listener import pgwire_listener
from server.pgwire.server import DEFAULT_LISTEN
from server.rest.listener import DEFAULT_HOST, DEFAULT_PORT, rest_listener

log = logging.getLogger("chorus.serve")

#: Where the REST API and budget dashboard listen by default.
DEFAULT_REST = f"{DEFAULT_HOST}:{DEFAULT_PORT}"


def serve(policy_path: str | Path, listen: str = DEFAULT_LISTEN,
          rest: str | None = DEFAULT_REST, pid_file: Path | None = None, *,
          sockets: Sequence[socket.socket | None] = (None, None),
          parent: int | None = None, relay: CancelRelay | None = None,
          on_ready: Callable[[], None] | None = None) -> None:
    """Load the policy, build the engine once, serve the wire protocol and (unless ``rest`` is
    None or empty) the REST API and dashboard until SIGINT/SIGTERM; on SIGHUP read the policy
    again (:mod:`chorus_py.reload`).  ``pid_file``: where ``chorus reload`` finds the process.

    As a worker of ``chorus serve --workers`` (:mod:`server.workers`): ``sockets`` are the
    wire and REST sockets the parent bound (shared by every worker), ``parent`` the parent's
    process id (the worker stops when the parent is gone), ``relay`` passes cancel requests
    between the workers, ``on_ready`` is called once every door serves."""
    engine = Engine.from_policy(policy_path)
    engine.warm_up()  # ranked copies build in the background; queries do not wait for them
    # The garbage collector's settings (server.heap): the process is the server's, not a
    # library host's, so its start owns them; logged so the owner sees what applies.
    settled = settle_heap()
    log.info("%s", settled.describe() if settled else f"garbage collector: CPython's "
             f"settings ({ENV}=default)")
    # Least privilege (docs/owner-guide.md): what the start-up checks found, for the owner.
    for warning in getattr(engine.backend, "warnings", ()):
        log.warning("%s", warning)  # a log line: one JSON object under --log-format json
    runner: Callable[[Any], Any] = asyncio.run
    with contextlib.suppress(ImportError):
        import uvloop  # type: ignore[import-not-found]  # optional: a faster event loop

        runner = uvloop.run
    wire_socket, rest_socket = sockets
    listeners = [pgwire_listener(engine, listen, wire_socket, relay)]
    if rest:
        listeners.append(rest_listener(engine, rest, rest_socket))

    def reload() -> None:
        outcome = reload_policy(engine, policy_path)
        # A log line (one JSON object under --log-format json), like the start-up warnings.
        (log.info if outcome.applied else log.warning)("%s", outcome.message)

    written = write_pid(pid_file)
    try:
        runner(run_listeners(listeners, on_reload=reload, parent=parent, on_ready=on_ready))
    finally:
        remove_pid(written)
        engine.close()


def remove_pid(written: Path | None) -> None:
    """Remove the pid file ``write_pid`` wrote, if it still names this process."""
    if written is not None:
        with contextlib.suppress(OSError):
            if written.read_text().strip() == str(os.getpid()):
                written.unlink()


def write_pid(pid_file: Path | None) -> Path | None:
    """Write this process's id for ``chorus reload``; a warning (not a failure) if the file
    cannot be written: SIGHUP still works."""
    if pid_file is None:
        return None
    try:
        pid_file.write_text(f"{os.getpid()}\n")
    except OSError as err:
        log.warning("cannot write the pid file %s (%s): `chorus reload` will not find this "
                    "server; send it SIGHUP (kill -HUP %d)", pid_file, err.strerror,
                    os.getpid())
        return None
    return pid_file


async def run_listeners(listeners: Sequence[StartListener],
                        on_reload: Callable[[], None] | None = None, *,
                        parent: int | None = None,
                        on_ready: Callable[[], None] | None = None) -> None:
    """Start every listener, wait for SIGINT or SIGTERM, close them all (those started, when
    one fails to start).  On SIGHUP, ``on_reload`` runs in a worker thread (it reads a file):
    the loop keeps serving the open sessions meanwhile.  ``parent``: stop as well once this
    process's parent is no longer that process (it died: a worker must not outlive the
    ``chorus serve --workers`` that started it).  ``on_ready``: called once all listen."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    if on_reload is not None:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGHUP, _in_thread(loop, on_reload))
    started: list[Listener] = []
    try:
        for start in listeners:
            started.append(await start())
        if on_ready is not None:
            on_ready()
        watch = None if parent is None else asyncio.create_task(_watch_parent(parent, stop))
        await stop.wait()
        if watch is not None:
            watch.cancel()
    finally:
        for listener in started:
            await listener.close()


async def _watch_parent(parent: int, stop: asyncio.Event) -> None:
    """Set ``stop`` once the parent process is gone (the worker is then re-parented, so its
    parent id changes): a parent killed with SIGKILL cannot stop its workers itself."""
    while os.getppid() == parent:
        await asyncio.sleep(_PARENT_POLL_SECONDS)
    log.warning("the parent `chorus serve --workers` (pid %d) is gone: stopping", parent)
    stop.set()


#: How often a worker checks that its parent is still there.
_PARENT_POLL_SECONDS = 0.5


def _in_thread(loop: asyncio.AbstractEventLoop, work: Callable[[], None]) -> Callable[[], None]:
    """A signal handler that runs ``work`` in the loop's thread pool, one run at a time (a
    second SIGHUP during a reload waits for it: reloads apply in order)."""
    lock = asyncio.Lock()
    running: set[asyncio.Task[None]] = set()  # referenced until done (the loop keeps weak refs)

    async def run() -> None:
        async with lock:
            try:
                await loop.run_in_executor(None, work)
            except Exception as err:  # never let a failed reload stop the server
                log.error("reload failed, the old policy stays: %r", err)

    def handler() -> None:
        task = loop.create_task(run())
        running.add(task)
        task.add_done_callback(running.discard)

    return handler
