"""The REST front door: a thin FastAPI app over one :class:`chorus_py.engine.Engine`.

Endpoints (the OpenAPI document is served at ``/openapi.json``):

==========================================  ===============  ==================================
``POST /v1/query``                          analyst token    run SQL with DP, rows + report
``POST /v1/explain``                        analyst token    the report only; nothing charged
``GET  /v1/info``                           analyst / owner  dialect, limits, tables, columns
``GET  /v1/budget``                         analyst / owner  budget of every block in the ledger
                                                             (an analyst: only their own spending)
``GET  /v1/budget/analysts/{name}``         that analyst     one analyst's spending
                                            / owner
``GET  /v1/dashboard``                      owner token      the data behind ``/dashboard``
``GET  /metrics``                           owner token      Prometheus metrics
``GET  /dashboard``                         none (static)    the budget dashboard page
``GET  /healthz``                           none             200 when the backend answers
==========================================  ===============  ==================================

Authentication is a bearer token: each analyst's ``token_sha256`` and the owner's
``[server] owner_token_sha256`` in the policy hold SHA-256 digests, never tokens.  Errors are RFC
9457 ``application/problem+json`` documents whose HTTP status follows the error's SQLSTATE (the
same code the wire server sends), with ``sqlstate`` and ``hint`` members.  Request bodies are
limited in size; the SQL text in length.  Engine calls block, so they run in a thread pool.

Run it with :func:`serve_rest` inside an existing asyncio loop (``chorus serve``), or
``python -m server.rest --policy policy.toml`` on its own.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import hmac
import logging
import re
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from budget.ledger import Viewer
from chorus_py.errors import ChorusError
from server import metrics as budget_views
from server.metrics import Metrics
from server.serve import ListenError

log = logging.getLogger("chorus.rest")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
#: Largest request body accepted (bytes); larger ones get 413 before they are read.
MAX_BODY_BYTES = 64 * 1024
#: Longest SQL text accepted (characters).
MAX_SQL_CHARS = 50_000
_NAME_MAX = 200
_DASHBOARD_DIR = Path(__file__).resolve().parent / "dashboard"
_DASHBOARD_FILES = {
    "index.html": "text/html; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}
# The dashboard loads nothing from elsewhere: no CDN, no inline script.
_PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; "
    "form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


# -- request and response models -----------------------------------------------------------------

class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class QueryRequest(_Model):
    """One SQL statement and, optionally, its privacy parameters."""

    sql: str = Field(min_length=1, max_length=MAX_SQL_CHARS,
                     description="One SELECT statement in the backend's dialect.",
                     examples=["SELECT city, COUNT(*) FROM trips GROUP BY city"])
    epsilon: float | None = Field(
        default=None, gt=0, allow_inf_nan=False,
        description="Privacy cost of this query (default: the policy's default_epsilon).")
    delta: float | None = Field(
        default=None, ge=0, lt=1, allow_inf_nan=False,
        description="Delta (default: the policy's default_delta); needed to release group keys "
        "without public_values.")
    wait_seconds: float | None = Field(
        default=None, ge=0, allow_inf_nan=False,
        description="Query only: how long to wait for budget the scheduler cannot grant at once "
        "(default: the policy's scheduler.wait_seconds, at most its max_wait_seconds).")
    sensitivity: Literal["analytic", "sampled"] | None = Field(
        default=None,
        description="'sampled' opts in to sensitivity sampling: an (epsilon, delta, gamma)-random"
        " DP answer for queries with no analytic bound (a median, SUM(LN(1 + x)), a column "
        "without bounds); default: the policy's privacy.sensitivity.")
    gamma: float | None = Field(
        default=None, gt=0, lt=1, allow_inf_nan=False,
        description="With sensitivity 'sampled': the probability the guarantee may fail over "
        "databases drawn from the table's sampling distribution (default: the policy's "
        "default_gamma, at most its max_gamma).")


class _ReportPart(BaseModel):
    # The engine may add fields to its report: pass them through rather than fail.
    model_config = ConfigDict(extra="allow")


class MeasurementModel(_ReportPart):
    """One noisy measurement per group."""

    id: str
    aggregate: str
    sensitivity: float | None
    derivation: str
    mechanism: dict[str, Any]
    error_bound_95: float | None


class ColumnModel(_ReportPart):
    """How one output column was produced."""

    name: str
    role: str = Field(description="aggregate, derived, group_key or constant")
    source: str
    measurements: list[str]
    mechanism: str | None = None
    scale: float | None = None
    error_bound_95: float | None = None
    note: str = ""


class KeyReleaseModel(_ReportPart):
    """How group keys were released."""

    method: str = Field(description="public_values or threshold")
    threshold: float | None = None
    gate: str | None = None
    delta: float | None = None
    note: str = ""


class ContributionModel(_ReportPart):
    """How many rows per privacy unit the query used, and what choosing that cost."""

    mode: str = Field(description="auto or fixed")
    limit: int
    cap: int | None = None
    epsilon: float
    note: str = ""
    method: str | None = Field(default=None, description="rows of several units: how the "
                               "stored kept set was chosen (greedy, sql-rank, ...)")


class RandomDPModel(_ReportPart):
    """A sampled-sensitivity answer: (epsilon, delta, gamma)-random DP, and how it was sampled."""

    gamma: float
    m: int
    k: int
    rho: float
    n: int
    n_source: str
    sensitivity: float
    distribution: str
    label: str
    note: str = ""


class PrivacyReportModel(_ReportPart):
    """What a query costs (explain) or cost (query), and how its answer was made."""

    analyst: str
    verdict: str = Field(description="allowed")
    charged: bool
    epsilon: float
    delta: float
    noise: str = Field(description="sql, proxy or none (public tables)")
    tables: list[str]
    blocks: list[str]
    stability: int | None = None
    privacy_unit: str | None = None
    measurements: list[MeasurementModel] = []
    columns: list[ColumnModel] = []
    key_release: KeyReleaseModel | None = None
    contribution: ContributionModel | None = None
    rewritten_sql: str | None = None
    notes: list[str] = []
    random_dp: RandomDPModel | None = None


class QueryResponse(_Model):
    """A noisy answer: column names, portable types, rows and the privacy report."""

    columns: list[str]
    types: list[str] = Field(description="integer, float, text, date, timestamp, boolean, ...")
    rows: list[list[Any]]
    report: PrivacyReportModel


class ExplainResponse(_Model):
    """What a query would cost, without running or charging anything."""

    report: PrivacyReportModel


class ColumnInfo(_Model):
    """A column an analyst may use."""

    type: str
    lower: float | None = None
    upper: float | None = None
    public_values: list[str | int | float | bool] | None = None
    private_id: bool = False


class TableInfo(_Model):
    """A table an analyst may query."""

    public: bool
    privacy_unit: str | None = None
    max_rows_per_unit: int | None = None
    block_column: str | None = None
    block_size: str | None = None
    # The blocks' public schedule: a UTC timestamp (time blocks) or an id (id ranges); end None:
    # time blocks run up to the current one.
    block_start: str | int | None = None
    block_end: str | int | None = None
    columns: dict[str, ColumnInfo]


class InfoResponse(_Model):
    """Who you are, the backend's SQL dialect, the privacy limits and the tables."""

    analyst: str | None
    owner: bool
    dialect: Literal["duckdb", "postgres"]
    default_epsilon: float
    default_delta: float
    max_epsilon_per_query: float
    max_delta_per_query: float
    epsilon_per_block: float
    delta_per_block: float
    tables: dict[str, TableInfo]


