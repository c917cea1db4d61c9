"""The transformers worker on a tiny Llama made here (random weights, no download).

In process: the engine's items, sampling options and limits, and what a kill
or a stop does to the generation thread.  Over real processes: a frontend and
``python -m dynamo_trio transformers``, the official ``openai`` client hanging
up mid-stream, counted once on each side, the engine idle after.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import pytest
import trio

pytest.importorskip("torch", reason="needs torch: `nox -s engines` installs the engines")
pytest.importorskip("transformers", reason="needs transformers: `nox -s engines`")


from dynamo_trio import Context
from dynamo_trio.engines._transformers import TransformersEngine
from dynamo_trio.llm import ContextLengthExceeded
from tests._memhttp import http_client
from tests.discovery._etcd_server import free_port
from tests.e2e.conftest import env as env, scrape, spawn as spawn
from tests.frontend.conftest import _frontend_url, wait_for_models

from ._clients import MESSAGES, chat_then_hang_ups
from ._tiny_model import VOCABULARY_WORDS
from .test_asyncio_bridge import consume

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

pytestmark = pytest.mark.engines


@pytest.fixture(scope="module")
def engine(tiny_model: Path) -> TransformersEngine:
    return TransformersEngine.load(tiny_model, dtype="float32")


def chat(**fields: Any) -> Any:
    return {"model": "tiny", "request_type": "chat", "messages": MESSAGES, **fields}


def generated(engine: TransformersEngine) -> float:
    return engine.metrics.generated_tokens._value.get()  # type: ignore[no-any-return]


async def run(engine: TransformersEngine, request: dict[str, Any], **how: int) -> list[Any]:
    context = Context()
    return await consume(engine.generate(request, context), context, **how)


async def test_items_have_the_engine_protocol_shape(engine: TransformersEngine) -> None:
    items = await run(engine, chat(max_tokens=8, ignore_eos=True, seed=1))
    assert len(items) == 8
    assert all(len(item["token_ids"]) == 1 for item in items)
    assert all("finish_reason" not in item for item in items[:-1])
    assert items[-1]["finish_reason"] == "length"
    prompt = len(engine.prompt_ids(chat()))
    assert items[-1]["usage"] == {"prompt_tokens": prompt, "completion_tokens": 8}
    text = "".join(item["text"] for item in items)
    ids = [item["token_ids"][0] for item in items]
    assert text.split() == engine._tokenizer.decode(ids).split()


async def test_a_seed_repeats_and_temperature_zero_is_greedy(engine: TransformersEngine) -> None:
    first = await run(engine, chat(max_tokens=6, ignore_eos=True, seed=7))
    again = await run(engine, chat(max_tokens=6, ignore_eos=True, seed=7))
    assert first == again
    greedy = [await run(engine, chat(max_tokens=6, ignore_eos=True, temperature=0)) for _ in "ab"]
    assert greedy[0] == greedy[1]


async def test_a_stop_sequence_ends_the_generation_before_it(engine: TransformersEngine) -> None:
    items = await run(engine, chat(max_tokens=6, ignore_eos=True, temperature=0))
    words = "".join(item["text"] for item in items).split()
    stop = words[3]
    assert stop not in words[:3]
    stopped = await run(engine, chat(max_tokens=6, ignore_eos=True, temperature=0, stop=[stop]))
    assert stopped[-1]["finish_reason"] == "stop"
    assert stopped[-1]["stop_sequence"] == stop
    assert "".join(item["text"] for item in stopped).split() == words[:3]


def text_of(items: list[Any]) -> str:
    return "".join(item.get("text", "") for item in items)


def ids_of(items: list[Any]) -> list[int]:
    return [token for item in items for token in item.get("token_ids", ())]


async def test_a_continuation_resumes_the_generation(engine: TransformersEngine) -> None:
    """Request migration: the earlier attempt's tokens continue the prompt; the two
    attempts' items read as the one uninterrupted generation, usage included."""
    request = chat(max_tokens=10, ignore_eos=True, temperature=0)
    whole = await run(engine, request)
    for cut in (1, 4, 9, 10):
        done = whole[:cut]
        continuation = {"text": text_of(done), "token_ids": ids_of(done)}
        rest = await run(engine, {**request, "continuation": continuation})
        assert text_of(done) + text_of(rest) == text_of(whole)
        assert ids_of(done) + ids_of(rest) == ids_of(whole)
        assert rest[-1]["finish_reason"] == "length"
        assert rest[-1]["usage"] == whole[-1]["usage"]


