"""The REST front door: a thin FastAPI app over one :class:`chorus_py.engine.Engine`.

One module per concern, each importing only those before it:

- :mod:`~server.rest.problems`: errors as RFC 9457 ``application/problem+json`` documents whose
  HTTP status follows the error's SQLSTATE (the same code the wire server sends);
- :mod:`~server.rest.body`: the request body size limit (413 before the body is read);
- :mod:`~server.rest.auth`: bearer tokens against the SHA-256 digests in the policy, and who may
  call which route (analyst, owner);
- :mod:`~server.rest.models`: the request and response bodies (the OpenAPI schemas);
- :mod:`~server.rest.app`: :func:`~server.rest.app.create_app`, the routes (the endpoint table
  is there), which also mount the budget dashboard (:mod:`server.dashboard`);
- :mod:`~server.rest.listener`: uvicorn inside ``chorus serve``'s loop, and listen addresses;
- :mod:`~server.rest.__main__`: ``python -m server.rest --policy policy.toml`` on its own.

The OpenAPI document is served at ``/openapi.json``.  Nothing here imports :mod:`server.serve`,
which starts this door beside the wire protocol.
"""
