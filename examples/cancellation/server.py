"""The backend: yields a number every 0.1 s, forever, until its caller cancels.

Run: ``python examples/cancellation/server.py``
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

from dynamo_trio.runtime import DistributedRuntime, dynamo_worker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from dynamo_trio import Context


async def generate(request: Any, context: Context) -> AsyncIterator[int]:
    i = 0
    try:
        while True:
            if context.is_stopped():
                print(f"Server: Cancelled at iteration {i} ({context.reason})", flush=True)
                return
            await trio.sleep(0.1)
            print(f"Server: Sending {i}", flush=True)
            yield i
            i += 1
    except (trio.Cancelled, GeneratorExit):
        # A kill lands as Cancelled while the handler awaits, or as GeneratorExit
        # while it waits at a yield for the runtime to take its item.
        print(f"Server: Killed at iteration {i} ({context.reason})", flush=True)
        raise


@dynamo_worker()
async def main(runtime: DistributedRuntime) -> None:
    endpoint = runtime.namespace("demo").component("server").endpoint("generate")
    print("Server: serving demo/server/generate", flush=True)
    await endpoint.serve_endpoint(generate)


if __name__ == "__main__":
    trio.run(main)