class BlockModel(BaseModel):
    """One private block as the ledger reports it (more fields appear as the ledger grows)."""

    model_config = ConfigDict(extra="allow")

    block: str
    epsilon_global: float | None = None
    epsilon_allocated: float | None = None
    epsilon_consumed: float | None = None
    epsilon_remaining: float | None = None
    delta_global: float | None = None
    delta_consumed: float | None = None
    delta_remaining: float | None = None
    by_analyst: dict[str, float] | None = Field(
        default=None, description="epsilon spent on this block per analyst: every analyst's "
        "for the data owner's token, only your own entry for an analyst's token")


class BudgetResponse(_Model):
    """The budget of every block the ledger holds; a block not listed has never been read."""

    epsilon_per_block: float
    delta_per_block: float
    blocks: list[BlockModel]


class AnalystBlock(_Model):
    """What one analyst spent on one block."""

    block: str
    epsilon_consumed: float
    delta_consumed: float
    queries: int


class AnalystBudgetResponse(_Model):
    """One analyst's spending: answered queries, epsilon and delta, per block and in total."""

    analyst: str
    queries: int
    epsilon_consumed: float
    delta_consumed: float
    claims: dict[str, int] = Field(description="claims of this analyst, by ledger state")
    blocks: list[AnalystBlock]


