"""The request body limit of the REST app: bodies over the limit get 413 before they are read.

:class:`BodyLimit` is ASGI middleware, so the limit holds for every route, whatever FastAPI
would otherwise buffer.  The SQL text has its own, shorter limit in the request model
(:data:`server.rest.models.MAX_SQL_CHARS`).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.rest.problems import problem

#: Largest request body accepted (bytes); larger ones get 413 before they are read.
MAX_BODY_BYTES = 64 * 1024


class BodyLimit:
    """Refuse request bodies over ``max_bytes`` (declared or streamed) with 413.

    Bodies are small, so the middleware reads the whole body first (stopping at the limit) and
    hands it to the app in one piece: the app never sees a partial body.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            try:
                too_large = int(declared) > self.max_bytes
            except ValueError:
                response = problem(400, "the Content-Length header is not a number",
                                   sqlstate="08P01")
                await response(scope, receive, send)
                return
            if too_large:
                await self._refuse(scope, receive, send)
                return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = problem(413, f"the request body is larger than {self.max_bytes} bytes",
                           sqlstate="54000", hint="send a shorter SQL statement",
                           instance=scope.get("path"), headers={"Connection": "close"})
        await response(scope, receive, send)
