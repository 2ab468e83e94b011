"""The data owner's and operator's commands of ``chorus``: init, reload, token, budget reconcile.

:mod:`chorus_py.cli` registers them; they stay here so the query commands' module stays small.
Exit status as the rest of the CLI: 0 on success, 1 on a failure (a message and a hint).
"""

from __future__ import annotations

import hashlib
import secrets
import sys
from pathlib import Path
from typing import NoReturn

import click

from chorus_py.errors import ChorusError, PolicyError

_POLICY = click.option("--policy", "policy_path", required=True,
                       type=click.Path(dir_okay=False, path_type=Path),
                       help="The policy (TOML) file.")


def _fail(err: ChorusError) -> NoReturn:
    click.secho(f"error: {err.message}", fg="red", err=True)
    if err.hint:
        click.echo(f"hint: {err.hint}", err=True)
    sys.exit(1)


@click.command()
@click.option("--from", "url", required=True, metavar="URL",
              help="The database: postgresql://user@host/db, duckdb:///path.duckdb, or "
                   "spark://local with --parquet")
@click.option("--parquet", "parquet", default=None,
              type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="With --from spark://local: the directory whose <table>.parquet entries "
                   "are the tables (the draft's [backend.spark] warehouse).")
@click.option("--out", "out", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("policy.toml"), show_default=True, help="Where to write the draft.")
@click.option("--analyst", default="analyst", show_default=True,
              help="Name of the analyst the draft declares (with a new REST token).")
@click.option("--force", is_flag=True, help="Overwrite --out if it exists.")
def init(url: str, parquet: Path | None, out: Path, analyst: str, force: bool) -> None:
    """Draft a policy from a database's schema and data, for the data owner to review.

    Guesses the privacy unit, rows per unit, block columns, public lookup tables and bounds of
    numeric columns, and says why in comments; TODO comments mark each decision to make.
    Prints the analyst's REST token once (only its SHA-256 is written).  The draft quotes the
    data (quantiles, categories): it is the owner's file, never an analyst's.

    \b
    Examples:
      chorus init --from postgresql://owner@127.0.0.1:5432/clinic --out policy.toml
      chorus init --from duckdb:///data.duckdb
      chorus init --from spark://local --parquet lake/ --out policy.toml
      chorus check --policy policy.toml
    """
    from chorus_py.backends import StatementFailed, open_backend
    from chorus_py.draft import draft_policy
    from chorus_py.errors import OperationalError
    from chorus_py.policy import BackendConfig, SparkConfig

    if out.exists() and not force:
        _fail(PolicyError(f"{out} exists", hint="choose another --out, or pass --force"))
    spark = None
    if url.startswith("sc://"):
        # The cluster's paths cannot be listed from here, and init reads every table whole.
        _fail(PolicyError("chorus init drafts from a local Spark, not over Spark Connect",
                          hint="draft from a copy of the Parquet files (--from spark://local "
                               "--parquet DIR), then set url = \"sc://...\" and the cluster's "
                               "paths in [backend.spark] tables (docs/owner-guide.md)"))
    if url.startswith("spark://"):
        if parquet is None:
            _fail(PolicyError("--from spark://local needs --parquet DIR",
                              hint="the directory whose <table>.parquet files are the tables"))
        # The stores' directory the drafted policy will use by default (load_policy).
        spark = SparkConfig(warehouse=str(parquet.resolve()),
                            private_dir=str(out.parent.resolve() / f"{out.name}.spark-private"))
    elif parquet is not None:
        _fail(PolicyError("--parquet is for --from spark://local"))
    try:
        dialect = BackendConfig(url=url, spark=spark).dialect
    except ValueError:
        _fail(PolicyError(f"--from {url!r}: expected a postgresql://, duckdb:/// or "
                          "spark://local URL"))
    try:
        backend = open_backend(url, spark=spark)
    except (ChorusError, OSError) as err:
        _fail(err if isinstance(err, ChorusError) else OperationalError(str(err)))
    try:
        draft = draft_policy(url, backend, dialect, out.parent, analyst, parquet)
    except ChorusError as err:
        _fail(err)
    except StatementFailed as err:
        _fail(OperationalError(f"reading the schema failed: {err.detail}"))
    finally:
        backend.close()
    # Owner-only: it quotes the data and may hold the database password.
    out.parent.mkdir(parents=True, exist_ok=True)
    out.touch(mode=0o600, exist_ok=True)
    out.write_text(draft.text, encoding="utf-8")
    for message in draft.messages:
        click.secho(message, fg="yellow" if message.startswith("WARNING") else None, err=True)
    click.echo(f"policy drafted in {out}: review every TODO, then `chorus check --policy {out}`")
    click.echo(f"REST token of analyst '{draft.analyst}' (shown once, only its hash is kept): "
               f"{draft.token}")


@click.command()
@_POLICY
@click.option("--pid-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The pid file `chorus serve` wrote (default: <policy stem>.pid next to it).")
def reload(policy_path: Path, pid_file: Path | None) -> None:
    """Make a running `chorus serve` read its policy again, without dropping sessions.

    Checks the file first (an error here leaves the server as it is), then sends SIGHUP to the
    server's process.  A reload changes analysts, their passwords, tokens and limits, and the
    owner's token; other changes need a restart (the server says so and keeps the old policy).
    The server prints the outcome on its standard error.

    Example: chorus reload --policy policy.toml
    """
    from chorus_py.policy import load_policy
    from chorus_py.reload import pid_file_for, signal_server

    try:
        load_policy(policy_path)
        pid = signal_server(pid_file or pid_file_for(policy_path))
    except ChorusError as err:
        _fail(err)
    click.echo(f"asked chorus serve (pid {pid}) to reload {policy_path}; it prints the outcome")