class BarModel(_Model):
    """One block's epsilon in four stacked parts (untouched: not yet in the ledger)."""

    block: str
    total: float
    consumed: float
    allocated: float
    unlocked: float
    locked: float
    untouched: bool


class HistoryPoint(_Model):
    """Total epsilon consumed and allocated over all blocks at time ``t`` (Unix seconds)."""

    t: float
    consumed: float
    allocated: float


class ClaimsSummary(_Model):
    """Claims granted, waiting, refused (and released), plus the ledger's own states."""

    granted: int
    waiting: int
    refused: int
    released: int
    by_state: dict[str, int]


class AnalystSpending(_Model):
    """What one analyst spent."""

    analyst: str
    queries: int
    epsilon: float
    delta: float


class DashboardResponse(_Model):
    """Everything the budget dashboard draws."""

    generated_at: float
    epsilon_per_block: float
    delta_per_block: float
    accounting: str
    scheduler: str
    blocks: list[BarModel]
    untouched_not_shown: int
    history: list[HistoryPoint]
    claims: ClaimsSummary
    analysts: list[AnalystSpending]
    refusals: dict[str, int] = Field(description="refusals seen by this server, by SQLSTATE")
    requests: dict[str, int] = Field(description="query/explain requests by outcome")


class HealthResponse(_Model):
    """The proxy is up and its backend answers."""

    status: Literal["ok"]


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


# -- errors as RFC 9457 problems ----------------------------------------------------------------

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


