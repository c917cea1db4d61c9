"""The trio edge of one request-plane connection: reader, coalescing writer, heartbeats
(docs/protocol.md, "One connection's tasks")."""

from __future__ import annotations

import logging
import os
import time
from contextlib import suppress
from typing import TYPE_CHECKING, Final

import trio

from .._contain import split_live_cancellation
from .._errors import ProtocolError
from .._ratelimit import LogLimiter
from ._frames import HANDSHAKE_MAX_FRAME_SIZE, Close, Ping, Welcome
from ._protocol import ConnectionState, Role

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from .._config import RequestPlaneConfig
    from ._frames import Frame
    from ._protocol import ProtocolConnection

log: Final = logging.getLogger("dynamo_trio.request_plane")

limited_log: Final = LogLimiter(log)  # for events a peer can cause at will

NETWORK_ERRORS: Final = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)
_RECEIVE_SIZE: Final = 65536
_RECEIVE_MAX: Final = 1 << 20  # reads grow up to this while each fills (a large frame)
_FINAL_FLUSH_TIMEOUT: Final = 0.25
_DIRECT_BURST: Final = 2  # frames sent straight to an idle socket per quiet moment
_DIRECT_PERIOD: Final = 0.001  # how long a quiet moment's allowance lasts
_DRAINED: Final = {
    Role.SERVER: "goaway sent and no stream is left",
    Role.CLIENT: "the worker said goaway and no stream is left",
}


def printable(text: str, limit: int = 300) -> str:
    """``text`` a peer may have chosen, made safe for a log line: short, ASCII, no controls."""
    escaped = text[:limit].encode("unicode_escape", "backslashreplace").decode("ascii")
    return escaped if len(escaped) <= limit and len(text) <= limit else f"{escaped[: limit - 3]}..."


def describe_close(frame: Close) -> str:
    """A peer's ``close`` frame, made safe for a log line."""
    return printable(f"{frame.code}: {frame.message}" if frame.message else frame.code)


async def handshake(
    stream: trio.abc.Stream,
    protocol: ProtocolConnection,
    authenticate: Callable[[], Awaitable[None]] | None = None,
) -> list[Frame]:
    """Drive ``protocol``'s handshake over ``stream`` until it is established (the frames
    that came behind the ``welcome``), closed or cut short by EOF (``[]``, the state tells
    which).  A ProtocolError propagates with its ``close`` queued, not sent."""
    while True:
        if data := protocol.data_to_send():
            await stream.send_all(data)
        if not protocol.state.handshaking:
            return []
        if protocol.state is ConnectionState.AUTHENTICATING:
            assert authenticate is not None
            await authenticate()
            continue
        chunk = await stream.receive_some(HANDSHAKE_MAX_FRAME_SIZE)
        if not chunk:
            return []
        frames = protocol.receive_data(chunk)
        if protocol.is_established:  # what followed the welcome is served as usual
            welcome = next(i for i, frame in enumerate(frames) if isinstance(frame, Welcome))
            return frames[welcome + 1 :]


