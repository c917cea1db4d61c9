"""The gRPC server as part of the frontend: ``run --kserve-grpc-port`` serves
``mock-tensor`` beside the text models, ``/debug/requests`` lists gRPC calls in flight,
a shutdown drains them, and the setting is read like every other."""

from __future__ import annotations

import signal
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import pytest
import trio
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from dynamo_trio import Config
from dynamo_trio._config import FrontendConfig
from tests._memhttp import http_client
from tests.frontend.conftest import _frontend_url, listed_models

from ._client import StreamResults, tensor
from .conftest import MODEL, StartGrpcStack, grpc_address, wait_for_events

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

SLOW: dict[str, Any] = {"delay_ms": 3_600_000}


def test_the_setting() -> None:
    assert Config.from_env({}).frontend.kserve_grpc_port is None
    assert Config.from_env({"DYN_KSERVE_GRPC_PORT": "8001"}).frontend.kserve_grpc_port == 8001
    with pytest.raises(ValueError, match="DYN_KSERVE_GRPC_PORT"):
        Config.from_env({"DYN_KSERVE_GRPC_PORT": "70000"})
    with pytest.raises(ValueError, match="http_workers"):
        FrontendConfig(kserve_grpc_port=8001, http_workers=2)


@pytest.mark.parametrize("command", ["run", "frontend"])
def test_grpc_needs_one_frontend_process(command: str, env: dict[str, str]) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "dynamo_trio",
            command,
            "--http-workers",
            "2",
            "--kserve-grpc-port",
            "0",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "http_workers 1" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
async def test_run_serves_mock_tensor_beside_the_text_models(
    spawn: Callable[..., Any], env: dict[str, str], tmp_path: Path
) -> None:
    own = {key: value for key, value in env.items() if key != "DYN_FILE_KV"}
    run = await spawn(
        "-m",
        "dynamo_trio",
        "run",
        "--workers",
        "1",
        "--http-port",
        "0",
        "--kserve-grpc-port",
        "0",
        env=own,
        name="dynamo-trio run",
    )
    url = await _frontend_url(run, within=60)
    address = await grpc_address(run)
    with trio.fail_after(30):
        while not any(line.startswith("dynamo-trio ready: ") for line in run.stdout_lines):
            assert not run.stdout_closed, run.stderr.decode(errors="replace")[-3000:]
            await run._changed.wait()
    served = {"mock-model", "mock-embedding", "mock-image", "mock-video", "mock-speech", MODEL}
    assert await listed_models(url) == served
    client = grpcclient.InferenceServerClient(address)
    try:
        result = await trio.to_thread.run_sync(
            lambda: client.infer(MODEL, [tensor([[1.5, 2.5]], "FP32")])
        )
    finally:
        client.close()
    assert result.as_numpy("OUTPUT0").tolist() == [[1.5, 2.5]]
    run.signal(signal.SIGINT)
    assert await run.wait_exit(within=30) == 0


@pytest.mark.slow
async def test_debug_requests_lists_grpc_calls_and_a_shutdown_drains_them(
    grpc_proc_stack: StartGrpcStack,
) -> None:
    stack = await grpc_proc_stack()
    client = grpcclient.InferenceServerClient(stack.grpc)
    results = StreamResults()
    try:
        await trio.to_thread.run_sync(
            lambda: client.async_infer(MODEL, [tensor([1])], callback=results, parameters=SLOW)
        )
        await wait_for_events(stack.worker, "start", 1)
        async with http_client(stack.stack.url) as http:
            listed = (await http.get("/debug/requests")).json()
        [tree] = listed
        assert tree["attributes"] == {"model": MODEL, "route": "tensor", "kind": "unary"}
        assert tree["state"] == "live"
        assert len(tree["children"]) == 1  # the call to the worker
        # A shutdown: the call in flight is ended with UNAVAILABLE once the grace is
        # over, and its worker's handler is killed with reason "shutdown".
        stack.frontend.signal(signal.SIGTERM)
        [(_, error)] = await trio.to_thread.run_sync(results.take, 1)
        [exit_] = await wait_for_events(stack.worker, "exit", 1)
    finally:
        client.close()
    assert isinstance(error, InferenceServerException)
    assert "UNAVAILABLE" in str(error.status())
    assert (exit_["how"], exit_["reason"]) == ("Cancelled", "shutdown")
    assert await stack.frontend.wait_exit(within=30) == 0


@pytest.mark.slow
async def test_a_calls_request_id_and_trace_reach_the_worker(
    grpc_stack: StartGrpcStack,
) -> None:
    stack = await grpc_stack()
    client = grpcclient.InferenceServerClient(stack.grpc)
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    headers = {"x-request-id": "grpc-7", "traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"}
    try:
        await trio.to_thread.run_sync(lambda: client.infer(MODEL, [tensor([1])], headers=headers))
        with pytest.raises(InferenceServerException) as refused:
            await trio.to_thread.run_sync(
                lambda: client.infer(MODEL, [tensor([1])], headers={"x-request-id": "a b"})
            )
    finally:
        client.close()
    assert "INVALID_ARGUMENT" in str(refused.value.status())
    assert "x-request-id" in str(refused.value.message())
    [start] = await wait_for_events(stack.worker, "start", 1)
    assert start["id"] == "grpc-7"
    assert start["trace_id"] == trace_id
