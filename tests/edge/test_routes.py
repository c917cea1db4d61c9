"""The edge's fixed routes and its hand-off, as an ASGI app and over real HTTP."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

import pytest
import trio
import trio.testing
from hypercorn.config import Config as HypercornConfig
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from dynamo_trio.edge import (
    Edge,
    EdgeRequest,
    EdgeResponse,
    Route,
    listen_sockets,
    serve_http,
    status_routes,
)
from dynamo_trio.edge._status import exposition
from tests._memhttp import http_client

from ._serving import served_bare


class Messages:
    """An ASGI receive that yields a request body in parts, then blocks."""

    def __init__(self, *parts: bytes) -> None:
        self.parts = list(parts)
        self.reads = 0

    async def __call__(self) -> dict[str, Any]:
        self.reads += 1
        if not self.parts:
            await trio.sleep_forever()
        body = self.parts.pop(0)
        return {"type": "http.request", "body": body, "more_body": bool(self.parts)}


def scope(path: str, method: str = "GET", query: bytes = b"") -> dict[str, Any]:
    return {
        "type": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query,
        "headers": [(b"accept", b"*/*")],
        "http_version": "1.1",
        "method": method,
    }


async def call(
    edge: Edge, path: str, method: str = "GET", *body: bytes, drained: bool = True
) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    receive = Messages(*(body or (b"",)))
    await edge(scope(path, method), receive, send)  # type: ignore[arg-type]
    if drained:
        assert not receive.parts, "the body was read to its end before answering"
    return sent


def hello(request: EdgeRequest) -> EdgeResponse:
    return EdgeResponse.json({"path": request.path, "method": request.method})


async def test_a_fixed_route_is_answered_at_the_edge_without_the_app() -> None:
    def app(*args: Any) -> None:
        raise AssertionError("a fixed route must not reach the app")

    edge = Edge([Route("/hello", hello)], app)  # type: ignore[arg-type]
    sent = await call(edge, "/hello", "GET", b"ignored ", b"body")
    start, body = sent
    assert start["status"] == 200
    assert dict(start["headers"])[b"content-length"] == str(len(body["body"])).encode()
    assert body["body"] == b'{"path":"/hello","method":"GET"}'


async def test_head_is_answered_where_get_is_without_a_body() -> None:
    start, body = await call(Edge([Route("/hello", hello)]), "/hello", "HEAD")
    assert start["status"] == 200
    assert body["body"] == b""
    assert dict(start["headers"])[b"content-length"] != b"0"


async def test_other_methods_are_405_with_allow() -> None:
    start, body = await call(Edge([Route("/hello", hello)]), "/hello", "POST", b"{}")
    assert start["status"] == 405
    assert dict(start["headers"])[b"allow"] == b"GET, HEAD"
    assert b"not allowed" in body["body"]


async def test_without_an_app_other_paths_are_404() -> None:
    start, body = await call(Edge([Route("/hello", hello)]), "/elsewhere")
    assert start["status"] == 404
    assert b"No route GET /elsewhere" in body["body"]


async def test_other_paths_go_to_the_app() -> None:
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["path"])

    await call(Edge([Route("/hello", hello)], app), "/v1/models", "GET", b"x", b"y", drained=False)
    assert seen == ["/v1/models"]


async def test_status_routes_over_real_http_with_keep_alive(nursery: trio.Nursery) -> None:
    registry = CollectorRegistry()
    Counter("edge_test", "a counter", registry=registry).inc(3)
    trees = [{"id": "old", "age_s": 9.0}, {"id": "new", "age_s": 0.5}]
    edge = Edge(
        status_routes(
            health=lambda: (200, {"status": "ok"}), metrics=registry, inflight=lambda: trees
        )
    )
    url = await served_bare(nursery, edge)
    async with http_client(url) as client:
        for path in ("/health", "/live"):
            response = await client.get(path)
            assert (response.status_code, response.json()) == (200, {"status": "ok"})
        assert "edge_test_total 3.0" in (await client.get("/metrics")).text
        listed = (await client.get("/debug/requests")).json()
        assert [tree["id"] for tree in listed] == ["old", "new"]
        stuck = (await client.get("/debug/requests", params={"min_age": "5"})).json()
        assert [tree["id"] for tree in stuck] == ["old"]
        assert (await client.get("/debug/requests", params={"min_age": "x"})).status_code == 400
        assert (await client.get("/nowhere")).status_code == 404
    nursery.cancel_scope.cancel()


async def test_a_failing_health_callback_is_a_500_not_a_dead_connection(
    nursery: trio.Nursery,
) -> None:
    def broken() -> tuple[int, dict[str, Any]]:
        raise RuntimeError("boom")

    registry = CollectorRegistry()
    url = await served_bare(
        nursery, Edge(status_routes(health=broken, metrics=registry, inflight=list))
    )
    async with http_client(url) as client:
        assert (await client.get("/health")).status_code == 500
        assert (await client.get("/metrics")).status_code == 200  # same connection, still fine
    nursery.cancel_scope.cancel()


async def test_a_keep_alive_connection_its_client_closed_is_closed_at_once(
    nursery: trio.Nursery,
) -> None:
    """hypercorn alone ignores an EOF on an idle connection and holds it (CLOSE-WAIT on
    the server) until its keep-alive timeout ends: with clients that open and close
    connections (every httpx client that is closed), sockets pile up."""
    config = HypercornConfig()
    config.accesslog = None
    config.keep_alive_timeout = 60
    edge = Edge([Route("/hello", hello)])
    binds: list[str] = await nursery.start(
        partial(
            serve_http,
            edge,
            config,
            trio.sleep_forever,
            sockets=listen_sockets(["127.0.0.1:0"]),
        )
    )
    host, port = binds[0].removeprefix("http://").rsplit(":", 1)
    for _ in range(3):
        stream = await trio.open_tcp_stream(host, int(port))
        await stream.send_all(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
        received = b""
        while b"hello" not in received:
            received += await stream.receive_some()
        assert received.startswith(b"HTTP/1.1 200")
        await trio.sleep(0.2)  # the connection idles, kept alive
        await stream.send_eof()  # the client is done with it
        with trio.fail_after(2):
            assert await stream.receive_some() == b""  # the server closed its side too
        await stream.aclose()
    nursery.cancel_scope.cancel()


async def test_a_body_that_never_ends_is_a_408_that_closes_the_connection(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A fixed route reads the request body before answering; one that never ends (an
    unterminated chunked body) gets a 408 after the body timeout, not a held connection."""
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        if not sent and not getattr(receive, "started", False):
            receive.started = True  # type: ignore[attr-defined]
            return {"type": "http.request", "body": b"5\r\nhel", "more_body": True}
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    edge = Edge([Route("/hello", hello)], body_timeout=7.0)
    start = trio.current_time()
    await edge(scope("/hello"), receive, send)  # type: ignore[arg-type]
    assert trio.current_time() - start == 7.0
    head, body = sent
    assert head["status"] == 408
    assert (b"connection", b"close") in head["headers"]
    assert "did not arrive within 7 seconds" in json.loads(body["body"])["error"]["message"]


