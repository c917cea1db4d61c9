"""Kill latency of a CPU-bound handler: one that computes between items and never awaits.

Run: ``python benchmarks/cpu_bound_kill.py [--samples 20] [--levels 0.5,5,20,50,200]``

A worker process serves a handler that spins for N ms of CPU per item (N in 0.5,
5, 20, 50, 200, alternating between levels so that every level sees the same
machine).  The caller reads the first item, kills its context, and the sample is
the time from ``kill()`` to the handler's ``finally`` (``time.monotonic()`` on
both sides), in ms and in items' worth of the handler's CPU.  The worker lets the
reader run at least every 32 items or 20 ms of a handler's time, so a kill waits
for at most the item being computed after that slice.
"""

from __future__ import annotations

import argparse
import signal
import tempfile
import time

from _bootstrap import ensure_project_python

ensure_project_python()

import trio  # noqa: E402
from _harness import REPO, Child, percentile, python_env  # noqa: E402
from request_plane import spawn_script  # noqa: E402

from dynamo_trio import Config, Context  # noqa: E402
from dynamo_trio.runtime import Client, DistributedRuntime  # noqa: E402

_LEVELS = "0.5,5,20,50,200"  # ms of CPU per item


async def one(client: Client, worker: Child, ms: float, serial: int) -> float:
    """One sample: ms from ``kill()`` to the handler observing it."""
    context = Context(f"cpu-{ms}-{serial}")
    stream = await client.generate({"mode": "cpu", "ms": ms}, context=context)
    await worker.wait_for("parked", id=context.id())
    await stream.__anext__()
    cause = time.monotonic()
    context.kill()
    observed = await worker.wait_for("killed", id=context.id())
    await stream.aclose()
    return float(observed["t"] - cause) * 1000


async def main(args: argparse.Namespace) -> None:
    env = python_env()
    env.update(
        DYN_DISCOVERY_BACKEND="file",
        DYN_FILE_KV=tempfile.mkdtemp(prefix="dynamo-bench-"),
        DYN_LOG="warning",
        PYTHONPATH=str(REPO),
    )
    levels = [float(level) for level in args.levels.split(",")]
    samples: dict[float, list[float]] = {ms: [] for ms in levels}
    async with trio.open_nursery() as nursery:
        worker = await spawn_script(nursery, "_worker.py", env)
        await worker.wait_for("ready")
        async with DistributedRuntime(Config.from_env(env)) as runtime:
            endpoint = runtime.namespace("bench").component("worker").endpoint("generate")
            client = await endpoint.client()
            await client.wait_for_instances()
            for i in range(3):  # warm up the connection and the handler
                await one(client, worker, 0.5, -i)
            for i in range(args.samples):
                for ms in levels:
                    samples[ms].append(await one(client, worker, ms, i))
        worker.process.send_signal(signal.SIGTERM)
        await worker.process.wait()

    print(f"\nkill() -> CPU-bound handler cancelled ({args.samples} samples each, alternating)")
    print(f"{'CPU per item':>12} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'p50 items':>10}")
    for ms, values in samples.items():
        p50, p99 = percentile(values, 0.5), percentile(values, 0.99)
        print(f"{ms:>9.1f} ms {p50:8.2f} {p99:8.2f} {max(values):8.2f} {p50 / ms:10.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--levels", default=_LEVELS, help="ms of CPU per item, comma-separated")
    trio.run(main, parser.parse_args())
