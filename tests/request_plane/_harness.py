"""Shared parts of the request plane's trio-level tests.

* :func:`streaming_handler`: a worker handler that sends an item every 10 ms
  (virtual time under the autojump clock) until it is stopped or killed.
* :class:`MemoryNetwork`: connects a :class:`ConnectionPool` to servers and
  to hostile fake servers over ``trio.testing.memory_stream_pair``, by address.
* :class:`RawPeer`: one end of a connection spoken to frame by frame, or byte
  by byte, with no rules at all (the hostile peer).
* :class:`HealthyStream`: a stream on a well-behaved connection that keeps
  consuming items in the background; tests check it is never disturbed.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import trio
import trio.testing

from dynamo_trio import Disconnected, RequestPlaneConfig
from dynamo_trio.request_plane._frames import FrameDecoder, encode_frame

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from dynamo_trio.request_plane import ClientStream, ConnectionPool, ServerStream

LIMIT = 1 << 20

CONFIG = RequestPlaneConfig(
    heartbeat_interval=0.1,
    heartbeat_timeout=1.0,
    handshake_timeout=1.0,
    connect_timeout=1.0,
    stream_window=4,
    max_frame_size=LIMIT,
    auth_penalty=0.2,
)


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


async def streaming_handler(stream: ServerStream) -> None:
    """Send an item every 10 ms until stopped or killed; end the stream accordingly."""
    context = stream.context
    index = 0
    try:
        while not context.is_stopped():
            await stream.send_item({"i": index})
            index += 1
            await trio.sleep(0.01)
    except Disconnected:
        return
    stream.end("killed" if context.is_killed() else "stopped", context.reason)


def wire(*frames: Any) -> bytes:
    out = bytearray()
    for frame in frames:
        encode_frame(frame, out, LIMIT)
    return bytes(out)


class RawPeer:
    """A peer that sends whatever it is told and records whatever it receives."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.decoder = FrameDecoder(LIMIT)
        self.received: list[Any] = []
        self.eof = False
        self.undecodable = False

    async def send(self, *frames: Any) -> bool:
        return await self.send_bytes(wire(*frames))

    async def send_bytes(self, data: bytes) -> bool:
        """Send ``data``; ``False`` if the other end is already gone."""
        try:
            await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return False
        return True

    async def read_for(self, seconds: float) -> None:
        """Collect frames until EOF or ``seconds`` pass."""
        with trio.move_on_after(seconds):
            while not self.eof:
                await self._read_once()

    async def expect(self, frame_type: type, seconds: float = 1.0) -> Any:
        """The next frame of ``frame_type`` (skipping pings), or fail."""
        with trio.fail_after(seconds):
            while True:
                for index, frame in enumerate(self.received):
                    if isinstance(frame, frame_type):
                        del self.received[: index + 1]
                        return frame
                if self.eof:
                    raise AssertionError(f"EOF before a {frame_type.__name__}: {self.received}")
                await self._read_once()

    async def _read_once(self) -> None:
        try:
            data = await self.stream.receive_some(65536)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
        if not data:
            self.eof = True
            return
        try:
            self.received += self.decoder.feed(data)
        except Exception:
            self.undecodable = True

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)


