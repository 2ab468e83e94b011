"""Write one benchmark's section of benchmarks/RESULTS.md, leaving the other sections alone.

Each benchmark owns the text between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->``; a
section that does not exist yet is appended.
"""

from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
HEADER = "# Benchmark results\n\nEach section is written by the script it names.\n"


def write_section(name: str, text: str, path: Path = RESULTS) -> None:
    """Replace (or append) the section ``name`` of the results file with ``text``."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{start}\n{text.strip()}\n{end}"
    current = path.read_text() if path.exists() else HEADER
    if start in current and end in current:
        before = current[: current.index(start)]
        after = current[current.index(end) + len(end):]
        current = before + block + after
    else:
        current = current.rstrip() + "\n\n" + block + "\n"
    path.write_text(current)
