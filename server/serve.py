"""``chorus serve``: build the engine once, then run the front doors on it until stopped.

Each front door is a *listener*: an async function that starts serving and returns an object
with an async ``close()``.  :func:`serve` starts the Postgres wire protocol listener; another
front door (the REST app) is one more entry in the list given to :func:`run_listeners`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from server.pgwire.server import DEFAULT_LISTEN, build_wire_server, parse_listen

log = logging.getLogger("chorus.serve")
#: Where the REST API and budget dashboard listen by default (server/rest.py).
DEFAULT_REST = "127.0.0.1:8000"


class Listener(Protocol):
    async def close(self) -> None: ...


StartListener = Callable[[], Awaitable[Listener]]


def serve(policy_path: str | Path, listen: str = DEFAULT_LISTEN,
          rest: str | None = DEFAULT_REST) -> None:
    """Load the policy, build the engine once, serve the wire protocol and (unless ``rest`` is
    None or empty) the REST API and dashboard until SIGINT/SIGTERM."""
    from chorus_py.engine import Engine

    engine = Engine.from_policy(policy_path)
    runner: Callable[[Any], Any] = asyncio.run
    with contextlib.suppress(ImportError):
        import uvloop  # type: ignore[import-not-found]  # optional: a faster event loop

        runner = uvloop.run
    listeners = [pgwire_listener(engine, listen)]
    if rest:
        from server.rest import rest_listener

        listeners.append(rest_listener(engine, rest))
    try:
        runner(run_listeners(listeners))
    finally:
        engine.close()


def pgwire_listener(engine: Any, listen: str) -> StartListener:
    """The Postgres wire protocol front door on ``listen`` (HOST:PORT)."""
    host, port = parse_listen(listen)

    async def start() -> Listener:
        server = build_wire_server(engine)
        await server.start(host, port)
        analysts = sorted(n for n, v in server.ctx.verifiers.items() if v is not None)
        print(f"chorus: Postgres wire protocol on {host}:{port} "
              f"({'TLS available' if server.tls else 'no TLS'}); analysts with a password: "
              f"{', '.join(analysts) or 'none (add one with `chorus passwd`)'}",
              file=sys.stderr, flush=True)
        return server

    return start


async def run_listeners(listeners: Sequence[StartListener]) -> None:
    """Start every listener, wait for SIGINT or SIGTERM, close them all."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    started = [await start() for start in listeners]
    try:
        await stop.wait()
    finally:
        for listener in started:
            await listener.close()
