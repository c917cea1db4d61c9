"""Cancelling a gRPC call cancels the worker's work, counted once on both sides.

Four ways a Triton client ends a call early: ``future.cancel()`` on an async
infer (``RST_STREAM``), closing a stream mid-way, a ``client_timeout`` shorter
than the work (``grpc-timeout``: the deadline), and the client process
SIGKILLed (its connection dropped).  Each time the worker's handler is
cancelled (``trio.Cancelled`` inside its wait), and
``dynamo_frontend_model_cancellation_total{endpoint="tensor"}`` (with the
call's ``request_type``) and the worker's ``dynamo_component_cancellation_total``
count it exactly once; the calls that completed beside it are never counted.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from dynamo_trio.kserve._server import MAX_STREAM_INFERENCES

from ._client import StreamResults, tensor
from .conftest import MODEL, GrpcStack, StartGrpcStack, eventually, wait_for_events

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = pytest.mark.slow

SLOW: dict[str, Any] = {"delay_ms": 3_600_000}
CLIENT_PROC = Path(__file__).with_name("_client_proc.py")


def killed_exits(stack: GrpcStack) -> list[dict[str, Any]]:
    return [e for e in stack.worker.events if e.get("event") == "exit" and e["how"] != "returned"]


async def completed_infer(client: grpcclient.InferenceServerClient) -> None:
    result = await trio.to_thread.run_sync(lambda: client.infer(MODEL, [tensor([5])]))
    assert result.as_numpy("OUTPUT0").tolist() == [5]


async def test_future_cancel_on_an_async_infer(grpc_stack: StartGrpcStack) -> None:
    stack = await grpc_stack()
    client = grpcclient.InferenceServerClient(stack.grpc)
    results = StreamResults()
    try:
        await completed_infer(client)
        future = await trio.to_thread.run_sync(
            lambda: client.async_infer(MODEL, [tensor([1, 2])], callback=results, parameters=SLOW)
        )
        await wait_for_events(stack.worker, "start", 2)
        future.cancel()
        exits = await wait_for_events(stack.worker, "exit", 2)
        [(_, error)] = await trio.to_thread.run_sync(results.take, 1)
        assert error is not None and "CANCELLED" in str(error.status())
        await eventually(lambda: stack.cancellations("unary"), (1, 1))
        await completed_infer(client)  # a completed call after it: still one
        await wait_for_events(stack.worker, "exit", 3)
    finally:
        client.close()
    assert [e["how"] for e in exits] == ["returned", "Cancelled"]
    assert exits[1]["state"] == "KILLED"
    assert exits[1]["reason"] == "client disconnect"
    assert await stack.cancellations("unary") == (1, 1)
    assert await stack.cancellations("stream") == (0, 1)


async def test_a_stream_closed_mid_way(grpc_stack: StartGrpcStack) -> None:
    stack = await grpc_stack()
    client = grpcclient.InferenceServerClient(stack.grpc)
    results = StreamResults()

    def start() -> None:
        client.start_stream(callback=results)
        client.async_stream_infer(MODEL, [tensor([9])], request_id="done")
        [(result, error)] = results.take(1)
        assert error is None and result.get_response().id == "done"
        for n in range(3):
            client.async_stream_infer(MODEL, [tensor([n])], request_id=f"slow{n}", parameters=SLOW)

    try:
        await trio.to_thread.run_sync(start)
        await wait_for_events(stack.worker, "start", 4)
        await trio.to_thread.run_sync(lambda: client.stop_stream(cancel_requests=True))
        exits = await wait_for_events(stack.worker, "exit", 4)
        await eventually(lambda: stack.cancellations("stream"), (3, 3))
    finally:
        client.close()
    assert [e["how"] for e in exits] == ["returned", "Cancelled", "Cancelled", "Cancelled"]
    assert {e["reason"] for e in exits[1:]} == {"client disconnect"}
    assert await stack.cancellations("unary") == (0, 3)


async def test_a_client_timeout_shorter_than_the_work(grpc_stack: StartGrpcStack) -> None:
    stack = await grpc_stack()
    client = grpcclient.InferenceServerClient(stack.grpc)
    try:
        await completed_infer(client)
        with pytest.raises(InferenceServerException) as raised:
            await trio.to_thread.run_sync(
                lambda: client.infer(MODEL, [tensor([1])], parameters=SLOW, client_timeout=1.0)
            )
        assert "DEADLINE_EXCEEDED" in str(raised.value.status())
        exits = await wait_for_events(stack.worker, "exit", 2)
        await eventually(lambda: stack.cancellations("unary"), (1, 1))
    finally:
        client.close()
    starts = await wait_for_events(stack.worker, "start", 2)
    assert starts[0]["remaining"] is None
    assert starts[1]["remaining"] > 0  # grpc-timeout travelled to the worker as its deadline
    assert exits[1]["how"] == "Cancelled"
    assert exits[1]["reason"] in ("deadline", "client disconnect")  # whichever came first


async def test_the_client_process_killed(
    grpc_stack: StartGrpcStack, spawn: Callable[..., Any], env: dict[str, str]
) -> None:
    stack = await grpc_stack()
    client = await spawn(str(CLIENT_PROC), stack.grpc, env=env, name="triton client")
    await client.wait_for("sent")
    await wait_for_events(stack.worker, "start", 1)
    client.signal(signal.SIGKILL)
    exits = await wait_for_events(stack.worker, "exit", 1)
    await eventually(lambda: stack.cancellations("unary"), (1, 1))
    assert exits[0]["how"] == "Cancelled"
    assert exits[0]["reason"] == "client disconnect"
    assert killed_exits(stack) == exits


async def test_a_full_stream_refuses_one_more_and_closing_it_counts_each_once(
    grpc_stack: StartGrpcStack,
) -> None:
    stack = await grpc_stack()
    client = grpcclient.InferenceServerClient(stack.grpc)
    results = StreamResults()
    limit = MAX_STREAM_INFERENCES

    def fill() -> list[tuple[Any, Any]]:
        client.start_stream(callback=results)
        for n in range(limit + 1):
            client.async_stream_infer(MODEL, [tensor([n])], request_id=str(n), parameters=SLOW)
        return results.take(1)

    try:
        [(_, refused)] = await trio.to_thread.run_sync(fill)
        assert "RESOURCE_EXHAUSTED" in str(refused)
        await wait_for_events(stack.worker, "start", limit, within=60)
        await trio.to_thread.run_sync(lambda: client.stop_stream(cancel_requests=True))
        exits = await wait_for_events(stack.worker, "exit", limit, within=60)
        await eventually(lambda: stack.cancellations("stream"), (limit, limit), within=30)
    finally:
        client.close()
    assert {(e["how"], e["reason"]) for e in exits} == {("Cancelled", "client disconnect")}


async def test_with_the_stop_policy_the_worker_drains_and_ends_on_its_own(
    grpc_stack: StartGrpcStack,
) -> None:
    stack = await grpc_stack("--on-disconnect", "stop")
    client = grpcclient.InferenceServerClient(stack.grpc)
    results = StreamResults()
    try:
        future = await trio.to_thread.run_sync(
            lambda: client.async_infer(MODEL, [tensor([1])], callback=results, parameters=SLOW)
        )
        await wait_for_events(stack.worker, "start", 1)
        future.cancel()
        [exit_] = await wait_for_events(stack.worker, "exit", 1)
        await eventually(lambda: stack.cancellations("unary"), (1, 1))
    finally:
        client.close()
    assert (exit_["how"], exit_["state"], exit_["reason"]) == (
        "returned",
        "STOPPED",
        "client disconnect",
    )
