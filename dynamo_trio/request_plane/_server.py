"""The worker side of the request plane: listening, sessions (a connection's gate,
then its streams) and served streams."""

from __future__ import annotations

from collections import Counter
from contextlib import suppress
from time import perf_counter
from typing import TYPE_CHECKING, Any, Final

import trio
from trio.lowlevel import checkpoint, checkpoint_if_cancelled

from .._contain import collapse, contain, split_live_cancellation
from .._context import CancelReason, Context, ContextState
from .._errors import Disconnected, ProtocolError, Unknown
from .._hostport import host_port
from .._startup import CannotServe
from ._connection import (
    NETWORK_ERRORS,
    FrameConnection,
    handshake,
    limited_log,
    linger,
    log,
    printable,
)
from ._frames import (
    HANDSHAKE_MAX_FRAME_SIZE,
    Close,
    Control,
    Credit,
    End,
    Error,
    GoAway,
    Item,
    Request,
    encode_frame,
)
from ._protocol import ConnectionState, ProtocolConnection, Role
from ._throttle import AuthTurns, source_key
from ._tls import server_context

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from .._config import RequestPlaneConfig
    from .._errors import DynamoError
    from ._frames import Frame, Outcome

# A handler yielding items without blocking checkpoints fully every this many items or
# seconds: batches pay the scheduler once, a CPU-bound one still hears its kill.
_YIELD_EVERY: Final = 32
_YIELD_AFTER: Final = 0.02
_REFUSAL_TIMEOUT: Final = 0.25  # for a refused connection's close frame
_MAX_LINGERING_REFUSALS: Final = 16  # refused connections lingering so that frame arrives
_VERDICT_MARGIN: Final = 0.1
_ORPHAN_GRACE: Final = 2.0  # a stream task outliving its connection is cancelled after this

_RUNTIME_CANCELS: Final = {CancelReason.DEADLINE, CancelReason.SHUTDOWN, CancelReason.DRAIN_TIMEOUT}


def _describe(exc: BaseException) -> str:
    exc = collapse(exc) or exc
    text = str(exc)
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


class ServerStream:
    """One request being served: :meth:`send_item` answers, then one :meth:`end` or :meth:`fail`."""

    def __init__(self, session: _Session, connection: FrameConnection, request: Request) -> None:
        self.sid: Final = request.sid
        self.endpoint: Final = request.endpoint
        self.instance_id: Final = request.instance_id
        self.payload: Final[Any] = request.payload
        self.headers: Final = request.headers or {}
        self.peer: Final = connection.name
        self.context: Final = Context(request.request_id, timeout=request.timeout)
        self.cancel_signal: CancelReason | None = None  # the caller side's first
        self.on_cancel_signal: Callable[[CancelReason], None] | None = None  # called once
        self._session = session
        self._connection = connection
        self._credit_wakeup: trio.Event | None = None
        self._since_checkpoint, self._slice_started = 0, perf_counter()
        self.finished = False  # end() or fail() was called
        self.context._add_exit_callback(self._on_context_cancelled)

    @property
    def task_nursery(self) -> trio.Nursery:
        """The nursery of this stream's task (no cancel scope in between): for its helper tasks."""
        nursery = self._session._nursery
        assert nursery is not None
        return nursery

    def _note_cancel_signal(self, reason: CancelReason) -> None:
        if self.cancel_signal is None and not self.finished:
            self.cancel_signal = reason
            if self.on_cancel_signal is not None:
                self.on_cancel_signal(reason)

    def _on_context_cancelled(
        self, ctx: Context, state: ContextState, reason: CancelReason
    ) -> None:
        # Control frames and transport loss are noted where they arrive.
        if reason in _RUNTIME_CANCELS:
            self._note_cancel_signal(reason)

    def _apply_control(self, frame: Control) -> None:
        kill = frame.action == "kill"
        try:
            reason = CancelReason(frame.reason)
        except ValueError:
            reason = CancelReason.KILL_REQUESTED if kill else CancelReason.STOP_REQUESTED
        self._note_cancel_signal(reason)
        (self.context.kill if kill else self.context.stop)(reason)

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
        """Send one item, waiting for a credit if none is left (Disconnected, InvalidArgument)."""
        connection = self._connection
        while connection.protocol.credits(self.sid) <= 0:
            if connection.closed:
                raise Disconnected(f"connection to {connection.name} lost")
            self._credit_wakeup = wakeup = trio.Event()
            await wakeup.wait()
            self._since_checkpoint, self._slice_started = 0, perf_counter()
        if not connection.send(Item(self.sid, data, id, event, comment)):
            raise Disconnected(f"connection to {connection.name} lost")
        sent = self._since_checkpoint = self._since_checkpoint + 1
        if sent < _YIELD_EVERY and perf_counter() - self._slice_started < _YIELD_AFTER:
            await checkpoint_if_cancelled()
            return
        await checkpoint()
        self._since_checkpoint, self._slice_started = 0, perf_counter()

    def end(self, outcome: Outcome, reason: CancelReason | None = None) -> None:
        """Finish the stream with an ``end`` frame (no-op if the connection is gone)."""
        self._finish(End(self.sid, outcome, reason.value if reason else None))

    def fail(self, error: DynamoError) -> None:
        """Finish the stream with an ``err`` frame (no-op if the connection is gone)."""
        self._finish(Error(self.sid, error.error_type, error.message, error.caused_by))

    def _finish(self, frame: End | Error) -> None:
        if self.finished:
            return
        self.finished = True
        self._session.streams.pop(self.sid, None)
        # Also breaks the context -> callback -> stream cycle: freed by reference counting.
        self.context.remove_cancel_callback(self._on_context_cancelled)
        if self._connection.protocol.is_open(self.sid):
            self._connection.send(frame)
        self._connection.retire_if_drained()


