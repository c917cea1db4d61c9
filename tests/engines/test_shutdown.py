"""A worker's graceful shutdown with requests inside an engine, through the real runtime:
each request is stopped (the engine asked to finish, the stream ends with a last
"cancelled" item), nothing is left in the engine, and the caller reads every item and
then learns the stream was cut short by the shutdown (StreamIncomplete)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from dynamo_trio.engines import open_asyncio_loop

from .._streams import drain_cut_by_shutdown
from . import test_asyncio_bridge, test_thread_bridge
from ._fakes import FakeAsyncEngine, FakeBlockingEngine

if TYPE_CHECKING:
    from typing import Any

    from tests.runtime.conftest import Cluster


async def read_through_shutdown(cluster: Cluster, handler: Any) -> list[Any]:
    """Read two items, shut the worker down, then read what is left of the stream."""
    client = await cluster.serve(handler)
    stream = await client.generate({})
    items = [(await stream.__anext__()).data() for _ in range(2)]
    cluster.worker.shutdown()
    with trio.fail_after(5):
        items += await drain_cut_by_shutdown(stream)
        await cluster.worker.wait_shut_down()
    return items


async def test_the_asyncio_engine_is_asked_to_finish(cluster: Cluster) -> None:
    engine = FakeAsyncEngine()
    async with open_asyncio_loop() as bridge:
        items = await read_through_shutdown(
            cluster, test_asyncio_bridge.handler(bridge, engine, tokens=10**6)
        )
        assert items[-1]["finish_reason"] == "cancelled"
        assert len(engine.aborted) == 1
        await test_asyncio_bridge.idle(bridge, engine)


async def test_the_blocking_engine_is_asked_to_finish(cluster: Cluster) -> None:
    engine = FakeBlockingEngine()
    items = await read_through_shutdown(cluster, test_thread_bridge.handler(engine, tokens=10**6))
    assert items[-1]["finish_reason"] == "cancelled"
    assert engine.active == 0
