"""Request-plane benchmarks: a worker and its callers as separate processes over real TCP.

Run: ``python3 benchmarks/request_plane.py [--runs 5] [--systems both|trio]``

Measures, each ``--runs`` times, and prints the median run (min-max):

a. items/s of one stream of 20,000 small dict items;
b. requests/s of 1-item requests, sequential and 32 concurrent;
c. latency from the caller's ``stop_generating()`` to the handler observing it
   (p50/p90/p99 of 200);
d. latency from SIGKILL of a caller process to the handler observing the kill
   (p50/p90/p99; each sample is its own caller process).

When Dynamo 1.6.1 is installed (``benchmarks/setup_dynamo.sh``), a, and b are also
measured for it, alternately (dynamo-trio, Dynamo, dynamo-trio, Dynamo, ...; each run
starts its own worker, so the two never compete): a Python caller and a Python worker on
Dynamo's runtime and TCP request plane, under uvloop as Dynamo's users run them
(``_dynamo_rp.py``), with the same handler and the same request and item shapes.  The
ratio column is the median of the per-run ratios.

Latencies across processes use ``time.monotonic()`` (CLOCK_MONOTONIC is
system-wide on Linux).  The machines are shared and noisy: read medians, and
compare ratios rather than absolute figures.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from _bootstrap import ensure_project_python

ensure_project_python()

import trio  # noqa: E402
from _harness import (  # noqa: E402
    DEFAULT_DYNAMO_VENV,
    DYNAMO_VERSION,
    HERE,
    REPO,
    Child,
    Figure,
    Runs,
    dynamo_env,
    dynamo_python,
    git_describe,
    load_average,
    now_stamp,
    percentile,
    print_table,
    python_env,
    spawn,
    stop_all,
)

from dynamo_trio import Config, Context  # noqa: E402
from dynamo_trio.runtime import Client, DistributedRuntime  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import Sequence

TRIO = "dynamo-trio"
DYNAMO = f"Dynamo {DYNAMO_VERSION} (uvloop)"
ITEMS = "items/s, one stream of {n:,}"
SEQUENTIAL = "requests/s, sequential"
CONCURRENT = "requests/s, 32 concurrent"

__all__ = ["Child", "percentile", "spawn_script"]


async def spawn_script(
    nursery: trio.Nursery, script: str, env: dict[str, str], *args: str
) -> Child:
    """Run ``benchmarks/<script>`` with this Python; its JSON stdout lines are collected."""
    return await spawn(nursery, [sys.executable, str(HERE / script), *args], env, name=script)


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
        callers = [await spawn_script(nursery, "_caller.py", env) for _ in range(batch)]
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


def trio_env(kv: str) -> dict[str, str]:
    env = python_env()
    env.update(DYN_DISCOVERY_BACKEND="file", DYN_FILE_KV=kv, DYN_LOG="warning")
    env["PYTHONPATH"] = str(REPO)
    return env


async def measure_trio(args: argparse.Namespace, workdir: Path) -> dict[str, float]:
    """One run of dynamo-trio: a fresh worker process, this process as the caller."""
    env = trio_env(str(workdir / "kv-trio"))
    results: dict[str, float] = {}
    async with trio.open_nursery() as nursery:
        worker = await spawn_script(nursery, "_worker.py", env)
        try:
            await worker.wait_for("ready")
            async with DistributedRuntime(Config.from_env(env)) as runtime:
                endpoint = runtime.namespace("bench").component("worker").endpoint("generate")
                client = await endpoint.client()
                await client.wait_for_instances()
                await sequential_rate(client, 200)  # warm up the connection
                results[ITEMS.format(n=args.items)] = await items_per_second(client, args.items)
                results[SEQUENTIAL] = await sequential_rate(client, args.requests)
                results[CONCURRENT] = await concurrent_rate(client, args.requests, 32)
                if args.stop_samples:
                    stops = await stop_latencies(client, args.stop_samples)
                    for q, key in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
                        results[f"stop -> handler, {key}"] = percentile(stops, q)
        finally:
            with trio.CancelScope(shield=True):
                await stop_all([worker])
            nursery.cancel_scope.cancel()
    return results


async def measure_dynamo(python: Path, args: argparse.Namespace, workdir: Path) -> dict[str, float]:
    """One run of Dynamo: a fresh worker process and a caller process (``_dynamo_rp.py``)."""
    env = dynamo_env(str(workdir / "kv-dynamo"))
    script = str(HERE / "_dynamo_rp.py")
    async with trio.open_nursery() as nursery:
        worker = await spawn(
            nursery, [str(python), script, "worker"], env, name="dynamo-worker", logdir=workdir
        )
        caller: Child | None = None
        try:
            await worker.wait_for("ready", within=60)
            caller = await spawn(
                nursery,
                [
                    *(str(python), script, "caller", "--items", str(args.items)),
                    *("--requests", str(args.requests), "--concurrency", "32"),
                ],
                env,
                name="dynamo-caller",
                logdir=workdir,
            )
            result = await caller.wait_for("result", within=600)
        except BaseException:
            for child in (worker, caller):
                if child is not None and child.log_tail():
                    print(f"--- {child.describe()}:\n{child.log_tail()}", file=sys.stderr)
            raise
        finally:
            with trio.CancelScope(shield=True):
                await stop_all([c for c in (caller, worker) if c is not None])
            nursery.cancel_scope.cancel()
    return {
        ITEMS.format(n=args.items): result["items_per_s"],
        SEQUENTIAL: result["sequential"],
        CONCURRENT: result["concurrent"],
    }


async def main(args: argparse.Namespace) -> None:
    python = dynamo_python(args.dynamo_venv) if args.systems == "both" else None
    if args.systems == "both" and python is None:
        print(
            f"(no Dynamo {DYNAMO_VERSION} in {args.dynamo_venv}: dynamo-trio only; "
            "benchmarks/setup_dynamo.sh installs it)",
            file=sys.stderr,
        )
    names = [TRIO] + ([DYNAMO] if python is not None else [])
    started = now_stamp()
    print(
        f"request plane benchmark, {started}; {os.cpu_count()} cores; checkout: {git_describe()}",
        file=sys.stderr,
    )
    runs: Runs = {name: [] for name in names}
    loads: dict[str, list[str]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="dynamo-trio-bench-") as tmp:
        for run in range(args.runs):
            for name in names:
                workdir = Path(tmp) / f"run{run + 1}-{name.split()[0]}"
                workdir.mkdir()
                before = load_average()
                if name == TRIO:
                    figures = await measure_trio(args, workdir)
                else:
                    assert python is not None
                    figures = await measure_dynamo(python, args, workdir)
                after = load_average()
                loads[name].append(f"{before.split()[0]}-{after.split()[0]}")
                runs[name].append(figures)
                print(
                    f"run {run + 1}/{args.runs} {name} (load average {before} -> {after}): "
                    + ", ".join(
                        f"{label} {value:,.1f}" for label, value in figures.items() if "/s" in label
                    ),
                    file=sys.stderr,
                    flush=True,
                )
        if args.kill_samples:
            env = trio_env(str(Path(tmp) / "kv-kill"))
            async with trio.open_nursery() as nursery:
                worker = await spawn_script(nursery, "_worker.py", env)
                await worker.wait_for("ready")
                kills = await kill_latencies(nursery, worker, env, args.kill_samples)
                await stop_all([worker])
            for q, key in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
                runs[TRIO][-1][f"caller SIGKILL -> handler, {key}"] = percentile(kills, q)

    rows = [
        Figure(ITEMS.format(n=args.items)),
        Figure(SEQUENTIAL),
        Figure(CONCURRENT),
    ]
    if args.stop_samples:
        rows += [Figure(f"stop -> handler, {key}", "ms", False, 2) for key in ("p50", "p90", "p99")]
    if args.kill_samples:
        rows += [
            Figure(f"caller SIGKILL -> handler, {key}", "ms", False, 2)
            for key in ("p50", "p90", "p99")
        ]
    print_table(
        f"request plane: {started}, {args.runs} run(s) per system"
        + (f", alternating {' / '.join(names)}" if len(names) > 1 else "")
        + "; median (min-max) over runs; ratio = median of per-run ratios",
        rows,
        runs,
        names,
        DYNAMO if DYNAMO in names else None,
    )
    print(
        "load average (1 min) at the start-end of each run: "
        + "; ".join(f"{name}: {', '.join(loads[name])}" for name in names)
    )
    print(
        f"(stop: {args.stop_samples} samples per run; caller SIGKILL: {args.kill_samples} "
        "samples once, after the runs, one caller process each; dynamo-trio only)"
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per system (5)")
    parser.add_argument(
        "--systems",
        choices=["both", "trio"],
        default="both",
        help="both (default; dynamo-trio only when Dynamo is not installed) or trio",
    )
    parser.add_argument(
        "--dynamo-venv",
        type=Path,
        default=DEFAULT_DYNAMO_VENV,
        help=f"the venv setup_dynamo.sh made (default {DEFAULT_DYNAMO_VENV})",
    )
    parser.add_argument("--items", type=int, default=20_000, help="items in the long stream")
    parser.add_argument("--requests", type=int, default=2_000, help="1-item requests per rate")
    parser.add_argument("--stop-samples", type=int, default=200, help="0 skips")
    parser.add_argument("--kill-samples", type=int, default=100, help="0 skips")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be positive")
    return args


if __name__ == "__main__":
    trio.run(main, parse_args())
