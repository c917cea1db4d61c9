"""The decode worker: asks the prefill worker for the prompt's KV cache, then decodes.

Run: ``python examples/disaggregated/decode_worker.py`` (with ``prefill_worker.py`` running)

Serves ``dynamo/decode/generate`` and registers it as model ``disagg`` (chat
and completions), speaking the engine protocol of :mod:`dynamo_trio.llm`.
For each request it calls ``dynamo/prefill/generate`` *with its own incoming
context*: that links the prefill call under this request, so whatever
cancels the request at the frontend (a client hang-up, a deadline) reaches
the prefill worker too, under the same request id.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any, Final

import trio

from dynamo_trio.llm import StopMatcher, validate_generate_request
from dynamo_trio.runtime import DistributedRuntime, dynamo_worker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from dynamo_trio import Context
    from dynamo_trio.llm import GenerateOutput, GenerateRequest, Usage
    from dynamo_trio.runtime import Client

WORDS: Final = (
    "the", "cache", "arrived", "from", "prefill", ",", "and", "decode", "carried", "on", "one",
    "token", "at", "a", "time", "until", "its", "answer", "was", "long", "enough", ".",
)  # fmt: skip
"""What this toy decoder says, one token at a time; it ends on its own after the full stop."""


def say(line: str) -> None:
    """Print ``line`` after the wall-clock time, to the millisecond."""
    now = time.time()
    stamp = f"{time.strftime('%H:%M:%S', time.localtime(now))}.{int(now * 1000) % 1000:03d}"
    print(f"{stamp} {line}", flush=True)


def render_prompt(request: GenerateRequest) -> str:
    if request["request_type"] == "completion":
        return request.get("prompt", "")
    return "".join(f"{m['role']}: {m['content']}\n" for m in request.get("messages", ()))


class DecodeWorker:
    def __init__(self, prefill: Client, ms_per_token: float, default_max_tokens: int) -> None:
        self.prefill = prefill
        self.ms_per_token = ms_per_token
        self.default_max_tokens = default_max_tokens

    async def remote_prefill(self, prompt: str, context: Context) -> dict[str, Any] | None:
        """The KV handle from a prefill worker; ``None`` if the request was cancelled first."""
        # context=context is the link: killing this request kills the prefill call,
        # which puts a `kill` frame on the wire to the prefill worker.
        stream = await self.prefill.generate({"prompt": prompt}, context=context)
        handle = None
        async with stream:
            async for item in stream:
                handle = item.data()["kv_handle"]
        # A real engine would start pulling the KV blocks here (NIXL, ...): see the
        # README for where a transfer-aware abort belongs.
        return handle

    async def generate(self, request: Any, context: Context) -> AsyncIterator[GenerateOutput]:
        valid = validate_generate_request(request)  # ValueError -> InvalidArgument (HTTP 400)
        request_id = context.id()
        prompt = render_prompt(valid)
        chat = valid["request_type"] == "chat"
        max_tokens = valid.get("max_tokens") or self.default_max_tokens
        stops = StopMatcher(valid.get("stop") or ())
        min_tokens = valid.get("min_tokens") or 0
        ignore_eos = bool(valid.get("ignore_eos"))
        say(f"Decode: waiting for prefill {request_id}")
        generated, finish_reason = 0, None
        try:
            handle = await self.remote_prefill(prompt, context)
            if handle is None and not context.is_stopped():
                raise RuntimeError("the prefill worker returned no KV handle")
            prompt_tokens = handle["prompt_tokens"] if handle else 0
            if handle is not None:
                say(
                    f"Decode: prefill done {request_id} ({prompt_tokens} tokens in "
                    f"{handle['blocks']} KV blocks from prefill instance {handle['instance']})"
                )
            while True:
                usage: Usage = {"prompt_tokens": prompt_tokens, "completion_tokens": generated}
                if context.is_stopped():
                    if context.is_killed():
                        await trio.lowlevel.checkpoint()  # take the pending Cancelled
                    finish_reason = "cancelled"
                    yield {
                        "text": stops.flush(),
                        "token_ids": [],
                        "finish_reason": "cancelled",
                        "usage": usage,
                    }
                    return
                await trio.sleep(self.ms_per_token / 1000)  # one decode step
                token = generated % len(WORDS)
                generated += 1
                usage["completion_tokens"] = generated
                text, stop = stops.push(_piece(token, first=generated == 1, chat=chat))
                if stop is not None:
                    finish_reason = "stop"
                    yield {
                        "text": text,
                        "token_ids": [token],
                        "finish_reason": "stop",
                        "stop_sequence": stop,
                        "usage": usage,
                    }
                    return
                if WORDS[token] == "." and not ignore_eos and generated >= min_tokens:
                    finish_reason = "stop"  # the end of the sentence is the end of the answer
                    yield {
                        "text": text + stops.flush(),
                        "token_ids": [token],
                        "finish_reason": "stop",
                        "usage": usage,
                    }
                    return
                if generated >= max_tokens:
                    finish_reason = "length"
                    yield {
                        "text": text + stops.flush(),
                        "token_ids": [token],
                        "finish_reason": "length",
                        "usage": usage,
                    }
                    return
                yield {"text": text, "token_ids": [token]}
        finally:
            if context.is_killed() or finish_reason == "cancelled":
                say(f"Decode: cancelled {request_id} ({context.reason})")
            elif finish_reason is not None:
                say(f"Decode: done {request_id} ({finish_reason}, {generated} tokens)")


def _piece(token: int, *, first: bool, chat: bool) -> str:
    word = WORDS[token]
    if token == 0 or (first and chat):
        word = word.capitalize()
    return word if not word[0].isalnum() or (first and chat) else f" {word}"


@dynamo_worker()
async def main(runtime: DistributedRuntime, args: argparse.Namespace) -> None:
    namespace = runtime.namespace("dynamo")
    prefill = await namespace.component("prefill").endpoint("generate").client()
    say("Decode: waiting for a prefill worker")
    await prefill.wait_for_instances()
    endpoint = namespace.component("decode").endpoint("generate")
    worker = DecodeWorker(prefill, args.decode_ms_per_token, args.max_tokens)
    async with trio.open_nursery() as nursery:
        await nursery.start(endpoint.serve_endpoint, worker.generate)
        await endpoint.register_model("disagg", "chat")
        await endpoint.register_model("disagg", "completions")
        say(f"Decode: serving model 'disagg' at {endpoint.path}")
        if runtime.status_url is not None:  # DYN_SYSTEM_PORT is set
            say(f"Decode: metrics at {runtime.status_url}/metrics")
    say("Decode: shut down")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decode-ms-per-token", type=float, default=50.0)
    parser.add_argument("--max-tokens", type=int, default=32, help="when a request gives none")
    trio.run(main, parser.parse_args())
