"""Dynamo 1.6.1's side of the frontend benchmark: a Python worker on Dynamo's own runtime.

Runs in the Dynamo venv (``setup_dynamo.sh``), under uvloop as Dynamo's users run it:

    python benchmarks/_dynamo_worker.py --model-path DIR --model-name bench \
        [--inter-token-latency-ms 10]

It registers ``--model-name`` for chat and completions with Dynamo's
``register_model`` (token input: Dynamo's frontend tokenizes with the tiny model in
``--model-path``) and serves ``dynamo.<model-name>.generate``.  Each request yields
``stop_conditions.max_tokens`` tokens (the words ``w0``, ``w1``, ... of the tiny model,
one token per item), without sleeping unless ``--inter-token-latency-ms`` is given, and
the last item carries ``finish_reason`` and the usage.

Prints ``{"event": "ready"}`` once registered, and with a latency, for every request
that is killed or stopped, ``{"event": "cancelled", "id": ..., "t": time.monotonic()}``
at the moment a watcher task awaiting ``context.async_killed_or_stopped()`` wakes (a
Dynamo handler is never cancelled by the runtime: watching its context is how Dynamo's
own backends observe a hang-up).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any

import uvloop
from dynamo.llm import ModelInput, ModelType, WorkerType, register_model
from dynamo.runtime import DistributedRuntime

FIRST_WORD_ID = 4  # _tiny_model.py: ids of w0, w1, ...
WORDS = 512


def make_handler(latency: float) -> Any:
    async def watch(context: Any) -> None:
        if await context.async_killed_or_stopped():
            observed = time.monotonic()
            print(json.dumps({"event": "cancelled", "id": context.id(), "t": observed}), flush=True)

    async def generate(request: dict[str, Any], context: Any) -> Any:
        prompt_tokens = len(request.get("token_ids") or ())
        stop = request.get("stop_conditions") or {}
        n = stop.get("max_tokens") or 16
        watcher = asyncio.ensure_future(watch(context)) if latency else None
        try:
            for i in range(n):
                if latency:
                    if context.is_stopped() or context.is_killed():
                        return
                    await asyncio.sleep(latency)
                item: dict[str, Any] = {"token_ids": [FIRST_WORD_ID + i % WORDS], "index": 0}
                if i == n - 1:
                    item["finish_reason"] = "length"
                    item["completion_usage"] = {
                        "prompt_tokens": prompt_tokens,
                        "completion_tokens": n,
                        "total_tokens": prompt_tokens + n,
                    }
                yield item
        finally:
            if watcher is not None:
                # let a kill that arrives while we unwind still be reported, then stop watching
                await asyncio.sleep(0)
                watcher.cancel()

    return generate


async def main(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    runtime = DistributedRuntime(loop, "file", "tcp", event_plane="zmq")
    endpoint = runtime.endpoint(f"dynamo.{args.model_name}.generate")
    await register_model(
        ModelInput.Tokens,
        ModelType.Chat | ModelType.Completions,
        endpoint,
        args.model_path,
        args.model_name,
        worker_type=WorkerType.Aggregated,
    )
    serving = asyncio.ensure_future(
        endpoint.serve_endpoint(make_handler(args.inter_token_latency_ms / 1000))
    )
    print(json.dumps({"event": "ready", "pid": os.getpid()}), flush=True)
    await serving


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--model-name", default="bench")
    parser.add_argument("--inter-token-latency-ms", type=float, default=0.0)
    arguments = parser.parse_args()
    try:
        uvloop.run(main(arguments))
    except KeyboardInterrupt:
        sys.exit(0)
