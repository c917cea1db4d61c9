"""The KServe gRPC frontend with the official Triton client: infers/s and cancel latency.

Run: ``python benchmarks/kserve.py [--unary 2000] [--stream 5000] [--cancels 50]``

Starts a frontend (``--kserve-grpc-port``) and a ``mock-tensor`` worker
(``_tensor_worker.py``) on loopback, then, with ``tritonclient.grpc``:

- unary infers/s, one at a time and 32 in flight (``async_infer``), 16 INT32s each;
- streamed infers/s: one ``ModelStreamInfer`` call, 256 requests in flight, until the
  last response;
- cancel latency: an ``async_infer`` whose worker waits for ever is cancelled with
  ``future.cancel()``; the time from the cancel to the worker's handler being cancelled
  (``time.monotonic()`` on both sides: one clock for every process on Linux).

Dynamo 1.6.1's KServe frontend is not measured beside it: it needs a Triton-compatible
Python worker of its own (and ``setup_dynamo.sh``'s venv).
"""

from __future__ import annotations

import argparse
import queue
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _bootstrap import NEEDED, ensure_project_python

ensure_project_python((*NEEDED, "tritonclient", "numpy"))

import numpy as np  # noqa: E402
import trio  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402
from _harness import (  # noqa: E402
    REPO,
    Child,
    free_port,
    load_average,
    percentile,
    python_env,
    spawn,
    stop_all,
)

MODEL = "mock-tensor"


def tensor(n: int) -> grpcclient.InferInput:
    infer_input = grpcclient.InferInput("INPUT0", [16], "INT32")
    infer_input.set_data_from_numpy(np.full(16, n, dtype=np.int32))
    return infer_input


def unary_sequential(address: str, count: int) -> float:
    client = grpcclient.InferenceServerClient(address)
    try:
        started = time.perf_counter()
        for n in range(count):
            client.infer(MODEL, [tensor(n)])
        return count / (time.perf_counter() - started)
    finally:
        client.close()


def unary_concurrent(address: str, count: int, in_flight: int) -> float:
    client = grpcclient.InferenceServerClient(address)
    slots = threading.Semaphore(in_flight)
    done = queue.Queue[object]()

    def finished(result: object, error: object) -> None:
        slots.release()
        done.put(error)

    try:
        started = time.perf_counter()
        for n in range(count):
            slots.acquire()
            client.async_infer(MODEL, [tensor(n)], callback=finished)
        errors = [done.get(timeout=60) for _ in range(count)]
        rate = count / (time.perf_counter() - started)
    finally:
        client.close()
    failed = [error for error in errors if error is not None]
    assert not failed, f"{len(failed)} failed: {[str(error) for error in failed[:3]]}"
    return rate


def streamed(address: str, count: int, in_flight: int) -> float:
    client = grpcclient.InferenceServerClient(address)
    slots = threading.Semaphore(in_flight)
    done = queue.Queue[object]()

    def finished(result: object, error: object) -> None:
        slots.release()
        done.put(error)

    try:
        client.start_stream(callback=finished)
        started = time.perf_counter()
        for n in range(count):
            slots.acquire()
            client.async_stream_infer(MODEL, [tensor(n)], request_id=str(n))
        errors = [done.get(timeout=60) for _ in range(count)]
        rate = count / (time.perf_counter() - started)
        client.stop_stream()
    finally:
        client.close()
    failed = [error for error in errors if error is not None]
    assert not failed, f"{len(failed)} failed: {[str(error) for error in failed[:3]]}"
    return rate


async def cancel_latencies(address: str, worker: Child, count: int) -> list[float]:
    client = grpcclient.InferenceServerClient(address)
    samples = []
    try:
        for n in range(count):
            request_id = f"cancel-{n}"
            future = await trio.to_thread.run_sync(
                lambda request_id=request_id: client.async_infer(
                    MODEL,
                    [tensor(0)],
                    callback=lambda result, error: None,
                    request_id=request_id,
                    parameters={"delay_ms": 3_600_000, "report": True},
                )
            )
            await worker.wait_for("started", id=request_id)
            cause = time.monotonic()
            future.cancel()
            observed: dict[str, Any] = await worker.wait_for("cancelled", id=request_id)
            samples.append((observed["t"] - cause) * 1000)
    finally:
        client.close()
    return samples


async def main(args: argparse.Namespace) -> None:
    env = python_env()
    env.update(
        DYN_DISCOVERY_BACKEND="file",
        DYN_FILE_KV=tempfile.mkdtemp(prefix="dynamo-bench-"),
        DYN_LOG="warning",
        PYTHONPATH=str(REPO),
    )
    http, grpc = free_port(), free_port()
    address = f"127.0.0.1:{grpc}"
    logdir = Path(tempfile.mkdtemp(prefix="dynamo-bench-logs-"))
    async with trio.open_nursery() as nursery:
        worker = await spawn(
            nursery,
            [sys.executable, str(REPO / "benchmarks/_tensor_worker.py")],
            env,
            name="tensor-worker",
            logdir=logdir,
        )
        frontend = await spawn(
            nursery,
            [
                sys.executable,
                "-m",
                "dynamo_trio",
                "frontend",
                "--http-port",
                str(http),
                "--kserve-grpc-port",
                str(grpc),
            ],
            env,
            name="frontend",
            logdir=logdir,
        )
        try:
            await worker.wait_for("ready")
            client = grpcclient.InferenceServerClient(address)
            with trio.fail_after(30):
                while not await trio.to_thread.run_sync(_ready, client):  # noqa: ASYNC110
                    await trio.sleep(0.1)
            client.close()
            print(f"load average before: {load_average()}")
            await trio.to_thread.run_sync(unary_sequential, address, 200)  # warm-up
            sequential = await trio.to_thread.run_sync(unary_sequential, address, args.unary)
            concurrent = await trio.to_thread.run_sync(unary_concurrent, address, args.unary, 32)
            stream = await trio.to_thread.run_sync(streamed, address, args.stream, 256)
            cancels = await cancel_latencies(address, worker, args.cancels)
            print(f"unary infers/s, 1 in flight:   {sequential:,.0f}")
            print(f"unary infers/s, 32 in flight:  {concurrent:,.0f}")
            print(f"streamed infers/s, one call, 256 in flight: {stream:,.0f}")
            print(
                f"future.cancel() -> handler cancelled, ms: p50 {statistics.median(cancels):.2f}"
                f" p99 {percentile(cancels, 0.99):.2f} max {max(cancels):.2f}"
                f" ({len(cancels)} samples)"
            )
            print(f"load average after: {load_average()}")
        finally:
            await stop_all([frontend, worker])
            nursery.cancel_scope.cancel()


def _ready(client: grpcclient.InferenceServerClient) -> bool:
    try:
        return bool(client.is_model_ready(MODEL))
    except Exception:
        return False


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--unary", type=int, default=2000)
    parser.add_argument("--stream", type=int, default=5000)
    parser.add_argument("--cancels", type=int, default=50)
    trio.run(main, parser.parse_args())
