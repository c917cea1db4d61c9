"""Calling endpoints: items, routing, typed errors, cancellation in every form (SPEC §2-§3)."""

from __future__ import annotations

import gc
import time
from typing import TYPE_CHECKING, Any

import pytest
import trio
import trio.testing

from dynamo_trio import (
    CancelReason,
    ConnectionTimeout,
    Context,
    EngineShutdown,
    InvalidArgument,
    NoInstances,
    StreamIncomplete,
    Unknown,
)
from dynamo_trio.runtime import Annotated

from .conftest import Cluster, metric_value

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


class Recorder:
    """Records what a handler saw, so tests can wait for and assert on it."""

    def __init__(self) -> None:
        self.contexts: list[Context] = []
        self.exits: list[tuple[str, str | None, str]] = []
        self.started = trio.Event()
        self.exited = trio.Event()

    def enter(self, context: Context) -> None:
        self.contexts.append(context)
        self.started.set()

    def exit(self, context: Context, how: str) -> None:
        self.exits.append(
            (context.state.name, context.reason.value if context.reason else None, how)
        )
        self.exited.set()

    async def wait_exit(self, within: float = 30.0) -> tuple[str, str | None, str]:
        """The handler's last exit, once it has exited (``within``: a hang guard only)."""
        with trio.fail_after(within):
            await self.exited.wait()
        return self.exits[-1]


def counting_handler(recorder: Recorder, period: float = 0.005):
    """Yields {"i": n} every ``period`` until asked to stop, then one final item."""

    async def handler(request: dict[str, Any], context: Context) -> AsyncIterator[Any]:
        recorder.enter(context)
        how = "returned"
        try:
            for i in range(request.get("n", 10**9)):
                if context.is_stopped():
                    yield {"final": True, "after": i}
                    return
                await trio.sleep(period)
                yield {"i": i}
        except trio.Cancelled:
            how = "cancelled"
            raise
        except GeneratorExit:
            how = "closed"
            raise
        finally:
            recorder.exit(context, how)

    return handler


async def _collect(stream: Any) -> tuple[list[Any], Exception | None]:
    """The items of a stream and the error that ended it, if any."""
    items = []
    try:
        async for item in stream:
            items.append(item.data())
    except Exception as exc:
        return items, exc
    return items, None


# ---------------------------------------------------------------------------- plain calls


async def test_items_flow_and_the_stream_completes(cluster: Cluster) -> None:
    recorder = Recorder()
    client = await cluster.serve(counting_handler(recorder, 0))
    stream = await client.generate({"n": 5})
    assert [item.data() async for item in stream] == [{"i": i} for i in range(5)]
    assert stream.outcome == "complete"
    assert stream.instance_id == cluster.worker.instance_id


async def test_context_is_passed_only_if_the_handler_asks(cluster: Cluster) -> None:
    seen: list[Any] = []

    async def without_context(request: Any) -> AsyncIterator[Any]:
        seen.append(request)
        yield "ok"

    client = await cluster.serve(without_context)
    assert [i.data() async for i in await client.generate({"x": 1})] == ["ok"]
    assert seen == [{"x": 1}]


async def test_the_request_id_is_shared_end_to_end(cluster: Cluster) -> None:
    recorder = Recorder()
    client = await cluster.serve(counting_handler(recorder, 0))
    ctx = Context("user-request-42")
    stream = await client.generate({"n": 1}, context=ctx)
    async for _ in stream:
        pass
    assert recorder.contexts[0].id() == "user-request-42"
    assert stream.context.id() == "user-request-42"
    assert ctx.children == ()  # the finished call unlinked itself


async def test_annotated_items_keep_their_annotations(cluster: Cluster) -> None:
    async def handler(request: Any) -> AsyncIterator[Any]:
        yield Annotated({"a": 1}, id="7", event="delta", comment=["hello"])
        yield 2

    client = await cluster.serve(handler)
    items = [item async for item in await client.generate(None)]
    assert items == [Annotated({"a": 1}, id="7", event="delta", comment=["hello"]), Annotated(2)]


