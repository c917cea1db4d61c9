"""What only the etcd backend does: leases lost and regained, resumed and resynced watches,
failover, and an etcd that answers garbage."""

from __future__ import annotations

import base64
import contextlib
import inspect
import re
import ssl
from contextlib import asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

import httpx
import msgspec
import pytest
import trio
import trio.testing
import trustme

from dynamo_trio import DiscoveryConfig
from dynamo_trio.discovery import DiscoveryError, WatchEvent, open_discovery
from dynamo_trio.discovery._etcd import (
    EtcdError,
    EtcdGateway,
    RequestBody,
    WatchPump,
    _message,
    prefix_range,
)
from tests._memhttp import TLS

from ._etcd_server import EtcdServer, free_port
from ._util import STEP, events, next_event

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable
    from pathlib import Path


def b64(data: str | bytes) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.b64encode(raw).decode()


async def raw_call(endpoint: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """Talk to etcd behind the backend's back."""
    async with httpx.AsyncClient(verify=TLS, trust_env=False) as client:
        response = await client.post(endpoint + path, json=body)
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result


async def lease_of(endpoint: str, key: str) -> int:
    answer = await raw_call(endpoint, "/v3/kv/range", {"key": b64(key)})
    return int(answer["kvs"][0].get("lease", 0))


async def current_revision(endpoint: str) -> int:
    answer = await raw_call(endpoint, "/v3/kv/range", {"key": b64("\0")})
    return int(answer["header"]["revision"])


def etcd_config(endpoints: tuple[str, ...], lease_ttl: float = 2.0) -> DiscoveryConfig:
    return DiscoveryConfig(backend="etcd", etcd_endpoints=endpoints, lease_ttl=lease_ttl)


# -- startup and endpoints ------------------------------------------------------------


async def test_unreachable_etcd_fails_fast_with_a_clear_error() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with trio.fail_after(10), pytest.raises(DiscoveryError, match="cannot register with etcd"):
        async with open_discovery(etcd_config((dead,))):
            pytest.fail("should not start")


async def test_an_https_endpoint_must_show_a_certificate_the_client_trusts() -> None:
    ca = trustme.CA()  # trusted by nobody
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_context)

    async def handshake(stream: trio.SSLStream[trio.SocketStream]) -> None:
        with contextlib.suppress(trio.BrokenResourceError):
            await stream.do_handshake()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            partial(trio.serve_ssl_over_tcp, handshake, 0, server_context, host="127.0.0.1")
        )
        port = listeners[0].transport_listener.socket.getsockname()[1]
        with (
            trio.fail_after(10),
            pytest.raises(DiscoveryError, match=r"(?i)ConnectError: .*certificate verify failed"),
        ):
            async with open_discovery(etcd_config((f"https://127.0.0.1:{port}",))):
                pytest.fail("should not start")
        nursery.cancel_scope.cancel()


def test_a_transport_error_is_told_by_the_first_message_in_its_causes() -> None:
    inner = ValueError("the reason")
    outer = httpx.ConnectError("")
    outer.__cause__ = OSError()
    outer.__cause__.__context__ = inner
    assert _message(outer) == "the reason"
    looped = httpx.ReadError("")
    looped.__cause__ = looped
    assert _message(looped) == ""


