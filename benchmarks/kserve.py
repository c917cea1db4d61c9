"""KServe gRPC frontends under the official Triton client: dynamo-trio beside Dynamo 1.6.1.

Run: ``python benchmarks/kserve.py [--rounds 2] [--unary 2000] [--stream 5000] [--cancels 50]``
``[--versus CHECKOUT]``

Each system is a frontend serving KServe gRPC and a ``mock-tensor`` worker on loopback:
dynamo-trio's (``--kserve-grpc-port``, ``_tensor_worker.py``), and, when
``setup_dynamo.sh`` has installed it, Dynamo 1.6.1's (``python -m dynamo.frontend
--kserve-grpc-server``, ``_dynamo_tensor_worker.py`` on Dynamo's Python runtime).  The
systems take turns (A B A B, ``--rounds``), each started afresh, under the same
``tritonclient.grpc`` load:

- unary infers/s, one at a time and 32 in flight (``async_infer``), 16 INT32s each;
- streamed infers/s: one ``ModelStreamInfer`` call, 256 requests in flight, until the
  last response;
- cancel latency: an ``async_infer`` whose worker waits for an hour is cancelled with
  ``future.cancel()``; the time from the cancel to the worker seeing it (``time.monotonic()``
  on both sides: one clock for every process on Linux);
- the CPU time the frontend and the worker processes spent per infer in the 32-in-flight
  run (``/proc``): a measure the other work on a shared machine moves less than rates.

``--versus CHECKOUT``: dynamo-trio beside the dynamo-trio of another checkout of the
repository (an older commit: ``git archive <commit> | tar -x -C <dir>``) instead of
Dynamo, taking turns the same way.
"""

from __future__ import annotations

import argparse
import queue
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from _bootstrap import NEEDED, ensure_project_python

ensure_project_python((*NEEDED, "tritonclient", "numpy"))

import numpy as np  # noqa: E402
import trio  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402
from _harness import (  # noqa: E402
    DEFAULT_DYNAMO_VENV,
    DYNAMO_VERSION,
    HERE,
    REPO,
    Child,
    Figure,
    Runs,
    cpu_seconds,
    dynamo_env,
    dynamo_python,
    free_port,
    git_describe,
    load_average,
    now_stamp,
    percentile,
    print_table,
    python_env,
    spawn,
    stop_all,
)

MODEL = "mock-tensor"
TRIO = "dynamo-trio"
DYNAMO = f"dynamo-{DYNAMO_VERSION}"

FIGURES = [
    Figure("unary infers/s, 1 in flight"),
    Figure("unary infers/s, 32 in flight"),
    Figure("streamed infers/s, 256 in flight"),
    Figure("cancel -> worker sees it, p50", "ms", higher_is_better=False, digits=2),
    Figure("cancel -> worker sees it, p99", "ms", higher_is_better=False, digits=2),
    Figure("cancels the worker never saw", ratio=False),
    Figure("frontend CPU per unary infer, 32 in flight", "us", higher_is_better=False),
    Figure("worker CPU per unary infer, 32 in flight", "us", higher_is_better=False),
]


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


async def cancel_latencies(address: str, worker: Child, count: int) -> tuple[list[float], int]:
    """The milliseconds from each ``future.cancel()`` to the worker seeing it, and how
    many cancels it did not see within 5 s."""
    client = grpcclient.InferenceServerClient(address)
    samples, missed = [], 0
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
            try:
                observed = await worker.wait_for("cancelled", within=5, id=request_id)
            except trio.TooSlowError:
                missed += 1
                continue
            samples.append((observed["t"] - cause) * 1000)
    finally:
        client.close()
    return samples, missed


@dataclass
class Deployment:
    address: str
    frontend: Child
    worker: Child

    @property
    def children(self) -> list[Child]:
        return [self.frontend, self.worker]


async def start_trio(nursery: trio.Nursery, workdir: Path, repo: Path = REPO) -> Deployment:
    """dynamo-trio's frontend and worker, from the checkout ``repo``."""
    env = python_env()
    env.update(
        DYN_DISCOVERY_BACKEND="file",
        DYN_FILE_KV=str(workdir / "kv"),
        DYN_LOG="warning",
        PYTHONPATH=str(repo),
    )
    http, grpc = free_port(), free_port()
    worker = await spawn(
        nursery,
        [sys.executable, str(repo / "benchmarks" / "_tensor_worker.py")],
        env,
        name="trio-worker",
        logdir=workdir,
    )
    frontend = await spawn(
        nursery,
        [
            # -P: the checkout on PYTHONPATH, not the working directory, is dynamo_trio.
            *(sys.executable, "-P", "-m", "dynamo_trio", "frontend"),
            *("--http-port", str(http), "--kserve-grpc-port", str(grpc)),
        ],
        env,
        name="trio-frontend",
        logdir=workdir,
    )
    await worker.wait_for("ready", within=60)
    return Deployment(f"127.0.0.1:{grpc}", frontend, worker)


