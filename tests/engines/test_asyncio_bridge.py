"""The asyncio bridge, handler level: a fake asyncio engine on a real loop in its thread.

After every way a stream can end, the engine's ``abort`` ran exactly once (or
the engine finished the request on its own), before the handler was done; no
request is left in the engine; and once the loop is closed, no thread is left.
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any

import pytest
import trio

from dynamo_trio import Context, EngineShutdown, Unknown
from dynamo_trio.engines import AsyncioLoop, open_asyncio_loop
from dynamo_trio.engines._asyncio import _set_all

from ._fakes import EngineFailure, FakeAsyncEngine

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator, Callable

    from tests.runtime.conftest import Cluster


def handler(
    bridge: AsyncioLoop, engine: FakeAsyncEngine, tokens: int = 1000, fail_at: int | None = None
) -> Any:
    """A worker's handler over the bridge: a token per item; after a stop, a last item."""

    async def generate(request: Any, context: Context) -> AsyncIterator[dict[str, Any]]:
        rid = context.id()
        items = bridge.stream(
            lambda: engine.generate(rid, tokens, fail_at=fail_at),
            abort=lambda: engine.abort(rid),
            context=context,
        )
        count = 0
        try:
            async for token in items:
                count += 1
                yield {"token": token}
        finally:
            await items.aclose()
            engine.events.append(f"handler done {rid}")
        if context.is_stopped():
            yield {"finish_reason": "cancelled", "count": count}

    return generate


async def consume(
    generator: Any, context: Context, *, kill_after: int = 0, stop_after: int = 0
) -> list[dict[str, Any]]:
    """Read the handler under its context's scope, as the runtime does."""
    got: list[dict[str, Any]] = []
    async with context.scope():
        try:
            async for item in generator:
                got.append(item)
                if len(got) == kill_after:
                    context.kill()
                if len(got) == stop_after:
                    context.stop()
        finally:
            await generator.aclose()
    return got


async def read_into(got: list[int], items: AsyncIterator[int]) -> None:
    """Append each item to ``got`` until the stream ends or raises."""
    async for item in items:
        got.append(item)


@pytest.fixture
async def bridge() -> AsyncIterator[AsyncioLoop]:
    before = set(threading.enumerate())
    async with open_asyncio_loop() as loop:
        assert len(set(threading.enumerate()) - before) == 1
        yield loop
    assert set(threading.enumerate()) <= before, "the loop's thread was not joined"


async def idle(bridge: AsyncioLoop, engine: FakeAsyncEngine) -> dict[str, int]:
    """Let the loop run a few passes; then no request may be running, and none may move."""
    produced = await bridge.run(lambda: _passes(engine))
    assert engine.running == {}
    return produced


async def _passes(engine: FakeAsyncEngine) -> dict[str, int]:
    before = dict(engine.produced)
    for _ in range(20):
        await asyncio.sleep(0)
    assert engine.produced == before, "a request kept generating after its handler was done"
    return before


async def test_a_stream_read_to_its_end_is_not_aborted(bridge: AsyncioLoop) -> None:
    engine = FakeAsyncEngine()
    context = Context()
    got = await consume(handler(bridge, engine, tokens=5)(None, context), context)
    assert got == [{"token": i} for i in range(5)]
    assert engine.aborted == []
    assert await idle(bridge, engine) == {context.id(): 5}


async def test_a_kill_aborts_the_request_before_the_handler_is_done(bridge: AsyncioLoop) -> None:
    engine = FakeAsyncEngine()
    context = Context()
    got = await consume(handler(bridge, engine)(None, context), context, kill_after=3)
    assert got == [{"token": i} for i in range(3)]
    assert context.is_killed()
    assert engine.aborted == [context.id()]
    assert engine.events == [f"abort {context.id()}", f"handler done {context.id()}"]
    await idle(bridge, engine)


