"""Each connection's protocol, guarded: cleartext HTTP/2 is a choice, a client's
stream resets are bounded, and a Transfer-Encoding we do not take is a 400.

Off unless asked: a prior-knowledge preface is answered 505 and the connection
closed, and an ``Upgrade: h2c`` is ignored (the request is served in HTTP/1.1).
On: a connection whose client resets streams faster than the bound (the
"rapid reset" flood) gets GOAWAY with ENHANCE_YOUR_CALM and is
closed, and the requests of the batch that crossed the bound never start.  The
rest of a request answered before its body came is dropped, the connection
serving on.
"""

from __future__ import annotations

import h2.config
import h2.connection
import h2.errors
import h2.events
import trio
import trio.testing

from tests._memhttp import MemoryHTTP, hypercorn_config

from ._serving import served_bare

PRI = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


class Counting:
    """An ASGI app that counts the requests it starts and answers each at once."""

    def __init__(self) -> None:
        self.started = 0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        self.started += 1
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def open_url(url: str) -> trio.SocketStream:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return await trio.open_tcp_stream(host, int(port))


async def read_all(stream: trio.SocketStream, within: float = 5) -> bytes:
    data = b""
    with trio.fail_after(within):
        while chunk := await stream.receive_some(65536):
            data += chunk
    return data


def client() -> h2.connection.H2Connection:
    connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    connection.initiate_connection()
    return connection


def get(connection: h2.connection.H2Connection, stream_id: int) -> None:
    connection.send_headers(
        stream_id,
        [(":method", "GET"), (":path", "/"), (":scheme", "http"), (":authority", "x")],
        end_stream=True,
    )


async def test_cleartext_http2_prior_knowledge_is_refused_unless_asked(nursery) -> None:
    app = Counting()
    url = await served_bare(nursery, app)
    stream = await open_url(url)
    connection = client()
    get(connection, 1)
    await stream.send_all(connection.data_to_send())
    answer = await read_all(stream)
    assert answer.startswith(b"HTTP/1.1 505 "), answer[:200]
    assert app.started == 0
    await stream.aclose()


async def test_an_upgrade_to_h2c_is_ignored_unless_asked(nursery) -> None:
    app = Counting()
    url = await served_bare(nursery, app)
    stream = await open_url(url)
    await stream.send_all(
        b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\n"
        b"HTTP2-Settings: AAMAAABkAAQAAP__\r\nConnection: close\r\n\r\n"
    )
    answer = await read_all(stream)
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
    assert b"\r\nok\r\n" in answer
    assert app.started == 1
    await stream.aclose()


async def test_cleartext_http2_is_served_when_asked(nursery) -> None:
    app = Counting()
    url = await served_bare(nursery, app, cleartext_http2=True)
    stream = await open_url(url)
    connection = client()
    get(connection, 1)
    await stream.send_all(connection.data_to_send())
    ended = False
    with trio.fail_after(5):
        while not ended:
            events = connection.receive_data(await stream.receive_some(65536))
            ended = any(isinstance(event, h2.events.StreamEnded) for event in events)
    assert app.started == 1
    await stream.aclose()


async def test_a_rapid_reset_flood_gets_goaway_enhance_your_calm(nursery) -> None:
    app = Counting()
    url = await served_bare(nursery, app, cleartext_http2=True, http2_max_resets=50)
    stream = await open_url(url)
    connection = client()
    await stream.send_all(connection.data_to_send())
    sent = 0
    goaway = None
    with trio.fail_after(10):
        for stream_id in range(1, 2 * 1000, 2):
            get(connection, stream_id)
            connection.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
            sent += 1
            if stream_id % 40 == 1:  # a batch at a time, then see what came back
                try:
                    await stream.send_all(connection.data_to_send())
                except trio.BrokenResourceError:
                    break
                with trio.move_on_after(0.05):
                    data = await stream.receive_some(65536)
                    if not data:
                        break
                    for event in connection.receive_data(data):
                        if isinstance(event, h2.events.ConnectionTerminated):
                            goaway = event
                if goaway is not None:
                    break
    assert goaway is not None, (sent, app.started)
    assert goaway.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
    assert app.started <= 50 + 40, app.started  # the bound, and at most one batch more
    await stream.aclose()


async def test_a_transfer_encoding_we_do_not_take_is_a_400_not_a_501(nursery) -> None:
    app = Counting()
    url = await served_bare(nursery, app)
    for coding in (b"gzip", b"gzip, chunked", b"chunked, chunked"):
        stream = await open_url(url)
        await stream.send_all(
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: " + coding + b"\r\n\r\n"
        )
        answer = await read_all(stream)
        assert answer.startswith(b"HTTP/1.1 400 "), (coding, answer[:200])
        assert b"connection: close" in answer.lower()
        await stream.aclose()
    assert app.started == 0


async def test_the_rest_of_a_request_answered_early_is_dropped_and_the_connection_goes_on(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    # Counting answers without reading the body: the client's DATA for that stream
    # arrives after the stream is closed (hypercorn's lookup of it was a KeyError that
    # ended the connection, and every other stream on it).
    network = MemoryHTTP(nursery, Counting(), hypercorn_config(), cleartext_http2=True)
    stream = await network.connect()
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    head = [(":method", "POST"), (":path", "/early"), (":scheme", "http"), (":authority", "x")]
    client.send_headers(1, head)
    await stream.send_all(client.data_to_send())

    async def until_ended(stream_id: int) -> bytes:
        body = b""
        with trio.fail_after(10):
            while True:
                data = await stream.receive_some()
                assert data, "the connection was closed"
                for event in client.receive_data(data):
                    if isinstance(event, h2.events.DataReceived) and event.stream_id == stream_id:
                        body += event.data
                    if isinstance(event, h2.events.StreamEnded) and event.stream_id == stream_id:
                        await stream.send_all(client.data_to_send())
                        return body
                await stream.send_all(client.data_to_send())

    assert await until_ended(1) == b"ok"
    client.send_data(1, b"x" * 1000, end_stream=True)  # the rest of the answered request
    client.send_headers(3, [(":method", "GET"), *head[1:]], end_stream=True)
    await stream.send_all(client.data_to_send())
    assert await until_ended(3) == b"ok"  # the connection serves on
    assert network.connections == 1
