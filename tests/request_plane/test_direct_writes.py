"""A frame sent to an idle connection goes straight to the socket, from the sender's task.

The rules (``_connection.py``'s module docstring): the writer task is woken
only for bursts (more than :data:`_DIRECT_BURST` frames in a quiet moment),
while more than one stream is open (many streams' frames are the writer's to
coalesce; a request, a stop or a kill still goes straight out, and a stop or a
kill then yields the CPU), for what the
socket did not take, and on TLS; the bytes on the wire are in the order the
frames were sent, whole, whatever the socket takes at a time; a socket that
fails under a direct write ends the connection, never the sender, and a
request whose direct write fails is a ``Disconnected`` at once.  Real TCP
sockets on 127.0.0.1 throughout.
"""

from __future__ import annotations

import math
import os
import random
import socket
import struct
from contextlib import asynccontextmanager, suppress
from typing import TYPE_CHECKING

import pytest
import trio
import trio.lowlevel
import trio.testing

from dynamo_trio import CancelReason, Disconnected, RequestPlaneConfig
from dynamo_trio.request_plane import ConnectionPool, RequestPlaneServer, _connection
from dynamo_trio.request_plane._connection import FrameConnection
from dynamo_trio.request_plane._frames import (
    NONCE_SIZE,
    PROTOCOL_VERSION,
    Auth,
    Credit,
    FrameDecoder,
    Hello,
    Item,
    Ping,
    Request,
    encode_frame,
)
from dynamo_trio.request_plane._protocol import ProtocolConnection, Role

from ._harness import streaming_handler

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from dynamo_trio.request_plane._client import ClientConnection

LIMIT = 1 << 20
CONFIG = RequestPlaneConfig(heartbeat_interval=30.0, heartbeat_timeout=60.0, max_frame_size=LIMIT)


def wire(*frames: object) -> bytes:
    out = bytearray()
    for frame in frames:
        encode_frame(frame, out, LIMIT)  # type: ignore[arg-type]
    return bytes(out)


def open_server() -> ProtocolConnection:
    """A worker's protocol past its handshake, serving stream 1 with a large credit
    window (the caller's frames given as raw bytes)."""
    server = ProtocolConnection(Role.SERVER, max_frame_size=LIMIT, peer_name="worker")
    server.receive_data(wire(Hello(PROTOCOL_VERSION, b"n" * NONCE_SIZE), Auth(None)))
    assert server.authenticate()
    server.receive_data(wire(Request(1, "generate", 1, "r1", None, 100_000)))
    server.data_to_send()
    assert server.open_streams == 1
    return server


@asynccontextmanager
async def connection_over_tcp(
    *, send_buffer: int | None = None, receive_buffer: int | None = None
) -> AsyncIterator[tuple[FrameConnection, socket.socket]]:
    """A running worker-side :class:`FrameConnection` on a real TCP socket, and the
    other end as a plain non-blocking socket (read synchronously by the tests)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    if receive_buffer is not None:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    listener.listen(1)
    stream = await trio.open_tcp_stream(*listener.getsockname()[:2])
    peer, _ = listener.accept()
    listener.close()
    peer.setblocking(False)
    if send_buffer is not None:
        stream.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
    connection = FrameConnection(
        stream, open_server(), CONFIG, on_frames=lambda frames: None, name="test"
    )
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(connection.run)
            await trio.testing.wait_all_tasks_blocked()
            yield connection, peer
            connection.close("test over")
    finally:
        peer.close()


def received(peer: socket.socket) -> list[object]:
    """The frames the peer's socket holds right now (none if it holds nothing)."""
    data = b""
    while True:
        try:
            chunk = peer.recv(1 << 20)
        except BlockingIOError:
            break
        if not chunk:
            break
        data += chunk
    return list(FrameDecoder(LIMIT).feed(data))


