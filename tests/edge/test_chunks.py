"""ChunkWriter: a streamed HTTP/1.1 body written straight to the connection.

Unit rules of when it is offered and usable, a property test of its framing
(h11, as a client, must read back exactly the bytes written), and real HTTP
through :func:`serve_http`: mixed with ASGI body messages, keep-alive reuse,
a client that reads nothing for a while (partial writes), and a client that
hangs up mid-stream (the app hears ``http.disconnect``; the server serves on).
"""

from __future__ import annotations

import socket
from typing import Any

import h11
import httpx
import pytest
import trio
from hypothesis import given, settings, strategies as st

from dynamo_trio.edge import CHUNK_WRITER, ChunkWriter
from dynamo_trio.edge._chunks import CONNECTION_WRITER

from ._serving import answer_lifespan, served


class Wire:
    """A connection writer that records what it is given."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    async def __call__(self, data: bytes) -> None:
        await trio.lowlevel.checkpoint()
        self.writes.append(data)


def http_scope(version: str = "1.1", method: str = "GET", wire: Wire | None = None) -> Any:
    state = {} if wire is None else {CONNECTION_WRITER: wire}
    return {"type": "http", "http_version": version, "method": method, "state": state}


async def _ignore(message: Any) -> None:
    await trio.lowlevel.checkpoint()


def start(status: int = 200, *headers: tuple[bytes, bytes]) -> Any:
    return {"type": "http.response.start", "status": status, "headers": list(headers)}


async def test_offered_only_for_http11_on_a_served_connection() -> None:
    for scope in (http_scope("1.0", wire=Wire()), http_scope("2", wire=Wire()), http_scope()):
        assert ChunkWriter.offer(scope, _ignore) is _ignore
        assert ChunkWriter.of(scope) is None
    scope = http_scope(wire=Wire())
    assert ChunkWriter.offer(scope, _ignore) is not _ignore
    assert isinstance(scope["extensions"][CHUNK_WRITER], ChunkWriter)
    assert ChunkWriter.of(scope) is scope["extensions"][CHUNK_WRITER]


@pytest.mark.parametrize(
    ("method", "message", "usable"),
    [
        ("GET", start(), True),
        ("POST", start(200, (b"content-type", b"text/event-stream")), True),
        ("GET", start(200, (b"Content-Length", b"5")), False),
        ("GET", start(200, (b"transfer-encoding", b"chunked")), False),
        ("HEAD", start(), False),
        ("GET", start(204), False),
        ("GET", start(304), False),
    ],
)
async def test_usable_only_while_h11_frames_the_body_as_chunked(
    method: str, message: Any, usable: bool
) -> None:
    wire = Wire()
    scope = http_scope(method=method, wire=wire)
    sent: list[dict[str, Any]] = []

    async def send(event: Any) -> None:
        await trio.lowlevel.checkpoint()
        sent.append(event)

    watched = ChunkWriter.offer(scope, send)
    writer = ChunkWriter.of(scope)
    assert writer is not None and not writer.usable
    await watched(message)
    assert writer.usable is usable
    await watched({"type": "http.response.body", "body": b"x", "more_body": True})
    assert writer.usable is usable
    await watched({"type": "http.response.body", "body": b"", "more_body": False})
    assert not writer.usable
    assert len(sent) == 3  # every message still goes to hypercorn
    with pytest.raises(RuntimeError):
        await writer.write(b"late")
    assert wire.writes == []


async def test_frames_each_piece_as_one_chunk_and_skips_empty_ones() -> None:
    wire = Wire()
    scope = http_scope(wire=wire)
    watched = ChunkWriter.offer(scope, _ignore)
    writer = ChunkWriter.of(scope)
    assert writer is not None
    await watched(start())
    await writer.write(b"hello")
    await writer.write(b"")
    await writer.write(b"x" * 300)
    assert wire.writes == [b"5\r\nhello\r\n", b"12c\r\n" + b"x" * 300 + b"\r\n"]


def _read_back(frames: list[bytes]) -> bytes:
    """What an HTTP/1.1 client (h11) reads from a chunked response made of ``frames``."""
    client = h11.Connection(h11.CLIENT)
    client.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
    client.send(h11.EndOfMessage())
    client.receive_data(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
    client.receive_data(b"".join(frames) + b"0\r\n\r\n")
    body = b""
    while True:
        event = client.next_event()
        if isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            return body
        elif event is h11.NEED_DATA:
            raise AssertionError("the response did not end")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=5000), max_size=30))
def test_h11_reads_back_exactly_the_bytes_written(pieces: list[bytes]) -> None:
    async def main() -> list[bytes]:
        wire = Wire()
        scope = http_scope(wire=wire)
        watched = ChunkWriter.offer(scope, _ignore)
        writer = ChunkWriter.of(scope)
        assert writer is not None
        await watched(start())
        for piece in pieces:
            await writer.write(piece)
        return wire.writes

    assert _read_back(trio.run(main)) == b"".join(pieces)


# ---------------------------------------------------------------------------- real HTTP


class StreamingApp:
    """Streams ``pieces`` (through the writer when offered, as ASGI messages for every
    ``via_asgi``-th piece), then ends the response; records what it heard."""

    def __init__(self, pieces: list[bytes], *, via_asgi: int = 0, forever: bool = False) -> None:
        self.pieces = pieces
        self.via_asgi = via_asgi
        self.forever = forever
        self.offered: list[bool] = []
        self.disconnected = trio.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        assert scope["type"] == "http"
        while (await receive()).get("more_body", False):
            pass
        writer = ChunkWriter.of(scope)
        self.offered.append(writer is not None)
        await send(start(200, (b"content-type", b"application/octet-stream")))
        async with trio.open_nursery() as nursery:

            async def listen() -> None:
                if (await receive())["type"] == "http.disconnect":
                    self.disconnected.set()
                    nursery.cancel_scope.cancel()

            nursery.start_soon(listen)
            n = 0
            while True:
                for piece in self.pieces:
                    n += 1
                    if writer is None or (self.via_asgi and n % self.via_asgi == 0):
                        await send({"type": "http.response.body", "body": piece, "more_body": True})
                    else:
                        await writer.write(piece)
                if not self.forever:
                    break
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            nursery.cancel_scope.cancel()


async def test_a_streamed_body_mixed_with_asgi_messages_and_keep_alive(
    nursery: trio.Nursery,
) -> None:
    pieces = [f"piece {n} ".encode() * (n % 7 + 1) for n in range(200)]
    app = StreamingApp(pieces, via_asgi=3)
    url = await served(nursery, app)
    async with httpx.AsyncClient(base_url=url) as client:
        for _ in range(3):  # one keep-alive connection: each body ended where it should
            response = await client.get("/stream")
            assert response.status_code == 200
            assert response.headers["transfer-encoding"] == "chunked"
            assert response.content == b"".join(pieces)
    assert app.offered == [True, True, True]


async def test_http10_clients_get_the_body_through_hypercorn(nursery: trio.Nursery) -> None:
    app = StreamingApp([b"one ", b"two ", b"three"])
    url = await served(nursery, app)
    host, port = url.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(b"GET / HTTP/1.0\r\n\r\n")
        received = b""
        while data := await stream.receive_some(65536):
            received += data
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert body == b"one two three"  # close-delimited, unframed
    assert app.offered == [False]


async def read_late(url: str, *, after: float) -> bytes:
    """GET ``url`` on a socket with a tiny receive buffer, start reading ``after``
    seconds later, and return the body as an HTTP/1.1 client (h11) reads it."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    sock = trio.socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    await sock.connect((host, int(port)))
    stream = trio.SocketStream(sock)
    async with stream:
        await stream.send_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        await trio.sleep(after)
        client = h11.Connection(h11.CLIENT)
        client.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
        client.send(h11.EndOfMessage())
        body = bytearray()
        with trio.fail_after(30):
            while True:
                event = client.next_event()
                if event is h11.NEED_DATA:
                    client.receive_data(await stream.receive_some(65536))
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    return bytes(body)


