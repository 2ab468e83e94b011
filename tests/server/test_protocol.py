"""The sans-I/O pieces, fed byte strings: framing, limits, codecs, SCRAM, statement classes."""

from __future__ import annotations

import contextlib
import datetime as dt
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server.pgwire import protocol as p
from server.pgwire import types as t
from server.pgwire.commands import classify, route, split_statements
from server.pgwire.scram import (
    AuthenticationFailed,
    ScramError,
    ScramExchange,
    make_verifier,
    parse_verifier,
    verify_password,
)
from tests.server.conftest import message, startup_packet


def test_reader_frames_any_chunking() -> None:
    stream = (startup_packet("alice") + message(b"Q", b"SELECT 1\0")
              + message(b"P", b"s1\0SELECT $1\0" + struct.pack("!hi", 1, 23))
              + message(b"S") + message(b"X"))
    expected = None
    for size in (1, 2, 3, 7, len(stream)):
        reader = p.MessageReader()
        out = []
        for i in range(0, len(stream), size):
            out += reader.feed(stream[i:i + size])
        assert [type(m).__name__ for m in out] == ["Startup", "Query", "Parse", "Sync",
                                                   "Terminate"]
        expected = expected or out
        assert out == expected
    assert out[0].params == {"user": "alice", "database": "chorus"}
    assert out[2] == p.Parse("s1", "SELECT $1", (23,))


def test_special_requests_stop_the_batch() -> None:
    reader = p.MessageReader()
    ssl = struct.pack("!ii", 8, p.SSL_REQUEST)
    out = reader.feed(ssl + startup_packet("bob"))
    assert out == [p.SSLRequest()] and reader.buffered > 0  # TLS must start before reading on
    assert isinstance(reader.feed(b"")[0], p.Startup)
    assert p.MessageReader().feed(struct.pack("!iiii", 16, p.CANCEL_REQUEST, 42, -7)) == [
        p.CancelRequest(42, -7)]
    assert p.MessageReader().feed(struct.pack("!ii", 8, p.GSSENC_REQUEST)) == [
        p.GSSENCRequest()]


@pytest.mark.parametrize("data", [
    struct.pack("!i", 10_001) + b"\0" * 4,  # startup packet over 10,000 bytes: refused at once
    struct.pack("!i", 4),  # shorter than its own header
    struct.pack("!ii", 8, 2 << 16),  # protocol 2.0
    struct.pack("!ii", 9, 196608) + b"u",  # unterminated parameter
])
def test_bad_startup(data: bytes) -> None:
    with pytest.raises(p.ProtocolViolation):
        p.MessageReader().feed(data)


def test_length_is_checked_before_reading() -> None:
    reader = p.MessageReader(max_message=1000)
    reader.feed(startup_packet("alice"))
    with pytest.raises(p.ProtocolViolation, match="exceeds"):
        reader.feed(b"Q" + struct.pack("!i", 1 << 30))  # 1 GiB announced, nothing allocated
    for bad in (message(b"Z"), b"Q" + struct.pack("!i", 2), message(b"S", b"x"),
                message(b"Q", b"no terminator"), message(b"D", b"Q\0"),
                message(b"B", b"\0\0" + struct.pack("!h", -1)),
                message(b"B", b"\0\0\0\0\0\x01" + struct.pack("!i", 100) + b"short"),
                message(b"P", b"\0SELECT\0" + struct.pack("!h", 3))):
        reader = p.MessageReader()
        reader.feed(startup_packet("alice"))
        with pytest.raises(p.ProtocolViolation):
            reader.feed(bad)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_never_crash_the_reader(data: bytes) -> None:
    for start in (b"", startup_packet("a")):
        reader = p.MessageReader(max_message=4096)
        with contextlib.suppress(p.ProtocolViolation):
            reader.feed(start + data)


def test_backend_messages() -> None:
    assert p.ready_for_query("I") == b"Z\0\0\0\x05I"
    err = p.error_response("42501", "refused", hint="do this")
    assert err.startswith(b"E") and b"SERROR\0VERROR\0C42501\0Mrefused\0Hdo this\0\0" in err
    row = p.data_row([b"1", None])
    assert row == b"D" + struct.pack("!ihi", 15, 2, 1) + b"1" + b"\xff\xff\xff\xff"


