"""The asyncio shell around :class:`~server.pgwire.session.Session`: sockets, TLS, timeouts.

It reads bytes, lets :class:`~server.pgwire.protocol.MessageReader` frame them, drives each
session generator, runs the blocking work it yields in a thread pool, and writes the output.
Here, and only here, live the things that need a clock or a socket:

- TLS after an ``SSLRequest`` (when the policy gives a certificate and key), refusing bytes that
  arrived before the handshake (they were not encrypted: CVE-2021-23214); with
  ``[server] tls = "require"`` a startup without TLS is refused (FATAL 28000);
- the connection limit (``53300`` beyond it), the login timeout (startup and SCRAM must finish in
  time), the idle timeout (``57P05``) and the statement timeout (``57014``);
- cancel requests: the running backend statement is interrupted through
  :meth:`chorus_py.backends.Backend.interrupt`; the engine settles the budget as for any failure
  (charged once the database started reading).

A failure in one connection closes that connection only.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import logging
import secrets
import socket
import ssl
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from chorus_py.backends import interrupt
from chorus_py.errors import ChorusError, PolicyError
from server.pgwire import protocol as p
from server.pgwire.cancels import CancelRelay
from server.pgwire.session import QueryCanceled, ServerContext, Session, Work

log = logging.getLogger("chorus.pgwire")

DEFAULT_LISTEN = "127.0.0.1:6432"
_READ_CHUNK = 65536


@dataclass(frozen=True)
class Limits:
    """Resource limits of the wire server (the policy's ``[server]`` section)."""

    max_connections: int = 100
    login_timeout: float = 30.0
    idle_timeout: float = 3600.0
    statement_timeout: float = 300.0
    max_message: int = p.MAX_MESSAGE
    workers: int = 8


class _Running:
    """The blocking work a session is running, so a cancel request can interrupt it."""

    def __init__(self) -> None:
        self.thread: int | None = None  # the worker thread, while it runs the work
        self.active = False  # work submitted and not finished
        self.cancelled: str | None = None  # why it is being cancelled
        self.future: asyncio.Future[Any] | None = None  # the work's, while it is active


class WireServer:
    """Serves the Postgres protocol for one engine."""

    def __init__(self, context: ServerContext, limits: Limits = Limits(),
                 tls: ssl.SSLContext | None = None) -> None:
        self.ctx = context
        self.limits = limits
        self.tls = tls
        context.tls_available = tls is not None
        if context.tls_required and tls is None:  # the policy validates this; fail closed too
            raise ValueError("TLS is required but no certificate was given")
        self.executor = ThreadPoolExecutor(max_workers=limits.workers,
                                           thread_name_prefix="chorus-pgwire")
        self._sessions: dict[int, tuple[Session, _Running]] = {}
        self._pids = itertools.count(secrets.randbelow(1 << 20) + 1000)
        self._relay: CancelRelay | None = None  # chorus serve --workers: see use_relay
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[Any]] = set()

    def use_relay(self, relay: CancelRelay) -> None:
        """Serve as one worker of several (:mod:`server.pgwire.cancels`): session ids that
        name this worker, cancel requests for other workers' sessions relayed to them."""
        self._relay = relay
        first = (secrets.randbelow(1 << 20) + 1000) * relay.count + relay.index
        self._pids = itertools.count(first, relay.count)

    async def start(self, host: str | None, port: int | None,
                    sock: socket.socket | None = None) -> asyncio.Server:
        """Listen on host:port, or accept on ``sock`` (bound already: ``chorus serve
        --workers``' workers share the parent's socket)."""
        if sock is not None:
            self._server = await asyncio.start_server(self._serve, sock=sock,
                                                      limit=self.limits.max_message + 16)
        else:
            self._server = await asyncio.start_server(self._serve, host, port,
                                                      limit=self.limits.max_message + 16)
        if self._relay is not None:
            self._relay.start(lambda pid, key: self._cancel(pid, key, relayed=True))
        return self._server

    async def close(self) -> None:
        if self._relay is not None:
            self._relay.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        tasks = list(self._connections)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        self.executor.shutdown(wait=False, cancel_futures=True)

    @property
    def connections(self) -> int:
        return len(self._sessions)

    # -- one connection -------------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        activity = self.ctx.engine.activity
        activity.connection("wire", True)
        try:
            await self._connection(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError, TimeoutError):
            pass
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("wire connection failed")
        finally:
            activity.connection("wire", False)
            if task is not None:
                self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1.0)

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        pid = next(self._pids)
        session = Session(self.ctx, pid, secrets.randbits(31))
        running = _Running()
        frames = p.MessageReader(self.limits.max_message)
        over_limit = len(self._sessions) >= self.limits.max_connections
        self._sessions[pid] = (session, running)
        started = time.monotonic()
        try:
            while not session.closed:
                if session.authenticated:
                    timeout = self.limits.idle_timeout
                else:
                    timeout = self.limits.login_timeout - (time.monotonic() - started)
                try:
                    # asyncio.timeout, not wait_for: wait_for wraps every read in a new task,
                    # a cost paid on each message of every query.
                    async with asyncio.timeout(max(timeout, 0.001)):
                        data = await reader.read(_READ_CHUNK)
                except TimeoutError:
                    if session.authenticated:
                        session.output += p.error_response(
                            "57P05", "terminating connection due to idle-session timeout",
                            severity="FATAL")
                    else:
                        session.output += p.error_response(
                            "08006", "the login did not complete in time", severity="FATAL")
                    await self._write(writer, session)
                    return
                if not data:
                    return
                try:
                    messages = frames.feed(data)
                    while messages:
                        for message in messages:
                            if over_limit and isinstance(message, p.Startup):
                                session.output += p.error_response(
                                    "53300", "sorry, too many clients already",
                                    severity="FATAL")
                                session.closed = True
                                break
                            await self._drive(session, running, message)
                            if session.closed:
                                break
                        if session.closed:
                            break
                        if session.want_tls:
                            session.want_tls = False
                            if frames.buffered or getattr(reader, "_buffer", b""):
                                session.protocol_violation(
                                    "received unencrypted data after SSL request")
                                break
                            # No await between the 'S' and the handshake: the client's hello
                            # must reach the TLS layer, not the plain stream buffer.
                            writer.write(session.take_output())
                            assert self.tls is not None
                            await asyncio.wait_for(writer.start_tls(self.tls),
                                                   self.limits.login_timeout)
                            session.tls_started()
                        messages = frames.feed(b"") if not session.closed else []
                except p.ProtocolViolation as err:
                    session.protocol_violation(str(err))
                if session.cancel_target is not None:
                    self._cancel(*session.cancel_target)
                    return
                await self._write(writer, session)
        finally:
            self._sessions.pop(pid, None)
            if session.output:
                with contextlib.suppress(Exception):
                    await self._write(writer, session)

    async def _write(self, writer: asyncio.StreamWriter, session: Session) -> None:
        data = session.take_output()
        if data:
            writer.write(data)
            # The common case: the socket took it all, nothing to wait for (no timer to set).
            if writer.transport.get_write_buffer_size() or writer.transport.is_closing():
                async with asyncio.timeout(self.limits.idle_timeout):
                    await writer.drain()

    async def _drive(self, session: Session, running: _Running,
                     message: p.FrontendMessage) -> None:
        gen = session.handle(message)
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                work = gen.throw(error) if error is not None else gen.send(value)
            except StopIteration:
                return
            value, error = None, None
            try:
                value = await self._run(running, work)
            except Exception as err:
                error = err

    # -- blocking work, timeouts and cancellation ---------------------------------------------
    async def _run(self, running: _Running, work: Work) -> Any:
        loop = asyncio.get_running_loop()
        running.cancelled = None

        def in_thread() -> Any:
            running.thread = threading.get_ident()
            try:
                if running.cancelled:
                    raise QueryCanceled(f"canceling statement due to {running.cancelled}")
                return work.fn()
            finally:
                running.thread = None

        # The common case costs one future awaited directly; the statement timeout is a timer,
        # and a cancel (timeout, cancel request, shutdown) interrupts from timers too.
        future = running.future = loop.run_in_executor(self.executor, in_thread)
        running.active = True
        timeout = loop.call_later(self.limits.statement_timeout, self._cancel_running,
                                  running, "statement timeout", future)
        try:
            await future
        except BaseException:
            if not future.done() or future.cancelled():  # this task was cancelled: shutdown
                running.cancelled = running.cancelled or "server shutdown"
                self._interrupt(running)
                raise
        finally:
            running.active = False
            running.future = None
            timeout.cancel()
        try:
            return future.result()
        except QueryCanceled:
            raise
        except ChorusError as err:
            if running.cancelled is None:
                raise
            raise QueryCanceled(f"canceling statement due to {running.cancelled}",
                                hint=err.hint) from None

    def _cancel_running(self, running: _Running, why: str,
                        future: asyncio.Future[Any] | None = None) -> None:
        """Interrupt the work running now (``future``: only if it is still that one), again
        every 0.2 s until it returns.

        A thread cannot be killed, only its backend statement interrupted: keep interrupting
        until the engine returns (the statement may not have reached the backend yet), so the
        engine settles the budget as for any failure.  A timer never outlives its statement:
        the next statement of the session is a different future.
        """
        current = running.future
        if current is None or current.done() or (future is not None and current is not future):
            return
        running.cancelled = running.cancelled or why
        self._interrupt(running)
        asyncio.get_running_loop().call_later(0.2, self._cancel_running, running, why, current)

    def _interrupt(self, running: _Running) -> None:
        thread = running.thread
        if thread is None:
            return
        # Whatever the thread runs: a backend statement or a catalog query (both register in
        # chorus_py.backends.cancellable).  The Postgres cancel is a network round trip: not on
        # the event loop's thread.
        why = running.cancelled or "user request"
        threading.Thread(target=_quietly, args=(interrupt, thread, why), daemon=True).start()

    def _cancel(self, pid: int, key: int, relayed: bool = False) -> None:
        found = self._sessions.get(pid)
        if found is None:
            if self._relay is not None and not relayed:
                self._relay.forward(pid, key)  # another worker's session, perhaps
            return
        session, running = found
        if not hmac.compare_digest(session.secret.to_bytes(4, "big", signed=True),
                                   key.to_bytes(4, "big", signed=True)):
            log.info("cancel request with a wrong key for pid %d ignored", pid)
            return
        if running.active and running.cancelled is None:
            self._cancel_running(running, "user request")


