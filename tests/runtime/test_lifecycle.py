"""Graceful shutdown, and nothing outliving its request."""

from __future__ import annotations

import gc
import os
from typing import TYPE_CHECKING, Any

import pytest
import trio
import trio.lowlevel
import trio.testing

from dynamo_trio import CannotConnect, Context, EngineShutdown, NoInstances
from dynamo_trio.request_plane import ClientStream, ServerStream
from dynamo_trio.runtime import DistributedRuntime

from .._streams import drain_cut_by_shutdown
from .conftest import TEST_CONFIG, Cluster, metric_value

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


async def test_shutdown_deregisters_drains_and_returns(cluster: Cluster) -> None:
    seen: list[tuple[str, str | None]] = []

    async def handler(request: Any, context: Context) -> AsyncIterator[Any]:
        i = 0
        while not context.is_stopped():
            await trio.sleep(0.005)
            yield i
            i += 1
        seen.append((context.state.name, context.reason.value if context.reason else None))
        yield "drained"

    worker = cluster.worker
    client = await cluster.serve(handler)
    stream = await client.generate({})
    await stream.__anext__()
    worker.shutdown()
    items = await drain_cut_by_shutdown(stream)  # the drain, then the truncation is told
    assert items[-1] == "drained"
    assert stream.outcome == "stopped"
    assert seen == [("STOPPED", "shutdown")]
    with trio.fail_after(30):  # a hang guard only
        await worker.wait_shut_down()
        await client._view.wait_until(lambda instances: not instances)
    assert worker.health().ready is False
    with pytest.raises(NoInstances):
        await client.generate({})
    labels = {"dynamo_endpoint": "generate"}
    assert metric_value(worker.registry, "dynamo_component_cancellation_total", **labels) == 1


async def test_shutdown_kills_what_ignores_the_stop(cluster: Cluster) -> None:
    killed = trio.Event()

    async def stubborn(request: Any, context: Context) -> AsyncIterator[Any]:
        yield "started"
        try:
            await trio.sleep_forever()
        finally:
            if context.is_killed():
                killed.set()

    client = await cluster.serve(stubborn)
    stream = await client.generate({})
    await stream.__anext__()
    grace = TEST_CONFIG.worker.shutdown_grace
    start = trio.current_time()
    cluster.worker.shutdown()
    with trio.fail_after(grace * 20), pytest.raises(EngineShutdown):  # a timeout for a hang
        async for _ in stream:
            pass
    assert killed.is_set()
    assert trio.current_time() - start >= grace  # it had the whole grace first


async def test_a_draining_worker_refuses_new_streams(cluster: Cluster) -> None:
    started = trio.Event()

    async def slow(request: Any, context: Context) -> AsyncIterator[Any]:
        started.set()
        await context.stopped()
        await trio.sleep(0.3)  # still draining while the test knocks
        yield "bye"

    client = await cluster.serve(slow)
    address = cluster.worker.address
    assert address is not None
    stream = await client.generate({})  # keeps the worker busy while it drains
    await started.wait()
    cluster.worker.shutdown()
    await trio.sleep(0.1)
    [connection] = cluster.caller._pool().connections()  # the one that got "goaway"
    assert not connection.usable
    with pytest.raises(CannotConnect):
        await cluster.caller._pool().connect(address)  # no new connections either
    with pytest.raises(EngineShutdown):
        connection.open_stream(
            endpoint="dynamo/backend/generate",
            instance_id=cluster.worker.instance_id,
            request_id="late",
            payload={},
        )
    assert await drain_cut_by_shutdown(stream) == ["bye"]


def _tasks() -> list[str]:
    root = trio.lowlevel.current_root_task()
    assert root is not None
    names, stack = [], [root]
    while stack:
        task = stack.pop()
        names.append(task.name)
        for nursery in task.child_nurseries:
            stack.extend(nursery.child_tasks)
    return sorted(names)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _live(kind: type) -> int:
    gc.collect()
    return sum(1 for obj in gc.get_objects() if isinstance(obj, kind))


