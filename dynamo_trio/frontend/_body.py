"""The SSE response body: reads a channel, sends keep-alives, notices a hang-up.

quart sends a body as ``async with body: async for chunk in body: send(chunk)``
and, when the client goes away mid-stream, quart-trio cancels that loop:
``__aexit__`` then runs with the cancellation.  :class:`StreamBody` uses that
to tell a finished stream (the channel ran dry) from an abandoned one (it did
not), and reports the latter to the request's lifecycle at once, in
``__aexit__``, without a checkpoint.

During long silences (a slow prefill) it sends an SSE comment every
``keepalive`` seconds, so proxies keep the connection open and a client that
vanished without a FIN is found out by the failed write.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Self

import trio
from quart.wrappers.response import ResponseBody

from ..llm import keepalive_comment

if TYPE_CHECKING:
    from types import TracebackType

    from ._lifecycle import RequestLifecycle

__all__ = ["StreamBody"]


class StreamBody(ResponseBody):
    """An SSE body fed by a memory channel of byte chunks.

    Args:
        first: The chunk that was ready before the response started.
        chunks: The rest; the producer closes its end when the stream is over.
        lifecycle: Told when the client leaves before the end.
        keepalive: Seconds of silence before a keep-alive comment; 0 for never.
    """

    def __init__(
        self,
        first: bytes,
        chunks: trio.MemoryReceiveChannel[bytes],
        lifecycle: RequestLifecycle,
        *,
        keepalive: float,
    ) -> None:
        self._first: bytes | None = first
        self._chunks = chunks
        self._lifecycle = lifecycle
        self._keepalive = keepalive
        self._complete = False

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Synchronous on purpose: this may run under quart-trio's cancellation.
        if not self._complete:
            self._lifecycle.client_gone()
        self._chunks.close()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> bytes:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        try:
            if self._keepalive <= 0:
                return await self._chunks.receive()
            with trio.move_on_after(self._keepalive):
                return await self._chunks.receive()
            return keepalive_comment()
        except trio.EndOfChannel:
            self._complete = True
            raise StopAsyncIteration from None
