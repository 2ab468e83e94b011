"""TLS, SCRAM, limits, timeouts and cancellation, against a running server."""

from __future__ import annotations

import datetime as dt
import shutil
import socket
import ssl
import struct
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from chorus_py.backends import StatementFailed
from chorus_py.errors import BackendError, PolicyError
from chorus_py.policy import load_policy
from tests.server.conftest import (
    PASSWORDS,
    RawClient,
    Wire,
    error_fields,
    start_wire,
    startup_packet,
)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A self-signed certificate and key for 127.0.0.1, made with the cryptography package."""
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    directory = tmp_path_factory.mktemp("tls")
    (directory / "server.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "server.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    return str(directory / "server.crt"), str(directory / "server.key")


def test_tls(duckdb_data: str, write_policy: Callable[..., Path],
             certificate: tuple[str, str]) -> None:
    cert, key = certificate
    server = f'tls_cert = "{cert}"\ntls_key = "{key}"'
    with start_wire(write_policy(duckdb_data), server=server) as wire:
        with psycopg.connect(wire.url(sslmode="require"), autocommit=True) as con:
            assert con.pgconn.ssl_in_use
            assert con.execute("SELECT COUNT(*) FROM trips").fetchone()[0] is not None
        with psycopg.connect(wire.url(sslmode="verify-ca", sslrootcert=cert)) as con:
            assert con.pgconn.ssl_in_use
        # bytes sent after the SSLRequest but before the handshake are refused (CVE-2021-23214)
        with socket.create_connection((wire.host, wire.port), timeout=5) as sock:
            sock.sendall(struct.pack("!ii", 8, 80877103) + startup_packet("alice"))
            assert sock.recv(1) == b"S"
            rest = b""
            while chunk := sock.recv(4096):
                rest += chunk
            assert b"unencrypted data after SSL request" in rest
    # without a certificate the server answers 'N': sslmode=require fails cleanly
    with start_wire(write_policy(duckdb_data)) as wire:
        with pytest.raises(psycopg.OperationalError, match="does not support SSL"):
            psycopg.connect(wire.url(sslmode="require"))
        with psycopg.connect(wire.url(sslmode="prefer")) as con:
            assert not con.pgconn.ssl_in_use


def _refused_plaintext(wire: Wire, prelude: bytes = b"") -> dict[str, str]:
    """Send a plaintext startup (after ``prelude``, answered by one byte) and return the
    fields of the one message the server answers before it closes."""
    with socket.create_connection((wire.host, wire.port), timeout=5) as sock:
        if prelude:
            sock.sendall(prelude)
            assert sock.recv(1) == b"N"
        sock.sendall(startup_packet("alice"))
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
    # exactly one ErrorResponse, then the server closes: no authentication request was sent
    assert answer[:1] == b"E" and len(answer) == struct.unpack("!i", answer[1:5])[0] + 1
    return error_fields(answer[5:])


def test_tls_required(duckdb_data: str, write_policy: Callable[..., Path],
                      certificate: tuple[str, str]) -> None:
    cert, key = certificate
    server = f'tls_cert = "{cert}"\ntls_key = "{key}"\ntls = "require"'
    with start_wire(write_policy(duckdb_data), server=server) as wire:
        claims = len(wire.engine.ledger.claims())
        for mode in ("require", "prefer"):  # prefer: the client tries TLS first
            with psycopg.connect(wire.url(sslmode=mode), autocommit=True) as con:
                assert con.pgconn.ssl_in_use
                assert con.execute("SELECT COUNT(*) FROM trips").fetchone()[0] is not None
        with psycopg.connect(wire.url(sslmode="verify-full", sslrootcert=cert)) as con:
            assert con.pgconn.ssl_in_use
        # (libpq reports no SQLSTATE for a failed connection: the raw client below checks it)
        with pytest.raises(psycopg.OperationalError, match="requires TLS"):
            psycopg.connect(wire.url(sslmode="disable"))
        # the raw protocol: a plaintext startup, and one after GSSENCRequest -> 'N'
        for prelude in (b"", struct.pack("!ii", 8, 80877104)):
            fields = _refused_plaintext(wire, prelude)
            assert fields["S"] == "FATAL" and fields["C"] == "28000"
            assert "requires TLS" in fields["M"] and "sslmode=require" in fields["H"]
        # the plaintext refusals charged nothing; the TLS sessions ran their queries
        assert len(wire.engine.ledger.claims()) == claims + 2
        with psycopg.connect(wire.url(sslmode="require"), autocommit=True) as con:
            assert con.execute("SELECT 1").fetchone() == (1,)  # the server is fine


def test_tls_required_with_psql(duckdb_data: str, write_policy: Callable[..., Path],
                                certificate: tuple[str, str]) -> None:
    psql = shutil.which("psql")
    if psql is None:
        pytest.skip("psql is not installed")
    cert, key = certificate
    # ``ssl``, Postgres's word, is accepted for ``tls``.
    server = f'tls_cert = "{cert}"\ntls_key = "{key}"\nssl = "require"'
    with start_wire(write_policy(duckdb_data), server=server) as wire:
        def run(mode: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([psql, wire.url(sslmode=mode), "-XAtc", "SELECT 1"],
                                  capture_output=True, text=True, timeout=60, check=False)
        assert run("require").stdout.strip() == "1"
        plain = run("disable")
        assert plain.returncode != 0 and "requires TLS" in plain.stderr


def test_tls_require_needs_a_certificate(duckdb_data: str,
                                         write_policy: Callable[..., Path]) -> None:
    path = write_policy(duckdb_data)
    path.write_text(path.read_text() + '\n[server]\ntls = "require"\n')
    with pytest.raises(PolicyError, match=r'tls = "require" needs a certificate'):
        load_policy(path)
    path.write_text(path.read_text().replace('tls = "require"', 'ssl = "require"'))
    with pytest.raises(PolicyError, match=r'tls = "require" needs a certificate'):
        load_policy(path)
    path.write_text(path.read_text().replace('ssl = "require"', 'tls = "always"'))
    with pytest.raises(PolicyError, match="tls"):
        load_policy(path)


def test_scram_and_requests(duckdb_wire: Wire) -> None:
    wire = duckdb_wire
    for user, password in (("alice", "wrong"), ("mallory", "x"), ("carol", "anything")):
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(wire.url(user, password))
        client = RawClient(wire.host, wire.port)
        try:
            out = client.login(user, password)
        finally:
            client.close()
        assert error_fields(out[-1][1])["C"] == "28P01"
    client = RawClient(wire.host, wire.port)
    try:  # GSSAPI encryption is refused with 'N'; the startup may follow on the same socket
        client.send(struct.pack("!ii", 8, 80877104))
        assert client.sock.recv(1) == b"N"
        kinds = [k for k, _ in client.login()]
        assert kinds[0] == b"R" and kinds[-1] == b"Z" and b"K" in kinds
    finally:
        client.close()
    with psycopg.connect(wire.url("bob")) as con:
        assert con.info.parameter_status("client_encoding") == "UTF8"
        assert con.info.parameter_status("DateStyle").startswith("ISO")
        assert con.info.parameter_status("session_authorization") == "bob"


def test_limits_and_timeouts(duckdb_data: str, write_policy: Callable[..., Path]) -> None:
    server = "max_connections = 2\nlogin_timeout_seconds = 0.5\nidle_timeout_seconds = 1"
    with start_wire(write_policy(duckdb_data), server=server) as wire:
        first = psycopg.connect(wire.url(), autocommit=True)
        second = psycopg.connect(wire.url(), autocommit=True)
        with pytest.raises(psycopg.OperationalError, match="too many clients"):
            psycopg.connect(wire.url())
        first.close()
        second.close()
        time.sleep(0.1)
        # a silent client is dropped after the login timeout
        with socket.create_connection((wire.host, wire.port), timeout=5) as sock:
            started = time.monotonic()
            data = sock.recv(4096)
            assert time.monotonic() - started < 3 and (data == b"" or data.startswith(b"E"))
        # an idle client is told why, then disconnected
        client = RawClient(wire.host, wire.port)
        try:
            assert client.login()[-1][0] == b"Z"
            kind, body = client.read_message()
            assert kind == b"E" and error_fields(body)["C"] == "57P05"
        finally:
            client.close()
        with psycopg.connect(wire.url(), autocommit=True) as con:  # the server is fine
            assert con.execute("SELECT 1").fetchone() == (1,)


class _SlowEngine:
    """The real engine, except that one marker query runs a slow statement on the backend."""

    MARKER = "SELECT COUNT(*) FROM trips WHERE fare > 199.5"

    def __init__(self, engine: Any, slow_sql: str) -> None:
        self._engine = engine
        self._slow_sql = slow_sql

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def execute(self, sql: str, **kwargs: Any) -> Any:
        if sql != self.MARKER:
            return self._engine.execute(sql, **kwargs)
        try:
            self._engine.backend.run(self._slow_sql)
        except StatementFailed:
            raise BackendError("the database failed while evaluating the query",
                               hint="the budget of this query was charged") from None
        raise AssertionError("the slow statement was not interrupted")


@pytest.mark.parametrize("backend", ["duckdb", pytest.param("postgres",
                                                             marks=pytest.mark.postgres)])
def test_cancel_and_statement_timeout(backend: str, request: pytest.FixtureRequest,
                                      write_policy: Callable[..., Path]) -> None:
    url = request.getfixturevalue(f"{backend}_data")
    slow = ("SELECT pg_sleep(60)" if backend == "postgres" else
            "SELECT COUNT(*) FROM range(100000000000) t(i) WHERE i % 7 = 3")
    with start_wire(write_policy(url), server="statement_timeout_seconds = 1",
                    wrap=lambda e: _SlowEngine(e, slow)) as wire:
        with psycopg.connect(wire.url(), autocommit=True) as con:
            started = time.monotonic()
            with pytest.raises(psycopg.errors.QueryCanceled, match="statement timeout"):
                con.execute(_SlowEngine.MARKER)
            assert time.monotonic() - started < 10
            assert con.execute("SELECT 1").fetchone() == (1,)
        with start_wire(write_policy(url), wrap=lambda e: _SlowEngine(e, slow)) as wire2, \
                psycopg.connect(wire2.url(), autocommit=True) as con:
            timer = threading.Timer(0.5, con.cancel_safe)
            timer.start()
            started = time.monotonic()
            with pytest.raises(psycopg.errors.QueryCanceled, match="user request"):
                con.execute(_SlowEngine.MARKER)
            timer.join()
            assert time.monotonic() - started < 10
            assert con.execute("SELECT COUNT(*) FROM trips").fetchone()[0] is not None


class _TwoSpeedEngine(_SlowEngine):
    """MARKER sleeps a minute on Postgres; SECOND sleeps one second, then answers."""

    SECOND = "SELECT COUNT(*) FROM trips WHERE fare > 199.25"

    def execute(self, sql: str, **kwargs: Any) -> Any:
        if sql == self.SECOND:
            self._engine.backend.run("SELECT pg_sleep(1)")
            return self._engine.execute("SELECT COUNT(*) FROM trips", **kwargs)
        return super().execute(sql, **kwargs)


@pytest.mark.postgres
def test_a_cancel_never_reaches_the_sessions_next_statement(
        postgres_data: str, write_policy: Callable[..., Path]) -> None:
    # A cancelled statement is interrupted again every 0.2 s until it returns; those retries
    # must stop with it, not interrupt the next statement of the same session.
    with start_wire(write_policy(postgres_data),
                    wrap=lambda e: _TwoSpeedEngine(e, "SELECT pg_sleep(60)")) as wire, \
            psycopg.connect(wire.url(), autocommit=True) as con:
        timer = threading.Timer(0.5, con.cancel_safe)
        timer.start()
        with pytest.raises(psycopg.errors.QueryCanceled, match="user request"):
            con.execute(_SlowEngine.MARKER)
        timer.join()
        assert con.execute(_TwoSpeedEngine.SECOND).fetchone()[0] is not None


def test_plain_socket_garbage_is_answered(duckdb_wire: Wire) -> None:
    with socket.create_connection((duckdb_wire.host, duckdb_wire.port), timeout=5) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        data = sock.recv(4096)
        assert data == b"" or data.startswith(b"E")
    with psycopg.connect(duckdb_wire.url(), autocommit=True) as con:
        assert con.execute("SHOW chorus.analyst").fetchone() == ("alice",)
    assert PASSWORDS["alice"]


def test_ssl_context_is_server_side(certificate: tuple[str, str]) -> None:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*certificate)  # the files the test made are a valid pair
