"""The prefill worker: reads a prompt slowly and hands back a (fake) KV-cache handle.

Run: ``python examples/disaggregated/prefill_worker.py [--prefill-ms-per-token 250]``

Serves ``dynamo/prefill/generate``.  Request: ``{"prompt": str}``.  Response:
one item, ``{"kv_handle": {"prompt_tokens", "block_size", "blocks", "instance"}}``.

The "forward pass" is one plain ``await``: it checks nothing, so a stop
request cannot end it early; only a kill can (the runtime cancels the scope
the handler runs in, and ``trio.Cancelled`` lands in that ``await`` at once).
"""

from __future__ import annotations

import argparse
import math
import re
import time
from typing import TYPE_CHECKING, Any, Final

import trio

from dynamo_trio.runtime import DistributedRuntime, dynamo_worker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from dynamo_trio import Context

BLOCK_SIZE: Final = 16
"""Tokens per (fake) KV block."""

_TOKEN: Final = re.compile(r"\w+|[^\w\s]")


def say(line: str) -> None:
    """Print ``line`` after the wall-clock time, to the millisecond."""
    now = time.time()
    stamp = f"{time.strftime('%H:%M:%S', time.localtime(now))}.{int(now * 1000) % 1000:03d}"
    print(f"{stamp} {line}", flush=True)


class PrefillWorker:
    def __init__(self, ms_per_token: float, instance_id: int) -> None:
        self.ms_per_token = ms_per_token
        self.instance_id = instance_id

    async def generate(self, request: Any, context: Context) -> AsyncIterator[dict[str, Any]]:
        prompt = request.get("prompt") if isinstance(request, dict) else None
        if not isinstance(prompt, str):
            raise ValueError("a prefill request is {'prompt': <str>}")  # -> InvalidArgument
        request_id = context.id()
        tokens = len(_TOKEN.findall(prompt))
        seconds = max(tokens, 1) * self.ms_per_token / 1000
        say(f"Prefill: started {request_id} ({tokens} tokens, {seconds:.1f} s)")
        try:
            await trio.sleep(seconds)  # the forward pass over the whole prompt
        except trio.Cancelled:
            # A real engine would abort the request here and free its KV blocks (in a
            # shielded, time-bounded scope), unless a transfer to decode is in flight:
            # see the README ("Why the prefill is linked").
            say(f"Prefill: cancelled {request_id} ({context.reason})")
            raise
        say(f"Prefill: done {request_id}")
        yield {
            "kv_handle": {
                "prompt_tokens": tokens,
                "block_size": BLOCK_SIZE,
                "blocks": math.ceil(tokens / BLOCK_SIZE),
                "instance": f"{self.instance_id:x}",
            }
        }


@dynamo_worker()
async def main(runtime: DistributedRuntime, ms_per_token: float) -> None:
    endpoint = runtime.namespace("dynamo").component("prefill").endpoint("generate")
    worker = PrefillWorker(ms_per_token, runtime.instance_id)
    async with trio.open_nursery() as nursery:
        await nursery.start(endpoint.serve_endpoint, worker.generate)
        say(f"Prefill: serving {endpoint.path} ({ms_per_token:g} ms per prompt token)")
        if runtime.status_url is not None:  # DYN_SYSTEM_PORT is set
            say(f"Prefill: metrics at {runtime.status_url}/metrics")
    say("Prefill: shut down")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--prefill-ms-per-token",
        type=float,
        default=250.0,
        help="prefill cost per prompt token (default 250: a short chat takes seconds)",
    )
    trio.run(main, parser.parse_args().prefill_ms_per_token)
