"""Who sent a REST request: bearer tokens checked against the digests in the policy.

Each analyst's ``token_sha256`` and the owner's ``[server] owner_token_sha256`` hold SHA-256
digests, never tokens; :class:`Tokens` compares in constant time whatever matches.  Routes
declare who may call them with the dependencies :data:`AnyPrincipal` (an analyst or the owner),
:data:`Analyst` (queries: never the owner) and :data:`Owner` (the dashboard's data, metrics).
A missing or unknown token is a 401, a known token without the right a 403; the app turns both
into problem documents (:mod:`server.rest.problems`).  The app keeps its :class:`Tokens` in
``app.state.tokens``.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException

from budget.ledger import Viewer


@dataclass(frozen=True)
class Principal:
    """Who sent a request: an analyst (by name) or the data owner."""

    analyst: str | None
    owner: bool

    @property
    def viewer(self) -> Viewer:
        """Whose view of the ledger this request gets: everyone's spending for the owner, only
        their own for an analyst (block totals are the same for both)."""
        if self.owner:
            return Viewer.owner()
        assert self.analyst is not None  # a principal is the owner or a named analyst
        return Viewer.of(self.analyst)


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


class Tokens:
    """Token digests from the engine's policy; comparisons take the same time whatever matches.

    The digests are read again whenever the engine's policy is replaced (``chorus reload``), so a
    revoked token stops working on the next request and a new one works at once.
    """

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self._snapshot = self._digests()

    def _digests(self) -> tuple[Any, list[tuple[str, str]], str | None]:
        """(policy, [(digest, analyst)], owner digest), read again after a reload; one tuple,
        replaced at once, so a request never sees one policy's analysts with another's owner."""
        snapshot = getattr(self, "_snapshot", None)
        policy = self._engine.policy
        if snapshot is not None and snapshot[0] is policy:
            return snapshot
        snapshot = (policy, [(digest, name) for name, a in policy.analysts.items()
                             for digest in a.token_digests], policy.server.owner_token_sha256)
        self._snapshot = snapshot
        return snapshot

    @property
    def owner_configured(self) -> bool:
        """Whether the policy gives an owner token (without one, owner routes are closed)."""
        return self._digests()[2] is not None

    def identify(self, token: str) -> Principal | None:
        """The analyst or owner whose digest ``token`` matches, or None."""
        _, analysts, owner = self._digests()
        digest = _digest(token)
        found: Principal | None = None
        for stored, name in analysts:
            if hmac.compare_digest(stored, digest):
                found = Principal(name, False)
        if owner is not None and hmac.compare_digest(owner, digest):
            found = Principal(None, True)
        return found


_bearer = HTTPBearer(auto_error=False, description="An analyst's token, or the data owner's.")
_Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def _unauthorized(detail: str) -> StarletteHTTPException:
    return StarletteHTTPException(401, detail, headers={"WWW-Authenticate": "Bearer"})


def _principal(request: Request, creds: HTTPAuthorizationCredentials | None) -> Principal:
    activity = request.app.state.engine.activity
    if creds is None or not creds.credentials:
        activity.login_failed("rest", None, "no_token")
        raise _unauthorized("a bearer token is required (Authorization: Bearer TOKEN)")
    who = request.app.state.tokens.identify(creds.credentials)
    if who is None:
        activity.login_failed("rest", None, "unknown_token")  # never the token itself
        raise _unauthorized("unknown token")
    return who


async def _any_principal(request: Request, creds: _Credentials) -> Principal:
    return _principal(request, creds)


async def _analyst_only(request: Request, creds: _Credentials) -> Principal:
    who = _principal(request, creds)
    if who.analyst is None:
        raise StarletteHTTPException(
            403, "the data owner's token cannot run queries: use an analyst's token")
    return who


async def _owner_only(request: Request, creds: _Credentials) -> Principal:
    if not request.app.state.tokens.owner_configured:
        raise StarletteHTTPException(
            403, "no owner token is configured: set [server] owner_token_sha256 in the "
            "policy to open the dashboard and metrics")
    who = _principal(request, creds)
    if not who.owner:
        raise StarletteHTTPException(403, "this needs the data owner's token")
    return who


AnyPrincipal = Annotated[Principal, Depends(_any_principal)]
Analyst = Annotated[Principal, Depends(_analyst_only)]
Owner = Annotated[Principal, Depends(_owner_only)]
