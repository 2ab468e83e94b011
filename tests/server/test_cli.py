"""`chorus passwd` and `chorus serve` as real subprocesses: right after `chorus demo`, the demo
analyst logs in with password "demo" (what `psql postgresql://demo:demo@127.0.0.1:6432/demo`
does, on a free port here)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from chorus_py.demo import generate_demo
from server.pgwire.scram import verify_password
from tests.conftest import free_port

CHORUS = Path(sys.executable).parent / "chorus"



def test_passwd() -> None:
    out = subprocess.run([str(CHORUS), "passwd"], input="correct horse\n", capture_output=True,
                         text=True, timeout=60, check=True)
    verifier = out.stdout.strip()
    assert verify_password(verifier, "correct horse")
    assert "correct horse" not in out.stdout + out.stderr
    empty = subprocess.run([str(CHORUS), "passwd"], input="\n", capture_output=True, text=True,
                           timeout=60, check=False)
    assert empty.returncode == 2


def test_serve_the_demo(tmp_path: Path) -> None:
    policy = generate_demo(tmp_path, rows=2000)
    port = free_port()
    proc = subprocess.Popen([str(CHORUS), "serve", "--policy", str(policy), "--listen",
                             f"127.0.0.1:{port}", "--rest", f"127.0.0.1:{free_port()}"],
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.2)
        url = f"postgresql://demo:demo@127.0.0.1:{port}/demo?sslmode=prefer"
        with psycopg.connect(url, autocommit=True) as con:
            (n,) = con.execute("SELECT COUNT(*) FROM trips").fetchone()
            assert isinstance(n, int)
        if shutil.which("psql"):
            out = subprocess.run(["psql", "-X", "-c", "SELECT city, COUNT(*) FROM trips "
                                  "GROUP BY city", url], capture_output=True, text=True,
                                 timeout=60, check=False, env={**os.environ})
            assert out.returncode == 0 and "(5 rows)" in out.stdout, out.stderr
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(url.replace("demo:demo", "demo:wrong"))
    finally:
        proc.terminate()
        proc.wait(20)
    assert proc.returncode == 0 or proc.returncode == -15


@pytest.mark.parametrize("door", ["--listen", "--rest"])
def test_serve_names_the_address_it_cannot_listen_on(tmp_path: Path, door: str) -> None:
    """A port already taken: the error names that front door's address and option, never the
    other one's (a taken REST port used to be reported as the wire protocol's)."""
    policy = generate_demo(tmp_path, rows=200)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = f"127.0.0.1:{taken.getsockname()[1]}"
        free = f"127.0.0.1:{free_port()}"
        addresses = {"--listen": busy, "--rest": free} if door == "--listen" else {
            "--listen": free, "--rest": busy}
        out = subprocess.run([str(CHORUS), "serve", "--policy", str(policy),
                              *(x for kv in addresses.items() for x in kv)],
                             capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 1, out.stderr
    kind = "Postgres wire protocol" if door == "--listen" else "REST API and dashboard"
    assert f"error: cannot listen on {busy} ({kind}): Address already in use" in out.stderr
    assert f"choose another address with {door} HOST:PORT" in out.stderr
    assert ("--rest ''" in out.stderr) == (door == "--rest")
    assert "Traceback" not in out.stderr


def test_serve_with_an_unreadable_certificate(tmp_path: Path) -> None:
    """A [server] tls_cert that is not there is a policy error naming the keys, not a failure
    to listen."""
    policy = generate_demo(tmp_path, rows=200)
    text = policy.read_text()
    assert text.count("\n[server]\n") == 1
    policy.write_text(text.replace("\n[server]\n", '\n[server]\ntls_cert = "missing.pem"\n'
                                                  'tls_key = "missing.key"\n'))
    out = subprocess.run([str(CHORUS), "serve", "--policy", str(policy), "--listen",
                          f"127.0.0.1:{free_port()}", "--rest", ""],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 1, out.stderr
    assert "[server] tls_cert / tls_key: cannot load" in out.stderr
    assert "missing.pem" in out.stderr and "cannot listen" not in out.stderr
    assert "Traceback" not in out.stderr
