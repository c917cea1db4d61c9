"""Simple server demonstration of request cancellation using context.is_stopped()."""

import asyncio

import trio

from dynamo_trio import dynamo_worker


class DemoServer:
    """Simple server that generates numbers and respects cancellation"""

    async def generate(self, request, context):
        """Generate numbers 0-999, checking for cancellation before each yield"""
        for i in range(1000):
            print(f"Server: Processing iteration {i}", flush=True)

            # Check if client requested cancellation
            if context.is_stopped():
                print(f"Server: Cancelled at iteration {i}", flush=True)
                raise asyncio.CancelledError

            await trio.sleep(0.1)  # Simulate some work
            print(f"Server: Sending iteration {i}", flush=True)
            yield i


@dynamo_worker()
async def main(runtime):
    component = runtime.namespace("demo").component("server")
    endpoint = component.endpoint("generate")
    handler = DemoServer()
    print("Demo server started", flush=True)
    await endpoint.serve_endpoint(handler.generate)


if __name__ == "__main__":
    trio.run(main)
