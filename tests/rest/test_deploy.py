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
- Least privilege, on the local Postgres for real: the init SQL (deploy/postgres/roles.sql)
  and the grants service's exact psql command make a proxy role that can SELECT the policy's
  tables and nothing else (no write, no DDL outside its schema, no undeclared table) and a
  public reader that sees the public table only; the loader's exact command loads the demo once
  and leaves the tables alone on the next start; an engine on the mounted policy starts on
  those roles with no least-privilege warning.
- Pins: every image names a patch release, and deploy/constraints.txt pins every runtime
  dependency at the version these tests run.
"""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import jsonschema
import psycopg
import pytest
import yaml
from click.testing import CliRunner
from packaging.markers import default_environment
from packaging.requirements import Requirement

from chorus_py.cli import main as cli
from chorus_py.demo import DEMO_TABLES, render_policy
from chorus_py.engine import Engine
from chorus_py.policy import load_policy, parse_policy
from tests.conftest import free_port
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
    assert set(services) == {"postgres", "demo-data", "db-grants", "proxy"}
    postgres, loader, proxy = services["postgres"], services["demo-data"], services["proxy"]
    grants = services["db-grants"]
    assert postgres["healthcheck"]["test"][:2] == ["CMD", "pg_isready"]
    assert proxy["healthcheck"]["test"][0] == "CMD"
    assert loader["healthcheck"] == {"disable": True}  # a one-off job, not the proxy
    assert loader["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert grants["depends_on"] == {"demo-data": {"condition": "service_completed_successfully"}}
    assert proxy["depends_on"] == {"postgres": {"condition": "service_healthy"},
                                   "db-grants": {"condition": "service_completed_successfully"}}
    # The roles are made when the database is created, by the init script of the postgres image.
    init = {m["target"]: m for m in postgres["volumes"] if isinstance(m, dict)}
    assert init["/docker-entrypoint-initdb.d"]["read_only"] is True
    assert (ROOT / init["/docker-entrypoint-initdb.d"]["source"] / "10-chorus-roles.sh").is_file()
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
    # Least privilege: the proxy is chorus_proxy, public queries chorus_public_reader, and the
    # proxy's password is not the superuser's.
    assert parts.username == "chorus_proxy"
    public = urlsplit(mounted["backend"]["public_url"])
    assert (public.username, public.hostname, public.path) == ("chorus_public_reader",
                                                               "postgres", parts.path)
    assert "CHORUS_DB_PASSWORD" in proxy["environment"]["PGPASSWORD"]
    assert "POSTGRES_PASSWORD" not in proxy["environment"]["PGPASSWORD"]
    loader = COMPOSE["services"]["demo-data"]
    loaded = urlsplit(_option(loader["command"], "--backend"))
    assert (loaded.username, loaded.hostname, loaded.path) == ("postgres", "postgres", parts.path)
    assert "POSTGRES_PASSWORD" in loader["environment"]["PGPASSWORD"]
    # It describes the demo data, with the demo credentials.  (Regenerate it after changing the
    # demo template: python -c "from chorus_py.demo import render_policy; open(
    # 'examples/docker-policy.toml', 'w').write(render_policy(URL, NOTE))" with this file's URL
    # and DOCKER_POLICY_NOTE.)
    demo = tomllib.loads(render_policy(url, DOCKER_POLICY_NOTE))
    for section in ("tables", "analysts", "server"):
        assert mounted[section] == demo[section], f"{source}: [{section}] differs from the demo"
    assert mounted["analysts"]["demo"]["token_sha256"]
    assert mounted["server"]["owner_token_sha256"]


@pytest.mark.parametrize("service", ["demo-data", "proxy"])  # db-grants runs psql
def test_commands_parse_with_the_cli(service: str) -> None:
    args = COMPOSE["services"][service]["command"]
    command = cli.commands[args[0]]
    ctx = command.make_context(args[0], list(args[1:]))  # unknown options would fail here
    assert ctx.params


def test_dockerfile() -> None:
    instructions = _dockerfile()
    first = instructions[0]
    assert first[0] == "FROM" and re.fullmatch(r"python:3\.11\.\d+-slim-\w+", first[1])
    copied = {args.split()[0] for word, args in instructions if word == "COPY"}
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"]["find"]["include"]
    assert {p.rstrip("*") for p in packages} <= copied  # every package goes into the image
    assert {"pyproject.toml", "README.md"} <= set(
        next(a for w, a in instructions if w == "COPY").split()[:-1])
    assert any(w == "RUN" and "pip install --constraint deploy/constraints.txt ." in a
               for w, a in instructions)
    assert "deploy/constraints.txt" in copied
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
    wire, rest = free_port(), free_port()
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


# -- pins -------------------------------------------------------------------------------------
def runtime_pins() -> dict[str, str]:
    """Every runtime dependency of chorus-py (with its extras, markers for this platform) and
    theirs, at the version installed here."""
    env = default_environment()
    pins: dict[str, str] = {}
    done: set[tuple[str, frozenset[str]]] = set()
    todo = [(Requirement(r), "") for r in importlib.metadata.requires("chorus-py") or []]
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({**env, "extra": extra}):
            continue
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        if (name, frozenset(req.extras)) in done:
            continue
        done.add((name, frozenset(req.extras)))
        dist = importlib.metadata.distribution(req.name)
        pins[name] = dist.version
        for sub in dist.requires or []:
            todo += [(Requirement(sub), e) for e in ("", *req.extras)]
    return dict(sorted(pins.items()))


def _constraints() -> dict[str, str]:
    lines = (ROOT / "deploy" / "constraints.txt").read_text().splitlines()
    pairs = [line.split("==") for line in lines if line.strip() and not line.startswith("#")]
    return {name: version for name, version in pairs}


def test_images_and_dependencies_are_pinned() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    for name, service in COMPOSE["services"].items():
        image = service["image"]
        if "build" in service:
            assert image == f"chorus-py:{version}", name  # built here, named by its version
        else:  # a patch release, never a moving tag
            assert re.fullmatch(r"postgres:\d+\.\d+-\w+", image), (name, image)
    pinned = _constraints()
    assert pinned == runtime_pins(), "deploy/constraints.txt differs from the tested versions"
    assert {"sqlglot", "duckdb", "psycopg", "psycopg-binary", "fastapi", "pydantic"} <= set(pinned)


# -- least privilege, for real ------------------------------------------------------------------
@pytest.fixture
def compose_database(postgres_url: str) -> Iterator[tuple[str, dict[str, str]]]:
    """A fresh database with deploy/postgres/roles.sql run in it by psql (as the init script
    runs it), under role names of its own (roles are shared by the whole cluster)."""
    if shutil.which("psql") is None:
        pytest.skip("psql is not installed")
    suffix = os.urandom(4).hex()
    roles = {"chorus_proxy": f"chorus_proxy_{suffix}",
             "chorus_public_reader": f"chorus_public_reader_{suffix}"}
    admin = postgres_url.rsplit("/", 1)[0]
    name = f"chorus_compose_{suffix}"
    with psycopg.connect(postgres_url, autocommit=True) as con:
        con.execute(f'CREATE DATABASE "{name}"')
    url = f"{admin}/{name}"
    try:
        _psql(url, _renamed(ROOT / "deploy" / "postgres" / "roles.sql", roles),
              "-v", "db_password=test-password")
        yield url, roles
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as con:
            con.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            for role in roles.values():
                con.execute(f'DROP ROLE IF EXISTS "{role}"')


def _renamed(path: Path, roles: dict[str, str]) -> str:
    text = path.read_text()
    for old, new in roles.items():
        text = text.replace(old, new)
    return text


def _psql(url: str, script: str, *args: str) -> str:
    done = subprocess.run(["psql", "-X", "-v", "ON_ERROR_STOP=1", *args, "-d", url, "-f", "-"],
                          input=script, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _as(url: str, role: str) -> str:
    parts = urlsplit(url)
    return parts._replace(netloc=f"{role}@{parts.netloc.rsplit('@', 1)[-1]}").geturl()


def _refused(url: str, sql: str) -> bool:
    with psycopg.connect(url, autocommit=True) as con:
        try:
            con.execute(sql)
        except psycopg.errors.InsufficientPrivilege:
            return True
    return False


def _oids(url: str) -> dict[str, int]:
    with psycopg.connect(url) as con:
        return {t: con.execute("SELECT %s::regclass::oid", [t]).fetchone()[0]
                for t in DEMO_TABLES}


@pytest.mark.postgres
def test_the_compose_database_setup_is_least_privilege(
        compose_database: tuple[str, dict[str, str]], tmp_path: Path) -> None:
    url, roles = compose_database
    services = COMPOSE["services"]
    # The loader's command, on this database with fewer rows: loads once, then leaves it alone.
    args = list(services["demo-data"]["command"])
    args[args.index(_option(args, "--backend"))] = url
    args[args.index(_option(args, "--rows"))] = "3000"
    args[args.index(_option(args, "--dir"))] = str(tmp_path / "demo")
    first = CliRunner().invoke(cli, args)
    assert first.exit_code == 0, first.output
    loaded = _oids(url)
    again = CliRunner().invoke(cli, args)
    assert again.exit_code == 0 and "nothing loaded" in again.output
    assert _oids(url) == loaded  # not dropped and made again
    with psycopg.connect(url, autocommit=True) as con:
        con.execute("TRUNCATE riders CASCADE")  # a load cut short: loaded again in full
    assert CliRunner().invoke(cli, args).exit_code == 0
    assert _oids(url)["trips"] != loaded["trips"]
    # The grants service's psql command, twice (every start): idempotent.
    grants = services["db-grants"]["command"]
    assert grants[:3] == ["psql", "-v", "ON_ERROR_STOP=1"]
    assert _option(grants, "-f") == "/chorus/grants.sql"
    script = _renamed(ROOT / "deploy" / "postgres" / "grants.sql", roles)
    for _ in range(2):
        _psql(url, script)
    proxy, reader = _as(url, roles["chorus_proxy"]), _as(url, roles["chorus_public_reader"])
    with psycopg.connect(url, autocommit=True) as con:
        con.execute("CREATE TABLE secrets (x int)")  # a table the policy does not declare
    for table in DEMO_TABLES:
        with psycopg.connect(proxy) as con:
            con.execute(f"SELECT 1 FROM {table} LIMIT 1")  # reads every declared table
        assert _refused(proxy, f"DELETE FROM {table}")
        assert _refused(proxy, f"TRUNCATE {table}")
    assert _refused(proxy, "INSERT INTO cities SELECT * FROM cities LIMIT 1")
    assert _refused(proxy, "UPDATE trips SET fare = 0")
    assert _refused(proxy, "SELECT * FROM secrets")
    assert _refused(proxy, "CREATE TABLE public.mine (x int)")
    assert _refused(proxy, "ALTER TABLE trips ADD COLUMN y int")
    with psycopg.connect(proxy, autocommit=True) as con:  # its own schema: it writes there
        con.execute("CREATE TABLE chorus_private.kept (x int); DROP TABLE chorus_private.kept")
        assert con.execute("SELECT rolsuper, rolcreatedb, rolcreaterole FROM pg_roles WHERE "
                           "rolname = current_user").fetchone() == (False, False, False)
    with psycopg.connect(reader) as con:
        assert con.execute("SELECT COUNT(*) FROM cities").fetchone()[0] > 0
    for table in set(DEMO_TABLES) - {"cities"} | {"secrets"}:
        assert _refused(reader, f"SELECT 1 FROM {table}"), table
    # The proxy on the mounted policy, pointed at these roles: starts with no warning, answers.
    with psycopg.connect(url, autocommit=True) as con:
        con.execute("DROP TABLE secrets")
    source = next(m["source"] for m in services["proxy"]["volumes"] if m["type"] == "bind")
    text = (ROOT / source).read_text()
    compose_url = tomllib.loads(text)["backend"]["url"]
    text = text.replace(compose_url, proxy).replace(
        tomllib.loads(text)["backend"]["public_url"], reader)
    text = text.replace('ledger = "sqlite:///budget.sqlite3"', 'ledger = "memory"')
    policy = tmp_path / "policy.toml"
    policy.write_text(text)
    engine = Engine.from_policy(policy)
    try:
        assert engine.backend.warnings == ()
        assert engine.execute("SELECT COUNT(*) FROM trips", epsilon=1.0).report.charged
        assert engine.execute("SELECT COUNT(*) FROM cities").rows[0][0] == 5
    finally:
        engine.close()


if __name__ == "__main__":
    if sys.argv[1:] == ["--constraints"]:
        print((ROOT / "deploy" / "constraints.txt").read_text().split("\n\n")[0].rstrip())
        print()
        for package, pinned in runtime_pins().items():
            print(f"{package}=={pinned}")