async def test_a_continuation_releases_the_text_held_for_a_stop(
    engine: TransformersEngine,
) -> None:
    """Text the earlier attempt held back (it could have begun a stop sequence) was never
    sent: the continuation sends it first."""
    plain = chat(max_tokens=10, ignore_eos=True, temperature=0)
    words = text_of(await run(engine, plain)).split()
    k = next(i for i in range(1, 9) if words[i] not in words[:i])  # its first appearance
    request = {**plain, "stop": [f" {words[k]} never"]}
    whole = await run(engine, request)
    assert whole[k]["text"] == ""  # held: it may begin the stop sequence
    done = whole[: k + 1]
    continuation = {"text": text_of(done), "token_ids": ids_of(done)}
    rest = await run(engine, {**request, "continuation": continuation})
    assert rest[0]["text"].startswith(f" {words[k]}")
    assert text_of(done) + text_of(rest) == text_of(whole)
    assert rest[-1]["usage"] == whole[-1]["usage"]


async def test_a_request_over_the_context_is_refused(engine: TransformersEngine) -> None:
    with pytest.raises(ContextLengthExceeded):
        await run(engine, chat(max_tokens=engine.context_length))


async def test_a_kill_ends_the_generation_at_the_next_token(engine: TransformersEngine) -> None:
    before_threads = set(threading.enumerate())
    before = generated(engine)
    items = await run(engine, chat(max_tokens=1000, ignore_eos=True), kill_after=5)
    assert len(items) == 5
    assert generated(engine) - before in (5, 6)  # the token under way at most
    assert engine.metrics.requests_running._value.get() == 0
    assert set(threading.enumerate()) <= before_threads


async def test_closing_the_handler_joins_the_generation_thread(
    engine: TransformersEngine,
) -> None:
    before_threads = set(threading.enumerate())
    before = generated(engine)
    handler: Any = engine.generate(chat(max_tokens=1000, ignore_eos=True), Context())
    for _ in range(3):
        await handler.__anext__()
    await handler.aclose()  # what the runtime does when the stream is abandoned
    assert set(threading.enumerate()) <= before_threads
    assert engine.metrics.requests_running._value.get() == 0
    assert generated(engine) - before in (3, 4)
    items = await run(engine, chat(max_tokens=2, ignore_eos=True))  # the slot is free again
    assert items[-1]["finish_reason"] == "length"


async def test_a_stop_ends_with_a_cancelled_item_and_usage(engine: TransformersEngine) -> None:
    before = generated(engine)
    items = await run(engine, chat(max_tokens=1000, ignore_eos=True), stop_after=3)
    last = items[-1]
    assert last["finish_reason"] == "cancelled"
    assert last["usage"]["completion_tokens"] == len(items) - 1 == generated(engine) - before
    assert len(items) - 1 in (3, 4)


async def embed(engine: TransformersEngine, **fields: Any) -> list[Any]:
    context = Context()
    request = {"model": "tiny", "request_type": "embedding", **fields}
    return await consume(engine.embed(request, context), context)


