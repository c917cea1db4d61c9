"""Dynamo 1.6.1's side of the request-plane benchmark, on Dynamo's own runtime under uvloop.

Runs in the Dynamo venv (``setup_dynamo.sh``), with file discovery and the TCP request
plane (the environment ``request_plane.py`` gives it):

    python benchmarks/_dynamo_rp.py worker
    python benchmarks/_dynamo_rp.py caller --items 20000 --requests 2000 --concurrency 32

The worker serves ``bench.worker.generate`` with the same handler modes as dynamo-trio's
``_worker.py`` (``items``: ``n`` small dict items; ``one``: a single item) and prints
``{"event": "ready"}``.  The caller measures, like ``request_plane.py`` does for
dynamo-trio: one stream of ``--items`` items (items/s), ``--requests`` sequential 1-item
requests (requests/s), the same spread over ``--concurrency`` tasks; and prints
``{"event": "result", ...}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import uvloop
from dynamo.runtime import DistributedRuntime

ENDPOINT = "bench.worker.generate"


def runtime() -> Any:
    return DistributedRuntime(asyncio.get_running_loop(), "file", "tcp", event_plane="zmq")


async def generate(request: dict[str, Any]) -> Any:
    mode = request["mode"]
    if mode == "items":
        for i in range(request["n"]):
            yield {"i": i, "text": "tok"}
    elif mode == "one":
        yield {"ok": True}
    else:
        raise ValueError(f"unknown mode {mode!r}")


async def worker() -> None:
    endpoint = runtime().endpoint(ENDPOINT)
    serving = asyncio.ensure_future(endpoint.serve_endpoint(generate))
    client = await endpoint.client()
    await client.wait_for_instances()
    print(json.dumps({"event": "ready"}), flush=True)
    await serving


async def caller(args: argparse.Namespace) -> None:
    client = await runtime().endpoint(ENDPOINT).client()
    await client.wait_for_instances()

    async def one() -> None:
        async for _ in await client.generate({"mode": "one"}):
            pass

    for _ in range(200):  # warm up the connection
        await one()

    start = time.perf_counter()
    count = 0
    async for _ in await client.generate({"mode": "items", "n": args.items}):
        count += 1
    items_per_s = count / (time.perf_counter() - start)
    if count != args.items:
        raise RuntimeError(f"{count} items, not {args.items}")

    start = time.perf_counter()
    for _ in range(args.requests):
        await one()
    sequential = args.requests / (time.perf_counter() - start)

    remaining = args.requests

    async def loop() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await one()

    start = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(args.concurrency)))
    concurrent = args.requests / (time.perf_counter() - start)
    result = {
        "event": "result",
        "items_per_s": items_per_s,
        "sequential": sequential,
        "concurrent": concurrent,
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("role", choices=["worker", "caller"])
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--requests", type=int, default=2_000)
    parser.add_argument("--concurrency", type=int, default=32)
    arguments = parser.parse_args()
    if arguments.role == "worker":
        uvloop.run(worker())
    else:
        uvloop.run(caller(arguments))
