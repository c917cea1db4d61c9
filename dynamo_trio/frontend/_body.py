"""One response on its way from the request's producer to quart: :class:`Reply`.

The producer sends; the view takes the first thing sent (an answer, a failure,
or a stream's first bytes); quart iterates the rest as the body, gathering the
chunks already waiting into one write.  Once the client leaves, the
producer's sends are discarded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, Self

import trio
from quart.wrappers.response import ResponseBody

from ..llm import keepalive_comment

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import TracebackType

__all__ = ["Reply"]

# The most bytes gathered into one write from chunks already waiting.
_COALESCE_LIMIT: Final = 64 * 1024


class Reply(ResponseBody):
    """A response's channel: the producer's :meth:`send`, the view's :meth:`first`,
    quart's body iteration.

    ``sent_any``: something reached the view; ``broken``: nobody listens any more
    (sends are discarded); ``stream_failure``: once a stream has started, the bytes
    that end it with ``(status, message)`` (its API's error event).
    """

    def __init__(self, depth: int = 16) -> None:
        self._send, self._chunks = trio.open_memory_channel[Any](depth)
        self.sent_any = False
        self.broken = False
        self.stream_failure: Callable[[int, str], bytes] | None = None
        self._first: bytes | None = None
        self._keepalive = 0.0
        self._ended = False  # the channel ran dry while gathering: end at the next call

    # -- the producer's side

    async def send(self, event: object) -> None:
        """Send ``event`` to the view (the first) or the body (a stream's bytes after
        its first); once nobody listens, discard it."""
        if self.broken:
            return
        try:
            try:
                # Room in the channel (the usual case): no trip through the scheduler;
                # the producer's next receive is its checkpoint.
                self._send.send_nowait(event)
            except trio.WouldBlock:
                await self._send.send(event)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.broken = True
        else:
            self.sent_any = True

    def close(self) -> None:
        """The producer is done (synchronous: the end, without a checkpoint)."""
        self._send.close()

    # -- the view's side

    async def first(self) -> object:
        """The first thing sent; ``None`` if the producer ended having sent nothing.
        Unless it is a stream's first bytes, nothing more is read."""
        try:
            first = await self._chunks.receive()
        except trio.EndOfChannel:
            first = None
        except BaseException:
            self._chunks.close()
            raise
        if isinstance(first, bytes):
            self._first = first
        else:
            self._chunks.close()
        return first

    def stream(self, *, keepalive: float) -> Self:
        """From now on, the body quart sends (keep-alive comments after ``keepalive``
        seconds of silence, 0 for never)."""
        self._keepalive = keepalive
        return self

    # -- quart's side

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