async def test_a_kill_reaches_the_engine_before_the_handler_resumes(bridge: AsyncioLoop) -> None:
    """The abort goes to the engine when the kill lands, even while the handler waits at
    a ``yield`` (its caller busy sending an item); the stream still ends only after the
    abort, and the abort runs once."""
    engine = FakeAsyncEngine()
    context = Context()
    rid = context.id()
    generator = handler(bridge, engine)(None, context)
    async with context.scope():
        try:
            assert await generator.__anext__() == {"token": 0}
            context.kill()
            with trio.CancelScope(shield=True):  # the caller still busy with the item
                heard = await bridge.run(lambda: _aborted_within(engine, rid, 100))
        finally:
            await generator.aclose()
    assert heard
    assert engine.aborted == [rid]
    assert engine.events == [f"abort {rid}", f"handler done {rid}"]
    await idle(bridge, engine)


async def _aborted_within(engine: FakeAsyncEngine, request_id: str, passes: int) -> bool:
    """On the loop: whether the engine has been told to abort ``request_id`` within
    ``passes`` loop passes."""
    for _ in range(passes):
        if request_id in engine.aborted:
            return True
        await asyncio.sleep(0)
    return False


async def test_a_stop_aborts_and_lets_the_handler_say_goodbye(bridge: AsyncioLoop) -> None:
    engine = FakeAsyncEngine()
    context = Context()
    got = await consume(handler(bridge, engine)(None, context), context, stop_after=4)
    assert got[:4] == [{"token": i} for i in range(4)]
    assert got[4:] == [{"finish_reason": "cancelled", "count": 4}]
    assert context.is_stopped() and not context.is_killed()
    assert engine.aborted == [context.id()]
    await idle(bridge, engine)


async def test_a_stop_while_the_engine_is_silent_ends_the_stream(bridge: AsyncioLoop) -> None:
    """A stop reaches a stream waiting for an item that never comes (a long prefill)."""
    engine = FakeAsyncEngine()
    context = Context()

    async def silent() -> AsyncIterator[int]:
        await asyncio.Event().wait()
        yield 0

    items = bridge.stream(silent, abort=lambda: engine.abort(context.id()), context=context)
    async with context.scope():
        context.stop()  # before the first item: the bridge starts nothing
        assert [item async for item in items] == []
    other = Context()
    items = bridge.stream(silent, abort=lambda: engine.abort(other.id()), context=other)
    async with other.scope() as nursery:

        async def stop_soon() -> None:
            await trio.testing.wait_all_tasks_blocked()
            other.stop()

        nursery.start_soon(stop_soon)
        assert [item async for item in items] == []
    assert engine.aborted == [context.id(), other.id()]


async def test_an_enclosing_timeout_is_a_kill(bridge: AsyncioLoop) -> None:
    engine = FakeAsyncEngine()
    context = Context()
    generator = handler(bridge, engine)(None, context)
    got: list[dict[str, Any]] = []
    with trio.CancelScope() as timeout:
        async with context.scope():
            try:
                async for item in generator:
                    got.append(item)
                    if len(got) == 2:
                        timeout.cancel()  # what move_on_after does when its deadline passes
            finally:
                await generator.aclose()
    assert timeout.cancelled_caught
    assert len(got) == 2
    assert context.is_killed()
    assert engine.aborted == [context.id()]
    await idle(bridge, engine)


async def test_aclose_mid_stream_aborts(bridge: AsyncioLoop) -> None:
    engine = FakeAsyncEngine()
    context = Context()
    generator = handler(bridge, engine)(None, context)
    async with context.scope():
        assert await generator.__anext__() == {"token": 0}
        await generator.aclose()
        assert engine.events == [f"abort {context.id()}", f"handler done {context.id()}"]
    await idle(bridge, engine)


async def test_an_engine_error_is_raised_and_the_request_aborted(bridge: AsyncioLoop) -> None:
    engine = FakeAsyncEngine()
    context = Context()
    with pytest.raises(EngineFailure, match="at token 3"):
        await consume(handler(bridge, engine, fail_at=3)(None, context), context)
    assert engine.aborted == [context.id()]
    await idle(bridge, engine)


