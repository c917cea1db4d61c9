"""Dynamo 1.6.1's runtime surface beside today's names: ``runtime.endpoint(path)``,
``serve_endpoint(handler, graceful_shutdown, metrics_labels)``, the ``worker_id``
label, and ``Client.generate/random/round_robin/direct(..., annotated)``."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import pytest
import trio

from dynamo_trio import Context, EngineShutdown, WorkerConfig
from dynamo_trio.runtime import Annotated, DataStream, DistributedRuntime, ResponseStream

from .._streams import drain_cut_by_shutdown
from .conftest import TEST_CONFIG, Cluster, metric_value

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator


# ---------------------------------------------------------------------------- naming


async def test_a_dotted_path_names_the_same_endpoint_as_the_chain(cluster: Cluster) -> None:
    runtime = cluster.worker
    chained = runtime.namespace("dynamo").component("backend").endpoint("generate")
    for path in ("dynamo.backend.generate", "dyn://dynamo.backend.generate"):
        endpoint = runtime.endpoint(path)
        assert (endpoint.namespace, endpoint.component, endpoint.name) == (
            "dynamo",
            "backend",
            "generate",
        )
        assert endpoint.path == chained.path
        assert endpoint.runtime is runtime


@pytest.mark.parametrize(
    "path",
    ["", "dynamo", "dynamo.backend", "a.b.c.d", "a..c", ".b.c", "a.b.", "dyn://a.b", "a/b/c"],
)
async def test_a_bad_path_is_refused(cluster: Cluster, path: str) -> None:
    with pytest.raises(ValueError, match=r"namespace\.component\.endpoint"):
        cluster.worker.endpoint(path)


async def test_names_invalid_for_the_chain_are_invalid_in_a_path(cluster: Cluster) -> None:
    with pytest.raises(ValueError, match="invalid component name"):
        cluster.worker.endpoint("dynamo. backend.generate")


async def test_serve_and_call_through_dotted_paths(cluster: Cluster) -> None:
    async def echo(request: Any) -> AsyncIterator[Any]:
        yield request

    endpoint = cluster.worker.endpoint("dynamo.backend.generate")
    await cluster.nursery.start(endpoint.serve_endpoint, echo)
    assert endpoint.connection_id() == cluster.worker.instance_id
    client = await cluster.caller.endpoint("dyn://dynamo.backend.generate").client()
    assert await client.wait_for_instances() == [cluster.worker.instance_id]
    assert [item.data() async for item in await client.generate("hi")] == ["hi"]


# ---------------------------------------------------------------------------- annotated


async def _annotated_handler(request: Any) -> AsyncIterator[Any]:
    yield {"n": 1}
    yield Annotated(None, event="ping", comment=["keep-alive"])  # annotations only: no data
    yield Annotated({"n": 2}, id="2", event="token")
    yield None  # a None item is data, not an annotation
    yield "last"


async def test_annotated_is_the_default_and_false_yields_the_data(cluster: Cluster) -> None:
    client = await cluster.serve(_annotated_handler)
    instance = cluster.worker.instance_id

    annotated = await client.generate({})
    assert type(annotated) is ResponseStream
    items = [item async for item in annotated]
    assert [item.data() for item in items] == [{"n": 1}, None, {"n": 2}, None, "last"]
    assert (items[1].event, items[1].comment) == ("ping", ["keep-alive"])
    assert items[1].comments() == ["keep-alive"] and not items[1].is_error()

    # Dynamo: annotated=False (or None) gives each item's data; annotation-only items are skipped.
    expected = [{"n": 1}, {"n": 2}, None, "last"]
    streams = [
        await client.generate({}, annotated=False),
        await client.generate({}, None),  # positional, as in Dynamo's signature
        await client.random({}, False),
        await client.round_robin({}, annotated=False),
        await client.direct({}, instance, False),
        await client.direct({}, instance, annotated=None, context=Context()),
    ]
    for stream in streams:
        assert isinstance(stream, DataStream)
        assert [data async for data in stream] == expected
    # annotated=True, explicitly and positionally.
    for stream in (
        await client.round_robin({}, True),
        await client.direct({}, instance, True, Context()),
    ):
        assert [item.data() async for item in stream] == [{"n": 1}, None, {"n": 2}, None, "last"]


async def test_a_call_with_a_stopped_context_still_sends_nothing_unannotated(
    cluster: Cluster,
) -> None:
    calls: list[Any] = []

    async def handler(request: Any) -> AsyncIterator[Any]:
        calls.append(request)
        yield request

    client = await cluster.serve(handler)
    ctx = Context()
    ctx.stop()
    stream = await client.generate("x", annotated=False, context=ctx)
    assert isinstance(stream, DataStream)
    assert [data async for data in stream] == []
    assert calls == []


async def test_closing_an_unannotated_stream_kills_the_work(cluster: Cluster) -> None:
    killed = trio.Event()

    async def handler(request: Any, context: Context) -> AsyncIterator[Any]:
        try:
            yield "first"
            await trio.sleep_forever()
        finally:
            if context.is_killed():
                killed.set()

    client = await cluster.serve(handler)
    async with await client.generate({}, annotated=False) as stream:
        assert await stream.__anext__() == "first"
    with trio.fail_after(30):  # a hang guard only
        await killed.wait()


# ---------------------------------------------------------------------------- metrics labels


async def test_worker_metrics_carry_worker_id_and_the_extra_labels(cluster: Cluster) -> None:
    async def handler(request: Any) -> AsyncIterator[Any]:
        yield request

    endpoint = cluster.worker.endpoint("dynamo.backend.generate")
    labels = [("model", "llama"), ("model_name", "meta/llama")]
    await cluster.nursery.start(
        endpoint.serve_endpoint,
        handler,
        True,
        labels,  # positional, as in Dynamo
    )
    client = await cluster.caller.endpoint("dynamo.backend.generate").client()
    await client.wait_for_instances()
    assert [item.data() async for item in await client.generate(1)] == [1]

    worker_id = f"{cluster.worker.instance_id:x}"
    expected = {
        "dynamo_namespace": "dynamo",
        "dynamo_component": "backend",
        "dynamo_endpoint": "generate",
        "worker_id": worker_id,
        "model": "llama",
        "model_name": "meta/llama",
    }
    registry = cluster.worker.registry
    assert metric_value(registry, "dynamo_component_requests_total", **expected) == 1
    assert metric_value(registry, "dynamo_component_cancellation_total", **expected) == 0
    from prometheus_client.exposition import generate_latest

    text = generate_latest(registry).decode()
    for line in text.splitlines():
        if line.startswith("dynamo_component_") and "{" in line:
            assert f'worker_id="{worker_id}"' in line and 'model="llama"' in line, line


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        ([("worker_id", "x")], "set by dynamo-trio"),
        ([("dynamo_namespace", "x")], "set by dynamo-trio"),
        ([("reason", "x")], "set by dynamo-trio"),
        ([("model", "a"), ("model", "b")], "twice"),
        ([("bad-name", "x")], "not a Prometheus label name"),
        ([("__reserved", "x")], "not a Prometheus label name"),
        ([("0model", "x")], "not a Prometheus label name"),
        ([("model", 1)], "strings"),
        ([("model",)], "pairs"),
    ],
)
async def test_invalid_metrics_labels_are_refused_before_serving(
    cluster: Cluster, labels: list[Any], message: str
) -> None:
    async def handler(request: Any) -> AsyncIterator[Any]:
        yield request

    endpoint = cluster.worker.endpoint("dynamo.backend.generate")
    with pytest.raises(ValueError, match=message):
        await endpoint.serve_endpoint(handler, metrics_labels=labels)
    assert await cluster.worker.discovery.get_prefix("v1/instances/") == {}
    # The endpoint can still be served, properly.
    await cluster.nursery.start(endpoint.serve_endpoint, handler)


# ---------------------------------------------------------------------------- graceful_shutdown


async def test_graceful_shutdown_false_kills_in_flight_requests_at_once(
    cluster: Cluster,
) -> None:
    events: dict[str, list[str]] = {"graceful": [], "abrupt": []}
    started = {name: trio.Event() for name in events}
    may_drain = trio.Event()  # set once the abrupt stream has ended

    def handler_for(name: str):
        async def handler(request: Any, context: Context) -> AsyncIterator[Any]:
            started[name].set()
            yield "started"
            try:
                await context.stopped()
                events[name].append(context.state.name)  # STOPPED, or KILLED at once
                await may_drain.wait()  # drains, if it is allowed to
                yield "drained"
            finally:
                events[name].append("killed" if context.is_killed() else "ended")

        return handler

    # Graces far longer than the hang guard: a stream that ended within it was not
    # killed at a grace's end, and the one held in its drain cannot be either.
    patient = dataclasses.replace(
        TEST_CONFIG, worker=WorkerConfig(drain_grace=60.0, shutdown_grace=60.0)
    )
    with trio.fail_after(30):  # a hang guard only
        async with DistributedRuntime(patient, memory_store=cluster.store) as worker:
            for name, graceful in (("graceful", True), ("abrupt", False)):
                endpoint = worker.endpoint(f"dynamo.{name}.generate")
                await cluster.nursery.start(endpoint.serve_endpoint, handler_for(name), graceful)
            clients = {
                name: await cluster.caller.endpoint(f"dynamo.{name}.generate").client()
                for name in events
            }
            for client in clients.values():
                await client.wait_for_instances()
            streams = {name: await clients[name].generate({}) for name in events}
            for name, stream in streams.items():
                assert (await stream.__anext__()).data() == "started"
                await started[name].wait()

            worker.shutdown()
            with pytest.raises(EngineShutdown):
                async for _ in streams["abrupt"]:
                    pass
            # Ended while the graceful one is still held in its drain: killed at once.
            assert events == {"graceful": ["STOPPED"], "abrupt": ["KILLED", "killed"]}
            may_drain.set()
            assert await drain_cut_by_shutdown(streams["graceful"]) == ["drained"]
    assert events == {"graceful": ["STOPPED", "ended"], "abrupt": ["KILLED", "killed"]}


def test_dynamo_worker_accepts_dynamos_deprecated_enable_nats() -> None:
    from dynamo_trio import dynamo_worker

    with pytest.warns(DeprecationWarning, match="enable_nats"):
        decorate = dynamo_worker(enable_nats=False)
    assert callable(decorate)


async def test_a_context_passed_where_annotated_goes_is_refused(cluster: Cluster) -> None:
    async def handler(request: Any) -> AsyncIterator[Any]:
        yield request

    client = await cluster.serve(handler)
    ctx = Context()
    for call in (
        lambda: client.generate({}, ctx),  # type: ignore[call-overload]
        lambda: client.round_robin({}, ctx),  # type: ignore[call-overload]
        lambda: client.direct({}, cluster.worker.instance_id, ctx),  # type: ignore[call-overload]
    ):
        with pytest.raises(TypeError, match="context="):
            await call()
    assert ctx.children == ()


# ---------------------------------------------------------------------------- abort pattern


class _BackgroundEngine:
    """An engine that generates in the background, as vLLM's does: each request runs in
    the engine's own task until it finishes or is aborted, whether or not anyone reads."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        self.running: dict[str, trio.CancelScope] = {}
        self.aborted: list[str] = []
        self.idle = trio.Event()
        self._outputs: dict[str, list[_Output]] = {}
        self._more = trio.Event()

    async def generate(self, prompt: str, request_id: str) -> AsyncGenerator[_Output, None]:
        self.running[request_id] = scope = trio.CancelScope()
        outputs: list[_Output] = []
        self._outputs[request_id] = outputs
        self._nursery.start_soon(self._run, request_id, scope)
        taken = 0
        while True:
            while taken < len(outputs):
                taken += 1
                yield outputs[taken - 1]
            await self._more.wait()

    async def _run(self, request_id: str, scope: trio.CancelScope) -> None:
        with scope:
            for i in range(10**6):
                await trio.sleep(0.001)
                self._outputs[request_id].append(_Output(f"t{i}", finished=False))
                self._more.set()
                self._more = trio.Event()
        self.running.pop(request_id, None)
        if not self.running:
            self.idle.set()

    async def abort(self, request_id: str) -> None:
        await trio.sleep(0.001)  # an abort takes a moment: a kill must not cancel it
        self.aborted.append(request_id)
        scope = self.running.get(request_id)
        if scope is not None:
            scope.cancel()


