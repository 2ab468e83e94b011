"""REST and the dashboard as a front door: address parsing, uvicorn, the ``chorus serve`` listener.

:func:`rest_listener` is the :data:`server.listen.StartListener` the serving loop
(:mod:`server.serve`) starts: it binds ``--rest`` itself (so a taken address is a
:class:`~server.listen.ListenError`, not uvicorn's exit), then runs uvicorn on that socket as a
task of the running loop, without signal handlers (the serving loop decides when to stop).
:func:`serve_rest` runs the app the same way for a caller with its own loop, and
``python -m server.rest`` (:mod:`server.rest.__main__`) on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import uvicorn
from fastapi import FastAPI

from server.listen import ListenError, bind_socket
from server.rest.app import create_app

log = logging.getLogger("chorus.rest")
# The start-up line: under chorus.serve, which `chorus serve` shows at its default level.
started_log = logging.getLogger("chorus.serve.rest")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000


def parse_listen(value: str, default_port: int = DEFAULT_PORT) -> tuple[str, int]:
    """``HOST:PORT``, ``[IPv6]:PORT``, ``HOST`` or ``:PORT`` (all interfaces) -> (host, port).

    The same forms as the wire server's ``--listen``.
    """
    value = value.strip()
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        port = rest.removeprefix(":")
    elif value.count(":") == 1:
        host, port = value.split(":")
    else:
        host, port = value, ""
    try:
        number = int(port) if port else default_port
    except ValueError:
        raise ValueError(f"bad listen address {value!r}: the port is not a number") from None
    if not 0 <= number <= 65535:
        raise ValueError(f"bad listen address {value!r}: port out of range")
    if not host and not value.startswith(":"):
        host = DEFAULT_HOST
    return host or "0.0.0.0", number


class _EmbeddedServer(uvicorn.Server):
    """A uvicorn server that leaves signal handling to the program it runs in."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def rest_server(app: FastAPI, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, *,
                handle_signals: bool = False, **config: Any) -> uvicorn.Server:
    """A uvicorn server for ``app``: ``await server.serve()`` runs it, ``should_exit`` stops it.

    With ``handle_signals`` False (the default) uvicorn installs no signal handlers: the program
    that embeds it (``chorus serve``) decides when to stop.  ``config`` goes to uvicorn.Config.
    """
    # log_config None: uvicorn's records go to the program's handlers (one format, text or
    # JSON: chorus_py.activity.configure_logging), not handlers of its own.
    options: dict[str, Any] = {"log_level": "info", "access_log": False, "lifespan": "off",
                               "server_header": False, "timeout_graceful_shutdown": 10,
                               "log_config": None}
    options.update(config)
    cls = uvicorn.Server if handle_signals else _EmbeddedServer
    return cls(uvicorn.Config(app, host=host, port=port, **options))


async def serve_rest(engine: Any, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, *,
                     handle_signals: bool = False, **config: Any) -> None:
    """Serve the REST app for ``engine`` on host:port inside the running asyncio loop.

    Runs until the task is cancelled (it then closes its sockets and re-raises) or, with
    ``handle_signals``, until SIGINT/SIGTERM.  The caller owns and closes the engine.
    """
    server = rest_server(create_app(engine), host, port, handle_signals=handle_signals,
                         **config)
    log.info("REST listening on http://%s:%d", host, port)
    try:
        await server.serve()
    except asyncio.CancelledError:
        server.should_exit = True
        if getattr(server, "servers", None):  # started: close the sockets and connections
            await asyncio.shield(server.shutdown())
        raise


class RestListener:
    """A running REST server inside ``chorus serve``'s loop (see ``server/serve.py``)."""

    def __init__(self, server: uvicorn.Server, task: asyncio.Task[None], url: str) -> None:
        self.server = server
        self.task = task
        self.url = url

    async def close(self) -> None:
        """Stop accepting requests, finish those in flight, close the socket."""
        self.server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self.task), timeout=15)
        except TimeoutError:
            self.task.cancel()


def rest_listener(engine: Any, listen: str = f"{DEFAULT_HOST}:{DEFAULT_PORT}",
                  sock: socket.socket | None = None,
                  **config: Any) -> Callable[[], Awaitable[RestListener]]:
    """The REST front door on ``listen`` (HOST:PORT) as a ``chorus serve`` listener.

    Calling the result binds the socket (a ``ListenError`` if it cannot), starts uvicorn as a task
    of the running loop and returns a :class:`RestListener` once it accepts connections.
    ``sock``: a socket already bound to ``listen`` (by ``chorus serve --workers``' parent,
    shared by every worker), used instead of binding one.
    """
    host, port = parse_listen(listen)

    async def start() -> RestListener:
        nonlocal sock
        if sock is None:
            try:
                sock = bind_socket(host, port)
            except OSError as err:
                raise ListenError("REST API and dashboard", listen, "--rest", err) from None
        server = rest_server(create_app(engine), host, port, **config)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            if task.done():
                sock.close()
                task.result()
                raise OSError(f"the REST server on {listen} stopped while starting")
            await asyncio.sleep(0.01)
        bound_host, bound_port = sock.getsockname()[:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        url = f"http://{shown}:{bound_port}"
        started_log.info("REST API on %s/v1 (OpenAPI: %s/openapi.json), budget dashboard on "
                         "%s/dashboard", url, url, url)
        return RestListener(server, task, url)

    return start
