"""A chunked HTTP/1.1 body's messages, framed here as h11 would and written straight to
the connection (:mod:`._server`); the head and the end still go through hypercorn and h11.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import trio

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

    from hypercorn.typing import ASGISendCallable, ASGISendEvent, HTTPResponseStartEvent, HTTPScope

CONNECTION_WRITER: Final = "dynamo_trio.connection_writer"
"""The key of the connection's writer (``async (bytes) -> None``) in its ASGI state."""

_NO_BODY_STATUSES: Final = frozenset({204, 304})


def direct_chunks(scope: HTTPScope, send: ASGISendCallable) -> ASGISendCallable:
    """``send``, writing a chunked HTTP/1.1 body's messages straight to the connection.

    A write is cancelled before a chunk's bytes, never in the middle; a failed
    one closes the connection as hypercorn's do (the app gets ``http.disconnect``).
    """
    if scope.get("http_version") != "1.1":
        return send
    state: Mapping[str, Any] = scope.get("state") or {}
    write: Callable[[bytes], Awaitable[None]] | None = state.get(CONNECTION_WRITER)
    if write is None:
        return send
    head_request = scope["method"] == "HEAD"
    direct = False

    async def chunked_send(message: ASGISendEvent) -> None:
        nonlocal direct
        if direct and message["type"] == "http.response.body":
            if message.get("more_body", False):
                if data := message.get("body", b""):
                    await write(b"%x\r\n%b\r\n" % (len(data), data))
                else:
                    await trio.lowlevel.checkpoint()
                return
            direct = False  # the end goes through h11
        await send(message)
        if message["type"] == "http.response.start":
            direct = _chunked(message, head_request)

    return chunked_send


def _chunked(start: HTTPResponseStartEvent, head_request: bool) -> bool:
    """Whether h11 frames this response's body as chunked (a body of unknown length)."""
    status = start["status"]
    if head_request or status < 200 or status in _NO_BODY_STATUSES:
        return False
    return not any(
        name.lower() in (b"content-length", b"transfer-encoding")
        for name, _ in start.get("headers", ())
    )
