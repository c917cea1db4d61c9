"""direct_chunks: a streamed HTTP/1.1 body's messages written straight to the connection.

Unit rules of when the short way is taken, a property test of its framing
(h11, as a client, must read back exactly the bytes written), and real HTTP
through :func:`serve_http`: keep-alive reuse, HTTP/1.0, a client that reads
nothing for a while (partial writes), a client that hangs up mid-stream (the
app hears ``http.disconnect``; the server serves on), and two tasks sending at
once.
"""

from __future__ import annotations

import socket
from typing import Any

import h11
import pytest
import trio
from hypothesis import given, settings, strategies as st

from dynamo_trio.edge import direct_chunks
from dynamo_trio.edge._chunks import CONNECTION_WRITER
from tests._fuzz import examples
from tests._memhttp import http_client

from ._serving import answer_lifespan, served


class Wire:
    """A connection writer that records what it is given."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    async def __call__(self, data: bytes) -> None:
        await trio.lowlevel.checkpoint()
        self.writes.append(data)


class Hypercorn:
    """The ``send`` below the edge: records the messages it is given."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def __call__(self, message: Any) -> None:
        await trio.lowlevel.checkpoint()
        self.sent.append(message)


def http_scope(version: str = "1.1", method: str = "GET", wire: Wire | None = None) -> Any:
    state = {} if wire is None else {CONNECTION_WRITER: wire}
    return {"type": "http", "http_version": version, "method": method, "state": state}


def start(status: int = 200, *headers: tuple[bytes, bytes]) -> Any:
    return {"type": "http.response.start", "status": status, "headers": list(headers)}


def body(data: bytes, *, more: bool = True) -> Any:
    return {"type": "http.response.body", "body": data, "more_body": more}


async def test_only_for_http11_on_a_served_connection() -> None:
    hypercorn = Hypercorn()
    for scope in (http_scope("1.0", wire=Wire()), http_scope("2", wire=Wire()), http_scope()):
        assert direct_chunks(scope, hypercorn) is hypercorn
    assert direct_chunks(http_scope(wire=Wire()), hypercorn) is not hypercorn


@pytest.mark.parametrize(
    ("method", "message", "direct"),
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
async def test_only_a_body_h11_frames_as_chunked_takes_the_short_way(
    method: str, message: Any, direct: bool
) -> None:
    wire, hypercorn = Wire(), Hypercorn()
    send = direct_chunks(http_scope(method=method, wire=wire), hypercorn)
    await send(body(b"early"))  # before the head: hypercorn's business
    await send(message)
    await send(body(b"x"))
    await send(body(b"", more=False))
    await send(body(b"late"))  # after the end: hypercorn's business
    assert wire.writes == ([b"1\r\nx\r\n"] if direct else [])
    assert [m.get("body") for m in hypercorn.sent] == (
        [b"early", None, b"", b"late"] if direct else [b"early", None, b"x", b"", b"late"]
    )


async def test_frames_each_piece_as_one_chunk_and_skips_empty_ones() -> None:
    wire = Wire()
    send = direct_chunks(http_scope(wire=wire), Hypercorn())
    await send(start())
    for piece in (b"hello", b"", b"x" * 300):
        await send(body(piece))
    assert wire.writes == [b"5\r\nhello\r\n", b"12c\r\n" + b"x" * 300 + b"\r\n"]


def _read_back(frames: list[bytes]) -> bytes:
    """What an HTTP/1.1 client (h11) reads from a chunked response made of ``frames``."""
    client = h11.Connection(h11.CLIENT)
    client.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
    client.send(h11.EndOfMessage())
    client.receive_data(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
    client.receive_data(b"".join(frames) + b"0\r\n\r\n")
    data = b""
    while True:
        event = client.next_event()
        if isinstance(event, h11.Data):
            data += event.data
        elif isinstance(event, h11.EndOfMessage):
            return data
        elif event is h11.NEED_DATA:
            raise AssertionError("the response did not end")


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.binary(max_size=5000), max_size=30))
def test_h11_reads_back_exactly_the_bytes_written(pieces: list[bytes]) -> None:
    async def main() -> list[bytes]:
        wire = Wire()
        send = direct_chunks(http_scope(wire=wire), Hypercorn())
        await send(start())
        for piece in pieces:
            await send(body(piece))
        return wire.writes

    assert _read_back(trio.run(main)) == b"".join(pieces)


