"""Structured cancellation across the request plane, with both runtimes in one process.

Three rules, each checked against a real handler behind real TCP:

1. whatever cancels a context's scope (its kill, its deadline, an enclosing
   trio scope, a failed sibling) reaches the remote work linked under it, with
   a reason that says which;
2. leaving a context's scope ends the remote work still linked under it, at
   once (never at garbage collection);
3. a handler can end its request, never its worker: whatever it raises,
   BaseException included, ends that one stream, counted once.

The same rules across real processes live in ``tests/e2e/test_structured.py``.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import pytest
import trio
import trio.testing

from dynamo_trio import Cancelled, CancelReason, Context, EngineShutdown, Unknown

from .._streams import drain_cut_by_shutdown
from .conftest import Cluster, metric_value
from .test_calls import Recorder, counting_handler

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from dynamo_trio.runtime import Client


def silent_handler(recorder: Recorder):
    """Yields once, then waits for ever (a long prefill); records how it ended."""

    async def handler(request: Any, context: Context) -> AsyncIterator[Any]:
        recorder.enter(context)
        try:
            yield "first"
            await trio.sleep_forever()
        finally:
            recorder.exit(context, "finally")

    return handler


async def _settled(cluster: Cluster) -> None:
    """Every request on the worker has finished (its terminal frame and metrics are done)."""
    with trio.fail_after(30):  # a hang guard only
        await cluster.worker._wait_idle()


async def _first_item(client: Client, parent: Context, keep: list[Any]) -> None:
    stream = await client.generate({}, context=parent)
    keep.append(stream)  # referenced: only the scope can end it, never the GC
    await stream.__anext__()


# ---------------------------------------------------------------------------- rule 1


async def test_an_enclosing_timeout_kills_the_parent_and_the_remote_work(
    cluster: Cluster,
) -> None:
    recorder = Recorder()
    client = await cluster.serve(silent_handler(recorder))
    parent, keep = Context(), list[Any]()
    with trio.CancelScope() as timeout:
        async with parent.scope():
            await _first_item(client, parent, keep)
            timeout.deadline = trio.current_time()
            await trio.sleep_forever()  # something_else(): the deadline strikes here
    assert timeout.cancelled_caught
    assert parent.is_killed() and parent.reason is CancelReason.SCOPE_TIMEOUT
    # Though the stream object is still alive and its connection healthy (heartbeats
    # flow): the kill frame is the only way the worker can learn, and its reason says so.
    state, reason, _ = await recorder.wait_exit()
    assert (state, reason) == ("KILLED", "scope timeout")
    assert keep[0].outcome == "killed"
    await _settled(cluster)
    labels = {"dynamo_endpoint": "generate", "reason": "scope timeout"}
    assert metric_value(cluster.worker.registry, "dynamo_component_cancellation_total") == 1
    assert (
        metric_value(cluster.worker.registry, "dynamo_component_cancelled_requests_total", **labels)
        == 1
    )


async def test_an_enclosing_cancel_scope_kills_the_remote_work(cluster: Cluster) -> None:
    recorder = Recorder()
    client = await cluster.serve(silent_handler(recorder))
    parent, keep = Context(), list[Any]()

    async def work() -> None:
        async with parent.scope():
            await _first_item(client, parent, keep)
            await trio.sleep_forever()

    with trio.CancelScope() as outer:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(work)
            await recorder.started.wait()
            await trio.testing.wait_all_tasks_blocked()
            outer.cancel()
    state, reason, _ = await recorder.wait_exit()
    assert (state, reason) == ("KILLED", "scope cancelled")
    assert parent.reason is CancelReason.SCOPE_CANCELLED


async def test_a_failed_sibling_kills_the_remote_work_of_its_nursery(cluster: Cluster) -> None:
    recorder = Recorder()
    client = await cluster.serve(silent_handler(recorder))
    parent, keep = Context(), list[Any]()

    async def work() -> None:
        async with parent.scope():
            await _first_item(client, parent, keep)
            await trio.sleep_forever()

    async def fail_once_started() -> None:
        await recorder.started.wait()
        await trio.testing.wait_all_tasks_blocked()
        raise ValueError("a sibling failed")

    with pytest.RaisesGroup(ValueError):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(work)
            nursery.start_soon(fail_once_started)
    state, reason, _ = await recorder.wait_exit()
    assert (state, reason) == ("KILLED", "scope cancelled")


async def test_the_contexts_own_deadline_kills_the_remote_work(cluster: Cluster) -> None:
    recorder = Recorder()
    client = await cluster.serve(silent_handler(recorder))
    parent, keep = Context(timeout=0.3), list[Any]()
    async with parent.scope():
        await _first_item(client, parent, keep)
        await trio.sleep_forever()
    assert parent.reason is CancelReason.DEADLINE
    state, reason, _ = await recorder.wait_exit()
    assert (state, reason) == ("KILLED", "deadline")


async def test_a_middle_hop_forwards_an_enclosing_timeout_down_the_chain(
    cluster: Cluster,
) -> None:
    # client -> middle -> backend, where the *middle* handler bounds its own
    # sub-work with a trio timeout around a scope of its incoming context.
    backend_recorder = Recorder()
    backend = await cluster.serve(silent_handler(backend_recorder), "dynamo/backend/generate")

    async def middle(request: Any, context: Context) -> AsyncIterator[Any]:
        sub = Context(context.id())
        context.link_child(sub)
        first = []
        with trio.CancelScope() as timeout:
            async with sub.scope():  # never yield inside a scope: collect, then yield
                stream = await backend.generate(request, context=sub)
                first.append((await stream.__anext__()).data())
                timeout.deadline = trio.current_time()
                await trio.sleep_forever()  # the deadline strikes here
        yield first[0]
        yield f"sub-work {sub.reason}"

    middle_client = await cluster.serve(middle, "dynamo/middle/generate")
    ctx = Context("chain-1")
    items = [i.data() async for i in await middle_client.generate({}, context=ctx)]
    assert items == ["first", "sub-work scope timeout"]
    state, reason, _ = await backend_recorder.wait_exit()
    assert (state, reason) == ("KILLED", "scope timeout")
    assert backend_recorder.contexts[0].id() == "chain-1"


# ---------------------------------------------------------------------------- rule 2


async def test_leaving_the_scope_kills_the_remote_work_still_open(cluster: Cluster) -> None:
    recorder = Recorder()
    client = await cluster.serve(silent_handler(recorder))
    parent, keep = Context(), list[Any]()
    async with parent.scope():
        await _first_item(client, parent, keep)
    assert not parent.is_stopped()  # a normal exit is not a cancellation of the parent
    state, reason, _ = await recorder.wait_exit()  # by its kill frame (see rule 1)
    assert (state, reason) == ("KILLED", "parent finished")
    assert keep[0].outcome == "killed"
    await _settled(cluster)
    assert metric_value(cluster.worker.registry, "dynamo_component_cancellation_total") == 1


async def test_a_completed_call_is_not_killed_when_the_scope_ends(cluster: Cluster) -> None:
    recorder = Recorder()
    client = await cluster.serve(counting_handler(recorder, 0))
    parent = Context()
    async with parent.scope():
        stream = await client.generate({"n": 3}, context=parent)
        assert [i.data() async for i in stream] == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert stream.outcome == "complete"
    assert await recorder.wait_exit() == ("LIVE", None, "returned")
    await _settled(cluster)
    assert metric_value(cluster.worker.registry, "dynamo_component_cancellation_total") == 0


@pytest.mark.parametrize(("kept", "reason"), [(True, "parent finished"), (False, "stream closed")])
async def test_a_handler_that_returns_early_ends_its_sub_calls(
    cluster: Cluster, kept: bool, reason: str
) -> None:
    backend_recorder = Recorder()
    backend = await cluster.serve(silent_handler(backend_recorder), "dynamo/backend/generate")
    elsewhere: list[Any] = []

    async def middle(request: Any, context: Context) -> AsyncIterator[Any]:
        stream = await backend.generate(request, context=context)
        if kept:
            elsewhere.append(stream)  # still referenced: only the scope's end can end it
        yield (await stream.__anext__()).data()
        # returns with the sub-call still open: dropped with the handler's frame, or
        # ended by the handler's scope

    middle_client = await cluster.serve(middle, "dynamo/middle/generate")
    assert [i.data() async for i in await middle_client.generate({})] == ["first"]
    state, got, _ = await backend_recorder.wait_exit()
    assert (state, got) == ("KILLED", reason)


async def test_a_call_with_a_finished_context_sends_nothing(cluster: Cluster) -> None:
    recorder = Recorder()
    client = await cluster.serve(counting_handler(recorder))
    parent = Context()
    async with parent.scope():
        pass
    stream = await client.generate({}, context=parent)
    assert [i async for i in stream] == []
    # A call after it, answered: had the first sent anything, it would have come first.
    after = Context()
    assert len([i async for i in await client.generate({"n": 1}, context=after)]) == 1
    assert [context.id() for context in recorder.contexts] == [after.id()]


# ---------------------------------------------------------------------------- rule 3


class Bespoke(BaseException):
    """A BaseException subclass of the handler's own."""


