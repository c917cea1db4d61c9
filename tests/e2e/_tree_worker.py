"""The worker process of the structured-cancellation state machine (``test_tree_machine.py``).

``python tests/e2e/_tree_worker.py worker EVENTS`` serves ``dynamo/tree/work``:
each request (``{"tag": ...}``) yields one item, then waits for its context to
be stopped (then yields a last item and returns) or killed (then its scope
cancels it mid-``await``).  It never ends on its own, so every end is a
cancellation.  Starts and exits are appended to the file ``EVENTS`` as JSON
lines with ``time.monotonic()`` stamps (one clock for all processes here).

``python tests/e2e/_tree_worker.py caller TAG`` makes one such call and
reports ``sent`` on stdout (the test then SIGKILLs it).
"""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Any

import trio

from dynamo_trio import Context, DistributedRuntime, dynamo_worker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


class Events:
    def __init__(self, path: str) -> None:
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process

    def write(self, event: str, **fields: Any) -> None:
        self._file.write(json.dumps({"event": event, "t": time.monotonic(), **fields}) + "\n")
        self._file.flush()


@dynamo_worker()
async def worker(runtime: DistributedRuntime, events_path: str) -> None:
    events = Events(events_path)

    async def work(request: dict[str, Any], context: Context) -> AsyncIterator[Any]:
        tag = request["tag"]
        events.write("start", tag=tag)
        how = "returned"
        try:
            yield {"tag": tag}
            await context.stopped()  # a kill cancels this await; a stop ends it
            yield {"tag": tag, "final": True}
        except BaseException as exc:
            how = type(exc).__name__
            raise
        finally:
            events.write(
                "exit",
                tag=tag,
                state=context.state.name,
                reason=context.reason.value if context.reason else None,
                how=how,
            )

    endpoint = runtime.namespace("dynamo").component("tree").endpoint("work")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(endpoint.serve_endpoint, work)
        client = await endpoint.client()
        await client.wait_for_instances()
        print(json.dumps({"event": "ready", "status_url": runtime.status_url}), flush=True)


@dynamo_worker()
async def caller(runtime: DistributedRuntime, tag: str) -> None:
    client = await runtime.namespace("dynamo").component("tree").endpoint("work").client()
    await client.wait_for_instances()
    stream = await client.generate({"tag": tag}, context=Context(tag))
    await stream.__anext__()
    print(json.dumps({"event": "sent"}), flush=True)
    await trio.sleep_forever()


if __name__ == "__main__":
    trio.run(worker if sys.argv[1] == "worker" else caller, sys.argv[2])
