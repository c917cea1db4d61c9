"""The mock engine: determinism, limits, timing on a virtual clock, stop and kill, embeddings.

Timing tests use pytest-trio's ``autojump_clock``: virtual time jumps ahead
whenever every task is blocked, so nothing really sleeps and times are exact.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import trio
import trio.testing

from dynamo_trio import Context
from dynamo_trio.llm import Generation, validate_generate_request
from dynamo_trio.mocker import MockEngine, MockerSettings, TokenSource, count_tokens, render_prompt

FAST = MockerSettings(inter_token_latency_ms=0.0)


def chat(content: str = "Tell me a story.", **fields: Any) -> dict[str, Any]:
    return {
        "model": "mock",
        "request_type": "chat",
        "messages": [{"role": "user", "content": content}],
        **fields,
    }


def completion(prompt: str = "Once upon a time", **fields: Any) -> dict[str, Any]:
    return {"model": "mock", "request_type": "completion", "prompt": prompt, **fields}


async def run(
    engine: MockEngine, request: dict[str, Any], context: Context | None = None
) -> list[dict[str, Any]]:
    return [dict(item) async for item in engine.generate(request, context or Context())]


def text_of(items: list[dict[str, Any]]) -> str:
    return "".join(item["text"] for item in items)


# ---------------------------------------------------------------------------- settings


@pytest.mark.parametrize(
    "fields",
    [
        {"ttft_ms": -1.0},
        {"inter_token_latency_ms": math.inf},
        {"inter_token_latency_ms": math.nan},
        {"default_max_tokens": 0},
        {"embedding_dimensions": 0},
    ],
)
def test_settings_are_checked(fields: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(fields))):
        MockerSettings(**fields)


def test_defaults() -> None:
    engine = MockEngine()
    assert engine.settings == MockerSettings(
        ttft_ms=0.0, inter_token_latency_ms=10.0, default_max_tokens=64, embedding_dimensions=16
    )


# ---------------------------------------------------------------------------- generation


async def test_same_prompt_and_seed_give_the_same_text() -> None:
    engine = MockEngine(FAST)
    first = await run(engine, chat(seed=3, max_tokens=12))
    assert first == await run(MockEngine(FAST), chat(seed=3, max_tokens=12))
    assert text_of(first) != text_of(await run(engine, chat(seed=4, max_tokens=12)))
    assert text_of(first) != text_of(await run(engine, chat("Another.", seed=3, max_tokens=12)))
    words = text_of(first).split(" ")
    assert len(words) == 12
    assert all(words)


async def test_max_tokens_ends_with_length_and_usage() -> None:
    request = completion(max_tokens=5)
    items = await run(MockEngine(FAST), request)
    assert len(items) == 5
    assert all("finish_reason" not in item for item in items[:-1])
    assert all(len(item["token_ids"]) == 1 for item in items)
    prompt_tokens = count_tokens("Once upon a time")
    assert items[-1]["finish_reason"] == "length"
    assert items[-1]["usage"] == {"prompt_tokens": prompt_tokens, "completion_tokens": 5}
    generation = Generation.collect(items)
    assert generation.usage == {"prompt_tokens": prompt_tokens, "completion_tokens": 5}


async def test_default_max_tokens() -> None:
    engine = MockEngine(MockerSettings(inter_token_latency_ms=0, default_max_tokens=7))
    items = await run(engine, chat(max_tokens=None))
    assert items[-1]["usage"]["completion_tokens"] == 7


async def test_chat_prompt_tokens_count_the_template() -> None:
    request = chat("hi there", max_tokens=1)
    [item] = await run(MockEngine(FAST), request)
    prompt = render_prompt(validate_generate_request(request))
    assert item["usage"]["prompt_tokens"] == count_tokens(prompt)


def _words(request: dict[str, Any], count: int) -> list[str]:
    source = TokenSource(render_prompt(validate_generate_request(request)), request.get("seed"))
    return [source.next()[1] for _ in range(count)]


async def test_stop_sequence_ends_with_stop_and_is_not_output() -> None:
    request = completion(seed=1, max_tokens=50)
    words = _words(request, 6)
    stop = words[3] + words[4]  # spans two tokens
    items = await run(MockEngine(FAST), {**request, "stop": ["never-generated", stop]})
    assert text_of(items) == "".join(words[:3])
    last = items[-1]
    assert (last["finish_reason"], last["stop_sequence"]) == ("stop", stop)
    assert last["usage"]["completion_tokens"] == 5


async def test_min_tokens_defers_stop_sequences() -> None:
    request = completion(seed=1, max_tokens=6)
    words = _words(request, 6)
    items = await run(MockEngine(FAST), {**request, "stop": [words[0]], "min_tokens": 3})
    assert text_of(items) == "".join(words)  # the stop was produced only before min_tokens
    assert items[-1]["finish_reason"] == "length"


async def test_text_held_back_for_a_stop_is_released_at_the_end() -> None:
    request = completion(seed=1, max_tokens=3)
    words = _words(request, 3)
    items = await run(MockEngine(FAST), {**request, "stop": [words[2] + "!"]})
    assert items[-1]["text"] == words[2]  # held, then flushed with the length finish
    assert text_of(items) == "".join(words)


@pytest.mark.parametrize(
    ("request_body", "fragment"),
    [
        ({"model": "m", "request_type": "chat"}, "messages"),
        (completion(max_tokens=0), "max_tokens"),
        (completion(request_type="embedding"), "request_type"),
        ("hello", "object"),
    ],
)
async def test_invalid_requests_raise_value_error(request_body: object, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        await run(MockEngine(FAST), request_body)  # type: ignore[arg-type]


async def test_first_token_after_ttft_then_one_per_inter_token_latency(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = MockEngine(MockerSettings(ttft_ms=100, inter_token_latency_ms=10))
    start = trio.current_time()
    times = []
    async for _ in engine.generate(completion(max_tokens=4), Context()):
        times.append(trio.current_time() - start)
    assert times == pytest.approx([0.1, 0.11, 0.12, 0.13])


async def test_a_slow_consumer_gets_the_tokens_it_missed_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = MockEngine(MockerSettings(ttft_ms=0, inter_token_latency_ms=10))
    start = trio.current_time()
    times = []
    async for _ in engine.generate(completion(max_tokens=4), Context()):
        times.append(trio.current_time() - start)
        if len(times) == 1:
            await trio.sleep(0.025)
    assert times == pytest.approx([0.0, 0.025, 0.025, 0.03])


async def test_zero_latency_still_checkpoints_so_it_can_be_killed() -> None:
    engine = MockEngine(MockerSettings(inter_token_latency_ms=0, default_max_tokens=10**9))
    context = Context()
    count = 0

    async def kill_soon() -> None:
        await trio.lowlevel.checkpoint()
        context.kill()

    with trio.fail_after(5):
        async with context.scope() as nursery:
            nursery.start_soon(kill_soon)
            async for _ in engine.generate(completion(), context):
                count += 1
    assert 0 < count < 1000


# ---------------------------------------------------------------------------- stop


async def _stop_after(context: Context, delay: float) -> None:
    await trio.sleep(delay)
    context.stop()


async def timed_run(
    engine: MockEngine, request: dict[str, Any], context: Context, stop_at: float
) -> list[tuple[float, dict[str, Any]]]:
    start = trio.current_time()
    out = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_stop_after, context, stop_at)
        async for item in engine.generate(request, context):
            out.append((trio.current_time() - start, dict(item)))
    return out


async def test_stop_while_waiting_for_the_first_token_answers_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = MockEngine(MockerSettings(ttft_ms=1000))
    request = chat("hi")
    [(when, item)] = await timed_run(engine, request, Context(), stop_at=0.25)
    assert when == pytest.approx(0.25)
    prompt_tokens = count_tokens(render_prompt(validate_generate_request(request)))
    assert item == {
        "text": "",
        "token_ids": [],
        "finish_reason": "cancelled",
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 0},
    }


async def test_stop_between_tokens_answers_at_once_with_usage(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = MockEngine(MockerSettings(ttft_ms=100, inter_token_latency_ms=1000))
    out = await timed_run(engine, completion(max_tokens=100), Context(), stop_at=1.5)
    times = [t for t, _ in out]
    assert times == pytest.approx([0.1, 1.1, 1.5])
    last = out[-1][1]
    assert last["finish_reason"] == "cancelled"
    assert last["usage"]["completion_tokens"] == 2
    assert Generation.collect([item for _, item in out]).finish_reason == "cancelled"


async def test_stop_seen_by_the_consumer_ends_the_stream_without_another_token() -> None:
    engine = MockEngine(FAST)
    context = Context()
    items: list[dict[str, Any]] = []
    async for item in engine.generate(completion(max_tokens=100), context):
        items.append(dict(item))
        if len(items) == 3:
            context.stop()
    assert len(items) == 4
    assert items[-1]["finish_reason"] == "cancelled"
    assert items[-1]["token_ids"] == []
    assert items[-1]["usage"]["completion_tokens"] == 3


async def test_stop_releases_text_held_for_a_possible_stop_sequence(
    autojump_clock: trio.testing.MockClock,
) -> None:
    request = completion(seed=2, max_tokens=10)
    first = _words(request, 1)[0]
    engine = MockEngine(MockerSettings(inter_token_latency_ms=1000))
    out = await timed_run(engine, {**request, "stop": [first + "?!"]}, Context(), stop_at=0.5)
    assert [item["text"] for _, item in out] == ["", first]
    assert out[-1][1]["finish_reason"] == "cancelled"


async def test_an_already_stopped_context_yields_only_the_cancelled_item() -> None:
    context = Context()
    context.stop()
    items = await run(MockEngine(), completion(), context)
    assert [item["finish_reason"] for item in items] == ["cancelled"]


# ---------------------------------------------------------------------------- kill


async def _kill_after(context: Context, delay: float) -> None:
    await trio.sleep(delay)
    context.kill()


@pytest.mark.parametrize(
    ("settings", "kill_at", "expected_items"),
    [
        pytest.param(MockerSettings(ttft_ms=1000), 0.5, 0, id="waiting-for-first-token"),
        pytest.param(
            MockerSettings(ttft_ms=0, inter_token_latency_ms=1000), 2.5, 3, id="between-tokens"
        ),
    ],
)
async def test_kill_cancels_at_once_and_closes_the_generator(
    autojump_clock: trio.testing.MockClock,
    settings: MockerSettings,
    kill_at: float,
    expected_items: int,
) -> None:
    engine = MockEngine(settings)
    context = Context()
    generator = engine.generate(completion(max_tokens=100), context)
    items = []
    start = trio.current_time()
    async with context.scope() as nursery:
        nursery.start_soon(_kill_after, context, kill_at)
        async for item in generator:
            items.append(item)
    assert trio.current_time() - start == pytest.approx(kill_at)
    assert len(items) == expected_items
    assert all(item.get("finish_reason") is None for item in items)
    assert generator.ag_frame is None  # type: ignore[attr-defined]  # finished, not suspended


async def test_kill_after_stop_yields_nothing_more(autojump_clock: trio.testing.MockClock) -> None:
    engine = MockEngine(MockerSettings(ttft_ms=1000))
    context = Context()
    items = []

    async def stop_then_kill() -> None:
        await trio.sleep(0.5)
        context.stop()
        context.kill()

    async with context.scope() as nursery:
        nursery.start_soon(stop_then_kill)
        async for item in engine.generate(completion(), context):
            items.append(item)
    assert items == []


# ---------------------------------------------------------------------------- embeddings


def embed_request(*inputs: str, dimensions: int | None = None) -> dict[str, Any]:
    return {
        "model": "e",
        "request_type": "embedding",
        "input": list(inputs),
        "dimensions": dimensions,
    }


async def embed(engine: MockEngine, request: dict[str, Any], context: Context | None = None) -> Any:
    return [item async for item in engine.embed(request, context or Context())]


async def test_embeddings_are_deterministic_unit_vectors() -> None:
    engine = MockEngine(MockerSettings(embedding_dimensions=8))
    [output] = await embed(engine, embed_request("cat", "dog", "cat"))
    cat, dog, cat_again = output["embeddings"]
    assert cat == cat_again
    assert cat != dog
    assert len(cat) == 8
    assert math.fsum(x * x for x in cat) == pytest.approx(1.0)
    assert output["usage"] == {"prompt_tokens": 3}
    [again] = await embed(MockEngine(MockerSettings(embedding_dimensions=8)), embed_request("cat"))
    assert again["embeddings"] == [cat]


async def test_fewer_dimensions_are_the_leading_components_renormalised() -> None:
    engine = MockEngine(MockerSettings(embedding_dimensions=8))
    [full] = await embed(engine, embed_request("cat"))
    [short] = await embed(engine, embed_request("cat", dimensions=3))
    vector = short["embeddings"][0]
    assert len(vector) == 3
    assert math.fsum(x * x for x in vector) == pytest.approx(1.0)
    head = full["embeddings"][0][:3]
    norm = math.sqrt(math.fsum(x * x for x in head))
    assert vector == pytest.approx([x / norm for x in head])


async def test_too_many_dimensions_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="exceeds this model's embedding size"):
        await embed(MockEngine(), embed_request("cat", dimensions=17))
    with pytest.raises(ValueError, match="invalid embedding request"):
        await embed(MockEngine(), embed_request())


async def test_embeddings_take_ttft_and_a_stop_yields_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = MockEngine(MockerSettings(ttft_ms=200))
    start = trio.current_time()
    assert len(await embed(engine, embed_request("a"))) == 1
    assert trio.current_time() - start == pytest.approx(0.2)
    context = Context()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_stop_after, context, 0.05)
        assert await embed(engine, embed_request("a"), context) == []
    assert trio.current_time() - start == pytest.approx(0.25)
