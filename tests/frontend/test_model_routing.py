"""The model registry's routing, in one process: runtimes on a shared memory store, real TCP.

The multi-process versions (mockers, SIGKILL) are in ``test_routing.py``.
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest
import trio

from dynamo_trio import CannotConnect, Context, NoInstances, WorkerConfig
from dynamo_trio.discovery import Instance, MemoryDiscovery, MemoryStore, ModelCard, encode_record
from dynamo_trio.frontend._models import ModelRegistry, ModelStream
from dynamo_trio.runtime import DistributedRuntime
from tests.discovery._etcd_server import free_port
from tests.runtime.conftest import TEST_CONFIG

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from dynamo_trio._config import RouterMode


def answering(name: str) -> Callable[..., Any]:
    async def handler(request: Any) -> AsyncIterator[Any]:
        await trio.lowlevel.checkpoint()
        yield {"who": name}

    return handler


async def never_answers(request: Any) -> AsyncIterator[Any]:
    await trio.sleep_forever()
    yield None  # unreachable


class Cluster:
    """Worker runtimes and a frontend runtime on one memory store, each held open by a
    task of the test's nursery (so each is entered and left by the same task)."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self.store = MemoryStore()
        self.nursery = nursery
        self.frontend: DistributedRuntime | None = None

    async def _hold(self, opened: Any, *, task_status: trio.TaskStatus[Any]) -> None:
        async with opened as value:
            task_status.started(value)
            await trio.sleep_forever()

    async def hold(self, opened: Any) -> Any:
        """Enter the async context manager ``opened`` in a task that keeps it open."""
        return await self.nursery.start(self._hold, opened)

    async def runtime(self, **worker: float) -> DistributedRuntime:
        config = TEST_CONFIG.replace(worker=WorkerConfig(**worker)) if worker else TEST_CONFIG
        runtime: DistributedRuntime = await self.hold(
            DistributedRuntime(config, memory_store=self.store)
        )
        return runtime

    async def worker(
        self, path: str, model: str, handler: Callable[..., Any], **worker: float
    ) -> DistributedRuntime:
        runtime = await self.runtime(**worker)
        namespace, component, name = path.split("/")
        endpoint = runtime.namespace(namespace).component(component).endpoint(name)
        await self.nursery.start(endpoint.serve_endpoint, handler)
        await endpoint.register_model(model, "chat")
        return runtime

    async def registry(self, mode: RouterMode = "round-robin") -> ModelRegistry:
        if self.frontend is None:
            self.frontend = await self.runtime()
        registry = ModelRegistry(self.frontend, "ns", mode)
        await registry.start()
        return registry


@pytest.fixture
def cluster(nursery: trio.Nursery) -> Cluster:
    return Cluster(nursery)


async def everything(stream: ModelStream) -> list[Any]:
    """The data of every item of ``stream``, in order."""
    items: list[Any] = []
    while batch := await stream.receive_batch():
        items.extend(batch)
    return items


async def ask(registry: ModelRegistry, model: str) -> str:
    """One request for ``model``; which worker answered."""
    with trio.fail_after(5):
        await wait_for_cards(registry, model)
        async with await registry.route(model, "chat").call({}, Context()) as stream:
            items = await everything(stream)
    assert len(items) == 1, items
    who: str = items[0]["who"]
    return who


async def wait_for_cards(registry: ModelRegistry, model: str, count: int = 1) -> None:
    view = registry._cards
    await view.wait_until(lambda cards: sum(c.name == model for c in cards.values()) >= count)


async def test_a_request_goes_only_to_the_instances_that_registered_its_model(
    cluster: Cluster,
) -> None:
    await cluster.worker("ns/c1/generate", "m", answering("a"))
    await cluster.worker("ns/c2/generate", "m", answering("b"))  # another component
    await cluster.worker("ns/c1/generate", "other", answering("c"))  # a's endpoint
    registry = await cluster.registry()
    await wait_for_cards(registry, "m", 2)
    answers = [await ask(registry, "m") for _ in range(12)]
    assert Counter(answers) == {"a": 6, "b": 6}, answers
    assert all(x != y for x, y in itertools.pairwise(answers)), "round robin alternates"
    assert {await ask(registry, "other") for _ in range(4)} == {"c"}

    random_registry = await cluster.registry("random")
    await wait_for_cards(random_registry, "m", 2)
    assert {await ask(random_registry, "m") for _ in range(30)} == {"a", "b"}


