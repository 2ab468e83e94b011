"""Helpers shared by the REST and DB-API tests: a real uvicorn server in a thread, test tokens."""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from chorus_py.engine import Engine
from chorus_py.policy import load_policy
from server.rest.app import create_app
from server.rest.listener import rest_server

ALICE_TOKEN = "alice-token-0123456789"
BOB_TOKEN = "bob-token-0123456789"
OWNER_TOKEN = "owner-token-0123456789"


def sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


# The data of tests/conftest.py (duckdb_data, postgres_data) with REST tokens.  Kept separate
# from the shared POLICY_TEMPLATE so engine options added there do not break the front doors.
_POLICY = """
[backend]
url = "{url}"

[privacy]
epsilon_per_block = {epsilon_per_block}
delta_per_block = 1e-3
default_epsilon = 1.0
default_delta = 1e-8
max_epsilon_per_query = {max_epsilon}
max_delta_per_query = 1e-4
{scheduler}

[tables.trips]
privacy_unit = "rider_id"
max_rows_per_unit = 10
block = {{ column = "pickup_time", size = "1 day", start = "2026-01-01", end = "2026-04-01" }}

[tables.trips.columns]
trip_id     = {{ type = "int" }}
rider_id    = {{ type = "int", private_id = true }}
driver_id   = {{ type = "int" }}
city        = {{ type = "text", public_values = ["SF", "NYC", "LA", "CHI", "SEA"] }}
pickup_time = {{ type = "timestamp" }}
fare        = {{ type = "float", lower = 0, upper = 200 }}
distance_km = {{ type = "float", lower = 0, upper = 100 }}

[tables.visits]
[tables.visits.columns]
visit_id = {{ type = "int" }}
page     = {{ type = "text" }}
seconds  = {{ type = "float", lower = 0, upper = 600 }}

[tables.cities]
public = true

[analysts.alice]
token_sha256 = "{alice}"

[analysts.bob]
max_epsilon_per_query = 0.5
token_sha256 = "{bob}"
"""


def policy_with_tokens(url: str, *, epsilon_per_block: float = 1000.0,
                       max_epsilon: float = 500.0, owner: bool = True,
                       scheduler: str = "") -> str:
    """A test policy with REST tokens for alice and bob and (optionally) the owner's.

    ``scheduler`` is the TOML value of ``privacy.scheduler`` (default: the policy's default).
    """
    text = _POLICY.format(url=url, epsilon_per_block=epsilon_per_block, max_epsilon=max_epsilon,
                          alice=sha256(ALICE_TOKEN), bob=sha256(BOB_TOKEN),
                          scheduler=f"scheduler = {scheduler}" if scheduler else "")
    if owner:
        text += f'\n[server]\nowner_token_sha256 = "{sha256(OWNER_TOKEN)}"\n'
    return text


def token_engine(directory: Path, url: str, **overrides: Any) -> Engine:
    """An engine on ``url`` whose policy has the test tokens."""
    path = directory / f"policy-{time.monotonic_ns()}.toml"
    path.write_text(policy_with_tokens(url, **overrides))
    return Engine(load_policy(path))


class ServerThread:
    """uvicorn serving an app on 127.0.0.1 (a free port) in a background thread."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.server = rest_server(app, "127.0.0.1", 0, log_level="warning")
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)
        self.url = ""

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(15)

    @property
    def engine(self) -> Engine:
        return self.app.state.engine

    def client(self, token: str | None = None, **kwargs: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60, **kwargs)


def serve_engine(engine: Engine, **app_options: Any) -> ServerThread:
    """A started server for ``engine`` (use as a context manager)."""
    return ServerThread(create_app(engine, **app_options))