@pytest.mark.etcd
async def test_fails_over_to_the_next_endpoint(
    etcd_endpoints: tuple[str, ...], prefix: str
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    async with open_discovery(etcd_config((dead, *etcd_endpoints))) as d:
        await d.put(prefix + "k", b"v")
        async with d.watch_prefix(prefix) as watch:
            assert watch.initial == {prefix + "k": b"v"}
            await d.delete(prefix + "k")
            assert await next_event(watch) == WatchEvent("delete", prefix + "k", None)


# -- the lease ------------------------------------------------------------------------


@pytest.mark.etcd
async def test_a_lost_lease_is_regranted_and_its_keys_put_back(
    etcd_endpoints: tuple[str, ...], prefix: str
) -> None:
    endpoint = etcd_endpoints[0]
    config = etcd_config(etcd_endpoints)
    async with open_discovery(config) as owner, open_discovery(config) as reader:
        lease_id = owner.lease_id
        await owner.put(prefix + "a", b"1")
        await owner.put(prefix + "b", b"2")
        async with reader.watch_prefix(prefix) as watch:
            await raw_call(endpoint, "/v3/lease/revoke", {"ID": str(lease_id)})
            gone = await events(watch, 2)
            assert {e.kind for e in gone} == {"delete"}
            # Put back by the owner's keepalive, which finds the lease gone (nothing is
            # written meanwhile that could notice it instead).
            back = await events(watch, 2, within=60)  # a hang guard only
            assert sorted((e.key, e.value) for e in back) == [
                (prefix + "a", b"1"),
                (prefix + "b", b"2"),
            ]
        assert owner.lease_id == lease_id, "the instance id must not change"
        assert await lease_of(endpoint, prefix + "a") == lease_id
    async with open_discovery(config) as check:
        assert await check.get_prefix(prefix) == {}, "closing revokes the re-granted lease"


@pytest.mark.etcd
async def test_a_put_on_a_lost_lease_recovers_at_once(
    etcd_endpoints: tuple[str, ...], prefix: str
) -> None:
    endpoint = etcd_endpoints[0]
    async with open_discovery(etcd_config(etcd_endpoints, lease_ttl=30.0)) as owner:
        await owner.put(prefix + "a", b"1")
        await raw_call(endpoint, "/v3/lease/revoke", {"ID": str(owner.lease_id)})
        await owner.put(prefix + "b", b"2")  # the keepalive would take 10 s to notice
        assert await owner.get_prefix(prefix) == {prefix + "a": b"1", prefix + "b": b"2"}
        assert await lease_of(endpoint, prefix + "b") == owner.lease_id


@pytest.mark.etcd
async def test_etcd_replaced_by_an_empty_cluster(etcd_binary_path: str, tmp_path: Path) -> None:
    """The worker re-registers and the watcher resynchronises with the new cluster."""
    first = EtcdServer(etcd_binary_path, tmp_path / "first")
    await trio.to_thread.run_sync(first.start)
    second = EtcdServer(etcd_binary_path, tmp_path / "second", client_port=first.client_port)
    try:
        config = etcd_config((first.url,))
        async with open_discovery(config) as owner, open_discovery(config) as reader:
            for _ in range(20):  # move the old cluster's revision well ahead
                await owner.put("other", b"x")
                await owner.delete("other")
            await owner.put("svc/a", b"1")
            async with reader.watch_prefix("svc/") as watch:
                await trio.to_thread.run_sync(first.stop)
                await trio.to_thread.run_sync(second.start)
                with trio.fail_after(60):  # a hang guard only
                    while await reader.get_prefix("svc/") != {"svc/a": b"1"}:  # noqa: ASYNC110
                        await trio.sleep(0.05)  # polls another process
                # The watch follows the new cluster (whose revisions restarted).
                await owner.put("svc/b", b"2")
                while (event := await next_event(watch, within=60)).key != "svc/b":
                    assert event.key == "svc/a"
                assert event == WatchEvent("put", "svc/b", b"2")
    finally:
        await trio.to_thread.run_sync(first.stop)
        await trio.to_thread.run_sync(second.stop)


# -- watches ----------------------------------------------------------------------------


@asynccontextmanager
async def gateway_for(endpoints: tuple[str, ...]) -> AsyncIterator[EtcdGateway]:
    async with httpx.AsyncClient(verify=TLS, trust_env=False) as client:
        yield EtcdGateway(client, endpoints, timeout=5.0)


@pytest.mark.etcd
async def test_a_watch_behind_compacted_history_resynchronises(
    etcd_endpoints: tuple[str, ...], prefix: str
) -> None:
    async with open_discovery(etcd_config(etcd_endpoints)) as d, gateway_for(etcd_endpoints) as gw:
        await d.put(prefix + "a", b"1")
        await d.put(prefix + "gone", b"x")
        old_state, old_revision = await gw.range_prefix(prefix)
        await d.put(prefix + "b", b"1")
        await d.delete(prefix + "a")
        await d.put(prefix + "c", b"1")
        await d.put(prefix + "c", b"2")
        await d.put(prefix + "flash", b"x")
        await d.delete(prefix + "flash")
        revision = await current_revision(etcd_endpoints[0])
        await raw_call(etcd_endpoints[0], "/v3/kv/compaction", {"revision": str(revision)})

        send_channel, receive_channel = trio.open_memory_channel[WatchEvent](0)
        pump = WatchPump(gw, prefix, old_state, old_revision + 1, send_channel)
        async with trio.open_nursery() as nursery, receive_channel:
            nursery.start_soon(pump.run)
            with trio.fail_after(STEP):
                got = [await receive_channel.receive() for _ in range(3)]
            assert got == [
                WatchEvent("delete", prefix + "a", None),
                WatchEvent("put", prefix + "b", b"1"),
                WatchEvent("put", prefix + "c", b"2"),
            ], "the difference, not the lost history, and nothing for 'gone' or 'flash'"
            # and then it follows live changes again
            await d.put(prefix + "d", b"1")
            with trio.fail_after(STEP):
                assert await receive_channel.receive() == WatchEvent("put", prefix + "d", b"1")
            nursery.cancel_scope.cancel()


class Proxy:
    """A TCP proxy to etcd whose connections the test can cut."""

    def __init__(self, target: str) -> None:
        match = re.fullmatch(r"http://([^:/]+):(\d+)", target)
        assert match, target
        self._host, self._port = match[1], int(match[2])
        self._scopes: set[trio.CancelScope] = set()
        self.url = ""

    async def serve(self, *, task_status: trio.TaskStatus[None]) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self._handle, listeners)
            task_status.started()

    def cut(self) -> int:
        """Close every connection open through the proxy; returns how many."""
        for scope in self._scopes:
            scope.cancel()
        return len(self._scopes)

    async def _handle(self, downstream: trio.SocketStream) -> None:
        with trio.CancelScope() as scope:
            self._scopes.add(scope)
            try:
                upstream = await trio.open_tcp_stream(self._host, self._port)
                async with downstream, upstream, trio.open_nursery() as nursery:
                    nursery.start_soon(self._pipe, downstream, upstream, nursery.cancel_scope)
                    nursery.start_soon(self._pipe, upstream, downstream, nursery.cancel_scope)
            finally:
                self._scopes.discard(scope)

    @staticmethod
    async def _pipe(
        source: trio.SocketStream, sink: trio.SocketStream, both: trio.CancelScope
    ) -> None:
        try:
            async for data in source:
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        both.cancel()


