"""Cancel requests between the workers of ``chorus serve --workers N``.

A Postgres client cancels a statement by opening a *new* connection and sending the session's
process id and secret key (``CancelRequest``).  With several workers listening on one port, that
connection may reach another worker than the one running the session, which would not know the
id and ignore it.  So each worker's sessions get ids of their own (``id % N == the worker's
index``), every worker receives relayed requests on a Unix datagram socket in a directory only
the server's user can enter, and a worker that gets a request for an id of another worker sends
the (id, key) pair there.  The receiving worker checks the key exactly as for a request it got
directly; nothing else is ever sent, and a lost datagram loses one cancel (the statement timeout
still applies).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("chorus.pgwire")

_PAIR = struct.Struct("!ii")  # (process id, secret key), as in the CancelRequest message


class CancelRelay:
    """Worker ``index`` of ``count``: its own inbox, and the way to its siblings'."""

    def __init__(self, directory: Path, index: int, count: int) -> None:
        self.directory, self.index, self.count = directory, index, count
        self._inbox: socket.socket | None = None

    def owner(self, pid: int) -> int:
        """The worker whose session ``pid`` is (ids are assigned ``index`` modulo ``count``)."""
        return pid % self.count

    def start(self, deliver: Callable[[int, int], None]) -> None:
        """Receive relayed requests in the running loop and hand each to ``deliver``."""
        path = self._path(self.index)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # left by the worker this one replaces
        inbox = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        inbox.bind(str(path))
        inbox.setblocking(False)
        self._inbox = inbox

        def readable() -> None:
            while True:
                try:
                    data = inbox.recv(64)
                except BlockingIOError:
                    return
                if len(data) == _PAIR.size:
                    deliver(*_PAIR.unpack(data))

        asyncio.get_running_loop().add_reader(inbox.fileno(), readable)

    def forward(self, pid: int, key: int) -> None:
        """Send a request for another worker's session to that worker (never blocks)."""
        target = self.owner(pid)
        if target == self.index:
            return  # ours, and not found: an ended session
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as out:
            out.setblocking(False)
            try:
                out.sendto(_PAIR.pack(pid, key), str(self._path(target)))
            except OSError as err:  # that worker is restarting, or its inbox is full
                log.info("cancel request for pid %d not relayed to worker %d: %s", pid, target,
                         os.strerror(err.errno) if err.errno else err)

    def close(self) -> None:
        if self._inbox is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self._inbox.fileno())
            self._inbox.close()
            self._inbox = None

    def _path(self, index: int) -> Path:
        return self.directory / f"cancel-{index}"