async def test_round_robin_alternates_and_direct_targets(cluster: Cluster) -> None:
    from dynamo_trio.runtime import DistributedRuntime

    from .conftest import TEST_CONFIG

    async def whoami(request: Any, context: Context) -> AsyncIterator[Any]:
        yield request

    async with DistributedRuntime(TEST_CONFIG, memory_store=cluster.store) as second:
        client = await cluster.serve(whoami)
        await cluster.serve(whoami, runtime=second)
        ids = client.instance_ids()
        assert sorted(ids) == sorted([cluster.worker.instance_id, second.instance_id])
        served = []
        for _ in range(6):
            stream = await client.round_robin("x")
            async for _item in stream:
                pass
            served.append(stream.instance_id)
        assert served[0::2] == [served[0]] * 3
        assert served[1::2] == [served[1]] * 3
        assert served[0] != served[1]
        stream = await client.direct("x", second.instance_id)
        async for _item in stream:
            pass
        assert stream.instance_id == second.instance_id
        with pytest.raises(NoInstances):
            await client.direct("x", 12345)
        second.shutdown()


async def test_no_instances_is_a_typed_error(cluster: Cluster) -> None:
    client = await cluster.caller.namespace("dynamo").component("nobody").endpoint("here").client()
    with pytest.raises(NoInstances):
        await client.generate({})


# ---------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("exception", "error_type", "caused_by"),
    [
        (ValueError("bad prompt"), InvalidArgument, "ValueError"),
        (TypeError("not a str"), InvalidArgument, "TypeError"),
        (TimeoutError("engine timed out"), ConnectionTimeout, "TimeoutError"),
        (RuntimeError("boom"), Unknown, "RuntimeError"),
        (EngineShutdown("draining"), EngineShutdown, None),
    ],
)
async def test_handler_exceptions_become_typed_errors(
    cluster: Cluster, exception: Exception, error_type: type[Exception], caused_by: str | None
) -> None:
    async def handler(request: Any) -> AsyncIterator[Any]:
        yield "first"
        raise exception

    client = await cluster.serve(handler)
    items, raised = await _collect(await client.generate({}))
    assert items == ["first"]
    assert isinstance(raised, error_type)
    assert str(exception) in str(raised)
    assert getattr(raised, "caused_by", None) == caused_by
    # Only that stream ended: the worker serves the next call the same way.
    again, raised_again = await _collect(await client.generate({}))
    assert again == ["first"]
    assert isinstance(raised_again, error_type)
    assert (
        metric_value(
            cluster.worker.registry,
            "dynamo_component_errors_total",
            error_type=raised.error_type,  # type: ignore[attr-defined]
        )
        == 2
    )


async def test_unsendable_items_are_an_invalid_argument(cluster: Cluster) -> None:
    async def handler(request: Any) -> AsyncIterator[Any]:
        yield {"fine": True}
        yield object()

    client = await cluster.serve(handler)
    stream = await client.generate({})
    with pytest.raises(InvalidArgument, match="cannot encode"):
        async for _ in stream:
            pass


async def test_a_handler_that_is_not_a_generator_is_an_error(cluster: Cluster) -> None:
    async def coroutine_handler(request: Any) -> Any:
        return "nope"

    client = await cluster.serve(coroutine_handler)
    with pytest.raises(InvalidArgument, match="async generator"):
        async for _ in await client.generate({}):
            pass


async def test_a_self_stopped_handler_ends_cleanly_and_stays_in_rotation(
    cluster: Cluster,
) -> None:
    async def handler(request: Any, context: Context) -> AsyncIterator[Any]:
        yield 1
        yield 2
        context.stop_generating()
        yield "last"

    client = await cluster.serve(handler)
    for _ in range(2):
        stream = await client.generate({})
        assert [i.data() async for i in stream] == [1, 2, "last"]
        assert stream.outcome == "stopped"
    assert client.live_instance_ids()  # not taken out of rotation
    assert metric_value(cluster.worker.registry, "dynamo_component_cancellation_total") == 0


# ---------------------------------------------------------------------------- stop


