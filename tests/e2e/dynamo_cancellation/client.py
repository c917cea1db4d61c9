"""Simple client demonstration of request cancellation using context.stop_generating()."""

import sys

import trio

from dynamo_trio import Context, dynamo_worker


async def demo_cancellation(client):
    """Perform the generation request with cancellation demonstration"""
    # Create context for cancellation control
    context = Context()

    # Start streaming request
    print("Starting streaming request...", flush=True)
    stream = await client.generate("dummy_request", context=context)

    iteration_count = 0
    async for response in stream:
        number = response.data()
        print(f"Client: Received {number}", flush=True)

        # Cancel after receiving 3 responses
        if iteration_count >= 2:
            print("Client: Cancelling after 3 responses...", flush=True)
            context.stop_generating()
            break

        iteration_count += 1

    print("Client: Stream stopped", flush=True)


@dynamo_worker()
async def main(runtime):
    use_middle_server = len(sys.argv) > 1 and sys.argv[1] == "--middle"
    component = "middle" if use_middle_server else "server"
    endpoint = runtime.namespace("demo").component(component).endpoint("generate")
    client = await endpoint.client()
    await client.wait_for_instances()
    print(f"Client connected to {component}", flush=True)
    await demo_cancellation(client)
    runtime.shutdown()


if __name__ == "__main__":
    trio.run(main)
