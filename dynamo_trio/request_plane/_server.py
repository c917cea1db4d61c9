"""The worker side of the request plane: listening, sessions, and served streams.

A :class:`RequestPlaneServer` accepts TCP connections.  Each becomes a
:class:`_Session` with its own nursery, which owns the connection's three I/O
tasks *and* one task per open stream, so nothing a connection started can
outlive it.

Every ``req`` frame becomes a :class:`ServerStream` holding the worker-side
:class:`~dynamo_trio.Context` (same request id, the caller's remaining time as
its deadline) and is handed to the runtime's stream handler in a new task.
From then on this module translates the wire into context transitions:

* ``ctl stop`` -> ``context.stop(reason)``; ``ctl kill`` -> ``context.kill(reason)``;
* the connection ending for any reason -> ``context.kill(TRANSPORT_LOST)`` for
  every stream still open on it;
* ``credit`` frames wake a handler waiting to send.

The first cancel signal that the handler did not give itself (a control
frame, the transport, the caller's deadline, the worker's shutdown) is
recorded once per stream in :attr:`ServerStream.cancel_signal`, which is what
the worker's cancellation metric counts: a control frame followed by the
socket closing is one cancellation, and a handler stopping its own context is
none.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final

import trio

from .._context import CancelReason, Context, ContextState
from .._errors import Disconnected
from ._connection import FrameConnection
from ._frames import Control, Credit, End, Error, GoAway, Item, Request
from ._protocol import ProtocolConnection, Role

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from .._config import RequestPlaneConfig
    from .._errors import DynamoError
    from ._frames import Frame, Outcome

__all__ = ["RequestPlaneServer", "ServerStream"]

_log = logging.getLogger("dynamo_trio.request_plane")

# Checkpoint fully (letting the writer and other streams run) at least this often
# when a handler yields items without ever blocking.
_YIELD_EVERY: Final = 32


_RUNTIME_CANCELS: Final = frozenset(
    {CancelReason.DEADLINE, CancelReason.SHUTDOWN, CancelReason.DRAIN_TIMEOUT}
)


def _reason(value: str, default: CancelReason) -> CancelReason:
    try:
        return CancelReason(value)
    except ValueError:
        return default


class ServerStream:
    """One request being served: its payload, its context, and a way to answer.

    The handler side uses :meth:`send_item` (waits for flow-control credit) and
    finishes with exactly one of :meth:`end` or :meth:`fail`.
    """

    def __init__(self, session: _Session, request: Request) -> None:
        self.sid: Final = request.sid
        self.endpoint: Final = request.endpoint
        self.instance_id: Final = request.instance_id
        self.payload: Final[Any] = request.payload
        self.headers: Final = request.headers or {}
        self.context: Final = Context(request.request_id, timeout=request.timeout)
        self.cancel_signal: CancelReason | None = None
        """The first cancel signal from the caller's side (control, transport, deadline)."""
        self.on_cancel_signal: Callable[[CancelReason], None] | None = None
        """Called once, when :attr:`cancel_signal` is first set."""
        self._session = session
        self._credit_wakeup: trio.Event | None = None
        self._since_checkpoint = 0
        self._finished = False
        self.context.add_cancel_callback(self._on_context_cancelled)

    @property
    def peer(self) -> str:
        return self._session.connection.name

    def _note_cancel_signal(self, reason: CancelReason) -> None:
        if self.cancel_signal is None and not self._finished:
            self.cancel_signal = reason
            if self.on_cancel_signal is not None:
                self.on_cancel_signal(reason)

    def _on_context_cancelled(
        self, ctx: Context, state: ContextState, reason: CancelReason
    ) -> None:
        # Control frames and transport loss are noted where they arrive; these
        # are the other cancellations the handler did not ask for itself.
        if reason in _RUNTIME_CANCELS:
            self._note_cancel_signal(reason)

    def _apply_control(self, frame: Control) -> None:
        if frame.action == "kill":
            reason = _reason(frame.reason, CancelReason.KILL_REQUESTED)
            self._note_cancel_signal(reason)
            self.context.kill(reason)
        else:
            reason = _reason(frame.reason, CancelReason.STOP_REQUESTED)
            self._note_cancel_signal(reason)
            self.context.stop(reason)

    def _transport_lost(self) -> None:
        self._note_cancel_signal(CancelReason.TRANSPORT_LOST)
        self.context.kill(CancelReason.TRANSPORT_LOST)
        self._wake()

    def _wake(self) -> None:
        wakeup, self._credit_wakeup = self._credit_wakeup, None
        if wakeup is not None:
            wakeup.set()

    async def send_item(
        self,
        data: Any,
        *,
        id: str | None = None,
        event: str | None = None,
        comment: list[str] | None = None,
    ) -> None:
        """Send one item, first waiting for a flow-control credit if none is left.

        Raises:
            Disconnected: the connection is gone.
            InvalidArgument: ``data`` cannot be encoded, or is too large.
        """
        connection = self._session.connection
        protocol = connection.protocol
        while protocol.credits(self.sid) <= 0:
            if connection.closed:
                raise Disconnected(f"connection to {connection.name} lost")
            self._credit_wakeup = wakeup = trio.Event()
            await wakeup.wait()
            self._since_checkpoint = 0
        if connection.closed:
            raise Disconnected(f"connection to {connection.name} lost")
        connection.send(Item(self.sid, data, id, event, comment))
        self._since_checkpoint += 1
        if self._since_checkpoint >= _YIELD_EVERY:
            self._since_checkpoint = 0
            await trio.lowlevel.checkpoint()
        else:
            await trio.lowlevel.checkpoint_if_cancelled()

    def end(self, outcome: Outcome, reason: CancelReason | None = None) -> None:
        """Finish the stream with an ``end`` frame (no-op if the connection is gone)."""
        self._finish(End(self.sid, outcome, reason.value if reason else None))

    def fail(self, error: DynamoError) -> None:
        """Finish the stream with an ``err`` frame (no-op if the connection is gone)."""
        self._finish(Error(self.sid, error.error_type, error.message, error.caused_by))

    def _finish(self, frame: End | Error) -> None:
        if self._finished:
            return
        self._finished = True
        self._session.streams.pop(self.sid, None)
        connection = self._session.connection
        if not connection.closed and connection.protocol.is_open(self.sid):
            connection.send(frame)


