"""The REST app: routes over one :class:`chorus_py.engine.Engine`, built by :func:`create_app`.

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

Each route checks who may call it (:mod:`server.rest.auth`), hands the engine its request in a
thread pool (engine calls block) and returns the engine's answer as JSON; the app holds no
privacy logic.  It counts requests and refusals for ``/metrics`` (:class:`server.metrics.Metrics`)
and the dashboard, and mounts the dashboard's page and data (:mod:`server.dashboard`).  Errors
become problem documents (:mod:`server.rest.problems`); bodies are size-limited
(:mod:`server.rest.body`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any

from fastapi import FastAPI
from fastapi import Path as PathParam
from fastapi.openapi.utils import get_openapi
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from budget.ledger import Viewer
from chorus_py.errors import ChorusError
from server import metrics as budget_views
from server.dashboard.data import DashboardResponse, build_dashboard
from server.dashboard.page import pages
from server.metrics import Metrics
from server.rest.auth import Analyst, AnyPrincipal, Owner, Principal, Tokens
from server.rest.body import MAX_BODY_BYTES, BodyLimit
from server.rest.models import (
    AnalystBudgetResponse,
    BudgetResponse,
    ExplainResponse,
    HealthResponse,
    InfoResponse,
    QueryRequest,
    QueryResponse,
)
from server.rest.problems import http_status, install_handlers, problem, responses

_NAME_MAX = 200


def create_app(engine: Any, *, max_body_bytes: int = MAX_BODY_BYTES,
               dashboard_refresh_ms: int = 2000) -> FastAPI:
    """The REST app over ``engine`` (which the caller keeps and closes)."""
    tokens = Tokens(engine)
    metrics = Metrics(engine)
    history = budget_views.BudgetHistory()
    outcomes: dict[str, int] = {"ok": 0, "refused": 0, "error": 0}
    refusals: dict[str, int] = {}

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
    install_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)

    # -- queries
    async def _answer(endpoint: str, call: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        outcome = "ok"
        try:
            return await run_in_threadpool(call)
        except ChorusError as err:
            outcome = "refused" if http_status(err.sqlstate) < 500 else "error"
            if outcome == "refused":  # the metrics count it from the engine's activity
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
              responses=responses(400, 401, 403, 409, 413, 422, 500, 502, 503))
    async def query(body: QueryRequest, who: Analyst) -> Any:
        """Answer one SQL query with differential privacy, charging its blocks."""
        def run() -> Any:
            answer = engine.execute(body.sql, analyst=who.analyst, epsilon=body.epsilon,
                                    delta=body.delta, wait_seconds=body.wait_seconds,
                                    sensitivity=body.sensitivity, gamma=body.gamma,
                                    door="rest")
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
              responses=responses(400, 401, 403, 413, 422, 500, 503))
    async def explain(body: QueryRequest, who: Analyst) -> Any:
        """What a query would cost and how it would be answered; nothing runs or is charged."""
        report = await _answer("explain", lambda: engine.explain(
            body.sql, analyst=who.analyst, epsilon=body.epsilon, delta=body.delta,
            sensitivity=body.sensitivity, gamma=body.gamma, door="rest"))
        return {"report": budget_views.jsonable(report.to_dict())}

    @app.get("/v1/info", response_model=InfoResponse, tags=["metadata"],
             responses=responses(401, 500))
    async def info(who: AnyPrincipal) -> Any:
        """The backend's SQL dialect, the privacy limits and the tables you may query."""
        return _info(engine, who)

    # -- budget
    @app.get("/v1/budget", response_model=BudgetResponse, tags=["budget"],
             responses=responses(401, 500))
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
             tags=["budget"], responses=responses(401, 403, 404, 422, 500))
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
             responses=responses(401, 403, 500))
    async def dashboard_data(who: Owner) -> Any:
        """Everything the budget dashboard draws (blocks, history, claims, analysts)."""
        data = await run_in_threadpool(build_dashboard, engine, history, metrics)
        data["refusals"] = dict(refusals)
        data["requests"] = dict(outcomes)
        return data

    @app.get("/metrics", response_class=PlainTextResponse, tags=["data owner"],
             responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                              "description": "Prometheus text exposition format."},
                        **responses(401, 403, 500)})
    async def prometheus_metrics(who: Owner) -> Response:
        """Prometheus metrics: claims, refusals, budget per block, query latency."""
        body = await run_in_threadpool(generate_latest, metrics.registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz", response_model=HealthResponse, tags=["metadata"],
             responses=responses(500, 503))
    async def healthz() -> Any:
        """200 when the proxy is up and its backend answers a trivial query."""
        try:
            await run_in_threadpool(engine.backend.run, "SELECT 1")
        except Exception as err:
            # Logged once when the state changes, not a traceback per probe (load balancers
            # probe every few seconds).
            engine.activity.health(False, err)
            return problem(503, "the database does not answer", sqlstate="08006",
                           instance="/healthz")
        engine.activity.health(True)
        return {"status": "ok"}

    # -- the dashboard page (static files; the data needs the owner token)
    for path, endpoint in pages(dashboard_refresh_ms).items():
        app.add_api_route(path, endpoint, methods=["GET"], include_in_schema=False)

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
            "block_scheme": table.block.scheme if table.block else None,
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
