"""Two runtimes in one process (a worker and a caller) on a shared memory store.

The request plane between them is still real TCP on 127.0.0.1; only discovery
is in memory.  Multi-process behaviour lives in ``tests/e2e``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest
import trio
from prometheus_client.exposition import generate_latest

from dynamo_trio import (
    Config,
    DiscoveryConfig,
    RequestPlaneConfig,
    WorkerConfig,
)
from dynamo_trio.discovery import MemoryStore
from dynamo_trio.runtime import Client, DistributedRuntime
from tests._metrics import parse, total

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from prometheus_client import CollectorRegistry

TEST_CONFIG = Config(
    discovery=DiscoveryConfig(backend="mem"),
    request_plane=RequestPlaneConfig(heartbeat_interval=0.2, heartbeat_timeout=1.0),
    worker=WorkerConfig(drain_grace=1.0, shutdown_grace=1.0),
)


def metric_value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    """The sum of the matching samples (0.0 if absent), read from the text exposition."""
    return total(parse(generate_latest(registry).decode()), name, **labels)


@dataclass
class Cluster:
    """A memory store shared by the runtimes a test opens, plus helpers to use them."""

    store: MemoryStore
    nursery: trio.Nursery
    caller: DistributedRuntime
    worker: DistributedRuntime

    async def serve(
        self,
        handler: Callable[..., Any],
        path: str = "dynamo/backend/generate",
        runtime: DistributedRuntime | None = None,
    ) -> Client:
        """Serve ``handler`` at ``path`` and return the caller's client, instances visible."""
        runtime = runtime or self.worker
        namespace, component, endpoint = path.split("/")
        target = runtime.namespace(namespace).component(component).endpoint(endpoint)
        self.nursery.start_soon(target.serve_endpoint, handler)
        client = (
            await self.caller.namespace(namespace).component(component).endpoint(endpoint).client()
        )
        with trio.fail_after(30):  # a hang guard only
            await client._view.wait_until(
                lambda items: any(i.instance_id == runtime.instance_id for i in items.values())
            )
        return client


@pytest.fixture
async def cluster(nursery: trio.Nursery) -> AsyncIterator[Cluster]:
    store = MemoryStore()
    async with (
        DistributedRuntime(TEST_CONFIG, memory_store=store) as worker,
        DistributedRuntime(TEST_CONFIG, memory_store=store) as caller,
    ):
        yield Cluster(store, nursery, caller, worker)
