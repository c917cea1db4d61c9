"""``DistributedRuntime(transport=)``: the request plane over an injected transport.

A caller and a worker in one trio run on :class:`~tests._memplane.MemoryTransport`,
on the autojump clock: calls reuse one connection, and a worker that shuts
down stops accepting on its transport as it would on its socket.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import trio
import trio.testing

from dynamo_trio.discovery import MemoryStore
from dynamo_trio.runtime import DistributedRuntime
from tests._memplane import MemoryTransport

from .conftest import TEST_CONFIG

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from dynamo_trio import Context


async def echo(request: dict[str, Any], context: Context) -> AsyncIterator[Any]:
    for index in range(request["n"]):
        await trio.sleep(0.01)
        yield {"i": index}


async def test_calls_go_over_the_injected_transport_on_one_connection(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    store, transport = MemoryStore(), MemoryTransport()
    async with (
        DistributedRuntime(TEST_CONFIG, memory_store=store, transport=transport) as worker,
        DistributedRuntime(TEST_CONFIG, memory_store=store, transport=transport) as caller,
    ):
        endpoint = worker.endpoint("dynamo.backend.generate")
        await nursery.start(endpoint.serve_endpoint, echo)
        assert worker.address is not None
        client = await caller.endpoint("dynamo.backend.generate").client()
        await client.wait_for_instances()
        for n in (1, 3, 5):
            stream = await client.generate({"n": n})
            assert [item.data() async for item in stream] == [{"i": i} for i in range(n)]
        assert transport.opened == {worker.address: 1}  # one connection, reused

        worker.shutdown()  # goaway; its transport refuses new connections
        await worker.wait_shut_down()
        with pytest.raises(OSError, match="connection refused"):
            await transport.open(worker.address)
