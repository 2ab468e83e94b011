"""The other DP SQL tools' side of ``benchmarks.peers``: SmartNoise SQL and Qrlew in their own
interpreter (the ``.venv-peers`` virtual environment: pyqrlew pins numpy 1.26, chorus needs 2).

    .venv-peers/bin/python benchmarks/peer_worker.py      # started by benchmarks.peers

Reads one JSON request per line on stdin and answers one JSON line on stdout:

- ``{"op": "setup", "url": ..., "smartnoise": {...}, "qrlew": {...}}``: connect to the database
  and build what each tool needs once (SmartNoise's reader metadata, Qrlew's dataset from the
  database's catalog); answers the tools' versions.
- ``{"op": "run", "tool": "smartnoise" | "qrlew", "sql": ...}``: one DP query, timed here
  around the tool's own call (not the pipe): SmartNoise's ``reader.execute``; for Qrlew the
  relation from the SQL, its rewrite with differential privacy, the rendered SQL run on the
  database and fetched (end to end, as chorus's ``Engine.execute``).  Answers ``ms``, ``ok``,
  the first result row as strings, or the error's first line.
- ``{"op": "quit"}``.

Imports only the standard library and the peers' packages, never chorus's code: it must run
in an interpreter where chorus cannot be installed.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from importlib import metadata
from typing import Any


def first_line(err: BaseException) -> str:
    """The error's type and first non-empty line of its message (Rust panics included)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0] if lines else '(no message)'}"[:300]


class Peers:
    """Connections and per-tool state, built by ``setup``."""

    def __init__(self, request: dict[str, Any]) -> None:
        import psycopg2
        import pyqrlew
        import snsql
        import sqlalchemy

        self.url: str = request["url"]
        self.timeout_ms = int(request.get("timeout_seconds", 60) * 1000)
        self.sn_settings: dict[str, Any] = request["smartnoise"]
        self.qr_settings: dict[str, Any] = request["qrlew"]
        # One connection per tool, autocommit (SmartNoise and the Qrlew SQL only read), each
        # with a statement timeout so that a runaway rewrite cannot stall the run.
        self.sn_con = psycopg2.connect(self.url)
        self.sn_con.autocommit = True
        self.qr_con = psycopg2.connect(self.url)
        self.qr_con.autocommit = True
        for con in (self.sn_con, self.qr_con):
            with con.cursor() as cur:
                cur.execute(f"SET statement_timeout = {self.timeout_ms}")
        self.snsql = snsql
        self.readers: dict[str, Any] = {}  # sql -> a reader whose epsilon makes the query's
        self.spent: dict[str, tuple[float, float]] = {}  # ... total (epsilon, delta) the policy's
        # Qrlew reads the schema from the database's catalog (ranges=False: no min/max read
        # from the data, numeric ranges unbounded), then gets the policy's bounds and public
        # values declared on top.
        engine = sqlalchemy.create_engine(
            self.url.replace("postgresql://", "postgresql+psycopg2://", 1))
        dataset = pyqrlew.Dataset.from_database(
            "demo", engine, schema_name=self.qr_settings["schema"], ranges=False)
        for table, column, lower, upper in self.qr_settings["ranges"]:
            dataset = dataset.with_range(self.qr_settings["schema"], table, column,
                                         float(lower), float(upper))
        for table, column, values in self.qr_settings["possible_values"]:
            dataset = dataset.with_possible_values(self.qr_settings["schema"], table, column,
                                                   values)
        engine.dispose()
        self.dataset = dataset
        self.privacy_unit = [(t, [tuple(step) for step in path], unit)
                             for t, path, unit in self.qr_settings["privacy_unit"]]

    # -- SmartNoise ------------------------------------------------------------------------

    def reader(self, sql: str) -> Any:
        """A SmartNoise reader for ``sql`` whose total cost is the settings' epsilon and delta.

        SmartNoise's ``Privacy(epsilon)`` is spent by each mechanism of the query (every
        aggregate, and the count of units that censors rare groups); its odometer adds them
        up (``get_privacy_cost``).  Chorus and Qrlew take the query's total, so the
        per-mechanism epsilon and delta are scaled down until the odometer's total is the
        policy's.  Done once per query text, outside the timing."""
        if sql in self.readers:
            return self.readers[sql]
        s = self.sn_settings
        epsilon, delta = float(s["epsilon"]), float(s["delta"])
        reader = self.snsql.from_connection(
            self.sn_con, engine="postgres", metadata=s["metadata"],
            privacy=self.snsql.Privacy(epsilon=epsilon, delta=delta))
        cost_epsilon, cost_delta = reader.get_privacy_cost([sql])
        if cost_epsilon > 0:
            reader.privacy.epsilon = epsilon * epsilon / cost_epsilon
        if cost_delta > 0:
            reader.privacy.delta = delta * delta / cost_delta
        self.spent[sql] = tuple(reader.get_privacy_cost([sql]))
        self.readers[sql] = reader
        return reader

    def smartnoise(self, sql: str) -> tuple[float, list[Any]]:
        reader = self.reader(sql)
        started = time.perf_counter()
        rows = reader.execute(sql)
        ms = (time.perf_counter() - started) * 1000
        return ms, (list(rows[1]) if len(rows) > 1 else [])  # rows[0]: the column names

    # -- Qrlew -----------------------------------------------------------------------------

    def qrlew(self, sql: str) -> tuple[float, list[Any]]:
        s = self.qr_settings
        started = time.perf_counter()
        relation = self.dataset.relation(sql)
        private = relation.rewrite_with_differential_privacy(
            self.dataset, self.privacy_unit,
            {"epsilon": float(s["epsilon"]), "delta": float(s["delta"])},
            max_multiplicity=float(s["max_multiplicity"]))
        text = private.relation().to_query()
        with self.qr_con.cursor() as cur:
            cur.execute(text)
            rows = cur.fetchall()
        ms = (time.perf_counter() - started) * 1000
        return ms, (list(rows[0]) if rows else [])


def versions() -> dict[str, str]:
    out = {}
    for name in ("smartnoise-sql", "pyqrlew", "opendp", "numpy", "psycopg2-binary",
                 "SQLAlchemy"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    out["python"] = sys.version.split()[0]
    return out


def answer(peers: Peers | None, request: dict[str, Any]) -> tuple[Peers | None, dict[str, Any]]:
    op = request.get("op")
    if op == "setup":
        started = time.perf_counter()
        peers = Peers(request)
        return peers, {"ok": True, "versions": versions(),
                       "ms": (time.perf_counter() - started) * 1000}
    if op == "run":
        if peers is None:
            return peers, {"ok": False, "error": "no setup"}
        tool, sql = request["tool"], request["sql"]
        try:
            ms, row = peers.smartnoise(sql) if tool == "smartnoise" else peers.qrlew(sql)
        except BaseException as err:  # Rust panics (pyo3) are BaseExceptions
            if isinstance(err, KeyboardInterrupt):
                raise
            return peers, {"ok": False, "error": first_line(err)}
        reply: dict[str, Any] = {"ok": True, "ms": ms, "row": [str(v) for v in row]}
        if tool == "smartnoise":
            reply["spent"] = peers.spent.get(sql)
        return peers, reply
    return peers, {"ok": False, "error": f"unknown op {op!r}"}


def main() -> None:
    peers: Peers | None = None
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        if request.get("op") == "quit":
            break
        try:
            peers, reply = answer(peers, request)
        except Exception as err:  # setup failures: reported, the parent decides
            reply = {"ok": False, "error": first_line(err),
                     "traceback": traceback.format_exc()[-2000:]}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
