"""The idle timer of a served connection: keep-alive timeout, busy time, shutdown.

serve_http replaces hypercorn's per-request idle task with one timer per
connection; these pin the behaviour down over memory streams on the autojump
clock (one connection, :func:`~dynamo_trio.edge.serve_stream`) and, for the
shutdown, which is serve_http's own, over real sockets.
"""

from __future__ import annotations

from functools import partial

import pytest
import trio
import trio.testing
from hypercorn.config import Config as HypercornConfig

from dynamo_trio.edge import Edge, EdgeRequest, EdgeResponse, Route, listen_sockets, serve_http
from tests._memhttp import MemoryHTTP, hypercorn_config

IDLE = 0.4


async def slow(request: EdgeRequest) -> EdgeResponse:
    seconds = float(request.query.decode().removeprefix("s=") or 0)
    await trio.sleep(seconds)
    return EdgeResponse.json({"slept": seconds})


async def start(
    nursery: trio.Nursery,
    shutdown: trio.Event | None = None,
    *,
    graceful: float = 5.0,
    idle: float = IDLE,
    routes: tuple[Route, ...] = (),
) -> tuple[str, int]:
    config = HypercornConfig()
    config.accesslog = None
    config.keep_alive_timeout = idle
    config.graceful_timeout = graceful
    trigger = shutdown.wait if shutdown is not None else trio.sleep_forever
    binds: list[str] = await nursery.start(
        partial(
            serve_http,
            Edge([Route("/slow", slow), *routes]),
            config,
            trigger,
            sockets=listen_sockets(["127.0.0.1:0"]),
        )
    )
    host, port = binds[0].removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def memory_edge(nursery: trio.Nursery, *, idle: float = IDLE) -> MemoryHTTP:
    """The same edge as :func:`start`'s, one connection at a time over memory streams."""
    return MemoryHTTP(
        nursery, Edge([Route("/slow", slow)]), hypercorn_config(keep_alive_timeout=idle)
    )


async def ask(stream: trio.abc.Stream, seconds: float = 0.0) -> bytes:
    await stream.send_all(b"GET /slow?s=%g HTTP/1.1\r\nHost: x\r\n\r\n" % seconds)
    received = b""
    while not received.endswith(b"}"):
        data = await stream.receive_some(65536)
        assert data, received
        received += data
    return received


async def closed_within(stream: trio.abc.Stream, seconds: float = 30) -> float:
    """Seconds until the server closes ``stream`` (EOF), failing after ``seconds`` (by
    default a hang guard only)."""
    start = trio.current_time()
    with trio.fail_after(seconds):
        while await stream.receive_some(65536):
            pass
    return trio.current_time() - start


async def test_an_idle_connection_closes_after_the_timeout_each_time_it_idles(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    stream = await memory_edge(nursery).connect()
    async with stream:
        for _ in range(4):  # requests closer together than the timeout keep it open
            assert (await ask(stream)).startswith(b"HTTP/1.1 200")
            await trio.sleep(IDLE * 0.9)
        assert (await ask(stream)).startswith(b"HTTP/1.1 200")
        waited = await closed_within(stream)
    assert waited == pytest.approx(IDLE)  # virtual time: at its deadline, not before


async def test_a_response_longer_than_the_timeout_is_not_cut(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    stream = await memory_edge(nursery).connect()
    async with stream:
        received = await ask(stream, IDLE * 3)
        assert received.startswith(b"HTTP/1.1 200") and b'"slept":1.2' in received
        assert (await ask(stream)).startswith(b"HTTP/1.1 200")  # still open after it
        assert await closed_within(stream) == pytest.approx(IDLE)


async def test_shutdown_closes_idle_connections_at_once_and_busy_ones_after_their_answer() -> None:
    # Keep-alive and graceful timeouts far longer than the hang guards: a connection
    # closed within one was closed by the shutdown, neither idling out nor at the grace;
    # and serve_http returns once both are closed, without waiting out the grace.
    entered, release = trio.Event(), trio.Event()

    async def held(request: EdgeRequest) -> EdgeResponse:
        entered.set()
        await release.wait()
        return EdgeResponse.json({"held": True})

    shutdown = trio.Event()
    async with trio.open_nursery() as serving:
        host, port = await start(
            serving, shutdown, graceful=120, idle=120, routes=(Route("/held", held),)
        )
        idle = await trio.open_tcp_stream(host, port)
        busy = await trio.open_tcp_stream(host, port)
        answered: list[bytes] = []
        async with idle, busy:
            await ask(idle)
            async with trio.open_nursery() as inner:

                async def held_request() -> None:
                    await busy.send_all(b"GET /held HTTP/1.1\r\nHost: x\r\n\r\n")
                    received = b""
                    while not received.endswith(b"}"):
                        data = await busy.receive_some(65536)
                        assert data, received
                        received += data
                    answered.append(received)

                inner.start_soon(held_request)
                await entered.wait()
                shutdown.set()
                await closed_within(idle)  # idle: closed at once ...
                assert not answered  # ... while the busy one is still held
                release.set()
            assert answered[0].startswith(b"HTTP/1.1 200")  # busy: answered first
            await closed_within(busy)  # then closed
        serving.cancel_scope.deadline = trio.current_time() + 30  # a hang guard < the grace
    assert not serving.cancel_scope.cancelled_caught  # serve_http returned on its own


async def test_a_connection_whose_client_left_mid_request_ends_with_its_request(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Nothing of the connection may linger once its request is over (a shutdown
    # would then wait the whole graceful timeout for it): its serving task ends.
    async with trio.open_nursery() as nursery:
        stream = await memory_edge(nursery).connect()
        await stream.send_all(b"GET /slow?s=0.3 HTTP/1.1\r\nHost: x\r\n\r\n")
        await trio.sleep(0.1)
        await stream.aclose()  # busy, and the client leaves
    assert trio.current_time() < IDLE  # ended with its request, not at the idle timeout