# ---------------------------------------------------------------------------- real HTTP


class StreamingApp:
    """Streams ``pieces`` as ASGI body messages, then ends the response; records what
    it heard."""

    def __init__(self, pieces: list[bytes], *, forever: bool = False) -> None:
        self.pieces = pieces
        self.forever = forever
        self.disconnected = trio.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        assert scope["type"] == "http"
        while (await receive()).get("more_body", False):
            pass
        await send(start(200, (b"content-type", b"application/octet-stream")))
        async with trio.open_nursery() as nursery:

            async def listen() -> None:
                if (await receive())["type"] == "http.disconnect":
                    self.disconnected.set()
                    nursery.cancel_scope.cancel()

            nursery.start_soon(listen)
            while True:
                for piece in self.pieces:
                    await send(body(piece))
                if not self.forever:
                    break
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            nursery.cancel_scope.cancel()


async def test_streamed_bodies_on_one_keep_alive_connection(nursery: trio.Nursery) -> None:
    pieces = [f"piece {n} ".encode() * (n % 7 + 1) for n in range(200)]
    app = StreamingApp(pieces)
    url = await served(nursery, app)
    async with http_client(url) as client:
        for _ in range(3):  # one keep-alive connection: each body ended where it should
            response = await client.get("/stream")
            assert response.status_code == 200
            assert response.headers["transfer-encoding"] == "chunked"
            assert response.content == b"".join(pieces)


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
    head, _, content = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert content == b"one two three"  # close-delimited, unframed


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
        received = bytearray()
        with trio.fail_after(30):
            while True:
                event = client.next_event()
                if event is h11.NEED_DATA:
                    client.receive_data(await stream.receive_some(65536))
                elif isinstance(event, h11.Data):
                    received += event.data
                elif isinstance(event, h11.EndOfMessage):
                    return bytes(received)


async def test_a_client_that_reads_nothing_for_a_while_gets_every_byte_in_order(
    nursery: trio.Nursery,
) -> None:
    # 8 MB in 64 KB pieces fill the socket buffers: most writes are partial and
    # finish on the slow path, while other pieces queue behind them.
    pieces = [bytes([n % 251]) * 65536 for n in range(128)]
    app = StreamingApp(pieces)
    url = await served(nursery, app)
    received = await read_late(url, after=0.5)  # the server's writes pile up meanwhile
    assert received == b"".join(pieces)


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
    # Two tasks send body messages while the client reads nothing, so writes go
    # partial and queue; every piece must arrive whole, and each task's in its order.
    size = 50_000
    done = trio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await StreamingApp([])(scope, receive, send)
            return
        await send(start())

        async def write(tag: int) -> None:
            for n in range(40):
                await send(body(bytes([tag]) * (size - 4) + n.to_bytes(4, "big")))

        async with trio.open_nursery() as writers:
            writers.start_soon(write, 1)
            writers.start_soon(write, 2)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        done.set()

    url = await served(nursery, app)
    received = await read_late(url, after=0.3)
    await done.wait()
    assert len(received) == 80 * size
    seen: dict[int, list[int]] = {1: [], 2: []}
    for at in range(0, len(received), size):
        piece = bytes(received[at : at + size])
        tag = piece[0]
        assert piece[: size - 4] == bytes([tag]) * (size - 4), f"a piece split at {at}"
        seen[tag].append(int.from_bytes(piece[-4:], "big"))
    assert seen == {1: list(range(40)), 2: list(range(40))}
