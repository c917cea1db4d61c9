"""ConnectionGone (:mod:`dynamo_trio.edge._server`): the app hears its client leave from
the task that read the EOF or the reset, before ``http.disconnect`` reaches it."""

from __future__ import annotations

import logging
import socket
import struct
from typing import TYPE_CHECKING, Any

import trio

from dynamo_trio.edge import CONNECTION_GONE, ConnectionGone, connection_gone

from .._memhttp import MemoryHTTP
from ._serving import answer_lifespan, served_bare

if TYPE_CHECKING:
    import pytest

REQUEST = b"POST /stream HTTP/1.1\r\nHost: edge.test\r\nContent-Length: 2\r\n\r\n{}"


class StreamingApp:
    """Starts a streamed response, then waits for ``http.disconnect``; records the
    order in which it hears of the hang-up."""

    def __init__(self) -> None:
        self.heard: list[str] = []
        self.started = trio.Event()
        self.done = trio.Event()
        self.found: ConnectionGone | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        self.found = connection_gone(scope)
        assert self.found is not None
        self.found.add(lambda: self.heard.append("gone"))
        await receive()  # the request's body
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"first", "more_body": True})
        self.started.set()
        while (await receive())["type"] != "http.disconnect":
            pass
        self.heard.append("http.disconnect")
        self.done.set()


async def test_the_reading_task_tells_the_app_before_http_disconnect_arrives() -> None:
    app = StreamingApp()
    async with trio.open_nursery() as nursery:
        network = MemoryHTTP(nursery, app)
        client = await network.connect()
        await client.send_all(REQUEST)
        await app.started.wait()
        await client.send_stream.aclose()  # the client's EOF
        with trio.fail_after(10):  # a hang guard only
            await app.done.wait()
        nursery.cancel_scope.cancel()
    assert app.heard == ["gone", "http.disconnect"]
    assert app.found is not None and app.found.gone


async def test_a_reset_tells_the_app_too() -> None:
    app = StreamingApp()
    async with trio.open_nursery() as nursery:
        url = await served_bare(nursery, app)
        host, port = url.removeprefix("http://").rsplit(":", 1)
        client = trio.socket.socket()
        await client.connect((host, int(port)))
        await client.send(REQUEST)
        await app.started.wait()
        # SO_LINGER 0: close sends a reset, not a FIN.
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()
        with trio.fail_after(10):  # a hang guard only
            await app.done.wait()
        nursery.cancel_scope.cancel()
    assert app.heard == ["gone", "http.disconnect"]


async def test_a_request_that_ends_first_is_not_told() -> None:
    heard: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        gone = connection_gone(scope)
        assert gone is not None

        def tell() -> None:
            heard.append("gone")

        gone.add(tell)
        await receive()
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        gone.discard(tell)

    async with trio.open_nursery() as nursery:
        network = MemoryHTTP(nursery, app)
        client = await network.connect()
        await client.send_all(REQUEST)
        with trio.fail_after(10):  # a hang guard only
            assert (await client.receive_some()).startswith(b"HTTP/1.1 204")
        await client.send_stream.aclose()
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert heard == []


def test_callbacks_run_once_in_order_and_one_failing_stops_none(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gone = ConnectionGone()
    ran: list[int] = []

    def fails() -> None:
        ran.append(2)
        raise RuntimeError("a broken callback")

    gone.add(lambda: ran.append(1))
    gone.add(fails)
    gone.add(lambda: ran.append(3))
    with caplog.at_level(logging.ERROR, logger="dynamo_trio.http"):
        gone.fire()
        gone.fire()  # idempotent
    assert ran == [1, 2, 3]
    assert "a hang-up callback" in caplog.text
    gone.add(lambda: ran.append(4))  # added after the hang-up: runs at once
    assert ran == [1, 2, 3, 4]


def test_no_connection_gone_off_the_edges_server() -> None:
    assert connection_gone({"type": "http"}) is None
    assert connection_gone({"type": "http", "state": {CONNECTION_GONE: "not one"}}) is None
