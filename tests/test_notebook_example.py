"""examples/noisy_histogram.py, the analyst's notebook example, runs as documented: a noisy
histogram with its 95% error bars, drawn to a PNG (matplotlib's Agg backend, no display)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import matplotlib.image

from chorus_py.demo import generate_demo

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "noisy_histogram.py"


def test_the_notebook_extra_installs_what_the_example_imports() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["notebook"]
    assert {e.split(">")[0].split("[")[0] for e in extras} == {"pandas", "matplotlib"}
    imports = {line.split()[1].split(".")[0] for line in SCRIPT.read_text().splitlines()
               if line.startswith(("import ", "from "))}
    assert imports - {"__future__", "argparse", "pathlib", "chorus_py"} == {
        "matplotlib", "pandas"}


def test_noisy_histogram_plots_error_bars(tmp_path: Path) -> None:
    policy = generate_demo(tmp_path / "demo", rows=4000)
    out = tmp_path / "hist.png"
    run = subprocess.run([sys.executable, str(SCRIPT), "--policy", str(policy), "--out",
                          str(out), "--epsilon", "1"], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "HOME": "/tmp"},
                         check=False)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].split()[:4] == ["city", "trips", "noise_lower", "noise_upper"]
    rows = [line.split() for line in lines[1:6]]
    assert [r[0] for r in rows] == ["CHI", "LA", "NYC", "SEA", "SF"]  # every public value
    for _, trips, low, high, *_ in rows:
        assert float(low) <= int(trips) <= float(high)  # the bar inside its error bar
    # A bar can be [0, 0]: a noisy count so far below 0 that its interval, clamped to counts,
    # holds only 0 (it missed: the 5% of the time); not every bar at once.
    assert any(float(high) > float(low) for _, _, low, high, *_ in rows)
    assert lines[-1] == f"plot written to {out}"
    image = matplotlib.image.imread(out)
    assert image.shape[:2] == (400, 700)  # figsize (7, 4) at 100 dpi
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