async def test_an_unterminated_chunked_body_on_a_fixed_route_over_real_http(
    nursery: trio.Nursery,
) -> None:
    """Found by the HTTP fuzz suite: ``GET /health`` with ``Transfer-Encoding: chunked``
    and no chunks held the connection for ever."""
    edge = Edge([Route("/hello", hello)], body_timeout=0.5)
    host, port = (await served_bare(nursery, edge)).removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    await stream.send_all(b"GET /hello HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    received = b""
    with trio.fail_after(5):
        while chunk := await stream.receive_some():
            received += chunk
    assert received.startswith(b"HTTP/1.1 408"), received
    await stream.aclose()
    nursery.cancel_scope.cancel()


def _families() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("c", "help \\ with\nnewline", ["a"], registry=registry).labels('x"y\\z\n').inc(3)
    Gauge("g", "a gauge", registry=registry).set(float("nan"))
    Histogram("h", "a histogram", ["m"], registry=registry).labels("q").observe(0.3)
    Info("i", "an info", registry=registry).info({"version": "1"})
    for index in range(20):  # families enough for several parts
        Gauge(f"g{index}", "one of many", registry=registry).set(index)
    return registry


@pytest.mark.parametrize("encode", [generate_latest, generate_openmetrics])
async def test_metrics_a_family_at_a_time_are_the_encoders_own_text(encode: Any) -> None:
    registry = _families()
    assert await exposition(encode, registry) == encode(registry)
    assert await exposition(encode, CollectorRegistry()) == encode(CollectorRegistry())


async def test_a_scrape_lets_other_tasks_run_between_families() -> None:
    ticks = 0
    seen: list[int] = []

    class Families:
        def collect(self) -> Any:
            for index in range(8 * 8):
                seen.append(ticks)
                yield GaugeMetricFamily(f"family_{index}", "one of several", value=index)

    registry = CollectorRegistry()
    registry.register(Families())

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.lowlevel.checkpoint()

    edge = Edge(status_routes(health=lambda: (200, {}), metrics=registry, inflight=list))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        await trio.lowlevel.checkpoint()
        start, body = await call(edge, "/metrics")
        nursery.cancel_scope.cancel()
    assert start["status"] == 200
    assert body["body"].count(b"# TYPE family_") == 64
    # A checkpoint every few families; trio may run the two tasks in either order within
    # a pass, so one interval between checkpoints can pass without a tick, never two in a row.
    assert seen == sorted(seen) and len(set(seen)) >= 4, seen
