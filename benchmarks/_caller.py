"""A caller process for the caller-kill benchmark: opens one silent stream and waits to die."""

from __future__ import annotations

import json

import trio

from dynamo_trio import Context
from dynamo_trio.runtime import DistributedRuntime, dynamo_worker


@dynamo_worker(handle_signals=False)
async def main(runtime: DistributedRuntime) -> None:
    client = await runtime.namespace("bench").component("worker").endpoint("generate").client()
    await client.wait_for_instances()
    ctx = Context()
    stream = await client.generate({"mode": "silent"}, context=ctx)
    print(json.dumps({"event": "sent", "id": ctx.id()}), flush=True)
    async for _ in stream:
        pass


if __name__ == "__main__":
    trio.run(main)
