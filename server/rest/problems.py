"""Errors as RFC 9457 ``application/problem+json`` documents, for every response of the REST app.

The HTTP status follows the error's SQLSTATE (:func:`http_status`: the exact code, then its
two-letter class), so a client sees the same code the wire server sends, with ``sqlstate`` and
``hint`` members.  :func:`install_handlers` maps each kind of failure to a problem: a proxy error
(:class:`~chorus_py.errors.ChorusError`) by its class and SQLSTATE, a body that does not match the
schema by the same categories as the engine's own checks, an HTTP error by its status, and
anything else as a 500 without detail (the log has it).  :data:`Problem` is the document's schema
in the OpenAPI document; :func:`responses` declares it for the error statuses of a route.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict
from starlette.exceptions import HTTPException as StarletteHTTPException

from chorus_py.errors import ChorusError

log = logging.getLogger("chorus.rest")


class Problem(BaseModel):
    """An RFC 9457 problem document; ``sqlstate`` is the error's SQLSTATE code."""

    model_config = ConfigDict(extra="allow")

    type: str
    title: str
    status: int
    detail: str
    sqlstate: str
    hint: str | None = None
    instance: str | None = None


_EXACT_STATUS = {"42501": 403, "08P01": 422, "58030": 502, "57014": 504}
_CLASS_STATUS = {"22": 400, "42": 400, "0A": 400, "28": 401, "53": 409, "54": 413, "23": 409,
                 "08": 503, "57": 503}
_HTTP_SQLSTATE = {400: "08P01", 401: "28000", 403: "42501", 404: "42704", 405: "08P01",
                  406: "08P01", 409: "53000", 413: "54000", 415: "08P01", 422: "08P01",
                  503: "08006"}
_HTTP_TITLES = {400: "Bad request", 401: "Authentication required", 403: "Forbidden",
                404: "Not found", 405: "Method not allowed", 413: "Request too large",
                415: "Unsupported media type", 422: "Invalid request",
                500: "Internal error", 503: "Unavailable"}
_DESCRIPTIONS = {
    400: "The SQL or a parameter is refused (nothing charged).",
    401: "Missing or unknown bearer token.",
    403: "The policy does not allow this (nothing charged).",
    404: "No such analyst.",
    409: "Not enough privacy budget left on a block (nothing charged).",
    413: "Request body too large.",
    422: "The request body does not match the schema.",
    500: "A bug in the proxy (reported without detail).",
    502: "The database failed while evaluating the query (charged, no detail shown).",
    503: "The database is unreachable.",
}


def http_status(sqlstate: str) -> int:
    """The HTTP status of an error, from its SQLSTATE (exact code, then its two-letter class)."""
    if sqlstate in _EXACT_STATUS:
        return _EXACT_STATUS[sqlstate]
    return _CLASS_STATUS.get(sqlstate[:2], 500)


def _validation_sqlstate(errors: list[dict[str, Any]]) -> str:
    """The SQLSTATE of a request that does not match its schema.

    The same categories as the engine's own checks: a bad epsilon, delta or wait is an invalid
    parameter (22023), SQL over the length limit a program limit (54000); anything else is a
    malformed request (08P01, a protocol violation).
    """
    fields = {tuple(e["loc"][:2]) for e in errors}
    if fields and fields <= {("body", "epsilon"), ("body", "delta"), ("body", "wait_seconds"),
                             ("body", "sensitivity"), ("body", "gamma")}:
        return "22023"
    if fields == {("body", "sql")} and all(e["type"] == "string_too_long" for e in errors):
        return "54000"
    return "08P01"


def _slug(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "-", name).lower().replace(" ", "-")


def _title(name: str) -> str:
    words = re.sub(r"(?<!^)(?=[A-Z])", " ", name).lower()
    return words[:1].upper() + words[1:]


def problem(status: int, detail: str, *, sqlstate: str, title: str | None = None,
            kind: str | None = None, hint: str | None = None, instance: str | None = None,
            headers: Mapping[str, str] | None = None, **extra: Any) -> JSONResponse:
    """An ``application/problem+json`` response."""
    body: dict[str, Any] = {
        "type": f"urn:chorus:problem:{kind or _slug(_HTTP_TITLES.get(status, 'error'))}",
        "title": title or _HTTP_TITLES.get(status, "Error"),
        "status": status,
        "detail": detail,
        "sqlstate": sqlstate,
    }
    if hint:
        body["hint"] = hint
    if instance:
        body["instance"] = instance
    body.update(extra)
    return JSONResponse(body, status_code=status, headers=dict(headers or {}),
                        media_type="application/problem+json")


def error_problem(err: ChorusError, instance: str | None = None) -> JSONResponse:
    """The problem document of a proxy error: its class names the type, its SQLSTATE the status."""
    name = type(err).__name__
    return problem(http_status(err.sqlstate), err.message, sqlstate=err.sqlstate,
                   title=_title(name), kind=_slug(name), hint=err.hint, instance=instance)


def responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI ``responses`` of a route for its error ``codes``: each a :class:`Problem`."""
    return {code: {"model": Problem, "description": _DESCRIPTIONS[code]} for code in codes}


def install_handlers(app: FastAPI) -> None:
    """Answer every failure of ``app`` with a problem document."""

    @app.exception_handler(ChorusError)
    async def _chorus_error(request: Request, err: ChorusError) -> Response:
        return error_problem(err, request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError) -> Response:
        errors = [{"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", "")),
                   "type": str(e.get("type", ""))} for e in err.errors()][:20]
        detail = "; ".join(f"{'.'.join(e['loc'])}: {e['msg']}" for e in errors) or \
            "invalid request"
        sqlstate = _validation_sqlstate(errors)
        # SQL over the length limit in a body within the size limit: 400, not 413.
        status = 400 if sqlstate == "54000" else http_status(sqlstate)
        return problem(status, detail[:2000], sqlstate=sqlstate,
                       instance=request.url.path, hint="see the request schema in /openapi.json",
                       errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, err: StarletteHTTPException) -> Response:
        return problem(err.status_code, str(err.detail), sqlstate=_HTTP_SQLSTATE.get(
            err.status_code, "XX000"), instance=request.url.path, headers=err.headers)

    @app.exception_handler(Exception)
    async def _bug(request: Request, err: Exception) -> Response:
        log.exception("unexpected error on %s", request.url.path)
        return problem(500, "internal error; the server log has the details",
                       sqlstate="XX000", title="Internal error", instance=request.url.path)
