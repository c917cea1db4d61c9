"""A streamed response body (SSE, MJPEG, audio): reads a channel, gathers what waits,
sends SSE keep-alives (never into a body that is not SSE: ``keepalive`` 0).

quart sends a body as ``async with body: async for chunk in body: send(chunk)``.
:class:`StreamBody` reads the producer's chunks from a memory channel; when
the client goes away mid-stream, quart-trio cancels that loop and
``__aexit__`` closes the channel, so the producer learns nobody is listening
(what that does to the request is :mod:`._hangup`'s business, not the body's).

Chunks that are already waiting when the body asks for one are sent
together: under load that is one write instead of dozens, and it never
delays a chunk (only what is already there is taken).

During long silences (a slow prefill) it sends an SSE comment every
``keepalive`` seconds, so proxies keep the connection open and a client that
vanished without a FIN is found out by the failed write.

Over HTTP/1.1 the edge writes each chunk quart sends straight to the
connection (:func:`~dynamo_trio.edge.direct_chunks`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Self

import trio
from quart.wrappers.response import ResponseBody

from ..llm import keepalive_comment

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["StreamBody"]

# The most bytes gathered into one write from chunks already waiting.
_COALESCE_LIMIT: Final = 64 * 1024


class StreamBody(ResponseBody):
    """A streamed body fed by a memory channel of byte chunks.

    Args:
        first: The chunk that was ready before the response started.
        chunks: The rest; the producer closes its end when the stream is over.
        keepalive: Seconds of silence before a keep-alive comment; 0 for never.
    """

    def __init__(
        self,
        first: bytes,
        chunks: trio.MemoryReceiveChannel[bytes],
        *,
        keepalive: float,
    ) -> None:
        self._first: bytes | None = first
        self._chunks = chunks
        self._keepalive = keepalive
        self._ended = False  # the channel ran dry while gathering: end at the next call

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Synchronous on purpose: this may run under quart-trio's cancellation.
        self._chunks.close()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> bytes:
        piece = await self._next(self._keepalive)
        if piece is None:
            raise StopAsyncIteration
        return piece

    async def _next(self, keepalive: float) -> bytes | None:
        """The next piece to send (the chunks waiting, gathered; or a keep-alive
        comment after ``keepalive`` seconds of silence, if not 0); ``None`` once
        the stream is over."""
        if self._first is not None:
            first, self._first = self._first, None
            return self._gather(first)
        if self._ended:
            return None
        try:
            # A chunk already waiting (the usual case under load) needs no timer and
            # no extra trip through the scheduler: the send right after this is the
            # checkpoint.
            return self._gather(self._chunks.receive_nowait())
        except trio.WouldBlock:
            pass
        except trio.EndOfChannel:
            return None
        try:
            if keepalive <= 0:
                return self._gather(await self._chunks.receive())
            with trio.move_on_after(keepalive):
                return self._gather(await self._chunks.receive())
            return keepalive_comment()
        except trio.EndOfChannel:
            return None

    def _gather(self, chunk: bytes) -> bytes:
        """``chunk`` plus whatever else is already waiting, up to the limit."""
        parts = [chunk]
        size = len(chunk)
        while size < _COALESCE_LIMIT:
            try:
                more = self._chunks.receive_nowait()
            except trio.WouldBlock:
                break
            except trio.EndOfChannel:
                self._ended = True
                break
            parts.append(more)
            size += len(more)
        return parts[0] if len(parts) == 1 else b"".join(parts)
