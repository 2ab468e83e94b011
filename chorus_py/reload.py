"""Reloading a served policy without a restart (``SIGHUP``, ``chorus reload``).

What a reload may change is what names people and their rights: ``[analysts.*]`` (who may log
in, their passwords, REST token digests and per-analyst limits) and ``[server]
owner_token_sha256``.  Everything else describes the data and its budget (tables, bounds,
blocks, ``[privacy]``, the backend) or the sockets (``[server]`` TLS and timeouts,
``[limits]``): the engine's caches, the ledger's blocks and the open sessions were built from
it, so a changed value there would silently apply to some queries and not others.  Such a
reload is refused as a whole and the old policy stays; those changes need a restart.

A reload that fails validation (TOML, types, the rules of :mod:`chorus_py.policy`) also keeps
the old policy; :func:`reload_policy` says why, for the server's log.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chorus_py.errors import ChorusError, PolicyError
from chorus_py.policy import Policy, load_policy

# Keys a reload may change; every other key must be equal (model_dump's exclude shape).
_RELOADABLE: dict[str, Any] = {"analysts": True, "source": True,
                               "server": {"owner_token_sha256"}}


@dataclass(frozen=True)
class ReloadOutcome:
    """What a reload did: ``applied``, and a one-line summary (or why it was refused)."""

    applied: bool
    message: str


def reload_differences(old: Policy, new: Policy) -> list[str]:
    """The top-level keys (``tables``, ``privacy.epsilon_per_block`` ...) whose change needs a
    restart: empty when ``new`` may replace ``old`` in a running server."""
    before = old.model_dump(exclude=_RELOADABLE)
    after = new.model_dump(exclude=_RELOADABLE)
    changed: list[str] = []
    for key in sorted(set(before) | set(after)):
        a, b = before.get(key), after.get(key)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict) and key != "tables":
            changed += [f"{key}.{k}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        else:
            changed.append(key)
    return changed


def summarize(old: Policy, new: Policy) -> str:
    """Analysts added, removed and changed, and whether the owner's token changed."""
    added = sorted(set(new.analysts) - set(old.analysts))
    removed = sorted(set(old.analysts) - set(new.analysts))
    changed = sorted(n for n in set(old.analysts) & set(new.analysts)
                     if old.analysts[n] != new.analysts[n])
    parts = [f"{label}: {', '.join(names)}" for label, names in
             (("added", added), ("removed", removed), ("changed", changed)) if names]
    if old.server.owner_token_sha256 != new.server.owner_token_sha256:
        parts.append("owner token changed")
    return "; ".join(parts) or "no change"


def reload_policy(engine: Any, path: str | Path) -> ReloadOutcome:
    """Read ``path`` again and hand it to ``engine`` (:meth:`Engine.adopt_policy`) if it is
    valid and changes only what a reload may change; otherwise keep the current policy."""
    old = engine.policy
    try:
        new = load_policy(path)
    except ChorusError as err:
        return ReloadOutcome(False, f"reload of {path} refused, the old policy stays: "
                             f"{err.message}")
    if old.analysts and not new.analysts:
        # With no analyst declared the engine accepts any name (a policy for one in-process
        # user): sessions opened by the removed analysts would go on asking.
        return ReloadOutcome(False, f"reload of {path} refused, the old policy stays: it "
                             "declares no analyst, which would let open sessions go on under "
                             "any name; keep one analyst, or stop the server")
    restart = reload_differences(old, new)
    if restart:
        return ReloadOutcome(False, f"reload of {path} refused, the old policy stays: "
                             f"{', '.join(restart)} changed, which takes a restart (a reload "
                             "changes analysts, their tokens, passwords and limits, and the "
                             "owner's token)")
    summary = summarize(old, new)
    engine.adopt_policy(new)
    return ReloadOutcome(True, f"reloaded {path}: {summary}")


def pid_file_for(policy_path: str | Path) -> Path:
    """Where ``chorus serve`` writes its process id by default: ``<policy stem>.pid`` next to
    the policy file (as the ledger's default ``<stem>.budget.sqlite3``)."""
    path = Path(policy_path)
    return path.with_name(f"{path.stem}.pid")


def signal_server(pid_file: Path) -> int:
    """Send SIGHUP to the ``chorus serve`` whose id ``pid_file`` holds; its id.

    Raises :class:`PolicyError` naming the problem when there is no such server."""
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        raise PolicyError(f"{pid_file}: no process id of a running `chorus serve`",
                          hint="start it with `chorus serve --policy ...` (it writes this "
                               "file), or pass --pid-file") from None
    try:
        os.kill(pid, signal.SIGHUP)
    except ProcessLookupError:
        raise PolicyError(f"{pid_file}: process {pid} is not running (a stale file)",
                          hint="start `chorus serve` again; it rewrites the file") from None
    except PermissionError:
        raise PolicyError(f"{pid_file}: not allowed to signal process {pid}",
                          hint="run `chorus reload` as the user that runs `chorus serve`"
                          ) from None
    return pid