class BodyLimit:
    """Refuse request bodies over ``max_bytes`` (declared or streamed) with 413.

    Bodies are small, so the middleware reads the whole body first (stopping at the limit) and
    hands it to the app in one piece: the app never sees a partial body.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            try:
                too_large = int(declared) > self.max_bytes
            except ValueError:
                response = problem(400, "the Content-Length header is not a number",
                                   sqlstate="08P01")
                await response(scope, receive, send)
                return
            if too_large:
                await self._refuse(scope, receive, send)
                return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = problem(413, f"the request body is larger than {self.max_bytes} bytes",
                           sqlstate="54000", hint="send a shorter SQL statement",
                           instance=scope.get("path"), headers={"Connection": "close"})
        await response(scope, receive, send)


# -- authentication -------------------------------------------------------------------------------

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


class _Tokens:
    """Token digests from the policy; comparisons take the same time whatever matches."""

    def __init__(self, policy: Any) -> None:
        self._analysts = [(a.token_sha256, name) for name, a in policy.analysts.items()
                          if a.token_sha256]
        self._owner = policy.server.owner_token_sha256

    @property
    def owner_configured(self) -> bool:
        return self._owner is not None

    def identify(self, token: str) -> Principal | None:
        digest = _digest(token)
        found: Principal | None = None
        for stored, name in self._analysts:
            if hmac.compare_digest(stored, digest):
                found = Principal(name, False)
        if self._owner is not None and hmac.compare_digest(self._owner, digest):
            found = Principal(None, True)
        return found


_bearer = HTTPBearer(auto_error=False, description="An analyst's token, or the data owner's.")
_Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def _unauthorized(detail: str) -> StarletteHTTPException:
    return StarletteHTTPException(401, detail, headers={"WWW-Authenticate": "Bearer"})


def _principal(request: Request, creds: HTTPAuthorizationCredentials | None) -> Principal:
    if creds is None or not creds.credentials:
        raise _unauthorized("a bearer token is required (Authorization: Bearer TOKEN)")
    who = request.app.state.tokens.identify(creds.credentials)
    if who is None:
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


# -- the app ------------------------------------------------------------------------------------

def _responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    descriptions = {
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
    return {code: {"model": Problem, "description": descriptions[code]} for code in codes}


def create_app(engine: Any, *, max_body_bytes: int = MAX_BODY_BYTES,
               dashboard_refresh_ms: int = 2000) -> FastAPI:
    """The REST app over ``engine`` (which the caller keeps and closes)."""
    tokens = _Tokens(engine.policy)
    metrics = Metrics(engine)
    history = budget_views.BudgetHistory()
    outcomes: dict[str, int] = {"ok": 0, "refused": 0, "error": 0}
    refusals: dict[str, int] = {}
    pages = {name: (_DASHBOARD_DIR / name).read_bytes() for name in _DASHBOARD_FILES}

    app = FastAPI(
        title="Chorus differential-privacy SQL proxy",
        version=_version(),
        summary="Ordinary SQL in, noisy aggregates and a privacy report out.",
        description="Every query is charged to a per-block privacy budget. Errors are RFC 9457 "
        "problem documents with the error's SQLSTATE; refused queries cost nothing.",
        docs_url=None, redoc_url=None,  # their pages load scripts from a CDN
    )
    app.state.engine = engine
    app.state.metrics = metrics
    app.state.tokens = tokens

    # -- error handlers
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

    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)

    # -- queries
    async def _answer(endpoint: str, call: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        outcome = "ok"
        try:
            return await run_in_threadpool(call)
        except ChorusError as err:
            outcome = "refused" if http_status(err.sqlstate) < 500 else "error"
            if outcome == "refused":
                metrics.refused(err.sqlstate)
                refusals[err.sqlstate] = refusals.get(err.sqlstate, 0) + 1
            raise
        except BaseException:
            outcome = "error"
            raise
        finally:
            metrics.latency.labels(endpoint).observe(time.perf_counter() - started)
            metrics.requests.labels(endpoint, outcome).inc()
            outcomes[outcome] += 1

    @app.post("/v1/query", response_model=QueryResponse, tags=["queries"],
              responses=_responses(400, 401, 403, 409, 413, 422, 500, 502, 503))
    async def query(body: QueryRequest, who: Analyst) -> Any:
        """Answer one SQL query with differential privacy, charging its blocks."""
        def run() -> Any:
            answer = engine.execute(body.sql, analyst=who.analyst, epsilon=body.epsilon,
                                    delta=body.delta, wait_seconds=body.wait_seconds,
                                    sensitivity=body.sensitivity, gamma=body.gamma)
            if history.due():  # the dashboard's "budget over time", at most once a second
                # totals only are recorded: the owner's view loses nothing
                history.record(budget_views.ledger_blocks(engine, Viewer.owner()))
            return answer

        result = await _answer("query", run)
        out = result.to_dict()
        out["rows"] = budget_views.jsonable(out["rows"])
        out["report"] = budget_views.jsonable(out["report"])
        return out

    @app.post("/v1/explain", response_model=ExplainResponse, tags=["queries"],
              responses=_responses(400, 401, 403, 413, 422, 500, 503))
    async def explain(body: QueryRequest, who: Analyst) -> Any:
        """What a query would cost and how it would be answered; nothing runs or is charged."""
        report = await _answer("explain", lambda: engine.explain(
            body.sql, analyst=who.analyst, epsilon=body.epsilon, delta=body.delta,
            sensitivity=body.sensitivity, gamma=body.gamma))
        return {"report": budget_views.jsonable(report.to_dict())}

    @app.get("/v1/info", response_model=InfoResponse, tags=["metadata"],
             responses=_responses(401, 500))
    async def info(who: AnyPrincipal) -> Any:
        """The backend's SQL dialect, the privacy limits and the tables you may query."""
        return _info(engine, who)

    # -- budget
    @app.get("/v1/budget", response_model=BudgetResponse, tags=["budget"],
             responses=_responses(401, 500))
    async def budget(who: AnyPrincipal) -> Any:
        """The budget of every block in the ledger (blocks not listed were never read): the
        same totals for everyone; ``by_analyst`` lists every analyst's spending for the data
        owner, and only your own for an analyst."""
        privacy = engine.policy.privacy
        return {"epsilon_per_block": privacy.epsilon_per_block,
                "delta_per_block": privacy.delta_per_block,
                "blocks": await run_in_threadpool(budget_views.ledger_blocks, engine,
                                                  who.viewer)}

    @app.get("/v1/budget/analysts/{name}", response_model=AnalystBudgetResponse,
             tags=["budget"], responses=_responses(401, 403, 404, 422, 500))
    async def analyst_budget(
            name: Annotated[str, PathParam(min_length=1, max_length=_NAME_MAX)],
            who: AnyPrincipal) -> Any:
        """What one analyst spent (an analyst sees only their own; the owner sees everyone)."""
        if not who.owner and who.analyst != name:
            raise StarletteHTTPException(403, "an analyst may only read their own budget")
        # This analyst's totals and spent claims only, never the whole ledger.
        totals = await run_in_threadpool(budget_views.ledger_totals, engine, name)
        spending = budget_views.analyst_spending(totals).get(name)
        if spending is None and name not in engine.policy.analysts:
            raise StarletteHTTPException(404, f"no analyst named {name!r}")
        spending = spending or {"queries": 0, "epsilon": 0.0, "delta": 0.0, "claims": {}}
        spent = await run_in_threadpool(budget_views.spent_claims, engine, name)
        return {"analyst": name, "queries": spending["queries"],
                "epsilon_consumed": spending["epsilon"], "delta_consumed": spending["delta"],
                "claims": spending["claims"],
                "blocks": budget_views.analyst_blocks(spent, name)}

    # -- data owner
    @app.get("/v1/dashboard", response_model=DashboardResponse, tags=["data owner"],
             responses=_responses(401, 403, 500))
    async def dashboard_data(who: Owner) -> Any:
        """Everything the budget dashboard draws (blocks, history, claims, analysts)."""
        data = await run_in_threadpool(_dashboard, engine, history, metrics)
        data["refusals"] = dict(refusals)
        data["requests"] = dict(outcomes)
        return data

    @app.get("/metrics", response_class=PlainTextResponse, tags=["data owner"],
             responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                              "description": "Prometheus text exposition format."},
                        **_responses(401, 403, 500)})
    async def prometheus_metrics(who: Owner) -> Response:
        """Prometheus metrics: claims, refusals, budget per block, query latency."""
        body = await run_in_threadpool(generate_latest, metrics.registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz", response_model=HealthResponse, tags=["metadata"],
             responses=_responses(500, 503))
    async def healthz() -> Any:
        """200 when the proxy is up and its backend answers a trivial query."""
        try:
            await run_in_threadpool(engine.backend.run, "SELECT 1")
        except Exception:
            log.warning("health check: the backend does not answer", exc_info=True)
            return problem(503, "the database does not answer", sqlstate="08006",
                           instance="/healthz")
        return {"status": "ok"}

    # -- the dashboard page (static files; the data needs the owner token)
    def _page(name: str) -> Callable[[], Awaitable[Response]]:
        async def serve_page() -> Response:
            body = pages[name]
            if name == "index.html":
                body = body.replace(b"{{REFRESH_MS}}", str(int(dashboard_refresh_ms)).encode())
            return Response(body, media_type=_DASHBOARD_FILES[name], headers=_PAGE_HEADERS)
        return serve_page

    app.add_api_route("/dashboard", _page("index.html"), methods=["GET"],
                      include_in_schema=False)
    for name in _DASHBOARD_FILES:
        app.add_api_route(f"/dashboard/{name}", _page(name), methods=["GET"],
                          include_in_schema=False)

    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def _schedule_bound(value: datetime | int | None) -> str | int | None:
    """A block schedule's start or end as shown to analysts (ISO timestamp, UTC)."""
    return value.isoformat() + "Z" if isinstance(value, datetime) else value


