"""A middle hop: forwards each request to the backend, passing its own context along.

Run: ``python examples/cancellation/middle_server.py`` (with ``server.py`` running)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

from dynamo_trio.runtime import Client, DistributedRuntime, dynamo_worker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from dynamo_trio import Context


class MiddleServer:
    def __init__(self, backend: Client) -> None:
        self.backend = backend

    async def generate(self, request: Any, context: Context) -> AsyncIterator[Any]:
        # Passing the incoming context links the backend call under it: whatever
        # cancels this request (stop or kill) reaches the backend too.
        stream = await self.backend.generate(request, context=context)
        async for item in stream:
            print(f"Middle server: Forwarding response {item.data()}", flush=True)
            yield item.data()
        print(f"Middle server: backend stream ended ({stream.outcome})", flush=True)


@dynamo_worker()
async def main(runtime: DistributedRuntime) -> None:
    backend = await runtime.namespace("demo").component("server").endpoint("generate").client()
    await backend.wait_for_instances()
    endpoint = runtime.namespace("demo").component("middle").endpoint("generate")
    print("Middle server: serving demo/middle/generate", flush=True)
    await endpoint.serve_endpoint(MiddleServer(backend).generate)


if __name__ == "__main__":
    trio.run(main)