class _Session:
    """One accepted connection: its gate (handshake), then the streams served on it."""

    def __init__(self, server: RequestPlaneServer, stream: trio.abc.Stream, peer: str) -> None:
        config = server.config
        self.server: Final = server
        self.peer: Final = peer
        self.streams: dict[int, ServerStream] = {}
        self.protocol: Final = ProtocolConnection(
            Role.SERVER,
            max_frame_size=config.max_frame_size,
            max_streams=config.max_streams,
            token=config.auth_token,
            peer_name=server.name,
        )
        self.connection: FrameConnection | None = None  # once the handshake is complete
        self._stream: trio.abc.Stream = stream
        self._nursery: trio.Nursery | None = None
        self._gate_scope = trio.CancelScope()
        self._gate_deadline = float("inf")
        self.awaiting_turn = False  # its proof waits to be judged (see ._throttle)
        self.source: Final = source_key(peer.rpartition(":")[0].strip("[]") or peer)

    async def run(self) -> None:
        admitted = False  # also when close() cancels the gate
        try:
            with self._gate_scope:
                admitted = await self._pass_gate()
        finally:
            if not admitted:
                await trio.aclose_forcefully(self._stream)
        if not admitted:
            return
        args = (self._stream, self.protocol, self.server.config)
        connection = FrameConnection(*args, self._on_frames, self._connection_lost, name=self.peer)
        self.connection = connection
        self.server._gated.pop(self, None)  # its handshake slot is free
        if self.server.draining:
            self.go_away()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await connection.run()
            if nursery.child_tasks:  # a handler ignoring its killed context
                nursery.cancel_scope.deadline = trio.current_time() + _ORPHAN_GRACE

    async def _pass_gate(self) -> bool:
        """TLS and the handshake under the deadline; whether the peer got in."""
        server = self.server
        config = server.config
        framed = server.ssl_context is None  # frames can be sent (TLS, if any, is up)
        with trio.move_on_after(config.handshake_timeout) as gate:
            # A verdict comes a little before the deadline, so the peer hears it.
            self._gate_deadline = gate.deadline - _VERDICT_MARGIN
            try:
                if server.ssl_context is not None:
                    tls = trio.SSLStream(self._stream, server.ssl_context, server_side=True)
                    self._stream = tls
                    await tls.do_handshake()
                    framed = True
                return await self._handshake()
            except NETWORK_ERRORS as exc:
                cause = exc.__cause__ or exc
                key, what = (
                    ("handshake-failed", "request-plane") if framed else ("tls-failed", "TLS")
                )
                why = "connection from %s: %s handshake failed: %s"
                limited_log.warning(key, why, self.peer, what, str(cause) or type(cause).__name__)
                return False
        why = "connection from %s: no complete handshake within %.1fs; closing it"
        limited_log.warning("handshake-timeout", why, self.peer, config.handshake_timeout)
        close = Close("timeout", f"no complete handshake within {config.handshake_timeout}s")
        if framed and self.protocol.send(close):
            with trio.move_on_after(_REFUSAL_TIMEOUT), suppress(*NETWORK_ERRORS):
                await self._stream.send_all(self.protocol.data_to_send())
        return False

    async def _handshake(self) -> bool:
        protocol = self.protocol
        try:
            await handshake(self._stream, protocol, self._authenticate)
        except ProtocolError as exc:
            why = "connection from %s: protocol error before authentication, refused: %s"
            limited_log.warning("handshake-refused", why, self.peer, printable(exc.message))
            await self._stream.send_all(protocol.data_to_send())
        if protocol.closed and protocol.close_frame is None:  # we refused it: let the close arrive
            await linger(self._stream, limit=HANDSHAKE_MAX_FRAME_SIZE)
        return protocol.state is ConnectionState.OPEN

    async def _authenticate(self) -> None:
        self.awaiting_turn = True
        try:
            verdict = await self.server.throttle.judge(
                self.source, self.protocol.authenticate, deadline=self._gate_deadline
            )
        finally:
            self.awaiting_turn = False
        if verdict is None:
            self.protocol.send(Close("throttled", "too many failed authentications; retry later"))
            why = "connection from %s: refused, its proof could not be judged before its handshake"
            why += " deadline (failed authentications are paced)"
            limited_log.warning("auth-throttled", why, self.peer)
        elif not verdict:
            why = "connection from %s: authentication failed (missing or wrong request-plane token)"
            limited_log.warning("auth-failed", why, self.peer)

    def _connection_lost(self, reason: str) -> None:
        if self.streams:
            why = "connection %s ended (%s): killing %d open stream(s)"
            log.info(why, self.peer, reason, len(self.streams))
        for stream in tuple(self.streams.values()):
            stream._transport_lost()

    def _on_frames(self, frames: list[Frame]) -> None:
        for frame in frames:
            if isinstance(frame, Request):
                self._open_stream(frame)
            elif isinstance(frame, Control) and (served := self.streams.get(frame.sid)):
                served._apply_control(frame)
            elif isinstance(frame, Credit) and (served := self.streams.get(frame.sid)):
                served._wake()

    def _open_stream(self, frame: Request) -> None:
        connection, nursery = self.connection, self._nursery
        assert connection is not None and nursery is not None
        try:
            stream = ServerStream(self, connection, frame)
        except Exception as exc:
            why = "connection %s: cannot set up stream %d: %s"
            args = (self.peer, frame.sid, _describe(exc))
            limited_log.error("stream-setup", why, *args, exc_info=exc)
            connection.send(Error(frame.sid, Unknown.error_type, "the worker could not start it"))
            return
        self.streams[frame.sid] = stream
        nursery.start_soon(self._serve_stream, stream, name=f"stream {frame.sid}")

    async def _serve_stream(self, stream: ServerStream) -> None:
        """Run the handler; whatever escapes it ends this stream only (contain(), written out)."""
        try:
            await self.server.handler(stream)
        except BaseException as exc:
            cancelled, escaped = split_live_cancellation(exc)
            if escaped is not None:
                why = "connection %s: stream %d ended by an exception that escaped its handler: %s"
                args = (self.peer, stream.sid, _describe(escaped))
                limited_log.error("stream-escape", why, *args, exc_info=escaped)
                stream.fail(Unknown("the worker failed while serving the request"))
            if cancelled is not None:
                raise cancelled from None
        finally:
            if not stream.finished:
                stream.fail(Unknown("the worker ended the request without an answer"))

    def go_away(self) -> None:
        connection = self.connection
        if connection is not None:  # the protocol drops a second goaway
            connection.send(GoAway("shutting down"))
            connection.retire_if_drained()

    def close(self, reason: str, *, graceful: bool) -> None:
        if self.connection is None:
            self._gate_scope.cancel()
        else:
            (self.connection.shutdown if graceful else self.connection.close)(reason)


