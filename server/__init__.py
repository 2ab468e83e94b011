"""The front doors: every way a client reaches the one engine, and the loop that runs them.

- :mod:`server.pgwire`: the Postgres wire protocol (a sans-I/O session, its asyncio shell, the
  catalog that lets clients describe tables, SCRAM, and its ``chorus serve`` listener);
- :mod:`server.rest`: the REST app (FastAPI) and its listener;
- :mod:`server.dashboard`: the data owner's budget dashboard (static page and the data it draws),
  mounted by the REST app;
- :mod:`server.metrics`: the ledger's views as numbers, for REST, the dashboard and Prometheus;
- :mod:`server.listen`: what the doors share with the serving loop (the listener contract,
  :class:`~server.listen.ListenError`);
- :mod:`server.serve`: ``chorus serve``, which builds the engine once and runs the doors on it.

Imports go one way: ``serve`` imports the doors, the doors import ``listen`` and ``metrics``,
never ``serve``.  No door holds privacy logic: each hands SQL to the engine and maps its errors
by SQLSTATE.
"""
