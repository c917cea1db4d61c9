"""A worker or a caller process for the multi-process tests.

Run as ``python tests/e2e/_procs.py worker`` or ``... caller MODE``.  Both read
their settings from the ``DYN_*`` environment and report what they see as JSON
lines on stdout, which the tests read.

The worker serves ``dynamo/backend/generate``; the request's ``mode`` picks the
handler's behaviour:

* ``count``: yield ``{"i": n}`` every ``period`` seconds; on stop, one final item;
* ``silent``: never yield (a long prefill);
* ``echo``: yield the request back once;
* ``thread``: wait in a thread that cannot be cancelled (blocking code), for ever.

The caller opens one stream and consumes it forever (the test kills it).
"""

from __future__ import annotations

import json
import sys
import threading
from typing import TYPE_CHECKING, Any

import trio

from dynamo_trio import Context
from dynamo_trio.runtime import DistributedRuntime, dynamo_worker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


def report(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


async def handler(request: dict[str, Any], context: Context) -> AsyncIterator[Any]:
    report("start", id=context.id(), mode=request["mode"])
    how = "returned"
    try:
        if request["mode"] == "echo":
            yield request
        elif request["mode"] == "silent":
            await trio.sleep_forever()
        elif request["mode"] == "thread":
            await trio.to_thread.run_sync(threading.Event().wait)
        else:
            i = 0
            while not context.is_stopped():
                await trio.sleep(request.get("period", 0.01))
                yield {"i": i}
                i += 1
            yield {"final": True}
    except BaseException as exc:
        how = type(exc).__name__
        raise
    finally:
        report(
            "exit",
            id=context.id(),
            state=context.state.name,
            reason=context.reason.value if context.reason else None,
            how=how,
        )


@dynamo_worker()
async def worker(runtime: DistributedRuntime) -> None:
    endpoint = runtime.namespace("dynamo").component("backend").endpoint("generate")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(endpoint.serve_endpoint, handler)
        client = await endpoint.client()
        await client.wait_for_instances()  # registered: the address is known
        report(
            "ready",
            instance_id=runtime.instance_id,
            address=runtime.address,
            status_url=runtime.status_url,
        )
    report("shut down")


@dynamo_worker()
async def caller(runtime: DistributedRuntime, mode: str) -> None:
    client = await runtime.namespace("dynamo").component("backend").endpoint("generate").client()
    await client.wait_for_instances()
    ctx = Context()
    stream = await client.generate({"mode": mode}, context=ctx)
    report("sent", id=ctx.id())
    async for item in stream:
        report("item", data=item.data())


if __name__ == "__main__":
    role = sys.argv[1]
    if role == "worker":
        trio.run(worker)
    else:
        trio.run(caller, sys.argv[2])