class FrameConnection:
    """Frames over one stream (closed when :meth:`run` returns), one writer task, heartbeats;
    ``on_frames`` gets each received batch in the reader task, ``on_close(reason)`` runs once,
    synchronously, the moment the connection is declared over."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        protocol: ProtocolConnection,
        config: RequestPlaneConfig,
        on_frames: Callable[[list[Frame]], None],
        on_close: Callable[[str], None] | None = None,
        *,
        name: str,
    ) -> None:
        self.protocol: Final = protocol
        self.name: Final = name
        self.close_reason: str | None = None  # None while open
        self._stream = stream
        self._config = config
        self._on_frames = on_frames
        self._on_close = on_close
        self._writer_wakeup: trio.Event | None = None
        self._scope = trio.CancelScope()  # close() cancels it, even before run()
        self._reader_scope = trio.CancelScope()  # shutdown() cancels it: a flush follows
        self._last_received = 0.0
        self._draining = False  # the reader is done: the writer sends what is left, then stops
        self._flushed = False  # ... and it did
        # Only a plain TCP socket takes frames from the sender's task (docs/protocol.md).
        self._socket = stream.socket if isinstance(stream, trio.SocketStream) else None
        self._direct_left = _DIRECT_BURST
        self._direct_since = 0.0

    @property
    def closed(self) -> bool:
        return self.close_reason is not None

    def send(self, frame: Frame, *, at_once: bool = False) -> bool:
        """Queue ``frame`` for the writer without blocking; whether it was queued (a closed
        connection drops it).  InvalidArgument for a frame that cannot be encoded.
        ``at_once``: an idle writer's socket takes it now, however many streams are open."""
        if self.close_reason is not None or not self.protocol.send(frame):
            return False
        if (queued := self.protocol.outbox_size) > self._config.max_write_buffer:
            why = "connection %s: %d bytes queued for a peer that is not reading; closing it"
            limited_log.warning("write-overflow", why, self.name, queued)
            self.close("write buffer overflow: the peer stopped reading")
            return True
        self._wake_writer(at_once)
        return True

    def retire_if_drained(self) -> None:
        """After ``goaway``, shut down once no stream is left (queued frames go out first)."""
        protocol = self.protocol
        if protocol.goaway and not protocol.open_streams and self.close_reason is None:
            self.shutdown(_DRAINED[protocol.role])

    def close(self, reason: str) -> None:
        """End the connection now, sending nothing more (idempotent, synchronous)."""
        self._declare_closed(reason)
        self._scope.cancel()

    def shutdown(self, reason: str) -> None:
        """End the connection gracefully: queued frames still go out (idempotent, synchronous)."""
        self._declare_closed(reason)
        self._reader_scope.cancel()

    def _declare_closed(self, reason: str) -> None:
        if self.close_reason is None:
            self.close_reason = reason
            if self._on_close is not None:
                try:
                    self._on_close(reason)
                except Exception:  # it runs in whatever task closed the connection
                    log.exception("connection %s: error in its close callback", self.name)

    async def run(self) -> None:
        """Serve until the connection ends, then close the stream (network and protocol
        failures never raise: see :attr:`close_reason`)."""
        self._last_received = trio.current_time()
        try:
            with self._scope:
                async with trio.open_nursery() as nursery:
                    heartbeat = trio.CancelScope()
                    nursery.start_soon(self._write_loop)
                    nursery.start_soon(self._heartbeats, heartbeat)
                    with self._reader_scope:
                        await self._read_loop()
                    # The reader ended on its own: the writer briefly delivers what is queued.
                    heartbeat.cancel()
                    self._draining = True
                    self._wake_writer()
                    nursery.cancel_scope.deadline = trio.current_time() + _FINAL_FLUSH_TIMEOUT
            if self._flushed:
                await linger(self._stream)
        except BaseException as exc:
            _, escaped = split_live_cancellation(exc)
            if escaped is not None:  # a bug here or in on_frames: the owner contains it
                self._declare_closed(f"internal error ({type(escaped).__name__})")
            raise
        finally:
            self._declare_closed("closed")  # a no-op unless nothing else closed it
            await trio.aclose_forcefully(self._stream)

    async def _read_loop(self) -> None:
        protocol = self.protocol
        size = _RECEIVE_SIZE
        while True:
            try:
                data = await self._stream.receive_some(size)
            except NETWORK_ERRORS as exc:
                self._declare_closed(f"connection lost: {str(exc) or type(exc).__name__}")
                return
            if not data:
                self._declare_closed("the peer closed the connection")
                return
            # A full read means more is waiting: read more at once (fewer scheduler trips).
            size = min(size * 2, _RECEIVE_MAX) if len(data) == size else _RECEIVE_SIZE
            received_before = protocol.frames_received
            self._direct_left = _DIRECT_BURST  # a new turn: answers may go straight out
            try:
                frames = protocol.receive_data(data)
            except ProtocolError as exc:
                why = printable(exc.message)
                log_line = "connection %s: protocol error, closing it: %s"
                limited_log.warning("protocol-error", log_line, self.name, why)
                self._declare_closed(f"protocol error: {why}")
                return
            if protocol.frames_received != received_before:
                self._last_received = trio.current_time()  # only whole, valid frames are life
            if frames:
                self._on_frames(frames)
            if protocol.close_frame is not None:
                message = describe_close(protocol.close_frame)
                log.debug("connection %s: the peer closed it (%s)", self.name, message)
                self._declare_closed(f"the peer closed the connection ({message})")
                return
            self.retire_if_drained()
            if self.close_reason is not None:
                return  # on_frames closed it, or it is drained
            if protocol.outbox_size:
                self._wake_writer()

    def _wake_writer(self, at_once: bool = False) -> None:
        wakeup = self._writer_wakeup
        if wakeup is None:
            return  # the writer is busy (or already woken): it sends what is queued
        if (
            self._socket is not None
            and self.close_reason is None  # (so not draining: the writer flushes what is left)
            and (at_once or self._may_write_directly())
            and self._write_directly()
        ):
            return
        self._writer_wakeup = None
        wakeup.set()

    def _may_write_directly(self) -> bool:
        if self.protocol.open_streams > 1:
            return False  # many streams' frames: the writer coalesces them
        left = self._direct_left
        if left == _DIRECT_BURST:  # the first of an allowance: its period starts
            self._direct_since = time.perf_counter()
        elif left <= 0:  # spent: refilled only once its period is over
            now = time.perf_counter()
            if now - self._direct_since < _DIRECT_PERIOD:
                return False
            self._direct_since = now
            left = _DIRECT_BURST
        self._direct_left = left - 1
        return True

    def _write_directly(self) -> bool:
        """Write the outbox from this task while the writer is idle; whether all of it went."""
        assert self._socket is not None
        fd = self._socket.fileno()
        if fd == -1:
            return False
        data = self.protocol.data_to_send()
        try:  # non-blocking; nothing awaited since fileno(), so the fd is still ours
            written = os.write(fd, data)
        except BlockingIOError:
            written = 0
        except OSError as exc:
            self.close(f"connection lost while writing: {exc}")
            return True
        if written == len(data):
            return True
        self.protocol.unsend(memoryview(data)[written:])
        return False

    async def _write_loop(self) -> None:
        while True:
            data = self.protocol.data_to_send()
            self._direct_left = _DIRECT_BURST
            if not data:
                if self._draining:
                    self._flushed = True
                    return
                self._writer_wakeup = wakeup = trio.Event()
                await wakeup.wait()
                if self.protocol.open_streams > 1:
                    # One more turn: the frames other woken tasks add join this write.
                    await trio.lowlevel.checkpoint()
                continue
            try:
                await self._stream.send_all(data)
            except NETWORK_ERRORS as exc:
                self.close(f"connection lost while writing: {str(exc) or type(exc).__name__}")
                return

    async def _heartbeats(self, scope: trio.CancelScope) -> None:
        with scope:
            interval, timeout = self._config.heartbeat_interval, self._config.heartbeat_timeout
            while True:
                expected = trio.current_time() + interval
                await trio.sleep(interval)
                now = trio.current_time()
                if now - expected > interval:
                    # This process stalled: blame the peer only for silence we were awake to hear.
                    self._last_received = max(self._last_received, now - interval)
                silent_for = now - self._last_received
                if silent_for > timeout:
                    why = "connection %s: no frame received for %.1fs; declaring it dead"
                    limited_log.warning("heartbeat-timeout", why, self.name, silent_for)
                    self.close(f"heartbeat timeout: no frame from the peer for {silent_for:.1f}s")
                    return
                self.send(Ping())


async def linger(stream: trio.abc.Stream, *, limit: int | None = None) -> None:
    """FIN, then discard the peer's input (up to ``limit``) until it closes, briefly: unread
    input would make the kernel reset, destroying our close frame.  The caller closes ``stream``."""
    with trio.move_on_after(_FINAL_FLUSH_TIMEOUT, shield=True), suppress(*NETWORK_ERRORS):
        if isinstance(stream, trio.abc.HalfCloseableStream):
            await stream.send_eof()
        discarded = 0
        while data := await stream.receive_some(_RECEIVE_SIZE):
            discarded += len(data)
            if limit is not None and discarded > limit:
                return
