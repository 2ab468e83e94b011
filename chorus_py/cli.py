"""The ``chorus`` command line: a thin layer over :class:`chorus_py.engine.Engine`.

Exit status: 0 on success, 2 when a query is refused (policy, SQL, budget or parameters),
1 on any other failure.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from chorus_py.errors import (
    BudgetExhausted,
    ChorusError,
    NotSupportedError,
    OperationalError,
    PolicyError,
    ProgrammingError,
)
from chorus_py.report import shown
from mechanisms.intervals import Interval, NoInterval, format_interval

REFUSED = 2
FAILED = 1

_DEMO_QUERIES = [
    ("How many trips per city?", "SELECT city, COUNT(*) AS trips FROM trips GROUP BY city "
     "ORDER BY city"),
    ("Average fare and distance, all trips",
     "SELECT AVG(fare) AS avg_fare, AVG(distance_km) AS avg_km FROM trips"),
    ("How many riders took a trip longer than 20 km in January?",
     "SELECT COUNT(DISTINCT rider_id) AS riders FROM trips WHERE distance_km > 20 "
     "AND pickup_time < DATE '2026-02-01'"),
    ("Fare spread (standard deviation) in SF and NYC",
     "SELECT city, STDDEV(fare) AS fare_sd FROM trips WHERE city IN ('SF', 'NYC') "
     "GROUP BY city"),
    ("Busiest hours of the day (every hour is a public key: no threshold)",
     "SELECT EXTRACT(hour FROM pickup_time) AS hour, COUNT(*) AS trips FROM trips "
     "GROUP BY 1 ORDER BY trips DESC LIMIT 3"),
    ("Busiest drivers (keys released by thresholding)",
     "SELECT driver_id, COUNT(*) AS trips FROM trips GROUP BY driver_id "
     "ORDER BY trips DESC LIMIT 3"),
]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="chorus-py", prog_name="chorus",
                      message="%(prog)s %(version)s")
@click.option("-v", "--verbose", count=True, help="Log more (-v: info, -vv: debug).")
def main(verbose: int) -> None:
    """Chorus: a differential-privacy SQL proxy.

    Analysts send ordinary SQL; the proxy bounds each person's influence, rewrites the query so
    the database adds calibrated noise, and charges the privacy cost to a per-block budget.

    \b
    Start here:
      chorus demo                         # demo data + policy in ./demo, example answers
      chorus query --policy demo/policy.toml "SELECT COUNT(*) FROM trips"
      chorus explain --policy demo/policy.toml "SELECT AVG(fare) FROM trips"
    """
    logging.basicConfig(level=[logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)],
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")


@main.command()
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path),
              default=Path("demo"), show_default=True, help="Where to write data and policy.")
@click.option("--backend", "backend_url", default=None, metavar="URL",
              help="Load into this Postgres database instead of DIR/demo.duckdb, e.g. "
              "postgresql://postgres@127.0.0.1:5432/demo")
@click.option("--rows", type=click.IntRange(min=1), default=1_000_000, show_default=True,
              help="Number of trips to generate.")
@click.option("--epsilon", type=float, default=None, help="Epsilon of each example query.")
@click.option("--no-queries", is_flag=True, help="Only generate data and policy.")
@click.option("--parquet", is_flag=True,
              help="Also export the tables to DIR/parquet/*.parquet and write "
              "DIR/policy-spark.toml, a policy for the Spark backend (spark://local).")
@click.option("--if-empty", is_flag=True,
              help="Do nothing when every demo table already holds rows (docker-compose.yml "
              "loads the data once, not on every start).")
def demo(directory: Path, backend_url: str | None, rows: int, epsilon: float | None,
         no_queries: bool, parquet: bool, if_empty: bool) -> None:
    """Generate a ride-sharing dataset and its policy, then answer example queries.

    The data (trips with rider, driver, city, pickup time over 90 days, fare, distance) is
    deterministic. Each answer is printed next to its privacy report.

    \b
    Examples:
      chorus demo
      chorus demo --dir /tmp/demo --rows 100000
      chorus demo --backend postgresql://postgres@127.0.0.1:5432/demo
      chorus demo --backend postgresql://postgres@127.0.0.1:5432/demo --if-empty --no-queries
      chorus demo --parquet --no-queries     # then: chorus query --policy demo/policy-spark.toml
    """
    from chorus_py.demo import demo_loaded, generate_demo
    from chorus_py.demo.people import JOIN_QUERIES

    try:
        if if_empty and demo_loaded(directory, backend_url):
            click.echo("the demo tables already hold rows: nothing loaded (--if-empty)")
            return
    except ChorusError as err:
        _fail(err)

    def progress(message: str, fraction: float) -> None:
        click.echo(f"[{fraction:4.0%}] {message}", err=True)

    try:
        policy_path = generate_demo(directory, backend_url=backend_url, rows=rows,
                                    progress=progress)
    except ChorusError as err:
        _fail(err)
    click.echo(f"policy written to {policy_path}")
    if parquet:
        from chorus_py.demo.parquet import export_parquet

        try:
            spark_policy = export_parquet(directory)
        except ChorusError as err:
            _fail(err)
        click.echo(f"Parquet tables in {directory / 'parquet'}; Spark policy written to "
                   f"{spark_policy}")
    if no_queries:
        return
    engine = _engine(policy_path)
    for question, sql in [*_DEMO_QUERIES, *JOIN_QUERIES]:
        click.echo("")
        click.secho(f"-- {question}", bold=True)
        click.echo(sql)
        try:
            result = engine.execute(sql, epsilon=epsilon)
        except ChorusError as err:
            click.secho(f"refused: {err}", fg="red")
            continue
        _print_table(result.columns, result.rows)
        _print_report(result.report.to_dict())
    click.echo("")
    click.echo("Budget left per block (first 3 of "
               f"{len(engine.ledger.blocks())}):")
    for block in engine.ledger.blocks()[:3]:
        click.echo(f"  {block.block_id}: epsilon {block.epsilon_remaining:.3f} "
                   f"of {block.epsilon_global:g}")
    click.echo(f"\nTry: chorus query --policy {policy_path} \"SELECT COUNT(*) FROM trips\"")


def _query_options(func: Any) -> Any:
    for option in reversed([
        click.option("--policy", "policy_path", required=True,
                     type=click.Path(dir_okay=False, path_type=Path),
                     help="The policy (TOML) file."),
        click.option("--analyst", default=None,
                     help="Analyst to charge (default: the policy's only analyst)."),
        click.option("--epsilon", type=float, default=None,
                     help="Privacy cost of this query (default: privacy.default_epsilon)."),
        click.option("--delta", type=float, default=None,
                     help="Delta (default: privacy.default_delta); needed to release "
                     "group keys without public_values."),
        click.option("--sensitivity", type=click.Choice(["analytic", "sampled"]), default=None,
                     help="'sampled': sensitivity sampling, an (epsilon, delta, gamma)-random "
                     "DP answer for queries with no analytic bound (default: "
                     "privacy.sensitivity)."),
        click.option("--gamma", type=float, default=None,
                     help="With --sensitivity sampled: the chance the guarantee fails over "
                     "databases drawn from P (default: privacy.default_gamma)."),
        click.option("--json", "as_json", is_flag=True,
                     help="Print one JSON object: columns, rows, report (or error)."),
        click.argument("sql"),
    ]):
        func = option(func)
    return func


@main.command()
@_query_options
def query(policy_path: Path, analyst: str | None, epsilon: float | None, delta: float | None,
          sensitivity: str | None, gamma: float | None, as_json: bool, sql: str) -> None:
    """Run one query with differential privacy and print the noisy answer.

    \b
    Examples:
      chorus query --policy demo/policy.toml "SELECT city, COUNT(*) FROM trips GROUP BY city"
      chorus query --policy demo/policy.toml --epsilon 0.5 --json \\
          "SELECT AVG(fare) FROM trips WHERE distance_km > 10"
      chorus query --policy policy.toml --sensitivity sampled --gamma 0.05 \\
          "SELECT MEDIAN(seconds) FROM visits"
    """
    engine = _engine(policy_path, as_json)
    try:
        result = engine.execute(sql, analyst=analyst, epsilon=epsilon, delta=delta,
                                sensitivity=sensitivity, gamma=gamma)
    except ChorusError as err:
        _fail(err, as_json)
    finally:
        # Closed before exit: a Spark Connect session left to the interpreter's shutdown
        # waits on release threads that no longer run, and the command never returns.
        engine.close()
    if as_json:
        click.echo(json.dumps(result.to_dict(), default=str))
        return
    _print_table(result.columns, result.rows, result.intervals())
    _print_report(result.report.to_dict())


@main.command()
@_query_options
def explain(policy_path: Path, analyst: str | None, epsilon: float | None,
            delta: float | None, sensitivity: str | None, gamma: float | None, as_json: bool,
            sql: str) -> None:
    """Show what a query would cost and how it would be answered, without running it.

    Nothing is executed and no budget is charged.

    \b
    Example:
      chorus explain --policy demo/policy.toml "SELECT AVG(fare) FROM trips GROUP BY city"
    """
    engine = _engine(policy_path, as_json)
    try:
        report = engine.explain(sql, analyst=analyst, epsilon=epsilon, delta=delta,
                                sensitivity=sensitivity, gamma=gamma)
    except ChorusError as err:
        _fail(err, as_json)
    finally:
        engine.close()  # as in `chorus query`
    if as_json:
        click.echo(json.dumps({"columns": [], "rows": [], "report": report.to_dict()},
                              default=str))
        return
    _print_report(report.to_dict(), verbose=True)


@main.command()
@click.option("--policy", "policy_path", required=True,
              type=click.Path(dir_okay=False, path_type=Path), help="The policy (TOML) file.")
@click.option("--listen", default="127.0.0.1:6432", show_default=True, metavar="HOST:PORT",
              help="Where the Postgres wire protocol listens.")
@click.option("--rest", default="127.0.0.1:8000", show_default=True, metavar="HOST:PORT",
              help="Where the REST API (/v1, /openapi.json) and the budget dashboard "
              "(/dashboard) listen; --rest '' turns them off.")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text",
              show_default=True, help="Log lines as text, or one JSON object per line. Every "
              "query, refusal, failed login and database health change is logged.")
@click.option("--pid-file", default=None, metavar="PATH",
              help="Where to write the process id for `chorus reload` (default: <policy "
              "stem>.pid next to the policy; '' for none).")
@click.option("--workers", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Proxy processes serving the same ports and sharing the ledger (a SQLite "
              "file or Postgres; the backend must be Postgres). SIGTERM stops them all; a "
              "worker that crashes is restarted (exit 1 if workers crash more than 5 times "
              "in a minute or one fails at start).")
def serve(policy_path: Path, listen: str, rest: str, log_format: str,
          pid_file: str | None, workers: int) -> None:
    """Serve the Postgres wire protocol: any Postgres client can connect.

    Each connection is one analyst of the policy, authenticated with SCRAM-SHA-256 against the
    verifier in [analysts.NAME] password (see `chorus passwd`). Answers carry their privacy
    report as a NOTICE; SET chorus.epsilon / chorus.delta choose the cost of the next queries.
    The same engine answers REST (bearer tokens: [analysts.NAME] token_sha256) and serves the
    data owner's budget dashboard, on --rest.

    With --workers N, N processes listen on the same ports (SO_REUSEPORT: the kernel hands
    each connection to one) and share the budget ledger: every ledger guarantee holds across
    them. Each has its own answer cache, metrics and connection limit. Signals go to the
    parent. Several machines: "Several proxy processes and machines" in docs/owner-guide.md.

    \b
    Examples:
      chorus serve --policy demo/policy.toml
      chorus serve --policy pg-policy.toml --workers 4
      chorus reload --policy demo/policy.toml   # analysts, tokens, passwords: no restart
      psql postgresql://demo:demo@127.0.0.1:6432/demo
      curl -H 'Authorization: Bearer demo-token' -d '{"sql": "SELECT COUNT(*) FROM trips"}' \\
          -H 'Content-Type: application/json' http://127.0.0.1:8000/v1/query
    """
    from chorus_py.activity import configure_logging
    from server.listen import ListenError
    from server.pgwire.server import parse_listen
    from server.serve import serve as run_server

    configure_logging("json" if log_format == "json" else "text")

    try:
        parse_listen(listen)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--listen") from None
    if rest:
        from server.rest.listener import parse_listen as parse_rest

        try:
            parse_rest(rest)
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint="--rest") from None
    from chorus_py.reload import pid_file_for

    pid_path: Path | None = pid_file_for(policy_path)
    if pid_file is not None:  # given: that file, or none at all for ''
        pid_path = Path(pid_file) if pid_file else None
    try:
        if workers > 1:
            from server.workers import serve_workers

            sys.exit(serve_workers(policy_path, listen, rest or None, workers, pid_path,
                                   log_format))
        run_server(policy_path, listen, rest or None, pid_path)
    except (PolicyError, OperationalError) as err:
        _fail(err, status=FAILED)
    except ChorusError as err:
        _fail(err)
    except ListenError as err:
        click.secho(f"error: {err}", fg="red", err=True)
        click.echo(f"hint: {err.hint}", err=True)
        sys.exit(FAILED)


@main.command()
@click.option("--policy", "policy_path", required=True,
              type=click.Path(dir_okay=False, path_type=Path), help="The policy file.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def check(policy_path: Path, as_json: bool) -> None:
    """Check a policy against the live data and the ledger (for the data owner): names the
    database lacks or the policy leaves unused, public_values no row has (a typo is released as
    a category of its own), values the list misses, bounds that clip much of a column, ledger
    blocks whose budget differs from the policy (`chorus budget reconcile`), a database role
    that can write.  Exits 1 when there is an error (for CI).

    Its findings quote the data: never show them to analysts.

    Example: chorus check --policy demo/policy.toml
    """
    from dataclasses import asdict

    from budget.ledger import open_ledger
    from chorus_py.backends import open_backend
    from chorus_py.lint import check_all
    from chorus_py.policy import load_policy

    # The role's warnings are findings here: not logged a second time by the backend.
    logging.getLogger("chorus.backends").setLevel(logging.ERROR)
    try:
        policy = load_policy(policy_path)
        backend = open_backend(policy.backend.url, policy.backend.statement_timeout_seconds,
                               policy.backend.spark)
    except ChorusError as err:
        _fail(err, as_json, status=FAILED)
    try:
        ledger = open_ledger(policy.privacy, policy.source, policy.analysts)
        try:
            findings = check_all(policy, backend, ledger)
        finally:
            ledger.close()
    except ChorusError as err:
        _fail(err, as_json, status=FAILED)
    finally:
        backend.close()
    if as_json:
        click.echo(json.dumps([asdict(f) for f in findings]))
    elif not findings:
        click.secho(f"{policy_path}: no problem found", fg="green")
    for f in [] if as_json else findings:
        click.secho(f"{f.severity}: {f.where}: {f.problem}", fg={"error": "red",
                    "warning": "yellow"}.get(f.severity))
        click.echo(f"  fix: {f.fix}")
    if any(f.severity == "error" for f in findings):
        sys.exit(1)


@main.command()
@click.option("--policy", "policy_path", required=True,
              type=click.Path(dir_okay=False, path_type=Path), help="The policy file.")
@click.option("--table", required=True, help="A table whose rows belong to several units.")
@click.option("--method", type=click.Choice(["greedy", "greedy-sparse", "sql-rank",
                                             "greedy-balanced", "ilp"]),
              default=None, help="How to choose S (default: the table's attribution_method; "
              "another method is a dry run that stores nothing).")
@click.option("--seed", type=int, default=None, help="Seed of the random order (default: "
              "derived from the proxy's secret key and the data version).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def bound(policy_path: Path, table: str, method: str | None, seed: int | None,
          as_json: bool) -> None:
    """Choose the rows kept of a multi-attribution table (S) now, and describe it.

    For the data owner only: |S| and the rows per unit are exact and depend on who is
    attributed to which row, so they are never shown to analysts.

    Example: chorus bound --policy demo/policy.toml --table papers --method greedy
    """
    from dataclasses import asdict

    from chorus_py.stores.attribution import summary_lines

    engine = _engine(policy_path, as_json)
    try:
        tp = engine.policy.table(table)
        if tp is None or not tp.multi_attribution:
            raise PolicyError(f"{policy_path}: tables.{table}: not a table whose privacy_unit "
                              "has several units per row",
                              hint="set privacy_unit to a list of columns or an attribution "
                              "table")
        if as_json:
            summary = engine.attribution.bound(table.lower(), tp, method, seed)
            click.echo(json.dumps(asdict(summary)))
            return
        with click.progressbar(length=1000, label=f"choosing S for {table}",
                               file=sys.stderr) as bar:
            def tell(fraction: float) -> None:
                bar.update(int(fraction * 1000) - bar.pos)
            summary = engine.attribution.bound(table.lower(), tp, method, seed, tell)
        for line in summary_lines(summary):
            click.echo(line)
    except ChorusError as err:
        _fail(err, as_json)
    finally:
        engine.close()


@main.command()
@click.option("--iterations", type=click.IntRange(min=4096), default=4096, show_default=True,
              help="PBKDF2 iterations of the verifier.")
def passwd(iterations: int) -> None:
    """Print the SCRAM-SHA-256 verifier of a password, for [analysts.NAME] password.

    The password is read from a prompt (typed twice, not echoed) or, when stdin is not a
    terminal, from the first line of stdin. Only the verifier goes into the policy: the proxy
    never stores or sees a password.

    \b
    Examples:
      chorus passwd
      printf '%s\\n' "$ANALYST_PASSWORD" | chorus passwd
    """
    from server.pgwire.scram import make_verifier

    if sys.stdin.isatty():
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True,
                                err=True)
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        click.secho("error: empty password", fg="red", err=True)
        sys.exit(REFUSED)
    click.echo(make_verifier(password, iterations=iterations))
    click.echo("put it in the policy: [analysts.NAME] password = \"<the line above>\"",
               err=True)


@main.group(invoke_without_command=True)
@click.option("--policy", "policy_path", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="The policy (TOML) file; its ledger is read.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--analyst", default=None, metavar="NAME",
              help="Show the ledger as this analyst sees it over the wire or REST: block "
              "totals and only their own spending (default: the data owner's view, everyone's).")
@click.pass_context
def budget(ctx: click.Context, policy_path: Path | None, as_json: bool,
           analyst: str | None) -> None:
    """Show the privacy budget ledger: per-block state, history, the scheduler simulator.

    Without a subcommand, prints every block's budget (like `budget status`): global, locked,
    unlocked, allocated and consumed epsilon, and the (epsilon, delta) guarantee left.

    Reading the ledger file is the data owner's right: by default every analyst's spending is
    shown. With --analyst NAME, only what that analyst may see (their own spending).

    \b
    Examples:
      chorus budget --policy demo/policy.toml
      chorus budget --policy demo/policy.toml --json
      chorus budget --policy demo/policy.toml history --limit 20
      chorus budget --policy demo/policy.toml analysts
      chorus budget --policy demo/policy.toml --analyst alice analysts
      chorus budget simulate --plot dpf.png
    """
    ctx.obj = {"policy": policy_path, "json": as_json, "analyst": analyst}
    if ctx.invoked_subcommand is None:
        ctx.invoke(budget_status)


@budget.command("status")
@click.pass_context
def budget_status(ctx: click.Context) -> None:
    """Print every block's budget (a table, or JSON with --json before the subcommand)."""
    ledger = _ledger(ctx)
    if ctx.obj["json"]:
        click.echo(json.dumps({"accounting": ledger.accounting,
                               "scheduler": ledger.settings.policy,
                               "blocks": ledger.budget_view(_viewer(ctx))}))
        return
    blocks = ledger.blocks()  # the table shows block totals only: the same for every viewer
    click.echo(f"accounting: {ledger.accounting}; scheduler: {ledger.settings.policy}; "
               f"{len(blocks)} block(s)")
    if not blocks:
        return
    columns = ("block", "state", "global", "consumed", "allocated", "unlocked", "locked",
               "epsilon left", "delta left")
    rows = [(b.block_id, b.state, f"{b.epsilon_capacity:.4g}", f"{b.epsilon_consumed:.4g}",
             f"{b.epsilon_allocated:.4g}", f"{b.epsilon_unlocked:.4g}",
             f"{b.epsilon_locked:.4g}", f"{b.epsilon_left:.4g}", f"{b.delta_left:.3g}")
            for b in blocks]
    _print_table(columns, rows)
    if ledger.accounting == "renyi":
        click.echo("(Rényi: budget columns at the order with the best guarantee; "
                   "--json shows every order)")