async def test_a_frame_sent_to_an_idle_connection_is_on_the_wire_before_any_checkpoint() -> None:
    async with connection_over_tcp() as (connection, peer):
        assert connection.send(Ping())
        # Nothing awaited: only a write from this task can have put it there.
        assert received(peer) == [Ping()]


async def test_a_burst_goes_to_the_writer_which_sends_it_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_connection, "_DIRECT_PERIOD", math.inf)  # no refill by the clock
    async with connection_over_tcp() as (connection, peer):
        items = [Item(1, {"n": n}) for n in range(10)]
        for item in items:
            assert connection.send(item)
        first = received(peer)
        assert len(first) == _connection._DIRECT_BURST
        await trio.testing.wait_all_tasks_blocked()  # the writer's turn
        rest = received(peer)
        assert items == first + rest
        # The writer has run: the next quiet moment's frame goes straight out again.
        assert connection.send(Ping())
        assert received(peer) == [Ping()]


async def test_while_several_streams_are_open_the_writer_sends() -> None:
    async with connection_over_tcp() as (connection, peer):
        connection.protocol.receive_data(wire(Request(2, "generate", 1, "r2", None, 4)))
        assert connection.send(Item(1, "a"))
        assert received(peer) == []
        await trio.testing.wait_all_tasks_blocked()
        assert received(peer) == [Item(1, "a")]


async def test_while_several_streams_are_open_the_writer_takes_what_their_next_turn_adds() -> None:
    # A 1-item reply: its item wakes the writer, its end comes a turn later (the
    # handler's scope is left in between).  Both go in one write, whichever of the
    # two tasks trio runs first in that turn (it varies the order: hence the rounds).
    async with connection_over_tcp() as (connection, peer):
        writes: list[bytes] = []
        send_all = connection._stream.send_all

        async def recording_send_all(data: bytes | bytearray | memoryview) -> None:
            writes.append(bytes(data))
            await send_all(data)

        connection._stream.send_all = recording_send_all  # type: ignore[method-assign]
        connection.protocol.receive_data(wire(Request(2, "generate", 1, "r2", None, 4)))
        rounds = 8
        for n in range(rounds):
            assert connection.send(Item(1, n))
            await trio.lowlevel.checkpoint()
            assert connection.send(Item(1, -n))
            await trio.testing.wait_all_tasks_blocked()
        assert [list(FrameDecoder(LIMIT).feed(data)) for data in writes] == [
            [Item(1, n), Item(1, -n)] for n in range(rounds)
        ]
        assert received(peer) == [Item(1, m) for n in range(rounds) for m in (n, -n)]


@pytest.mark.parametrize("seed", range(3))
async def test_what_a_full_socket_does_not_take_goes_first_and_whole(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_connection, "_DIRECT_BURST", 1_000_000)  # every frame tries
    rng = random.Random(seed)
    partial = 0
    async with connection_over_tcp(send_buffer=4096, receive_buffer=4096) as (connection, peer):
        protocol = connection.protocol
        unsend = protocol.unsend

        def counting_unsend(rest: bytes | bytearray | memoryview) -> None:
            nonlocal partial
            partial += 1
            unsend(rest)

        monkeypatch.setattr(protocol, "unsend", counting_unsend)
        sent = []
        decoder = FrameDecoder(LIMIT)
        got: list[object] = []
        for n in range(300):
            item = Item(1, "x" * rng.randrange(1, 30_000), id=str(n))
            assert connection.send(item)
            sent.append(item)
            if rng.random() < 0.3:
                await trio.lowlevel.checkpoint()  # sometimes the writer runs in between
            if rng.random() < 0.2:  # and the peer reads a little, sometimes
                with suppress(BlockingIOError):
                    got += decoder.feed(peer.recv(rng.randrange(1, 20_000)))
        with trio.fail_after(10):
            while len(got) < len(sent):
                try:
                    got += decoder.feed(peer.recv(65536))
                except BlockingIOError:
                    await trio.sleep(0.001)
        assert got == sent
        assert connection.close_reason is None
    assert partial > 0  # the test did exercise a partial direct write


