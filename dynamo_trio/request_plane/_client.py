"""The caller side of the request plane: pooled connections and their streams.

One :class:`ClientConnection` per worker address carries any number of
concurrent streams.  Its reader routes each ``item``/``end``/``err`` frame to
the :class:`ClientStream` it belongs to, synchronously and without ever
blocking: a stream's queue cannot grow past the credit window it granted, so
one slow consumer never holds up the others on the same connection.

Consumption drives flow control: when a consumer has taken half a window of
items, the stream returns that many credits to the worker.

Cancellation is synchronous and immediate: :meth:`ClientStream.kill` queues a
``ctl kill`` frame for the writer task, forgets the stream (late frames for it
are dropped by the protocol) and wakes a consumer blocked in
:meth:`ClientStream.receive`, all without a checkpoint, so it can run from a
``finally`` block, a cancel callback, or a garbage-collection finaliser.

When a connection is lost, every stream on it learns so at once: a consumer
blocked in ``receive`` gets :class:`~dynamo_trio.Disconnected`.
"""

from __future__ import annotations

import logging
from collections import deque
from contextlib import suppress
from typing import TYPE_CHECKING, Any, Final

import trio

from .._errors import (
    CannotConnect,
    Disconnected,
    EngineShutdown,
    error_from_wire,
)
from ._connection import FrameConnection
from ._frames import Close, Control, Credit, End, Error, GoAway, Item, Request, Welcome
from ._protocol import ConnectionState, ProtocolConnection, Role

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._config import RequestPlaneConfig
    from .._context import CancelReason
    from ._frames import Frame, Outcome

__all__ = ["ClientConnection", "ClientStream", "ConnectionPool", "parse_address"]

_log = logging.getLogger("dynamo_trio.request_plane")

_FAIR_EVERY: Final = 32


def parse_address(address: str) -> tuple[str, int]:
    """Split ``"host:port"`` or ``"[v6]:port"``.

    Raises:
        ValueError: if there is no valid port.
    """
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"bad address {address!r}: expected host:port")
    return host.strip("[]"), int(port)


