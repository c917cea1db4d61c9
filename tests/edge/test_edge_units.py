"""The edge's small parts, without a server: the Edge as an ASGI app, ordered sends on a socket.

The same behaviour is tested end to end in ``test_hostile_http.py``; here each
rule is pinned at its boundary, fast.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
import trio
import trio.testing

from dynamo_trio.discovery import ModelCard, decode_model_card, encode_record
from dynamo_trio.edge import Edge, ErrorBody, error_json
from dynamo_trio.edge._server import _OrderedSends
from dynamo_trio.frontend._apis import edge_error_body

if TYPE_CHECKING:
    from collections.abc import Callable

LIMIT = 100


class Recorder:
    """An ASGI app that records that it was called."""

    def __init__(self) -> None:
        self.scopes: list[dict[str, Any]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.scopes.append(scope)


async def call(
    scope: dict[str, Any], error_body: ErrorBody = edge_error_body
) -> tuple[Recorder, list[dict[str, Any]]]:
    """Call an edge in front of a recording app (the frontend's error shapes by default)."""
    app = Recorder()
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        raise AssertionError("the edge never reads a refused request")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    edge = Edge([], app, max_header_size=LIMIT, error_body=error_body)
    await edge(scope, receive, send)  # type: ignore[arg-type]
    return app, sent


def http_scope(path: str = "/v1/models", query: bytes = b"", headers: Any = ()) -> dict[str, Any]:
    return {
        "type": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query,
        "headers": list(headers),
        "http_version": "1.1",
        "method": "GET",
    }


async def test_requests_within_the_limits_pass_through() -> None:
    scope = http_scope(
        "/" + "a" * 49, b"q" * 50, [(b"x" * 50, b"y" * 50)]
    )  # exactly at both limits
    app, sent = await call(scope)
    assert app.scopes == [scope]
    assert sent == []
    lifespan = {"type": "lifespan"}
    app, sent = await call(lifespan)
    assert app.scopes == [lifespan]


@pytest.mark.parametrize(
    ("scope", "status"),
    [
        (http_scope("/" + "a" * 50, b"q" * 50), 414),
        (http_scope(headers=[(b"x" * 50, b"y" * 51)]), 431),
        (http_scope(headers=[(b"a", b"b")] * 51), 431),
        (http_scope("/v1/messages", headers=[(b"x", b"y" * 200)]), 431),
    ],
)
async def test_oversized_heads_are_refused_before_the_app(
    scope: dict[str, Any], status: int
) -> None:
    app, sent = await call(scope)
    assert app.scopes == []
    start, body = sent
    assert start["type"] == "http.response.start"
    assert start["status"] == status
    headers = dict(start["headers"])
    assert headers[b"connection"] == b"close"
    assert headers[b"content-type"] == b"application/json"
    assert int(headers[b"content-length"]) == len(body["body"])
    assert body == {"type": "http.response.body", "body": body["body"], "more_body": False}
    payload = json.loads(body["body"])
    if scope["path"] == "/v1/messages":
        assert payload["type"] == "error"
        assert f"the limit is {LIMIT} bytes" in payload["error"]["message"]
    else:
        assert f"the limit is {LIMIT} bytes" in payload["error"]["message"]


async def test_the_edge_alone_answers_a_plain_json_error() -> None:
    """The edge knows no API: a status server's refusals are ``{"error": {"message",
    "code"}}``, whatever the path."""
    for path in ("/v1/messages", "/metrics"):
        _, sent = await call(http_scope(path, headers=[(b"x", b"y" * 200)]), error_json)
        payload = json.loads(sent[1]["body"])
        assert payload == {"error": {"message": payload["error"]["message"], "code": 431}}
        assert f"the limit is {LIMIT} bytes" in payload["error"]["message"]


async def test_a_websocket_is_refused_with_a_json_response() -> None:
    scope = {"type": "websocket", "path": "/v1/chat/completions", "extensions": {
        "websocket.http.response": {}}}  # fmt: skip
    app, sent = await call(scope)
    assert app.scopes == []
    start, body = sent
    assert (start["type"], start["status"]) == ("websocket.http.response.start", 404)
    assert body["type"] == "websocket.http.response.body"
    assert json.loads(body["body"])["error"]["code"] == "websocket_not_supported"


async def test_a_websocket_without_the_response_extension_is_closed() -> None:
    app, sent = await call({"type": "websocket", "path": "/x", "extensions": {}})
    assert app.scopes == []
    assert sent == [{"type": "websocket.close", "code": 1008, "reason": ""}]


# ---------------------------------------------------------------------------- ordered sends


async def test_send_eof_during_a_blocked_send_all_is_refused_at_once() -> None:
    left, right = trio.socket.socketpair()
    stream = _OrderedSends(trio.SocketStream(left), left)
    peer = trio.SocketStream(right)
    blocked = trio.Event()

    async def fill() -> None:
        blocked.set()
        with pytest.raises(trio.ClosedResourceError):
            await stream.send_all(b"x" * 10_000_000)  # the peer reads nothing

    async with trio.open_nursery() as nursery:
        nursery.start_soon(fill)
        await blocked.wait()
        await trio.sleep(0.1)
        with trio.fail_after(1), pytest.raises(trio.BusyResourceError):
            await stream.send_eof()  # must not wait behind the blocked send
        await stream.aclose()  # what hypercorn does next: it unblocks the send
    await peer.aclose()


async def test_send_all_waits_for_a_send_eof_then_fails_cleanly() -> None:
    left, right = trio.socket.socketpair()
    stream = _OrderedSends(trio.SocketStream(left), left)
    peer = trio.SocketStream(right)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stream.send_eof)
        while not stream._sending.locked():  # the EOF is under way (inside trio's send_eof)
            await trio.lowlevel.checkpoint()
        # Without the ordering, trio's conflict detector raises BusyResourceError here.
        with pytest.raises(trio.ClosedResourceError, match="after sending EOF"):
            await stream.send_all(b"late")
    assert await peer.receive_some() == b""
    await stream.aclose()
    await peer.aclose()


