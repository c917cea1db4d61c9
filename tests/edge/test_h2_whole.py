"""A response sent whole on an HTTP/2 stream (:func:`dynamo_trio.edge._h2.send_whole_response`):
head, body and trailers in one write, the stream then closed and the connection still in
use; a response that cannot go that way is refused before any byte, for the ASGI path."""

from __future__ import annotations

from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest
import trio
from hyperframe.frame import DataFrame, Frame, HeadersFrame, WindowUpdateFrame

from dynamo_trio.edge import _server
from dynamo_trio.edge._h2 import send_whole_response

from ._serving import answer_lifespan, served_bare

HEADERS = [(b"content-type", b"application/grpc")]
TRAILERS = [(b"grpc-status", b"0")]


class Whole:
    """An ASGI app that answers each request with its body, sent whole when it can be
    (after a ``response.start`` of its own when the request's path is ``/started``);
    it notes what :func:`send_whole_response` said, in order."""

    def __init__(self) -> None:
        self.sent_whole: list[bool] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        http2 = scope["http_version"] == "2"
        start = {"type": "http.response.start", "status": 200, "headers": HEADERS}
        start["trailers"] = http2
        if scope["path"] == "/started":
            await send(start)
        headers = [*HEADERS, (b"te", b"gzip")] if scope["path"] == "/bad" else HEADERS
        whole = await send_whole_response(send, headers, body, TRAILERS)
        self.sent_whole.append(whole)
        if whole:
            return
        if scope["path"] != "/started":
            await send(start)
        await send({"type": "http.response.body", "body": body, "more_body": False})
        if http2:
            await send({"type": "http.response.trailers", "headers": TRAILERS})


class Reply:
    def __init__(self) -> None:
        self.headers: list[tuple[bytes, bytes]] = []
        self.data = b""
        self.trailers: list[tuple[bytes, bytes]] = []
        self.ended = False
        self.reset = False


async def calls(
    url: str,
    bodies: list[bytes],
    *,
    path: str = "/",
    trailers: bool = True,
    window: int | None = None,
) -> list[Reply]:
    """Send ``bodies`` as requests on one connection, all at once; their replies."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    if window is not None:
        connection.local_settings = h2.settings.Settings(
            client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window}
        )
    connection.initiate_connection()
    replies: dict[int, Reply] = {}
    for body in bodies:
        stream_id = connection.get_next_available_stream_id()
        headers = [(":method", "POST"), (":scheme", "http"), (":authority", "x"), (":path", path)]
        if trailers:
            headers.append(("te", "trailers"))
        connection.send_headers(stream_id, headers)
        size = connection.max_outbound_frame_size
        chunks = [body[start : start + size] for start in range(0, len(body), size)] or [b""]
        for index, chunk in enumerate(chunks):
            connection.send_data(stream_id, chunk, end_stream=index == len(chunks) - 1)
        replies[stream_id] = Reply()
    try:
        with trio.fail_after(10):
            await stream.send_all(connection.data_to_send())
            while not all(reply.ended for reply in replies.values()):
                data = await stream.receive_some(65536)
                assert data, "the server closed the connection"
                for event in connection.receive_data(data):
                    if isinstance(event, h2.events.ResponseReceived):
                        replies[event.stream_id].headers = event.headers
                    elif isinstance(event, h2.events.DataReceived):
                        replies[event.stream_id].data += event.data
                        connection.acknowledge_received_data(
                            event.flow_controlled_length, event.stream_id
                        )
                    elif isinstance(event, h2.events.TrailersReceived):
                        replies[event.stream_id].trailers = event.headers
                    elif isinstance(event, h2.events.StreamEnded):
                        replies[event.stream_id].ended = True
                    elif isinstance(event, h2.events.StreamReset):
                        replies[event.stream_id].ended = replies[event.stream_id].reset = True
                await stream.send_all(connection.data_to_send())
    finally:
        await stream.aclose()
    return list(replies.values())


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[list[Frame]]:
    """The HTTP/2 frames of each write the server makes, after the connection's preface."""
    seen: list[list[Frame]] = []
    send_all = _server._OrderedSends.send_all

    async def recording(self: Any, data: Any) -> None:
        frames, view = [], memoryview(bytes(data))
        while len(view) >= 9:
            frame, length = Frame.parse_frame_header(view[:9])
            frame.parse_body(view[9 : 9 + length])
            frames.append(frame)
            view = view[9 + length :]
        seen.append(frames)
        await send_all(self, data)

    monkeypatch.setattr(_server._OrderedSends, "send_all", recording)
    return seen