class RequestPlaneServer:
    """Accepts request-plane connections and runs ``await handler(stream)`` per request,
    which must finish the stream (:meth:`ServerStream.end` or :meth:`~ServerStream.fail`)."""

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
        self.throttle: Final = AuthTurns(config.auth_penalty)
        self.ssl_context: Final = server_context(config) if config.tls else None
        self._sessions: set[_Session] = set()
        self._gated: dict[_Session, None] = {}  # sessions in their handshake, oldest first
        self._refusing = 0
        self._listen_scope: Final = trio.CancelScope()  # stop_accepting() cancels it

    @property
    def sessions(self) -> int:
        """Connections held now (in their handshake or established)."""
        return len(self._sessions)

    @property
    def handshaking(self) -> int:
        """Connections held now that have not completed the handshake."""
        return len(self._gated)

    async def serve(self, *, task_status: trio.TaskStatus[tuple[str, int]]) -> None:
        """Listen and serve until cancelled; ``task_status.started((host, port))``."""
        try:
            listeners = await trio.open_tcp_listeners(self.config.port, host=self.config.host)
        except OSError as exc:
            where = host_port(self.config.host or "*", self.config.port)
            message = f"cannot listen for the request plane on {where}: {exc.strerror or exc}"
            raise CannotServe(message) from exc
        async with trio.open_nursery() as nursery:
            with self._listen_scope:
                task_status.started(listeners[0].socket.getsockname()[:2])
                await trio.serve_listeners(self._accepted, listeners, handler_nursery=nursery)

    def stop_accepting(self) -> None:
        """Close the listeners: no new connections (open ones continue)."""
        self._listen_scope.cancel()

    def go_away(self) -> None:
        """Refuse new streams on every connection (``goaway``); open streams go on."""
        self.draining = True
        for session in tuple(self._sessions):
            session.go_away()

    def close_all(self, reason: str = "server shutting down", *, graceful: bool = False) -> None:
        """Close every connection, killing its open streams as transport loss (``graceful``:
        queued frames, the ``goaway``, go out first); handshakes are dropped."""
        for session in tuple(self._sessions):
            session.close(reason, graceful=graceful)

    async def _accepted(self, stream: trio.SocketStream) -> None:
        try:
            peer = host_port(*stream.socket.getpeername()[:2])
        except OSError:
            peer = "unknown peer"
        await self.handle_connection(stream, peer=peer)

    async def handle_connection(self, stream: trio.abc.Stream, peer: str) -> None:
        """Serve one accepted connection (``peer``: ``host:port``) until it ends; raises only
        ``trio.Cancelled`` (whatever goes wrong ends this connection only)."""
        config = self.config
        if len(self._sessions) >= config.max_connections:
            why = f"too many connections (limit {config.max_connections})"
            await self._refuse(stream, peer, why)
            return
        if len(self._gated) >= config.max_handshakes:
            if not self._gated:  # a cap of 0: nobody may be in a handshake
                await self._refuse(stream, peer, "no connection may be in its handshake")
                return
            self._evict_oldest_handshake(peer)
        session = _Session(self, stream, peer)
        self._sessions.add(session)
        self._gated[session] = None

        def escaped(exc: BaseException) -> None:
            why = "connection %s: ended by an internal error: %s"
            limited_log.error("connection-escape", why, peer, _describe(exc), exc_info=exc)

        try:
            with contain(escaped):
                await session.run()
        finally:
            self._gated.pop(session, None)
            self._sessions.discard(session)

    def _evict_oldest_handshake(self, newcomer: str) -> None:
        """Make room for ``newcomer`` (docs/protocol.md, "The worker side")."""
        oldest = next((session for session in self._gated if not session.awaiting_turn), None)
        if oldest is None:
            counts = Counter(session.source for session in self._gated)
            oldest = next(s for s in self._gated if counts[s.source] == max(counts.values()))
        why = "handshake slots full (limit %d): dropping the oldest unauthenticated connection"
        args = (self.config.max_handshakes, oldest.peer, newcomer)
        limited_log.warning("handshake-evicted", why + ", from %s, for one from %s", *args)
        del self._gated[oldest]  # its slot is the newcomer's from now on
        oldest.close("evicted", graceful=False)  # in its handshake: the gate is cancelled

    async def _refuse(self, stream: trio.abc.Stream, peer: str, why: str) -> None:
        """Tell a connection beyond a cap why (plaintext; a few linger so it arrives); drop it."""
        limited_log.warning("connection-refused", "refusing a connection from %s: %s", peer, why)
        self._refusing += 1
        try:
            if self.ssl_context is None:
                out = bytearray()
                encode_frame(Close("unavailable", why), out, HANDSHAKE_MAX_FRAME_SIZE)
                with suppress(*NETWORK_ERRORS):
                    with trio.move_on_after(_REFUSAL_TIMEOUT):
                        await stream.send_all(out)
                    if self._refusing <= _MAX_LINGERING_REFUSALS:
                        await linger(stream, limit=HANDSHAKE_MAX_FRAME_SIZE)
        finally:
            self._refusing -= 1
            await trio.aclose_forcefully(stream)
