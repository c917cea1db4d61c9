"""Contexts made or cancelled outside the trio run that owns the work: plain threads, an
earlier ``trio.run``, the garbage collector's reference cycles, a failing sibling task.

Whatever path marks a call's context killed, the worker hears of it, and no other stream
on the same connection is disturbed.
"""

from __future__ import annotations

import gc
import threading
from typing import TYPE_CHECKING, Any

import pytest
import trio
import trio.testing

from dynamo_trio import CancelReason, Context

from .conftest import Cluster, metric_value
from .test_calls import Recorder, counting_handler

if TYPE_CHECKING:
    from dynamo_trio.runtime import Client, ResponseStream


# A killed handler is cancelled in its own await, or closed at its yield when the kill
# caught the runtime sending its item.
_KILLED = ("cancelled", "closed")


def _in_plain_thread(fn: Any) -> Any:
    """Run ``fn()`` in a new plain thread (no trio token) and return its result."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(fn()))
    thread.start()
    thread.join()
    return result[0]


async def _open(client: Client, context: Context | None = None) -> ResponseStream:
    stream = await client.generate({}, context=context)
    await stream.__anext__()
    return stream


async def _others_still_flow(streams: list[ResponseStream], items: int = 5) -> None:
    """Every stream in ``streams`` keeps delivering items."""
    for stream in streams:
        for _ in range(items):
            with trio.fail_after(30):  # a hang guard only
                await stream.__anext__()


async def test_a_context_made_in_a_plain_thread_and_killed_from_one_kills_the_call(
    cluster: Cluster,
) -> None:
    recorder = Recorder()
    client = await cluster.serve(counting_handler(recorder))
    others = [await _open(client) for _ in range(3)]
    parent: Context = _in_plain_thread(Context)
    stream = await _open(client, parent)
    await trio.to_thread.run_sync(parent.kill)
    with trio.fail_after(30):  # a hang guard only
        rest = [item async for item in stream]
    assert rest == []
    assert stream.outcome == "killed"
    # The worker's handler for that call was cancelled, with the caller's reason.
    state, reason, how = await recorder.wait_exit()
    assert (state, reason) == ("KILLED", "kill requested")
    assert how in _KILLED
    assert len(recorder.exits) == 1
    # The connection still serves the other streams, and nothing was lost on it.
    await _others_still_flow(others)
    for other in others:
        await other.aclose()
    with trio.fail_after(30):  # a hang guard only
        await cluster.worker._wait_idle()
    assert metric_value(cluster.worker.registry, "dynamo_component_cancellation_total") == 4


async def test_a_plain_thread_stop_drains_the_call(cluster: Cluster) -> None:
    recorder = Recorder()
    client = await cluster.serve(counting_handler(recorder))
    parent: Context = _in_plain_thread(Context)
    stream = await _open(client, parent)
    await trio.to_thread.run_sync(parent.stop_generating)
    with trio.fail_after(30):  # a hang guard only
        rest = [item.data() async for item in stream]
    assert rest[-1]["final"] is True
    assert stream.outcome == "stopped"


async def test_a_context_bound_by_linking_wakes_its_waiters_in_its_run() -> None:
    """A context made outside trio learns its run when a child is linked in it."""
    parent: Context = _in_plain_thread(Context)
    child = Context()
    parent.link_child(child)
    woke = trio.Event()

    async def wait() -> None:
        await parent.killed()
        woke.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait)
        await trio.testing.wait_all_tasks_blocked()
        await trio.to_thread.run_sync(parent.kill)
        with trio.fail_after(30):  # a hang guard only
            await woke.wait()
    assert child.is_killed() and child.reason is CancelReason.KILL_REQUESTED


def test_a_context_from_an_earlier_run_kills_a_call_in_this_run() -> None:
    async def make() -> Context:
        await trio.lowlevel.checkpoint()
        return Context()  # bound to this run, which then ends

    parent = trio.run(make)

    async def main() -> None:
        from dynamo_trio.discovery import MemoryStore
        from dynamo_trio.runtime import DistributedRuntime

        from .conftest import TEST_CONFIG

        store = MemoryStore()
        async with (
            DistributedRuntime(TEST_CONFIG, memory_store=store) as worker,
            DistributedRuntime(TEST_CONFIG, memory_store=store) as caller,
            trio.open_nursery() as nursery,
        ):
            cluster = Cluster(store, nursery, caller, worker)
            recorder = Recorder()
            client = await cluster.serve(counting_handler(recorder))
            stream = await _open(client, parent)
            parent.kill()
            with trio.fail_after(30):  # a hang guard only
                assert [item async for item in stream] == []
            with trio.fail_after(30):  # a hang guard only
                state, reason, how = await recorder.wait_exit()
            assert (state, reason) == ("KILLED", "kill requested")
            assert how in _KILLED
            # And the earlier run's context now belongs to this one: it can be awaited.
            with trio.fail_after(30):  # a hang guard only
                await parent.killed()
            nursery.cancel_scope.cancel()

    trio.run(main)


async def test_waiting_on_a_context_of_another_live_run_is_refused() -> None:
    made = threading.Event()
    release = threading.Event()
    box: list[Context] = []

    def other_run() -> None:
        async def hold() -> None:
            box.append(Context())
            made.set()
            await trio.to_thread.run_sync(release.wait)

        trio.run(hold)

    thread = threading.Thread(target=other_run)
    thread.start()
    try:
        await trio.to_thread.run_sync(made.wait)
        with pytest.raises(RuntimeError, match="belongs to another trio run"):
            await box[0].stopped()
    finally:
        release.set()
        await trio.to_thread.run_sync(thread.join)


# ---------------------------------------------------------------------------- cycles


async def test_a_stream_in_a_reference_cycle_sends_its_kill(cluster: Cluster) -> None:
    recorder = Recorder()
    client = await cluster.serve(counting_handler(recorder))
    other = await _open(client)
    stream = await _open(client)
    context = stream.context
    stream.cycle = stream  # type: ignore[attr-defined]
    del stream
    gc.collect()
    assert context.is_killed() and context.reason is CancelReason.STREAM_CLOSED
    state, reason, how = await recorder.wait_exit()
    assert (state, reason) == ("KILLED", "stream closed")
    assert how in _KILLED
    await _others_still_flow([other])
    await other.aclose()


async def test_leaving_a_scope_after_its_stream_was_collected_in_a_cycle_kills_the_call(
    cluster: Cluster,
) -> None:
    recorder = Recorder()
    client = await cluster.serve(counting_handler(recorder))
    parent = Context()
    async with parent.scope():
        stream = await _open(client, parent)
        stream.cycle = stream  # type: ignore[attr-defined]
        del stream
        gc.collect()
    state, _reason, how = await recorder.wait_exit()
    assert state == "KILLED"
    assert how in _KILLED


async def test_a_stream_collected_in_a_plain_thread_sends_its_kill(cluster: Cluster) -> None:
    recorder = Recorder()
    client = await cluster.serve(counting_handler(recorder))
    stream = await _open(client)
    box = [stream]
    del stream
    await trio.to_thread.run_sync(box.clear)  # the last reference goes in another thread
    state, reason, how = await recorder.wait_exit()
    assert (state, reason) == ("KILLED", "stream closed")
    assert how in _KILLED


# ---------------------------------------------------------------------------- own nursery


async def test_a_failed_sibling_in_the_contexts_own_nursery_kills_it(cluster: Cluster) -> None:
    recorder = Recorder()
    client = await cluster.serve(counting_handler(recorder))
    parent, opened, keep = Context(), trio.Event(), []

    async def failing() -> None:
        await opened.wait()
        raise KeyError("sibling")

    async def work() -> None:
        async with parent.scope():
            parent.start_soon(failing)
            keep.append(await _open(client, parent))  # referenced: only the scope ends it
            opened.set()
            await trio.sleep_forever()

    with pytest.raises(KeyError):
        await work()
    assert keep[0].outcome == "killed"
    assert parent.is_killed() and parent.reason is CancelReason.SCOPE_CANCELLED
    state, reason, _ = await recorder.wait_exit()
    assert (state, reason) == ("KILLED", "scope cancelled")


async def test_a_body_that_raises_is_not_a_cancellation(cluster: Cluster) -> None:
    recorder = Recorder()
    client = await cluster.serve(counting_handler(recorder))
    parent, keep = Context(), []

    async def work() -> None:
        async with parent.scope():
            keep.append(await _open(client, parent))  # referenced: only the scope ends it
            raise KeyError("body")

    with pytest.raises(KeyError):
        await work()
    assert keep[0].outcome == "killed"
    assert not parent.is_stopped()
    state, reason, _ = await recorder.wait_exit()
    assert (state, reason) == ("KILLED", "parent finished")