@budget.command("history")
@click.option("--since", type=click.IntRange(min=0), default=0, help="After this entry number.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="At most this many.")
@click.pass_context
def budget_history(ctx: click.Context, since: int, limit: int | None) -> None:
    """Print the ledger's journal: every change, oldest first."""
    import datetime

    if ctx.obj["analyst"] is not None:
        _fail(ChorusError("the journal lists every analyst's claims: it is the data owner's "
                          "view, not an analyst's",
                          hint="drop --analyst, or use `chorus budget --analyst NAME analysts`"),
              ctx.obj["json"], status=REFUSED)
    rows = _ledger(ctx).history(since, limit)
    if ctx.obj["json"]:
        click.echo(json.dumps(rows))
        return
    for row in rows:
        at = datetime.datetime.fromtimestamp(row["at"], datetime.UTC).isoformat(
            timespec="seconds")
        data = row["data"]
        what = ", ".join(data["blocks"]) if isinstance(data.get("blocks"), list) else (
            data.get("block", {}).get("block_id") if isinstance(data.get("block"), dict)
            else data.get("block") or data.get("reason") or "")
        claim = f" claim {row['claim_id']}" if row["claim_id"] is not None else ""
        click.echo(f"{row['seq']:>6} {at} {row['event']}{claim} {what}")


@budget.command("analysts")
@click.pass_context
def budget_analysts(ctx: click.Context) -> None:
    """Print each analyst's spending per block (the epsilons of their granted queries)."""
    ledger = _ledger(ctx)
    viewer = _viewer(ctx)
    spending = ledger.spending(viewer)
    limits = {name: cap for name, cap in ledger.analyst_caps.items()
              if viewer.is_owner or name == viewer.analyst}
    if ctx.obj["json"]:
        click.echo(json.dumps({"analysts": spending, "limits": limits}))
        return
    rows = [(analyst, block, f"{eps:.4g}",
             f"{limits[analyst]:g}" if analyst in limits else "-")
            for analyst, blocks in sorted(spending.items())
            for block, eps in sorted(blocks.items())]
    _print_table(("analyst", "block", "epsilon spent", "limit per block"), rows)


@budget.command("simulate")
@click.option("--workload", type=click.Choice(["single", "multi"]), default="single",
              show_default=True, help="The paper's single-block or multi-block experiment.")
@click.option("-n", "ns", type=click.IntRange(min=1), multiple=True,
              help="N values of DPF-N and RR-N (repeat the option; default: a sweep).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Also save a PNG plot here (needs matplotlib).")
@click.pass_context
def budget_simulate(ctx: click.Context, workload: str, ns: tuple[int, ...], seed: int,
                    plot_path: Path | None) -> None:
    """Run the PrivateKube microbenchmark on the real scheduler: claims granted per policy.

    \b
    Example:
      chorus budget simulate --workload single -n 50 -n 100 -n 200
    """
    from budget.simulator import Workload, plot, sweep

    w = (Workload.single_block(seed=seed) if workload == "single"
         else Workload.multi_block(seed=seed))
    results = sweep(w, ns or (25, 50, 100, 150, 200, 300))
    if ctx.obj["json"]:
        click.echo(json.dumps([r.__dict__ for r in results]))
    else:
        _print_table(("policy", "N", "arrived", "granted", "mice", "elephants"),
                     [(r.policy, "-" if r.n is None else str(r.n), r.arrived, r.granted,
                       r.granted_mice, r.granted_elephants) for r in results])
    if plot_path is not None:
        plot(results, plot_path, f"{workload} block")


def _ledger(ctx: click.Context) -> Any:
    from budget.ledger import open_ledger
    from chorus_py.policy import load_policy

    as_json = ctx.obj["json"]
    if ctx.obj["policy"] is None:
        _fail(ChorusError("--policy is required", hint="chorus budget --policy demo/policy.toml"),
              as_json, status=REFUSED)
    try:
        policy = load_policy(ctx.obj["policy"])
        ledger = open_ledger(policy.privacy, policy.source, policy.analysts)
    except PolicyError as err:
        _fail(err, as_json, status=FAILED)
    except (ValueError, OSError) as err:
        _fail(PolicyError(f"{ctx.obj['policy']}: privacy.ledger: cannot open the budget ledger: "
                          f"{err}"), as_json, status=FAILED)
    ctx.call_on_close(ledger.close)
    analyst = ctx.obj["analyst"]
    if analyst is not None and analyst not in policy.analysts:
        _fail(ChorusError(f"--analyst: the policy declares no analyst named {analyst!r}",
                          hint="give a name from the policy's [analysts.NAME] sections"),
              as_json, status=REFUSED)
    return ledger


def _viewer(ctx: click.Context) -> Any:
    """Whose view of the ledger to print: the owner's, or --analyst NAME's."""
    from budget.ledger import Viewer

    analyst = ctx.obj["analyst"]
    return Viewer.owner() if analyst is None else Viewer.of(analyst)


def _engine(policy_path: Path, as_json: bool = False) -> Any:
    from chorus_py.engine import Engine

    try:
        # One-shot: read a ranked copy a server built, never start a build to wait for at exit.
        return Engine.from_policy(policy_path, build_ranked_copies=False)
    except (PolicyError, OperationalError) as err:
        _fail(err, as_json, status=FAILED)
    except ChorusError as err:
        _fail(err, as_json)


def _fail(err: ChorusError, as_json: bool = False, status: int | None = None) -> None:
    if status is None:
        refused = isinstance(err, ProgrammingError | NotSupportedError | BudgetExhausted)
        status = REFUSED if refused else FAILED
    if as_json:
        click.echo(json.dumps({"error": {"message": err.message, "hint": err.hint,
                                         "sqlstate": err.sqlstate,
                                         "type": type(err).__name__}}))
    else:
        click.secho(f"error: {err.message}", fg="red", err=True)
        if err.hint:
            click.echo(f"hint: {err.hint}", err=True)
    sys.exit(status)


def _print_table(columns: tuple[str, ...], rows: list[tuple[Any, ...]],
                 intervals: Sequence[Sequence[Interval | NoInterval | None]] = ()) -> None:
    """Rows as a text table; a noisy cell with its 95% interval (``5,112 ± 140 (noise)``)."""
    # A cell without an interval still shows its value, with the reason beside it.
    cells = [[_cell(v) if iv is None else f"{_cell(v)} ({iv.reason})"
              if isinstance(iv, NoInterval) else format_interval(iv)
              for v, iv in zip(row, ivs, strict=True)]
             for row, ivs in zip(rows, intervals or [(None,) * len(columns)] * len(rows),
                                 strict=True)]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    click.echo("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    click.echo("  ".join("-" * w for w in widths))
    for row in cells:
        click.echo("  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)))


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return "NULL" if value is None else str(value)


def _print_report(report: dict[str, Any], verbose: bool = False) -> None:
    charged = "charged" if report["charged"] else "would charge"
    blocks = report["blocks"]
    span = f"{blocks[0]} .. {blocks[-1]}" if len(blocks) > 1 else ", ".join(blocks) or "none"
    click.secho(f"privacy: {charged} epsilon={report['epsilon']:g} delta={report['delta']:g} "
                f"on {len(blocks)} block(s) [{span}]; noise in {report['noise']}", fg="cyan")
    if report.get("random_dp"):
        r = report["random_dp"]
        click.secho(f"  random DP: gamma={r['gamma']:g}, sampled sensitivity "
                    f"{shown(r['sensitivity'])} (k = {r['k']} of m = {r['m']} samples, "
                    f"rho = {r['rho']:.4g}, n = {r['n']}: {r['n_source']})", fg="yellow")
        if verbose:
            click.echo(f"  sampling distribution P: {r['distribution']}")
    contribution = report.get("contribution")
    if contribution and contribution.get("method"):
        click.echo(f"  at most {contribution['cap']} rows per {report.get('privacy_unit')}, "
                   f"kept by the '{contribution['method']}' method (a stored set of rows)")
    elif contribution and contribution.get("cap") is not None:
        click.echo(f"  at most {contribution['cap']} rows per {report.get('privacy_unit')} "
                   f"(chosen for this query, limit {contribution['limit']}; "
                   f"epsilon {contribution['epsilon']:g} spent choosing it)")
        # The other private choices (clipping bounds, groups per unit): DP outputs, shown.
        for step in contribution.get("steps") or ():
            if step["kind"] != "cap" and step.get("chosen") is not None:
                click.echo(f"  {step['target']}: {step['chosen']} (chosen for this query, "
                           f"declared {step['declared']})")
    elif contribution:
        click.echo(f"  rows per {report.get('privacy_unit')}: chosen when the query runs "
                   f"(limit {contribution['limit']}, epsilon {contribution['epsilon']:g})")
    elif report.get("stability") is not None:
        unit = report.get("privacy_unit")
        click.echo(f"  stability {report['stability']}"
                   + (f" (at most {report['stability']} rows per {unit})" if unit else
                      " (event-level)"))
    for col in report["columns"]:
        if col["role"] == "aggregate":
            click.echo(f"  {col['name']}: {col['mechanism']}, scale {shown(col['scale'])}, "
                       f"95% error within +-{shown(col['error_bound_95'])}")
        elif col["role"] == "derived":
            click.echo(f"  {col['name']}: {col['note']}")
    if report.get("key_release"):
        kr = report["key_release"]
        if kr["method"] == "threshold":
            click.echo(f"  group keys: released when noisy count > {kr['threshold']:.1f}")
    if verbose:
        for m in report["measurements"]:
            click.echo(f"  {m['id']} = {m['aggregate']}: {m['derivation']}; "
                       f"{m['mechanism']['name']} epsilon={m['mechanism']['epsilon']:.4g} "
                       f"scale={shown(m['mechanism']['scale'])}")
        if report.get("elastic"):  # a join: S(k), the max frequencies' sources, the smooth bound
            e = report["elastic"]
            click.echo(f"  elastic stability S(k) = {e['stability']}")
            for f in e["frequencies"]:
                click.echo(f"  max frequency {f['name']}: {f['source']}"
                           + ("" if f["value"] is None else f" = {f['value']:g}"))
            click.echo("  smooth bound: " + ("data-dependent (not shown)" if e["data_dependent"]
                                             else f"S(0) = {e['at_zero']:g}, peak at k = "
                                             f"{e['peak_k']}, S* = {e['smooth_bound']:.6g}"))
        for note in report["notes"]:
            click.echo(f"  note: {note}")
        if report.get("rewritten_sql"):
            click.echo("  rewritten SQL:")
            click.echo("    " + report["rewritten_sql"])
    for warning in report.get("warnings") or ():
        click.secho(f"  warning: {warning}", fg="yellow")


def _register_owner_commands() -> None:
    """The owner's commands live in chorus_py.cli_owner (init, reload, token, reconcile)."""
    from chorus_py.cli_owner import budget_reconcile, init, reload, token

    for command in (init, reload, token):
        main.add_command(command)
    budget.add_command(budget_reconcile)


_register_owner_commands()