async def test_stop_drains_and_ends_with_a_terminal_frame(cluster: Cluster) -> None:
    recorder = Recorder()
    client = await cluster.serve(counting_handler(recorder))
    ctx = Context()
    stream = await client.generate({}, context=ctx)
    received = []
    with trio.fail_after(30):  # a hang guard only
        async for item in stream:
            received.append(item.data())
            if len(received) == 3:
                ctx.stop_generating()
    assert received[-1]["final"] is True  # the handler's drain output was delivered
    assert stream.outcome == "stopped"
    state, reason, how = await recorder.wait_exit()
    assert (state, reason, how) == ("STOPPED", "stop requested", "returned")
    assert not recorder.contexts[0].is_killed()


async def test_a_call_with_a_stopped_context_sends_nothing(cluster: Cluster) -> None:
    recorder = Recorder()
    client = await cluster.serve(counting_handler(recorder))
    for cancel in (Context.stop, Context.kill):
        ctx = Context()
        cancel(ctx)
        stream = await client.generate({}, context=ctx)
        assert [i async for i in stream] == []
        assert stream.instance_id is None
    # A call after them, answered: had either sent anything, it would have come first.
    after = Context()
    assert len([i async for i in await client.generate({"n": 1}, context=after)]) == 1
    assert [context.id() for context in recorder.contexts] == [after.id()]
    assert metric_value(cluster.worker.registry, "dynamo_component_requests_total") == 1


async def test_a_stop_with_drain_grace_escalates_to_kill(cluster: Cluster) -> None:
    recorder = Recorder()

    async def stubborn(request: Any, context: Context) -> AsyncIterator[Any]:
        recorder.enter(context)
        try:
            yield "started"
            await trio.sleep_forever()  # ignores the stop
        finally:
            recorder.exit(context, "finally")

    client = await cluster.serve(stubborn)
    ctx = Context()
    stream = await client.generate({}, context=ctx)

    async def read() -> None:
        async for _ in stream:
            ctx.stop()

    with pytest.raises(StreamIncomplete, match=r"cut the drain short \(drain timeout\)"):
        await read()
    assert stream.outcome == "killed" and stream.end_reason == "drain timeout"
    state, reason, _ = await recorder.wait_exit()
    assert (state, reason) == ("KILLED", "drain timeout")


async def test_a_handler_that_stops_its_own_work_ends_cleanly(cluster: Cluster) -> None:
    async def self_stopping(request: Any, context: Context) -> AsyncIterator[Any]:
        yield 1
        context.stop()
        yield {"finish_reason": "cancelled"}

    client = await cluster.serve(self_stopping)
    stream = await client.generate({})
    assert [item.data() async for item in stream] == [1, {"finish_reason": "cancelled"}]
    assert (stream.outcome, stream.end_reason) == ("stopped", "stop requested")


# ---------------------------------------------------------------------------- kill


async def test_kill_cancels_a_handler_blocked_in_an_await(cluster: Cluster) -> None:
    recorder = Recorder()

    async def silent(request: Any, context: Context) -> AsyncIterator[Any]:
        recorder.enter(context)
        try:
            await trio.sleep_forever()  # a long prefill: never yields
            yield "never"
        finally:
            recorder.exit(context, "finally")

    client = await cluster.serve(silent)
    ctx = Context()
    stream = await client.generate({}, context=ctx)
    await recorder.started.wait()
    ctx.kill(CancelReason.CLIENT_DISCONNECT)
    assert [i async for i in stream] == []
    state, reason, _ = await recorder.wait_exit()
    assert (state, reason) == ("KILLED", "client disconnect")


async def test_kill_while_the_handler_is_yielding(cluster: Cluster) -> None:
    recorder = Recorder()
    client = await cluster.serve(counting_handler(recorder, 0))
    ctx = Context()
    stream = await client.generate({}, context=ctx)
    async for item in stream:
        if item.data()["i"] == 10:
            ctx.kill()
    state, reason, how = await recorder.wait_exit()
    assert (state, reason) == ("KILLED", "kill requested")
    assert how in {"cancelled", "closed"}  # cancelled in an await, or closed at a yield