def _info(engine: Any, who: Principal) -> dict[str, Any]:
    policy = engine.policy
    privacy = policy.privacy
    limit = privacy.max_epsilon_per_query
    mine = policy.analysts.get(who.analyst) if who.analyst else None
    if mine is not None and mine.max_epsilon_per_query is not None:
        limit = min(limit, mine.max_epsilon_per_query)
    tables = {}
    for name, table in policy.tables.items():
        tables[name] = {
            "public": table.public,
            "privacy_unit": table.unit_label,
            "max_rows_per_unit": table.max_rows_per_unit,
            "block_column": table.block.column if table.block else None,
            "block_size": table.block.size if table.block else None,
            "block_start": _schedule_bound(table.block.start) if table.block else None,
            "block_end": _schedule_bound(table.block.end) if table.block else None,
            "columns": {c: {"type": cp.type, "lower": cp.lower, "upper": cp.upper,
                            "public_values": list(cp.public_values)
                            if cp.public_values is not None else None,
                            "private_id": cp.private_id}
                        for c, cp in table.columns.items()},
        }
        if table.public:  # declared columns are optional for public tables: show the live ones
            for c in engine.public_columns.get(name, {}):
                tables[name]["columns"].setdefault(
                    c, {"type": engine.public_columns[name][c]})
    return {"analyst": who.analyst, "owner": who.owner, "dialect": engine.dialect,
            "default_epsilon": privacy.default_epsilon, "default_delta": privacy.default_delta,
            "max_epsilon_per_query": limit, "max_delta_per_query": privacy.max_delta_per_query,
            "epsilon_per_block": privacy.epsilon_per_block,
            "delta_per_block": privacy.delta_per_block, "tables": tables}


