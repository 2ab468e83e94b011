"""The Postgres frontend/backend protocol 3.0, sans I/O: bytes in, messages out, and back.

:class:`MessageReader` is fed whatever bytes the socket delivered and yields complete frontend
messages as small frozen dataclasses; the functions at the bottom encode backend messages.  Nothing
here imports a socket or asyncio, so the tests feed byte strings and the server shell stays thin.

Limits come from Postgres itself: a startup packet is at most 10,000 bytes
(``MAX_STARTUP_PACKET_LENGTH``) and every length is checked *before* the body is read, so an
analyst cannot make the proxy allocate a large buffer by announcing a large message.  Any
malformed message raises :class:`ProtocolViolation`; the session answers it with a FATAL error
and closes that connection only.

Message layouts: https://www.postgresql.org/docs/current/protocol-message-formats.html
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

PROTOCOL_3_0 = 196608  # 3 << 16
SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
CANCEL_REQUEST = 80877102
MAX_STARTUP_PACKET = 10_000  # Postgres: MAX_STARTUP_PACKET_LENGTH
MAX_MESSAGE = 8 * 1024 * 1024  # a query text or bind message larger than this is refused

_I16 = struct.Struct("!h")
_U16 = struct.Struct("!H")
_I32 = struct.Struct("!i")
_HEADER = struct.Struct("!ci")


class ProtocolViolation(Exception):
    """A frontend message that breaks the protocol; the connection must be closed."""

    sqlstate = "08P01"


# -- frontend messages --------------------------------------------------------------------------


@dataclass(frozen=True)
class SSLRequest:
    """The client asks for TLS before the startup message."""


@dataclass(frozen=True)
class GSSENCRequest:
    """The client asks for GSSAPI encryption (always refused)."""


@dataclass(frozen=True)
class CancelRequest:
    """Sent on a fresh connection: cancel what the connection (pid, key) is running."""

    pid: int
    key: int


@dataclass(frozen=True)
class Startup:
    """The startup message: protocol version and parameters (user, database, options...)."""

    version: int
    params: dict[str, str]


@dataclass(frozen=True)
class Query:
    """Simple query protocol: one string, possibly several statements."""

    sql: str


@dataclass(frozen=True)
class Parse:
    """Extended protocol: prepare ``sql`` as statement ``name`` with parameter type OIDs."""

    name: str
    sql: str
    param_oids: tuple[int, ...]


@dataclass(frozen=True)
class Bind:
    """Extended protocol: bind parameter values to a statement, creating a portal."""

    portal: str
    statement: str
    param_formats: tuple[int, ...]
    params: tuple[bytes | None, ...]
    result_formats: tuple[int, ...]


@dataclass(frozen=True)
class Describe:
    """Extended protocol: describe statement (``kind`` 'S') or portal ('P')."""

    kind: str
    name: str


@dataclass(frozen=True)
class Execute:
    """Extended protocol: run a portal, returning at most ``max_rows`` rows (0: all)."""

    portal: str
    max_rows: int


@dataclass(frozen=True)
class Close:
    """Extended protocol: close statement ('S') or portal ('P')."""

    kind: str
    name: str


@dataclass(frozen=True)
class Sync:
    """End of an extended-protocol batch: answer ReadyForQuery."""


@dataclass(frozen=True)
class Flush:
    """Send everything pending now, without waiting for Sync."""


@dataclass(frozen=True)
class Terminate:
    """The client closes the connection."""


@dataclass(frozen=True)
class Password:
    """A 'p' message: password, SASLInitialResponse or SASLResponse (meaning set by context)."""

    data: bytes


@dataclass(frozen=True)
class Unsupported:
    """A well-formed message the proxy does not implement (COPY data, function call...)."""

    type: str


FrontendMessage = (SSLRequest | GSSENCRequest | CancelRequest | Startup | Query | Parse | Bind
                   | Describe | Execute | Close | Sync | Flush | Terminate | Password | Unsupported)


# -- decoding -------------------------------------------------------------------------------------


class _Cursor:
    """Reads fields out of one message body, raising ProtocolViolation when it runs short."""

    __slots__ = ("body", "pos", "what")

    def __init__(self, body: bytes, what: str) -> None:
        self.body = body
        self.pos = 0
        self.what = what

    def _need(self, n: int) -> None:
        if n < 0 or self.pos + n > len(self.body):
            raise ProtocolViolation(f"truncated {self.what} message")

    def int16(self) -> int:
        self._need(2)
        (value,) = _I16.unpack_from(self.body, self.pos)
        self.pos += 2
        return int(value)

    def uint16(self) -> int:
        self._need(2)
        (value,) = _U16.unpack_from(self.body, self.pos)
        self.pos += 2
        return int(value)

    def int32(self) -> int:
        self._need(4)
        (value,) = _I32.unpack_from(self.body, self.pos)
        self.pos += 4
        return int(value)

    def byte(self) -> str:
        self._need(1)
        value = chr(self.body[self.pos])
        self.pos += 1
        return value

    def raw(self, n: int) -> bytes:
        self._need(n)
        value = self.body[self.pos:self.pos + n]
        self.pos += n
        return value

    def cstring(self) -> str:
        end = self.body.find(b"\0", self.pos)
        if end < 0:
            raise ProtocolViolation(f"unterminated string in {self.what} message")
        raw = self.body[self.pos:end]
        self.pos = end + 1
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolViolation(f"invalid UTF-8 in {self.what} message") from None

    def done(self) -> None:
        if self.pos != len(self.body):
            raise ProtocolViolation(f"{self.what} message has trailing bytes")


def _decode_startup(body: bytes) -> FrontendMessage:
    cur = _Cursor(body, "startup")
    code = cur.int32()
    if code == SSL_REQUEST:
        cur.done()
        return SSLRequest()
    if code == GSSENC_REQUEST:
        cur.done()
        return GSSENCRequest()
    if code == CANCEL_REQUEST:
        pid, key = cur.int32(), cur.int32()
        cur.done()
        return CancelRequest(pid, key)
    if code >> 16 != 3:
        raise ProtocolViolation(
            f"unsupported frontend protocol {code >> 16}.{code & 0xFFFF}: server supports 3.0")
    params: dict[str, str] = {}
    while True:
        name = cur.cstring()
        if not name:
            break
        params[name] = cur.cstring()
    cur.done()
    return Startup(code, params)


def _decode(kind: bytes, body: bytes) -> FrontendMessage:
    t = kind.decode("latin-1")
    if t == "Q":
        cur = _Cursor(body, "Query")
        sql = cur.cstring()
        cur.done()
        return Query(sql)
    if t == "P":
        cur = _Cursor(body, "Parse")
        name, sql = cur.cstring(), cur.cstring()
        n = cur.int16()
        if n < 0:
            raise ProtocolViolation("negative parameter count in Parse message")
        oids = tuple(cur.int32() & 0xFFFFFFFF for _ in range(n))
        cur.done()
        return Parse(name, sql, oids)
    if t == "B":
        cur = _Cursor(body, "Bind")
        portal, statement = cur.cstring(), cur.cstring()
        n_formats = cur.int16()
        if n_formats < 0:
            raise ProtocolViolation("negative format count in Bind message")
        formats = tuple(cur.int16() for _ in range(n_formats))
        n_params = cur.int16()
        if n_params < 0:
            raise ProtocolViolation("negative parameter count in Bind message")
        params: list[bytes | None] = []
        for _ in range(n_params):
            length = cur.int32()
            if length < -1:
                raise ProtocolViolation("invalid parameter length in Bind message")
            params.append(None if length == -1 else cur.raw(length))
        n_results = cur.int16()
        if n_results < 0:
            raise ProtocolViolation("negative result format count in Bind message")
        results = tuple(cur.int16() for _ in range(n_results))
        cur.done()
        if any(f not in (0, 1) for f in formats + results):
            raise ProtocolViolation("format codes must be 0 (text) or 1 (binary)")
        return Bind(portal, statement, formats, tuple(params), results)
    if t in ("D", "C"):
        cur = _Cursor(body, "Describe" if t == "D" else "Close")
        which = cur.byte()
        name = cur.cstring()
        cur.done()
        if which not in ("S", "P"):
            raise ProtocolViolation(f"invalid {cur.what} target {which!r}")
        return Describe(which, name) if t == "D" else Close(which, name)
    if t == "E":
        cur = _Cursor(body, "Execute")
        portal = cur.cstring()
        max_rows = cur.int32()
        cur.done()
        return Execute(portal, max(0, max_rows))
    if t in ("S", "H", "X"):
        if body:
            raise ProtocolViolation(f"message {t!r} must have an empty body")
        return {"S": Sync(), "H": Flush(), "X": Terminate()}[t]
    if t == "p":
        return Password(body)
    if t in ("d", "c", "f", "F"):
        return Unsupported(t)
    raise ProtocolViolation(f"invalid frontend message type {t!r}")


class MessageReader:
    """Frames frontend messages out of a byte stream.

    The first message of a connection has no type byte (startup, SSL, GSS or cancel request);
    the reader stays in that mode until a :class:`Startup` message was read.  ``feed`` accepts any
    chunking of the stream and returns the complete messages seen so far.
    """

    def __init__(self, max_message: int = MAX_MESSAGE) -> None:
        self._buffer = bytearray()
        self._startup = True
        self._max = max_message

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a complete message."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[FrontendMessage]:
        self._buffer += data
        out: list[FrontendMessage] = []
        while True:
            message = self._next()
            if message is None:
                return out
            out.append(message)
            if isinstance(message, SSLRequest | GSSENCRequest | CancelRequest):
                # The server answers before anything else may be read (TLS starts right after
                # the answer to an SSLRequest): stop here, the caller feeds b"" to continue.
                return out

    def _next(self) -> FrontendMessage | None:
        buf = self._buffer
        if self._startup:
            if len(buf) < 4:
                return None
            (length,) = _I32.unpack_from(buf, 0)
            if length < 8 or length > MAX_STARTUP_PACKET:
                raise ProtocolViolation(f"invalid startup packet length {length}")
            if len(buf) < length:
                return None
            body = bytes(buf[4:length])
            del buf[:length]
            message = _decode_startup(body)
            if isinstance(message, Startup):
                self._startup = False
            return message
        if len(buf) < 5:
            return None
        kind, length = _HEADER.unpack_from(buf, 0)
        if length < 4:
            raise ProtocolViolation(f"invalid message length {length}")
        if length > self._max:
            raise ProtocolViolation(
                f"message of {length} bytes exceeds the limit of {self._max} bytes")
        if len(buf) < length + 1:
            return None
        body = bytes(buf[5:length + 1])
        del buf[:length + 1]
        return _decode(kind, body)


def parse_sasl_initial(data: bytes) -> tuple[str, bytes]:
    """SASLInitialResponse body: (mechanism, initial client response)."""
    cur = _Cursor(data, "SASLInitialResponse")
    mechanism = cur.cstring()
    length = cur.int32()
    payload = b"" if length == -1 else cur.raw(length)
    cur.done()
    return mechanism, payload


# -- encoding -------------------------------------------------------------------------------------


def _message(kind: bytes, body: bytes = b"") -> bytes:
    return kind + _I32.pack(len(body) + 4) + body


def _cstr(value: str) -> bytes:
    return value.replace("\0", "").encode("utf-8") + b"\0"


def authentication_ok() -> bytes:
    return _message(b"R", _I32.pack(0))


def authentication_sasl(mechanisms: tuple[str, ...]) -> bytes:
    return _message(b"R", _I32.pack(10) + b"".join(_cstr(m) for m in mechanisms) + b"\0")


def authentication_sasl_continue(data: bytes) -> bytes:
    return _message(b"R", _I32.pack(11) + data)


def authentication_sasl_final(data: bytes) -> bytes:
    return _message(b"R", _I32.pack(12) + data)


def negotiate_protocol_version(minor: int, unsupported: list[str]) -> bytes:
    """NegotiateProtocolVersion: the newest minor version served, options not recognised."""
    return _message(b"v", _I32.pack(minor) + _I32.pack(len(unsupported))
                    + b"".join(_cstr(o) for o in unsupported))


def parameter_status(name: str, value: str) -> bytes:
    return _message(b"S", _cstr(name) + _cstr(value))


def backend_key_data(pid: int, key: int) -> bytes:
    return _message(b"K", _I32.pack(pid) + _I32.pack(key))


def ready_for_query(status: str) -> bytes:
    return _message(b"Z", status.encode("ascii"))


@dataclass(frozen=True)
class Field:
    """One column of a RowDescription."""

    name: str
    type_oid: int
    type_size: int = -1
    type_modifier: int = -1
    format: int = 0
    table_oid: int = 0
    column: int = 0


def row_description(fields: list[Field] | tuple[Field, ...]) -> bytes:
    parts = [_I16.pack(len(fields))]
    for f in fields:
        parts.append(_cstr(f.name) + struct.pack("!ihihih", f.table_oid, f.column, f.type_oid,
                                                   f.type_size, f.type_modifier, f.format))
    return _message(b"T", b"".join(parts))


def data_row(values: list[bytes | None] | tuple[bytes | None, ...]) -> bytes:
    parts = [_I16.pack(len(values))]
    for v in values:
        parts.append(b"\xff\xff\xff\xff" if v is None else _I32.pack(len(v)) + v)
    return _message(b"D", b"".join(parts))


def command_complete(tag: str) -> bytes:
    return _message(b"C", _cstr(tag))


def empty_query_response() -> bytes:
    return _message(b"I")


def parse_complete() -> bytes:
    return _message(b"1")


def bind_complete() -> bytes:
    return _message(b"2")


def close_complete() -> bytes:
    return _message(b"3")


def no_data() -> bytes:
    return _message(b"n")


def portal_suspended() -> bytes:
    return _message(b"s")


def parameter_description(oids: list[int] | tuple[int, ...]) -> bytes:
    return _message(b"t", _I16.pack(len(oids)) + b"".join(struct.pack("!I", o) for o in oids))


def _fields(severity: str, code: str, message: str, detail: str | None, hint: str | None,
            position: int | None) -> bytes:
    parts = [b"S" + _cstr(severity), b"V" + _cstr(severity), b"C" + _cstr(code),
             b"M" + _cstr(message)]
    if detail:
        parts.append(b"D" + _cstr(detail))
    if hint:
        parts.append(b"H" + _cstr(hint))
    if position:
        parts.append(b"P" + _cstr(str(position)))
    return b"".join(parts) + b"\0"


def error_response(code: str, message: str, *, severity: str = "ERROR",
                   detail: str | None = None, hint: str | None = None,
                   position: int | None = None) -> bytes:
    """ErrorResponse with severity (S and V), SQLSTATE (C) and message (M) fields."""
    return _message(b"E", _fields(severity, code, message, detail, hint, position))


def notice_response(message: str, *, code: str = "00000", severity: str = "NOTICE",
                    detail: str | None = None, hint: str | None = None) -> bytes:
    return _message(b"N", _fields(severity, code, message, detail, hint, None))
