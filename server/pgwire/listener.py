"""The wire protocol as a front door of ``chorus serve``: bind, announce, hand back the server.

:func:`pgwire_listener` is the :data:`server.listen.StartListener` the serving loop
(:mod:`server.serve`) starts: it builds the :class:`~server.pgwire.server.WireServer` from the
engine's policy, binds ``--listen`` (a :class:`~server.listen.ListenError` if it cannot) and
prints the start-up line (address, TLS mode, analysts who can log in).
"""

from __future__ import annotations

import sys
from typing import Any

from server.listen import Listener, ListenError, StartListener
from server.pgwire.server import WireServer, build_wire_server, parse_listen


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


def _tls_mode(server: WireServer) -> str:
    """How the wire server treats TLS, for its start-up line."""
    if server.ctx.tls_required:
        return "TLS required"
    return "TLS available" if server.tls else "no TLS"