@pytest.mark.etcd
async def test_a_broken_watch_stream_resumes_where_it_stopped(
    etcd_endpoints: tuple[str, ...], prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = Proxy(etcd_endpoints[0])
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.serve)
        async with (
            open_discovery(etcd_config(etcd_endpoints)) as writer,
            open_discovery(etcd_config((proxy.url,))) as reader,
            reader.watch_prefix(prefix) as watch,
        ):
            await writer.put(prefix + "1", b"before")
            assert await next_event(watch) == WatchEvent("put", prefix + "1", b"before")
            assert proxy.cut() >= 1
            await writer.put(prefix + "2", b"during")
            await writer.delete(prefix + "1")
            got = await events(watch, 2)
            assert got == [
                WatchEvent("put", prefix + "2", b"during"),
                WatchEvent("delete", prefix + "1", None),
            ]
            with trio.move_on_after(0.3):
                extra = await watch.__anext__()
                pytest.fail(f"an event was repeated: {extra}")
        nursery.cancel_scope.cancel()
    assert "resuming from revision" in caplog.text


async def etcd_watchers(endpoint: str) -> int:
    async with httpx.AsyncClient(verify=TLS, trust_env=False) as client:
        text = (await client.get(endpoint + "/metrics")).text
    match = re.search(r"^etcd_debugging_mvcc_watcher_total (\d+)", text, re.MULTILINE)
    assert match, "etcd no longer exports etcd_debugging_mvcc_watcher_total"
    return int(match[1])


async def wait_for_watchers(endpoint: str, expected: int) -> None:
    with trio.fail_after(STEP):
        while await etcd_watchers(endpoint) != expected:  # noqa: ASYNC110 - nothing to wait on
            await trio.sleep(0.02)


@pytest.mark.etcd
async def test_leaving_a_watch_ends_it_on_the_server(
    etcd_endpoints: tuple[str, ...], prefix: str
) -> None:
    endpoint = etcd_endpoints[0]
    async with open_discovery(etcd_config(etcd_endpoints)) as d:
        before = await etcd_watchers(endpoint)
        async with d.watch_prefix(prefix), d.watch_prefix(prefix), d.watch_prefix(prefix):
            await wait_for_watchers(endpoint, before + 3)
        await wait_for_watchers(endpoint, before)
        with trio.move_on_after(0.1):
            async with d.watch_prefix(prefix) as watch:
                async for _ in watch:
                    pass
        await wait_for_watchers(endpoint, before)


# -- garbage and errors (no etcd needed) --------------------------------------------------


@asynccontextmanager
async def mock_gateway(
    handler: Callable[[httpx.Request], httpx.Response],
) -> AsyncIterator[EtcdGateway]:
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        yield EtcdGateway(client, ("http://etcd.invalid:2379",), timeout=1.0)


