"""The REST front door through a real uvicorn server and httpx, on DuckDB and Postgres."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from chorus_py.engine import Engine
from server.rest.listener import parse_listen, serve_rest
from server.rest.problems import http_status
from tests.conftest import free_port
from tests.rest.harness import (
    ALICE_TOKEN,
    BOB_TOKEN,
    OWNER_TOKEN,
    ServerThread,
    policy_with_tokens,
    serve_engine,
    token_engine,
)

PROBLEM = "application/problem+json"
CITY_COUNT = "SELECT city, COUNT(*) AS trips FROM trips GROUP BY city ORDER BY city"


def spent(engine: Engine) -> tuple[float, int]:
    """(epsilon consumed + allocated over all blocks, number of claims that took budget)."""
    blocks = engine.ledger.blocks()
    return (sum(b.epsilon_consumed + b.epsilon_allocated for b in blocks),
            sum(c.state in ("allocated", "consumed") for c in engine.ledger.claims()))


def assert_problem(response: httpx.Response, status: int, sqlstate: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    body = response.json()
    assert body["status"] == status
    assert body["sqlstate"] == sqlstate
    assert body["type"].startswith("urn:chorus:problem:")
    assert body["title"] and body["detail"]
    return body


def test_query_answers_with_rows_and_report(live: ServerThread) -> None:
    with live.client(ALICE_TOKEN) as client:
        response = client.post("/v1/query", json={"sql": CITY_COUNT, "epsilon": 2.0})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["columns"] == ["city", "trips"]
    assert body["types"] == ["text", "integer"]
    assert [row[0] for row in body["rows"]] == sorted(["SF", "NYC", "LA", "CHI", "SEA"])
    assert all(isinstance(row[1], int) for row in body["rows"])
    report = body["report"]
    assert report["analyst"] == "alice" and report["charged"] is True
    assert report["epsilon"] == pytest.approx(2.0)
    assert len(report["blocks"]) == 90
    assert report["columns"][1]["role"] == "aggregate"


def test_explain_charges_nothing(live: ServerThread) -> None:
    before = spent(live.engine)
    with live.client(BOB_TOKEN) as client:
        response = client.post("/v1/explain", json={"sql": "SELECT AVG(fare) FROM trips",
                                                     "epsilon": 0.4})
    assert response.status_code == 200, response.text
    report = response.json()["report"]
    assert report["charged"] is False and report["analyst"] == "bob"
    assert report["epsilon"] == pytest.approx(0.4)
    assert spent(live.engine) == before


def test_timestamps_and_public_tables(live: ServerThread) -> None:
    with live.client(ALICE_TOKEN) as client:
        public = client.post("/v1/query", json={
            "sql": "SELECT state, COUNT(*) AS n FROM cities GROUP BY state ORDER BY state"})
        assert public.status_code == 200, public.text
        assert public.json()["rows"] == [["CA", 2], ["IL", 1], ["NY", 1], ["WA", 1]]
        assert public.json()["report"]["charged"] is False


def test_authentication(live: ServerThread) -> None:
    body = {"sql": CITY_COUNT}
    before = spent(live.engine)
    with live.client() as anonymous:
        missing = anonymous.post("/v1/query", json=body)
        assert_problem(missing, 401, "28000")
        assert missing.headers["www-authenticate"] == "Bearer"
        assert_problem(anonymous.post("/v1/query", json=body,
                                      headers={"Authorization": "Bearer nope"}), 401, "28000")
        assert_problem(anonymous.post("/v1/query", json=body,
                                      headers={"Authorization": f"Basic {ALICE_TOKEN}"}),
                       401, "28000")
        assert_problem(anonymous.get("/v1/budget"), 401, "28000")
        assert_problem(anonymous.get("/metrics"), 401, "28000")
    with live.client(OWNER_TOKEN) as owner:
        assert_problem(owner.post("/v1/query", json=body), 403, "42501")
        assert owner.get("/v1/budget/analysts/alice").status_code == 200
        assert_problem(owner.get("/v1/budget/analysts/nobody"), 404, "42704")
    with live.client(BOB_TOKEN) as bob:
        assert_problem(bob.get("/v1/budget/analysts/alice"), 403, "42501")
        assert_problem(bob.get("/v1/budget/analysts/nobody"), 403, "42501")  # no enumeration
        assert_problem(bob.get("/v1/dashboard"), 403, "42501")
        assert_problem(bob.get("/metrics"), 403, "42501")
    assert spent(live.engine) == before


@pytest.mark.parametrize(("body", "status", "sqlstate"), [
    ({"sql": "SELECT * FROM trips"}, 403, "42501"),
    ({"sql": "SELECT COUNT(* FROM trips"}, 400, "42601"),
    ({"sql": "SELECT COUNT(*) FROM secrets"}, 400, "42P01"),
    ({"sql": "DELETE FROM trips"}, 403, "42501"),
    ({"sql": "SELECT COUNT(*) FROM trips; SELECT 1"}, 403, "42501"),
    ({"sql": "SELECT COUNT(*) FROM trips", "epsilon": 0.9}, 400, "22023"),  # bob's max is 0.5
    ({"sql": "SELECT COUNT(*) FROM trips", "epsilon": -1}, 400, "22023"),
    ({"sql": "SELECT COUNT(*) FROM trips", "delta": 1.5}, 400, "22023"),
    ({"sql": "SELECT COUNT(*) FROM trips", "epsilon": "lots"}, 400, "22023"),
    ({"sql": ""}, 422, "08P01"),
    ({"sql": 42}, 422, "08P01"),
    ({"query": "SELECT 1"}, 422, "08P01"),
    ({"sql": "SELECT COUNT(*) FROM trips", "extra": 1}, 422, "08P01"),
])
def test_refusals_are_problems_and_cost_nothing(live: ServerThread, body: dict, status: int,
                                                sqlstate: str) -> None:
    before = spent(live.engine)
    with live.client(BOB_TOKEN) as client:
        problem = assert_problem(client.post("/v1/query", json=body), status, sqlstate)
    assert problem["instance"] == "/v1/query"
    assert spent(live.engine) == before


def test_malformed_bodies(live_duckdb: ServerThread) -> None:
    before = spent(live_duckdb.engine)
    with live_duckdb.client(ALICE_TOKEN) as client:
        json_headers = {"content-type": "application/json"}
        assert_problem(client.post("/v1/query", content=b"{nope", headers=json_headers),
                       422, "08P01")
        # Python's json accepts NaN; the schema does not
        assert_problem(client.post("/v1/query", headers=json_headers,
                                   content=b'{"sql": "SELECT COUNT(*) FROM trips", '
                                           b'"epsilon": NaN}'), 400, "22023")
        assert_problem(client.post("/v1/query", content=b"\xff\xfe", headers=json_headers),
                       422, "08P01")
        assert_problem(client.post("/v1/query", json=[1, 2]), 422, "08P01")
        sql_nul = client.post("/v1/query", json={"sql": "SELECT COUNT(*) FROM trips\x00"})
        assert 400 <= sql_nul.status_code < 500
        assert_problem(client.get("/v1/nothing-here"), 404, "42704")
        not_allowed = assert_problem(client.delete("/v1/query"), 405, "08P01")
        assert not_allowed["instance"] == "/v1/query"
    assert spent(live_duckdb.engine) == before


def test_request_size_limits(live_duckdb: ServerThread) -> None:
    before = spent(live_duckdb.engine)
    with live_duckdb.client(ALICE_TOKEN) as client:
        big = {"sql": "SELECT COUNT(*) FROM trips WHERE city = '" + "x" * 70_000 + "'"}
        assert_problem(client.post("/v1/query", json=big), 413, "54000")

        def chunks():  # no Content-Length: the limit applies while reading
            yield b'{"sql": "'
            for _ in range(80):
                yield b"x" * 1000
            yield b'"}'

        assert_problem(client.post("/v1/query", content=chunks(),
                                   headers={"content-type": "application/json"}), 413, "54000")
        long_sql = {"sql": "SELECT COUNT(*) FROM trips WHERE city = '" + "x" * 55_000 + "'"}
        problem = assert_problem(client.post("/v1/query", json=long_sql), 400, "54000")
        assert "50000" in problem["detail"]
    host, port = live_duckdb.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        raw.sendall(b"POST /v1/query HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: abc\r\nAuthorization: Bearer " + ALICE_TOKEN.encode()
                    + b"\r\n\r\n{}")
        assert raw.recv(100).startswith(b"HTTP/1.1 400 ")
    assert spent(live_duckdb.engine) == before


def test_budget_endpoints(live: ServerThread) -> None:
    with live.client(ALICE_TOKEN) as client:
        charged = client.post("/v1/query", json={
            "sql": "SELECT COUNT(*) FROM trips WHERE pickup_time >= '2026-03-30'",
            "epsilon": 0.25})
        assert charged.status_code == 200, charged.text
        blocks = charged.json()["report"]["blocks"]
        assert blocks == ["trips/2026-03-30", "trips/2026-03-31"]
        budget = client.get("/v1/budget").json()
        assert budget["epsilon_per_block"] == 1000.0
        by_id = {b["block"]: b for b in budget["blocks"]}
        assert by_id["trips/2026-03-31"]["epsilon_consumed"] >= 0.25
        assert by_id["trips/2026-03-31"]["epsilon_remaining"] == pytest.approx(
            1000.0 - by_id["trips/2026-03-31"]["epsilon_consumed"])
        mine = client.get("/v1/budget/analysts/alice").json()
        assert mine["analyst"] == "alice" and mine["queries"] >= 1
        assert mine["claims"]["consumed"] == mine["queries"]
        per_block = {b["block"]: b for b in mine["blocks"]}
        assert per_block["trips/2026-03-31"]["epsilon_consumed"] >= 0.25
    with live.client(OWNER_TOKEN) as owner:
        assert owner.get("/v1/budget/analysts/alice").json() == mine
        assert owner.get("/v1/budget").status_code == 200


def test_budget_exhausted_is_409_and_nothing_spent(duckdb_data: str, tmp_path: Path) -> None:
    engine = token_engine(tmp_path, duckdb_data, epsilon_per_block=1.0, max_epsilon=1.0)
    sql = {"sql": "SELECT COUNT(*) FROM visits", "epsilon": 0.75}
    try:
        with serve_engine(engine) as server, server.client(ALICE_TOKEN) as client:
            assert client.post("/v1/query", json=sql).status_code == 200
            before = spent(engine)
            problem = assert_problem(client.post("/v1/query", json=sql), 409, "53400")
            assert "visits" in problem["detail"] and problem["hint"]
            assert spent(engine) == before
            with server.client(OWNER_TOKEN) as owner:
                dashboard = owner.get("/v1/dashboard").json()
            assert dashboard["claims"]["refused"] == 1
            assert dashboard["claims"]["granted"] == 1
            assert dashboard["refusals"] == {"53400": 1}
    finally:
        engine.close()


def test_info(live: ServerThread) -> None:
    with live.client(BOB_TOKEN) as client:
        info = client.get("/v1/info").json()
    assert info["analyst"] == "bob" and info["owner"] is False
    assert info["dialect"] in ("duckdb", "postgres")
    assert info["max_epsilon_per_query"] == 0.5  # bob's own limit
    trips = info["tables"]["trips"]
    assert trips["privacy_unit"] == "rider_id" and trips["block_column"] == "pickup_time"
    # The public block schedule (never derived from the data).
    assert (trips["block_start"], trips["block_end"]) == ("2026-01-01T00:00:00Z",
                                                          "2026-04-01T00:00:00Z")
    assert trips["block_scheme"] == "pickup_time: 1 day from 1970-01-01 00:00 UTC"
    assert trips["columns"]["fare"] == {"type": "float", "lower": 0.0, "upper": 200.0,
                                        "public_values": None, "private_id": False}
    assert info["tables"]["cities"]["public"] is True
    assert set(info["tables"]["cities"]["columns"]) == {"city", "state", "population"}


def test_concurrent_queries_run_in_the_thread_pool(live_duckdb: ServerThread) -> None:
    engine = live_duckdb.engine
    before, claims = spent(engine)
    sql = {"sql": "SELECT COUNT(*) FROM trips WHERE pickup_time < '2026-01-02'", "epsilon": 0.5}

    def ask(_: int) -> tuple[int, int]:
        with live_duckdb.client(ALICE_TOKEN) as client:
            response = client.post("/v1/query", json=sql)
            return response.status_code, len(response.json()["report"]["blocks"])

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, range(16)))
    assert [status for status, _ in answers] == [200] * 16
    after, claims_after = spent(engine)
    assert claims_after == claims + 16
    assert after == pytest.approx(before + sum(0.5 * n for _, n in answers))


def test_healthz(live: ServerThread, duckdb_data: str, tmp_path: Path) -> None:
    with live.client() as client:
        response = client.get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}
    engine = token_engine(tmp_path, duckdb_data)
    with serve_engine(engine) as server, server.client() as client:
        engine.close()  # the backend goes away
        assert_problem(client.get("/healthz"), 503, "08006")


def test_metrics(live_duckdb: ServerThread) -> None:
    with live_duckdb.client(ALICE_TOKEN) as client:
        assert client.post("/v1/query", json={"sql": "SELECT COUNT(*) FROM trips"}).is_success
        client.post("/v1/query", json={"sql": "SELECT * FROM trips"})
    with live_duckdb.client(OWNER_TOKEN) as owner:
        response = owner.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    latency = families["chorus_query_duration_seconds"]
    assert any(s.name.endswith("_count") and s.labels["endpoint"] == "query" and s.value >= 1
               for s in latency.samples)
    refusals = {s.labels["sqlstate"]: s.value for s in families["chorus_refusals"].samples
                if s.name == "chorus_refusals_total"}
    assert refusals["42501"] >= 1
    claims = {s.labels["state"]: s.value for s in families["chorus_claims"].samples}
    assert claims["consumed"] >= 1
    blocks = {(s.labels["block"], s.labels["part"]): s.value
              for s in families["chorus_block_epsilon"].samples}
    assert blocks[("trips/2026-01-01", "total")] == 1000.0
    assert blocks[("trips/2026-01-01", "consumed")] > 0
    spent_by = {s.labels["analyst"]: s.value
                for s in families["chorus_analyst_epsilon_consumed"].samples}
    assert spent_by["alice"] > 0


def test_dashboard_data_and_page(live_duckdb: ServerThread) -> None:
    with live_duckdb.client(OWNER_TOKEN) as owner:
        first = owner.get("/v1/dashboard").json()
        assert len(first["blocks"]) >= 90
        with live_duckdb.client(ALICE_TOKEN) as alice:
            alice.post("/v1/query", json={
                "sql": "SELECT COUNT(*) FROM trips WHERE pickup_time < '2026-01-03'",
                "epsilon": 1.0})
        second = owner.get("/v1/dashboard").json()
        page = owner.get("/dashboard")
    bars = {b["block"]: b for b in second["blocks"]}
    assert bars["trips/2026-01-02"]["consumed"] >= 1.0
    old = {b["block"]: b for b in first["blocks"]}.get("trips/2026-01-02")
    assert old is None or old["consumed"] < bars["trips/2026-01-02"]["consumed"]
    for bar in second["blocks"]:
        parts = bar["consumed"] + bar["allocated"] + bar["unlocked"] + bar["locked"]
        assert bar["untouched"] or parts == pytest.approx(bar["total"])
    assert second["history"][-1]["consumed"] >= first["history"][-1]["consumed"] + 2.0
    assert {a["analyst"] for a in second["analysts"]} == {"alice", "bob"}
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert b"cdn" not in page.content.lower() and b"http" not in page.content.lower()


def test_dashboard_closed_without_owner_token(duckdb_data: str, tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(policy_with_tokens(duckdb_data, owner=False))
    engine = Engine.from_policy(policy)
    try:
        with serve_engine(engine) as server, server.client(ALICE_TOKEN) as client:
            problem = assert_problem(client.get("/v1/dashboard"), 403, "42501")
            assert "owner_token_sha256" in problem["detail"]
            assert client.get("/dashboard").status_code == 200  # the static page itself
    finally:
        engine.close()


def test_openapi_document(live_duckdb: ServerThread) -> None:
    with live_duckdb.client() as client:
        doc = client.get("/openapi.json").json()
        assert client.get("/docs").status_code == 404  # Swagger UI would load a CDN
    paths = doc["paths"]
    assert {"/v1/query", "/v1/explain", "/v1/budget", "/v1/budget/analysts/{name}", "/healthz",
            "/v1/info", "/v1/dashboard", "/metrics"} <= set(paths)
    query = paths["/v1/query"]["post"]
    assert query["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/QueryRequest")
    for code in ("400", "401", "403", "409", "413", "422", "502"):
        assert "application/problem+json" in query["responses"][code]["content"]
    assert query["security"] == [{"HTTPBearer": []}]
    sql = doc["components"]["schemas"]["QueryRequest"]["properties"]["sql"]
    assert sql["maxLength"] == 50_000


@pytest.mark.parametrize(("sqlstate", "status"), [
    ("42501", 403), ("42601", 400), ("42P01", 400), ("22023", 400), ("0A000", 400),
    ("53400", 409), ("58030", 502), ("XX000", 500), ("F0000", 500), ("08006", 503),
    ("28000", 401), ("54000", 413)])
def test_status_follows_sqlstate(sqlstate: str, status: int) -> None:
    assert http_status(sqlstate) == status


def test_parse_listen() -> None:
    assert parse_listen("127.0.0.1:8000") == ("127.0.0.1", 8000)
    assert parse_listen("0.0.0.0:9") == ("0.0.0.0", 9)
    assert parse_listen("[::1]:8080") == ("::1", 8080)
    assert parse_listen("localhost") == ("localhost", 8000)
    assert parse_listen(":8001") == ("0.0.0.0", 8001)  # like the wire server's --listen
    for bad in ("host:port", "h:70000"):
        with pytest.raises(ValueError):
            parse_listen(bad)


def test_serve_rest_inside_a_running_loop(duckdb_data: str, tmp_path: Path) -> None:
    """``serve_rest`` runs as one task of an existing loop and stops when cancelled."""
    engine = token_engine(tmp_path, duckdb_data)
    port = free_port()
    statuses: list[int] = []

    async def main() -> None:
        task = asyncio.create_task(serve_rest(engine, "127.0.0.1", port, log_level="warning"))
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            for _ in range(200):
                try:
                    statuses.append((await client.get("/healthz")).status_code)
                    break
                except httpx.ConnectError:
                    await asyncio.sleep(0.02)
            other = await asyncio.to_thread(lambda: httpx.post(  # a blocking client meanwhile
                f"http://127.0.0.1:{port}/v1/query", json={"sql": "SELECT COUNT(*) FROM trips"},
                headers={"Authorization": f"Bearer {ALICE_TOKEN}"}).status_code)
            statuses.append(other)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        thread = threading.Thread(target=asyncio.run, args=(main(),))
        thread.start()
        thread.join(30)
        assert statuses == [200, 200]
        time.sleep(0.05)
        with socket.socket() as again:  # the listening socket was closed
            again.bind(("127.0.0.1", port))
    finally:
        engine.close()