@pytest.mark.parametrize("how", ["aclose", "async_with", "scope_cancelled", "dropped"])
async def test_leaving_a_stream_early_kills_the_remote_work(cluster: Cluster, how: str) -> None:
    recorder = Recorder()

    async def silent_after_one(request: Any, context: Context) -> AsyncIterator[Any]:
        recorder.enter(context)
        try:
            yield "one"
            await trio.sleep_forever()
        finally:
            recorder.exit(context, "finally")

    client = await cluster.serve(silent_after_one)
    if how == "aclose":
        stream = await client.generate({})
        await stream.__anext__()
        await stream.aclose()
    elif how == "async_with":
        async with await client.generate({}) as stream:
            async for _ in stream:
                break
    elif how == "scope_cancelled":
        with trio.CancelScope() as scope:
            async for _ in await client.generate({}):
                scope.deadline = trio.current_time()  # times out once the stream has begun
    else:
        stream = await client.generate({})
        await stream.__anext__()
        del stream
        gc.collect()
    state, reason, _ = await recorder.wait_exit()
    # A consumer whose scope timed out abandons the stream for that reason.
    expected = "scope timeout" if how == "scope_cancelled" else "stream closed"
    assert (state, reason) == ("KILLED", expected)


async def test_a_batch_wait_cancelled_with_keep_if_cancelled_leaves_the_call_running(
    cluster: Cluster,
) -> None:
    recorder = Recorder()
    client = await cluster.serve(counting_handler(recorder, 0.02))
    async with await client.generate({"n": 6}) as stream:
        # Cancelled while it waits, before the first item: only the wait ends.
        with trio.CancelScope() as waiting:
            async with trio.open_nursery() as nursery:

                async def cancel_once_waiting() -> None:
                    await trio.testing.wait_all_tasks_blocked()
                    waiting.cancel()

                nursery.start_soon(cancel_once_waiting)
                await stream.receive_batch(keep_if_cancelled=True)
        assert waiting.cancelled_caught
        assert not stream.done
        items = []
        while batch := await stream.receive_batch():
            items.extend(batch)
    assert items == [{"i": i} for i in range(6)]
    assert stream.outcome == "complete"
    assert recorder.exits == [("LIVE", None, "returned")]  # never killed


async def test_a_nudge_ends_a_batch_wait_with_nothing_and_the_stream_goes_on(
    cluster: Cluster,
) -> None:
    recorder = Recorder()
    client = await cluster.serve(counting_handler(recorder, 0.05))
    async with await client.generate({"n": 3}) as stream:
        stream.nudge()  # before the wait: the next wait ends at once
        assert await stream.receive_batch() == []
        assert not stream.done
        async with trio.open_nursery() as nursery:
            nudged = trio.Event()

            async def nudge_soon() -> None:
                await trio.sleep(0.01)
                stream.nudge()
                nudged.set()

            nursery.start_soon(nudge_soon)
            assert await stream.receive_batch() == []
            assert nudged.is_set()
        items = []
        while (batch := await stream.receive_batch()) or not stream.done:
            items.extend(batch)
    assert items == [{"i": i} for i in range(3)]
    assert stream.outcome == "complete"


# ---------------------------------------------------------------------------- chains


async def test_a_chain_forwards_stop_and_kill_with_one_id(cluster: Cluster) -> None:
    backend_recorder = Recorder()
    backend = await cluster.serve(counting_handler(backend_recorder), "dynamo/backend/generate")
    middle_contexts: list[Context] = []

    async def middle(request: Any, context: Context) -> AsyncIterator[Any]:
        middle_contexts.append(context)
        async for item in await backend.generate(request, context=context):
            yield item.data()

    middle_client = await cluster.serve(middle, "dynamo/middle/generate")
    ctx = Context("chain-1")
    stream = await middle_client.generate({}, context=ctx)
    received = []
    with trio.fail_after(30):  # a hang guard only
        async for item in stream:
            received.append(item.data())
            if len(received) == 3:
                ctx.stop_generating()
    state, reason, _ = await backend_recorder.wait_exit()
    assert (state, reason) == ("STOPPED", "stop requested")
    assert received[-1]["final"] is True  # the backend's drain output came back through the middle
    assert backend_recorder.contexts[0].id() == middle_contexts[0].id() == "chain-1"

    backend_recorder.exited = trio.Event()
    ctx = Context("chain-2")
    stream = await middle_client.generate({}, context=ctx)
    async for _ in stream:
        ctx.kill(CancelReason.CLIENT_DISCONNECT)
    state, reason, _ = await backend_recorder.wait_exit()
    assert (state, reason) == ("KILLED", "client disconnect")
    assert middle_contexts[1].is_killed()


