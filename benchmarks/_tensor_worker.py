"""The mock tensor model for ``kserve.py``: ``mock-tensor``, reporting when it is cancelled.

Prints ``{"event": "ready"}`` once registered; for a request with parameter ``report``
set, ``{"event": "started", "id"}`` when its handler starts and ``{"event": "cancelled",
"id", "t"}`` (``time.monotonic()``) when its handler is cancelled.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from _bootstrap import ensure_project_python

ensure_project_python()

import trio  # noqa: E402

from dynamo_trio.mocker._tensor import echo_tensor, tensor_model_config  # noqa: E402
from dynamo_trio.runtime import DistributedRuntime, dynamo_worker  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from dynamo_trio import Context


def report(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


async def handler(request: dict[str, Any], context: Context) -> AsyncIterator[Any]:
    watched = bool(request["parameters"].get("report"))
    if watched:
        report("started", id=request["id"])
    try:
        async for item in echo_tensor(request, context):
            yield item
    except trio.Cancelled:
        if watched:
            report("cancelled", id=request["id"], t=time.monotonic())
        raise


@dynamo_worker()
async def main(runtime: DistributedRuntime) -> None:
    endpoint = runtime.namespace("dynamo").component("tensor").endpoint("infer")
    async with trio.open_nursery() as nursery:
        await nursery.start(endpoint.serve_endpoint, handler)
        await endpoint.register_model(
            "mock-tensor", "tensor", tensor_model_config=tensor_model_config("mock-tensor")
        )
        report("ready")


if __name__ == "__main__":
    trio.run(main)
