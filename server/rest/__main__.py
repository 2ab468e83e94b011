"""``python -m server.rest``: the REST API and dashboard alone, for one policy, until stopped.

``chorus serve`` runs the same app beside the wire protocol (:mod:`server.serve`); this entry
point serves REST only, with uvicorn's own signal handling (the REST benchmark runs it).
"""

from __future__ import annotations

import argparse
import asyncio
import logging

from chorus_py.engine import Engine
from server.heap import settle_heap
from server.rest.listener import DEFAULT_HOST, DEFAULT_PORT, parse_listen, serve_rest


def main(argv: list[str] | None = None) -> None:
    """``python -m server.rest --policy policy.toml [--listen 127.0.0.1:8000]``."""
    parser = argparse.ArgumentParser(prog="python -m server.rest",
                                     description="Serve the Chorus REST API and dashboard.")
    parser.add_argument("--policy", required=True, help="the policy (TOML) file")
    parser.add_argument("--listen", default=f"{DEFAULT_HOST}:{DEFAULT_PORT}",
                        help="HOST:PORT to listen on (default %(default)s)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log every query (the engine logs at INFO)")
    args = parser.parse_args(argv)
    host, port = parse_listen(args.listen)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    with Engine.from_policy(args.policy) as engine:
        settled = settle_heap()  # a server's process: its start owns the collector (server.heap)
        if settled is not None:
            logging.getLogger("chorus.serve").info("%s", settled.describe())
        asyncio.run(serve_rest(engine, host, port, handle_signals=True))


if __name__ == "__main__":
    main()
