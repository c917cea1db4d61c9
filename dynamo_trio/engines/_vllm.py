"""vLLM's ``AsyncLLM`` served by a trio worker, through the asyncio bridge.

The engine lives on the bridge's asyncio loop (:func:`open_asyncio_loop`),
created there when the worker starts and shut down when it stops, after the
runtime has drained its requests: ``AsyncLLM.shutdown()`` ends the engine-core
process it spawned, so the worker leaves no process behind.  Each request is
one ``engine.generate(...)`` stream (``RequestOutputKind.DELTA``) read through
:meth:`AsyncioLoop.batches` (a batch's outputs go out as one item) with
``engine.abort(request_id)`` as its abort hook: a hang-up, a deadline, a stop
or the worker's shutdown aborts the request in the engine before its handler
returns.  After a stop the handler yields a last ``finish_reason:
"cancelled"`` item with the usage so far.

The prompt is rendered and tokenized with the model's Hugging Face tokenizer
(its chat template), as for the transformers worker, on the engine's loop
when the request starts (a long prompt never holds up the trio thread); vLLM
detokenizes and matches stop sequences.  vLLM's own Prometheus series
(``vllm:num_requests_running``, ``vllm:num_requests_waiting``, ...) are
served on the worker's ``/metrics`` beside the runtime's.

``AsyncLLM`` starts its engine core with ``multiprocessing`` *spawn*: the
program that runs this worker must guard its entry point with
``if __name__ == "__main__":`` (``python -m dynamo_trio vllm`` does).
"""

from __future__ import annotations

import logging
import uuid
from functools import partial
from typing import TYPE_CHECKING, Any, final

import trio

from ..llm import validate_generate_request
from ..runtime._runtime import dynamo_worker
from ._asyncio import AsyncioLoop, open_asyncio_loop
from ._prompt import output_budget, prompt_ids

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator, Iterator
    from pathlib import Path

    from .._config import Config
    from .._context import Context
    from ..llm import FinishReason, GenerateOutput, GenerateRequest
    from ..runtime import DistributedRuntime

__all__ = ["VllmEngine", "run_vllm_worker"]

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

    __slots__ = ("_bridge", "_engine", "_tokenizer", "context_length")

    def __init__(self, bridge: AsyncioLoop, engine: Any, tokenizer: Any) -> None:
        self._bridge = bridge
        self._engine = engine
        self._tokenizer = tokenizer
        self.context_length = int(engine.model_config.max_model_len)

    async def generate(self, request: object, context: Context) -> AsyncIterator[GenerateOutput]:
        """Stream one generation: an item per engine output (see the module docstring).

        Raises:
            ValueError: if the request is invalid or does not fit the context.
        """
        valid = validate_generate_request(request)
        # vLLM wants ids unique among its running requests; the context's id is the
        # user's, and a client may reuse it.
        request_id = f"{context.id()}-{uuid.uuid4().hex[:8]}"
        engine, tokenizer, context_length = self._engine, self._tokenizer, self.context_length
        prompt: list[int] = []

        def start() -> AsyncIterator[Any]:
            # On the engine's loop: tokenizing a long prompt never holds up the trio thread.
            from vllm import SamplingParams
            from vllm.sampling_params import RequestOutputKind

            prompt.extend(prompt_ids(tokenizer, valid))
            max_tokens = output_budget(valid, len(prompt), context_length, None)
            params = SamplingParams(
                output_kind=RequestOutputKind.DELTA, **_sampling(valid, max_tokens)
            )
            outputs: AsyncIterator[Any] = engine.generate(
                {"prompt_token_ids": prompt}, params, request_id
            )
            return outputs

        batches: AsyncGenerator[list[Any], None] = self._bridge.batches(
            start, abort=lambda: engine.abort(request_id), context=context
        )
        generated = 0
        try:
            async for batch in batches:
                # The outputs read since the last batch: one item, so one frame.
                last = batch[-1]
                completion = last.outputs[0]
                token_ids = [token for output in batch for token in output.outputs[0].token_ids]
                text = "".join(output.outputs[0].text for output in batch)
                generated += len(token_ids)
                item: GenerateOutput = {"text": text, "token_ids": token_ids}
                if last.finished:
                    reason = _FINISH.get(completion.finish_reason or "stop", "stop")
                    item["finish_reason"] = reason
                    if reason == "stop" and isinstance(completion.stop_reason, str):
                        item["stop_sequence"] = completion.stop_reason
                    item["usage"] = {"prompt_tokens": len(prompt), "completion_tokens": generated}
                yield item
                if last.finished:
                    return
        finally:
            await batches.aclose()
        if context.is_killed():
            await trio.lowlevel.checkpoint()  # the kill's Cancelled: no last item
        yield {
            "text": "",
            "token_ids": [],
            "finish_reason": "cancelled" if context.is_stopped() else "stop",
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": generated},
        }


def _sampling(request: GenerateRequest, max_tokens: int) -> dict[str, Any]:
    """``SamplingParams`` keyword arguments for the request's sampling fields."""
    options: dict[str, Any] = {
        "max_tokens": max_tokens,
        "min_tokens": request.get("min_tokens") or 0,
        "ignore_eos": bool(request.get("ignore_eos")),
        "stop": list(request.get("stop", ())),
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
            engine, tokenizer = await bridge.run(partial(_start_engine, str(model_dir), args))
            try:
                runtime.registry.register(_VllmCollector())
                served = VllmEngine(bridge, engine, tokenizer)
                await _serve(runtime, served, model_name, endpoint)
            finally:
                with trio.CancelScope(shield=True):
                    await bridge.run(partial(_stop_engine, engine))

        await worker()


async def _start_engine(model_dir: str, args: dict[str, Any]) -> tuple[Any, Any]:
    """On the loop: the engine, and the model's tokenizer."""
    from transformers import AutoTokenizer
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=model_dir, **args))
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    return engine, tokenizer


async def _stop_engine(engine: Any) -> None:
    """On the loop: shut the engine down; its engine-core process exits."""
    engine.shutdown()


async def _serve(
    runtime: DistributedRuntime, engine: VllmEngine, model_name: str, endpoint: str
) -> None:
    served = runtime.endpoint(endpoint)
    async with trio.open_nursery() as nursery:
        await nursery.start(served.serve_endpoint, engine.generate)
        card: dict[str, Any] = {"context_length": engine.context_length}
        await served.register_model(model_name, "chat", **card)
        await served.register_model(model_name, "completions", **card)
        _log.info("serving %s (chat, completions) at %s", model_name, served.path)
