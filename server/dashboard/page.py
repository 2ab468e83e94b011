"""The dashboard's static page: its files, read once, served with a strict content policy.

:func:`pages` gives the REST app one handler per URL (``/dashboard`` and each file under
``/dashboard/``), with no authentication: the page holds no data, and the data it fetches
(``/v1/dashboard``) needs the owner token.  The files ship in the wheel as package data of
``server.dashboard`` (pyproject.toml).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from fastapi.responses import Response

_DIR = Path(__file__).resolve().parent
#: The page's files and their media types.
FILES = {
    "index.html": "text/html; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}
# The dashboard loads nothing from elsewhere: no CDN, no inline script.
_PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; "
    "form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def pages(refresh_ms: int) -> dict[str, Callable[[], Awaitable[Response]]]:
    """URL path -> handler for the page and each of its files; the page refreshes its data
    every ``refresh_ms`` milliseconds."""
    contents = {name: (_DIR / name).read_bytes() for name in FILES}

    def page(name: str) -> Callable[[], Awaitable[Response]]:
        async def serve_page() -> Response:
            body = contents[name]
            if name == "index.html":
                body = body.replace(b"{{REFRESH_MS}}", str(int(refresh_ms)).encode())
            return Response(body, media_type=FILES[name], headers=_PAGE_HEADERS)
        return serve_page

    return {"/dashboard": page("index.html"),
            **{f"/dashboard/{name}": page(name) for name in FILES}}