async def test_a_reset_under_a_direct_write_ends_the_connection_not_the_sender() -> None:
    async with connection_over_tcp() as (connection, peer):
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        peer.close()  # a reset: the next writes fail
        with trio.fail_after(5):
            while connection.close_reason is None:
                connection.send(Ping())  # never raises
                await trio.sleep(0.01)
        assert connection.close_reason is not None
        assert connection.close_reason.startswith("connection lost")
        assert not connection.send(Ping())


async def test_nothing_is_written_once_the_connection_is_over() -> None:
    async with connection_over_tcp() as (connection, peer):
        connection.close("done")
        await trio.testing.wait_all_tasks_blocked()
        assert not connection.send(Ping())
        assert received(peer) == []


async def caller_of_a_worker(
    nursery: trio.Nursery,
) -> tuple[ConnectionPool, ClientConnection, FrameConnection]:
    """A caller's pool connected to a worker serving ``streaming_handler``: the pool, its
    connection and the connection's frame layer, its writer idle."""
    server = RequestPlaneServer(CONFIG, streaming_handler)
    host, port = await nursery.start(server.serve)
    pool = ConnectionPool(CONFIG, nursery, name="caller")
    connection = await pool.connect(f"{host}:{port}")
    frames = connection._connection
    assert frames is not None
    await trio.testing.wait_all_tasks_blocked()  # the writer is idle
    return pool, connection, frames


async def test_a_request_goes_straight_out_however_many_streams_are_open(
    nursery: trio.Nursery,
) -> None:
    # A request starts the worker's work (a stop or kill ends it): it is not held back
    # to share a write with other callers' frames, nor limited to a burst per quiet moment.
    _, connection, frames = await caller_of_a_worker(nursery)
    streams = []
    for n in range(2 * _connection._DIRECT_BURST + 2):
        streams.append(
            connection.open_stream(endpoint="e", instance_id=1, request_id=f"r{n}", payload=None)
        )
        assert frames.protocol.outbox_size == 0  # on the wire: nothing left for the writer
    assert frames.protocol.open_streams == len(streams)
    # So do a stop and a kill: the worker hears of them without waiting for the writer.
    streams[0].stop(CancelReason.STOP_REQUESTED)
    assert frames.protocol.outbox_size == 0
    streams[1].kill(CancelReason.KILL_REQUESTED)
    assert frames.protocol.outbox_size == 0
    with trio.fail_after(5):
        for stream in streams[2:]:
            assert await stream.receive() is not None
    # Other frames of a busy connection (a credit) still go to the writer, to be coalesced.
    await trio.testing.wait_all_tasks_blocked()
    assert frames.send(Credit(streams[2].sid, 1))
    assert frames.protocol.outbox_size > 0


async def test_a_request_whose_direct_write_fails_is_disconnected_never_orphaned(
    nursery: trio.Nursery,
) -> None:
    # A worker SIGKILLed a moment ago: the caller's next request is written from its
    # own task and the write fails, closing the connection inside open_stream. The
    # stream must learn of it (it once was registered only after the loss had been
    # announced, and waited for ever: a soak test's 30 s read timeout).
    server = RequestPlaneServer(CONFIG, streaming_handler)
    host, port = await nursery.start(server.serve)
    pool = ConnectionPool(CONFIG, nursery, name="caller")
    connection = await pool.connect(f"{host}:{port}")
    frames = connection._connection
    assert frames._socket is not None
    await trio.testing.wait_all_tasks_blocked()  # the writer is idle: writes go direct
    frames._socket.shutdown(socket.SHUT_WR)  # the next write fails (EPIPE); reads still work
    with pytest.raises(Disconnected, match="connection lost while writing"):
        connection.open_stream(endpoint="e", instance_id=1, request_id="r", payload=None)
    assert connection.closed
    assert connection.streams() == []
    # A new connection serves as usual.
    fresh = await pool.connect(f"{host}:{port}")
    assert fresh is not connection
    stream = fresh.open_stream(endpoint="e", instance_id=1, request_id="r2", payload=None)
    with trio.fail_after(5):
        assert await stream.receive() is not None
    pool.close_all()


