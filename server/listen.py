"""What every front door shares with the serving loop: the listener contract and its error.

A front door (the wire protocol in :mod:`server.pgwire.listener`, REST and the dashboard in
:mod:`server.rest.listener`) offers a :data:`StartListener`: an async function that binds its
address, starts serving inside the running event loop and returns a :class:`Listener`, which
``chorus serve`` (:mod:`server.serve`) closes on SIGINT/SIGTERM.  A door that cannot bind its
address raises :class:`ListenError`, which the CLI shows with a hint.  The doors and the serving
loop import this module; it imports none of them.
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Protocol


class Listener(Protocol):
    """A running front door."""

    async def close(self) -> None:
        """Stop accepting connections, finish or drop those open, release the socket."""


#: Starts a front door in the running loop (raises :class:`ListenError` if it cannot bind).
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


def bind_socket(host: str, port: int, backlog: int | None = None,
                reuse_port: bool = False) -> socket.socket:
    """A TCP socket bound to host:port (``SO_REUSEADDR``: a restart need not wait for the old
    connections' TIME_WAIT); listening already when ``backlog`` is given.

    ``reuse_port``: ``SO_REUSEPORT``, for ``chorus serve --workers N`` (:mod:`server.workers`):
    each worker listens on a socket of its own on the same address, and the kernel spreads
    new connections over them (a hash of the client's address and port).  One listening socket
    shared by every worker would not: an asyncio server accepts every connection waiting at
    each wake-up, so the first worker to wake takes a whole burst.  Linux lets only processes
    of the same user join the group.  Raises ``OSError`` (the caller turns it into a
    :class:`ListenError`).
    """
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
        if backlog is not None:
            sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock
