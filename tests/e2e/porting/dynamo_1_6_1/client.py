"""A client written against Dynamo 1.6.1's Python API (``ai-dynamo-runtime==1.6.1``).

It calls ``porting.backend.generate`` each way Dynamo 1.6.1 offers (generate,
round_robin, random, direct; annotated and not; with a context carrying
metadata) and stops one call after two items; it prints one JSON line per call.
"""

import json

import uvloop
from dynamo.runtime import Context, DistributedRuntime, dynamo_worker


def report(call, **fields):
    print(json.dumps({"call": call, **fields}), flush=True)


@dynamo_worker()
async def worker(runtime: DistributedRuntime):
    client = await runtime.endpoint("porting.backend.generate").client()
    instance_ids = await client.wait_for_instances()

    context = Context(metadata={"tenant": "acme"})
    stream = await client.generate({"n": 3}, context=context)
    items = [item.data() async for item in stream]
    report("generate", request_id=context.id(), items=items)

    stream = await client.round_robin({"n": 2}, annotated=False)
    report("round_robin", items=[data async for data in stream])

    stream = await client.random({"n": 2}, annotated=False)
    report("random", items=[data async for data in stream])

    stream = await client.direct({"n": 1}, instance_ids[0], annotated=False)
    report("direct", instance_id=instance_ids[0], items=[data async for data in stream])

    context = Context()
    stream = await client.generate({"n": 1000, "delay": 0.05}, context=context)
    received = 0
    async for _item in stream:
        received += 1
        if received == 2:
            context.stop_generating()
            break
    report("stopped", request_id=context.id(), received=received, stopped=context.is_stopped())


if __name__ == "__main__":
    uvloop.run(worker())