async def test_a_failing_abort_is_logged_and_the_stream_still_closes(
    bridge: AsyncioLoop, caplog: pytest.LogCaptureFixture
) -> None:
    engine = FakeAsyncEngine()
    context = Context()

    async def broken_abort() -> None:
        await engine.abort(context.id())
        raise RuntimeError("abort exploded")

    items = bridge.stream(lambda: engine.generate(context.id(), 1000), abort=broken_abort)
    assert await items.__anext__() == 0
    await items.aclose()
    assert engine.aborted == [context.id()]
    assert "abort exploded" in caplog.text
    await idle(bridge, engine)


async def test_run_cancels_the_coroutine_on_the_loop_and_waits_for_it() -> None:
    token = trio.lowlevel.current_trio_token()
    started = trio.Event()
    unwound: list[str] = []
    async with open_asyncio_loop() as bridge:

        async def forever() -> None:
            token.run_sync_soon(started.set)
            try:
                await asyncio.Event().wait()
            finally:
                await asyncio.sleep(0)
                unwound.append("unwound")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(bridge.run, forever)
            await started.wait()
            nursery.cancel_scope.cancel()
        assert unwound == ["unwound"]
        started = trio.Event()
        with trio.move_on_after(0):  # cancelled before or after it starts on the loop
            await bridge.run(forever)
        # Whichever: it never ran, or it ran and unwound before run() returned.
        assert unwound == ["unwound", "unwound"] if started.is_set() else ["unwound"]
        assert await bridge.run(lambda: asyncio.sleep(0, "value")) == "value"


async def test_closing_the_loop_ends_a_stream_still_open() -> None:
    """A stream left open when the loop closes ends with EngineShutdown, never hangs; only
    the rest of a batch already handed over (at most a window) comes before."""
    before = set(threading.enumerate())
    engine = FakeAsyncEngine()
    async with open_asyncio_loop() as bridge:
        items = bridge.stream(lambda: engine.generate("r", 1000), window=4)
        assert await items.__anext__() == 0
        other = bridge.stream(lambda: engine.generate("s", 1000))
        assert await other.__anext__() == 0
    got: list[int] = []
    with pytest.raises(EngineShutdown):
        await read_into(got, items)
    assert got == list(range(1, len(got) + 1)) and len(got) < 4
    await other.aclose()
    assert set(threading.enumerate()) <= before


async def test_through_the_runtime_an_engine_error_is_a_typed_error(cluster: Cluster) -> None:
    engine = FakeAsyncEngine()
    async with open_asyncio_loop() as bridge:
        client = await cluster.serve(handler(bridge, engine, fail_at=2))
        stream = await client.generate({})
        with pytest.raises(Unknown, match="EngineFailure: the engine failed at token 2"):
            async for _ in stream:
                pass
        assert len(engine.aborted) == 1
        await idle(bridge, engine)


