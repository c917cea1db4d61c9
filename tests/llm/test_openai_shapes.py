"""Chat completions, completions and models objects, checked against the official client."""

from __future__ import annotations

from typing import Any

import httpx2
import msgspec
import openai
import pytest
from hypothesis import given, strategies as st
from openai.types import Completion, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from dynamo_trio.llm import (
    ChatCompletionStream,
    ChatRequest,
    CompletionRequest,
    CompletionStream,
    EngineError,
    Generation,
    SamplingParams,
    chat_completion,
    completion,
    encode_error_event,
    encode_event,
    model_list,
    openai_error_body,
    parse_chat_request,
    parse_completion_request,
)

from ._support import items, openai_client, sse, stream_response

SAMPLING = SamplingParams()
CHAT = ChatRequest(model="m", messages=({"role": "user", "content": "hi"},), sampling=SAMPLING)
CHAT_USAGE = ChatRequest(
    model="m",
    messages=({"role": "user", "content": "hi"},),
    sampling=SAMPLING,
    stream=True,
    include_usage=True,
)
COMPLETION = CompletionRequest(model="m", prompt="p", sampling=SAMPLING, stream=True)


def chat_chunks(request: ChatRequest, engine_items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    stream = ChatCompletionStream(request, "r1", created=5)
    chunks = [c for engine_item in engine_items for c in stream.feed(engine_item)]
    return chunks + stream.finish()


def completion_chunks(engine_items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    stream = CompletionStream(COMPLETION, "r1", created=5)
    chunks = [c for engine_item in engine_items for c in stream.feed(engine_item)]
    return chunks + stream.finish()


FINISH = [
    pytest.param("stop", "stop", id="stop"),
    pytest.param("length", "length", id="length"),
    pytest.param("cancelled", "stop", id="cancelled-is-stop"),
    pytest.param(None, "stop", id="no-finish-reason"),
]


@pytest.mark.parametrize(("engine_finish", "finish"), FINISH)
def test_chat_chunks_validate_and_end_with_the_finish_reason(
    engine_finish: Any, finish: str
) -> None:
    chunks = chat_chunks(CHAT, items(["Hel", "", "lo"], engine_finish))
    parsed = [ChatCompletionChunk.model_validate(c) for c in chunks]
    assert all(p.id == "chatcmpl-r1" and p.created == 5 and p.model == "m" for p in parsed)
    assert parsed[0].choices[0].delta.role == "assistant"
    assert [p.choices[0].delta.content for p in parsed] == ["", "Hel", "lo", None]
    assert [p.choices[0].finish_reason for p in parsed] == [None, None, None, finish]
    assert all(p.usage is None for p in parsed)
    assert "usage" not in chunks[0]


def test_last_text_and_finish_reason_share_a_chunk() -> None:
    chunks = chat_chunks(CHAT, [{"text": "a"}, {"text": "b", "finish_reason": "length"}])
    assert [c["choices"][0]["delta"] for c in chunks] == [
        {"role": "assistant", "content": ""},
        {"content": "a"},
        {"content": "b"},
    ]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(("engine_finish", "finish"), FINISH)
def test_include_usage_adds_a_usage_chunk(engine_finish: Any, finish: str) -> None:
    chunks = chat_chunks(CHAT_USAGE, items(["a", "b", "c"], engine_finish, prompt_tokens=4))
    parsed = [ChatCompletionChunk.model_validate(c) for c in chunks]
    assert all("usage" in c for c in chunks)
    assert all(p.usage is None for p in parsed[:-1])
    last = parsed[-1]
    assert last.choices == []
    assert last.usage is not None
    prompt = 0 if engine_finish is None else 4
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (prompt, 3)
    assert last.usage.total_tokens == prompt + 3
    assert parsed[-2].choices[0].finish_reason == finish


def test_chunks_after_the_finish_are_ignored_and_finish_is_idempotent() -> None:
    stream = ChatCompletionStream(CHAT_USAGE, "r1")
    stream.feed(
        {
            "text": "a",
            "finish_reason": "stop",
            "usage": {"prompt_tokens": 1, "completion_tokens": 1},
        }
    )
    assert stream.feed({"text": "late"}) == []
    assert len(stream.finish()) == 1
    assert stream.finish() == []
    assert stream.generation.text == "a"


def test_fail_ends_the_stream_with_an_openai_error_body() -> None:
    stream = ChatCompletionStream(CHAT_USAGE, "r1")
    stream.feed({"text": "a"})
    assert stream.fail("lost the worker", status=503) == [openai_error_body(503, "lost the worker")]
    assert stream.fail("again") == []
    assert stream.finish() == []  # no finish chunk, no usage chunk after an error


def test_an_empty_stream_still_opens_and_closes() -> None:
    chunks = chat_chunks(CHAT, [])
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, "stop"]


@pytest.mark.parametrize(
    ("engine_item", "message"),
    [
        pytest.param({"finish_reason": "error", "error": "GPU on fire"}, "GPU on fire", id="error"),
        pytest.param({"finish_reason": "error"}, "without saying why", id="error-no-message"),
        pytest.param({"text": 5}, "malformed engine output", id="text-int"),
        pytest.param({"finish_reason": "done"}, "malformed engine output", id="unknown-reason"),
        pytest.param([], "malformed engine output", id="not-an-object"),
        pytest.param(
            {"usage": {"prompt_tokens": "1", "completion_tokens": 1}},
            "malformed engine output",
            id="usage",
        ),
    ],
)
def test_engine_errors_and_malformed_items_raise(engine_item: object, message: str) -> None:
    with pytest.raises(EngineError, match=message):
        ChatCompletionStream(CHAT, "r1").feed(engine_item)
    with pytest.raises(EngineError, match=message):
        Generation.collect([engine_item])


@pytest.mark.parametrize(("engine_finish", "finish"), FINISH)
def test_unary_chat_completion(engine_finish: Any, finish: str) -> None:
    generation = Generation.collect(items(["Hel", "lo"], engine_finish))
    parsed = ChatCompletion.model_validate(chat_completion(CHAT, "r1", generation, created=5))
    assert parsed.id == "chatcmpl-r1"
    assert parsed.choices[0].message.content == "Hello"
    assert parsed.choices[0].message.role == "assistant"
    assert parsed.choices[0].finish_reason == finish
    assert parsed.usage is not None
    assert parsed.usage.completion_tokens == 2


@pytest.mark.parametrize(("engine_finish", "finish"), FINISH)
def test_completion_chunks_and_unary(engine_finish: Any, finish: str) -> None:
    chunks = completion_chunks(items(["Hel", "lo"], engine_finish))
    assert [c["choices"][0]["text"] for c in chunks] == ["Hel", "lo", ""]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, finish]
    assert all(c["object"] == "text_completion" and c["id"] == "cmpl-r1" for c in chunks)
    # Completion's finish_reason is not nullable in the client's types, so only
    # the last chunk validates strictly (real OpenAI streams are the same).
    Completion.model_validate(chunks[-1])
    generation = Generation.collect(items(["Hel", "lo"], engine_finish))
    parsed = Completion.model_validate(completion(COMPLETION, "r1", generation))
    assert parsed.choices[0].text == "Hello"
    assert parsed.choices[0].finish_reason == finish


