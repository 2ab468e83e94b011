"""Deployment: docker-compose.yml against the compose specification, the Dockerfile, and the
commands they run, run here for real (no Docker engine on these machines).

- ``docker-compose.yml`` validates against the compose-spec JSON schema that check-jsonschema
  ships (``vendor/compose-spec.json``), and has the services, ports, health checks, start order
  and policy mount the deployment needs.
- The proxy's command (``chorus serve ...``) runs as a subprocess with only the policy path and
  the listen addresses changed; the compose health check command passes against it; the REST
  port answers a query and the wire port accepts connections; SIGTERM stops it cleanly.
- The demo loader's command parses with the CLI (``chorus demo`` itself is tested in
  tests/test_demo.py and tests/test_cli.py), and the mounted policy is the demo policy for the
  compose Postgres.
"""

from __future__ import annotations

import importlib.resources
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import jsonschema
import pytest
import yaml

from chorus_py.cli import main as cli
from chorus_py.demo import render_policy
from chorus_py.policy import load_policy, parse_policy
from tests.rest.harness import ALICE_TOKEN, policy_with_tokens

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
DOCKER_POLICY_NOTE = "docker-compose.yml: the password comes from PGPASSWORD (POSTGRES_PASSWORD)."


def _compose_schema() -> dict:
    vendor = importlib.resources.files("check_jsonschema.builtin_schemas.vendor")
    return json.loads((vendor / "compose-spec.json").read_text())


def _dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), " ".join(rest.split())))
    return out


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_compose_file_follows_the_compose_specification() -> None:
    schema = _compose_schema()
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = sorted(validator.iter_errors(COMPOSE), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)
    # the schema is strict about unknown keys: a typo is caught
    broken = json.loads(json.dumps(COMPOSE))
    broken["services"]["proxy"]["healthcheck"]["intervall"] = "5s"
    assert list(validator.iter_errors(broken))


def test_compose_services() -> None:
    services = COMPOSE["services"]
    assert set(services) == {"postgres", "demo-data", "proxy"}
    postgres, loader, proxy = services["postgres"], services["demo-data"], services["proxy"]
    assert postgres["healthcheck"]["test"][:2] == ["CMD", "pg_isready"]
    assert proxy["healthcheck"]["test"][0] == "CMD"
    assert loader["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert proxy["depends_on"] == {"postgres": {"condition": "service_healthy"},
                                   "demo-data": {"condition": "service_completed_successfully"}}
    ports = {p.split(":")[-1] for p in proxy["ports"]}
    assert ports == {"6432", "8000"}
    assert all(p.startswith("127.0.0.1:") for p in proxy["ports"])  # loopback by default
    assert loader["build"] == proxy["build"] == "." and loader["image"] == proxy["image"]
    # the policy is mounted read-only from a file of the repository, over the ledger volume
    mounts = {m["target"]: m for m in proxy["volumes"]}
    policy_mount = mounts[_option(proxy["command"], "--policy")]
    assert policy_mount["type"] == "bind" and policy_mount["read_only"] is True
    assert (ROOT / policy_mount["source"]).is_file()
    ledger = mounts[str(Path(policy_mount["target"]).parent)]
    assert ledger["type"] == "volume" and ledger["source"] in COMPOSE["volumes"]


def _option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_mounted_policy_is_the_demo_policy_for_the_compose_postgres() -> None:
    proxy = COMPOSE["services"]["proxy"]
    source = next(m["source"] for m in proxy["volumes"] if m["type"] == "bind")
    text = (ROOT / source).read_text()
    mounted = tomllib.loads(text)
    parse_policy(mounted, source)  # a valid policy
    url = mounted["backend"]["url"]
    parts = urlsplit(url)
    assert parts.hostname == "postgres"  # the compose service
    assert parts.path == "/" + COMPOSE["services"]["postgres"]["environment"]["POSTGRES_DB"]
    assert parts.password is None  # it comes from PGPASSWORD
    assert "PGPASSWORD" in proxy["environment"]
    loader = COMPOSE["services"]["demo-data"]
    assert _option(loader["command"], "--backend") == url  # the data goes where the proxy looks
    assert "PGPASSWORD" in loader["environment"]
    # It describes the demo data, with the demo credentials.  (Regenerate it after changing the
    # demo template: python -c "from chorus_py.demo import render_policy; open(
    # 'examples/docker-policy.toml', 'w').write(render_policy(URL, NOTE))" with this file's URL
    # and DOCKER_POLICY_NOTE.)
    demo = tomllib.loads(render_policy(url, DOCKER_POLICY_NOTE))
    for section in ("tables", "analysts", "server"):
        assert mounted[section] == demo[section], f"{source}: [{section}] differs from the demo"
    assert mounted["analysts"]["demo"]["token_sha256"]
    assert mounted["server"]["owner_token_sha256"]