async def _raising_after_stop(client: Client, exception: BaseException) -> list[Any]:
    ctx = Context()
    received = []
    with trio.fail_after(30):  # a hang guard only
        async for item in await client.generate({}, context=ctx):
            received.append(item.data())
            if len(received) == 2:
                ctx.stop_generating()
    return received


def _seed_handler(recorder: Recorder):
    """The seed's own handler: raises asyncio.CancelledError once it sees a stop."""

    async def generate(request: Any, context: Context) -> AsyncIterator[Any]:
        recorder.enter(context)
        try:
            for i in range(1000):
                if context.is_stopped():
                    raise asyncio.CancelledError
                await trio.sleep(0.005)
                yield i
        finally:
            recorder.exit(context, "finally")

    return generate


async def _still_serving(cluster: Cluster, client: Client, other: Any) -> None:
    """The worker kept serving: another stream flows, the instance is still registered."""
    with trio.fail_after(30):  # a hang guard only
        await other.__anext__()
        await other.__anext__()
    assert cluster.worker.instance_id in client.instance_ids()
    assert not cluster.worker.shutting_down


async def test_the_seeds_cancelled_error_after_a_stop_ends_only_its_request(
    cluster: Cluster,
) -> None:
    recorder = Recorder()
    client = await cluster.serve(_seed_handler(recorder))
    other = await client.generate({})  # in flight on the same worker and connection
    await other.__anext__()
    received = await _raising_after_stop(client, asyncio.CancelledError())
    assert received[:2] == [0, 1]
    assert recorder.exits[0][:2] == ("STOPPED", "stop requested")
    await _still_serving(cluster, client, other)
    await other.aclose()
    await _settled(cluster)
    # The stopped request and the closed one: each counted once, nothing else.
    assert metric_value(cluster.worker.registry, "dynamo_component_cancellation_total") == 2
    assert metric_value(cluster.worker.registry, "dynamo_component_errors_total") == 0