async def test_garbage_from_etcd_is_a_discovery_error() -> None:
    html = httpx.Response(200, content=b"<html>proxy</html>")
    async with mock_gateway(lambda request: html) as gateway:
        with pytest.raises(DiscoveryError, match="unreadable"):
            await gateway.range_prefix("p/")
    wrong_shape = httpx.Response(200, json={"kvs": "not a list"})
    async with mock_gateway(lambda request: wrong_shape) as gateway:
        with pytest.raises(DiscoveryError, match="unreadable"):
            await gateway.range_prefix("p/")
    binary_error = httpx.Response(400, content=b"\xff\xfe")
    async with mock_gateway(lambda request: binary_error) as gateway:
        with pytest.raises(EtcdError, match="HTTP 400"):
            await gateway.put("k", b"v", 1)
    body = {"error": "lease not found", "message": "lease not found", "code": 5}
    not_found = httpx.Response(404, json=body)
    async with mock_gateway(lambda request: not_found) as gateway:
        with pytest.raises(EtcdError, match="lease not found") as caught:
            await gateway.put("k", b"v", 1)
    assert caught.value.code == 5


async def test_non_utf8_keys_are_skipped(caplog: pytest.LogCaptureFixture) -> None:
    body = {
        "header": {"revision": "7"},
        "kvs": [{"key": b64(b"p/\xff"), "value": b64("x")}, {"key": b64("p/ok"), "value": ""}],
        "count": "2",
    }
    async with mock_gateway(lambda request: httpx.Response(200, json=body)) as gateway:
        assert await gateway.range_prefix("p/") == ({"p/ok": b""}, 7)
    assert "non-UTF-8" in caplog.text


