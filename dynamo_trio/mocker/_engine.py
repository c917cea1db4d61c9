"""The mock LLM engine: deterministic text and embeddings at a configurable pace
(docs/mocker.md)."""

from __future__ import annotations

import hashlib
import math
import random
from typing import TYPE_CHECKING, Final

import trio

from ..llm import (
    ContextLengthExceeded,
    StopMatcher,
    validate_embed_request,
    validate_generate_request,
)
from ._settings import MockerSettings
from ._text import TokenSource, count_tokens_yielding, render_prompt

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from .._context import Context
    from ..llm import Continuation, EmbedOutput, FinishReason, GenerateOutput


class MockEngine:
    """A mock LLM: deterministic words for text generation, hashed unit vectors for embeddings.

    Serve :meth:`generate` and :meth:`embed` as endpoint handlers::

        engine = MockEngine(MockerSettings(ttft_ms=50, inter_token_latency_ms=5))
        await endpoint.serve_endpoint(engine.generate)
    """

    __slots__ = ("settings",)

    def __init__(self, settings: MockerSettings | None = None) -> None:
        self.settings: Final = MockerSettings() if settings is None else settings

    async def generate(self, request: object, context: Context) -> AsyncIterator[GenerateOutput]:
        """Generate text for an engine request, one item per token (``text`` empty while held
        back as a possible stop sequence); ValueError for an invalid request or one over the
        limits (:class:`ContextLengthExceeded`)."""
        valid = validate_generate_request(request)
        prompt = render_prompt(valid)
        prompt_tokens = await count_tokens_yielding(prompt)
        max_tokens = self._max_tokens(valid.get("max_tokens"), prompt_tokens, valid["request_type"])
        min_tokens = valid.get("min_tokens") or 0
        tokens = TokenSource(prompt, valid.get("seed"))
        stops = StopMatcher(valid.get("stop", ()))
        continuation = valid.get("continuation")
        generated = 0 if continuation is None else _replay(continuation, tokens, stops, min_tokens)
        deadline = trio.current_time() + self.settings.ttft_ms / 1000
        text, token_ids, stop = "", list[int](), None
        reason: FinishReason | None = None
        if generated >= max_tokens:  # the earlier attempt produced every token but not the end
            await wait_until(deadline, context)  # a kill lands here
            reason = "length"
        while reason is None:
            if await wait_until(deadline, context, burst=generated % BURST != 0):
                text, token_ids, reason = "", [], "cancelled"
                break
            token_id, token = tokens.next()
            generated += 1
            text, stop = stops.push(token, active=generated >= min_tokens)
            token_ids = [token_id]
            if stop is not None:
                reason = "stop"
            elif generated >= max_tokens:
                reason = "length"
            else:
                yield {"text": text, "token_ids": token_ids}
                deadline += self.settings.inter_token_latency_ms / 1000
        last: GenerateOutput = {
            "text": text + stops.flush() if stop is None else text,
            "token_ids": token_ids,
            "finish_reason": reason,
        }
        if stop is not None:
            last["stop_sequence"] = stop
        last["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": generated}
        yield last

    def _max_tokens(self, requested: int | None, prompt_tokens: int, request_type: str) -> int:
        """The tokens to generate at most (ValueError over the model's limits)."""
        settings = self.settings
        if requested is not None and requested > settings.max_output_tokens:
            raise ValueError(
                f"max_tokens is too large: {requested}. This model supports at most "
                f"{settings.max_output_tokens} completion tokens, whereas you provided {requested}."
            )
        room = settings.context_length - prompt_tokens
        if room <= 0 or (requested is not None and requested > room):
            raise ContextLengthExceeded(
                context_length=settings.context_length,
                prompt_tokens=prompt_tokens,
                max_tokens=requested if room > 0 else None,
                prompt_kind="prompt" if request_type == "completion" else "messages",
            )
        if requested is not None:
            return requested
        return min(settings.default_max_tokens, settings.max_output_tokens, room)

    async def embed(self, request: object, context: Context) -> AsyncIterator[EmbedOutput]:
        """Embed each input as a unit vector fixed by its hash, after ``ttft_ms`` (fewer
        ``dimensions``: the leading components, renormalised); ValueError if invalid."""
        valid = validate_embed_request(request)
        full = self.settings.embedding_dimensions
        dimensions = valid.get("dimensions") or full
        if dimensions > full:
            raise ValueError(
                f"invalid embedding request: dimensions ({dimensions}) exceeds this model's "
                f"embedding size ({full})"
            )
        limit, inputs = self.settings.context_length, valid["input"]
        counts = [await count_tokens_yielding(text) for text in inputs]
        if (tokens := next((n for n in counts if n > limit), None)) is not None:
            raise ContextLengthExceeded(
                context_length=limit, prompt_tokens=tokens, max_tokens=None, prompt_kind="input"
            )
        if await wait_until(trio.current_time() + self.settings.ttft_ms / 1000, context):
            return
        yield {
            "embeddings": [_embedding(text, full, dimensions) for text in inputs],
            "usage": {"prompt_tokens": sum(counts)},
        }


BURST: Final = 16  # due tokens generated between two trips through the scheduler


async def wait_until(deadline: float, context: Context, *, burst: bool = False) -> bool:
    """Sleep until ``deadline`` unless stopped first; whether the context is stopped.  A kill
    lands here as :class:`trio.Cancelled`; with ``burst``, a past deadline does not yield."""
    if not context.is_stopped() and deadline > trio.current_time():
        with trio.move_on_at(deadline):
            await context.stopped()
    else:
        await (trio.lowlevel.checkpoint_if_cancelled if burst else trio.lowlevel.checkpoint)()
    if context.is_killed():
        # kill() wakes stopped() waiters before it cancels the scope, so the
        # cancellation may still be pending: take it here, before any yield.
        await trio.lowlevel.checkpoint()
    return context.is_stopped()


def _replay(
    continuation: Continuation, tokens: TokenSource, stops: StopMatcher, min_tokens: int
) -> int:
    """Draw the continuation's tokens again, checking they are this request's; return how many."""
    released: list[str] = []
    token_ids = continuation["token_ids"]
    for position, token_id in enumerate(token_ids, start=1):
        expected, token = tokens.next()
        if token_id != expected:
            raise ValueError(
                f"invalid continuation: token {position} is {token_id}, but this request's "
                f"token {position} is {expected}"
            )
        text, stop = stops.push(token, active=position >= min_tokens)
        if stop is not None:
            raise ValueError(
                f"invalid continuation: generation had ended at token {position} "
                f"(stop sequence {stop!r})"
            )
        released.append(text)
    if "".join(released) != continuation["text"]:
        raise ValueError(
            f"invalid continuation: its text does not match its {len(token_ids)} token(s)"
        )
    return len(token_ids)


def _embedding(text: str, full: int, dimensions: int) -> list[float]:
    """The unit vector of ``text``: ``full`` seeded Gaussian components, cut to ``dimensions``."""
    key = hashlib.blake2b(text.encode(), digest_size=8).digest()
    source = random.Random(int.from_bytes(key, "little"))
    vector = [source.gauss(0.0, 1.0) for _ in range(full)][:dimensions]
    norm = math.sqrt(math.fsum(x * x for x in vector)) or 1.0
    return [x / norm for x in vector]