def _quietly(fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except Exception:
        log.debug("interrupting a backend statement failed", exc_info=True)


def parse_listen(listen: str) -> tuple[str, int]:
    """'host:port' (or '[v6]:port', or ':port' for all interfaces) -> (host, port)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"expected HOST:PORT, got {listen!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


@contextlib.contextmanager
def running_server(server: WireServer, host: str = "127.0.0.1",
                   port: int = 0) -> Iterator[tuple[str, int]]:
    """Run ``server`` on its own event loop thread (tests, benchmarks, embedding)."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    address: list[tuple[str, int]] = []
    failure: list[BaseException] = []

    async def main() -> None:
        try:
            srv = await server.start(host, port)
        except BaseException as err:
            failure.append(err)
            started.set()
            raise
        address.append(srv.sockets[0].getsockname()[:2])
        started.set()
        await srv.serve_forever()

    thread = threading.Thread(target=lambda: _run_loop(loop, main()), daemon=True,
                              name="chorus-pgwire-loop")
    thread.start()
    started.wait(10)
    if failure:
        raise failure[0]
    try:
        yield address[0]
    finally:
        asyncio.run_coroutine_threadsafe(server.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def _run_loop(loop: asyncio.AbstractEventLoop, main: Any) -> None:
    asyncio.set_event_loop(loop)
    task = loop.create_task(main)
    with contextlib.suppress(BaseException):
        loop.run_forever()
    task.cancel()
    with contextlib.suppress(BaseException):
        loop.run_until_complete(task)
    loop.close()


class PolicyVerifiers(Mapping[str, Any]):
    """Analyst -> SCRAM verifier (None: no password), read from the engine's policy again
    whenever it is replaced (``chorus reload``): a new analyst or password works for the next
    login, and sessions already logged in are left as they are."""

    def __init__(self, engine: Any, parse: Any) -> None:
        self._engine, self._parse = engine, parse
        self._snapshot: tuple[Any, dict[str, Any]] = (None, {})

    def _current(self) -> dict[str, Any]:
        policy, verifiers = self._snapshot
        if policy is not self._engine.policy:
            policy = self._engine.policy
            verifiers = {name: self._parse(a.password) if a.password else None
                         for name, a in policy.analysts.items()}
            self._snapshot = (policy, verifiers)  # one tuple, replaced at once
        return verifiers

    def __getitem__(self, name: str) -> Any:
        return self._current()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._current())

    def __len__(self) -> int:
        return len(self._current())


def build_wire_server(engine: Any) -> WireServer:
    """A wire server for an engine, configured by its policy's ``[server]`` section."""
    from pathlib import Path

    from server.pgwire import types as t
    from server.pgwire.catalog import Catalog
    from server.pgwire.scram import parse_verifier

    policy = engine.policy
    columns: dict[str, dict[str, int]] = {}
    public = getattr(engine, "public_columns", {})
    for name, table in policy.tables.items():
        if table.public:
            columns[name] = {c: t.PORTABLE_OIDS.get(ty, t.TEXT)
                             for c, ty in public.get(name, {}).items()}
        else:
            columns[name] = {c: t.POLICY_OIDS[cp.type] for c, cp in table.columns.items()}
    verifiers = PolicyVerifiers(engine, parse_verifier)
    config = getattr(policy, "server", None)
    limits = Limits()
    tls = None
    if config is not None:
        statement = config.statement_timeout_seconds or \
            policy.backend.statement_timeout_seconds
        limits = Limits(max_connections=config.max_connections,
                        login_timeout=config.login_timeout_seconds,
                        idle_timeout=config.idle_timeout_seconds,
                        statement_timeout=statement)
        if config.tls_cert and config.tls_key:
            base = Path(policy.source).parent if policy.source != "<memory>" else Path(".")
            tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            try:
                tls.load_cert_chain(base / config.tls_cert, base / config.tls_key)
            except OSError as err:  # ssl.SSLError is one too
                raise PolicyError(
                    f"{policy.source}: [server] tls_cert / tls_key: cannot load "
                    f"{base / config.tls_cert} and {base / config.tls_key}: "
                    f"{err.strerror or err}",
                    hint="give a PEM certificate and its private key, paths relative to the "
                         "policy file") from None
    context = ServerContext(engine, Catalog(columns, limits.statement_timeout), verifiers,
                            columns=columns,
                            tls_required=config is not None and config.tls == "require")
    return WireServer(context, limits, tls)
