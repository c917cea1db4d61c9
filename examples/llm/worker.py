"""A model worker: the toy engine served at ``dynamo/toy/generate`` as model ``toy``.

Run: ``python examples/llm/worker.py`` (then ``python -m dynamo_trio.frontend``)

It speaks the engine protocol of :mod:`dynamo_trio.llm`: the frontend sends a
validated ``GenerateRequest`` (chat or completion) and the worker streams
``{"text", "token_ids"}`` items, the last one with ``finish_reason`` and
``usage``.  It prints one line when a request starts and one when it ends:

    Toy: started <id> (<n> prompt tokens)
    Toy: finished <id> (<finish reason>, <n> tokens)
    Toy: stopped <id> after <n> tokens (<reason>)    drained: a last "cancelled" item
    Toy: killed <id> after <n> tokens (<reason>)     cancelled mid-await, nothing more sent
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

import trio
from engine import ToyEngine, render_prompt  # engine.py, next to this file

from dynamo_trio.llm import validate_generate_request
from dynamo_trio.runtime import DistributedRuntime, dynamo_worker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from dynamo_trio import Context
    from dynamo_trio.llm import GenerateOutput


def say(line: str) -> None:
    """Print ``line`` after the wall-clock time, to the millisecond."""
    now = time.time()
    stamp = f"{time.strftime('%H:%M:%S', time.localtime(now))}.{int(now * 1000) % 1000:03d}"
    print(f"{stamp} {line}", flush=True)


class ToyWorker:
    def __init__(self, engine: ToyEngine) -> None:
        self.engine = engine

    async def generate(self, request: Any, context: Context) -> AsyncIterator[GenerateOutput]:
        valid = validate_generate_request(request)  # ValueError -> InvalidArgument (HTTP 400)
        request_id = context.id()
        prompt_tokens = len(self.engine.tokenize(render_prompt(valid)))
        say(f"Toy: started {request_id} ({prompt_tokens} prompt tokens)")
        tokens, finish_reason = 0, None
        steps = self.engine.generate(valid, context)
        try:
            async for item in steps:
                tokens += len(item.get("token_ids", ()))
                finish_reason = item.get("finish_reason")
                yield item
        finally:
            await steps.aclose()  # deterministic, even when we are killed mid-await
            if context.is_killed():
                say(f"Toy: killed {request_id} after {tokens} tokens ({context.reason})")
            elif finish_reason == "cancelled":
                say(f"Toy: stopped {request_id} after {tokens} tokens ({context.reason})")
            elif finish_reason is not None:
                say(f"Toy: finished {request_id} ({finish_reason}, {tokens} tokens)")


@dynamo_worker()
async def main(runtime: DistributedRuntime, args: argparse.Namespace) -> None:
    engine = ToyEngine(
        prefill_ms_per_token=args.prefill_ms_per_token,
        decode_ms_per_token=args.decode_ms_per_token,
        default_max_tokens=args.max_tokens,
    )
    endpoint = runtime.namespace("dynamo").component("toy").endpoint("generate")
    async with trio.open_nursery() as nursery:
        # nursery.start returns once the instance is registered in discovery.
        await nursery.start(endpoint.serve_endpoint, ToyWorker(engine).generate)
        await endpoint.register_model("toy", "chat")
        await endpoint.register_model("toy", "completions")
        say(f"Toy: serving model 'toy' at {endpoint.path} ({len(engine.vocab)} token vocabulary)")
        if runtime.status_url is not None:  # DYN_SYSTEM_PORT is set
            say(f"Toy: metrics at {runtime.status_url}/metrics")
    say("Toy: shut down")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefill-ms-per-token", type=float, default=5.0)
    parser.add_argument("--decode-ms-per-token", type=float, default=50.0)
    parser.add_argument("--max-tokens", type=int, default=32, help="when a request gives none")
    trio.run(main, parser.parse_args())