def _dashboard(engine: Any, history: budget_views.BudgetHistory,
               metrics: Metrics) -> dict[str, Any]:
    privacy = engine.policy.privacy
    blocks = budget_views.ledger_blocks(engine, Viewer.owner())  # the owner's page only
    totals = budget_views.ledger_totals(engine, None)  # counts and sums: no claim is read
    history.record(blocks)
    bars = {b["block"]: budget_views.bar_view(b, privacy.epsilon_per_block) for b in blocks}
    untouched = [i for i in budget_views.known_block_ids(engine) if i not in bars]
    hidden = max(0, len(untouched) - budget_views.MAX_UNTOUCHED_BLOCKS)
    for block_id in untouched[:budget_views.MAX_UNTOUCHED_BLOCKS]:
        bars[block_id] = {"block": block_id, "total": privacy.epsilon_per_block,
                          "consumed": 0.0, "allocated": 0.0, "unlocked": 0.0, "locked": 0.0,
                          "untouched": True}
    by_state = budget_views.claim_states(totals)
    summary = budget_views.claims_summary(by_state, metrics.budget_refusals)
    spending = budget_views.analyst_spending(totals)
    for name in engine.policy.analysts:
        spending.setdefault(name, {"analyst": name, "queries": 0, "epsilon": 0.0,
                                   "delta": 0.0, "claims": {}})
    return {
        "generated_at": time.time(),
        "epsilon_per_block": privacy.epsilon_per_block,
        "delta_per_block": privacy.delta_per_block,
        "accounting": str(privacy.accounting),
        "scheduler": str(privacy.scheduler.policy),
        "blocks": [bars[k] for k in sorted(bars)],
        "untouched_not_shown": hidden,
        "history": history.points(),
        "claims": {**summary, "by_state": by_state},
        "analysts": [{k: s[k] for k in ("analyst", "queries", "epsilon", "delta")}
                     for _, s in sorted(spending.items())],
    }


def _openapi(app: FastAPI) -> dict[str, Any]:
    """The generated document, with error bodies declared as application/problem+json."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, summary=app.summary,
                         description=app.description, routes=app.routes)
    problem_ref = {"schema": {"$ref": "#/components/schemas/Problem"}}
    for path in schema.get("paths", {}).values():
        for operation in path.values():
            for code, response in operation.get("responses", {}).items():
                if code[:1] in "45":
                    response["content"] = {"application/problem+json": problem_ref}
    app.openapi_schema = schema
    return schema


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("chorus-py")
    except PackageNotFoundError:
        return "0"


# -- running it ------------------------------------------------------------------------------------

def parse_listen(value: str, default_port: int = DEFAULT_PORT) -> tuple[str, int]:
    """``HOST:PORT``, ``[IPv6]:PORT``, ``HOST`` or ``:PORT`` (all interfaces) -> (host, port).

    The same forms as the wire server's ``--listen``.
    """
    value = value.strip()
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        port = rest.removeprefix(":")
    elif value.count(":") == 1:
        host, port = value.split(":")
    else:
        host, port = value, ""
    try:
        number = int(port) if port else default_port
    except ValueError:
        raise ValueError(f"bad listen address {value!r}: the port is not a number") from None
    if not 0 <= number <= 65535:
        raise ValueError(f"bad listen address {value!r}: port out of range")
    if not host and not value.startswith(":"):
        host = DEFAULT_HOST
    return host or "0.0.0.0", number


class _EmbeddedServer(uvicorn.Server):
    """A uvicorn server that leaves signal handling to the program it runs in."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def rest_server(app: FastAPI, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, *,
                handle_signals: bool = False, **config: Any) -> uvicorn.Server:
    """A uvicorn server for ``app``: ``await server.serve()`` runs it, ``should_exit`` stops it.

    With ``handle_signals`` False (the default) uvicorn installs no signal handlers: the program
    that embeds it (``chorus serve``) decides when to stop.  ``config`` goes to uvicorn.Config.
    """
    options: dict[str, Any] = {"log_level": "info", "access_log": False, "lifespan": "off",
                               "server_header": False, "timeout_graceful_shutdown": 10}
    options.update(config)
    cls = uvicorn.Server if handle_signals else _EmbeddedServer
    return cls(uvicorn.Config(app, host=host, port=port, **options))