async def start_dynamo(nursery: trio.Nursery, workdir: Path, python: Path) -> Deployment:
    env = dynamo_env(str(workdir / "kv"))
    grpc = free_port()
    worker = await spawn(
        nursery,
        [str(python), str(HERE / "_dynamo_tensor_worker.py")],
        env,
        name="dynamo-worker",
        logdir=workdir,
    )
    frontend = await spawn(
        nursery,
        [
            *(str(python), "-m", "dynamo.frontend", "--kserve-grpc-server"),
            *("--http-host", "127.0.0.1", "--http-port", str(grpc)),
            *("--grpc-metrics-port", str(free_port())),
        ],
        env,
        name="dynamo-frontend",
        logdir=workdir,
    )
    await worker.wait_for("ready", within=60)
    return Deployment(f"127.0.0.1:{grpc}", frontend, worker)


def _ready(address: str) -> bool:
    client = grpcclient.InferenceServerClient(address)
    try:
        return bool(client.is_model_ready(MODEL))
    except Exception:
        return False
    finally:
        client.close()


async def measure(deployment: Deployment, args: argparse.Namespace) -> dict[str, float]:
    address = deployment.address
    with trio.fail_after(60):
        while not await trio.to_thread.run_sync(_ready, address):
            for child in deployment.children:
                if child.process.returncode is not None:
                    raise RuntimeError(f"{child.describe()} exited:\n{child.log_tail()}")
            await trio.sleep(0.2)
    await trio.to_thread.run_sync(unary_sequential, address, 200)  # warm-up
    sequential = await trio.to_thread.run_sync(unary_sequential, address, args.unary)
    pids = (deployment.frontend.pid, deployment.worker.pid)
    cpu_before = [cpu_seconds(pid) for pid in pids]
    concurrent = await trio.to_thread.run_sync(unary_concurrent, address, args.unary, 32)
    frontend_cpu, worker_cpu = (
        (cpu_seconds(pid) - before) / args.unary * 1e6
        for pid, before in zip(pids, cpu_before, strict=True)
    )
    stream = await trio.to_thread.run_sync(streamed, address, args.stream, 256)
    cancels, missed = await cancel_latencies(address, deployment.worker, args.cancels)
    run = {
        FIGURES[0].label: sequential,
        FIGURES[1].label: concurrent,
        FIGURES[2].label: stream,
        FIGURES[5].label: float(missed),
        FIGURES[6].label: frontend_cpu,
        FIGURES[7].label: worker_cpu,
    }
    if cancels:
        run[FIGURES[3].label] = statistics.median(cancels)
        run[FIGURES[4].label] = percentile(cancels, 0.99)
    return run


async def main(args: argparse.Namespace) -> None:
    versus: Path | None = args.versus
    python = None if versus is not None else dynamo_python(args.dynamo_venv)
    other = f"{TRIO} ({versus})" if versus is not None else DYNAMO
    systems = [TRIO] if python is None and versus is None else [TRIO, other]
    if python is None and versus is None:
        print(f"(no Dynamo {DYNAMO_VERSION} in {args.dynamo_venv}: run setup_dynamo.sh)")
    runs: Runs = {system: [] for system in systems}
    print(f"{now_stamp()}  {git_describe()}")
    print(f"load average before: {load_average()}")
    for round_ in range(args.rounds):
        for system in systems:
            workdir = Path(tempfile.mkdtemp(prefix=f"kserve-bench-{systems.index(system)}-"))
            async with trio.open_nursery() as nursery:
                if system == TRIO:
                    deployment = await start_trio(nursery, workdir)
                elif versus is not None:
                    deployment = await start_trio(nursery, workdir, versus)
                else:
                    assert python is not None
                    deployment = await start_dynamo(nursery, workdir, python)
                try:
                    run = await measure(deployment, args)
                finally:
                    await stop_all(deployment.children)
                    nursery.cancel_scope.cancel()
            runs[system].append(run)
            shown = ", ".join(f"{label}: {value:,.2f}" for label, value in run.items())
            print(f"round {round_ + 1} {system}: {shown}", flush=True)
    print_table(
        f"KServe gRPC, tritonclient, {args.rounds} round(s), median (min-max)",
        FIGURES,
        runs,
        systems,
        baseline=other if len(systems) > 1 else None,
    )
    print(f"load average after: {load_average()}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--unary", type=int, default=2000)
    parser.add_argument("--stream", type=int, default=5000)
    parser.add_argument("--cancels", type=int, default=50)
    parser.add_argument(
        "--versus",
        type=Path,
        help="another checkout of dynamo-trio to measure beside this one, instead of Dynamo",
    )
    parser.add_argument(
        "--dynamo-venv",
        type=Path,
        default=DEFAULT_DYNAMO_VENV,
        help=f"the venv setup_dynamo.sh made (default {DEFAULT_DYNAMO_VENV})",
    )
    trio.run(main, parser.parse_args())
