"""Writing a streamed HTTP/1.1 response body's chunks straight to the connection.

An SSE stream is thousands of small body pieces.  Sent as ASGI messages, each
piece walks quart's body loop, the edge's ``send``, hypercorn's ``HTTPStream``
and ``H11Protocol`` and h11's chunked writer before reaching the socket; that
walk costs more CPU than the piece's own encoding.

:class:`ChunkWriter` is the short way for the body of an HTTP/1.1 response
that h11 frames as ``Transfer-Encoding: chunked``: it frames each piece as one
chunk (``<size in hex>\r\n<data>\r\n``, as h11 does) and hands the bytes to
the connection's writer (:mod:`._server`): one non-blocking write when the
socket has room, ordered with hypercorn's own writes through the connection's
send lock otherwise; a failed write closes the connection the way hypercorn's
failed writes do (the app gets ``http.disconnect``, and the hang-up rule
applies).  The response's head and its end (the zero-length chunk) still go
through hypercorn and h11, which do not count the bytes of a chunked body.

It is offered to the app in ``scope["extensions"]`` under
:data:`CHUNK_WRITER` for HTTP/1.1 requests served by
:func:`~dynamo_trio.edge.serve_http` (which puts the connection's writer in
the connection state under :data:`CONNECTION_WRITER`).  It is usable only
between a ``http.response.start`` that h11 will frame as chunked and the last
``http.response.body``: an app checks :attr:`ChunkWriter.usable` and sends
ASGI messages otherwise (HTTP/1.0, a sized body, a ``HEAD``, HTTP/2).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, cast, final

import trio

from ._extensions import offered, put_offer

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

    from hypercorn.typing import (
        ASGISendCallable,
        ASGISendEvent,
        HTTPResponseStartEvent,
        HTTPScope,
    )

__all__ = ["CHUNK_WRITER", "CONNECTION_WRITER", "ChunkWriter"]

CHUNK_WRITER: Final = "dynamo_trio.chunk_writer"
"""The key of a request's :class:`ChunkWriter` in ``scope["extensions"]``."""

CONNECTION_WRITER: Final = "dynamo_trio.connection_writer"
"""The key of the connection's writer (``async (bytes) -> None``) in its ASGI state."""

# Responses h11 sends without a body, whatever the app sends.
_NO_BODY_STATUSES: Final = frozenset({204, 304})


@final
class ChunkWriter:
    """One HTTP/1.1 response's body chunks, written to the connection directly.

    Made by the edge per request (see the module docstring); the edge's
    :meth:`watch` wrapper of ``send`` decides when it is usable.
    """

    __slots__ = ("_head_request", "_write", "usable")

    def __init__(self, write: Callable[[bytes], Awaitable[None]], *, head_request: bool) -> None:
        self._write = write
        self._head_request = head_request
        self.usable = False
        """Whether :meth:`write` may be called now: the response's head was sent,
        h11 frames its body as chunked, and its last body message was not."""

    @classmethod
    def offer(cls, scope: HTTPScope, send: ASGISendCallable) -> ASGISendCallable:
        """Put a writer in ``scope["extensions"]`` if this request can have one;
        returns the ``send`` to give the app (watched, if a writer was offered)."""
        if scope.get("http_version") != "1.1":
            return send
        state: Mapping[str, Any] = scope.get("state") or {}
        write = state.get(CONNECTION_WRITER)
        if write is None:
            return send
        writer = cls(write, head_request=scope["method"] == "HEAD")
        put_offer(scope, CHUNK_WRITER, writer)
        return writer.watch(send)

    @staticmethod
    def of(scope: Mapping[str, Any]) -> ChunkWriter | None:
        """The writer the edge offered for the request of ``scope``, if any."""
        found = offered(scope, CHUNK_WRITER)
        return found if isinstance(found, ChunkWriter) else None

    def watch(self, send: ASGISendCallable) -> ASGISendCallable:
        """``send``, noting when the response's chunked body begins and ends."""

        async def watched(message: ASGISendEvent) -> None:
            kind = message["type"]
            if kind == "http.response.start":
                await send(message)
                self.usable = self._chunked(message)  # after the head went out
            elif kind == "http.response.body" and not message.get("more_body", False):
                self.usable = False  # before the end goes out
                await send(message)
            else:
                await send(message)

        return watched

    def _chunked(self, message: ASGISendEvent) -> bool:
        """Whether h11 frames this response's body as chunked (HTTP/1.1 peer, a
        body of unknown length)."""
        start = cast("HTTPResponseStartEvent", message)
        status = start["status"]
        if self._head_request or status < 200 or status in _NO_BODY_STATUSES:
            return False
        return not any(
            name.lower() in (b"content-length", b"transfer-encoding")
            for name, _ in start.get("headers", ())
        )

    async def write(self, data: bytes) -> None:
        """Send ``data`` as one chunk (nothing for empty data).

        The write is the connection's: a cancellation point (a cancellation
        lands before the chunk's bytes, never in the middle of them) that yields
        to the scheduler only while the socket's buffer is full; so a loop of
        writes must block somewhere else (on the source of its data).  If the
        write fails, the connection is closed and the app gets
        ``http.disconnect``, as when hypercorn's own write fails.

        Raises:
            RuntimeError: the writer is not usable now (see :attr:`usable`).
        """
        if not self.usable:
            raise RuntimeError("no chunked response body is being sent on this connection")
        if data:
            await self._write(b"%x\r\n%b\r\n" % (len(data), data))
        else:
            await trio.lowlevel.checkpoint()