@pytest.mark.parametrize(
    ("exception", "error_type", "caused_by"),
    [
        (asyncio.CancelledError(), Cancelled, "CancelledError"),
        (GeneratorExit(), EngineShutdown, "GeneratorExit"),
        (Bespoke("custom"), Unknown, "Bespoke"),
    ],
)
async def test_a_live_handler_raising_a_base_exception_ends_only_its_request(
    cluster: Cluster, exception: BaseException, error_type: type[Exception], caused_by: str
) -> None:
    async def handler(request: Any) -> AsyncIterator[Any]:
        if request == "raise":
            yield "first"
            raise exception
        while True:
            await trio.sleep(0.005)
            yield "tick"

    client = await cluster.serve(handler)
    other = await client.generate("tick")
    await other.__anext__()
    stream = await client.generate("raise")
    assert (await stream.__anext__()).data() == "first"
    with pytest.raises(error_type) as raised:
        await stream.__anext__()
    assert raised.value.caused_by == caused_by  # type: ignore[attr-defined]
    await _still_serving(cluster, client, other)
    await other.aclose()


async def test_a_stale_trio_cancelled_from_a_handler_is_contained(cluster: Cluster) -> None:
    async def handler(request: Any, context: Context) -> AsyncIterator[Any]:
        yield "first"
        if request != "raise":
            return
        caught: list[trio.Cancelled] = []
        with trio.CancelScope() as own:
            own.cancel()
            try:
                await trio.lowlevel.checkpoint()
            except trio.Cancelled as exc:
                caught.append(exc)
        raise caught[0]  # re-raised outside the scope that produced it

    client = await cluster.serve(handler)
    stream = await client.generate("raise")
    await stream.__anext__()
    with pytest.raises(Cancelled, match="the handler cancelled") as raised:
        await stream.__anext__()
    assert raised.value.caused_by == "Cancelled"
    assert [i.data() async for i in await client.generate("ok")] == ["first"]


