"""SCRAM-SHA-256 (RFC 5802, RFC 7677) as Postgres speaks it, server side, sans I/O.

The policy stores a *verifier*, never a password, in Postgres's own format::

    SCRAM-SHA-256$<iterations>:<base64 salt>$<base64 StoredKey>:<base64 ServerKey>

with SaltedPassword = PBKDF2-HMAC-SHA-256(SASLprep(password), salt, iterations),
ClientKey = HMAC(SaltedPassword, "Client Key"), StoredKey = SHA-256(ClientKey) and
ServerKey = HMAC(SaltedPassword, "Server Key").  The server proves it knows ServerKey and checks
that the client knows ClientKey, without ever seeing the password.

For an unknown analyst (or one without a verifier) the exchange runs against a mock verifier
derived from the user name and a per-process secret, like Postgres does, so the answer time and
messages do not tell whether the analyst exists.  Channel binding (SCRAM-SHA-256-PLUS) is not
offered.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import stringprep
import unicodedata
from dataclasses import dataclass

MECHANISM = "SCRAM-SHA-256"
DEFAULT_ITERATIONS = 4096
_VERIFIER_RE = re.compile(
    r"^SCRAM-SHA-256\$(\d+):([A-Za-z0-9+/]+={0,2})\$([A-Za-z0-9+/]+={0,2}):([A-Za-z0-9+/]+={0,2})$")


class ScramError(Exception):
    """Malformed SCRAM message (protocol violation)."""


class AuthenticationFailed(Exception):
    """Wrong password (or unknown analyst)."""


@dataclass(frozen=True)
class Verifier:
    """A parsed SCRAM-SHA-256 verifier."""

    iterations: int
    salt: bytes
    stored_key: bytes
    server_key: bytes


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _hmac(key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hashlib.sha256).digest()


def saslprep(password: str) -> str:
    """SASLprep (RFC 4013) of a password; the raw password when it cannot be prepared.

    Postgres and libpq fall back on the raw bytes in the same cases, so both sides agree.
    """
    chars = []
    for c in password:
        if stringprep.in_table_c12(c):  # non-ASCII space -> space
            chars.append(" ")
        elif not stringprep.in_table_b1(c):  # commonly mapped to nothing
            chars.append(c)
    prepared = unicodedata.normalize("NFKC", "".join(chars))
    if not prepared:
        return password
    prohibited = (stringprep.in_table_c12, stringprep.in_table_c21_c22, stringprep.in_table_c3,
                  stringprep.in_table_c4, stringprep.in_table_c5, stringprep.in_table_c6,
                  stringprep.in_table_c7, stringprep.in_table_c8, stringprep.in_table_c9)
    if any(check(c) for c in prepared for check in prohibited):
        return password
    if any(stringprep.in_table_d1(c) for c in prepared):
        if not (stringprep.in_table_d1(prepared[0]) and stringprep.in_table_d1(prepared[-1])):
            return password
        if any(stringprep.in_table_d2(c) for c in prepared):
            return password
    return prepared


def _keys(password: str, salt: bytes, iterations: int) -> tuple[bytes, bytes]:
    salted = hashlib.pbkdf2_hmac("sha256", saslprep(password).encode("utf-8"), salt, iterations)
    stored_key = hashlib.sha256(_hmac(salted, b"Client Key")).digest()
    return stored_key, _hmac(salted, b"Server Key")


def make_verifier(password: str, *, salt: bytes | None = None,
                  iterations: int = DEFAULT_ITERATIONS) -> str:
    """The verifier to store in the policy for ``password`` (random 16-byte salt)."""
    if iterations < 1:
        raise ValueError("iterations must be positive")
    salt = secrets.token_bytes(16) if salt is None else salt
    stored_key, server_key = _keys(password, salt, iterations)
    return f"{MECHANISM}${iterations}:{_b64(salt)}${_b64(stored_key)}:{_b64(server_key)}"


def parse_verifier(text: str) -> Verifier:
    """Parse a stored verifier; ValueError names what is wrong."""
    match = _VERIFIER_RE.match(text)
    if not match:
        raise ValueError("expected a SCRAM-SHA-256 verifier "
                         "'SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>' "
                         "(make one with `chorus passwd`), never a plain password")
    iterations = int(match.group(1))
    salt, stored, server = (base64.b64decode(match.group(i)) for i in (2, 3, 4))
    if iterations < 1 or len(stored) != 32 or len(server) != 32 or not salt:
        raise ValueError("malformed SCRAM-SHA-256 verifier: keys must be 32 bytes, "
                         "iterations positive")
    return Verifier(iterations, salt, stored, server)


def verify_password(verifier: str, password: str) -> bool:
    """True when ``password`` matches the stored verifier (for tests and tools)."""
    v = parse_verifier(verifier)
    stored_key, server_key = _keys(password, v.salt, v.iterations)
    return hmac.compare_digest(stored_key, v.stored_key) and \
        hmac.compare_digest(server_key, v.server_key)


_MOCK_SECRET = secrets.token_bytes(32)


def _mock_verifier(user: str) -> Verifier:
    digest = _hmac(_MOCK_SECRET, user.encode("utf-8", "replace"))
    return Verifier(DEFAULT_ITERATIONS, digest[:16], secrets.token_bytes(32),
                    secrets.token_bytes(32))


def _attributes(message: str) -> dict[str, str]:
    attrs: dict[str, str] = {}
    for part in message.split(","):
        if len(part) < 2 or part[1] != "=":
            raise ScramError("malformed SCRAM attribute")
        attrs.setdefault(part[0], part[2:])
    return attrs


class ScramExchange:
    """One server-side SCRAM-SHA-256 exchange: ``first`` then ``final``.

    ``verifier`` None runs the mock exchange that always fails (unknown analyst).
    """

    def __init__(self, verifier: Verifier | None, user: str) -> None:
        self._real = verifier is not None
        self._verifier = verifier or _mock_verifier(user)
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""
        self._gs2 = ""

    def first(self, client_first: bytes) -> bytes:
        """Client-first-message in, server-first-message out."""
        try:
            text = client_first.decode("utf-8")
        except UnicodeDecodeError:
            raise ScramError("SCRAM message is not UTF-8") from None
        parts = text.split(",", 2)
        if len(parts) != 3:
            raise ScramError("malformed SCRAM client-first-message")
        flag, authzid, bare = parts
        if flag == "p" or flag.startswith("p="):
            raise ScramError("channel binding is not supported; use SCRAM-SHA-256")
        if flag not in ("n", "y") or (authzid and not authzid.startswith("a=")):
            raise ScramError("malformed SCRAM GS2 header")
        attrs = _attributes(bare)
        if "m" in attrs:
            raise ScramError("SCRAM extensions are not supported")
        client_nonce = attrs.get("r", "")
        if not client_nonce or any(not (33 <= ord(c) <= 126) or c == "," for c in client_nonce):
            raise ScramError("malformed SCRAM client nonce")
        self._gs2 = f"{flag},{authzid},"
        self._client_first_bare = bare
        self._nonce = client_nonce + _b64(secrets.token_bytes(18))
        v = self._verifier
        self._server_first = f"r={self._nonce},s={_b64(v.salt)},i={v.iterations}"
        return self._server_first.encode("ascii")

    def final(self, client_final: bytes) -> bytes:
        """Client-final-message in, server-final-message out; AuthenticationFailed if wrong."""
        try:
            text = client_final.decode("utf-8")
        except UnicodeDecodeError:
            raise ScramError("SCRAM message is not UTF-8") from None
        proof_at = text.rfind(",p=")
        if proof_at < 0:
            raise ScramError("SCRAM client-final-message has no proof")
        without_proof, proof_b64 = text[:proof_at], text[proof_at + 3:]
        attrs = _attributes(without_proof)
        try:
            binding = base64.b64decode(attrs.get("c", ""), validate=True)
            proof = base64.b64decode(proof_b64, validate=True)
        except ValueError:
            raise ScramError("malformed base64 in SCRAM client-final-message") from None
        if binding != self._gs2.encode("utf-8"):
            raise ScramError("SCRAM channel binding does not match")
        if attrs.get("r") != self._nonce:
            raise ScramError("SCRAM nonce does not match")
        if len(proof) != 32:
            raise ScramError("SCRAM proof has the wrong length")
        auth_message = ",".join((self._client_first_bare, self._server_first,
                                 without_proof)).encode("utf-8")
        v = self._verifier
        signature = _hmac(v.stored_key, auth_message)
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        ok = hmac.compare_digest(hashlib.sha256(client_key).digest(), v.stored_key)
        if not (ok and self._real):
            raise AuthenticationFailed("password authentication failed")
        return f"v={_b64(_hmac(v.server_key, auth_message))}".encode("ascii")
