"""Chorus's default policy against the other DP SQL tools, SmartNoise SQL and Qrlew: end-to-end
DP / raw time per question of the analyst corpus, on the same Postgres database, machine and
run.  Writes the ``peers`` (``--questions corpus``) or ``peers-heldout`` section of
benchmarks/RESULTS.md.

    python -m benchmarks.peers --setup          # make .venv-peers (SmartNoise, Qrlew) and stop
    python -m benchmarks.peers [--questions corpus|heldout] [--rows 1000000] [--repeat 5]
                               [--timeout 60] [--postgres URL] [--database NAME] [--out FILE]

Issue 23's check: "a held-out rerun of the peer corpus measures the default's end-to-end ratio
(DP time / raw query time) against the other tools on the same machine in one run: it must be
the lowest of all".

1. The demo (``generate_demo``) at ``--rows`` trips in a Postgres database ``--database``
   created next to ``--postgres`` and dropped at the end (as ``benchmarks.corpus``).
2. Chorus: one engine on the demo's own policy (budget per block raised so no run exhausts
   it), warmed up as ``chorus serve`` starts; ``Engine.execute`` at the default epsilon.
3. The peers run in a worker process (``benchmarks/peer_worker.py``) in their own virtual
   environment, ``.venv-peers`` (pyqrlew pins numpy 1.26; chorus needs numpy 2), made by
   ``--setup`` or by the first run.  The worker times each tool's own call; the pipe is not
   timed.  Each gets the demo policy's settings as far as it can express them
   (:func:`smartnoise_metadata`, :func:`qrlew_settings`): the privacy unit rider_id for
   trips and riders, at most ``max_rows_per_unit`` rows per unit, the columns' bounds, the
   public table cities (Qrlew; SmartNoise has none), the same epsilon per query (the policy's
   ``default_epsilon``) and delta (its ``default_delta``).
4. Per question: a first run of each (raw, chorus, SmartNoise, Qrlew: never-seen text; shown
   apart), then ``--repeat`` rounds alternating the four in that order; medians.  A question
   a tool refuses or fails (an error, a Rust panic, Postgres's statement timeout
   ``--timeout``) is counted as refused for that tool, with the error's first line, and is
   not timed; the run goes on.

Shared, noisy machine: read ratios and medians; the load average is in the results.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.corpus import QUESTIONS, Query  # noqa: E402
from benchmarks.demo_data import (  # noqa: E402
    RawQueries,
    demo_on,
    demo_options,
    drop_database,
    open_engine,
)
from benchmarks.results import write_section  # noqa: E402
from benchmarks.run import percentile  # noqa: E402
from chorus_py.engine import Engine  # noqa: E402

VENV = ROOT / ".venv-peers"
WORKER = Path(__file__).resolve().parent / "peer_worker.py"
#: What ``--setup`` installs (the versions the comparison is pinned to).
PEER_PACKAGES = ("smartnoise-sql==1.0.10", "pyqrlew==0.9.27", "psycopg2-binary")
TOOLS = ("raw", "chorus", "smartnoise", "qrlew")
PEERS = ("smartnoise", "qrlew")
NAMES = {"raw": "raw", "chorus": "chorus (default policy)", "smartnoise": "SmartNoise SQL",
         "qrlew": "Qrlew"}
SECTIONS = {"corpus": "peers", "heldout": "peers-heldout"}
TITLES = {
    "corpus": "## Peers on the corpus (36 questions): DP / raw time of chorus, SmartNoise SQL "
              "and Qrlew",
    "heldout": "## Peers on the held-out questions (30): DP / raw time of chorus, SmartNoise "
               "SQL and Qrlew",
}

#: Chorus column types -> SmartNoise's.
SMARTNOISE_TYPES = {"int": "int", "float": "float", "text": "string", "timestamp": "datetime",
                    "date": "datetime", "bool": "boolean"}


# -- the policy, as each peer can take it ----------------------------------------------------


def load_policy(path: Path) -> dict[str, Any]:
    return tomllib.loads(path.read_text())


def unit_column(table: dict[str, Any]) -> str | None:
    """The table's privacy unit when it is one column of the table itself (else None: public,
    event level, or an attribution table, which neither peer can express)."""
    unit = table.get("privacy_unit")
    return unit if isinstance(unit, str) else None


def smartnoise_metadata(policy: dict[str, Any], schema: str = "public",
                        collection: str = "demo") -> dict[str, Any]:
    """SmartNoise's metadata for the policy's tables it can express.

    A table with a one-column privacy unit: that column ``private_id``, ``row_privacy:
    false``, ``max_ids`` = the policy's ``max_rows_per_unit`` (the policy's limit; chorus's
    default chooses a cap <= that limit per query, SmartNoise's cap is fixed) with
    ``sample_max_ids`` (SmartNoise keeps at most ``max_ids`` random rows per unit: the bound
    is enforced, not assumed).  An event-level table (no privacy unit, not public):
    ``row_privacy: true``.  Numeric bounds as ``lower`` / ``upper`` (values clamped to them).
    Public tables and tables with an attribution table as privacy unit are left out:
    SmartNoise has no public tables (and no joins) and one private_id column per table."""
    tables: dict[str, Any] = {}
    for name, table in policy.get("tables", {}).items():
        if table.get("public"):
            continue
        unit = unit_column(table)
        if unit is None and "privacy_unit" in table:
            continue
        entry: dict[str, Any] = {"row_privacy": unit is None}
        if unit is not None:
            entry["max_ids"] = int(table.get("max_rows_per_unit", 1))
            entry["sample_max_ids"] = True
        for column, spec in table.get("columns", {}).items():
            col: dict[str, Any] = {"type": SMARTNOISE_TYPES.get(spec.get("type"), "unknown")}
            if column == unit:
                col["private_id"] = True
            for bound in ("lower", "upper"):
                if bound in spec:
                    col[bound] = spec[bound]
            entry[column] = col
        tables[name] = entry
    return {collection: {schema: tables}}


def qrlew_settings(policy: dict[str, Any], schema: str = "public") -> dict[str, Any]:
    """Qrlew's settings for the policy.

    Privacy unit: per table with a one-column unit, the (empty) path from the table to that
    column (``(table, [], column)``); event-level tables ``_PRIVACY_UNIT_ROW_``; public tables
    left out (Qrlew treats tables outside the privacy unit as public).  Tables whose unit is
    an attribution table are row-level (no path to one unit from a paper with several
    authors; stricter, and no question reads them).  Bounds: the policy's ``lower`` /
    ``upper`` declared as the dataset's column ranges (``Dataset.with_range``), its
    ``public_values`` as possible values (``with_possible_values``: group keys released
    without thresholding).  ``max_multiplicity`` = the largest ``max_rows_per_unit`` of the
    policy (Qrlew takes one for the whole query)."""
    unit: list[tuple[str, list[tuple[str, str, str]], str]] = []
    ranges: list[tuple[str, str, float, float]] = []
    values: list[tuple[str, str, list[str]]] = []
    most = 1
    for name, table in policy.get("tables", {}).items():
        if table.get("public"):
            continue
        column = unit_column(table)
        unit.append((name, [], column if column is not None else "_PRIVACY_UNIT_ROW_"))
        if column is not None:
            most = max(most, int(table.get("max_rows_per_unit", 1)))
        for col, spec in table.get("columns", {}).items():
            if "lower" in spec and "upper" in spec:
                ranges.append((name, col, float(spec["lower"]), float(spec["upper"])))
            if "public_values" in spec:
                values.append((name, col, [str(v) for v in spec["public_values"]]))
    return {"schema": schema, "privacy_unit": unit, "ranges": ranges,
            "possible_values": values, "max_multiplicity": most}


def peer_settings(policy: dict[str, Any]) -> dict[str, Any]:
    """Both peers' settings, with the policy's default epsilon and delta per query."""
    privacy = {"epsilon": float(policy["privacy"]["default_epsilon"]),
               "delta": float(policy["privacy"]["default_delta"])}
    return {"smartnoise": {**privacy, "metadata": smartnoise_metadata(policy)},
            "qrlew": {**privacy, **qrlew_settings(policy)}}


# -- the peers' virtual environment and worker ----------------------------------------------


def peers_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def venv_ready(venv: Path) -> bool:
    if not peers_python(venv).exists():
        return False
    check = subprocess.run([str(peers_python(venv)), "-c", "import snsql, pyqrlew, psycopg2"],
                           capture_output=True)
    return check.returncode == 0


def make_venv(venv: Path) -> None:
    """``python3.11 -m venv`` and pip install the pinned peers, printing pip's progress."""
    python = shutil.which("python3.11") or sys.executable
    print(f"peers: making {venv} with {python} (SmartNoise SQL, Qrlew; a few minutes)",
          file=sys.stderr, flush=True)
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(peers_python(venv)), "-m", "pip", "install", "--upgrade", "pip"],
                   check=True)
    subprocess.run([str(peers_python(venv)), "-m", "pip", "install", *PEER_PACKAGES],
                   check=True)
    print(f"peers: {venv} ready", file=sys.stderr, flush=True)