async def test_a_client_that_reads_nothing_for_a_while_gets_every_byte_in_order(
    nursery: trio.Nursery,
) -> None:
    # 8 MB in 64 KB pieces fill the socket buffers: most writes are partial and
    # finish on the slow path, while other pieces queue behind them.
    pieces = [bytes([n % 251]) * 65536 for n in range(128)]
    app = StreamingApp(pieces)
    url = await served(nursery, app)
    body = await read_late(url, after=0.5)  # the server's writes pile up meanwhile
    assert body == b"".join(pieces)


async def test_a_hang_up_mid_stream_reaches_the_app_and_the_server_serves_on(
    nursery: trio.Nursery,
) -> None:
    app = StreamingApp([b"data: token\n\n"] * 50, forever=True)
    url = await served(nursery, app)
    host, port = url.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    received = await _read_some_tokens(stream, 100)
    await stream.aclose()
    with trio.fail_after(10):
        await app.disconnected.wait()
    assert received.startswith(b"HTTP/1.1 200")

    # A new connection is served as before (the writes of the first ended cleanly).
    app.disconnected = trio.Event()
    stream = await trio.open_tcp_stream(host, int(port))
    received = await _read_some_tokens(stream, 10)
    assert received.count(b"data: token\n\n") >= 10
    await stream.aclose()
    with trio.fail_after(10):
        await app.disconnected.wait()


async def _read_some_tokens(stream: trio.SocketStream, count: int) -> bytes:
    await stream.send_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    received = b""
    with trio.fail_after(10):
        while received.count(b"token") < count:
            received += await stream.receive_some(65536)
    return received


async def test_two_tasks_writing_at_once_never_split_a_chunk(nursery: trio.Nursery) -> None:
    # Like the SSE body and its keep-alive task: both write while the client reads
    # nothing, so writes go partial and queue; every piece must arrive whole, and
    # each task's pieces in its order.
    size = 50_000
    done = trio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await StreamingApp([])(scope, receive, send)
            return
        await send(start())
        writer = ChunkWriter.of(scope)
        assert writer is not None

        async def write(tag: int) -> None:
            for n in range(40):
                await writer.write(bytes([tag]) * (size - 4) + n.to_bytes(4, "big"))

        async with trio.open_nursery() as writers:
            writers.start_soon(write, 1)
            writers.start_soon(write, 2)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        done.set()

    url = await served(nursery, app)
    body = await read_late(url, after=0.3)
    await done.wait()
    assert len(body) == 80 * size
    seen: dict[int, list[int]] = {1: [], 2: []}
    for at in range(0, len(body), size):
        piece = bytes(body[at : at + size])
        tag = piece[0]
        assert piece[: size - 4] == bytes([tag]) * (size - 4), f"a piece split at {at}"
        seen[tag].append(int.from_bytes(piece[-4:], "big"))
    assert seen == {1: list(range(40)), 2: list(range(40))}
