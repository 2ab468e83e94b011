"""`chorus --version`: the installed package's version (its metadata), as operators expect."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_version_is_the_package_metadata() -> None:
    chorus = Path(sys.executable).parent / "chorus"
    out = subprocess.run([str(chorus), "--version"], capture_output=True, text=True,
                         timeout=60, check=True)
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert out.stdout == f"chorus {version('chorus-py')}\n"
    assert version("chorus-py") == declared
