"""The client: reads three responses, then cancels (stop, or kill with ``--kill``).

Run: ``python examples/cancellation/client.py [--middle] [--kill]``
"""

from __future__ import annotations

import argparse

import trio

from dynamo_trio import Context
from dynamo_trio.runtime import DistributedRuntime, dynamo_worker


@dynamo_worker()
async def main(runtime: DistributedRuntime, middle: bool, kill: bool) -> None:
    component = "middle" if middle else "server"
    client = await runtime.namespace("demo").component(component).endpoint("generate").client()
    await client.wait_for_instances()
    context = Context()
    stream = await client.generate("hello", context=context)
    received = 0
    async for item in stream:
        print(f"Client: Received response {item.data()}", flush=True)
        received += 1
        if received == 3:
            if kill:
                print("Client: Killing after 3 responses...", flush=True)
                context.kill()
            else:
                print("Client: Cancelling after 3 responses...", flush=True)
                context.stop_generating()
    print(f"Client: Stream ended after {received} responses ({stream.outcome})", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--middle", action="store_true", help="go through middle_server.py")
    parser.add_argument("--kill", action="store_true", help="kill instead of stop")
    args = parser.parse_args()
    trio.run(main, args.middle, args.kill)
