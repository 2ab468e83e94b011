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
import signal
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from chorus_py.engine import Engine
from server.listen import Listener, StartListener
from server.pgwire.listener import pgwire_listener
from server.pgwire.server import DEFAULT_LISTEN
from server.rest.listener import DEFAULT_HOST, DEFAULT_PORT, rest_listener

log = logging.getLogger("chorus.serve")

#: Where the REST API and budget dashboard listen by default.
DEFAULT_REST = f"{DEFAULT_HOST}:{DEFAULT_PORT}"


def serve(policy_path: str | Path, listen: str = DEFAULT_LISTEN,
          rest: str | None = DEFAULT_REST) -> None:
    """Load the policy, build the engine once, serve the wire protocol and (unless ``rest`` is
    None or empty) the REST API and dashboard until SIGINT/SIGTERM."""
    engine = Engine.from_policy(policy_path)
    # Least privilege (docs/owner-guide.md): what the start-up checks found, for the owner.
    for warning in getattr(engine.backend, "warnings", ()):
        log.warning("%s", warning)  # a log line: one JSON object under --log-format json
    runner: Callable[[Any], Any] = asyncio.run
    with contextlib.suppress(ImportError):
        import uvloop  # type: ignore[import-not-found]  # optional: a faster event loop

        runner = uvloop.run
    listeners = [pgwire_listener(engine, listen)]
    if rest:
        listeners.append(rest_listener(engine, rest))
    try:
        runner(run_listeners(listeners))
    finally:
        engine.close()


async def run_listeners(listeners: Sequence[StartListener]) -> None:
    """Start every listener, wait for SIGINT or SIGTERM, close them all (those started, when
    one fails to start)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    started: list[Listener] = []
    try:
        for start in listeners:
            started.append(await start())
        await stop.wait()
    finally:
        for listener in started:
            await listener.close()
