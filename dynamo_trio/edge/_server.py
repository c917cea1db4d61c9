"""Serving an ASGI app over HTTP: hypercorn's per-connection code under an accept loop
whose shutdown always ends (docs/architecture.md, "The HTTP edge"), each connection's hang-up
told to the app at once (:class:`ConnectionGone`).
"""

from __future__ import annotations

import logging
import math
import os
import socket
from contextlib import ExitStack, suppress
from functools import partial
from typing import TYPE_CHECKING, Any, Final, cast, final

import trio
from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.events import Closed, Event, RawData
from hypercorn.protocol.h2 import H2Protocol
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import repr_socket_addr

from .._contain import split_live_cancellation
from .._hostport import parse_address
from .._startup import CannotServe
from ._chunks import CONNECTION_WRITER
from ._guard import GuardedProtocol, limited_log
from ._h2 import RoundRobin

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

    from hypercorn.config import Config as HypercornConfig
    from hypercorn.protocol import ProtocolWrapper
    from hypercorn.typing import ASGIFramework

_log = logging.getLogger("dynamo_trio.http")


def listen_sockets(binds: list[str], *, reuse_port: bool = False) -> list[socket.socket]:
    """Bound (not yet listening) TCP sockets for ``host:port`` strings (``[v6]:port``),
    with ``SO_REUSEPORT`` if ``reuse_port``; ``CannotServe`` if one cannot be bound."""
    sockets: list[socket.socket] = []
    with ExitStack() as opened:  # all closed if one fails
        for bind in binds:
            host, port = parse_address(bind)
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = opened.enter_context(socket.socket(family, socket.SOCK_STREAM))
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            try:
                sock.bind((host, port))
            except OSError as exc:
                raise CannotServe(f"cannot listen on {bind}: {exc.strerror or exc}") from exc
            sock.setblocking(False)
        opened.pop_all()
    return sockets


