"""The KServe gRPC tests: a frontend (``--kserve-grpc-port 0``) and a tensor worker.

:func:`grpc_stack` runs both in the test's process (:class:`~tests._serving.Cluster`,
on loopback TCP); :func:`grpc_proc_stack` as processes, from the multi-process
harness of ``tests/e2e``, for a test that signals the frontend.  The clients
are the official Triton client (``tritonclient.grpc``, on grpcio), called in
threads since it blocks.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from dynamo_trio.mocker._tensor import echo_tensor, tensor_model_config
from tests._serving import Cluster, Events, Served
from tests.e2e._model_worker import reporting
from tests.e2e.conftest import Proc, Stack, env as env, spawn as spawn
from tests.frontend.conftest import _frontend_url, wait_for_models

TENSOR_WORKER = Path(__file__).with_name("_tensor_worker.py")
MODEL = "mock-tensor"

CANCELLED = "dynamo_frontend_model_cancellation_total"
WORKER_CANCELLED = "dynamo_component_cancellation_total"
REQUESTS = "dynamo_frontend_requests_total"


@dataclass
class GrpcStack:
    """The stack (processes, or in the test's process), and where its gRPC server
    listens (``host:port``)."""

    stack: Stack | Served
    grpc: str

    @property
    def worker(self) -> Proc | Events:
        return self.stack.worker

    @property
    def frontend(self) -> Proc:
        assert isinstance(self.stack, Stack), "a frontend process: grpc_proc_stack"
        return self.stack.frontend

    def log(self) -> str:
        """What the frontend logged so far."""
        if isinstance(self.stack, Stack):
            return self.stack.frontend.stderr.decode(errors="replace")
        return self.stack.log()

    async def cancellations(self, request_type: str) -> tuple[float, float]:
        """``(frontend's, worker's)`` cancellation counts of the tensor endpoint."""
        frontend = await self.stack.metric(CANCELLED, endpoint="tensor", request_type=request_type)
        worker = await self.stack.metric(WORKER_CANCELLED, worker=True, dynamo_endpoint="infer")
        return frontend, worker


async def grpc_address(frontend: Proc, *, within: float = 15) -> str:
    """The ``host:port`` a frontend process says its gRPC server listens on."""
    marker = "kserve grpc listening on"
    with trio.fail_after(within):
        while not any(marker in line for line in frontend.stdout_lines):
            if frontend.stdout_closed:
                raise AssertionError(frontend.stderr.decode(errors="replace")[-3000:])
            await frontend._changed.wait()
    return next(line for line in frontend.stdout_lines if marker in line).rsplit(" ", 1)[1]


StartGrpcStack = Callable[..., Awaitable[GrpcStack]]


@pytest.fixture
async def grpc_stack(nursery: trio.Nursery, env: dict[str, str]) -> StartGrpcStack:
    """``await grpc_stack(*frontend_flags)``: a frontend serving gRPC and a tensor worker
    (``_tensor_worker.py``'s) in the test's process, once the frontend lists the model."""

    async def start(*frontend_flags: str) -> GrpcStack:
        cluster = Cluster(nursery, env)
        reported = Events()
        worker = await cluster.worker()
        endpoint = worker.namespace("dynamo").component("tensor").endpoint("infer")
        await nursery.start(endpoint.serve_endpoint, reporting(MODEL, echo_tensor, reported.report))
        await endpoint.register_model(
            MODEL, "tensor", tensor_model_config=tensor_model_config(MODEL)
        )
        url = await cluster.frontend("--kserve-grpc-port", "0", *frontend_flags)
        await wait_for_models(url, {MODEL}, within=15)
        assert worker.status_url is not None
        served = Served(url, reported, worker.status_url, cluster.log)
        return GrpcStack(served, cluster.grpc[url])

    return start


@pytest.fixture
async def grpc_proc_stack(spawn: Callable[..., Any], env: dict[str, str]) -> StartGrpcStack:
    """:func:`grpc_stack` as two processes (the frontend and ``_tensor_worker.py``)."""

    async def start(*frontend_flags: str) -> GrpcStack:
        worker = await spawn(str(TENSOR_WORKER), env=env, name="tensor worker")
        frontend = await spawn(
            "-m",
            "dynamo_trio.frontend",
            "--http-port",
            "0",
            "--kserve-grpc-port",
            "0",
            *frontend_flags,
            env=env,
            name="frontend",
        )
        ready = await worker.wait_for("ready", within=15)
        url = await _frontend_url(frontend)
        grpc = await grpc_address(frontend)
        await wait_for_models(url, {MODEL}, within=15)
        return GrpcStack(Stack(frontend, worker, url, ready["status_url"]), grpc)

    return start


def events(proc: Proc | Events, name: str) -> list[dict[str, Any]]:
    """The events named ``name`` that ``proc`` reported so far, in order."""
    return [event for event in proc.events if event.get("event") == name]


async def wait_for_events(
    proc: Proc | Events, name: str, count: int, *, within: float = 15
) -> list[Any]:
    """Wait until ``proc`` has reported ``count`` events named ``name``; return them all."""
    with trio.fail_after(within):
        while len(events(proc, name)) < count:
            if isinstance(proc, Events):
                await proc.changed()
                continue
            if proc.stdout_closed:
                raise AssertionError(f"{proc.name} exited: {proc.stderr.decode()[-3000:]}")
            await proc._changed.wait()
    return events(proc, name)


async def eventually(
    read: Callable[[], Awaitable[Any]], expected: Any, *, within: float = 10
) -> None:
    """Poll ``read()`` until it returns ``expected`` (a metric another process updates)."""
    with trio.fail_after(within):
        while (found := await read()) != expected:  # noqa: ASYNC110 - polls another process
            await trio.sleep(0.05)
    assert found == expected
