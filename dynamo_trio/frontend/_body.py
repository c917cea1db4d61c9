"""One response on its way from the request's producer to quart: :class:`Reply`
(docs/architecture.md, "A request in the frontend").
"""

from __future__ import annotations

from contextlib import suppress
from typing import TYPE_CHECKING, Any, Final, Self

import trio
from quart.wrappers.response import ResponseBody

from ..llm import keepalive_comment

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

_COALESCE_LIMIT: Final = 64 * 1024  # the most bytes of waiting chunks gathered into one write


class Reply(ResponseBody):
    """A response's channel: the producer's :meth:`send`, the view's :meth:`first`,
    quart's body iteration.  ``stream_failure``: once a stream has started, the bytes
    that end it with ``(status, message)`` (its API's error event).
    """

    def __init__(self, *, keepalive: float = 0.0) -> None:
        self._send, self._chunks = trio.open_memory_channel[Any](16)
        self.sent_any = False  # something reached the view
        self.broken = False  # nobody listens any more: sends are discarded
        self.stream_failure: Callable[[int, str], bytes] | None = None
        self.keepalive: Final = keepalive  # seconds of silence before a comment (0: never)
        self._last_piece = 0.0  # trio.current_time() of the body's last lent piece
        self._first: bytes | None = None
        self._ended = False  # the channel ran dry while gathering: end at the next call
        self._pull: Callable[[], Awaitable[bytes | None]] | None = None  # lent, see lend()
        self._returned: trio.Event | None = None  # set when the body gives the pull back
        self._pull_error: BaseException | None = None
        self._body_done = False

    # -- the producer's side

    async def send(self, event: object) -> None:
        """Send ``event`` to the view (the first) or the body; once nobody listens, discard it."""
        if self.broken:
            return
        try:
            try:
                # Room (the usual case): no trip through the scheduler.
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

    async def lend(
        self, pull: Callable[[], Awaitable[bytes | None]], nudge: Callable[[], None]
    ) -> None:
        """Let the body pull its pieces itself, in its task, until ``pull`` returns ``None``;
        then return, the producer going on.  ``nudge`` (after :attr:`keepalive` seconds without
        a piece) makes a waiting pull return a keep-alive comment; what ``pull`` raises is
        raised here.  If the body stops first (the client left), return at once; cancelled
        here, the producer takes the source back (a piece pulled meanwhile is dropped)."""
        if self._body_done or self.broken:
            await trio.lowlevel.checkpoint()
            return
        self._pull = pull
        self._returned = returned = trio.Event()
        self._last_piece = trio.current_time()
        with suppress(trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            self._send.send_nowait(b"")  # a body waiting for a send: look again
        try:
            if self.keepalive <= 0:
                await returned.wait()
            while not returned.is_set():
                with trio.move_on_at(self._last_piece + self.keepalive):
                    await returned.wait()
                if trio.current_time() >= self._last_piece + self.keepalive:
                    self._last_piece = trio.current_time()
                    nudge()
        finally:
            self._pull = None
        error, self._pull_error = self._pull_error, None
        if error is not None:
            raise error

    # -- the view's side

    async def first(self) -> object:
        """The first thing sent (``None``: nothing was); only a stream's bytes read on."""
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

    # -- quart's side

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        # Synchronous on purpose: this may run under quart-trio's cancellation.
        self._body_done = True
        self._give_back()
        self._chunks.close()

    def __aiter__(self) -> Self:
        return self

    def _give_back(self, error: BaseException | None = None) -> None:
        """The body is done with the lent source (``error``: what pulling raised)."""
        if self._pull is not None:
            self._pull = None
            self._pull_error = error
            if self._returned is not None:
                self._returned.set()

    async def _pulled(self, pull: Callable[[], Awaitable[bytes | None]]) -> bytes | None:
        """The next piece from the lent source; ``None`` once it is given back."""
        try:
            piece = await pull()
        except trio.Cancelled:
            self._give_back()  # the body is leaving: the producer reads on
            raise
        except BaseException as exc:
            self._give_back(exc)  # (a no-op once taken back)
            return None
        if self._pull is not pull:
            return None  # taken back meanwhile: the producer ends the stream
        if piece is None:
            self._give_back()
        else:
            self._last_piece = trio.current_time()
        return piece

    async def __anext__(self) -> bytes:
        """The next piece to send (the chunks waiting, gathered; a piece pulled from a
        lent source; or a keep-alive comment), until the stream is over."""
        if self._first is not None:
            first, self._first = self._first, None
            return self._gather(first)
        while not self._ended:
            try:
                # A chunk already waiting needs no timer and no trip through the scheduler.
                piece: bytes | None = self._gather(self._chunks.receive_nowait())
            except trio.WouldBlock:
                pull = self._pull
                if pull is None:
                    piece = await self._wait()
                else:
                    piece = await self._pulled(pull)
                    if piece is None:
                        continue  # given back: the producer sends the rest
            except trio.EndOfChannel:
                break
            if piece is None:
                break
            if piece:
                return piece
            # (empty: lend()'s nudge)
        raise StopAsyncIteration

    async def _wait(self) -> bytes | None:
        """The chunks the producer sends next, gathered (a keep-alive comment after
        :attr:`keepalive` seconds of silence); ``None`` at the end."""
        try:
            if self.keepalive <= 0:
                return self._gather(await self._chunks.receive())
            with trio.move_on_after(self.keepalive):
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