# ---------------------------------------------------------------------------- deadlines and flow


async def test_the_deadline_travels_to_the_worker(cluster: Cluster) -> None:
    recorder = Recorder()

    async def silent(request: Any, context: Context) -> AsyncIterator[Any]:
        recorder.enter(context)
        try:
            await trio.sleep_forever()
            yield "never"
        finally:
            recorder.exit(context, "finally")

    client = await cluster.serve(silent)
    ctx = Context(timeout=0.3)
    stream = await client.generate({}, context=ctx)
    await recorder.started.wait()
    remaining = recorder.contexts[0].time_remaining()
    assert remaining is not None
    assert 0 < remaining <= 0.3
    with trio.fail_after(30):  # a hang guard only
        assert [i async for i in stream] == []
    assert ctx.reason is CancelReason.DEADLINE
    state, reason, _ = await recorder.wait_exit()
    assert (state, reason) == ("KILLED", "deadline")


async def test_a_slow_consumer_slows_only_its_own_handler(cluster: Cluster) -> None:
    produced = {"slow": 0}

    async def firehose(request: Any) -> AsyncIterator[Any]:
        for i in range(request["n"]):
            if request["name"] == "slow":
                produced["slow"] = i + 1
            yield i

    client = await cluster.serve(firehose)
    slow = await client.generate({"name": "slow", "n": 100_000})
    await slow.__anext__()
    await trio.sleep(0.2)  # the slow consumer sits on its stream
    window = cluster.caller.config.request_plane.stream_window
    assert produced["slow"] <= window + 2  # bounded by credits, not by the worker's memory
    with trio.fail_after(30):  # a hang guard only
        fast = await client.generate({"name": "fast", "n": 5000})
        assert len([i async for i in fast]) == 5000  # same connection, not stalled
    await slow.aclose()


# ---------------------------------------------------------------------------- metrics


async def test_cancellations_are_counted_exactly_once(cluster: Cluster) -> None:
    recorder = Recorder()
    client = await cluster.serve(counting_handler(recorder, 0.001))
    registry = cluster.worker.registry
    labels = {"dynamo_namespace": "dynamo", "dynamo_component": "backend"}
    for _ in range(300):
        async for _ in await client.generate({"n": 2}):
            pass
    assert metric_value(registry, "dynamo_component_requests_total", **labels) == 300
    assert metric_value(registry, "dynamo_component_cancellation_total", **labels) == 0
    for cancel in ("stop", "kill", "stop_then_kill", "aclose"):
        ctx = Context()
        stream = await client.generate({}, context=ctx)
        await stream.__anext__()
        if cancel == "stop":
            ctx.stop()
            async for _ in stream:
                pass
        elif cancel == "kill":
            ctx.kill()
        elif cancel == "stop_then_kill":
            ctx.stop()
            ctx.kill()
        else:
            await stream.aclose()
    with trio.fail_after(30):  # a hang guard only
        await cluster.worker._wait_idle()
    assert metric_value(registry, "dynamo_component_inflight_requests", **labels) == 0
    assert metric_value(registry, "dynamo_component_cancellation_total", **labels) == 4


async def test_a_local_stall_longer_than_the_heartbeat_timeout_is_not_a_dead_peer(
    cluster: Cluster,
) -> None:
    async def ticker(request: Any) -> AsyncIterator[Any]:
        for i in range(20):
            await trio.sleep(0.01)
            yield i

    client = await cluster.serve(ticker)
    stream = await client.generate({})
    await stream.__anext__()
    timeout = cluster.caller.config.request_plane.heartbeat_timeout
    time.sleep(timeout * 2.5)  # noqa: ASYNC251 - deliberately block the whole event loop
    assert len([item async for item in stream]) == 19
    assert client.live_instance_ids()  # nobody was declared dead
