"""The thread bridge, handler level: a fake blocking engine stepping in its thread.

After every way a stream can end, the engine's thread has ended and been
joined before the handler was done, and the engine stepped at most once more
after the handler stopped reading.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import pytest
import trio

from dynamo_trio import Context, Unknown
from dynamo_trio.engines import Emit, StopFlag, iterate_in_thread, stream_from_thread

from ._fakes import EngineFailure, FakeBlockingEngine
from .test_asyncio_bridge import consume

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from tests.runtime.conftest import Cluster


def handler(engine: FakeBlockingEngine, tokens: int = 1000, fail_at: int | None = None) -> Any:
    async def generate(request: Any, context: Context) -> AsyncIterator[dict[str, Any]]:
        items = iterate_in_thread(
            lambda should_stop: engine.tokens(tokens, should_stop, fail_at=fail_at),
            context=context,
        )
        try:
            async for item in items:
                yield item
        finally:
            await items.aclose()

    return generate


@pytest.fixture
def threads() -> Iterator[None]:
    """No thread the test started is alive at its end."""
    before = set(threading.enumerate())
    yield
    assert set(threading.enumerate()) <= before  # (an idle trio thread from before may end)


@pytest.mark.usefixtures("threads")
async def test_a_stream_read_to_its_end() -> None:
    engine = FakeBlockingEngine()
    context = Context()
    got = await consume(handler(engine, tokens=4)(None, context), context)
    assert got == [{"token": i} for i in range(4)]
    assert (engine.produced, engine.active) == (4, 0)
    assert len(engine.threads) == 1
    assert threading.current_thread().name not in engine.threads


@pytest.mark.usefixtures("threads")
async def test_a_kill_ends_the_generation_within_one_step() -> None:
    engine = FakeBlockingEngine()
    context = Context()
    got = await consume(handler(engine)(None, context), context, kill_after=5)
    assert got == [{"token": i} for i in range(5)]
    assert context.is_killed()
    assert engine.active == 0
    assert engine.produced in (5, 6)  # at most the step under way when the kill came


@pytest.mark.usefixtures("threads")
async def test_a_stop_lets_the_engine_end_with_its_last_item() -> None:
    engine = FakeBlockingEngine()
    context = Context()
    got = await consume(handler(engine)(None, context), context, stop_after=3)
    assert got[:3] == [{"token": i} for i in range(3)]
    assert got[3]["finish_reason"] == "cancelled"
    assert got[3]["produced"] in (3, 4)
    assert len(got) == 4
    assert engine.active == 0


@pytest.mark.usefixtures("threads")
async def test_an_enclosing_timeout_is_a_kill() -> None:
    engine = FakeBlockingEngine()
    context = Context()
    generator = handler(engine)(None, context)
    got: list[Any] = []
    with trio.CancelScope() as timeout:
        async with context.scope():
            try:
                async for item in generator:
                    got.append(item)
                    if len(got) == 2:
                        timeout.cancel()
            finally:
                await generator.aclose()
    assert timeout.cancelled_caught and context.is_killed()
    assert engine.active == 0
    assert engine.produced in (2, 3)


@pytest.mark.usefixtures("threads")
async def test_aclose_mid_stream_joins_the_thread() -> None:
    engine = FakeBlockingEngine()
    generator = handler(engine)(None, Context())
    assert await generator.__anext__() == {"token": 0}
    await generator.aclose()
    assert engine.active == 0
    assert engine.produced in (1, 2)


@pytest.mark.usefixtures("threads")
async def test_an_engine_error_is_raised_after_the_thread_ended() -> None:
    engine = FakeBlockingEngine()
    context = Context()
    with pytest.raises(EngineFailure, match="at token 2"):
        await consume(handler(engine, fail_at=2)(None, context), context)
    assert engine.active == 0


@pytest.mark.usefixtures("threads")
async def test_a_kill_during_a_long_step_waits_for_that_step_only() -> None:
    """The handler cannot return while its thread runs: it waits (shielded) for the step."""
    token = trio.lowlevel.current_trio_token()
    step_started = trio.Event()
    release = threading.Event()
    order: list[str] = []

    def work(emit: Emit[int], should_stop: StopFlag) -> None:
        emit(0)
        token.run_sync_soon(step_started.set)
        release.wait()  # a long forward pass
        order.append("step done")
        if not should_stop():
            emit(1)
        order.append("thread returns")

    context = Context()
    items = stream_from_thread(work, context=context)

    async def kill_then_release() -> None:
        await step_started.wait()
        context.kill()
        await trio.testing.wait_all_tasks_blocked()
        order.append("killed")
        release.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(kill_then_release)
        async with context.scope():
            assert await items.__anext__() == 0
            try:
                await items.__anext__()
            finally:
                await items.aclose()
                order.append("handler done")
    assert order == ["killed", "step done", "thread returns", "handler done"]


@pytest.mark.usefixtures("threads")
async def test_the_trio_loop_runs_while_the_engine_steps() -> None:
    release = threading.Event()
    ticks = 0

    def work(emit: Emit[str], should_stop: StopFlag) -> None:
        release.wait()
        emit("done")

    async def tick() -> None:
        nonlocal ticks
        for _ in range(5):
            ticks += 1
            await trio.lowlevel.checkpoint()
        release.set()

    items = stream_from_thread(work)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(tick)
        assert [item async for item in items] == ["done"]
    assert ticks == 5


async def test_through_the_runtime_an_engine_error_is_a_typed_error(cluster: Cluster) -> None:
    engine = FakeBlockingEngine()
    client = await cluster.serve(handler(engine, fail_at=1))
    stream = await client.generate({})
    with pytest.raises(Unknown, match="EngineFailure: the engine failed at token 1"):
        async for _ in stream:
            pass
    assert engine.active == 0