async def test_embeddings_are_mean_pooled_last_hidden_states(engine: TransformersEngine) -> None:
    import torch

    texts = ["hello", "tell me a long story"]
    [item] = await embed(engine, input=texts)
    full = engine._model.config.hidden_size
    ids = [engine._tokenizer(text)["input_ids"] for text in texts]
    assert item["usage"] == {"prompt_tokens": sum(map(len, ids))}
    for vector, one in zip(item["embeddings"], ids, strict=True):
        with torch.inference_mode():
            states = engine._model(torch.tensor([one]), output_hidden_states=True).hidden_states
        mean = states[-1][0].mean(dim=0)
        assert len(vector) == full
        assert torch.allclose(torch.tensor(vector), mean / mean.norm(), atol=1e-5)
    [short] = await embed(engine, input=texts, dimensions=8)
    for vector, whole in zip(short["embeddings"], item["embeddings"], strict=True):
        leading = torch.tensor(whole[:8])
        assert torch.allclose(torch.tensor(vector), leading / leading.norm(), atol=1e-5)


async def test_an_embeddings_request_the_model_cannot_serve_is_refused(
    engine: TransformersEngine,
) -> None:
    with pytest.raises(ValueError, match="exceeds this model's embedding size"):
        await embed(engine, input=["hello"], dimensions=10_000)
    with pytest.raises(ContextLengthExceeded):
        await embed(engine, input=["hello " * (engine.context_length + 1)])
    with pytest.raises(ValueError, match="empty"):
        await embed(engine, input=[""])


# ---------------------------------------------------------------------------- processes


async def test_a_hang_up_stops_the_model_and_counts_once_each_side(
    spawn: Callable[..., Any], env: dict[str, str], tiny_model: Path
) -> None:
    status = f"http://127.0.0.1:{free_port()}"
    worker = await spawn(
        "-m",
        "dynamo_trio",
        "transformers",
        "--model",
        str(tiny_model),
        "--served-model-name",
        "tiny",
        "--dtype",
        "float32",
        env={**env, "DYN_SYSTEM_PORT": status.rsplit(":", 1)[1]},
        name="transformers worker",
    )
    frontend = await spawn("-m", "dynamo_trio.frontend", "--http-port", "0", env=env)
    url = await _frontend_url(frontend)
    try:
        await wait_for_models(url, {"tiny"}, within=60)
    except BaseException:
        print(worker.stderr.decode(errors="replace")[-3000:])
        raise
    hang_ups = 50

    whole, texts = await trio.to_thread.run_sync(chat_then_hang_ups, url, hang_ups)
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 5
    # A vocabulary word per token, except that a special token (the weights are random, so
    # any token may be sampled) decodes to none.
    words = whole.choices[0].message.content.split()
    assert 1 <= len(words) <= 5 and set(words) <= VOCABULARY_WORDS, words
    assert len(texts) == hang_ups and all(texts)
    async with http_client(url) as http:  # the same model, as embeddings
        body = {"model": "tiny", "input": ["hello", "tell me"], "dimensions": 8}
        vectors = (await http.post("/v1/embeddings", json=body)).json()["data"]
    assert [len(vector["embedding"]) for vector in vectors] == [8, 8]

    async def idle() -> tuple[float, float, float]:
        return (
            await scrape(status, "dynamo_engine_requests_running"),
            await scrape(status, "dynamo_component_cancellation_total"),
            await scrape(url, "dynamo_frontend_model_cancellation_total"),
        )

    with trio.fail_after(10):
        while await idle() != (0, hang_ups, hang_ups):  # noqa: ASYNC110 - other processes
            await trio.sleep(0.05)
    tokens = await scrape(status, "dynamo_engine_generated_tokens_total")
    assert tokens < 5 + hang_ups * 1500  # no generation ran to its end
    for _ in range(3):
        await trio.sleep(0.1)
        assert await idle() == (0, hang_ups, hang_ups)
        assert await scrape(status, "dynamo_engine_generated_tokens_total") == tokens

    worker.signal(15)
    assert await worker.wait_exit(within=15) == 0
