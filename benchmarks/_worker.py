"""The benchmark worker: serves ``bench/worker/generate`` with a handler per request ``mode``.

Prints ``{"event": "ready"}`` once registered, and one JSON line per observed kill
(``{"event": "killed", "id": ..., "t": time.monotonic()}``) for the kill-latency benchmarks.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import trio

from dynamo_trio.runtime import DistributedRuntime, dynamo_worker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from dynamo_trio import Context


async def generate(request: dict[str, Any], context: Context) -> AsyncIterator[Any]:
    mode = request["mode"]
    if mode == "items":
        for i in range(request["n"]):
            yield {"i": i, "text": "tok"}
    elif mode == "one":
        yield {"ok": True}
    elif mode == "stop":
        yield {"waiting": True}
        await context.stopped()
        yield {"observed": time.monotonic()}
    elif mode == "cpu":  # computes ``ms`` between items and never awaits (CPU-bound)
        print(json.dumps({"event": "parked", "id": context.id()}), flush=True)
        try:
            while True:
                spin_until = time.perf_counter() + request["ms"] / 1000
                while time.perf_counter() < spin_until:
                    pass
                yield {"tok": 1}
        finally:
            observed = time.monotonic()
            print(json.dumps({"event": "killed", "id": context.id(), "t": observed}), flush=True)
    elif mode in ("silent", "parked"):
        if mode == "parked":  # says when it is waiting, for the scope-cancellation benchmark
            print(json.dumps({"event": "parked", "id": context.id()}), flush=True)
        try:
            await trio.sleep_forever()
        finally:
            observed = time.monotonic()
            print(json.dumps({"event": "killed", "id": context.id(), "t": observed}), flush=True)
        yield None  # unreachable: makes this an async generator


@dynamo_worker()
async def main(runtime: DistributedRuntime) -> None:
    endpoint = runtime.namespace("bench").component("worker").endpoint("generate")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(endpoint.serve_endpoint, generate)
        client = await endpoint.client()
        await client.wait_for_instances()
        print(json.dumps({"event": "ready"}), flush=True)


if __name__ == "__main__":
    trio.run(main)