async def test_send_all_with_room_in_the_socket_writes_without_a_scheduler_pass() -> None:
    left, right = trio.socket.socketpair()
    stream = _OrderedSends(trio.SocketStream(left), left)
    peer = trio.SocketStream(right)
    others_ran = False

    def other() -> None:
        nonlocal others_ran
        others_ran = True

    async with trio.open_nursery() as nursery:
        nursery.start_soon(_run_sync, other)
        await stream.send_all(b"HTTP/1.1 200 OK\r\n\r\n")
        assert not others_ran  # no trip through the scheduler on the way
        assert await peer.receive_some() == b"HTTP/1.1 200 OK\r\n\r\n"
    assert others_ran
    with trio.CancelScope() as scope:
        scope.cancel()
        with pytest.raises(trio.Cancelled):
            await stream.send_all(b"never")  # a cancellation lands before any byte
    await stream.aclose()
    with trio.fail_after(1):
        assert await peer.receive_some() == b""  # "never" was not written
    await peer.aclose()


async def _run_sync(fn: Callable[[], None]) -> None:
    fn()


async def test_send_all_sends_what_the_socket_does_not_take_in_order_behind_others() -> None:
    left, right = trio.socket.socketpair()
    left.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_SNDBUF, 4096)
    stream = _OrderedSends(trio.SocketStream(left), left)
    peer = trio.SocketStream(right)
    big = bytes(range(256)) * 4096  # 1 MiB: most of it waits for the reader
    received = bytearray()

    async def read() -> None:
        while chunk := await peer.receive_some():
            received.extend(chunk)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(stream.send_all, big)
        await trio.testing.wait_all_tasks_blocked()
        assert stream._sending.locked()  # the rest of it waits for room
        nursery.start_soon(stream.send_all, b"after")  # must queue behind, not write now
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(read)
        await trio.testing.wait_all_tasks_blocked()
        await stream.send_eof()
    assert bytes(received) == big + b"after"
    await stream.aclose()
    await peer.aclose()


# ---------------------------------------------------------------------------- model cards


def test_model_cards_carry_limits_and_old_cards_still_decode() -> None:
    card = ModelCard(
        name="org/m",
        model_type="chat",
        namespace="ns",
        component="c",
        endpoint="generate",
        instance_id=7,
        context_length=8192,
        max_output_tokens=4096,
    )
    assert decode_model_card(encode_record(card)) == card
    old = json.dumps(
        {"name": "m", "model_type": "chat", "namespace": "ns", "component": "c",
         "endpoint": "generate", "instance_id": 7}
    ).encode()  # fmt: skip
    decoded = decode_model_card(old)
    assert (decoded.context_length, decoded.max_output_tokens) == (None, None)
    with pytest.raises(ValueError, match="max_output_tokens must be positive"):
        ModelCard(
            name="m", model_type="chat", namespace="ns", component="c", endpoint="e",
            instance_id=1, max_output_tokens=0,
        )  # fmt: skip
