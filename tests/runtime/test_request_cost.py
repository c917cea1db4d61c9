"""What one served request costs the worker's scheduler, counted (never timed).

A 1-item request is one task on the worker (no watcher: nothing to watch) that takes
two steps: the handler's run up to leaving the context's scope (a nursery, whose exit
is a schedule point), then the stream's end.  More would be a regression in the
per-request path (docs/architecture.md, "Serving a request").
"""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from dynamo_trio import Context

    from .conftest import Cluster


class _StreamTasks(trio.abc.Instrument):
    """Counts the tasks spawned, and the steps taken, by the worker's stream tasks."""

    def __init__(self) -> None:
        self.spawned = 0
        self.steps = 0
        self.others_spawned: list[str] = []

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        if task.name.startswith("stream "):
            self.spawned += 1
        else:
            self.others_spawned.append(task.name)

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task.name.startswith("stream "):
            self.steps += 1


async def one_item(request: Any, context: Context) -> AsyncIterator[Any]:
    yield {"ok": request}


async def test_a_one_item_request_is_one_task_and_two_steps_on_the_worker(
    cluster: Cluster,
) -> None:
    client = await cluster.serve(one_item)
    async for _ in await client.generate(0):  # the connection is up before counting
        pass
    counts = _StreamTasks()
    rounds, concurrency = 5, 8

    async def caller(n: int) -> None:
        for r in range(rounds):
            got = [item.data() async for item in await client.generate(n * rounds + r)]
            assert got == [{"ok": n * rounds + r}]

    # No cyclic collection while counting: one can free an async generator abandoned
    # before (the suite's earlier garbage), and trio closes it in a task of its own.
    # What a request abandons is freed by reference counting, and counted still.
    gc.disable()
    trio.lowlevel.add_instrument(counts)
    try:
        async with trio.open_nursery() as nursery:
            for n in range(concurrency):
                nursery.start_soon(caller, n)
    finally:
        trio.lowlevel.remove_instrument(counts)
        gc.enable()
    requests = rounds * concurrency
    # Besides the callers, nothing per request: no watcher, no connection.
    others = [name for name in counts.others_spawned if "caller" not in name]
    assert (counts.spawned, counts.steps, others) == (requests, 2 * requests, [])
