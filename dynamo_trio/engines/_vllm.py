"""vLLM's ``AsyncLLM`` served by a trio worker, through the asyncio bridge.

The engine lives on the bridge's loop from the worker's start to its stop
(``AsyncLLM.shutdown()`` ends its engine-core process).  A request is one
``engine.generate(...)`` stream read in batches, each batch sent as one item; an
early end of any kind runs ``engine.abort(request_id)`` before the handler
returns.  ``AsyncLLM`` spawns a process: guard the entry point with
``if __name__ == "__main__":``.  See docs/engines.md.
"""

from __future__ import annotations

import logging
import uuid
from functools import partial
from typing import TYPE_CHECKING, Any, final

import trio

from .._startup import CannotServe
from ..llm import StopMatcher, validate_generate_request
from ..runtime._runtime import dynamo_worker
from ._asyncio import AsyncioLoop, open_asyncio_loop
from ._detokenize import Detokenizer
from ._prompt import output_budget, prompt_ids, register_text_model

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator, Iterator
    from pathlib import Path

    from .._config import Config
    from .._context import Context
    from ..llm import FinishReason, GenerateOutput, GenerateRequest, Usage
    from ..runtime import DistributedRuntime

_log = logging.getLogger("dynamo_trio.engines")

_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "cancelled"}


@final
class VllmEngine:
    """An ``AsyncLLM`` on the bridge's loop, and the handler that serves it.

    Args:
        bridge: The loop the engine was created on.
        engine: The ``vllm.v1.engine.async_llm.AsyncLLM``.
        tokenizer: The model's Hugging Face tokenizer (for the chat template).
    """

    __slots__ = ("_bridge", "_engine", "_tokenizer", "_tokenizing", "context_length")

    def __init__(self, bridge: AsyncioLoop, engine: Any, tokenizer: Any) -> None:
        self._bridge = bridge
        self._engine = engine
        self._tokenizer = tokenizer
        # Prompts are tokenized in a thread, one at a time (a Hugging Face tokenizer is
        # not safe to share between threads): a long prompt holds up neither loop.
        self._tokenizing = trio.CapacityLimiter(1)
        self.context_length = int(engine.model_config.max_model_len)

    async def generate(self, request: object, context: Context) -> AsyncIterator[GenerateOutput]:
        """Stream one generation: an item per batch of engine outputs (see the module
        docstring).

        Raises:
            ValueError: if the request is invalid or does not fit the context.
        """
        valid = validate_generate_request(request)
        # vLLM wants ids unique among its running requests; the context's id is the
        # user's, and a client may reuse it.
        request_id = f"{context.id()}-{uuid.uuid4().hex[:8]}"
        engine, tokenizer, context_length = self._engine, self._tokenizer, self.context_length
        continuation = valid.get("continuation")
        done = list(continuation["token_ids"]) if continuation else []
        plan: dict[str, Any] = {"prompt_tokens": 0, "new_tokens": 1, "held": ""}
        prompt = await trio.to_thread.run_sync(
            prompt_ids, tokenizer, valid, context_length, limiter=self._tokenizing
        )

        def start() -> AsyncIterator[Any]:  # on the engine's loop
            from vllm import SamplingParams
            from vllm.sampling_params import RequestOutputKind

            budget = output_budget(valid, len(prompt), context_length, None)
            plan["prompt_tokens"], plan["new_tokens"] = len(prompt), budget - len(done)
            if continuation:
                plan["held"] = _held_text(tokenizer, prompt, done, continuation["text"])
            if plan["new_tokens"] <= 0:
                return _nothing()
            options = _sampling(valid, plan["new_tokens"], done=len(done))
            params = SamplingParams(output_kind=RequestOutputKind.DELTA, **options)
            outputs: AsyncIterator[Any] = engine.generate(
                {"prompt_token_ids": prompt + done}, params, request_id
            )
            return outputs

        batches: AsyncGenerator[list[Any], None] = self._bridge.batches(
            start, abort=lambda: engine.abort(request_id), context=context
        )
        # A continuation's stop sequences are matched here, across the boundary with
        # the earlier attempt's text (vLLM sees only its own); others by vLLM.
        stops = StopMatcher(valid.get("stop", ())) if continuation else None
        min_tokens = valid.get("min_tokens") or 0
        generated = len(done)
        try:
            async for batch in batches:
                # The outputs read since the last batch: one item, so one frame.
                last = batch[-1]
                completion = last.outputs[0]
                token_ids = [token for output in batch for token in output.outputs[0].token_ids]
                text = "".join(output.outputs[0].text for output in batch)
                generated += len(token_ids)
                item: GenerateOutput = {"text": text, "token_ids": token_ids}
                if stops is not None:
                    text, plan["held"] = plan["held"] + text, ""
                    item["text"], stop = stops.push(text, active=generated >= min_tokens)
                    if stop is not None:
                        item["finish_reason"], item["stop_sequence"] = "stop", stop
                        item["usage"] = _usage(plan, generated)
                        yield item
                        return
                    if last.finished:
                        item["text"] += stops.flush()
                if last.finished:
                    reason = _FINISH.get(completion.finish_reason or "stop", "stop")
                    item["finish_reason"] = reason
                    if reason == "stop" and isinstance(completion.stop_reason, str):
                        item["stop_sequence"] = completion.stop_reason
                    item["usage"] = _usage(plan, generated)
                yield item
                if last.finished:
                    return
        finally:
            await batches.aclose()
        if context.is_killed():
            await trio.lowlevel.checkpoint()  # the kill's Cancelled: no last item
        last_item: GenerateOutput = {"text": "", "token_ids": [], "finish_reason": "stop"}
        if stops is not None:  # what was held back for a stop sequence
            text, stop = stops.push(plan["held"], active=generated >= min_tokens)
            last_item["text"] = text if stop is not None else text + stops.flush()
            if stop is not None:
                last_item["stop_sequence"] = stop
        if context.is_stopped():
            last_item["finish_reason"] = "cancelled"
        elif plan["new_tokens"] <= 0 and "stop_sequence" not in last_item:
            last_item["finish_reason"] = "length"  # a continuation with nothing left to make
        last_item["usage"] = _usage(plan, generated)
        yield last_item