class _Session:
    """One accepted connection and the streams served on it."""

    def __init__(
        self,
        server: RequestPlaneServer,
        stream: trio.SocketStream,
        name: str,
    ) -> None:
        config = server.config
        self.server = server
        self.streams: dict[int, ServerStream] = {}
        self.connection: Final = FrameConnection(
            stream,
            ProtocolConnection(
                Role.SERVER,
                max_frame_size=config.max_frame_size,
                max_streams=config.max_streams,
                token=config.auth_token,
                peer_name=server.name,
            ),
            config,
            on_frames=self._on_frames,
            on_close=self._connection_lost,
            name=name,
        )
        self._nursery: trio.Nursery | None = None

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            if self.server.draining:
                self.connection.send(GoAway("shutting down"))
            await self.connection.run()

    def _connection_lost(self, reason: str) -> None:
        # Runs inside FrameConnection.close: the streams die before any teardown.
        if self.streams:
            _log.info(
                "connection %s ended (%s): killing %d open stream(s)",
                self.connection.name,
                reason,
                len(self.streams),
            )
        for stream in tuple(self.streams.values()):
            stream._transport_lost()

    def _on_frames(self, frames: list[Frame]) -> None:
        for frame in frames:
            if isinstance(frame, Request):
                stream = ServerStream(self, frame)
                self.streams[frame.sid] = stream
                assert self._nursery is not None
                self._nursery.start_soon(self.server.handler, stream, name=f"stream {frame.sid}")
            elif isinstance(frame, Control):
                served = self.streams.get(frame.sid)
                if served is not None:
                    served._apply_control(frame)
            elif isinstance(frame, Credit):
                served = self.streams.get(frame.sid)
                if served is not None:
                    served._wake()

    def go_away(self) -> None:
        if not self.connection.closed and not self.connection.protocol.goaway:
            self.connection.send(GoAway("shutting down"))


class RequestPlaneServer:
    """Accepts request-plane connections and hands each request to ``handler``.

    Args:
        config: Bind address, limits, token, heartbeats.
        handler: ``async handler(stream)``, run in a new task per request; it
            must finish the stream with :meth:`ServerStream.end` or
            :meth:`ServerStream.fail`.
        name: This server's name in handshakes and logs.
    """

    def __init__(
        self,
        config: RequestPlaneConfig,
        handler: Callable[[ServerStream], Awaitable[None]],
        *,
        name: str = "worker",
    ) -> None:
        self.config: Final = config
        self.handler: Final = handler
        self.name: Final = name
        self.draining = False
        self._sessions: set[_Session] = set()
        self._listen_scope: trio.CancelScope | None = None

    @property
    def sessions(self) -> int:
        return len(self._sessions)

    async def serve(self, *, task_status: trio.TaskStatus[tuple[str, int]]) -> None:
        """Listen and serve until cancelled; ``task_status.started((host, port))``."""
        listeners = await trio.open_tcp_listeners(self.config.port, host=self.config.host)
        address = listeners[0].socket.getsockname()
        async with trio.open_nursery() as nursery:
            with trio.CancelScope() as self._listen_scope:
                task_status.started((address[0], address[1]))
                await trio.serve_listeners(
                    self._serve_connection, listeners, handler_nursery=nursery
                )

    def stop_accepting(self) -> None:
        """Close the listeners: no new connections (open ones continue)."""
        if self._listen_scope is not None:
            self._listen_scope.cancel()

    def go_away(self) -> None:
        """Refuse new streams on every connection (``goaway``); open streams go on."""
        self.draining = True
        for session in tuple(self._sessions):
            session.go_away()

    def close_all(self, reason: str = "server shutting down", *, graceful: bool = False) -> None:
        """Close every connection (streams still open on one are killed as transport loss).

        With ``graceful``, frames already queued (the ``goaway``) are sent first
        and each connection lingers briefly; otherwise it is cut at once.
        """
        for session in tuple(self._sessions):
            if graceful:
                session.connection.shutdown(reason)
            else:
                session.connection.close(reason)

    async def _serve_connection(self, stream: trio.SocketStream) -> None:
        try:
            host, port = stream.socket.getpeername()[:2]
            name = f"{host}:{port}"
        except OSError:
            name = "unknown peer"
        session = _Session(self, stream, name)
        self._sessions.add(session)
        try:
            await session.run()
        finally:
            self._sessions.discard(session)