async def test_a_connection_shut_down_before_it_runs_still_sends_what_was_queued() -> None:
    """A draining worker queues a goaway on a connection it has just accepted and shuts it
    down at once: the frames queued before ``run`` go out before the connection closes
    (a ``close`` before ``run`` sends nothing)."""
    for shut, expected in (("shutdown", [Item(1, "queued")]), ("close", [])):
        ours, theirs = trio.testing.memory_stream_pair()
        connection = FrameConnection(
            ours, open_server(), CONFIG, on_frames=lambda frames: None, name="test"
        )
        assert connection.send(Item(1, "queued"))
        getattr(connection, shut)("draining")
        received = bytearray()

        async def read(stream: trio.abc.ReceiveStream = theirs, into: bytearray = received) -> None:
            while data := await stream.receive_some():
                into += data

        with trio.fail_after(10):  # a hang guard only
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read)
                await connection.run()
                await theirs.send_stream.aclose()  # (the peer's EOF: lingering ends)
        assert FrameDecoder(LIMIT).feed(received) == expected, shut


class RecordedReads(trio.abc.Stream):
    """``stream``, noting how many bytes each read asked for."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.asked: list[int | None] = []

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        self.asked.append(max_bytes)
        return await self.stream.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.stream.aclose()


async def test_reads_grow_while_each_fills_then_shrink_back() -> None:
    """A large frame is read in fewer, larger reads; once a read finds less, the next
    is the usual size again."""
    ours, theirs = trio.testing.memory_stream_pair()
    recorded = RecordedReads(ours)
    connection = FrameConnection(
        recorded, open_server(), CONFIG, on_frames=lambda frames: None, name="test"
    )
    requests = [Request(sid, "generate", 1, f"r{sid}", "x" * 600_000, 8) for sid in (3, 5, 7)]
    blob = wire(*requests)  # about 1.8 MB, waiting before the first read
    await theirs.send_all(blob)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(connection.run)
        await trio.testing.wait_all_tasks_blocked()
        assert connection.protocol.open_streams == 4
        size, read = _connection._RECEIVE_SIZE, 0
        expected: list[int | None] = []
        while read < len(blob):
            expected.append(size)
            read += size
            size = min(size * 2, _connection._RECEIVE_MAX)
        expected.append(_connection._RECEIVE_SIZE)  # the last read found less: waiting now
        assert recorded.asked == expected
        connection.close("test over")


async def test_a_stop_or_kill_yields_the_cpu_once_its_frame_is_on_the_wire(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The write wakes the worker; the caller then gives up its CPU, so that a worker the
    # kernel queued behind it hears the cancellation before the caller's own teardown.
    pool, connection, frames = await caller_of_a_worker(nursery)
    events: list[str] = []
    send = frames.send

    def logged_send(frame: object, **kwargs: bool) -> bool:
        events.append(f"send {type(frame).__name__} {getattr(frame, 'action', '')}".strip())
        return send(frame, **kwargs)  # type: ignore[arg-type]

    def logged_yield() -> None:
        assert frames.protocol.outbox_size == 0  # written, not left for the writer
        events.append("yield")

    monkeypatch.setattr(frames, "send", logged_send)
    monkeypatch.setattr(os, "sched_yield", logged_yield)
    streams = [
        connection.open_stream(endpoint="e", instance_id=1, request_id=f"r{n}", payload=None)
        for n in range(2)
    ]
    streams[0].stop(CancelReason.STOP_REQUESTED)
    streams[1].kill(CancelReason.KILL_REQUESTED)
    streams[1].kill(CancelReason.KILL_REQUESTED)  # a second kill sends nothing
    assert events == [
        "send Request",
        "send Request",
        "send Control stop",
        "yield",
        "send Control kill",
        "yield",
    ]
    pool.close_all()