class Burst:
    """An engine whose generator yields ``count`` items at once (no await between them),
    then waits until it is cancelled; it records how far it got and how it ended."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.produced = 0
        self.events: list[str] = []  # shared with the test (list.append is atomic)

    async def generate(self) -> AsyncIterator[int]:
        try:
            for item in range(self.count):
                self.produced += 1
                yield item
            await asyncio.Event().wait()
        finally:
            self.events.append(f"closed after {self.produced}")

    async def abort(self) -> None:
        self.events.append("abort")


async def test_a_burst_arrives_in_fewer_wake_ups_than_items_and_in_order(
    bridge: AsyncioLoop,
) -> None:
    engine = Burst(10)
    batches = bridge.batches(engine.generate, abort=engine.abort)
    got: list[list[int]] = []
    try:
        while sum(map(len, got)) < 10:
            got.append(await batches.__anext__())
    finally:
        await batches.aclose()
    assert [item for batch in got for item in batch] == list(range(10))
    assert all(got) and len(got) < 10
    assert engine.events == ["abort", "closed after 10"]


async def test_the_engine_is_read_at_most_a_window_ahead(bridge: AsyncioLoop) -> None:
    engine = Burst(1000)
    batches = bridge.batches(engine.generate, abort=engine.abort, window=4)
    taken: list[int] = []
    try:
        for _ in range(5):
            batch = await batches.__anext__()
            assert 1 <= len(batch) <= 4
            assert batch == list(range(len(taken), len(taken) + len(batch)))
            taken += batch
            await bridge.run(lambda: _loop_passes(20))  # the loop is free to read on
            assert engine.produced == len(taken) + 4
    finally:
        await batches.aclose()
    # Closed while the reading task waited for room: the engine's generator is closed too.
    assert engine.events == ["abort", f"closed after {len(taken) + 4}"]


async def _loop_passes(count: int) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


async def test_a_kill_in_the_middle_of_a_batch_drops_the_rest_and_aborts(
    bridge: AsyncioLoop,
) -> None:
    engine = Burst(10)
    context = Context()

    async def generate(request: Any, context: Context) -> AsyncIterator[dict[str, int]]:
        items = bridge.stream(engine.generate, abort=engine.abort, context=context)
        try:
            async for item in items:
                yield {"token": item}
        finally:
            await items.aclose()
            engine.events.append("handler done")

    got = await consume(generate(None, context), context, kill_after=3)
    assert got == [{"token": 0}, {"token": 1}, {"token": 2}]
    assert context.is_killed()
    # The reading task had read all ten (the engine yielded them without a pause, and the
    # abort runs on the loop after it): seven were read and dropped.
    assert engine.events == ["abort", "closed after 10", "handler done"]


async def test_an_engine_error_comes_after_the_items_it_yielded(bridge: AsyncioLoop) -> None:
    aborted: list[str] = []

    async def failing() -> AsyncIterator[int]:
        yield 0
        yield 1
        raise EngineFailure("mid-batch")

    async def abort() -> None:
        aborted.append("abort")

    got: list[int] = []
    items = bridge.stream(failing, abort=abort)
    try:
        with pytest.raises(EngineFailure, match="mid-batch"):
            await read_into(got, items)
    finally:
        await items.aclose()
    assert got == [0, 1]
    assert aborted == ["abort"]


async def test_a_window_below_one_is_refused(bridge: AsyncioLoop) -> None:
    batches = bridge.batches(Burst(1).generate, window=0)
    with pytest.raises(ValueError, match="window"):
        await batches.__anext__()


async def test_streams_fed_in_one_loop_pass_wake_trio_in_one_hop(
    bridge: AsyncioLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    hops: list[int] = []  # the wake-ups each hop carried
    original = AsyncioLoop._from_loop

    def counting(self: AsyncioLoop, fn: Callable[..., object], *args: Any) -> None:
        if fn is _set_all:
            hops.append(len(args[0]))
        original(self, fn, *args)

    monkeypatch.setattr(AsyncioLoop, "_from_loop", counting)
    gate = asyncio.Event()

    async def gated() -> AsyncIterator[int]:
        await gate.wait()
        yield 1
        await asyncio.Event().wait()

    async def open_gate() -> None:
        gate.set()

    streams = [bridge.batches(gated) for _ in range(8)]
    got: list[list[int]] = []

    async def first(batches: AsyncGenerator[list[int], None]) -> None:
        got.append(await batches.__anext__())

    try:
        async with trio.open_nursery() as nursery:
            for batches in streams:
                nursery.start_soon(first, batches)
            await trio.testing.wait_all_tasks_blocked()  # all eight wait for an item
            await bridge.run(open_gate)
    finally:
        for batches in streams:
            await batches.aclose()
    assert got == [[1]] * 8
    assert hops == [8]