def test_codecs() -> None:
    ts = dt.datetime(2026, 1, 2, 3, 4, 5, 600)
    assert t.encode_text(ts, t.TIMESTAMP) == b"2026-01-02 03:04:05.000600"
    assert t.decode_parameter(t.encode_binary(ts, t.TIMESTAMP), t.TIMESTAMP, True) == ts
    day = dt.date(1999, 12, 31)
    assert t.decode_parameter(t.encode_binary(day, t.DATE), t.DATE, True) == day
    assert t.encode_text(0.1, t.FLOAT8) == b"0.1" and t.encode_text(True, t.BOOL) == b"t"
    assert t.encode_text(float("inf"), t.FLOAT8) == b"Infinity"
    assert struct.unpack("!q", t.encode_binary(7, t.INT8)) == (7,)
    assert t.decode_parameter(b"42", t.INT4, False) == 42
    assert t.decode_parameter(struct.pack("!d", 2.5), t.FLOAT8, True) == 2.5
    assert t.decode_parameter(b"2026-01-01 00:00:00+00", t.TIMESTAMPTZ, False).year == 2026
    assert t.encode_text(["a", "b c", None], t.TEXT_ARRAY) == b'{a,"b c",NULL}'
    # numeric in binary: 12.5 = digits [12, 5000], weight 0, dscale 1
    assert str(t.decode_parameter(struct.pack("!hhHHHH", 2, 0, 0, 1, 12, 5000), t.NUMERIC,
                                  True)) == "12.5"
    for raw, oid, binary in ((b"abc", t.INT8, False), (b"\x00", t.INT8, True),
                             (b"maybe", t.BOOL, False), (b"2026-13-01", t.DATE, False)):
        with pytest.raises(t.ParameterError):
            t.decode_parameter(raw, oid, binary)


def _client_proof(password: str, salt: bytes, iterations: int, auth: bytes) -> bytes:
    import hashlib
    import hmac

    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    signature = hmac.new(hashlib.sha256(client_key).digest(), auth, hashlib.sha256).digest()
    return bytes(a ^ b for a, b in zip(client_key, signature, strict=True))


def _exchange(verifier: str | None, password: str, user: str = "alice") -> bytes:
    import base64

    server = ScramExchange(parse_verifier(verifier) if verifier else None, user)
    first = server.first(b"n,,n=,r=clientnonce").decode()
    attrs = dict(part.split("=", 1) for part in first.split(","))
    assert attrs["r"].startswith("clientnonce")
    without = f"c=biws,r={attrs['r']}"
    auth = f"n=,r=clientnonce,{first},{without}".encode()
    proof = _client_proof(password, base64.b64decode(attrs["s"]), int(attrs["i"]), auth)
    return server.final(f"{without},p={base64.b64encode(proof).decode()}".encode())


def test_scram() -> None:
    verifier = make_verifier("s3cret ü")
    assert verifier.startswith("SCRAM-SHA-256$4096:") and "s3cret" not in verifier
    assert verify_password(verifier, "s3cret ü") and not verify_password(verifier, "s3cret")
    assert _exchange(verifier, "s3cret ü").startswith(b"v=")
    with pytest.raises(AuthenticationFailed):
        _exchange(verifier, "wrong")
    with pytest.raises(AuthenticationFailed):  # unknown analyst: a mock exchange that fails
        _exchange(None, "anything", user="mallory")
    server = ScramExchange(parse_verifier(verifier), "alice")
    for bad in (b"p=tls-server-end-point,,n=,r=x", b"n,,r", b"x,,n=,r=abc", b"\xff"):
        with pytest.raises(ScramError):
            ScramExchange(parse_verifier(verifier), "alice").first(bad)
    server.first(b"n,,n=,r=abc")
    with pytest.raises(ScramError):
        server.final(b"c=biws,r=othernonce,p=AAAA")
    for bad_verifier in ("demo", "SCRAM-SHA-256$0:abc=$x:y", "md5abcdef"):
        with pytest.raises(ValueError):
            parse_verifier(bad_verifier)


def test_statement_classes() -> None:
    assert split_statements("SELECT ';'; SELECT $x$;$x$; -- c\n;/* ; */ SELECT 1") == [
        "SELECT ';'", "SELECT $x$;$x$", "/* ; */ SELECT 1"]
    assert split_statements("  ; -- nothing") == []
    assert classify("SET chorus.epsilon TO 0.25").values == ("0.25",)
    assert classify("set DateStyle = 'ISO, MDY'").name == "datestyle"
    assert classify("SHOW TRANSACTION ISOLATION LEVEL").name == "transaction_isolation"
    assert classify("EXPLAIN (FORMAT JSON) SELECT COUNT(*) FROM trips").explain_format == "json"
    assert classify("EXPLAIN ANALYZE SELECT 1").kind == "refuse"
    assert classify("SET ROLE postgres").kind == "refuse"
    assert classify("ROLLBACK TO SAVEPOINT s1").kind == "rollback_to"
    tables = frozenset({"trips", "cities"})
    assert route("SELECT COUNT(*) FROM trips", tables).target == "engine"
    assert route("SELECT relname FROM pg_catalog.pg_class", tables).target == "catalog"
    assert route("SELECT version()", tables).target == "catalog"
    assert route("SELECT 1 FROM pg_class, trips", tables).target == "engine"
    assert route("SELECT * FROM pg_stats", tables).target == "engine"  # unknown: engine refuses
    assert route("SELECT * FROM secret_table", tables).target == "engine"