def dead_peer_options(timeout: float) -> list[tuple[int, int, int]]:
    """``(level, option, value)`` socket options that find a silent TCP peer in about
    ``timeout`` seconds: keepalive probes from a third of it, a sixth apart, and
    ``TCP_USER_TIMEOUT`` of it (options this platform lacks are left out; the trade-off
    is docs/operations.md's "Clients that vanish")."""
    idle = max(1, int(timeout // 3))
    interval = max(1, int(timeout // 6))
    count = max(1, math.ceil((timeout - idle) / interval))
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (
        ("TCP_KEEPIDLE", idle),
        ("TCP_KEEPINTVL", interval),
        ("TCP_KEEPCNT", count),
        ("TCP_USER_TIMEOUT", max(1, round(timeout * 1000))),
    ):
        if hasattr(socket, name):
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    return options


async def serve_http(
    app: ASGIFramework,
    config: HypercornConfig,
    shutdown_trigger: Callable[[], Awaitable[None]],
    *,
    sockets: list[socket.socket],
    dead_peer_timeout: float = 0.0,
    cleartext_http2: bool = False,
    http2_max_resets: int = 100,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` over plain HTTP on ``sockets`` (:func:`listen_sockets`) until
    ``shutdown_trigger`` returns; the bound URLs go to ``task_status``.

    On shutdown: stop accepting, let connections finish for ``config.graceful_timeout``,
    then cancel them and close their sockets.  ``dead_peer_timeout`` (0: none): see
    :func:`dead_peer_options`; ``cleartext_http2`` and ``http2_max_resets``: :mod:`._guard`.
    """
    wrapped = ASGIWrapper(app)
    lifespan_state: dict[str, Any] = {}
    lifespan = Lifespan(wrapped, config, lifespan_state)
    guard = partial(GuardedProtocol, cleartext_http2=cleartext_http2, max_resets=http2_max_resets)
    # Each open connection's context, whose "terminated" closes it once idle: set by the
    # shutdown, and by the client's EOF (hypercorn would wait for the keep-alive timeout).
    open_streams: dict[trio.SocketStream, WorkerContext] = {}
    shutting_down = False
    peer_options = dead_peer_options(dead_peer_timeout) if dead_peer_timeout > 0 else []

    async def handle(stream: trio.SocketStream) -> None:
        context = open_streams[stream] = WorkerContext(None)
        try:
            with suppress(OSError):  # not TCP, or already reset (hypercorn finds out at once)
                for level, option, value in peer_options:
                    stream.socket.setsockopt(level, option, value)
            if shutting_down:
                await context.terminated.set()
            ordered = _OrderedSends(stream, stream.socket, context)
            await _serve_connection(wrapped, config, context, lifespan_state, ordered, guard)
        finally:
            del open_streams[stream]

    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        for sock in sockets:
            sock.listen(config.backlog)
        listeners = [trio.SocketListener(trio.socket.from_stdlib_socket(s)) for s in sockets]
        binds = [f"http://{repr_socket_addr(s.family, s.getsockname())}" for s in sockets]
        _log.debug("listening on %s", ", ".join(binds))
        async with trio.open_nursery() as closer:
            async with trio.open_nursery() as connections:
                serve = partial(
                    trio.serve_listeners, handle, listeners, handler_nursery=connections
                )
                async with trio.open_nursery() as accepting:
                    accepting.start_soon(serve)
                    task_status.started(binds)
                    await shutdown_trigger()
                    accepting.cancel_scope.cancel()  # closes the listeners
                shutting_down = True
                for context in tuple(open_streams.values()):
                    await context.terminated.set()  # idle keep-alive connections close now
                deadline = trio.current_time() + config.graceful_timeout
                connections.cancel_scope.deadline = deadline
                closer.start_soon(_close_at, deadline, open_streams)
            closer.cancel_scope.cancel()
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()


async def serve_stream(
    app: ASGIFramework,
    config: HypercornConfig,
    stream: trio.abc.HalfCloseableStream,
    *,
    cleartext_http2: bool = False,
    http2_max_resets: int = 100,
) -> None:
    """Serve the one HTTP connection ``stream`` carries (any trio stream) until it ends,
    as :func:`serve_http` serves each of its own; no lifespan, the peer is ``127.0.0.1``."""
    context = WorkerContext(None)
    ordered = _OrderedStreamSends(stream, _NoSocket(), context)
    guard = partial(GuardedProtocol, cleartext_http2=cleartext_http2, max_resets=http2_max_resets)
    await _serve_connection(ASGIWrapper(app), config, context, {}, ordered, guard)


async def _serve_connection(
    wrapped: ASGIWrapper,
    config: HypercornConfig,
    context: WorkerContext,
    lifespan_state: dict[str, Any],
    ordered: _OrderedSends,
    guard: Callable[[ProtocolWrapper], GuardedProtocol],
) -> None:
    """hypercorn's protocols over ``ordered`` until the connection ends; what its code
    raises ends that connection only (logged at a bounded rate), a live cancellation goes on."""
    try:
        # (typed for TLS streams; hypercorn's own loop passes a plain one too)
        tls_typed = cast("trio.SSLStream[trio.SocketStream]", ordered)
        state = ConnectionState(lifespan_state.copy())
        server = _Connection(wrapped, config, context, state, tls_typed, guard=guard)
        state[CONNECTION_WRITER] = server.write  # ._chunks
        state[CONNECTION_GONE] = ordered.gone
        try:
            await server.run()
        finally:
            del state[CONNECTION_WRITER]  # no cycle through the server outlives it
            del state[CONNECTION_GONE]
    except BaseException as exc:
        live, failure = split_live_cancellation(exc)
        if live is not None:
            raise live from None
        if failure is not None:
            limited_log.error(
                "connection-escape",
                "an HTTP connection's code raised %s; closing that connection only",
                type(failure).__name__,
                exc_info=failure,
            )


async def _close_at(deadline: float, streams: dict[trio.SocketStream, WorkerContext]) -> None:
    """At ``deadline``, close the sockets of the connections still open."""
    await trio.sleep_until(deadline)
    if streams:
        _log.info("closing %d connection(s) still open after the shutdown grace", len(streams))
    for stream in tuple(streams):
        stream.socket.close()  # a send blocked on it fails with ClosedResourceError


@final
class _Connection(TCPServer):
    """hypercorn's per-connection server, with a cheaper idle timer (:class:`_IdleTimer`)
    and writes that skip its send lock (:class:`_OrderedSends` keeps them whole and in
    order) and the empty one that ends a body of declared length."""

    _guarded: GuardedProtocol

    def __init__(self, *args: Any, guard: Callable[[ProtocolWrapper], GuardedProtocol]) -> None:
        self._guard = guard
        super().__init__(*args)
        self.idle_task = _IdleTimer(self)  # type: ignore[assignment]  # hypercorn's interface

    @property  # type: ignore[override]  # hypercorn's attribute, guarded (see ._guard)
    def protocol(self) -> GuardedProtocol:
        return self._guarded

    @protocol.setter
    def protocol(self, wrapped: ProtocolWrapper) -> None:
        self._guarded = self._guard(wrapped)

    async def protocol_send(self, event: Event) -> None:
        protocol = self.protocol.protocol
        if type(protocol) is H2Protocol and not isinstance(protocol.priority, RoundRobin):
            # An HTTP/2 connection's first send (its SETTINGS), before any stream:
            # its streams are sent in turn (see ._h2), not by hypercorn's priority tree.
            protocol.priority = RoundRobin()  # type: ignore[assignment]  # the tree's interface
        if isinstance(event, RawData):
            await trio.lowlevel.checkpoint_if_cancelled()
            if event.data:
                await self.write(event.data)
            return
        await super().protocol_send(event)

    async def write(self, data: bytes) -> None:
        """Write ``data`` (cancelled only before any byte); a failed write closes the
        connection as hypercorn's own do, so the app gets ``http.disconnect``."""
        try:
            await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            async with self.send_lock:
                await self.protocol.handle(Closed())

    async def _read_data(self) -> None:
        self._task_group.spawn(self.idle_task.watch)  # type: ignore[attr-defined]
        try:
            await super()._read_data()
        finally:
            self.idle_task.finish()  # type: ignore[attr-defined]


@final
class _IdleTimer:
    """The idle timer of a :class:`_Connection`, one task (:meth:`watch`) for all its requests
    (``restart``/``stop``: hypercorn's ``TrioSingleTask`` interface): idle from ``restart``,
    busy from ``stop``."""

    __slots__ = ("_connection", "_deadline", "_done", "_idle", "_sleep")

    def __init__(self, connection: _Connection) -> None:
        self._connection = connection
        self._idle = False
        self._deadline = math.inf
        self._sleep = trio.CancelScope()  # the watch's current sleep (none yet: a spare one)
        self._done = False

    async def restart(self, task_group: Any, action: object) -> None:
        """The connection is idle from now (hypercorn's arguments are not used)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        self._idle = True
        self._move(trio.current_time() + self._connection.config.keep_alive_timeout)
        if self._connection.context.terminated.is_set():
            self._sleep.cancel()  # terminated while busy: close now that it is idle

    async def stop(self) -> None:
        """The connection is serving a request (HTTP/2: each new stream says so again)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._idle:  # (busy already: the deadline is infinite)
            self._idle = False
            self._move(math.inf)

    def finish(self) -> None:
        """The connection stopped reading: the watch ends (hypercorn closes the rest)."""
        self._done = True
        self._sleep.cancel()

    def _move(self, deadline: float) -> None:
        self._deadline = deadline
        self._sleep.deadline = deadline  # no wake-up: trio just files the new deadline

    async def watch(self) -> None:
        """Close the connection once it is idle past its deadline, or idle and terminated."""
        terminated = self._connection.context.terminated
        while not self._done:
            if self._idle and (terminated.is_set() or trio.current_time() >= self._deadline):
                with trio.CancelScope(shield=True):
                    await self._connection._initiate_server_close()
                return
            with trio.CancelScope(deadline=self._deadline) as self._sleep:
                if terminated.is_set():
                    await trio.sleep_forever()
                else:
                    await terminated.wait()


CONNECTION_GONE: Final = "dynamo_trio.connection_gone"
"""The key of the connection's :class:`ConnectionGone` in its ASGI state: the client's
hang-up, told by the task that reads the connection a scheduler pass before
``http.disconnect`` reaches the app."""


@final
class ConnectionGone:
    """Callbacks to run, each once, in the order added, when the client ends the
    connection (its EOF, or a reset); one added after that runs at once."""

    __slots__ = ("_callbacks", "gone")

    def __init__(self) -> None:
        self._callbacks: dict[Callable[[], object], None] = {}
        self.gone = False
        """Whether the client has ended the connection."""

    def add(self, callback: Callable[[], object]) -> None:
        """Run ``callback`` when the client ends the connection (now if it has)."""
        if self.gone:
            _run(callback)
        else:
            self._callbacks[callback] = None

    def discard(self, callback: Callable[[], object]) -> None:
        """Forget ``callback`` (a request that ended no longer needs telling)."""
        self._callbacks.pop(callback, None)

    def fire(self) -> None:
        """The client has ended the connection: run the callbacks (idempotent)."""
        self.gone = True
        callbacks, self._callbacks = self._callbacks, {}
        for callback in callbacks:
            _run(callback)


def connection_gone(scope: Mapping[str, Any]) -> ConnectionGone | None:
    """The :class:`ConnectionGone` of ``scope``'s connection (``None`` off the edge's server)."""
    gone = (scope.get("state") or {}).get(CONNECTION_GONE)
    return gone if isinstance(gone, ConnectionGone) else None


def _run(callback: Callable[[], object]) -> None:
    try:
        callback()
    except Exception as exc:
        limited_log.error("connection-gone", "a hang-up callback %r failed", callback, exc_info=exc)


class _OrderedSends(trio.abc.HalfCloseableStream):
    """A socket stream whose sends are whole and in order.  A ``send_eof`` (which hypercorn
    calls without its send lock) during a ``send_all`` is refused at once with the
    ``BusyResourceError`` hypercorn ignores: the send may be blocked on a client that reads
    nothing, and the ``aclose`` after the EOF is what unblocks it."""

    def __init__(
        self,
        stream: trio.abc.HalfCloseableStream,
        socket: Any,
        context: WorkerContext | None = None,
    ) -> None:
        self._stream = stream
        self._sending = trio.StrictFIFOLock()
        self._context = context  # the client's EOF sets its "terminated": closed once idle
        self.socket = socket  # hypercorn reads the peer's address from it
        self.gone: Final = ConnectionGone()
        """Told, by the reading task, the moment the client ends the connection."""

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Send ``data`` (a cancellation lands before any byte): at once if the socket has
        room, else the rest waits its turn, shielded (closing the socket ends the wait)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        sent = self.send_nowait(data)
        if sent == len(data):
            return
        with trio.CancelScope(shield=True):
            async with self._sending:
                await self._stream.send_all(memoryview(data)[sent:])

    def send_nowait(self, data: bytes | bytearray | memoryview) -> int:
        """Send what the socket takes without blocking: the bytes sent (0 while another
        send is under way or the buffer is full); ``ClosedResourceError`` after a close
        or an EOF, ``BrokenResourceError`` once the peer is gone."""
        sock = self.socket
        fd = sock.fileno()
        if fd == -1 or sock.did_shutdown_SHUT_WR:
            raise trio.ClosedResourceError("the connection is closed")
        if self._sending.locked():  # (trio hands a released lock straight to a waiter)
            return 0
        try:
            # The socket is non-blocking (trio's); nothing awaits between the check
            # above and this write, so the descriptor is this connection's.
            return os.write(fd, data)
        except BlockingIOError:
            return 0
        except OSError as exc:
            raise trio.BrokenResourceError(f"the connection was lost: {exc}") from exc

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        if self._sending.locked():
            await trio.lowlevel.checkpoint()
            raise trio.BusyResourceError("another task is currently sending data on this stream")
        async with self._sending:
            await self._stream.send_eof()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        try:
            data = await self._stream.receive_some(max_bytes)
        except trio.BrokenResourceError:  # a reset
            self.gone.fire()
            raise
        if not data:
            self.gone.fire()
            if self._context is not None:
                await self._context.terminated.set()
        return data

    async def aclose(self) -> None:
        await self._stream.aclose()


@final
class _OrderedStreamSends(_OrderedSends):
    """:class:`_OrderedSends` on a stream with no socket: every write waits its turn."""

    def send_nowait(self, data: bytes | bytearray | memoryview) -> int:
        return 0


@final
class _NoSocket:
    """What hypercorn reads of a connection's socket, for a stream that has none."""

    family: Final = socket.AF_INET

    def getpeername(self) -> tuple[str, int]:
        return ("127.0.0.1", 1)

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", 80)