@click.group()
def token() -> None:
    """Add or revoke an analyst's REST tokens (their SHA-256 is written into the policy).

    An analyst may hold several tokens at once, so a token can be rotated without a moment
    where none works: add a new one, hand it over, revoke the old one.  `chorus reload` (or
    --reload) applies the change to a running server.

    \b
    Examples:
      chorus token add --policy policy.toml alice --reload
      chorus token revoke --policy policy.toml alice --oldest --reload
    """


def _reload_after(policy_path: Path, reload_now: bool) -> None:
    from chorus_py.reload import pid_file_for, signal_server

    if not reload_now:
        click.echo(f"apply it to a running server: chorus reload --policy {policy_path}",
                   err=True)
        return
    try:
        pid = signal_server(pid_file_for(policy_path))
    except ChorusError as err:
        _fail(err)
    click.echo(f"asked chorus serve (pid {pid}) to reload", err=True)


@token.command("add")
@_POLICY
@click.argument("analyst")
@click.option("--reload", "reload_now", is_flag=True, help="Then reload the running server.")
def token_add(policy_path: Path, analyst: str, reload_now: bool) -> None:
    """Create a token for ANALYST (declared if new); print it once, write its SHA-256."""
    from chorus_py.policy_edit import current_digests, write_token_digests

    new = secrets.token_urlsafe(32)
    digest = hashlib.sha256(new.encode()).hexdigest()
    try:
        write_token_digests(policy_path, analyst,
                            (*current_digests(policy_path, analyst), digest))
    except ChorusError as err:
        _fail(err)
    click.echo(new)
    click.echo(f"the token above is for analyst '{analyst}' (shown once); its SHA-256 "
               f"{digest[:12]}... is in {policy_path}", err=True)
    _reload_after(policy_path, reload_now)


@token.command("revoke")
@_POLICY
@click.argument("analyst")
@click.option("--sha256", "prefix", default=None, metavar="PREFIX",
              help="The token's SHA-256, or its first 8 or more hex digits.")
@click.option("--oldest", is_flag=True, help="The first token listed (the one a rotation "
              "replaces).")
@click.option("--all", "every", is_flag=True, help="Every token of the analyst.")
@click.option("--reload", "reload_now", is_flag=True, help="Then reload the running server.")
def token_revoke(policy_path: Path, analyst: str, prefix: str | None, oldest: bool,
                 every: bool, reload_now: bool) -> None:
    """Remove one or all of ANALYST's tokens from the policy."""
    from chorus_py.policy_edit import current_digests, write_token_digests

    try:
        if sum((prefix is not None, oldest, every)) != 1:
            raise PolicyError("say which token: --sha256 PREFIX, --oldest or --all")
        have = current_digests(policy_path, analyst)
        if not have:
            raise PolicyError(f"analyst '{analyst}' has no token in {policy_path}")
        if every:
            gone = have
        elif oldest:
            gone = have[:1]
        else:
            assert prefix is not None
            gone = tuple(d for d in have if len(prefix) >= 8 and d.startswith(prefix.lower()))
            if len(gone) != 1:
                raise PolicyError(f"--sha256 {prefix}: matches {len(gone)} of the analyst's "
                                  "tokens", hint="give at least 8 hex digits of one of: "
                                  + ", ".join(d[:12] for d in have))
        write_token_digests(policy_path, analyst, tuple(d for d in have if d not in gone))
    except ChorusError as err:
        _fail(err)
    click.echo(f"revoked {len(gone)} token(s) of '{analyst}' ({', '.join(d[:12] for d in gone)})"
               f"; {len(have) - len(gone)} left", err=True)
    _reload_after(policy_path, reload_now)


@click.command("reconcile")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def budget_reconcile(ctx: click.Context, yes: bool) -> None:
    """Raise every block whose budget is below the policy's epsilon_per_block / delta_per_block
    to it (a block keeps the budget it was created with otherwise).  Journaled in the ledger.

    More budget for blocks already spent on is a privacy decision: the same rows may then be
    queried more.  Budgets are never lowered (what was spent cannot be taken back).

    Example: chorus budget --policy policy.toml reconcile
    """
    from budget.ledger import open_ledger
    from chorus_py.policy import load_policy

    if ctx.obj["policy"] is None:
        _fail(ChorusError("--policy is required",
                          hint="chorus budget --policy policy.toml reconcile"))
    try:
        policy = load_policy(ctx.obj["policy"])
        ledger = open_ledger(policy.privacy, policy.source, policy.analysts)
    except ChorusError as err:
        _fail(err)
    try:
        privacy = policy.privacy
        target = (privacy.epsilon_per_block, privacy.delta_per_block)
        below = [b.block_id for b in ledger.blocks()
                 if (b.epsilon_global, b.delta_global) != target
                 and b.epsilon_global <= target[0] and b.delta_global <= target[1]]
        if not below:
            click.echo(f"every block already has the policy's budget or more (epsilon "
                       f"{target[0]:g}, delta {target[1]:g}): nothing to do")
            return
        click.echo(f"{len(below)} block(s) ({below[0]} .. {below[-1]}) would be raised to "
                   f"epsilon {target[0]:g}, delta {target[1]:g}")
        if not yes and not click.confirm("raise them (a privacy decision)?", err=True):
            sys.exit(1)
        raised = ledger.raise_budgets(*target)
        click.echo(f"raised {len(raised)} block(s); journaled as block_budget_raised "
                   "(`chorus budget history`)")
    finally:
        ledger.close()
