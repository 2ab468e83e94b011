"""``chorus serve``: build the engine once, then run the front doors on it until stopped.

Each front door is a *listener*: an async function that starts serving and returns an object
with an async ``close()``.  :func:`serve` starts the Postgres wire protocol listener; another
front door (the REST app) is one more entry in the list given to :func:`run_listeners`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
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


class ListenError(Exception):
    """A front door could not listen on its address (taken, not local, not permitted...)."""

    def __init__(self, door: str, address: str, option: str, err: OSError) -> None:
        # os.strerror: "Address already in use", not asyncio's or uvicorn's long wording.
        self.reason = os.strerror(err.errno) if err.errno else str(err)
        self.door, self.address, self.option, self.errno = door, address, option, err.errno
        super().__init__(f"cannot listen on {address} ({door}): {self.reason}")

    @property
    def hint(self) -> str:
        """What to do about it."""
        why = {errno.EADDRINUSE: "another process listens there (another `chorus serve`?)",
               errno.EACCES: "ports below 1024 need privileges",
               errno.EADDRNOTAVAIL: "the host is not an address of this machine"}
        hint = why.get(self.errno, "") + ("; " if self.errno in why else "")
        hint += f"choose another address with {self.option} HOST:PORT"
        return hint + (", or turn it off with --rest ''" if self.option == "--rest" else "")


def serve(policy_path: str | Path, listen: str = DEFAULT_LISTEN,
          rest: str | None = DEFAULT_REST) -> None:
    """Load the policy, build the engine once, serve the wire protocol and (unless ``rest`` is
    None or empty) the REST API and dashboard until SIGINT/SIGTERM."""
    from chorus_py.engine import Engine

    engine = Engine.from_policy(policy_path)
    # Least privilege (docs/owner-guide.md): what the start-up checks found, for the owner.
    for warning in getattr(engine.backend, "warnings", ()):
        print(f"chorus: warning: {warning}", file=sys.stderr, flush=True)
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
        try:
            await server.start(host, port)
        except OSError as err:
            raise ListenError("Postgres wire protocol", listen, "--listen", err) from None
        analysts = sorted(n for n, v in server.ctx.verifiers.items() if v is not None)
        print(f"chorus: Postgres wire protocol on {host}:{port} "
              f"({_tls_mode(server)}); analysts with a password: "
              f"{', '.join(analysts) or 'none (add one with `chorus passwd`)'}",
              file=sys.stderr, flush=True)
        return server

    return start


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


def _tls_mode(server: Any) -> str:
    """How the wire server treats TLS, for its start-up line."""
    if server.ctx.tls_required:
        return "TLS required"
    return "TLS available" if server.tls else "no TLS"
