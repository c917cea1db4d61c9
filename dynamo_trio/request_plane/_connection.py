"""The trio edge of one request-plane connection: reader, coalescing writer, heartbeats.

:class:`FrameConnection` owns a byte stream and a
:class:`~dynamo_trio.request_plane._protocol.ProtocolConnection`, and runs three
tasks in its own nursery for as long as the connection lives:

* the **reader** feeds received bytes to the protocol and hands the frames it
  returns to a synchronous callback (which must not block: it only routes
  frames to streams);
* the **writer** is the only task that writes to the socket.  Senders call the
  synchronous :meth:`FrameConnection.send`, which encodes into the protocol's
  outbox and wakes the writer; everything queued while a write is in progress
  goes out in the next single ``send_all``, so many small frames cost one
  system call;
* the **heartbeat** sends a ``ping`` every interval and declares the
  connection dead when nothing at all has arrived for ``heartbeat_timeout``
  seconds (a half-open peer: its kernel may ACK, but its process is gone).
  Silence only counts while this process was awake to hear it: after a local
  stall (a long GC pause, a handler blocking the loop) the peer gets a fresh
  window, since its frames may be waiting unread in the socket.

:meth:`FrameConnection.run` returns when the connection is over, for whatever
reason (EOF, reset, heartbeat timeout, protocol violation, local close), and
records why in :attr:`FrameConnection.close_reason`.  Network failures never
escape as exceptions: for this layer they are how connections end.
"""

from __future__ import annotations

import logging
from contextlib import suppress
from typing import TYPE_CHECKING, Final

import trio

from .._errors import ProtocolError
from ._frames import Close, Ping

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._config import RequestPlaneConfig
    from ._frames import Frame
    from ._protocol import ProtocolConnection

__all__ = ["FrameConnection"]

_log = logging.getLogger("dynamo_trio.request_plane")

_RECEIVE_SIZE: Final = 65536
_FINAL_FLUSH_TIMEOUT: Final = 0.25