async def fake_dead_instance(cluster: Cluster, model: str) -> None:
    """A card and an instance record for an address nobody listens on (a SIGKILLed worker
    whose lease has not expired yet)."""
    discovery: MemoryDiscovery = await cluster.hold(MemoryDiscovery(cluster.store))
    dead = Instance("ns", "dead", "generate", discovery.lease_id, f"127.0.0.1:{free_port()}")
    card = ModelCard(model, "chat", "ns", "dead", "generate", discovery.lease_id)
    await discovery.put(dead.key, encode_record(dead))
    await discovery.put(card.key, encode_record(card))


async def test_an_unreachable_instance_is_skipped_at_once(cluster: Cluster) -> None:
    await fake_dead_instance(cluster, "m")
    await cluster.worker("ns/c1/generate", "m", answering("a"))
    registry = await cluster.registry()
    await wait_for_cards(registry, "m", 2)
    assert [await ask(registry, "m") for _ in range(6)] == ["a"] * 6


async def test_a_model_with_no_reachable_instance_is_a_clear_error(cluster: Cluster) -> None:
    await fake_dead_instance(cluster, "m")
    registry = await cluster.registry()
    await wait_for_cards(registry, "m")
    with pytest.raises(CannotConnect, match="cannot connect"):
        await registry.route("m", "chat").call({}, Context())
    # Now out of rotation: no second connection attempt, a 503 naming the model.
    with pytest.raises(NoInstances, match="no live instance serves the chat model `m`"):
        await registry.route("m", "chat").call({}, Context())


async def test_a_card_seen_before_its_instance_waits_for_it(cluster: Cluster) -> None:
    runtime = await cluster.runtime()
    endpoint = runtime.namespace("ns").component("late").endpoint("generate")
    await endpoint.register_model("m", "chat")  # the card first...
    registry = await cluster.registry()
    await wait_for_cards(registry, "m")

    async def serve_later() -> None:
        await trio.sleep(0.3)
        await endpoint.serve_endpoint(answering("late"))

    cluster.nursery.start_soon(serve_later)
    assert await ask(registry, "m") == "late"  # ...the instance 0.3 s later


async def test_a_failure_before_the_first_item_moves_the_request(cluster: Cluster) -> None:
    """The instance shuts down (and kills the request) before answering: another takes it."""
    stuck = await cluster.worker(
        "ns/c1/generate", "m", never_answers, shutdown_grace=0.1, drain_grace=0.1
    )
    registry = await cluster.registry()
    await wait_for_cards(registry, "m")
    context = Context()
    with trio.fail_after(5):
        async with await registry.route("m", "chat").call({}, context) as stream:
            assert stream.instance_id == stuck.instance_id
            await cluster.worker("ns/c2/generate", "m", answering("b"))
            await wait_for_cards(registry, "m", 2)
            stuck.shutdown()
            items = await everything(stream)
    assert items == [{"who": "b"}]
    assert not context.is_stopped()


async def test_a_name_clash_between_types_serves_each_type_from_its_own_workers(
    cluster: Cluster,
) -> None:
    await cluster.worker("ns/c1/generate", "m", answering("chat"))
    embedder = await cluster.runtime()
    endpoint = embedder.namespace("ns").component("c1").endpoint("embed")
    await cluster.nursery.start(endpoint.serve_endpoint, answering("embeddings"))
    await endpoint.register_model("m", "embeddings")
    registry = await cluster.registry()
    await wait_for_cards(registry, "m", 2)
    assert registry.models()[0][0] == "m"
    assert len(registry.models()) == 1
    for model_type, expected in (("chat", "chat"), ("embeddings", "embeddings")):
        route = registry.route("m", model_type)  # type: ignore[arg-type]
        assert [card.model_type for card in registry.cards(route.name, route.model_type)] == [
            model_type
        ]
        async with await route.call({}, Context()) as stream:
            assert await everything(stream) == [{"who": expected}]