def test_models_list() -> None:
    body = model_list(["b", "a", "b"], created=3)
    assert body == {
        "object": "list",
        "data": [
            {"id": "b", "object": "model", "created": 3, "owned_by": "dynamo-trio"},
            {"id": "a", "object": "model", "created": 3, "owned_by": "dynamo-trio"},
        ],
    }
    data = body["data"]
    assert isinstance(data, list)
    for model in data:
        Model.model_validate(model)


texts = st.lists(st.text(max_size=8), max_size=12)
finishes = st.sampled_from(["stop", "length", "cancelled", None])


@given(texts, finishes)
def test_streamed_text_and_unary_text_agree(deltas: list[str], finish: Any) -> None:
    engine_items = items(deltas, finish)
    expected = "".join(deltas)
    chunks = chat_chunks(CHAT_USAGE, engine_items)
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert streamed == expected
    assert all(c["choices"][0]["delta"].get("content") != "" for c in chunks[1:] if c["choices"])
    unary = chat_completion(CHAT, "r1", Generation.collect(engine_items))
    assert unary["choices"][0]["message"]["content"] == expected  # type: ignore[index]
    streamed = "".join(c["choices"][0]["text"] for c in completion_chunks(engine_items))
    assert streamed == expected


# ---------------------------------------------------------------------------- the real client


