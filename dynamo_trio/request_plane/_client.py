"""The caller side of the request plane: pooled connections and their streams."""

from __future__ import annotations

import math
import os
import ssl
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal

import trio
from trio.lowlevel import checkpoint, checkpoint_if_cancelled

from .._contain import contain, split_live_cancellation
from .._errors import (
    CannotConnect,
    Disconnected,
    EngineShutdown,
    InvalidArgument,
    ProtocolError,
    error_from_wire,
)
from .._hostport import parse_address
from ._connection import (
    NETWORK_ERRORS,
    FrameConnection,
    describe_close,
    handshake,
    limited_log,
    log,
    printable,
)
from ._frames import Control, Credit, End, Error, GoAway, Item, Request
from ._protocol import ConnectionState, ProtocolConnection, Role
from ._tls import client_context

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from .._config import RequestPlaneConfig
    from .._context import CancelReason
    from ._frames import Frame, Outcome

    OpenTransport = Callable[[str], Awaitable[trio.abc.Stream]]

_FAIR_EVERY: Final = 32


class ClientStream:
    """The caller's end of one stream: received frames, credits, cancellation."""

    def __init__(self, connection: ClientConnection, sid: int, window: int) -> None:
        self.sid: Final = sid
        self.outcome: Outcome | None = None  # from the ``end`` frame
        self.end_reason: str | None = None
        self._connection = connection
        self._frames = connection._connection
        self._queue: deque[Item | End | Error] = deque()
        self._wakeup: trio.Event | None = None
        self._refill_at = max(1, window // 2)
        self._consumed = self._since_checkpoint = 0
        self._killed = self._stopping = self._discarding = self._nudged = False
        self._lost: str | None = None
        self.done = False  # no more items will come (terminal frame consumed, killed, or lost)

    def _deliver(self, frame: Item | End | Error) -> None:
        if self._discarding:
            if isinstance(frame, Item):
                self._took_items(1)  # nobody reads it: hand the credit straight back
            else:
                self.done = True
            return
        self._queue.append(frame)
        self._wake()

    def discard(self) -> None:
        """Nobody will read this stream again: drop what comes, returning its credits."""
        if self._discarding or self.done or self._killed:
            return
        self._discarding = True
        for frame in self._queue:
            self._deliver(frame)  # discarded as if it arrived now
        self._queue.clear()

    def _connection_lost(self, reason: str) -> None:
        self._lost = reason
        self._wake()

    def nudge(self) -> None:
        """Make :meth:`receive_many` waiting for items (now or next) return ``[]``."""
        self._nudged = True
        self._wake()

    def _wake(self) -> None:
        wakeup, self._wakeup = self._wakeup, None
        if wakeup is not None:
            wakeup.set()

    async def receive(self) -> Item | None:
        """The next item, or ``None`` once ended; raises the worker's error (its
        :class:`DynamoError` type), or :class:`Disconnected` if the connection was lost."""
        items = await self._receive(many=False)
        return None if items is None else items[0]

    async def receive_many(self) -> list[Item] | None:
        """Every item queued (waiting for at least one), or ``None`` once ended, as
        :meth:`receive`; ``[]`` if :meth:`nudge` came first."""
        return await self._receive(many=True)

    async def _receive(self, *, many: bool) -> list[Item] | None:
        queue = self._queue
        while True:
            if queue and not self._killed:
                frame = queue.popleft()
                if not isinstance(frame, Item):
                    self.done = True
                    await checkpoint_if_cancelled()  # over: no loop can spin on it
                    if isinstance(frame, Error):
                        raise error_from_wire(frame.code, frame.message, frame.caused_by)
                    self.outcome, self.end_reason = frame.outcome, frame.reason
                    return None
                items = [frame]
                while many and queue and isinstance(queue[0], Item):
                    items.append(queue.popleft())  # type: ignore[arg-type]
                self._took_items(len(items))
                if many:
                    self._nudged = False
                self._since_checkpoint = (self._since_checkpoint + 1) % _FAIR_EVERY
                await (checkpoint_if_cancelled if self._since_checkpoint else checkpoint)()
                return items
            if self._killed or self.done:
                self.done = True
                await checkpoint()
                return None
            if self._lost is not None:
                self.done = True
                await checkpoint()
                raise Disconnected(f"stream ended before generation completed: {self._lost}")
            if many and self._nudged:
                self._nudged = False
                await checkpoint_if_cancelled()
                return []
            self._wakeup = wakeup = trio.Event()
            await wakeup.wait()
            self._since_checkpoint = 0

    def _took_items(self, count: int) -> None:
        self._consumed += count
        if self._consumed >= self._refill_at:
            credit, self._consumed = self._consumed, 0
            self._frames.send(Credit(self.sid, credit))

    @property
    def draining(self) -> bool:
        """A stop was sent and the worker has not ended the stream yet."""
        return self._stopping and not self.done and not self._killed and self._lost is None

    def stop(self, reason: CancelReason) -> None:
        """Ask the worker to drain and finish (items keep coming until ``end``)."""
        if not self.done and not self._killed:
            self._stopping = True
            self._control("stop", reason)

    def kill(self, reason: CancelReason) -> None:
        """Abandon the stream now: tell the worker, drop what is queued, end ``receive``."""
        if self._killed or self.done:
            return
        self._killed = True
        self._queue.clear()
        self._connection._streams.pop(self.sid, None)
        self._control("kill", reason)
        self._frames.retire_if_drained()
        self._wake()

    def _control(self, action: Literal["stop", "kill"], reason: CancelReason) -> None:
        """Send it at once, then yield the CPU: the worker hears it before our teardown."""
        self._frames.send(Control(self.sid, action, reason.value), at_once=True)
        os.sched_yield()


class ClientConnection:
    """One multiplexed connection to a worker address, made by a :class:`ConnectionPool`;
    ``on_closed(connection, reason)`` follows its end."""

    def __init__(
        self,
        address: str,
        stream: trio.abc.Stream,
        protocol: ProtocolConnection,
        config: RequestPlaneConfig,
        on_closed: Callable[[ClientConnection, str], None],
    ) -> None:
        self.address: Final = address
        self._config = config
        self._on_closed = on_closed
        self._streams: dict[int, ClientStream] = {}
        self._connection: Final = FrameConnection(
            stream, protocol, config, self._on_frames, self._connection_lost, name=address
        )

    @property
    def closed(self) -> bool:
        return self._connection.closed

    @property
    def usable(self) -> bool:
        """Open, and the worker still takes new streams (no ``goaway``)."""
        return not self.closed and self._connection.protocol.state is ConnectionState.OPEN

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    @property
    def close_reason(self) -> str | None:
        return self._connection.close_reason

    async def run(self) -> None:
        """Serve until the connection ends (its streams get :class:`Disconnected`); raises
        only ``trio.Cancelled``."""
        with contain(self._log_escape):  # whatever ends the connection ends it alone
            await self._connection.run()

    def _log_escape(self, exc: BaseException) -> None:
        why = "connection to %s: ended by an internal error: %s"
        name = type(exc).__name__
        limited_log.error("client-connection-escape", why, self.address, name, exc_info=exc)

    @property
    def drained(self) -> bool:
        """The worker said ``goaway`` before the connection ended (an orderly shutdown)."""
        return self._connection.protocol.goaway

    def _connection_lost(self, reason: str) -> None:
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            stream._connection_lost(reason)
        self._on_closed(self, reason)

    def _on_frames(self, frames: list[Frame]) -> None:
        for frame in frames:
            if isinstance(frame, Item | End | Error):
                if (stream := self._streams.get(frame.sid)) is not None:
                    if type(frame) is not Item:
                        del self._streams[frame.sid]
                    stream._deliver(frame)
            elif isinstance(frame, GoAway):
                log.info("worker at %s is draining (goaway): %r", self.address, frame.reason[:200])

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
        """Send a ``req`` frame and return its stream, without blocking; ``timeout`` is the
        seconds left to the caller's deadline (a past one is sent as 0).  Raises
        Disconnected, EngineShutdown after ``goaway``, InvalidArgument."""
        connection = self._connection
        if connection.closed:
            raise Disconnected(f"connection to {self.address} is closed")
        protocol = connection.protocol
        if protocol.state is not ConnectionState.OPEN:
            raise EngineShutdown(f"worker at {self.address} takes no new requests")
        if timeout is not None:
            if not math.isfinite(timeout):
                raise InvalidArgument(f"a request timeout must be finite (got {timeout})")
            timeout = max(0.0, timeout)
        window = self._config.stream_window
        sid = protocol.next_sid()
        request = Request(sid, endpoint, instance_id, request_id, payload, window, timeout, headers)
        if not connection.send(request, at_once=True) or connection.closed:
            reason = connection.close_reason or "closed"
            raise Disconnected(f"connection to {self.address} is closed: {reason}")
        stream = self._streams[sid] = ClientStream(self, sid, window)
        return stream

    def streams(self) -> list[ClientStream]:
        """The streams open on this connection (not yet ended, killed or lost)."""
        return list(self._streams.values())

    def close(self, reason: str) -> None:
        self._connection.close(reason)


async def _open_tcp(address: str) -> trio.abc.Stream:
    return await trio.open_tcp_stream(*parse_address(address))


@dataclass(eq=False, slots=True)
class _Attempt:
    """One shared connection attempt to one address, and its outcome."""

    done: trio.Event = field(default_factory=trio.Event)
    connection: ClientConnection | None = None
    error: str | None = None


class ConnectionPool:
    """At most one live connection per worker address, connected on demand in ``nursery``;
    ``on_connection_lost(address, reason, drained)`` follows every established one's end
    (``drained``: the worker said ``goaway`` first)."""

    def __init__(
        self,
        config: RequestPlaneConfig,
        nursery: trio.Nursery,
        *,
        name: str,
        on_connection_lost: Callable[[str, str, bool], None] | None = None,
        open_transport: OpenTransport | None = None,
    ) -> None:
        self._config = config
        self._nursery = nursery
        self._name = name
        self._on_connection_lost = on_connection_lost
        self._open_transport = open_transport or _open_tcp
        self._ssl_context = client_context(config) if config.tls else None
        self._connections: dict[str, ClientConnection] = {}
        self._attempts: dict[str, _Attempt] = {}

    def connections(self) -> list[ClientConnection]:
        return list(self._connections.values())

    async def connect(self, address: str) -> ClientConnection:
        """The usable connection to ``address``, connecting if there is none; concurrent
        callers share one attempt (not cancelled with one of them) and its CannotConnect."""
        connection = self._connections.get(address)
        if connection is not None and connection.usable:
            await checkpoint_if_cancelled()  # the send that follows yields
            return connection
        attempt = self._attempts.get(address)
        if attempt is None:
            attempt = _Attempt()
            try:
                self._nursery.start_soon(self._attempt, address, attempt, name=f"connect {address}")
            except RuntimeError:  # the nursery is closed: the runtime is shutting down
                raise CannotConnect(f"cannot connect to {address}: shutting down") from None
            self._attempts[address] = attempt
        # The attempt is bounded by connect_timeout; the margin guards against a bug there.
        with trio.move_on_after(self._config.connect_timeout + 1.0):
            await attempt.done.wait()
        if not attempt.done.is_set():
            raise CannotConnect(f"cannot connect to {address}: the attempt did not finish in time")
        connected = attempt.connection
        if connected is not None and connected.usable:
            return connected
        if connected is not None:
            reason = connected.close_reason or "the worker takes no new requests"
            raise CannotConnect(f"connection to {address} ended as it was made: {reason}")
        raise CannotConnect(attempt.error or f"cannot connect to {address}")

    async def _attempt(self, address: str, attempt: _Attempt) -> None:
        connection = None
        try:
            connection = await self._connect(address)
        except CannotConnect as exc:
            attempt.error = exc.message
        except BaseException as exc:
            cancelled, escaped = split_live_cancellation(exc)
            why = "shutting down" if escaped is None else type(escaped).__name__
            attempt.error = f"cannot connect to {address}: {why}"
            if escaped is not None:
                why = "connecting to %s failed with an internal error"
                limited_log.error("connect-escape", why, address, exc_info=escaped)
            if cancelled is not None:
                raise cancelled from None
        else:
            attempt.connection = connection
            if not connection.closed:
                self._connections[address] = connection
        finally:
            if self._attempts.get(address) is attempt:
                del self._attempts[address]
            attempt.done.set()
        if connection is not None:
            await connection.run()

    async def _connect(self, address: str) -> ClientConnection:
        """A connection past TLS and the handshake (raises only CannotConnect or Cancelled)."""
        config = self._config
        protocol = ProtocolConnection(
            Role.CLIENT,
            max_frame_size=config.max_frame_size,
            token=config.auth_token,
            peer_name=self._name,
        )
        stream: trio.abc.Stream | None = None
        step = "connect"
        try:
            with trio.fail_after(config.connect_timeout):
                stream = await self._open_transport(address)
                if self._ssl_context is not None:
                    step = "TLS handshake"
                    name = config.tls_server_name or parse_address(address)[0]
                    stream = trio.SSLStream(stream, self._ssl_context, server_hostname=name)
                    await stream.do_handshake()
                step = "handshake"
                early_frames = await self._handshake(address, stream, protocol)
        except BaseException as exc:
            if stream is not None:
                await trio.aclose_forcefully(stream)
            cancelled, failure = split_live_cancellation(exc)
            if cancelled is not None:
                raise cancelled from None
            assert failure is not None
            raise self._cannot_connect(address, step, failure) from None
        connection = ClientConnection(address, stream, protocol, config, self._closed)
        if early_frames:  # what followed the welcome is served as usual
            connection._on_frames(early_frames)
            connection._connection.retire_if_drained()
        return connection

    def _cannot_connect(self, address: str, step: str, exc: BaseException) -> CannotConnect:
        if isinstance(exc, CannotConnect):
            return exc
        if isinstance(exc, trio.TooSlowError):
            why = f"no answer from the worker at {address} within {self._config.connect_timeout}s"
            return CannotConnect(f"{why} ({step})")
        if isinstance(exc, ProtocolError):
            why = printable(exc.message)
            return CannotConnect(f"handshake with the worker at {address} failed: {why}")
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        detail = str(cause) or type(cause).__name__
        if step == "TLS handshake" or isinstance(cause, ssl.SSLError):
            hint = "is the worker serving TLS, and does it want a client certificate?"
            if isinstance(cause, ssl.SSLCertVerificationError):
                hint = "check DYN_TCP_TLS_CA and the worker's certificate"
            return CannotConnect(f"TLS handshake with {address} failed: {detail} ({hint})")
        if isinstance(exc, (*NETWORK_ERRORS, ValueError)):
            return CannotConnect(f"cannot connect to {address}: {detail}")
        return CannotConnect(f"cannot connect to {address}: {type(exc).__name__}: {detail}")

    async def _handshake(
        self, address: str, stream: trio.abc.Stream, protocol: ProtocolConnection
    ) -> list[Frame]:
        protocol.start()
        try:
            frames = await handshake(stream, protocol)
        except ProtocolError:
            with trio.move_on_after(0.1):  # tell the worker why, best effort
                await stream.send_all(protocol.data_to_send())
            raise
        if protocol.closed:
            close = protocol.close_frame
            why = describe_close(close) if close is not None else "it closed the connection"
            raise CannotConnect(f"the worker at {address} refused the connection: {why}")
        if not protocol.is_established:
            why = f"the worker at {address} closed the connection during the handshake"
            raise CannotConnect(why if self._ssl_context else f"{why} (is the worker serving TLS?)")
        return frames

    def _closed(self, connection: ClientConnection, reason: str) -> None:
        current = self._connections.get(connection.address)
        if current is connection:
            del self._connections[connection.address]
        elif current is not None and connection.drained:
            return  # an old connection retired after goaway; a newer one serves the address
        if self._on_connection_lost is not None:
            self._on_connection_lost(connection.address, reason, connection.drained)

    def close_all(self, reason: str = "closing") -> None:
        for connection in tuple(self._connections.values()):
            connection.close(reason)
