"""Edits of a policy file by the ``chorus`` command line, keeping the owner's comments and layout.

Only ``[analysts.NAME] token_sha256`` is edited (``chorus token add|revoke``).  The standard
library reads TOML but does not write it, and rewriting the whole file would drop the comments
that explain the owner's decisions; so the one key's line is replaced in place.  Every edit is
checked by parsing the result: everything but the edited analyst's digests must be unchanged,
or nothing is written and the error says to edit by hand.  The file is replaced atomically (a
temporary file renamed over it), so a running server reloading at that moment reads the old or
the new file, never half of one.
"""

from __future__ import annotations

import os
import re
import tempfile
import tomllib
from pathlib import Path

from chorus_py.errors import PolicyError
from chorus_py.policy import parse_policy

_HEADER = re.compile(r'^\s*\[\[?\s*([^\[\]#]+?)\s*\]\]?\s*(#.*)?$')
_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def _section_name(analyst: str) -> str:
    return f"analysts.{analyst}" if _BARE.match(analyst) else f'analysts."{analyst}"'


def _normal(header: str) -> str:
    """A table header's key without the blanks around its dots (those inside quotes kept)."""
    return "".join(part if part.startswith('"') else part.replace(" ", "").replace("\t", "")
                   for part in re.split(r'("[^"]*")', header))


def _value(digests: tuple[str, ...]) -> str:
    if len(digests) == 1:
        return f'"{digests[0]}"'
    return "[" + ", ".join(f'"{d}"' for d in digests) + "]"


def with_token_digests(text: str, analyst: str, digests: tuple[str, ...]) -> str:
    """``text`` with ``[analysts.<analyst>] token_sha256`` set to ``digests`` (removed when
    empty; the section added at the end when missing).  Raises :class:`PolicyError` when the
    result would change anything else."""
    lines = text.splitlines(keepends=True)
    wanted = _normal(_section_name(analyst))
    start = next((i for i, line in enumerate(lines)
                  if (m := _HEADER.match(line)) and _normal(m.group(1)) == wanted), None)
    new_line = f"token_sha256 = {_value(digests)}\n" if digests else ""
    if start is None:
        if digests:
            tail = "" if not text or text.endswith("\n") else "\n"
            lines.append(f"{tail}\n[{_section_name(analyst)}]\n{new_line}")
    else:
        end = next((i for i in range(start + 1, len(lines)) if _HEADER.match(lines[i])),
                   len(lines))
        key = next((i for i in range(start + 1, end)
                    if re.match(r"^\s*token_sha256\s*=", lines[i])), None)
        if key is None:
            lines.insert(start + 1, new_line)
        else:
            last = key
            if "[" in lines[key] and "]" not in lines[key].split("#")[0]:
                while last + 1 < end and "]" not in lines[last]:  # a multi-line array
                    last += 1
            lines[key:last + 1] = [new_line]
    result = "".join(lines)
    _check_only_tokens_changed(text, result, analyst, digests)
    return result


def _check_only_tokens_changed(before: str, after: str, analyst: str,
                               digests: tuple[str, ...]) -> None:
    fail = PolicyError(f"cannot edit [analysts.{analyst}] token_sha256 in place (the file "
                       "declares its analysts in a form this edit does not handle)",
                       hint="edit it by hand: token_sha256 = " + _value(digests or ("...",)))
    try:
        old, new = tomllib.loads(before), tomllib.loads(after)
    except tomllib.TOMLDecodeError:
        raise fail from None
    old_analyst = dict(old.get("analysts", {}).get(analyst, {}))
    new_analyst = dict(new.get("analysts", {}).get(analyst, {}))
    old_analyst.pop("token_sha256", None)
    got = new_analyst.pop("token_sha256", None)
    got = () if got is None else (got,) if isinstance(got, str) else tuple(got)
    rest_old = {k: v for k, v in old.items() if k != "analysts"}
    rest_new = {k: v for k, v in new.items() if k != "analysts"}
    others_old = {k: v for k, v in old.get("analysts", {}).items() if k != analyst}
    others_new = {k: v for k, v in new.get("analysts", {}).items() if k != analyst}
    if (got != digests or old_analyst != new_analyst or rest_old != rest_new
            or others_old != others_new):
        raise fail


def current_digests(path: Path, analyst: str) -> tuple[str, ...]:
    """The token digests the policy file at ``path`` gives ``analyst`` (validated)."""
    policy = parse_policy(_read(path), str(path))
    found = policy.analysts.get(analyst)
    return () if found is None else found.token_digests


def write_token_digests(path: Path, analyst: str, digests: tuple[str, ...]) -> None:
    """Set the analyst's digests in the file at ``path``: validated, then replaced atomically."""
    text = path.read_text(encoding="utf-8")
    result = with_token_digests(text, analyst, digests)
    parse_policy(tomllib.loads(result), str(path))  # the whole policy stays valid
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(result)
        os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _read(path: Path) -> dict[str, object]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise PolicyError(f"{path}: cannot read the policy file: {err}") from None