@pytest.mark.parametrize("service", ["demo-data", "proxy"])
def test_commands_parse_with_the_cli(service: str) -> None:
    args = COMPOSE["services"][service]["command"]
    command = cli.commands[args[0]]
    ctx = command.make_context(args[0], list(args[1:]))  # unknown options would fail here
    assert ctx.params


def test_dockerfile() -> None:
    instructions = _dockerfile()
    first = instructions[0]
    assert first[0] == "FROM" and first[1].startswith("python:3.11")
    copied = {args.split()[0] for word, args in instructions if word == "COPY"}
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"]["find"]["include"]
    assert {p.rstrip("*") for p in packages} <= copied  # every package goes into the image
    assert {"pyproject.toml", "README.md"} <= set(
        next(a for w, a in instructions if w == "COPY").split()[:-1])
    assert any(w == "RUN" and "pip install ." in a for w, a in instructions)
    assert ("EXPOSE", "6432 8000") in instructions
    assert ("ENTRYPOINT", '["chorus"]') in instructions
    cmd = json.loads(next(a for w, a in instructions if w == "CMD"))
    assert cmd == COMPOSE["services"]["proxy"]["command"]
    healthcheck = next(a for w, a in instructions if w == "HEALTHCHECK")
    exec_form = json.loads(healthcheck[healthcheck.index("CMD ") + 4:])
    assert ["CMD", *exec_form] == COMPOSE["services"]["proxy"]["healthcheck"]["test"]
    assert any(w == "USER" and a != "root" for w, a in instructions)


def _chorus() -> str:
    exe = Path(sys.executable).with_name("chorus")
    return str(exe) if exe.exists() else shutil.which("chorus") or "chorus"


def test_the_proxy_command_runs(duckdb_data: str, tmp_path: Path) -> None:
    """`chorus serve` exactly as compose runs it, but on loopback ports and a test policy."""
    database = tmp_path / "demo.duckdb"  # a copy: DuckDB lets one process open a file
    shutil.copyfile(duckdb_data.removeprefix("duckdb:///"), database)
    policy = tmp_path / "policy.toml"
    policy.write_text(policy_with_tokens(f"duckdb:///{database}"))
    load_policy(policy)
    wire, rest = _free_port(), _free_port()
    proxy = COMPOSE["services"]["proxy"]
    args = [_chorus(), *proxy["command"]]
    args[args.index(_option(args, "--policy"))] = str(policy)
    args[args.index(_option(args, "--listen"))] = f"127.0.0.1:{wire}"
    args[args.index(_option(args, "--rest"))] = f"127.0.0.1:{rest}"
    healthcheck = [a.replace(":8000/", f":{rest}/") for a in proxy["healthcheck"]["test"][1:]]
    # the health check fails while nothing listens
    assert subprocess.run(healthcheck, capture_output=True, timeout=30).returncode != 0
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               cwd=tmp_path, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{rest}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None, process.communicate()[1].decode()
            assert time.monotonic() < deadline, "chorus serve did not come up"
            time.sleep(0.2)
        check = subprocess.run(healthcheck, capture_output=True, timeout=30)
        assert check.returncode == 0, (shlex.join(healthcheck), check.stderr)
        answer = httpx.post(f"http://127.0.0.1:{rest}/v1/query",
                            headers={"Authorization": f"Bearer {ALICE_TOKEN}"},
                            json={"sql": "SELECT COUNT(*) FROM trips"}, timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json()["report"]["charged"] is True
        with socket.create_connection(("127.0.0.1", wire), timeout=10):
            pass  # the wire protocol listens too
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            _, err = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            _, err = process.communicate()
    assert process.returncode == 0, err.decode()
    assert "REST API on" in err.decode() and "dashboard" in err.decode()
