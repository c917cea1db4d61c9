"""A Hugging Face transformers model served by a trio worker, through the thread bridge.

``generate()`` runs in a thread per request, with a streamer that hands each
token to the handler and a stopping criterion that reads the request's stop
flag after every token, so a hang-up ends the generation at the next token.
Requests run one at a time by default (a ``seed`` seeds torch's global
generator).  Continuations and embeddings (mean-pooled last hidden states) are
described in docs/engines.md.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING, Any, Final, final

import trio

from .._startup import CannotServe
from ..llm import (
    ContextLengthExceeded,
    StopMatcher,
    Usage,
    validate_embed_request,
    validate_generate_request,
)
from ._detokenize import Detokenizer
from ._metrics import EngineMetrics
from ._prompt import check_length, output_budget, prompt_ids, register_text_model
from ._thread import stream_from_thread

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator
    from pathlib import Path

    from .._context import Context
    from ..llm import EmbedOutput, GenerateOutput, GenerateRequest
    from ..runtime import DistributedRuntime
    from ._thread import Emit, StopFlag

_log = logging.getLogger("dynamo_trio.engines")

DEFAULT_MAX_TOKENS: Final = 512
"""Tokens generated for a request that names no ``max_tokens`` (at most what fits)."""


@final
class TransformersEngine:
    """A causal LM and its tokenizer, loaded from a local checkpoint directory.

    Create it with :meth:`load` (blocking: call it from a thread); serve
    :meth:`generate` as an endpoint handler.
    """

    __slots__ = (
        "_eos",
        "_model",
        "_slots",
        "_tokenizer",
        "context_length",
        "default_max_tokens",
        "metrics",
    )

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_concurrency: int = 1,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        metrics: EngineMetrics | None = None,
    ) -> None:
        self.metrics = metrics if metrics is not None else EngineMetrics(None, "unnamed")
        self._model = model
        self._tokenizer = tokenizer
        self._slots = trio.Semaphore(max_concurrency)
        self.default_max_tokens = default_max_tokens
        config = model.config
        length: Any = getattr(config, "max_position_embeddings", None) or getattr(
            tokenizer, "model_max_length", 2048
        )
        self.context_length = int(length)
        eos = model.generation_config.eos_token_id
        if eos is None:
            eos = tokenizer.eos_token_id
        self._eos: frozenset[int] = frozenset(
            () if eos is None else (eos if isinstance(eos, list) else [eos])
        )

    @classmethod
    def load(
        cls, model_dir: Path | str, *, dtype: str = "auto", **settings: Any
    ) -> TransformersEngine:
        """Load the checkpoint in ``model_dir`` (local files only, nothing downloaded).

        Raises:
            ImportError: if torch or transformers is not installed.
            OSError: if the directory is not a checkpoint transformers can load.
        """
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        torch_dtype = dtype if dtype == "auto" else getattr(torch, dtype)
        model = AutoModelForCausalLM.from_pretrained(
            model_dir, local_files_only=True, dtype=torch_dtype
        )
        model.eval()
        return cls(model, tokenizer, **settings)

    async def embed(self, request: object, context: Context) -> AsyncIterator[EmbedOutput]:
        """Embed each input as the mean of the model's last hidden states over its
        tokens, L2-normalised (``dimensions`` keeps the leading components,
        renormalised).  The model runs in a thread, one input at a time: a kill
        waits for the input under way at most, and a stop yields nothing.

        Raises:
            ValueError: if the request is invalid, an input is empty or longer than
                the context (:class:`~dynamo_trio.llm.ContextLengthExceeded`), or
                ``dimensions`` exceeds the model's hidden size.
        """
        valid = validate_embed_request(request)
        full = int(self._model.config.hidden_size)
        dimensions = valid.get("dimensions") or full
        if dimensions > full:
            raise ValueError(
                f"invalid embedding request: dimensions ({dimensions}) exceeds this model's "
                f"embedding size ({full})"
            )
        vectors: list[list[float]] = []
        tokens = 0
        async with self._slots:
            for text in valid["input"]:
                vector, count = await trio.to_thread.run_sync(self._embed_one, text, dimensions)
                vectors.append(vector)
                tokens += count
        if context.is_stopped():
            return  # an embedding has no partial result
        yield {"embeddings": vectors, "usage": {"prompt_tokens": tokens}}

    def _embed_one(self, text: str, dimensions: int) -> tuple[list[float], int]:  # in a thread
        import torch

        check_length(self._tokenizer, text, self.context_length, "input")
        ids = list(self._tokenizer(text)["input_ids"])
        if not ids:
            raise ValueError("invalid embedding request: an input is empty")
        if len(ids) > self.context_length:
            raise ContextLengthExceeded(
                context_length=self.context_length,
                prompt_tokens=len(ids),
                max_tokens=None,
                prompt_kind="input",
            )
        with torch.inference_mode():
            output = self._model(torch.tensor([ids], dtype=torch.long), output_hidden_states=True)
            vector = output.hidden_states[-1][0].float().mean(dim=0)[:dimensions]
            vector = vector / vector.norm().clamp_min(1e-12)
        return vector.tolist(), len(ids)

    def prompt_ids(self, request: GenerateRequest) -> list[int]:
        """The request's prompt as token ids: chat messages through the model's template."""
        return prompt_ids(self._tokenizer, request, self.context_length)

    async def generate(self, request: object, context: Context) -> AsyncIterator[GenerateOutput]:
        """Generate text for an engine request, one item per token (see the module docstring).

        Raises:
            ValueError: if the request is invalid, or does not fit the context
                (:class:`~dynamo_trio.llm.ContextLengthExceeded`).
        """
        valid = validate_generate_request(request)
        await self._slots.acquire()
        items = self._generate(valid, context)
        try:
            async for item in items:
                yield item
        finally:
            await items.aclose()  # its thread joined before the next request may start
            self._slots.release()

    async def _generate(
        self, request: GenerateRequest, context: Context
    ) -> AsyncGenerator[GenerateOutput, None]:
        plan: dict[str, Any] = {}
        items: AsyncGenerator[tuple[int | None, str], None] = stream_from_thread(
            lambda emit, should_stop: self._run(request, plan, emit, should_stop),
            context=context,
            name=f"transformers {context.id()}",
        )
        stops = StopMatcher(request.get("stop", ()))
        min_tokens = request.get("min_tokens") or 0
        ignore_eos = bool(request.get("ignore_eos"))
        continuation = request.get("continuation")
        generated = len(continuation["token_ids"]) if continuation else 0
        try:
            async for token_id, delta in items:
                if token_id is None:  # a continuation's text the client has not been sent
                    text, stop = stops.push(delta, active=generated >= min_tokens)
                    if stop is None and generated < plan["max_tokens"]:
                        if text:
                            yield {"text": text, "token_ids": []}
                        continue
                    last: GenerateOutput = {
                        "text": text + stops.flush(),
                        "token_ids": [],
                        "finish_reason": "length" if stop is None else "stop",
                        "usage": _usage(plan["prompt_tokens"], generated),
                    }
                    if stop is not None:
                        last["stop_sequence"] = stop
                    yield last
                    return
                generated += 1
                usage = _usage(plan["prompt_tokens"], generated)
                if token_id in self._eos and not ignore_eos:
                    yield {
                        "text": stops.flush(),
                        "token_ids": [token_id],
                        "finish_reason": "stop",
                        "usage": usage,
                    }
                    return
                text, stop = stops.push(delta, active=generated >= min_tokens)
                if stop is not None:
                    yield {
                        "text": text,
                        "token_ids": [token_id],
                        "finish_reason": "stop",
                        "stop_sequence": stop,
                        "usage": usage,
                    }
                    return
                if generated >= plan["max_tokens"]:
                    yield {
                        "text": text + stops.flush(),
                        "token_ids": [token_id],
                        "finish_reason": "length",
                        "usage": usage,
                    }
                    return
                yield {"text": text, "token_ids": [token_id]}
        finally:
            await items.aclose()
        if context.is_killed():
            await trio.lowlevel.checkpoint()  # the kill's Cancelled: no last item
        yield {
            "text": stops.flush(),
            "token_ids": [],
            "finish_reason": "cancelled" if context.is_stopped() else "stop",
            "usage": _usage(plan.get("prompt_tokens", 0), generated),
        }

    def _run(
        self,
        request: GenerateRequest,
        plan: dict[str, Any],
        emit: Emit[tuple[int | None, str]],
        should_stop: StopFlag,
    ) -> None:
        """In the request's thread: tokenize, check the limits, run ``generate()``."""
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList
        from transformers.generation.streamers import BaseStreamer

        prompt = self.prompt_ids(request)
        plan["prompt_tokens"] = len(prompt)
        max_tokens = output_budget(
            request, len(prompt), self.context_length, self.default_max_tokens
        )
        plan["max_tokens"] = max_tokens
        detokenizer = Detokenizer(self._tokenizer, prompt)
        continuation = request.get("continuation")
        done = continuation["token_ids"] if continuation else []
        if continuation:
            # The earlier attempt's tokens continue the prompt; their text beyond what the
            # client was sent (held back as a possible stop sequence) comes first.
            text = "".join(detokenizer.push(token_id) for token_id in done)
            sent = continuation["text"]
            emit((None, text[len(sent) :] if text.startswith(sent) else ""))
        new_tokens = max_tokens - len(done)
        if new_tokens <= 0:
            return

        class Streamer(BaseStreamer):  # type: ignore[misc]
            """Hands each new token to the handler (the first ``put`` is the prompt)."""

            prompt_seen = False

            def put(self, value: Any) -> None:
                if not self.prompt_seen:
                    self.prompt_seen = True
                    return
                for token_id in value.reshape(-1).tolist():
                    generated_tokens.inc()
                    emit((token_id, detokenizer.push(token_id)))

            def end(self) -> None:
                pass

        class Stop(StoppingCriteria):  # type: ignore[misc]
            """Ends the generation after the token under way once the request is stopped."""

            def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
                return torch.full((input_ids.shape[0],), should_stop(), dtype=torch.bool)

        options = self._sampling(request, new_tokens, len(done))
        generated_tokens = self.metrics.generated_tokens
        if should_stop():
            return
        running = self.metrics.requests_running
        running.inc()
        try:
            with torch.inference_mode():
                self._model.generate(
                    torch.tensor([prompt + done], dtype=torch.long),
                    attention_mask=torch.ones((1, len(prompt) + len(done)), dtype=torch.long),
                    streamer=Streamer(),
                    stopping_criteria=StoppingCriteriaList([Stop()]),
                    **options,
                )
        finally:
            running.dec()

    def _sampling(self, request: GenerateRequest, new_tokens: int, done: int) -> dict[str, Any]:
        """``generate()``'s keyword arguments for the request's sampling fields, for
        ``new_tokens`` more tokens after ``done`` already generated (a continuation)."""
        import torch

        temperature = request.get("temperature")
        temperature = 1.0 if temperature is None else temperature
        wanted = request.get("min_tokens") or 0
        min_tokens = new_tokens if request.get("ignore_eos") else max(0, wanted - done)
        options: dict[str, Any] = {
            "max_new_tokens": new_tokens,
            "min_new_tokens": min(min_tokens, new_tokens),
            "pad_token_id": self._tokenizer.pad_token_id or next(iter(self._eos), 0),
        }
        if temperature == 0:
            options.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            options.update(
                do_sample=True,
                temperature=temperature,
                top_p=request.get("top_p") or 1.0,
                top_k=request.get("top_k") or 0,
            )
        seed = request.get("seed")
        if seed is not None:
            torch.manual_seed(seed)
        return options


