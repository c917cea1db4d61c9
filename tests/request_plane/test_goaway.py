"""A connection that said or heard ``goaway`` closes once its last stream ends.

A worker that sends ``goaway`` and stays alive must not leave one connection
behind per reconnect: the caller retires its end when the last stream on it
ends, and so does the worker, whichever of them notices first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

from dynamo_trio import CancelReason
from dynamo_trio.request_plane import ConnectionPool, RequestPlaneServer

from ._harness import CONFIG, MemoryNetwork, drain, fd_count, wait_until

if TYPE_CHECKING:
    from collections.abc import Callable


class _Gated:
    """A handler that sends one item, then completes once ``release`` is set."""

    def __init__(self) -> None:
        self.release = trio.Event()

    async def __call__(self, stream) -> None:
        await stream.send_item({"i": 0})
        await self.release.wait()
        stream.end("complete")


def _say_goaway(server: RequestPlaneServer) -> None:
    """Every session says ``goaway``, but the server goes on taking connections."""
    for session in tuple(server._sessions):
        session.go_away()


async def _open(pool: ConnectionPool, address: str):
    connection = await pool.connect(address)
    return connection, connection.open_stream(
        endpoint="e", instance_id=1, request_id="r", payload=None
    )


async def test_both_ends_close_once_the_last_stream_after_goaway_ends(autojump_clock):
    async with trio.open_nursery() as nursery:
        handler = _Gated()
        server = RequestPlaneServer(CONFIG, handler)
        network = MemoryNetwork(nursery)
        network.route("worker:1", lambda s: server.handle_connection(s, "10.0.0.1:1"))
        pool = ConnectionPool(CONFIG, nursery, name="caller", open_transport=network.open)
        connection, first = await _open(pool, "worker:1")
        second = connection.open_stream(endpoint="e", instance_id=1, request_id="s", payload=None)
        await first.receive()
        await second.receive()
        _say_goaway(server)
        await wait_until(lambda: connection.drained)
        assert not connection.closed  # two streams still open on it
        assert server.sessions == 1
        handler.release.set()
        await drain(first)
        await drain(second)
        await wait_until(lambda: connection.closed and server.sessions == 0)
        assert pool.connections() == []
        nursery.cancel_scope.cancel()


async def test_goaway_on_an_idle_connection_closes_it_at_once(autojump_clock):
    async with trio.open_nursery() as nursery:
        server = RequestPlaneServer(CONFIG, _Gated())
        network = MemoryNetwork(nursery)
        network.route("worker:1", lambda s: server.handle_connection(s, "10.0.0.1:1"))
        pool = ConnectionPool(CONFIG, nursery, name="caller", open_transport=network.open)
        connection = await pool.connect("worker:1")
        _say_goaway(server)
        await wait_until(lambda: connection.closed and server.sessions == 0)
        nursery.cancel_scope.cancel()


async def test_a_killed_last_stream_still_sends_its_kill_before_the_close(autojump_clock):
    async with trio.open_nursery() as nursery:
        seen = []

        async def watching(stream):
            await stream.send_item({"i": 0})
            await stream.context.killed()
            seen.append(stream.cancel_signal)
            stream.end("killed", stream.context.reason)

        server = RequestPlaneServer(CONFIG, watching)
        network = MemoryNetwork(nursery)
        network.route("worker:1", lambda s: server.handle_connection(s, "10.0.0.1:1"))
        pool = ConnectionPool(CONFIG, nursery, name="caller", open_transport=network.open)
        connection, stream = await _open(pool, "worker:1")
        await stream.receive()
        _say_goaway(server)
        await wait_until(lambda: connection.drained)
        stream.kill(CancelReason.CLIENT_DISCONNECT)
        await wait_until(lambda: connection.closed and server.sessions == 0)
        assert seen == [CancelReason.CLIENT_DISCONNECT]
        nursery.cancel_scope.cancel()


async def test_reconnects_after_goaway_leave_no_socket_behind(nursery):
    """Real sockets: a worker that says ``goaway`` after every request and stays
    alive; each request reconnects, and the descriptors come back every time."""
    server: RequestPlaneServer

    async def one_then_goaway(stream) -> None:
        await stream.send_item({"i": 0})
        stream.end("complete")
        _say_goaway(server)

    server = RequestPlaneServer(CONFIG, one_then_goaway)
    host, port = await nursery.start(server.serve)
    pool = ConnectionPool(CONFIG, nursery, name="caller")
    address = f"{host}:{port}"
    connection, stream = await _open(pool, address)
    await drain(stream)
    await wait_until(lambda: server.sessions == 0)
    baseline = fd_count()
    for _ in range(20):
        connection, stream = await _open(pool, address)
        await drain(stream)
        await wait_until(_closed_with(connection, server))
    await wait_until(lambda: fd_count() <= baseline)
    assert fd_count() == baseline
    assert pool.connections() == []


def _closed_with(connection: Any, server: Any) -> Callable[[], bool]:
    """Whether ``connection`` is closed and ``server`` holds no session."""
    return lambda: connection.closed and server.sessions == 0