async def serve_rest(engine: Any, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, *,
                     handle_signals: bool = False, **config: Any) -> None:
    """Serve the REST app for ``engine`` on host:port inside the running asyncio loop.

    Runs until the task is cancelled (it then closes its sockets and re-raises) or, with
    ``handle_signals``, until SIGINT/SIGTERM.  The caller owns and closes the engine.
    """
    server = rest_server(create_app(engine), host, port, handle_signals=handle_signals,
                         **config)
    log.info("REST listening on http://%s:%d", host, port)
    try:
        await server.serve()
    except asyncio.CancelledError:
        server.should_exit = True
        if getattr(server, "servers", None):  # started: close the sockets and connections
            await asyncio.shield(server.shutdown())
        raise


class RestListener:
    """A running REST server inside ``chorus serve``'s loop (see ``server/serve.py``)."""

    def __init__(self, server: uvicorn.Server, task: asyncio.Task[None], url: str) -> None:
        self.server = server
        self.task = task
        self.url = url

    async def close(self) -> None:
        """Stop accepting requests, finish those in flight, close the socket."""
        self.server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self.task), timeout=15)
        except TimeoutError:
            self.task.cancel()


def _bind(host: str, port: int) -> socket.socket:
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def rest_listener(engine: Any, listen: str = f"{DEFAULT_HOST}:{DEFAULT_PORT}",
                  **config: Any) -> Callable[[], Awaitable[RestListener]]:
    """The REST front door on ``listen`` (HOST:PORT) as a ``chorus serve`` listener.

    Calling the result binds the socket (a ``ListenError`` if it cannot), starts uvicorn as a task
    of the running loop and returns a :class:`RestListener` once it accepts connections.
    """
    host, port = parse_listen(listen)

    async def start() -> RestListener:
        try:
            sock = _bind(host, port)
        except OSError as err:
            raise ListenError("REST API and dashboard", listen, "--rest", err) from None
        server = rest_server(create_app(engine), host, port, **config)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            if task.done():
                sock.close()
                task.result()
                raise OSError(f"the REST server on {listen} stopped while starting")
            await asyncio.sleep(0.01)
        bound_host, bound_port = sock.getsockname()[:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        url = f"http://{shown}:{bound_port}"
        print(f"chorus: REST API on {url}/v1 (OpenAPI: {url}/openapi.json), budget dashboard "
              f"on {url}/dashboard", file=sys.stderr, flush=True)
        return RestListener(server, task, url)

    return start


def main(argv: list[str] | None = None) -> None:
    """``python -m server.rest --policy policy.toml [--listen 127.0.0.1:8000]``."""
    parser = argparse.ArgumentParser(prog="python -m server.rest",
                                     description="Serve the Chorus REST API and dashboard.")
    parser.add_argument("--policy", required=True, help="the policy (TOML) file")
    parser.add_argument("--listen", default=f"{DEFAULT_HOST}:{DEFAULT_PORT}",
                        help="HOST:PORT to listen on (default %(default)s)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log every query (the engine logs at INFO)")
    args = parser.parse_args(argv)
    host, port = parse_listen(args.listen)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from chorus_py.engine import Engine

    with Engine.from_policy(args.policy) as engine:
        asyncio.run(serve_rest(engine, host, port, handle_signals=True))


if __name__ == "__main__":
    main()
