"""Dynamo 1.6.1's side of the KServe benchmark: ``mock-tensor`` on Dynamo's own runtime.

Runs in the Dynamo venv (``setup_dynamo.sh``), under uvloop:
``python benchmarks/_dynamo_tensor_worker.py``.  It registers ``mock-tensor`` with
``register_model(ModelInput.Tensor, ModelType.TensorBased, ...)`` and a
``tensor_model_config`` (``INPUT0``/``OUTPUT0``, ``Int32``, shape ``[-1]``), and answers
each request with its ``INPUT0`` as ``OUTPUT0``, as dynamo-trio's mock does.

Prints ``{"event": "ready"}`` once registered.  A request with the parameter ``delay_ms``
waits that long first; with ``report`` set it prints ``{"event": "started", "id"}`` (the
request's id) when its handler starts and ``{"event": "cancelled", "id", "t"}``
(``time.monotonic()``) when a watcher awaiting ``context.async_killed_or_stopped()`` wakes
(a Dynamo handler is not cancelled by its runtime: watching the context is how Dynamo's
backends see a hang-up), as ``_tensor_worker.py`` does for dynamo-trio.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

import uvloop
from dynamo.llm import ModelInput, ModelType, WorkerType, register_model
from dynamo.runtime import DistributedRuntime

MODEL = "mock-tensor"
CONFIG = {
    "name": MODEL,
    "inputs": [{"name": "INPUT0", "data_type": "Int32", "shape": [-1]}],
    "outputs": [{"name": "OUTPUT0", "data_type": "Int32", "shape": [-1]}],
}


def report(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def parameter(parameters: dict[str, Any], name: str) -> Any:
    """A request parameter's value: Dynamo sends each as ``{"int64": 5}`` and the like."""
    value = parameters.get(name)
    if isinstance(value, dict) and len(value) == 1:
        return next(iter(value.values()))
    return value


async def generate(request: dict[str, Any], context: Any) -> Any:
    parameters = request.get("parameters") or {}
    request_id = request.get("id")
    delay_ms = parameter(parameters, "delay_ms") or 0
    watcher = None
    if parameter(parameters, "report"):
        report("started", id=request_id)

        async def watch() -> None:
            if await context.async_killed_or_stopped():
                report("cancelled", id=request_id, t=time.monotonic())

        watcher = asyncio.ensure_future(watch())
    try:
        if delay_ms:
            deadline = time.monotonic() + delay_ms / 1000
            while time.monotonic() < deadline:
                if context.is_stopped() or context.is_killed():
                    return
                await asyncio.sleep(min(0.01, deadline - time.monotonic()))
        tensor = next(t for t in request["tensors"] if t["metadata"]["name"] == "INPUT0")
        yield {
            "model": request["model"],
            "id": request.get("id"),
            "tensors": [
                {
                    "metadata": {**tensor["metadata"], "name": "OUTPUT0"},
                    "data": tensor["data"],
                }
            ],
        }
    finally:
        if watcher is not None:
            await asyncio.sleep(0)  # a kill that arrives while unwinding is still reported
            watcher.cancel()


async def main() -> None:
    loop = asyncio.get_running_loop()
    runtime = DistributedRuntime(loop, "file", "tcp", event_plane="zmq")
    endpoint = runtime.endpoint("dynamo.tensor.generate")
    await register_model(
        ModelInput.Tensor,
        ModelType.TensorBased,
        endpoint,
        MODEL,
        worker_type=WorkerType.Aggregated,
        tensor_model_config=CONFIG,
    )
    serving = asyncio.ensure_future(endpoint.serve_endpoint(generate))
    report("ready", pid=os.getpid())
    await serving


if __name__ == "__main__":
    try:
        uvloop.run(main())
    except KeyboardInterrupt:
        sys.exit(0)