class _Output:
    def __init__(self, text: str, *, finished: bool) -> None:
        self.text = text
        self.finished = finished


def _aborting_handler(engine: _BackgroundEngine):
    """The handler of docs/cancellation.md, "An engine with an abort hook", verbatim."""

    async def generate(request: Any, context: Context) -> AsyncIterator[Any]:
        request_id = context.id()
        outputs = engine.generate(request["prompt"], request_id)
        finished = False
        try:
            async for output in outputs:
                if context.is_stopped():  # a stop: end early, say so, let the finally abort
                    yield {"text": "", "finish_reason": "cancelled"}
                    return
                yield {"text": output.text}
                finished = output.finished
        finally:
            with trio.CancelScope(shield=True):  # a kill must not cancel the clean-up
                await outputs.aclose()
                if not finished:
                    await engine.abort(request_id)

    return generate


@pytest.mark.parametrize("how", ["kill", "stop", "enclosing timeout", "closed stream"])
async def test_the_documented_abort_pattern_leaves_nothing_in_the_engine(
    cluster: Cluster, how: str
) -> None:
    engine = _BackgroundEngine(cluster.nursery)
    client = await cluster.serve(_aborting_handler(engine))
    ctx = Context()
    items: list[Any] = []

    async def call() -> None:
        async with ctx.scope():
            stream = await client.generate({"prompt": "hi"}, annotated=False, context=ctx)
            async for item in stream:
                items.append(item)
                if len(items) == 3:
                    if how == "kill":
                        ctx.kill()
                    elif how == "stop":
                        ctx.stop_generating()
                    elif how == "closed stream":
                        await stream.aclose()
                        return
                    else:
                        await trio.sleep_forever()

    with trio.move_on_after(5 if how != "enclosing timeout" else 0.2):
        await call()
    with trio.fail_after(30):  # a hang guard only
        await cluster.worker._wait_idle()
        await engine.idle.wait()
    assert engine.aborted == [ctx.id()]
    assert len(items) >= 3
    if how == "stop":
        assert items[-1] == {"text": "", "finish_reason": "cancelled"}
