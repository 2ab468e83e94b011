"""The wire protocol as a front door of ``chorus serve``: bind, announce, hand back the server.

:func:`pgwire_listener` is the :data:`server.listen.StartListener` the serving loop
(:mod:`server.serve`) starts: it builds the :class:`~server.pgwire.server.WireServer` from the
engine's policy, binds ``--listen`` (a :class:`~server.listen.ListenError` if it cannot) and
logs the start-up line (address, TLS mode, analysts who can log in) under ``chorus.serve``,
which ``chorus serve`` shows at its default level.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

from server.listen import Listener, ListenError, StartListener
from server.pgwire.cancels import CancelRelay
from server.pgwire.server import WireServer, build_wire_server, parse_listen

log = logging.getLogger("chorus.serve.wire")


def pgwire_listener(engine: Any, listen: str, sock: socket.socket | None = None,
                    relay: CancelRelay | None = None) -> StartListener:
    """The Postgres wire protocol front door on ``listen`` (HOST:PORT).  As a worker of
    ``chorus serve --workers``: ``sock``, the worker's socket bound there, and ``relay``, how
    cancel requests reach the worker that runs the session (:mod:`server.pgwire.cancels`)."""
    host, port = parse_listen(listen)

    async def start() -> Listener:
        server = build_wire_server(engine)
        if relay is not None:
            server.use_relay(relay)
        try:
            await server.start(host, port, sock)
        except OSError as err:
            raise ListenError("Postgres wire protocol", listen, "--listen", err) from None
        analysts = sorted(n for n, v in server.ctx.verifiers.items() if v is not None)
        log.info("Postgres wire protocol on %s:%d (%s); analysts with a password: %s", host,
                 port, _tls_mode(server),
                 ", ".join(analysts) or "none (add one with `chorus passwd`)")
        return server

    return start


def _tls_mode(server: WireServer) -> str:
    """How the wire server treats TLS, for its start-up line."""
    if server.ctx.tls_required:
        return "TLS required"
    return "TLS available" if server.tls else "no TLS"