class Worker:
    """The peers' worker process: one JSON request per line, one JSON answer per line.  Started
    again (and set up again) if it dies, e.g. on a crash inside a peer's native code."""

    def __init__(self, venv: Path, setup: dict[str, Any], log: Path) -> None:
        self.venv, self.setup_request, self.log_path = venv, setup, log
        self.process: subprocess.Popen[str] | None = None
        self.log: IO[str] = log.open("a")
        self.versions: dict[str, str] = {}
        self.setup_ms = 0.0
        self.restarts = -1

    def start(self) -> None:
        env = {**os.environ, "RUST_BACKTRACE": "0"}
        self.process = subprocess.Popen(
            [str(peers_python(self.venv)), str(WORKER)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        self.restarts += 1
        reply = self.ask(self.setup_request, restart=False)
        if not reply.get("ok"):
            raise SystemExit(f"peers: worker setup failed: {reply.get('error')}\n"
                             f"{reply.get('traceback', '')}")
        self.versions, self.setup_ms = reply["versions"], reply["ms"]

    def ask(self, request: dict[str, Any], restart: bool = True) -> dict[str, Any]:
        if self.process is None or self.process.poll() is not None:
            self.start()
        assert self.process is not None and self.process.stdin and self.process.stdout
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
        except BrokenPipeError:
            line = ""
        if line:
            return json.loads(line)
        code = self.process.wait()
        self.process = None
        return {"ok": False, "error": f"the peers' worker died (exit code {code}; see "
                                      f"{self.log_path.name})"}

    def run(self, tool: str, sql: str) -> dict[str, Any]:
        return self.ask({"op": "run", "tool": tool, "sql": sql})

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.write(json.dumps({"op": "quit"}) + "\n")
            self.process.stdin.flush()
            self.process.wait(timeout=30)
        self.log.close()


# -- the runs -------------------------------------------------------------------------------


@dataclass
class Cell:
    """One question for one tool: the first run (apart), the rounds, or why it was refused."""

    first_ms: float | None = None
    first_row: list[str] = field(default_factory=list)
    ms: list[float] = field(default_factory=list)
    error: str | None = None
    spent: Any = None  # SmartNoise: the odometer's (epsilon, delta) for the query

    @property
    def median(self) -> float:
        return statistics.median(self.ms)


Results = dict[str, dict[str, Cell]]  # question name -> tool -> cell


def timed_ms(fn: Any, *args: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    out = fn(*args)
    return (time.perf_counter() - started) * 1000, out


def run_once(tool: str, sql: str, engine: Engine, raw: RawQueries, worker: Worker
             ) -> tuple[float | None, list[str], str | None, Any]:
    """(ms, first row as strings, error's first line, SmartNoise's spend) of one run."""
    if tool in PEERS:
        reply = worker.run(tool, sql)
        if not reply.get("ok"):
            return None, [], reply.get("error", "?"), None
        return reply["ms"], reply["row"], None, reply.get("spent")
    try:
        if tool == "raw":
            ms, rows = timed_ms(raw.run, sql)
        else:
            ms, result = timed_ms(lambda: engine.execute(sql, remaining=False))
            rows = result.rows
    except Exception as err:  # ChorusError and the rest: one failure never stops the run
        text = str(err).strip().splitlines()
        return None, [], f"{type(err).__name__}: {text[0] if text else ''}"[:300], None
    return ms, ([str(v) for v in rows[0]] if rows else []), None, None


def bench(queries: tuple[Query, ...], engine: Engine, worker: Worker, repeat: int) -> Results:
    results: Results = {}
    with contextlib.closing(RawQueries(engine)) as raw_queries:
        for query in queries:
            cells = results[query.name] = {tool: Cell() for tool in TOOLS}
            # The first run of each: never-seen text for every tool (and cold buffers for raw).
            for tool in TOOLS:
                cell = cells[tool]
                cell.first_ms, cell.first_row, cell.error, cell.spent = run_once(
                    tool, query.sql, engine, raw_queries, worker)
            for _ in range(repeat):
                for tool in TOOLS:  # alternating, round by round
                    cell = cells[tool]
                    if cell.error is not None:
                        continue
                    ms, _row, error, _ = run_once(tool, query.sql, engine, raw_queries, worker)
                    if error is not None:  # failed in a later round (a timeout): refused
                        cell.error, cell.ms = f"(round {len(cell.ms) + 1}) {error}", []
                    else:
                        cell.ms.append(ms)  # type: ignore[arg-type]
            raw = cells["raw"]
            parts = []
            for tool in TOOLS:
                c = cells[tool]
                if c.error is not None:
                    parts.append(f"{tool} refused ({c.error[:80]})")
                elif tool == "raw":
                    parts.append(f"raw {c.median:.1f} ms")
                elif raw.error is None:
                    parts.append(f"{tool} {c.median:.1f} ms ({c.median / raw.median:.2f}x)")
            print(f"{query.name}: " + ", ".join(parts), file=sys.stderr, flush=True)
    return results


# -- the report -----------------------------------------------------------------------------


def ratios(results: Results, tool: str) -> list[float]:
    """DP / raw median time of each question the tool (and raw) answered."""
    return [cells[tool].median / cells["raw"].median for cells in results.values()
            if cells[tool].error is None and cells["raw"].error is None]


def summary(results: Results) -> list[str]:
    lines = ["| tool | questions answered | of them with no row | refused or failed | "
             "DP / raw median | p90 | max | first run / raw median | max |",
             "|---|---|---|---|---|---|---|---|---|"]
    for tool in TOOLS[1:]:
        got = ratios(results, tool)
        first = [cells[tool].first_ms / cells["raw"].median  # type: ignore[operator]
                 for cells in results.values()
                 if cells[tool].error is None and cells["raw"].error is None]
        refused = sum(cells[tool].error is not None for cells in results.values())
        # An answer without rows: every group (or the one row) censored, e.g. by SmartNoise's
        # threshold on the count of units; timed like the others, but worth knowing.
        empty = sum(cells[tool].error is None and not cells[tool].first_row
                    for cells in results.values())
        if got:
            lines.append(f"| {NAMES[tool]} | {len(got)} | {empty} | {refused} | "
                         f"{statistics.median(got):.2f} | {percentile(got, 0.9):.2f} | "
                         f"{max(got):.2f} | {statistics.median(first):.2f} | {max(first):.2f} |")
        else:
            lines.append(f"| {NAMES[tool]} | 0 | 0 | {refused} | - | - | - | - | - |")
    return lines


def common(results: Results) -> list[str]:
    """The same statistics on the questions every tool answered (a fair like-for-like)."""
    shared = {name: cells for name, cells in results.items()
              if all(c.error is None for c in cells.values())}
    lines = [f"On the {len(shared)} questions all three answered:", "",
             "| tool | DP / raw median | p90 | max |", "|---|---|---|---|"]
    for tool in TOOLS[1:]:
        got = ratios(shared, tool)
        if got:
            lines.append(f"| {NAMES[tool]} | {statistics.median(got):.2f} | "
                         f"{percentile(got, 0.9):.2f} | {max(got):.2f} |")
    return lines


def per_question(queries: tuple[Query, ...], results: Results) -> list[str]:
    head = ("| # | question | raw ms (first) | "
            + " | ".join(f"{NAMES[t]} ms (first) | DP / raw" for t in TOOLS[1:]) + " |")
    lines = [head, "|---|---|---|" + "---|---|" * (len(TOOLS) - 1)]
    for i, query in enumerate(queries, 1):
        cells = results[query.name]
        raw = cells["raw"]
        row = [f"| {i} | {query.name}: `{query.sql}` | "
               + (f"{raw.median:.1f} ({raw.first_ms:.1f})" if raw.error is None else "refused")]
        for tool in TOOLS[1:]:
            c = cells[tool]
            if c.error is not None:
                row.append("refused | -")
            elif raw.error is None:
                row.append(f"{c.median:.1f} ({c.first_ms:.1f}) | {c.median / raw.median:.2f}")
            else:
                row.append(f"{c.median:.1f} ({c.first_ms:.1f}) | -")
        lines.append(" | ".join(row) + " |")
    return lines


def refusals(queries: tuple[Query, ...], results: Results) -> list[str]:
    lines = []
    for tool in TOOLS[1:]:
        for query in queries:
            error = results[query.name][tool].error
            if error is not None:
                lines.append(f"- {NAMES[tool]}, {query.name}: {error.replace('|', '/')}")
    return lines or ["None."]


def answers(queries: tuple[Query, ...], results: Results) -> list[str]:
    """Each tool's first result row of its first run, beside the raw one, to read by eye."""
    lines = ["| # | question | " + " | ".join(NAMES[t] for t in TOOLS) + " |",
             "|---|---|" + "---|" * len(TOOLS)]

    def show(cell: Cell) -> str:
        if cell.error is not None:
            return "refused"
        return ", ".join(v if len(v) <= 14 else f"{float(v):.6g}" if _numeric(v) else v[:14]
                         for v in cell.first_row) or "(no row)"

    for i, query in enumerate(queries, 1):
        cells = results[query.name]
        lines.append(f"| {i} | {query.name} | " + " | ".join(show(cells[t]) for t in TOOLS)
                     + " |")
    return lines


def _numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def smartnoise_spend(results: Results) -> str:
    spent = [cells["smartnoise"].spent for cells in results.values()
             if cells["smartnoise"].spent]
    if not spent:
        return "no SmartNoise query answered"
    eps = [s[0] for s in spent]
    return (f"SmartNoise's odometer after the scaling: epsilon {min(eps):.3g} to "
            f"{max(eps):.3g} per answered query")


def describe_smartnoise(meta: dict[str, Any]) -> str:
    """The SmartNoise metadata's tables in a sentence."""
    (schemas,) = meta.values()
    (tables,) = schemas.values()
    parts = []
    for name, table in tables.items():
        columns = {c: s for c, s in table.items() if isinstance(s, dict)}
        if table["row_privacy"]:
            text = f"{name}: row_privacy true"
        else:
            unit = next(c for c, s in columns.items() if s.get("private_id"))
            text = (f"{name}: private_id {unit}, max_ids {table['max_ids']} (the policy's "
                    "max_rows_per_unit; sample_max_ids: rows beyond it dropped at random), "
                    "row_privacy false")
        text += "".join(f", {c} [{s['lower']:g}, {s['upper']:g}]"
                        for c, s in columns.items() if "lower" in s)
        parts.append(text)
    return "; ".join(parts)


def report(args: argparse.Namespace, queries: tuple[Query, ...], results: Results,
           settings: dict[str, Any], worker: Worker, load: tuple[float, float], made: str,
           setup_lines: list[str]) -> str:
    v = worker.versions
    sn_meta = settings["smartnoise"]["metadata"]
    qr = settings["qrlew"]
    epsilon, delta = settings["qrlew"]["epsilon"], settings["qrlew"]["delta"]
    try:
        chorus_version = metadata.version("chorus_py")
    except metadata.PackageNotFoundError:
        chorus_version = "the working tree"
    return "\n".join([
        TITLES[args.questions],
        "",
        f"Written by `python -m benchmarks.peers --questions {args.questions} --rows "
        f"{args.rows} --repeat {args.repeat} --timeout {args.timeout:g}` on {made} UTC; "
        f"{platform.machine()}, {os.cpu_count()} cores shared with other engineers' jobs (load "
        f"average {load[0]:.2f} at the start, {load[1]:.2f} at the end), {args.rows:,} demo "
        f"trips on Postgres. Chorus {chorus_version} (Python {platform.python_version()}); "
        f"SmartNoise SQL {v.get('smartnoise-sql')} (OpenDP {v.get('opendp')}), pyqrlew "
        f"{v.get('pyqrlew')}, numpy {v.get('numpy')}, Python {v.get('python')} in "
        "`.venv-peers`, in a worker process that times each tool's own call. Per question a "
        "first run of each tool (never-seen text; shown in parentheses), then "
        f"{args.repeat} rounds alternating raw, chorus, SmartNoise, Qrlew; medians. DP / raw: "
        "a tool's median over raw's median. A question a tool refused or failed (error, Rust "
        f"panic, Postgres statement timeout of {args.timeout:g} s) is counted as refused and "
        "not timed. Read the ratios.",
        "",
        "Settings (the demo policy, as far as each tool can express it):",
        "",
        "- Raw: the analyst's SQL on a Postgres connection of its own with the server's "
        "settings (`benchmarks.demo_data.RawQueries`, as `benchmarks.corpus`).",
        f"- Chorus: `Engine.execute` with the demo policy unchanged but for a budget per block "
        f"no run exhausts: epsilon {epsilon:g}, delta {delta:g} (its defaults), privacy unit "
        "rider_id, automatic cap <= 200 trips per rider and automatic clipping bounds inside "
        "fare [0, 200], distance_km [0, 100], per-query bounding from the ranked copy, choices "
        "of an identical query reused for 10 minutes unless dominated by noise, cities "
        "public.",
        f"- SmartNoise SQL: `snsql.from_connection(psycopg2, engine='postgres')`, "
        f"`Privacy(epsilon, delta)` scaled per query so that the odometer's total "
        f"(`get_privacy_cost`) is epsilon {epsilon:g}, delta {delta:g} (SmartNoise spends its "
        "epsilon per mechanism: each aggregate and the count that censors rare groups); "
        f"{smartnoise_spend(results)}. Metadata from the policy: "
        + describe_smartnoise(sn_meta)
        + ". max_ids 200 is the policy's limit (chorus's default chooses a cap <= 200 per "
        "query; SmartNoise's documented default is 1, which would keep one trip per rider). "
        "Cities is left out: SmartNoise has no public tables and no joins; other options at "
        "their defaults (censor_dims: groups with few units are suppressed, clamp_columns).",
        f"- Qrlew: `Dataset.from_database(sqlalchemy, schema 'public', ranges=False)` made "
        "once when the worker starts (not timed); timed per query: `dataset.relation(sql)`, "
        f"`rewrite_with_differential_privacy(dataset, privacy_unit, "
        f"{{epsilon: {epsilon:g}, delta: {delta:g}}}, max_multiplicity="
        f"{qr['max_multiplicity']:g})`, `to_query()`, the SQL run on Postgres and fetched. "
        "Privacy unit "
        + ", ".join(f"`{t}` -> {u}" for t, _, u in qr["privacy_unit"])
        + " (cities, public, left out: Qrlew treats it as public); ranges (the policy's "
        "bounds, `with_range`): "
        + ", ".join(f"{t}.{c} [{lo:g}, {hi:g}]" for t, c, lo, hi in qr["ranges"])
        + "; possible values (the policy's public_values, `with_possible_values`): "
        + ", ".join(f"{t}.{c}" for t, c, _ in qr["possible_values"])
        + ". max_multiplicity: the policy's limit (Qrlew's default is 100); other columns "
        "unbounded (ranges=False reads no min/max from the data).",
        *setup_lines,
        "",
        "What each runs per query (read from their rewritten SQL): SmartNoise one statement: "
        "values clamped to the bounds, `ROW_NUMBER() OVER (PARTITION BY rider_id ORDER BY "
        "RANDOM())` keeping at most max_ids rows per rider, the aggregates and `COUNT(DISTINCT "
        "rider_id)` per group (the count that censors groups), then noise in Python (OpenDP); "
        "Qrlew one statement: per rider a GROUP BY on MD5(rider_id) of the rows passing the "
        "filter, each row scaled so that the rider's contribution stays within max_multiplicity "
        "times the bound, joined back and summed, Gaussian noise (no cap chosen per query, "
        "nothing stored: its work grows with the rows passing the filter and is close to raw on "
        "selective filters); chorus the private choices (noisy histograms, unless an identical "
        "query's are reused) and the answer from the ranked copy.",
        "",
        "### Summary",
        "",
        *summary(results),
        "",
        *common(results),
        "",
        "### Per question",
        "",
        "Milliseconds: median of the rounds (the first run in parentheses).",
        "",
        *per_question(queries, results),
        "",
        "### Refused or failed, per tool (the error's first line)",
        "",
        *refusals(queries, results),
        "",
        "### First answers (first row of each tool's first run, to read by eye)",
        "",
        *answers(queries, results),
        "",
    ])


# -- main -----------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", choices=sorted(QUESTIONS), default="corpus",
                        help="corpus: the 36 questions (section 'peers'); heldout: the 30 "
                             "kept out of tuning (section 'peers-heldout')")
    demo_options(parser, "peers_bench", skips=False)
    parser.add_argument("--repeat", type=int, default=5, help="rounds per question")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="Postgres statement timeout of the peers' queries, seconds")
    parser.add_argument("--venv", type=Path, default=VENV,
                        help="the peers' virtual environment (made if missing)")
    parser.add_argument("--setup", action="store_true",
                        help="make the peers' virtual environment and stop")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("need --repeat >= 1")
    if args.setup:
        make_venv(args.venv)
        return
    if not venv_ready(args.venv):
        make_venv(args.venv)

    load_start = os.getloadavg()[0]
    queries = QUESTIONS[args.questions]
    work = Path(tempfile.mkdtemp(prefix="chorus-peers-"))
    worker: Worker | None = None
    engine: Engine | None = None
    text = ""
    try:
        started = time.perf_counter()
        policy_path = demo_on("Postgres", work, args)
        made_s = time.perf_counter() - started
        started = time.perf_counter()
        engine = open_engine(policy_path)
        warm_s = time.perf_counter() - started
        settings = peer_settings(load_policy(policy_path))
        url = f"{args.postgres.rsplit('/', 1)[0]}/{args.database}"
        worker = Worker(args.venv, {"op": "setup", "url": url, "timeout_seconds": args.timeout,
                                    **settings}, work / "peer_worker.log")
        worker.start()
        print(f"demo made in {made_s:.0f} s, chorus warmed up in {warm_s:.1f} s, peers set "
              f"up in {worker.setup_ms / 1000:.1f} s", file=sys.stderr, flush=True)
        results = bench(queries, engine, worker, args.repeat)
        setup_lines = [
            f"- Set-up (not timed): demo made in {made_s:.0f} s; chorus's engine opened and "
            f"its ranked copy built in {warm_s:.1f} s; the peers' worker set up in "
            f"{worker.setup_ms / 1000:.1f} s (restarted {worker.restarts} times during the "
            "run)."]
        load = (load_start, os.getloadavg()[0])
        text = report(args, queries, results, settings, worker, load,
                      f"{datetime.now(UTC):%Y-%m-%d %H:%M}", setup_lines)
        write_section(SECTIONS[args.questions], text, args.out)
    finally:
        if worker is not None:
            worker.close()
            log = work / "peer_worker.log"
            if log.exists() and log.stat().st_size:
                kept = Path(tempfile.gettempdir()) / f"peer_worker-{args.questions}.log"
                shutil.copy(log, kept)
                print(f"the peers' stderr: {kept}", file=sys.stderr)
        if engine is not None:
            engine.close()
        drop_database(args)
        shutil.rmtree(work, ignore_errors=True)
    print(text)


if __name__ == "__main__":
    main()
