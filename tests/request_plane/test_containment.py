"""Issue 12, item 7: the request plane's own net, at the trio edge.

Each stream's task and each connection's task contain every exception,
BaseException included, and end only that stream or that connection; a
``trio.Cancelled`` always propagates.  What escapes is logged once per kind at
a bounded rate (a token bucket), never once per hostile frame.  (The runtime's
``serve_stream`` has its own net for handlers; these tests hand the server raw
handlers, so they exercise this module's alone.)
"""

from __future__ import annotations

import logging

import pytest
import trio
import trio.lowlevel

from dynamo_trio import Disconnected, Unknown
from dynamo_trio._context import CancelReason
from dynamo_trio.request_plane import ConnectionPool, RequestPlaneServer
from dynamo_trio.request_plane._client import ClientConnection
from dynamo_trio.request_plane._server import _Session

from ._harness import CONFIG, HealthyStream, MemoryNetwork, streaming_handler, wait_until


class Boom(BaseException):
    """A BaseException that is neither Exception nor trio's."""


ESCAPES = {
    "exception": lambda: ValueError("bad"),
    "keyboard-interrupt": KeyboardInterrupt,
    "system-exit": lambda: SystemExit(3),
    "base-exception": lambda: Boom("boom"),
    "generator-exit": GeneratorExit,
    "exception-group": lambda: ExceptionGroup("many", [ValueError("a"), KeyError("b")]),
    "base-exception-group": lambda: BaseExceptionGroup("many", [KeyboardInterrupt(), Boom()]),
}


def handler_raising(escape):
    async def handler(stream):
        if stream.payload == "raise":
            await trio.sleep(0.01)
            raise escape()
        await streaming_handler(stream)

    return handler


async def world(nursery, handler):
    server = RequestPlaneServer(CONFIG, handler)
    network = MemoryNetwork(nursery)
    network.route("worker:1", lambda s: server.handle_connection(s, "10.0.0.1:1"))
    network.route("worker:2", lambda s: server.handle_connection(s, "10.0.0.2:1"))
    pool = ConnectionPool(CONFIG, nursery, name="caller", open_transport=network.open)
    return server, pool


def open_stream(connection, payload):
    return connection.open_stream(endpoint="e", instance_id=1, request_id="r", payload=payload)


async def flowing(nursery, connection):
    healthy = HealthyStream(open_stream(connection, "healthy"))
    nursery.start_soon(healthy.consume)
    await healthy.assert_flowing()
    return healthy


@pytest.mark.parametrize("escape", ESCAPES)
async def test_an_exception_escaping_a_handler_ends_that_stream_only(
    escape, autojump_clock, caplog
):
    caplog.set_level(logging.ERROR, logger="dynamo_trio")
    async with trio.open_nursery() as nursery:
        server, pool = await world(nursery, handler_raising(ESCAPES[escape]))
        connection = await pool.connect("worker:1")
        neighbour = await flowing(nursery, connection)  # same connection
        doomed = open_stream(connection, "raise")
        with pytest.raises(Unknown, match="the worker failed while serving the request"):
            await doomed.receive()
        await neighbour.assert_flowing()
        assert connection.usable and server.sessions == 1
        lines = [r for r in caplog.records if "escaped its handler" in r.getMessage()]
        assert len(lines) == 1
        pool.close_all()
        nursery.cancel_scope.cancel()


async def test_escapes_are_logged_at_a_bounded_rate(autojump_clock, caplog):
    caplog.set_level(logging.ERROR, logger="dynamo_trio")
    async with trio.open_nursery() as nursery:
        _, pool = await world(nursery, handler_raising(ESCAPES["exception"]))
        connection = await pool.connect("worker:1")
        for _ in range(50):
            with pytest.raises(Unknown):
                await open_stream(connection, "raise").receive()
        lines = [r for r in caplog.records if "escaped its handler" in r.getMessage()]
        assert 1 <= len(lines) <= 5
        pool.close_all()
        nursery.cancel_scope.cancel()


async def test_a_handler_that_returns_without_an_answer_gets_one(autojump_clock):
    async def silent(stream):
        await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        _, pool = await world(nursery, silent)
        connection = await pool.connect("worker:1")
        with pytest.raises(Unknown, match="without an answer"):
            await open_stream(connection, None).receive()
        pool.close_all()
        nursery.cancel_scope.cancel()


