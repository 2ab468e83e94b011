"""Plot a noisy histogram with its 95% error bars: the demo's trips per city in February.

Needs the ``notebook`` extra (``pip install 'chorus-py[notebook]'``: pandas, matplotlib)::

    chorus demo --dir demo --no-queries
    python examples/noisy_histogram.py --policy demo/policy.toml --out trips-per-hour.png

It runs in-process (``chorus_py.connect(policy=...)``); give ``--url http://HOST:8000`` and
``--token`` to ask a running proxy instead.  The query costs ``--epsilon`` on every block it
reads.  Each bar is a noisy count; its error bar is the 95% interval of the noise
(``cursor.intervals``: ``noise_lower``/``noise_upper``), not a sampling error: the noisy count
lands that close to the count the query computed 95% of the time.  When rows above the
contribution cap were left out, the count may also be low: the interval's ``text`` says by how
much at most, and the plot repeats it under the bars.  The cities are the policy's
``public_values``, so every city gets a bar, even one with no trips.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no window, works on a server or in CI

import matplotlib.pyplot as plt
import pandas as pd

import chorus_py
from chorus_py.clients.dbapi import Connection

SQL = ("SELECT city, COUNT(*) AS trips FROM trips "
       "WHERE pickup_time >= DATE '2026-02-01' AND pickup_time < DATE '2026-03-01' "
       "GROUP BY city ORDER BY city")


def noisy_histogram(conn: Connection, epsilon: float) -> pd.DataFrame:
    """Trips per city in February: the noisy count and its 95% interval, one row per city."""
    cur = conn.cursor()
    cur.execute(SQL, epsilon=epsilon)
    rows, intervals = cur.fetchall(), cur.intervals
    frame = pd.DataFrame(rows, columns=[d[0] for d in cur.description])
    frame["noise_lower"] = [bound["noise_lower"] for _, bound in intervals]
    frame["noise_upper"] = [bound["noise_upper"] for _, bound in intervals]
    frame["interval"] = [bound["text"] for _, bound in intervals]
    frame.attrs["epsilon"] = cur.privacy_report.epsilon
    frame.attrs["bias"] = sorted({f"up to {b['fraction']:.0%} {b['direction']} ({b['reason']})"
                                  for _, bound in intervals for b in bound.get("bias", [])})
    return frame


def plot(frame: pd.DataFrame, out: Path) -> None:
    """A bar per city, its error bar from the interval (asymmetric when the noise is)."""
    below = (frame["trips"] - frame["noise_lower"]).clip(lower=0)
    above = (frame["noise_upper"] - frame["trips"]).clip(lower=0)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(frame["city"], frame["trips"], yerr=[below, above], capsize=6, color="#4c78a8")
    ax.set_ylabel("trips (noisy count)")
    ax.set_title(f"Trips per city, February 2026 (epsilon {frame.attrs['epsilon']:g}, "
                 "95% error bars)")
    if frame.attrs["bias"]:
        fig.text(0.01, 0.01, "also possibly: " + "; ".join(frame.attrs["bias"]), fontsize=7)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", type=Path, help="a policy file: run in this process")
    parser.add_argument("--url", help="a running proxy's REST address instead")
    parser.add_argument("--token", help="your REST token (with --url)")
    parser.add_argument("--analyst", default=None, help="your analyst name (with --policy)")
    parser.add_argument("--epsilon", type=float, default=0.5)
    parser.add_argument("--out", type=Path, default=Path("trips-per-city.png"))
    args = parser.parse_args()
    if (args.policy is None) == (args.url is None):
        parser.error("give --policy (in-process) or --url (a running proxy)")
    conn = (chorus_py.connect(policy=args.policy, analyst=args.analyst) if args.policy
            else chorus_py.connect(args.url, token=args.token))
    with conn:
        frame = noisy_histogram(conn, args.epsilon)
    plot(frame, args.out)
    print(frame.to_string(index=False))
    print(f"plot written to {args.out}")


if __name__ == "__main__":
    main()
