"""Reload without restart (issue 21 part 3), on a real `chorus serve` subprocess over Postgres:
an open psycopg session survives reloads; a revoked REST token stops working and its
replacement works at once; a new analyst logs in; a policy that fails validation, or changes
what needs a restart, is refused and the old one keeps serving."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from server.pgwire.scram import make_verifier
from tests.conftest import free_port

CHORUS = Path(sys.executable).parent / "chorus"
pytestmark = pytest.mark.postgres



def chorus(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CHORUS), *args], capture_output=True, text=True, timeout=60,
                          check=False)


class Served:
    """A running `chorus serve`: its ports and everything it printed on stderr so far."""

    def __init__(self, policy: Path, *options: str) -> None:
        self.policy, self.wire, self.rest = policy, free_port(), free_port()
        self.proc = subprocess.Popen(
            [str(CHORUS), "serve", "--policy", str(policy), "--listen",
             f"127.0.0.1:{self.wire}", "--rest", f"127.0.0.1:{self.rest}", *options],
            stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.wait_for("budget dashboard")

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    def wait_for(self, text: str, after: int = 0, timeout: float = 60) -> str:
        deadline = time.time() + timeout
        while time.time() < deadline:
            for line in self.lines[after:]:
                if text in line:
                    return line
            assert self.proc.poll() is None, "".join(self.lines)
            time.sleep(0.05)
        raise AssertionError(f"{text!r} not printed; stderr: {''.join(self.lines)}")

    def reload(self, expect: str) -> str:
        """`chorus reload`, then the outcome line the server prints."""
        mark = len(self.lines)
        done = chorus("reload", "--policy", str(self.policy))
        assert done.returncode == 0, done.stderr
        return self.wait_for(expect, after=mark)

    def rest_status(self, token: str) -> int:
        return httpx.get(f"http://127.0.0.1:{self.rest}/v1/info",
                         headers={"Authorization": f"Bearer {token}"}, timeout=30).status_code

    def url(self, user: str, password: str) -> str:
        return f"postgresql://{user}:{password}@127.0.0.1:{self.wire}/chorus?sslmode=disable"


@pytest.fixture
def served(postgres_data: str, write_policy: Callable[..., Path]) -> Iterator[Served]:
    policy = write_policy(postgres_data)
    policy.write_text(policy.read_text().replace(
        "[analysts.alice]", f'[analysts.alice]\npassword = "{make_verifier("alice-pw")}"'))
    server = Served(policy)
    yield server
    server.proc.send_signal(signal.SIGTERM)
    server.proc.wait(30)
    assert not policy.with_name(f"{policy.stem}.pid").exists()  # removed on the way out


def _token(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_tokens_and_analysts_change_without_dropping_a_session(served: Served) -> None:
    first = _token(chorus("token", "add", "--policy", str(served.policy), "alice"))
    served.reload("changed: alice")
    assert served.rest_status(first) == 200
    with psycopg.connect(served.url("alice", "alice-pw"), autocommit=True) as session:
        assert session.execute("SELECT COUNT(*) FROM trips").fetchone() is not None
        # Rotation: a second token, both work; then the first is revoked.
        second = _token(chorus("token", "add", "--policy", str(served.policy), "alice"))
        served.reload("changed: alice")
        assert served.rest_status(first) == 200 and served.rest_status(second) == 200
        revoked = chorus("token", "revoke", "--policy", str(served.policy), "alice",
                         "--oldest", "--reload")
        assert revoked.returncode == 0, revoked.stderr
        served.wait_for("changed: alice", after=len(served.lines) - 1)
        deadline = time.time() + 10
        while served.rest_status(first) != 401 and time.time() < deadline:
            time.sleep(0.05)
        assert served.rest_status(first) == 401 and served.rest_status(second) == 200
        # A new analyst with a password logs in after the reload (and not before).
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(served.url("dora", "dora-pw"))
        with served.policy.open("a") as f:
            f.write(f'\n[analysts.dora]\npassword = "{make_verifier("dora-pw")}"\n')
        served.reload("added: dora")
        with psycopg.connect(served.url("dora", "dora-pw"), autocommit=True) as dora:
            assert dora.execute("SELECT COUNT(*) FROM trips").fetchone() is not None
        # The session opened before every reload still answers.
        assert session.execute("SELECT COUNT(*) FROM trips").fetchone() is not None


def test_a_policy_that_fails_validation_or_needs_a_restart_is_refused(served: Served) -> None:
    good = served.policy.read_text()
    with psycopg.connect(served.url("alice", "alice-pw"), autocommit=True) as session:
        # chorus reload checks the file first: nothing is sent to the server.
        served.policy.write_text(good.replace("max_epsilon_per_query = 0.5",
                                              "max_epsilon_per_query = -1"))
        refused = chorus("reload", "--policy", str(served.policy))
        assert refused.returncode == 1 and "max_epsilon_per_query" in refused.stderr
        # SIGHUP straight to the server (as `kill -HUP`): it keeps the old policy and says why.
        mark = len(served.lines)
        os.kill(served.proc.pid, signal.SIGHUP)
        line = served.wait_for("refused", after=mark)
        assert "old policy stays" in line and "max_epsilon_per_query" in line
        # A change to the data's side (bounds) takes a restart: refused, named.
        served.policy.write_text(good.replace("upper = 200", "upper = 300"))
        line = served.reload("refused")
        assert "tables changed, which takes a restart" in line
        served.policy.write_text(good.replace("epsilon_per_block = 1000.0",
                                              "epsilon_per_block = 2000.0"))
        assert "privacy.epsilon_per_block changed" in served.reload("refused")
        assert session.execute("SELECT COUNT(*) FROM trips").fetchone() is not None
        # Per-analyst limits are reloaded, and bind the session opened before.
        session.execute("SET chorus.epsilon = 0.4")
        assert session.execute("SELECT COUNT(*) FROM trips").fetchone() is not None
        served.policy.write_text(good.replace("[analysts.alice]", "[analysts.alice]\n"
                                              "max_epsilon_per_query = 0.2"))
        served.reload("changed: alice")
        with pytest.raises(psycopg.Error, match=r"above the per-query maximum 0\.2"):
            session.execute("SELECT COUNT(*) FROM trips")


def test_without_a_pid_file_sighup_still_reloads(postgres_data: str,
                                                 write_policy: Callable[..., Path]) -> None:
    policy = write_policy(postgres_data)
    server = Served(policy, "--pid-file", "")
    try:
        assert not policy.with_name(f"{policy.stem}.pid").exists()
        refused = chorus("reload", "--policy", str(policy))
        assert refused.returncode == 1 and "no process id" in refused.stderr
        policy.write_text(policy.read_text() + "\n[analysts.frank]\n")
        mark = len(server.lines)
        os.kill(server.proc.pid, signal.SIGHUP)
        server.wait_for("added: frank", after=mark)
    finally:
        server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(30)
