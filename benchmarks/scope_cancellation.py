"""Latency from a trio cancellation of a caller's scope to the remote handler being cancelled.

Run: ``python benchmarks/scope_cancellation.py [--samples 200]``

The caller opens ``parent.scope()``, makes a call linked under ``parent`` to a
worker process whose handler waits (a long prefill), and then cancels it one of
two ways, alternating A B A B so that both see the same machine:

A. an enclosing ``trio.move_on_at`` fires while the caller awaits something
   else (the scope's deadline is the cause);
B. ``parent.kill()`` (the moment of the call is the cause).

Each sample is the time from the cause to the worker's handler observing its
cancellation (``time.monotonic()`` on both sides: one clock for every process
on Linux).  They should be the same: both are one ``ctl kill`` frame.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import tempfile
import time

from _bootstrap import ensure_project_python

ensure_project_python()

import trio  # noqa: E402
from _harness import REPO, Child, percentile, python_env  # noqa: E402
from request_plane import spawn_script  # noqa: E402

from dynamo_trio import Config, Context  # noqa: E402
from dynamo_trio.runtime import Client, DistributedRuntime  # noqa: E402

_AHEAD = 0.02  # how far ahead the enclosing deadline is set


async def one(client: Client, worker: Child, how: str, serial: int) -> float:
    parent = Context(f"{how}-{serial}")
    keep = []
    deadline = trio.current_time() + 3600.0
    with trio.move_on_at(deadline) as enclosing:
        async with parent.scope():
            keep.append(await client.generate({"mode": "parked"}, context=parent))
            await worker.wait_for("parked", id=parent.id())
            if how == "kill":
                cause = time.monotonic()
                parent.kill()
            else:
                enclosing.deadline = trio.current_time() + _AHEAD
                cause = time.monotonic() + _AHEAD
            await trio.sleep_forever()  # the caller's other work: the cancellation strikes here
    observed = await worker.wait_for("killed", id=parent.id())
    return float(observed["t"] - cause) * 1000


async def main(args: argparse.Namespace) -> None:
    env = python_env()
    env.update(
        DYN_DISCOVERY_BACKEND="file",
        DYN_FILE_KV=tempfile.mkdtemp(prefix="dynamo-bench-"),
        DYN_LOG="warning",
        PYTHONPATH=str(REPO),
    )
    samples: dict[str, list[float]] = {"enclosing move_on_at": [], "parent.kill()": []}
    async with trio.open_nursery() as nursery:
        worker = await spawn_script(nursery, "_worker.py", env)
        await worker.wait_for("ready")
        async with DistributedRuntime(Config.from_env(env)) as runtime:
            endpoint = runtime.namespace("bench").component("worker").endpoint("generate")
            client = await endpoint.client()
            await client.wait_for_instances()
            for i in range(10):  # warm up the connection and both paths
                await one(client, worker, "kill", -i)
                await one(client, worker, "scope", -i)
            for i in range(args.samples):
                samples["enclosing move_on_at"].append(await one(client, worker, "scope", i))
                samples["parent.kill()"].append(await one(client, worker, "kill", i))
        worker.process.send_signal(signal.SIGTERM)
        await worker.process.wait()

    print(f"\ncause -> remote handler cancelled, ms ({args.samples} samples each, alternating)")
    print(f"{'cause':<22} {'p50':>7} {'p90':>7} {'p99':>7} {'max':>7}")
    for label, values in samples.items():
        row = [percentile(values, q) for q in (0.5, 0.9, 0.99)] + [max(values)]
        print(f"{label:<22} " + " ".join(f"{v:7.3f}" for v in row))
    a, b = (statistics.median(v) for v in samples.values())
    print(f"median ratio enclosing / kill: {a / b:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=200)
    trio.run(main, parser.parse_args())