class MemoryNetwork:
    """Addresses served over in-memory streams: real servers or hostile scripts."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self._routes: dict[str, Callable[[trio.abc.Stream], Awaitable[None]]] = {}
        self.opened: dict[str, int] = {}

    def route(self, address: str, serve: Callable[[trio.abc.Stream], Awaitable[None]]) -> None:
        self._routes[address] = serve

    async def open(self, address: str) -> trio.abc.Stream:
        await trio.lowlevel.checkpoint()
        serve = self._routes.get(address)
        if serve is None:
            raise OSError(f"connection refused: {address}")
        self.opened[address] = self.opened.get(address, 0) + 1
        client_end, server_end = trio.testing.memory_stream_pair()
        self.nursery.start_soon(serve, server_end)
        return client_end


class HealthyStream:
    """A stream on a good connection, consumed in the background, that must keep flowing."""

    def __init__(self, stream: ClientStream) -> None:
        self.stream = stream
        self.items = 0
        self.error: BaseException | None = None
        self.ended = False

    async def consume(self) -> None:
        try:
            while await self.stream.receive() is not None:
                self.items += 1
        except Exception as exc:
            self.error = exc
        self.ended = True

    async def assert_flowing(self, at_least: int = 5) -> None:
        """More items arrive (and the stream is still open)."""
        start = self.items
        with trio.fail_after(30):  # a hang guard only
            while self.items < start + at_least:
                assert not self.ended, f"the healthy stream ended: {self.error!r}"
                await trio.sleep(0.01)


async def open_healthy(pool: ConnectionPool, address: str, nursery: trio.Nursery) -> HealthyStream:
    connection = await pool.connect(address)
    stream = connection.open_stream(
        endpoint="e", instance_id=1, request_id="healthy", payload={"healthy": True}
    )
    healthy = HealthyStream(stream)
    nursery.start_soon(healthy.consume)
    await healthy.assert_flowing()
    return healthy


# ----------------------------------------------------------------- sans-IO shadows

SHADOW_NONCE = b"s" * 32


def shadow(role: Any, state: Any, *, stream: bool = True, token: str | None = None) -> Any:
    """A sans-IO end in ``state`` (with stream 1 open once established), to predict
    what the real end must do with the next bytes.  Nothing is left to send.
    ``token``: (client) the token it holds, and so the server proof it demands."""
    from dynamo_trio.request_plane._frames import (
        PROTOCOL_VERSION,
        Auth,
        Challenge,
        Close,
        GoAway,
        Hello,
        Request,
        Welcome,
    )
    from dynamo_trio.request_plane._protocol import (
        ConnectionState,
        ProtocolConnection,
        Role,
        server_proof,
    )

    s = ConnectionState
    first = Request(1, "e", 1, "r", None, 2)
    if role is Role.SERVER:
        conn = ProtocolConnection(Role.SERVER, max_frame_size=LIMIT, nonce=SHADOW_NONCE)
        if state in (s.AWAIT_AUTH, s.AUTHENTICATING, s.OPEN, s.DRAINING):
            conn.receive_data(wire(Hello(PROTOCOL_VERSION, SHADOW_NONCE)))
        if state in (s.AUTHENTICATING, s.OPEN, s.DRAINING):
            conn.receive_data(wire(Auth()))
        if state in (s.OPEN, s.DRAINING):
            conn.authenticate()
            if stream:
                conn.receive_data(wire(first))
        if state is s.DRAINING:
            conn.send(GoAway())
    else:
        conn = ProtocolConnection(
            Role.CLIENT, max_frame_size=LIMIT, nonce=SHADOW_NONCE, token=token
        )
        conn.start()
        if state in (s.AWAIT_WELCOME, s.OPEN, s.DRAINING):
            conn.receive_data(wire(Challenge(PROTOCOL_VERSION, SHADOW_NONCE)))
        if state in (s.OPEN, s.DRAINING):
            proof = None if token is None else server_proof(token, SHADOW_NONCE, SHADOW_NONCE)
            conn.receive_data(wire(Welcome(PROTOCOL_VERSION, "", 0, 0, proof)))
            if stream:
                conn.send(first)
        if state is s.DRAINING:
            conn.receive_data(wire(GoAway()))
    if state is s.CLOSED:
        conn.receive_data(wire(Close("bye")))
    conn.data_to_send()
    assert conn.state is state, (conn.state, state)
    return conn


async def wait_until(predicate: Callable[[], object], seconds: float = 30.0) -> None:
    """Poll ``predicate`` every 10 ms until it holds; fail after ``seconds`` (by default
    a hang guard only)."""
    with trio.fail_after(seconds):
        while True:
            if predicate():
                return
            await trio.sleep(0.01)


async def drain(stream: ClientStream) -> None:
    """Receive until the stream ends (raising whatever error ends it)."""
    while await stream.receive() is not None:
        pass