async def test_a_watch_survives_garbage_and_compaction_messages(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Offline: garbage drops the stream, compaction resyncs, live events follow."""
    streams = [
        b"this is not json\n",
        b'{"result": {"created": true}}\n{"result": {"canceled": true, "compact_revision": "9"}}\n',
        b'{"result": {"created": true, "header": {"revision": "10"}}}\n'
        + msgspec.json.encode(
            {
                "result": {
                    "header": {"revision": "11"},
                    "events": [
                        {"kv": {"key": b64("p/new"), "value": b64("v"), "mod_revision": "11"}}
                    ],
                }
            }
        )
        + b"\n",
    ]
    watch_requests: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v3/kv/range":
            kvs = [{"key": b64("p/kept"), "value": b64("1"), "mod_revision": "3"}]
            return httpx.Response(200, json={"header": {"revision": "10"}, "kvs": kvs})
        assert request.url.path == "/v3/watch"
        watch_requests.append(msgspec.json.decode(request.content))
        return httpx.Response(200, content=streams.pop(0) if streams else b"")

    send_channel, receive_channel = trio.open_memory_channel[WatchEvent](0)
    state = {"p/kept": b"1", "p/old": b"x"}
    async with mock_gateway(handler) as gateway, trio.open_nursery() as nursery, receive_channel:
        pump = WatchPump(gateway, "p/", state, 5, send_channel)
        nursery.start_soon(pump.run)
        with trio.fail_after(STEP):
            assert await receive_channel.receive() == WatchEvent("delete", "p/old", None)
            assert await receive_channel.receive() == WatchEvent("put", "p/new", b"v")
        nursery.cancel_scope.cancel()
    starts = [int(r["create_request"]["start_revision"]) for r in watch_requests[:3]]
    assert starts == [5, 5, 11]
    assert "unreadable watch message" in caplog.text
    assert "compacted" in caplog.text


def test_prefix_range() -> None:
    assert prefix_range("a/") == (b"a/", b"a0")
    assert prefix_range("") == (b"\0", b"\0")
    raw = "ключ".encode()
    assert prefix_range("ключ") == (raw, raw[:-1] + bytes([raw[-1] + 1]))


async def test_a_consumer_far_behind_gets_coalesced_changes(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("dynamo_trio.discovery._etcd._MAX_PENDING", 3)
    lines = [b'{"result": {"created": true, "header": {"revision": "10"}}}']
    for i in range(10):
        kv = {"key": b64(f"p/{i}"), "value": b64("v"), "mod_revision": str(11 + i)}
        lines.append(msgspec.json.encode({"result": {"events": [{"kv": kv}]}}))
    kv = {"key": b64("p/0"), "mod_revision": "21"}
    lines.append(msgspec.json.encode({"result": {"events": [{"type": "DELETE", "kv": kv}]}}))
    bodies = [b"\n".join(lines) + b"\n"]

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=bodies.pop() if bodies else b"")

    send_channel, receive_channel = trio.open_memory_channel[WatchEvent](0)
    async with mock_gateway(handler) as gateway, trio.open_nursery() as nursery, receive_channel:
        pump = WatchPump(gateway, "p/", {"p/old": b"x"}, 11, send_channel)
        nursery.start_soon(pump.run)
        state = {"p/old": b"x"}
        while True:
            # Everything blocked: the reader took what it could while nobody read, and the
            # pump offers its next event, if it has one.
            await trio.testing.wait_all_tasks_blocked()
            try:
                event = receive_channel.receive_nowait()
            except trio.WouldBlock:
                break
            if event.value is None:
                del state[event.key]
            else:
                state[event.key] = event.value
        nursery.cancel_scope.cancel()
    assert state == {"p/old": b"x", **{f"p/{i}": b"v" for i in range(1, 10)}}
    assert "coalescing" in caplog.text


async def test_a_send_cancelled_while_writing_its_body_leaves_no_generator_behind() -> None:
    """The gateway's request bodies are read by a plain iterator: a send cancelled between
    its body's chunks (as a watch left mid-request is) leaves no suspended async generator
    for the garbage collector to finalize (httpx's own body is an async generator)."""
    iterators: list[object] = []

    class StuckTransport(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            assert isinstance(request.stream, httpx.AsyncByteStream)
            iterator = aiter(request.stream)
            iterators.append(iterator)
            async for _chunk in iterator:
                await trio.sleep_forever()  # (the write of the chunk, cancelled)
            raise AssertionError("not reached")

    async with httpx.AsyncClient(transport=StuckTransport()) as client:
        gateway = EtcdGateway(client, ("http://etcd.test:2379",), timeout=5.0)
        with trio.move_on_after(0.01):
            async with gateway.watch("/dynamo/", 1):
                raise AssertionError("not reached")
        with trio.move_on_after(0.01):
            await gateway.revoke(7)
    assert len(iterators) == 2
    assert not any(inspect.isasyncgen(iterator) for iterator in iterators)
    body = RequestBody(b'{"key": "a"}')
    assert [chunk async for chunk in body] == [b'{"key": "a"}']
    assert [chunk async for chunk in body] == [b'{"key": "a"}']  # once per send


class _Stalled(httpx.AsyncByteStream):
    async def __aiter__(self) -> AsyncIterator[bytes]:
        await trio.sleep_forever()
        yield b""  # not reached


async def test_a_watch_whose_member_never_answers_fails_over(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A member cut off just as a watch was sent never sends its head, or its error body:
    the watch moves on within a request timeout, as any call does (its stream's reads stay
    unbounded)."""

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "cut.test":
            await trio.sleep_forever()
        if request.url.host == "stalled.test":
            return httpx.Response(503, stream=_Stalled())
        return httpx.Response(200, content=b'{"result": {"created": true}}\n')

    endpoints = ("http://cut.test:2379", "http://stalled.test:2379", "http://live.test:2379")
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        gateway = EtcdGateway(client, endpoints, timeout=1.0)
        with trio.fail_after(5):
            async with gateway.watch("p/", 1) as (endpoint, lines):
                assert endpoint == "http://live.test:2379"
                assert [line async for line in lines] == ['{"result": {"created": true}}']
    assert gateway.endpoint == "http://live.test:2379"


async def test_calls_failing_together_move_on_to_the_next_member_once() -> None:
    """Two calls that both find the current member dead must not each step the shared
    pointer: the second step would skip the live member after it."""
    arrived = 0
    both_arrived = trio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal arrived
        if request.url.host == "live.test":
            return httpx.Response(200, json={"header": {"revision": "3"}})
        if request.url.host == "first.test":
            arrived += 1
            if arrived == 2:
                both_arrived.set()
            await both_arrived.wait()
        raise httpx.ConnectError("refused", request=request)

    endpoints = ("http://first.test:2379", "http://live.test:2379", "http://last.test:2379")
    answers: list[int] = []
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        gateway = EtcdGateway(client, endpoints, timeout=1.0)

        async def read() -> None:
            answers.append((await gateway.range_prefix("p/"))[1])

        with trio.fail_after(STEP):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read)
                nursery.start_soon(read)
    assert answers == [3, 3]
    assert gateway.endpoint == "http://live.test:2379"