def _serve_chat(engine_items: list[dict[str, Any]], *, fail: str | None = None) -> Any:
    def handler(http_request: httpx2.Request) -> httpx2.Response:
        request = parse_chat_request(msgspec.json.decode(http_request.content))
        if not request.stream:
            generation = Generation.collect(engine_items)
            return httpx2.Response(200, json=chat_completion(request, "r9", generation))
        stream = ChatCompletionStream(request, "r9")
        body = b""
        try:
            for engine_item in engine_items:
                body += sse(stream.feed(engine_item))
        except EngineError as exc:
            [error] = stream.fail(exc.message)
            return stream_response(body + encode_error_event(error))
        if fail is not None:
            [error] = stream.fail(fail, status=503)
            return stream_response(body + encode_error_event(error))
        return stream_response(body + sse(stream.finish(), done=True))

    return handler


def test_official_client_streams_chat_with_usage() -> None:
    client = openai_client(_serve_chat(items(["Hello", " world"], "cancelled", prompt_tokens=3)))
    chunks = list(
        client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello world"
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.total_tokens == 5


def test_official_client_unary_chat() -> None:
    client = openai_client(_serve_chat(items(["Hello"], "length")))
    result = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=1
    )
    assert result.choices[0].message.content == "Hello"
    assert result.choices[0].finish_reason == "length"


@pytest.mark.parametrize(
    ("engine_items", "fail", "message"),
    [
        pytest.param(items(["a"], None), "no instances left", "no instances left", id="midway"),
        pytest.param(
            [{"text": "a"}, {"finish_reason": "error", "error": "oom"}], None, "oom", id="engine"
        ),
    ],
)
def test_official_client_raises_on_the_error_event(
    engine_items: list[dict[str, Any]], fail: str | None, message: str
) -> None:
    client = openai_client(_serve_chat(engine_items, fail=fail))
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    seen: list[ChatCompletionChunk] = []
    with pytest.raises(openai.APIError, match=message) as caught:
        seen.extend(stream)
    assert "".join(c.choices[0].delta.content or "" for c in seen) == "a"
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["message"] == message


def test_official_client_streams_completions() -> None:
    def handler(http_request: httpx2.Request) -> httpx2.Response:
        request = parse_completion_request(msgspec.json.decode(http_request.content))
        stream = CompletionStream(request, "r9")
        events = [c for i in items(["one", " two"], "length") for c in stream.feed(i)]
        return stream_response(sse(events + stream.finish(), done=True))

    client = openai_client(handler, strict=False)
    chunks = list(client.completions.create(model="m", prompt="p", stream=True, max_tokens=2))
    assert "".join(c.choices[0].text for c in chunks) == "one two"
    assert chunks[-1].choices[0].finish_reason == "length"


def test_official_client_reads_the_models_list() -> None:
    def handler(_: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, content=encode_event(model_list(["m1", "m2"]))[6:-2])

    models = openai_client(handler).models.list()
    assert [m.id for m in models] == ["m1", "m2"]
