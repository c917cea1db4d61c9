"""The mock engine's token limits: refused as a real engine refuses, announced on its cards."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
import trio

from dynamo_trio import Config, Context, DistributedRuntime
from dynamo_trio._config import DiscoveryConfig
from dynamo_trio.discovery import ModelCard, decode_model_card, model_prefix
from dynamo_trio.llm import ContextLengthExceeded
from dynamo_trio.mocker import MockEngine, MockerSettings, count_tokens, render_prompt
from dynamo_trio.mocker._worker import serve_mocker

LIMITED = MockerSettings(inter_token_latency_ms=0, context_length=40, max_output_tokens=16)


def chat(content: str = "hi", **fields: Any) -> dict[str, Any]:
    return {
        "model": "mock",
        "request_type": "chat",
        "messages": [{"role": "user", "content": content}],
        **fields,
    }


async def run(engine: MockEngine, request: dict[str, Any]) -> list[dict[str, Any]]:
    return [dict(item) async for item in engine.generate(request, Context())]


@pytest.mark.parametrize("fields", [{"context_length": 0}, {"max_output_tokens": 0}])
def test_limits_are_positive(fields: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(fields))):
        MockerSettings(**fields)


async def test_max_tokens_over_the_output_limit_is_refused() -> None:
    engine = MockEngine(LIMITED)
    assert len(await run(engine, chat(max_tokens=16))) <= 16
    with pytest.raises(ValueError, match=r"max_tokens is too large: 17\. .* at most 16 "):
        await run(engine, chat(max_tokens=17))


async def test_prompt_plus_max_tokens_over_the_context_is_refused() -> None:
    engine = MockEngine(LIMITED)
    request = chat("word " * 20, max_tokens=16)
    prompt_tokens = count_tokens(render_prompt(request))  # type: ignore[arg-type]
    assert prompt_tokens + 16 > 40 >= prompt_tokens
    with pytest.raises(ContextLengthExceeded) as caught:
        await run(engine, request)
    assert str(caught.value) == (
        f"This model's maximum context length is 40 tokens. However, you requested "
        f"{prompt_tokens + 16} tokens ({prompt_tokens} in the messages, 16 in the "
        "completion). Please reduce the length of the messages or completion."
    )


async def test_a_prompt_longer_than_the_context_is_refused_even_without_max_tokens() -> None:
    engine = MockEngine(LIMITED)
    completion = {"model": "mock", "request_type": "completion", "prompt": "word " * 40}
    with pytest.raises(ContextLengthExceeded, match="your prompt resulted in 40 tokens"):
        await run(engine, completion)


async def test_without_max_tokens_generation_stops_at_the_end_of_the_context() -> None:
    settings = MockerSettings(inter_token_latency_ms=0, context_length=30, default_max_tokens=64)
    request = chat("one two three")
    prompt_tokens = count_tokens(render_prompt(request))  # type: ignore[arg-type]
    items = await run(MockEngine(settings), request)
    assert items[-1]["finish_reason"] == "length"
    assert items[-1]["usage"] == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 30 - prompt_tokens,
    }


async def test_an_embedding_input_longer_than_the_context_is_refused() -> None:
    engine = MockEngine(LIMITED)
    request = {"model": "e", "request_type": "embedding", "input": ["short", "word " * 41]}
    with pytest.raises(ContextLengthExceeded, match="your input resulted in 41 tokens"):
        async for _ in engine.embed(request, Context()):
            pass


async def test_the_cards_announce_the_limits() -> None:
    config = Config().replace(discovery=DiscoveryConfig(backend="mem"))
    settings = MockerSettings(context_length=1000, max_output_tokens=100)
    async with DistributedRuntime(config) as runtime, trio.open_nursery() as nursery:
        nursery.start_soon(
            partial(serve_mocker, runtime, settings, model_name="m", embedding_model_name="e")
        )
        cards = await _cards(runtime, count=3)
        nursery.cancel_scope.cancel()
    limits = {
        (c.name, c.model_type): (c.context_length, c.max_output_tokens, c.accepts_continuation)
        for c in cards
    }
    assert limits == {
        ("m", "chat"): (1000, 100, True),
        ("m", "completions"): (1000, 100, True),
        ("e", "embeddings"): (1000, None, False),
    }


async def _cards(runtime: DistributedRuntime, *, count: int) -> list[ModelCard]:
    view = await runtime.watch_prefix(model_prefix("dynamo"), decode_model_card)
    with trio.fail_after(5):
        items = await view.wait_until(lambda items: len(items) >= count)
    return list(items.values())