class ClientStream:
    """The caller's end of one stream: received frames, credits, cancellation."""

    def __init__(self, connection: ClientConnection, sid: int, window: int) -> None:
        self.sid: Final = sid
        self.outcome: Outcome | None = None
        """How the worker ended the stream (``None`` until an ``end`` frame arrives)."""
        self.end_reason: str | None = None
        self._connection = connection
        self._queue: deque[Item | End | Error] = deque()
        self._wakeup: trio.Event | None = None
        self._refill_at = max(1, window // 2)
        self._consumed = 0
        self._since_checkpoint = 0
        self._killed = False
        self._stopping = False
        self._discarding = False
        self._lost: str | None = None
        self._done = False

    @property
    def done(self) -> bool:
        """No more items will come (terminal frame consumed, killed, or lost)."""
        return self._done

    def _deliver(self, frame: Item | End | Error) -> None:
        if self._discarding:
            if isinstance(frame, Item):
                self._took_item()  # nobody reads it: hand the credit straight back
            else:
                self._done = True
            return
        self._queue.append(frame)
        self._wake()

    def discard(self) -> None:
        """Nobody will read this stream again: drop what is queued and what still comes,
        returning credits so the worker's drain is not held up by the missing reader."""
        if self._discarding or self._done or self._killed:
            return
        self._discarding = True
        for frame in self._queue:
            if isinstance(frame, Item):
                self._took_item()
            else:
                self._done = True
        self._queue.clear()

    def _connection_lost(self, reason: str) -> None:
        self._lost = reason
        self._wake()

    def _wake(self) -> None:
        wakeup, self._wakeup = self._wakeup, None
        if wakeup is not None:
            wakeup.set()

    async def receive(self) -> Item | None:
        """The next item, or ``None`` once the stream has ended.

        Raises:
            DynamoError: the worker ended the stream with an error (its type).
            Disconnected: the connection was lost before the terminal frame.
        """
        while True:
            if self._queue and not self._killed:
                frame = self._queue.popleft()
                if isinstance(frame, Item):
                    self._took_item()
                    await self._fair_checkpoint()
                    return frame
                self._done = True
                await trio.lowlevel.checkpoint()
                if isinstance(frame, End):
                    self.outcome = frame.outcome
                    self.end_reason = frame.reason
                    return None
                raise error_from_wire(frame.code, frame.message, frame.caused_by)
            if self._killed or self._done:
                self._done = True
                await trio.lowlevel.checkpoint()
                return None
            if self._lost is not None:
                self._done = True
                await trio.lowlevel.checkpoint()
                raise Disconnected(
                    f"stream ended before generation completed: {self._lost}",
                )
            self._wakeup = wakeup = trio.Event()
            await wakeup.wait()
            self._since_checkpoint = 0

    async def _fair_checkpoint(self) -> None:
        self._since_checkpoint += 1
        if self._since_checkpoint >= _FAIR_EVERY:
            self._since_checkpoint = 0
            await trio.lowlevel.checkpoint()
        else:
            await trio.lowlevel.checkpoint_if_cancelled()

    def _took_item(self) -> None:
        self._consumed += 1
        if self._consumed >= self._refill_at:
            credit, self._consumed = self._consumed, 0
            self._connection._send_quietly(Credit(self.sid, credit))

    @property
    def draining(self) -> bool:
        """A stop was sent and the worker has not ended the stream yet."""
        return self._stopping and not self._done and not self._killed and self._lost is None

    def stop(self, reason: CancelReason) -> None:
        """Ask the worker to drain and finish (items keep coming until ``end``)."""
        if not self._done and not self._killed:
            self._stopping = True
            self._connection._send_quietly(Control(self.sid, "stop", reason.value))

    def kill(self, reason: CancelReason) -> None:
        """Abandon the stream now: tell the worker, drop what is queued, end ``receive``."""
        if self._killed or self._done:
            return
        self._killed = True
        self._queue.clear()
        self._connection._forget(self.sid)
        self._connection._send_quietly(Control(self.sid, "kill", reason.value))
        self._wake()


class ClientConnection:
    """One multiplexed connection to a worker address, owned by a :class:`ConnectionPool`."""

    def __init__(self, address: str, config: RequestPlaneConfig, *, name: str) -> None:
        self.address: Final = address
        self._config = config
        self._name = name
        self._streams: dict[int, ClientStream] = {}
        self._connection: FrameConnection | None = None
        self._settled = trio.Event()  # the handshake was answered, or the connection ended
        self._close_message: str | None = None
        self.on_closed: list[Callable[[ClientConnection, str], None]] = []

    @property
    def closed(self) -> bool:
        return self._connection is None or self._connection.closed

    @property
    def usable(self) -> bool:
        """Open, and the worker still takes new streams (no ``goaway``)."""
        return (
            self._connection is not None
            and not self._connection.closed
            and self._connection.protocol.state is ConnectionState.OPEN
            and not self._connection.protocol.goaway
        )

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    async def run(self, *, task_status: trio.TaskStatus[ClientConnection]) -> None:
        """Connect, shake hands, report ready, then serve until the connection ends.

        Raises:
            CannotConnect: before ``task_status.started``, if the worker cannot
                be reached or refuses the handshake.
        """
        config = self._config
        try:
            host, port = parse_address(self.address)
            with trio.fail_after(config.connect_timeout):
                stream = await trio.open_tcp_stream(host, port)
        except (OSError, ValueError, trio.TooSlowError) as exc:
            raise CannotConnect(
                f"cannot connect to {self.address}: {str(exc) or type(exc).__name__}"
            ) from None
        protocol = ProtocolConnection(
            Role.CLIENT,
            max_frame_size=config.max_frame_size,
            token=config.auth_token,
            peer_name=self._name,
        )
        protocol.start()
        connection = FrameConnection(
            stream,
            protocol,
            config,
            on_frames=self._on_frames,
            on_close=self._connection_lost,
            name=self.address,
        )
        self._connection = connection
        refused: str | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._serve, connection)
            with trio.move_on_after(config.connect_timeout):
                await self._settled.wait()
            if self.usable:
                task_status.started(self)
            else:
                refused = (
                    self._close_message
                    or connection.close_reason
                    or "no answer to the handshake in time"
                )
                connection.close(refused)
        if refused is not None:
            raise CannotConnect(f"worker at {self.address} refused the connection: {refused}")

    async def _serve(self, connection: FrameConnection) -> None:
        await connection.run()

    @property
    def drained(self) -> bool:
        """The worker said ``goaway`` before the connection ended (an orderly shutdown)."""
        return self._connection is not None and self._connection.protocol.goaway

    def _connection_lost(self, reason: str) -> None:
        # Runs inside FrameConnection.close: streams learn of the loss at once.
        self._settled.set()
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            stream._connection_lost(reason)
        for callback in tuple(self.on_closed):
            callback(self, reason)

    def _on_frames(self, frames: list[Frame]) -> None:
        for frame in frames:
            if isinstance(frame, Item):
                stream = self._streams.get(frame.sid)
                if stream is not None:
                    stream._deliver(frame)
            elif isinstance(frame, End | Error):
                stream = self._streams.pop(frame.sid, None)
                if stream is not None:
                    stream._deliver(frame)
            elif isinstance(frame, Welcome):
                self._settled.set()
            elif isinstance(frame, Close):
                self._close_message = f"{frame.code}: {frame.message}"
            elif isinstance(frame, GoAway):
                _log.info("worker at %s is draining (goaway): %s", self.address, frame.reason)

    def open_stream(
        self,
        *,
        endpoint: str,
        instance_id: int,
        request_id: str,
        payload: Any,
        timeout: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> ClientStream:
        """Send a ``req`` frame and return its stream.  Never blocks.

        Raises:
            Disconnected: the connection is closed.
            EngineShutdown: the worker sent ``goaway``.
            InvalidArgument: the payload cannot be encoded or is too large.
        """
        connection = self._connection
        if connection is None or connection.closed:
            raise Disconnected(f"connection to {self.address} is closed")
        protocol = connection.protocol
        if protocol.goaway or protocol.state is not ConnectionState.OPEN:
            raise EngineShutdown(f"worker at {self.address} takes no new requests")
        window = self._config.stream_window
        sid = protocol.next_sid()
        stream = ClientStream(self, sid, window)
        try:
            connection.send(
                Request(sid, endpoint, instance_id, request_id, payload, window, timeout, headers)
            )
        except trio.ClosedResourceError as exc:
            raise Disconnected(str(exc)) from None
        self._streams[sid] = stream
        return stream

    def streams(self) -> list[ClientStream]:
        """The streams open on this connection (not yet ended, killed or lost)."""
        return list(self._streams.values())

    def _forget(self, sid: int) -> None:
        self._streams.pop(sid, None)

    def _send_quietly(self, frame: Frame) -> None:
        """Send a control-path frame; a closed connection makes it moot, not an error."""
        connection = self._connection
        if connection is None or connection.closed:
            return
        with suppress(trio.ClosedResourceError):
            connection.send(frame)

    def close(self, reason: str) -> None:
        if self._connection is not None:
            self._connection.close(reason)


class ConnectionPool:
    """At most one live connection per worker address, connected on demand.

    Args:
        config: Request-plane settings.
        nursery: Where connection tasks live (the runtime's nursery).
        name: This process's name in handshakes.
        on_connection_lost: Called with ``(address, reason, drained)`` whenever
            a connection that had been established ends; ``drained`` says the
            worker announced its shutdown first (an expected loss).
    """

    def __init__(
        self,
        config: RequestPlaneConfig,
        nursery: trio.Nursery,
        *,
        name: str,
        on_connection_lost: Callable[[str, str, bool], None] | None = None,
    ) -> None:
        self._config = config
        self._nursery = nursery
        self._name = name
        self._on_connection_lost = on_connection_lost
        self._connections: dict[str, ClientConnection] = {}
        self._connecting: dict[str, trio.Event] = {}

    def connections(self) -> list[ClientConnection]:
        return list(self._connections.values())

    async def connect(self, address: str) -> ClientConnection:
        """The usable connection to ``address``, connecting if there is none.

        Concurrent callers for the same address share one connection attempt.

        Raises:
            CannotConnect: the worker cannot be reached.
        """
        while True:
            connection = self._connections.get(address)
            if connection is not None and connection.usable:
                await trio.lowlevel.checkpoint()
                return connection
            pending = self._connecting.get(address)
            if pending is None:
                break
            await pending.wait()
            failed = self._connections.get(address)
            if failed is None or not failed.usable:
                break  # the shared attempt failed: try our own
        done = self._connecting[address] = trio.Event()
        try:
            connection = ClientConnection(address, self._config, name=self._name)
            connection.on_closed.append(self._closed)
            connected: ClientConnection = await self._nursery.start(connection.run)
            self._connections[address] = connected
            return connected
        finally:
            del self._connecting[address]
            done.set()

    def _closed(self, connection: ClientConnection, reason: str) -> None:
        if self._connections.get(connection.address) is connection:
            del self._connections[connection.address]
        if self._on_connection_lost is not None:
            self._on_connection_lost(connection.address, reason, connection.drained)

    def close_all(self, reason: str = "closing") -> None:
        for connection in tuple(self._connections.values()):
            connection.close(reason)