def _usage(prompt_tokens: int, completion_tokens: int) -> Usage:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}


async def serve_transformers(
    runtime: DistributedRuntime,
    model_dir: Path | str,
    *,
    model_name: str,
    endpoint: str = "dynamo.transformers.generate",
    dtype: str = "auto",
    **settings: Any,
) -> None:
    """Load the checkpoint (in a thread) and serve it as ``model_name`` (chat and
    completions on ``endpoint``, embeddings on ``embed`` beside it) until the runtime
    shuts down; its metrics go to the runtime's registry."""
    metrics = EngineMetrics(runtime.registry, model_name)
    load = partial(TransformersEngine.load, model_dir, dtype=dtype, metrics=metrics, **settings)
    _log.info("loading %s from %s", model_name, model_dir)
    try:
        engine = await trio.to_thread.run_sync(load)
    except Exception as exc:
        raise CannotServe(f"transformers could not load {model_dir}: {exc}") from exc
    if runtime.shutting_down:  # a signal came while the model loaded
        return
    served = runtime.endpoint(endpoint)
    async with trio.open_nursery() as nursery:
        await nursery.start(served.serve_endpoint, engine.generate)
        await register_text_model(served, model_name, engine.context_length)
        embed = runtime.endpoint(f"{endpoint.rsplit('.', 1)[0]}.embed")
        await nursery.start(embed.serve_endpoint, engine.embed)
        await embed.register_model(model_name, "embeddings", context_length=engine.context_length)
        _log.info(
            "serving %s (chat, completions) at %s, embeddings at %s",
            model_name,
            served.path,
            embed.path,
        )