@pytest.mark.parametrize("exception", [KeyboardInterrupt, SystemExit])
async def test_keyboard_interrupt_or_system_exit_start_a_graceful_shutdown(
    cluster: Cluster, exception: type[BaseException]
) -> None:
    async def handler(request: Any, context: Context) -> AsyncIterator[Any]:
        if request == "exit":
            raise exception
        i = 0
        while not context.is_stopped():
            await trio.sleep(0.005)
            yield i
            i += 1
        yield "drained"

    client = await cluster.serve(handler)
    other = await client.generate("work")
    await other.__anext__()
    with pytest.raises(EngineShutdown):
        async for _ in await client.generate("exit"):
            pass
    # The other request drains as in any graceful shutdown, and the worker deregisters.
    items = await drain_cut_by_shutdown(other)
    assert items[-1] == "drained" and other.outcome == "stopped"
    with trio.fail_after(30):  # a hang guard only
        await cluster.worker.wait_shut_down()


# ---------------------------------------------------------------------------- graceful ends


def _stop_aware(recorder: Recorder):
    """Counts until stopped; then takes a moment to drain (say, billing) and returns."""

    async def handler(request: Any, context: Context) -> AsyncIterator[Any]:
        recorder.enter(context)
        how = "returned"
        try:
            i = 0
            while not context.is_stopped():
                await trio.sleep(0.005)
                yield i
                i += 1
            await trio.sleep(0.05)
            yield "usage"
        except BaseException as exc:
            how = type(exc).__name__
            raise
        finally:
            recorder.exit(context, how)

    return handler


async def test_a_stopped_stream_dropped_by_its_owner_is_left_to_drain(cluster: Cluster) -> None:
    # Dynamo's client pattern: stop_generating(), then break and drop the stream.
    recorder = Recorder()
    client = await cluster.serve(_stop_aware(recorder))
    ctx = Context()
    stream = await client.generate({}, context=ctx)
    async for _ in stream:
        ctx.stop_generating()
        break
    del stream
    assert await recorder.wait_exit() == ("STOPPED", "stop requested", "returned")


async def test_an_unstopped_stream_dropped_by_its_owner_is_killed(cluster: Cluster) -> None:
    recorder = Recorder()
    client = await cluster.serve(_stop_aware(recorder))
    stream = await client.generate({})
    await stream.__anext__()
    del stream
    assert await recorder.wait_exit() == ("KILLED", "stream closed", "Cancelled")


async def test_leaving_a_runtime_lets_stopped_calls_drain_and_kills_live_ones(
    cluster: Cluster,
) -> None:
    from dynamo_trio.runtime import DistributedRuntime

    from .conftest import TEST_CONFIG

    stopped, live = Recorder(), Recorder()
    await cluster.serve(_stop_aware(stopped), "dynamo/stopped/generate")
    await cluster.serve(_stop_aware(live), "dynamo/live/generate")
    async with DistributedRuntime(TEST_CONFIG, memory_store=cluster.store) as caller:
        streams = []
        for component in ("stopped", "live"):
            endpoint = caller.namespace("dynamo").component(component).endpoint("generate")
            client = await endpoint.client()
            await client.wait_for_instances()
            ctx = Context(component)
            streams.append(await client.generate({}, context=ctx))
            await streams[-1].__anext__()
            if component == "stopped":
                ctx.stop_generating()
    # The stop became a drain, not a "transport lost" kill; the live call was told why.
    assert await stopped.wait_exit() == ("STOPPED", "stop requested", "returned")
    assert await live.wait_exit() == ("KILLED", "shutdown", "Cancelled")


# ---------------------------------------------------------------------------- CPU-bound


async def test_a_cpu_bound_handler_hears_its_kill_within_a_slice(cluster: Cluster) -> None:
    """A handler that computes between items and never awaits still hears its kill
    after the item it is working on (or the one after): the runtime lets the reader
    run once the handler has held the loop for a slice of time, not only every so
    many items."""
    produced: list[int] = []
    killed_at: list[int] = []

    async def cpu_bound(request: Any, context: Context) -> AsyncIterator[Any]:
        for i in range(60):
            spin_until = time.perf_counter() + 0.025
            while time.perf_counter() < spin_until:
                pass
            produced.append(i)
            yield i

    client = await cluster.serve(cpu_bound)
    ctx = Context()
    stream = await client.generate({}, context=ctx)
    await stream.__anext__()
    killed_at.append(len(produced))
    ctx.kill()
    await _settled(cluster)
    # The caller got its first item while the handler was at most a few items in
    # (the loop was shared), and the handler stopped a few items after the kill.
    assert killed_at[0] <= 3, killed_at
    assert len(produced) - killed_at[0] <= 3, (killed_at, len(produced))