async def test_cancellation_propagates_through_the_net(autojump_clock, no_errors_logged):
    """Handlers that ignore their killed context are cancelled after a grace once
    their connection is gone: nothing is logged as an error, nothing is left
    running, and the cancellation is not swallowed."""
    cancelled = []

    async def blocked(stream):
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            cancelled.append(stream.sid)
            raise

    async with trio.open_nursery() as nursery:
        server, pool = await world(nursery, blocked)
        connection = await pool.connect("worker:1")
        streams = [open_stream(connection, None) for _ in range(3)]
        await wait_until(lambda: server.sessions == 1)
        await trio.sleep(0.1)
        server.close_all()
        await wait_until(lambda: len(cancelled) == 3 and server.sessions == 0, 5)
        for stream in streams:
            with pytest.raises(Disconnected):
                await stream.receive()
        nursery.cancel_scope.cancel()


async def test_an_internal_error_setting_up_a_stream_fails_that_stream(autojump_clock, monkeypatch):
    from dynamo_trio.request_plane import _server

    real = _server.ServerStream

    def flaky(session, connection, request):
        if request.payload == "unlucky":
            raise RuntimeError("cannot build the stream")
        return real(session, connection, request)

    monkeypatch.setattr(_server, "ServerStream", flaky)
    async with trio.open_nursery() as nursery:
        _, pool = await world(nursery, streaming_handler)
        connection = await pool.connect("worker:1")
        neighbour = await flowing(nursery, connection)
        with pytest.raises(Unknown, match="could not start it"):
            await open_stream(connection, "unlucky").receive()
        await neighbour.assert_flowing()
        pool.close_all()
        nursery.cancel_scope.cancel()


async def test_an_internal_error_in_a_server_connection_ends_that_connection_only(
    autojump_clock, monkeypatch, caplog
):
    caplog.set_level(logging.ERROR, logger="dynamo_trio")
    real = _Session._on_frames

    def fragile(self, frames):
        if self.peer.startswith("10.0.0.2") and any(
            getattr(f, "payload", None) == "poison" for f in frames
        ):
            raise Boom("a bug in the frame router")
        real(self, frames)

    monkeypatch.setattr(_Session, "_on_frames", fragile)
    async with trio.open_nursery() as nursery:
        server, pool = await world(nursery, streaming_handler)
        first = await pool.connect("worker:1")
        second = await pool.connect("worker:2")
        healthy = await flowing(nursery, first)
        victim = await flowing(nursery, second)
        open_stream(second, "poison")
        await wait_until(lambda: victim.ended)
        assert isinstance(victim.error, Disconnected)
        await healthy.assert_flowing()
        assert server.sessions == 1
        lines = [r for r in caplog.records if "ended by an internal error" in r.getMessage()]
        assert len(lines) == 1
        pool.close_all()
        nursery.cancel_scope.cancel()


async def test_an_internal_error_in_a_client_connection_ends_that_connection_only(
    autojump_clock, monkeypatch, caplog
):
    caplog.set_level(logging.ERROR, logger="dynamo_trio")
    real = ClientConnection._on_frames

    def fragile(self, frames):
        if self.address == "worker:2":
            raise KeyboardInterrupt  # anything at all, BaseException included
        real(self, frames)

    monkeypatch.setattr(ClientConnection, "_on_frames", fragile)
    async with trio.open_nursery() as nursery:
        _, pool = await world(nursery, streaming_handler)
        first = await pool.connect("worker:1")
        second = await pool.connect("worker:2")
        healthy = await flowing(nursery, first)
        victim = open_stream(second, None)
        with pytest.raises(Disconnected, match="internal error"):
            await victim.receive()
        assert second.closed and not first.closed
        await healthy.assert_flowing()
        assert [c.address for c in pool.connections()] == ["worker:1"]
        assert (await pool.connect("worker:2")) is not second  # a fresh one
        victim.kill(CancelReason.STREAM_CLOSED)
        pool.close_all()
        nursery.cancel_scope.cancel()