async def test_two_thousand_mixed_requests_leak_nothing(cluster: Cluster) -> None:
    async def handler(request: Any, context: Context) -> AsyncIterator[Any]:
        for i in range(request["n"]):
            if context.is_stopped():
                yield "final"
                return
            await trio.lowlevel.checkpoint()
            yield i

    client = await cluster.serve(handler)
    parent = Context("long-lived-parent")

    async def one(i: int) -> None:
        mode = i % 4
        ctx = Context(parent.id())
        parent.link_child(ctx)
        stream = await client.generate({"n": 3 if mode == 0 else 10**6}, context=ctx)
        async for _ in stream:
            if mode == 1:
                ctx.stop()
            elif mode == 2:
                ctx.kill()
            elif mode == 3:
                await stream.aclose()
                break
        ctx.finish()

    worker = cluster.worker

    async def settle() -> None:
        with trio.fail_after(30):  # a hang guard only
            await worker._wait_idle()
        await trio.testing.wait_all_tasks_blocked()

    for i in range(20):  # warm up: connection, pool, metric children
        await one(i)
    await settle()
    tasks, fds = _tasks(), _open_fds()
    # Earlier tests' logged tracebacks may still hold a few objects: count growth.
    objects = {kind: _live(kind) for kind in (ServerStream, ClientStream, Context)}

    for batch in range(0, 2000, 50):
        async with trio.open_nursery() as nursery:
            for i in range(batch, batch + 50):
                nursery.start_soon(one, i)

    await settle()
    server = worker._server
    assert server is not None
    assert all(not session.streams for session in server._sessions)
    assert all(conn.open_streams == 0 for conn in cluster.caller._pool().connections())
    assert parent.children == ()
    assert _tasks() == tasks
    assert _open_fds() == fds
    for kind, before in objects.items():
        assert _live(kind) <= before, kind.__name__
    labels = {"dynamo_endpoint": "generate"}
    assert metric_value(worker.registry, "dynamo_component_inflight_requests", **labels) == 0
    # 1,500 of the 2,020 were cancelled (stop, kill, close), each counted once.
    assert metric_value(worker.registry, "dynamo_component_cancellation_total", **labels) == 1515


async def test_leaving_the_runtime_leaves_no_tasks_or_sockets(nursery: trio.Nursery) -> None:
    tasks, fds = _tasks(), _open_fds()
    async with DistributedRuntime(TEST_CONFIG) as worker, DistributedRuntime(TEST_CONFIG) as caller:

        async def echo(request: Any) -> AsyncIterator[Any]:
            yield request

        endpoint = worker.namespace("ns").component("c").endpoint("e")
        nursery.start_soon(endpoint.serve_endpoint, echo)
        client = await caller.namespace("ns").component("c").endpoint("e").client()
        await client.wait_for_instances()
        assert [i.data() async for i in await client.generate(1)] == [1]
        worker.shutdown()
        await worker.wait_shut_down()
    await trio.testing.wait_all_tasks_blocked()
    assert _tasks() == tasks
    assert _open_fds() == fds


async def test_an_idle_worker_says_goaway_before_closing(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    async def echo(request: Any) -> AsyncIterator[Any]:
        yield request

    client = await cluster.serve(echo)
    assert [i.data() async for i in await client.generate(1)] == [1]
    [connection] = cluster.caller._pool().connections()
    cluster.worker.shutdown()
    with trio.fail_after(30):  # a hang guard only
        await cluster.worker.wait_shut_down()
        while not connection.closed:  # noqa: ASYNC110 - watching another task's socket
            await trio.sleep(0.01)
    assert connection.drained  # the goaway reached us before the connection closed
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


async def test_an_endpoint_served_after_the_shutdown_began_serves_nothing(
    cluster: Cluster,
) -> None:
    """A signal during a worker's start-up: its endpoint is never registered, and serving
    it returns at once rather than failing the worker."""

    async def handler(request: Any) -> AsyncIterator[Any]:
        yield request

    worker = cluster.worker
    worker.shutdown()
    endpoint = worker.namespace("dynamo").component("late").endpoint("generate")
    with trio.fail_after(30):  # a hang guard only
        async with trio.open_nursery() as nursery:
            await nursery.start(endpoint.serve_endpoint, handler)
    assert not [key for key in cluster.store.snapshot("") if "late" in key]
    assert "dynamo/late/generate" not in worker._endpoints
