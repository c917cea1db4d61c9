"""Middle server that proxies requests to backend servers and passes context for cancellation."""

import trio

from dynamo_trio import dynamo_worker


class MiddleServer:
    """Middle server that forwards requests to backend servers"""

    def __init__(self, runtime):
        self.runtime = runtime
        self.backend_client = None

    async def initialize(self):
        """Initialize connection to backend servers"""
        endpoint = self.runtime.namespace("demo").component("server").endpoint("generate")
        self.backend_client = await endpoint.client()
        await self.backend_client.wait_for_instances()
        print("Middle server: Connected to backend servers", flush=True)

    async def generate(self, request, context):
        """Forward request to backend and pass context"""
        print("Middle server: Received request, forwarding to backend", flush=True)

        assert self.backend_client is not None, "Did you call initialize()?"

        # Forward request to backend with the same context: this passes the
        # cancellation context through to the backend
        stream = await self.backend_client.generate(request, context=context)

        # Stream responses back to client
        async for response in stream:
            data = response.data()
            print(f"Middle server: Forwarding response {data}", flush=True)
            yield data

        print("Middle server: Backend stream ended", flush=True)


@dynamo_worker()
async def main(runtime):
    handler = MiddleServer(runtime)
    await handler.initialize()
    endpoint = runtime.namespace("demo").component("middle").endpoint("generate")
    print("Middle server started", flush=True)
    await endpoint.serve_endpoint(handler.generate)


if __name__ == "__main__":
    trio.run(main)
