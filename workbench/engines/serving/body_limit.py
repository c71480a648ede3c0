"""Every request body bounded, however it is framed (a pure ASGI middleware)."""

from __future__ import annotations

import re

from workbench.engines.serving.errors import error_response

MAX_BODY_BYTES = 8 * 1024 * 1024


def _declared_length(values: list[bytes]) -> int:
    """The request's Content-Length (one or more equal headers, or a comma list of equal values, as RFC 9110
    allows); ValueError when it is not a plain decimal number."""
    sizes = {v.strip() for raw in values for v in raw.decode("latin-1").split(",")}
    if len(sizes) != 1 or not re.fullmatch(r"[0-9]{1,19}", next(iter(sizes))):
        raise ValueError(f"malformed content-length {b', '.join(values)[:40]!r}")
    return int(sizes.pop())


def _body_too_large(limit: int):
    """The 413 raised from inside the body read; an HTTPException so FastAPI passes it on unchanged."""
    from starlette.exceptions import HTTPException

    return HTTPException(413, f"request body exceeds the limit of {limit} bytes; split the request",
                         headers={"connection": "close"})


class BodyLimit:
    """Pure ASGI middleware: every request body is bounded, however it is framed.

    A `content-length` over the limit is refused (413) before a byte of the body is read, a malformed one
    is a 400 (uvicorn's HTTP parser already refuses most with its own plain-text 400). A body without one
    (chunked transfer encoding) is counted as it streams in: the read that passes the limit raises a 413,
    the answer closes the connection, and the rest is never read, let alone buffered.
    """

    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = int(max_bytes)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = [v for k, v in scope.get("headers", ()) if k.lower() == b"content-length"]
        if declared:
            try:
                size = _declared_length(declared)
            except ValueError as e:
                await error_response(400, f"{e}; send the body's size in bytes, or no content-length (chunked)",
                             headers={"connection": "close"})(scope, receive, send)
                return
            if size > self.max_bytes:
                await error_response(413, f"request body of {size} bytes exceeds the limit of {self.max_bytes}; split the "
                             "request", headers={"connection": "close"})(scope, receive, send)
                return
        received = 0
        started = False
        overflow = None

        async def counted_receive():
            nonlocal received, overflow
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    overflow = _body_too_large(self.max_bytes)
                    raise overflow
            return message

        async def tracked_send(message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except Exception as e:  # our 413, where the app let it through (FastAPI answers it via the handler)
            if e is not overflow or started:
                raise
            await error_response(413, str(e.detail), headers=e.headers)(scope, receive, send)
