"""Request-plane benchmarks: a worker and its callers as separate processes over real TCP.

Run: ``python benchmarks/request_plane.py [--runs 5]``

Measures, each ``--runs`` times, and prints the median run beside Dynamo 1.6.1's
figures on this machine (Rust runtime, Python handlers):

a. items/s of one stream of 20,000 small dict items;
b. requests/s of 1-item requests, sequential and 32 concurrent;
c. latency from the caller's ``stop_generating()`` to the handler observing it
   (p50/p90/p99 of 200);
d. latency from SIGKILL of a caller process to the handler observing the kill
   (p50/p90/p99; each sample is its own caller process).

Latencies across processes use ``time.monotonic()`` (CLOCK_MONOTONIC is
system-wide on Linux).  The machines are shared and noisy: read medians, and
compare ratios rather than absolute figures.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from dynamo_trio import Config, Context
from dynamo_trio.runtime import Client, DistributedRuntime

HERE = Path(__file__).parent
DYNAMO = {
    "items/s, one stream of 20,000": "~5,700",
    "requests/s, sequential": "~840",
    "requests/s, 32 concurrent": "~2,700",
    "stop -> handler, p50 ms": "0.4-1.0",
    "stop -> handler, p90 ms": "-",
    "stop -> handler, p99 ms": "0.6-2",
    "caller SIGKILL -> handler, p50 ms": "~2.5",
    "caller SIGKILL -> handler, p90 ms": "-",
    "caller SIGKILL -> handler, p99 ms": "~4-5",
}


class Child:
    """A child process whose JSON stdout lines are collected."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.events: list[dict[str, Any]] = []
        self._changed = trio.Event()

    async def read(self) -> None:
        assert self.process.stdout is not None
        buffer = b""
        async for chunk in self.process.stdout:
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                try:
                    self.events.append(json.loads(line))
                except ValueError:
                    continue
            self._changed.set()
            self._changed = trio.Event()

    async def wait_for(self, event: str, within: float = 30.0, **fields: Any) -> dict[str, Any]:
        with trio.fail_after(within):
            while True:
                for candidate in self.events:
                    if candidate.get("event") == event and all(
                        candidate.get(k) == v for k, v in fields.items()
                    ):
                        return candidate
                await self._changed.wait()


async def spawn(nursery: trio.Nursery, script: str, env: dict[str, str]) -> Child:
    process = await trio.lowlevel.open_process(
        [sys.executable, str(HERE / script)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        env=env,
    )
    child = Child(process)
    nursery.start_soon(child.read)
    return child


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def items_per_second(client: Client, n: int) -> float:
    start = time.perf_counter()
    count = 0
    async for _ in await client.generate({"mode": "items", "n": n}):
        count += 1
    assert count == n
    return n / (time.perf_counter() - start)


async def sequential_rate(client: Client, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        async for _ in await client.generate({"mode": "one"}):
            pass
    return n / (time.perf_counter() - start)


async def concurrent_rate(client: Client, n: int, concurrency: int) -> float:
    remaining = n

    async def loop() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            async for _ in await client.generate({"mode": "one"}):
                pass

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(loop)
    return n / (time.perf_counter() - start)


async def stop_latencies(client: Client, samples: int) -> list[float]:
    latencies = []
    for _ in range(samples):
        ctx = Context()
        stream = await client.generate({"mode": "stop"}, context=ctx)
        await stream.__anext__()
        stopped_at = time.monotonic()
        ctx.stop_generating()
        observed = [item.data()["observed"] async for item in stream]
        latencies.append((observed[0] - stopped_at) * 1000)
    return latencies


async def kill_latencies(
    nursery: trio.Nursery, worker: Child, env: dict[str, str], samples: int
) -> list[float]:
    latencies: list[float] = []
    batch = 10
    while len(latencies) < samples:
        callers = [await spawn(nursery, "_caller.py", env) for _ in range(batch)]
        sent = [await caller.wait_for("sent") for caller in callers]
        await trio.sleep(0.2)  # every request is in its handler
        for caller, event in zip(callers, sent, strict=True):
            killed_at = time.monotonic()
            os.kill(caller.process.pid, signal.SIGKILL)
            observed = await worker.wait_for("killed", id=event["id"])
            latencies.append((observed["t"] - killed_at) * 1000)
            await caller.process.wait()
            await trio.sleep(0.02)
    return latencies[:samples]


def summarise(label: str, runs: list[float], digits: int = 0) -> tuple[str, str, str]:
    median = statistics.median(runs)
    spread = f"{min(runs):,.{digits}f} .. {max(runs):,.{digits}f}"
    return label, f"{median:,.{digits}f}", spread


async def main(args: argparse.Namespace) -> None:
    kv = tempfile.mkdtemp(prefix="dynamo-bench-")
    env = {key: value for key, value in os.environ.items() if not key.startswith("DYN_")}
    env.update(DYN_DISCOVERY_BACKEND="file", DYN_FILE_KV=kv, DYN_LOG="warning")
    env["PYTHONPATH"] = str(HERE.parent)
    config = Config.from_env(env)
    results: dict[str, list[float]] = {key: [] for key in DYNAMO}
    async with trio.open_nursery() as nursery:
        worker = await spawn(nursery, "_worker.py", env)
        await worker.wait_for("ready")
        async with DistributedRuntime(config) as runtime:
            client = (
                await runtime.namespace("bench").component("worker").endpoint("generate").client()
            )
            await client.wait_for_instances()
            await sequential_rate(client, 200)  # warm up the connection
            for run in range(args.runs):
                results["items/s, one stream of 20,000"].append(
                    await items_per_second(client, args.items)
                )
                results["requests/s, sequential"].append(
                    await sequential_rate(client, args.requests)
                )
                results["requests/s, 32 concurrent"].append(
                    await concurrent_rate(client, args.requests, 32)
                )
                stops = await stop_latencies(client, args.stop_samples)
                for q, key in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
                    results[f"stop -> handler, {key} ms"].append(percentile(stops, q))
                print(f"run {run + 1}/{args.runs} done", file=sys.stderr, flush=True)
        kills = await kill_latencies(nursery, worker, env, args.kill_samples)
        for q, key in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
            results[f"caller SIGKILL -> handler, {key} ms"].append(percentile(kills, q))
        worker.process.send_signal(signal.SIGTERM)
        await worker.process.wait()

    rows = [
        summarise(label, values, 0 if "/s" in label else 2) for label, values in results.items()
    ]
    width = max(len(row[0]) for row in rows)
    print(f"\nrequest plane, {args.runs} runs (median, min .. max); Dynamo 1.6.1 for reference")
    print(f"{'metric':<{width}}  {'median':>10}  {'min .. max':>22}  {'Dynamo 1.6.1':>12}")
    for label, median, spread in rows:
        print(f"{label:<{width}}  {median:>10}  {spread:>22}  {DYNAMO[label]:>12}")
    print(f"(caller SIGKILL: {args.kill_samples} samples, one caller process each)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--requests", type=int, default=2_000)
    parser.add_argument("--stop-samples", type=int, default=200)
    parser.add_argument("--kill-samples", type=int, default=100)
    trio.run(main, parser.parse_args())