class FrameConnection:
    """Frames over one stream, with a single writer task and heartbeats.

    Args:
        stream: The connected byte stream (it is closed when :meth:`run` returns).
        protocol: The state machine for this end.
        config: Heartbeat timings and the write-buffer limit.
        on_frames: Called in the reader task with each batch of received frames.
        on_close: Called once, synchronously, the moment the connection is
            declared over (before its tasks and socket are torn down), with
            the reason: the owner cancels its streams without waiting.
        name: How log lines name this connection (e.g. the peer address).
    """

    def __init__(
        self,
        stream: trio.abc.Stream,
        protocol: ProtocolConnection,
        config: RequestPlaneConfig,
        *,
        on_frames: Callable[[list[Frame]], None],
        on_close: Callable[[str], None] | None = None,
        name: str,
    ) -> None:
        self.protocol: Final = protocol
        self.name: Final = name
        self.close_reason: str | None = None
        """Why the connection ended (``None`` while it is open)."""
        self._stream = stream
        self._config = config
        self._on_frames = on_frames
        self._on_close = on_close
        self._writer_wakeup: trio.Event | None = None
        self._scope: trio.CancelScope | None = None
        self._reader_scope: trio.CancelScope | None = None
        self._last_received = 0.0
        self._draining = False  # the reader is done: the writer sends what is left, then stops
        self._flushed = False  # ... and it did

    @property
    def closed(self) -> bool:
        return self.close_reason is not None

    def send(self, frame: Frame) -> None:
        """Queue ``frame``; the writer task sends it soon.  Never blocks.

        Raises:
            trio.ClosedResourceError: if the connection is closed.
            InvalidArgument, RuntimeError: from the protocol (the frame is
                not sent; the connection stays usable).
        """
        if self.close_reason is not None:
            raise trio.ClosedResourceError(f"connection {self.name} is closed: {self.close_reason}")
        self.protocol.send(frame)
        if self.protocol.outbox_size > self._config.max_write_buffer:
            _log.error(
                "connection %s: %d bytes queued for a peer that is not reading; closing it",
                self.name,
                self.protocol.outbox_size,
            )
            self.close("write buffer overflow: the peer stopped reading")
            return
        self._wake_writer()

    def close(self, reason: str) -> None:
        """End the connection now (idempotent, synchronous): :meth:`run` returns soon.

        Nothing more is sent: use it when the peer is dead or must be cut off.
        """
        self._declare_closed(reason)
        if self._scope is not None:
            self._scope.cancel()

    def shutdown(self, reason: str) -> None:
        """End the connection gracefully (idempotent, synchronous).

        No new frame can be queued; what is already queued (a ``goaway``, a
        ``close``) is still sent, then the connection lingers briefly and closes.
        """
        self._declare_closed(reason)
        if self._reader_scope is not None:
            self._reader_scope.cancel()

    def _declare_closed(self, reason: str) -> None:
        if self.close_reason is None:
            self.close_reason = reason
            if self._on_close is not None:
                self._on_close(reason)

    async def run(self) -> None:
        """Serve the connection until it ends; then close the stream.  Never raises
        for network or protocol failures (see :attr:`close_reason`)."""
        self._last_received = trio.current_time()
        try:
            with trio.CancelScope() as self._scope:
                if self.close_reason is not None:
                    self._scope.cancel()
                async with trio.open_nursery() as nursery:
                    heartbeat = trio.CancelScope()
                    nursery.start_soon(self._write_loop)
                    nursery.start_soon(self._heartbeat_loop, heartbeat)
                    with trio.CancelScope() as self._reader_scope:
                        if self.close_reason is not None:
                            self._reader_scope.cancel()  # shut down before it ran
                        await self._read_loop()
                    # The reader ended on its own (EOF, a protocol error, a graceful
                    # shutdown): let the writer deliver what is queued (a close or
                    # goaway frame saying why), briefly, instead of dropping it.
                    heartbeat.cancel()
                    self._draining = True
                    self._wake_writer()
                    nursery.cancel_scope.deadline = trio.current_time() + _FINAL_FLUSH_TIMEOUT
            if self._flushed:
                await self._linger()
        finally:
            self._declare_closed("closed")  # a no-op unless nothing else closed it
            await trio.aclose_forcefully(self._stream)

    async def _read_loop(self) -> None:
        while True:
            try:
                data = await self._stream.receive_some(_RECEIVE_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                self._declare_closed(f"connection lost: {str(exc) or type(exc).__name__}")
                return
            if not data:
                self._declare_closed("the peer closed the connection")
                return
            self._last_received = trio.current_time()
            try:
                frames = self.protocol.receive_data(data)
            except ProtocolError as exc:
                _log.error("connection %s: protocol error, closing it: %s", self.name, exc.message)
                self._declare_closed(f"protocol error: {exc.message}")
                return
            if frames:
                for frame in frames:
                    if isinstance(frame, Close):
                        _log.info(
                            "connection %s: peer is closing it (%s: %s)",
                            self.name,
                            frame.code,
                            frame.message,
                        )
                self._on_frames(frames)
            if self.protocol.outbox_size:
                self._wake_writer()

    def _wake_writer(self) -> None:
        wakeup, self._writer_wakeup = self._writer_wakeup, None
        if wakeup is not None:
            wakeup.set()

    async def _write_loop(self) -> None:
        while True:
            data = self.protocol.data_to_send()
            if not data:
                if self._draining:
                    self._flushed = True
                    return
                self._writer_wakeup = wakeup = trio.Event()
                await wakeup.wait()
                continue
            try:
                await self._stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                self.close(f"connection lost while writing: {str(exc) or type(exc).__name__}")
                return

    async def _heartbeat_loop(self, scope: trio.CancelScope) -> None:
        with scope:
            await self._heartbeats()

    async def _heartbeats(self) -> None:
        interval = self._config.heartbeat_interval
        timeout = self._config.heartbeat_timeout
        while True:
            expected = trio.current_time() + interval
            await trio.sleep(interval)
            now = trio.current_time()
            if now - expected > interval:
                # This process was stalled (a GC pause, a handler blocking the loop):
                # the peer's frames may be sitting unread in the socket.  Blame the
                # peer only for silence we were awake to hear.
                self._last_received = max(self._last_received, now - interval)
            silent_for = now - self._last_received
            if silent_for > timeout:
                _log.warning(
                    "connection %s: nothing received for %.1fs; declaring it dead",
                    self.name,
                    silent_for,
                )
                self.close(f"heartbeat timeout: peer silent for {silent_for:.1f}s")
                return
            if not self.closed:
                self.send(Ping())

    async def _linger(self) -> None:
        """Close gracefully: FIN, then discard the peer's input until it closes too.

        Closing a socket with unread input makes the kernel send a reset, and a
        reset destroys whatever the peer has not read yet: the close frame that
        says why we hung up, for one.  Bounded by a short timeout.
        """
        with (
            trio.move_on_after(_FINAL_FLUSH_TIMEOUT, shield=True),
            suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError),
        ):
            if isinstance(self._stream, trio.abc.HalfCloseableStream):
                await self._stream.send_eof()
            while await self._stream.receive_some(_RECEIVE_SIZE):
                pass
