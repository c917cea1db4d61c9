"""Your own asyncio engine in a trio worker, through dynamo-trio's asyncio bridge.

Run: ``python examples/engines/asyncio_worker.py`` (then ``python -m dynamo_trio.frontend``)
and ask model ``echo`` for a chat completion.

``EchoEngine`` stands for any asyncio engine (vLLM's ``AsyncLLM``, SGLang, your
own): a request is a task on the engine's loop that keeps producing tokens into
a queue until it is done or ``abort(request_id)`` is called, and
``generate(...)`` reads that queue.  The worker runs the engine on the bridge's
event loop (``open_asyncio_loop``) and streams each request with
``bridge.stream(generate, abort=..., context=...)``: when the client hangs up,
the engine's ``abort`` runs before the handler returns.  It prints::

    Engine: started <id>
    Engine: finished <id> after <n> tokens
    Engine: aborted <id> after <n> tokens
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import trio

from dynamo_trio.engines import AsyncioLoop, open_asyncio_loop
from dynamo_trio.llm import validate_generate_request
from dynamo_trio.runtime import DistributedRuntime, dynamo_worker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from dynamo_trio import Context
    from dynamo_trio.llm import GenerateOutput


class EchoEngine:
    """An asyncio engine: echoes the last message's words, one per 20 ms, ``repeat`` times
    (or until ``limit`` words)."""

    def __init__(self, repeat: int = 50) -> None:
        self.repeat = repeat
        self.running: dict[str, asyncio.Task[None]] = {}
        self.produced: dict[str, int] = {}

    async def generate(self, words: list[str], request_id: str, limit: int) -> AsyncIterator[str]:
        queue: asyncio.Queue[str | None] = asyncio.Queue()
        print(f"Engine: started {request_id}", flush=True)
        self.produced[request_id] = 0
        self.running[request_id] = asyncio.create_task(
            self._run((words or ["echo"]) * self.repeat, request_id, queue, limit)
        )
        while (word := await queue.get()) is not None:
            yield word

    async def _run(
        self, words: list[str], request_id: str, queue: asyncio.Queue[str | None], limit: int
    ) -> None:
        for word in words[:limit]:
            await asyncio.sleep(0.02)  # one engine step
            self.produced[request_id] += 1
            queue.put_nowait(word)
        queue.put_nowait(None)
        del self.running[request_id]
        print(
            f"Engine: finished {request_id} after {self.produced.pop(request_id)} tokens",
            flush=True,
        )

    async def abort(self, request_id: str) -> None:
        task = self.running.pop(request_id, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            produced = self.produced.pop(request_id)
            print(f"Engine: aborted {request_id} after {produced} tokens", flush=True)


class EchoWorker:
    def __init__(self, bridge: AsyncioLoop, engine: EchoEngine) -> None:
        self.bridge = bridge
        self.engine = engine

    async def generate(self, request: Any, context: Context) -> AsyncIterator[GenerateOutput]:
        valid = validate_generate_request(request)
        messages = valid.get("messages") or [{"role": "user", "content": valid.get("prompt", "")}]
        words = messages[-1]["content"].split()
        request_id, engine = context.id(), self.engine
        limit = valid.get("max_tokens") or 1000
        tokens = self.bridge.stream(
            lambda: engine.generate(words, request_id, limit),  # called on the engine's loop
            abort=lambda: engine.abort(request_id),  # whenever the stream ends early
            context=context,
        )
        count = 0
        try:
            async for word in tokens:
                count += 1
                yield {"text": (" " if count > 1 else "") + word, "token_ids": [count]}
        finally:
            await tokens.aclose()  # at once, even when the handler is killed
        if context.is_killed():
            return
        finish = "cancelled" if context.is_stopped() else "length" if count == limit else "stop"
        usage = {"prompt_tokens": len(words), "completion_tokens": count}
        yield {"text": "", "finish_reason": finish, "usage": usage}


@dynamo_worker()
async def main(runtime: DistributedRuntime, bridge: AsyncioLoop) -> None:
    engine = await bridge.run(_create_engine)  # an engine is created on its own loop
    endpoint = runtime.namespace("dynamo").component("echo").endpoint("generate")
    async with trio.open_nursery() as nursery:
        await nursery.start(endpoint.serve_endpoint, EchoWorker(bridge, engine).generate)
        await endpoint.register_model("echo", "chat")
        await endpoint.register_model("echo", "completions")
        print("Worker: serving model echo", flush=True)


async def _create_engine() -> EchoEngine:
    return EchoEngine()


async def run() -> None:
    # The loop's thread lives as long as this block: started before the runtime,
    # joined after it has drained its requests.
    async with open_asyncio_loop() as bridge:
        await main(bridge)


if __name__ == "__main__":
    trio.run(run)
