"""The frontend benchmark's worker: the mock engine as model ``bench``, reporting cancellations.

Prints ``{"event": "ready"}`` once its models are registered, and for every
request whose work is cancelled ``{"event": "cancelled", "id": ..., "t":
time.monotonic()}`` at the moment the handler observes it.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import TYPE_CHECKING, Any

import trio

from dynamo_trio.mocker import MockEngine, MockerSettings
from dynamo_trio.runtime import DistributedRuntime, dynamo_worker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from dynamo_trio import Context


def reporting(engine: MockEngine) -> Any:
    async def generate(request: Any, context: Context) -> AsyncIterator[Any]:
        try:
            async for item in engine.generate(request, context):
                yield item
        except BaseException:
            if context.is_killed():
                observed = time.monotonic()
                print(
                    json.dumps({"event": "cancelled", "id": context.id(), "t": observed}),
                    flush=True,
                )
            raise

    return generate


@dynamo_worker()
async def main(runtime: DistributedRuntime, model: str, inter_token_latency_ms: float) -> None:
    engine = MockEngine(
        MockerSettings(inter_token_latency_ms=inter_token_latency_ms, default_max_tokens=100)
    )
    endpoint = runtime.namespace("dynamo").component(model).endpoint("generate")
    async with trio.open_nursery() as nursery:
        await nursery.start(endpoint.serve_endpoint, reporting(engine))
        await endpoint.register_model(model, "chat")
        await endpoint.register_model(model, "completions")
        print(json.dumps({"event": "ready"}), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-name", default="bench")
    parser.add_argument("--inter-token-latency-ms", type=float, default=0.0)
    args = parser.parse_args()
    trio.run(main, args.model_name, args.inter_token_latency_ms)
