"""The garbage collector's settings (server.heap): a real `chorus serve` freezes its start and
raises the young generation's threshold, and says so in its log; `CHORUS_GC=default` keeps
CPython's; the engine alone (a library in its host's process) changes neither."""

from __future__ import annotations

import gc
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chorus_py.clients.dbapi import connect
from chorus_py.demo import generate_demo
from chorus_py.engine import Engine
from tests.conftest import free_port

CHORUS = Path(sys.executable).parent / "chorus"



def _serve_log(policy: Path, **env: str) -> str:
    """Start `chorus serve` (wire protocol only), wait until it listens, stop it: its log."""
    port = free_port()
    proc = subprocess.Popen([str(CHORUS), "serve", "--policy", str(policy), "--listen",
                             f"127.0.0.1:{port}", "--rest", "", "--pid-file", ""],
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **env})
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.2)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    return err


@pytest.mark.parametrize(("setting", "gen0", "ignored"), [
    ("", 10_000, False), ("freeze", 700, False), ("freez", 10_000, True)])
def test_serve_freezes_its_start(tmp_path: Path, setting: str, gen0: int,
                                 ignored: bool) -> None:
    """As shipped: frozen, the young generation's threshold 10,000; ``CHORUS_GC=freeze``:
    frozen, CPython's thresholds; a value that is no setting: said so, the shipped one."""
    policy = generate_demo(tmp_path, rows=200)
    log = _serve_log(policy, CHORUS_GC=setting)
    found = re.search(r"garbage collector: (\d+) objects of the start frozen \(gc\.freeze\), "
                      r"thresholds (\d+)/10/10", log)
    assert found, log
    assert int(found[1]) > 10_000  # the modules and the engine: far more than a few objects
    assert int(found[2]) == gen0
    assert ("CHORUS_GC='freez' is not a setting: ignored" in log) == ignored, log


def test_serve_keeps_cpython_settings_when_asked(tmp_path: Path) -> None:
    policy = generate_demo(tmp_path, rows=200)
    log = _serve_log(policy, CHORUS_GC="default")
    assert "garbage collector: CPython's settings (CHORUS_GC=default)" in log, log
    assert "frozen" not in log


def test_the_engine_alone_leaves_the_collector(tmp_path: Path) -> None:
    """A library must not change its host's process-wide settings: building, warming up and
    querying an engine, or querying through the DB-API, leaves the freeze count and the
    thresholds as they were."""
    policy = generate_demo(tmp_path, rows=200)
    frozen, thresholds = gc.get_freeze_count(), gc.get_threshold()
    with Engine.from_policy(policy) as engine:
        engine.warm_up(wait=True)
        engine.execute("SELECT COUNT(*) FROM trips", analyst="demo", epsilon=0.1)
    with connect(policy=policy, analyst="demo", epsilon=0.1) as con:
        con.cursor().execute("SELECT SUM(fare) FROM trips")
    assert (gc.get_freeze_count(), gc.get_threshold()) == (frozen, thresholds)
