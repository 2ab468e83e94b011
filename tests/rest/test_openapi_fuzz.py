"""Schemathesis against the OpenAPI document a real server serves: no 5xx, answers match it.

Every operation is fuzzed with schema-valid and schema-invalid inputs (random SQL, epsilon,
delta, names), with an analyst's token or, for the owner's endpoints, the owner's; all of
schemathesis' checks run, among them ``ignored_auth`` (the request re-sent without credentials
must get 401) and ``negative_data_rejection``.  Positive-data acceptance is excluded: schema-valid
SQL is still refused (400/403) when the privacy policy does not allow it.

(Hypothesis drives the operations' strategies directly: schemathesis' pytest plugin does not run
on pytest 9.)
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import positive_data_acceptance

from tests.rest.harness import ALICE_TOKEN, OWNER_TOKEN, ServerThread

OWNER_PATHS = {"/v1/dashboard", "/metrics"}
OPERATIONS = [
    ("POST", "/v1/query"), ("POST", "/v1/explain"), ("GET", "/v1/info"), ("GET", "/v1/budget"),
    ("GET", "/v1/budget/analysts/{name}"), ("GET", "/v1/dashboard"), ("GET", "/metrics"),
    ("GET", "/healthz"),
]


@pytest.fixture(scope="module")
def served_schema(live_duckdb: ServerThread) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(f"{live_duckdb.url}/openapi.json")


def test_every_operation_is_fuzzed(served_schema: schemathesis.BaseSchema) -> None:
    served = {(r.ok().method.upper(), r.ok().path) for r in served_schema.get_all_operations()}
    assert served == set(OPERATIONS)


@pytest.mark.parametrize(("method", "path", "mode"), [
    (method, path, mode) for method, path in OPERATIONS
    for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE)
    if not (path == "/healthz" and mode == schemathesis.GenerationMode.NEGATIVE)  # no inputs
])
def test_operation_conforms_to_the_document(served_schema: schemathesis.BaseSchema,
                                            live_duckdb: ServerThread, method: str, path: str,
                                            mode: schemathesis.GenerationMode) -> None:
    operation = served_schema[path][method]
    token = OWNER_TOKEN if path in OWNER_PATHS else ALICE_TOKEN
    ledger = live_duckdb.engine.ledger

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=40, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def check(case: schemathesis.Case) -> None:
        before = [(b.block_id, b.epsilon_consumed) for b in ledger.blocks()]
        response = case.call_and_validate(base_url=live_duckdb.url,
                                          headers={"Authorization": f"Bearer {token}"},
                                          excluded_checks=[positive_data_acceptance])
        if response.status_code >= 400:  # a refused request never costs budget
            assert [(b.block_id, b.epsilon_consumed) for b in ledger.blocks()] == before

    check()


_FRAGMENTS = [
    "SELECT", "COUNT(*)", "COUNT(DISTINCT rider_id)", "SUM(fare)", "AVG(fare)", "MAX(fare)",
    "STDDEV(fare)", "city", "fare", "rider_id", "pickup_time", "FROM", "trips", "cities",
    "visits", "secrets", "WHERE", "GROUP BY", "HAVING", "ORDER BY", "LIMIT", "1", "0", "-1",
    "1e400", "'SF'", "'", '"', "(", ")", ",", ";", "--", "/*", "*/", "=", ">", "<", "AND", "OR",
    "NOT", "NULL", "IN", "UNION", "JOIN", "ON", "AS", "x", "::", "::date", "*", "/", "1/0",
    "LN(fare)", "SQRT(fare)", "random()", "pg_sleep(1)", "setseed(0.5)", "DATE '2026-01-01'",
    "'2026-02-01'", "CAST(fare AS INT)", "EXTRACT(hour FROM pickup_time)", "DELETE", "DROP",
    "TABLE", "INSERT", "INTO", "VALUES", "COPY", "\\x00", "$1", ":name", "?", "WITH", "t",
    "CASE", "WHEN", "THEN", "ELSE", "END", "OVER", "PARTITION BY", "information_schema.tables",
]


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(words=st.lists(st.sampled_from(_FRAGMENTS), min_size=1, max_size=16),
       epsilon=st.one_of(st.none(), st.floats(min_value=1e-6, max_value=600)))
def test_sql_soup_never_crashes_and_refusals_cost_nothing(live_duckdb: ServerThread,
                                                          words: list[str],
                                                          epsilon: float | None) -> None:
    """Random SQL-shaped text: an answer or a 4xx problem, never a 5xx; refusals are free."""
    ledger = live_duckdb.engine.ledger
    before = [(b.block_id, b.epsilon_consumed) for b in ledger.blocks()]
    body: dict[str, object] = {"sql": " ".join(words)}
    if epsilon is not None:
        body["epsilon"] = epsilon
    with live_duckdb.client(ALICE_TOKEN) as client:
        response = client.post("/v1/query", json=body)
    assert response.status_code in (200, 400, 403, 409), response.text
    if response.status_code != 200:
        assert response.headers["content-type"].startswith("application/problem+json")
        assert [(b.block_id, b.epsilon_consumed) for b in ledger.blocks()] == before