def _usage(plan: dict[str, Any], generated: int) -> Usage:
    return {"prompt_tokens": plan["prompt_tokens"], "completion_tokens": generated}


async def _nothing() -> AsyncIterator[Any]:
    """An engine stream that ends at once (a continuation with no tokens left to make)."""
    return
    yield


def _held_text(tokenizer: Any, prompt: list[int], done: list[int], sent: str) -> str:
    """The text of the earlier attempt's tokens that its client was not sent (held back
    as the possible start of a stop sequence)."""
    detokenizer = Detokenizer(tokenizer, prompt)
    text = "".join(detokenizer.push(token_id) for token_id in done)
    return text[len(sent) :] if text.startswith(sent) else ""


def _sampling(request: GenerateRequest, max_tokens: int, *, done: int = 0) -> dict[str, Any]:
    """``SamplingParams`` keyword arguments for the request's sampling fields, for
    ``max_tokens`` more tokens after ``done`` already made (a continuation, whose stop
    sequences the handler matches)."""
    options: dict[str, Any] = {
        "max_tokens": max_tokens,
        "min_tokens": max(0, (request.get("min_tokens") or 0) - done),
        "ignore_eos": bool(request.get("ignore_eos")),
        "stop": [] if request.get("continuation") else list(request.get("stop", ())),
        "temperature": 1.0 if request.get("temperature") is None else request.get("temperature"),
    }
    for name in ("top_p", "top_k", "seed"):
        value = request.get(name)
        if value is not None:
            options[name] = value
    return options


@final
class _VllmCollector:
    """Serves the ``vllm:`` families of the process's default Prometheus registry
    (where vLLM's stat logger records) from the runtime's own registry."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client import REGISTRY

        for family in REGISTRY.collect():
            if family.name.startswith("vllm:"):
                yield family


async def run_vllm_worker(
    config: Config,
    model_dir: Path | str,
    *,
    model_name: str,
    endpoint: str = "dynamo.vllm.generate",
    **engine_args: Any,
) -> None:
    """Start ``AsyncLLM`` on ``model_dir`` and serve it until SIGINT/SIGTERM; then drain,
    shut the engine (and its engine-core process) down, and return.

    ``engine_args`` are ``vllm.engine.arg_utils.AsyncEngineArgs`` fields (``dtype``,
    ``max_model_len``, ...); ``None`` values are left to vLLM.
    """
    args = {key: value for key, value in engine_args.items() if value is not None}
    async with open_asyncio_loop("dynamo-trio vllm") as bridge:

        @dynamo_worker(config)
        async def worker(runtime: DistributedRuntime) -> None:
            try:
                engine, tokenizer = await bridge.run(partial(_start_engine, str(model_dir), args))
            except Exception as exc:
                if not runtime.shutting_down:
                    raise CannotServe(f"vLLM could not start on {model_dir}: {exc}") from exc
                # Ctrl-C reaches the engine-core process too, and its start fails: that
                # is the shutdown asked for, not a crash.
                _log.warning("shut down while the engine was starting (it reported: %s)", exc)
                return
            try:
                runtime.registry.register(_VllmCollector())
                handler = VllmEngine(bridge, engine, tokenizer)
                served = runtime.endpoint(endpoint)
                async with trio.open_nursery() as nursery:
                    await nursery.start(served.serve_endpoint, handler.generate)
                    await register_text_model(served, model_name, handler.context_length)
                    _log.info("serving %s (chat, completions) at %s", model_name, served.path)
            finally:
                with trio.CancelScope(shield=True):
                    await bridge.run(partial(_stop_engine, engine))

        await worker()


async def _start_engine(model_dir: str, args: dict[str, Any]) -> tuple[Any, Any]:
    """On the loop: the engine, and the model's tokenizer."""
    from transformers import AutoTokenizer
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    # The tokenizer first, and the engine in no local: a library keeps the frames of its
    # lazy imports (an error's traceback), and with them their callers' locals.
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    return AsyncLLM.from_engine_args(AsyncEngineArgs(model=model_dir, **args)), tokenizer


async def _stop_engine(engine: Any) -> None:
    """On the loop: shut the engine down; its engine-core process exits."""
    engine.shutdown()