def response_frames(writes: list[list[Frame]], stream_id: int) -> list[list[str]]:
    """For each write carrying response frames of ``stream_id`` (not the server's
    acknowledgements of its request's DATA): their kinds, in order."""
    kinds = []
    for frames in writes:
        mine = [
            frame
            for frame in frames
            if frame.stream_id == stream_id and not isinstance(frame, WindowUpdateFrame)
        ]
        if mine:
            kinds.append(
                [
                    "end"
                    if "END_STREAM" in frame.flags and isinstance(frame, HeadersFrame)
                    else type(frame).__name__
                    for frame in mine
                ]
            )
    return kinds


async def test_a_response_goes_whole_in_one_write(
    nursery: trio.Nursery, writes: list[list[Frame]]
) -> None:
    app = Whole()
    url = await served_bare(nursery, app, cleartext_http2=True)
    [reply] = await calls(url, [b"message"])
    assert (reply.headers[0], reply.data, reply.trailers) == (
        (b":status", b"200"),
        b"message",
        TRAILERS,
    )
    assert (b"content-type", b"application/grpc") in reply.headers
    assert app.sent_whole == [True]
    assert response_frames(writes, 1) == [["HeadersFrame", DataFrame.__name__, "end"]]


async def test_a_body_larger_than_a_frame_goes_whole_in_frames(
    nursery: trio.Nursery, writes: list[list[Frame]]
) -> None:
    app = Whole()
    url = await served_bare(nursery, app, cleartext_http2=True)
    body = bytes(range(256)) * 160  # 40,960 bytes: three frames of at most 16 KiB
    [reply] = await calls(url, [body])
    assert (reply.data, reply.trailers, app.sent_whole) == (body, TRAILERS, [True])
    data = DataFrame.__name__
    assert response_frames(writes, 1) == [["HeadersFrame", data, data, data, "end"]]


async def test_the_connection_goes_on_serving_streams_sent_whole(nursery: trio.Nursery) -> None:
    app = Whole()
    url = await served_bare(nursery, app, cleartext_http2=True)
    bodies = [str(n).encode() * (n + 1) for n in range(20)]
    replies = await calls(url, bodies)
    assert [reply.data for reply in replies] == bodies
    assert all(reply.trailers == TRAILERS for reply in replies)
    assert app.sent_whole == [True] * 20
    assert [reply.data for reply in await calls(url, [b"again", b""])] == [b"again", b""]


async def test_headers_h2_refuses_reset_the_stream_and_the_connection_goes_on(
    nursery: trio.Nursery,
) -> None:
    app = Whole()
    url = await served_bare(nursery, app, cleartext_http2=True)
    [reply] = await calls(url, [b"message"], path="/bad")
    assert (reply.reset, reply.data) == (True, b"")
    assert [reply.data for reply in await calls(url, [b"next"])] == [b"next"]
    assert app.sent_whole == [True, True]


@pytest.mark.parametrize(
    ("path", "trailers", "window"),
    [
        ("/started", True, None),  # the app started the response itself
        ("/", False, None),  # the client takes no trailers: hypercorn's path drops them
        ("/", True, 4),  # more than the stream's flow control window
    ],
    ids=["started", "no-te-trailers", "over-the-window"],
)
async def test_what_cannot_go_whole_goes_the_asgi_way(
    nursery: trio.Nursery, path: str, trailers: bool, window: int | None
) -> None:
    app = Whole()
    url = await served_bare(nursery, app, cleartext_http2=True)
    [reply] = await calls(url, [b"message"], path=path, trailers=trailers, window=window)
    assert app.sent_whole == [False]
    assert reply.data == b"message"
    assert reply.trailers == (TRAILERS if trailers else [])


async def test_over_http1_it_is_refused(nursery: trio.Nursery) -> None:
    app = Whole()
    url = await served_bare(nursery, app)
    host, port = url.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    await stream.send_all(
        b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\nconnection: close\r\n\r\nhi"
    )
    data = b""
    with trio.fail_after(5):
        while chunk := await stream.receive_some(65536):
            data += chunk
    await stream.aclose()
    assert app.sent_whole == [False]
    assert data.startswith(b"HTTP/1.1 200") and b"\r\n\r\n2\r\nhi\r\n" in data
