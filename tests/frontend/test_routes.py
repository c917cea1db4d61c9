"""Every generating route, unary and streaming, read on the wire with httpx (SPEC §6).

The mock engine is deterministic (the text depends only on the prompt), so a
streamed answer must equal the unary answer to the same request, and the
three chat-shaped APIs (chat completions, Responses, Anthropic Messages) must
agree with each other on text and token counts.
"""

from __future__ import annotations

import base64
import math
import struct
import time
from typing import TYPE_CHECKING, Any

import pytest

from tests._memhttp import http_client

from .conftest import CHAT_BODY, parse_sse

if TYPE_CHECKING:
    import httpx
    import trio.testing

    from .conftest import StartStack

MAX_TOKENS = 4


def assert_openai_usage(usage: dict[str, Any], completion_tokens: int) -> None:
    assert set(usage) == {"prompt_tokens", "completion_tokens", "total_tokens"}, usage
    assert usage["completion_tokens"] == completion_tokens, usage
    assert usage["prompt_tokens"] > 0, usage
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"], usage


def assert_sse_response(response: httpx.Response, request_id: str) -> None:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream"), response.headers
    assert response.headers["cache-control"] == "no-cache", response.headers
    assert response.headers["x-request-id"] == request_id, response.headers


async def test_chat_completions_unary_and_stream_agree(
    stack: StartStack, autojump_clock: trio.testing.MockClock
) -> None:
    running = await stack(memory=True)
    async with http_client(running.url) as http:
        unary = await http.post(
            "/v1/chat/completions",
            json={**CHAT_BODY, "max_tokens": MAX_TOKENS},
            headers={"x-request-id": "chat-unary"},
        )
        plain = await http.post(
            "/v1/chat/completions",
            json={**CHAT_BODY, "max_tokens": MAX_TOKENS, "stream": True},
            headers={"x-request-id": "chat-stream"},
        )
        with_usage = await http.post(
            "/v1/chat/completions",
            json={
                **CHAT_BODY,
                "max_tokens": MAX_TOKENS,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
            headers={"x-request-id": "chat-usage"},
        )

    assert unary.status_code == 200, unary.text
    assert unary.headers["content-type"] == "application/json"
    assert unary.headers["x-request-id"] == "chat-unary"
    body = unary.json()
    assert body["id"] == "chatcmpl-chat-unary"
    assert body["object"] == "chat.completion"
    assert body["model"] == "mock"
    assert abs(body["created"] - time.time()) < 60
    [choice] = body["choices"]
    assert choice["index"] == 0
    assert choice["message"]["role"] == "assistant"
    text = choice["message"]["content"]
    assert len(text.split()) == MAX_TOKENS, text
    assert choice["finish_reason"] == "length"
    assert_openai_usage(body["usage"], MAX_TOKENS)

    for response, request_id in ((plain, "chat-stream"), (with_usage, "chat-usage")):
        assert_sse_response(response, request_id)
        events = parse_sse(response.text)
        assert all(event.event is None for event in events), events
        assert events[-1].data == "[DONE]"
        assert [event.data for event in events].count("[DONE]") == 1
        chunks = [event.json() for event in events[:-1]]
        assert {chunk["id"] for chunk in chunks} == {f"chatcmpl-{request_id}"}
        assert {chunk["object"] for chunk in chunks} == {"chat.completion.chunk"}
        assert {chunk["model"] for chunk in chunks} == {"mock"}
        choices = [chunk["choices"][0] for chunk in chunks if chunk["choices"]]
        assert choices[0]["delta"] == {"role": "assistant", "content": ""}
        assert "".join(c["delta"].get("content", "") for c in choices) == text
        assert [c["finish_reason"] for c in choices] == [None] * (len(choices) - 1) + ["length"]

    # Without stream_options.include_usage: no usage anywhere in the stream.
    assert all("usage" not in event.json() for event in parse_sse(plain.text)[:-1])
    # With it: "usage": null on every chunk, then one usage chunk with no choices.
    *chunks, usage_chunk = [event.json() for event in parse_sse(with_usage.text)[:-1]]
    assert all(chunk["usage"] is None for chunk in chunks), chunks
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == body["usage"]


async def test_completions_unary_and_stream_agree(
    stack: StartStack, autojump_clock: trio.testing.MockClock
) -> None:
    running = await stack(memory=True)
    request = {"model": "mock", "prompt": "once upon a time", "max_tokens": MAX_TOKENS}
    async with http_client(running.url) as http:
        unary = await http.post("/v1/completions", json=request)
        plain = await http.post("/v1/completions", json={**request, "stream": True})
        with_usage = await http.post(
            "/v1/completions",
            json={**request, "stream": True, "stream_options": {"include_usage": True}},
        )

    assert unary.status_code == 200, unary.text
    body = unary.json()
    assert body["id"] == f"cmpl-{unary.headers['x-request-id']}"
    assert body["object"] == "text_completion"
    assert body["model"] == "mock"
    [choice] = body["choices"]
    assert (choice["index"], choice["logprobs"], choice["finish_reason"]) == (0, None, "length")
    text = choice["text"]
    assert len(text.split()) == MAX_TOKENS, text
    assert_openai_usage(body["usage"], MAX_TOKENS)
    assert body["usage"]["prompt_tokens"] == 4  # one per word of the prompt

    for response in (plain, with_usage):
        assert_sse_response(response, response.headers["x-request-id"])
        events = parse_sse(response.text)
        assert events[-1].data == "[DONE]"
        chunks = [event.json() for event in events[:-1]]
        assert {chunk["object"] for chunk in chunks} == {"text_completion"}
        assert {chunk["id"] for chunk in chunks} == {f"cmpl-{response.headers['x-request-id']}"}
        choices = [chunk["choices"][0] for chunk in chunks if chunk["choices"]]
        assert "".join(c["text"] for c in choices) == text
        assert [c["finish_reason"] for c in choices] == [None] * (len(choices) - 1) + ["length"]

    assert all("usage" not in event.json() for event in parse_sse(plain.text)[:-1])
    *chunks, usage_chunk = [event.json() for event in parse_sse(with_usage.text)[:-1]]
    assert all(chunk["usage"] is None for chunk in chunks)
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == body["usage"]


async def test_responses_unary_and_stream_agree(
    stack: StartStack, autojump_clock: trio.testing.MockClock
) -> None:
    running = await stack(memory=True)
    request = {"model": "mock", "input": "hi", "max_output_tokens": MAX_TOKENS}
    async with http_client(running.url) as http:
        unary = await http.post("/v1/responses", json=request, headers={"x-request-id": "r1"})
        streamed = await http.post(
            "/v1/responses", json={**request, "stream": True}, headers={"x-request-id": "r2"}
        )

    assert unary.status_code == 200, unary.text
    body = unary.json()
    assert body["id"] == "resp_r1"
    assert body["object"] == "response"
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["max_output_tokens"] == MAX_TOKENS
    [item] = body["output"]
    assert (item["id"], item["type"], item["role"]) == ("msg_r1", "message", "assistant")
    [part] = item["content"]
    assert part["type"] == "output_text"
    text = part["text"]
    assert len(text.split()) == MAX_TOKENS
    usage = body["usage"]
    assert usage["output_tokens"] == MAX_TOKENS
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]

    assert_sse_response(streamed, "r2")
    assert "[DONE]" not in streamed.text
    events = parse_sse(streamed.text)
    payloads = [event.json() for event in events]
    # Every event is named after its type, numbered from 0 without gaps.
    assert [event.event for event in events] == [p["type"] for p in payloads]
    assert [p["sequence_number"] for p in payloads] == list(range(len(payloads)))
    types = [p["type"] for p in payloads]
    deltas = types.count("response.output_text.delta")
    assert types == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    streamed_text = "".join(p["delta"] for p in payloads if p["type"].endswith(".delta"))
    assert streamed_text == text
    final = payloads[-1]["response"]
    assert final["id"] == "resp_r2"
    assert final["status"] == "incomplete"
    assert final["output"][0]["content"][0]["text"] == text
    assert final["usage"] == usage


async def test_anthropic_messages_unary_and_stream_agree(
    stack: StartStack, autojump_clock: trio.testing.MockClock
) -> None:
    running = await stack(memory=True)
    request = {**CHAT_BODY, "max_tokens": MAX_TOKENS}
    async with http_client(running.url) as http:
        unary = await http.post("/v1/messages", json=request, headers={"x-request-id": "m1"})
        streamed = await http.post(
            "/v1/messages", json={**request, "stream": True}, headers={"x-request-id": "m2"}
        )
        chat = await http.post("/v1/chat/completions", json=request)

    assert unary.status_code == 200, unary.text
    body = unary.json()
    assert body["id"] == "msg_m1"
    assert (body["type"], body["role"], body["model"]) == ("message", "assistant", "mock")
    [block] = body["content"]
    assert block["type"] == "text"
    text = block["text"]
    assert (body["stop_reason"], body["stop_sequence"]) == ("max_tokens", None)
    assert body["usage"]["output_tokens"] == MAX_TOKENS
    # The same conversation through the OpenAI route: same text, same token counts.
    chat_body = chat.json()
    assert chat_body["choices"][0]["message"]["content"] == text
    assert body["usage"] == {
        "input_tokens": chat_body["usage"]["prompt_tokens"],
        "output_tokens": chat_body["usage"]["completion_tokens"],
    }

    assert_sse_response(streamed, "m2")
    assert "[DONE]" not in streamed.text
    events = parse_sse(streamed.text)
    payloads = [event.json() for event in events]
    assert [event.event for event in events] == [p["type"] for p in payloads]
    types = [p["type"] for p in payloads]
    deltas = types.count("content_block_delta")
    assert types == [
        "message_start",
        "content_block_start",
        "ping",
        *["content_block_delta"] * deltas,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert payloads[0]["message"]["id"] == "msg_m2"
    assert "".join(p["delta"]["text"] for p in payloads if p["type"] == "content_block_delta") == (
        text
    )
    message_delta = payloads[-2]
    assert message_delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert message_delta["usage"]["output_tokens"] == MAX_TOKENS


async def test_stop_sequences_end_generation_with_stop_reasons(
    stack: StartStack, autojump_clock: trio.testing.MockClock
) -> None:
    running = await stack(memory=True)
    async with http_client(running.url) as http:
        full = (await http.post("/v1/chat/completions", json={**CHAT_BODY, "max_tokens": 6})).json()
        words = full["choices"][0]["message"]["content"].split(" ")
        stop = " " + words[2]
        chat = await http.post(
            "/v1/chat/completions", json={**CHAT_BODY, "max_tokens": 6, "stop": [stop]}
        )
        messages = await http.post(
            "/v1/messages", json={**CHAT_BODY, "max_tokens": 6, "stop_sequences": [stop]}
        )
    [choice] = chat.json()["choices"]
    assert choice["message"]["content"] == " ".join(words[:2])
    assert choice["finish_reason"] == "stop"
    body = messages.json()
    assert body["content"][0]["text"] == " ".join(words[:2])
    assert (body["stop_reason"], body["stop_sequence"]) == ("stop_sequence", stop)


async def test_embeddings_float_and_base64(
    stack: StartStack, autojump_clock: trio.testing.MockClock
) -> None:
    running = await stack(memory=True)
    request = {"model": "mock-embed", "input": ["first text", "second"]}
    async with http_client(running.url) as http:
        floats = await http.post("/v1/embeddings", json=request)
        packed = await http.post("/v1/embeddings", json={**request, "encoding_format": "base64"})
        short = await http.post("/v1/embeddings", json={**request, "dimensions": 4})

    assert floats.status_code == 200, floats.text
    body = floats.json()
    assert (body["object"], body["model"]) == ("list", "mock-embed")
    assert [(d["object"], d["index"]) for d in body["data"]] == [
        ("embedding", 0),
        ("embedding", 1),
    ]
    vectors = [d["embedding"] for d in body["data"]]
    assert [len(v) for v in vectors] == [16, 16]
    assert all(math.isclose(math.fsum(x * x for x in v), 1.0) for v in vectors)
    assert vectors[0] != vectors[1]
    assert body["usage"] == {"prompt_tokens": 3, "total_tokens": 3}

    assert packed.status_code == 200, packed.text
    packed_body = packed.json()
    assert packed_body["usage"] == body["usage"]
    for datum, vector in zip(packed_body["data"], vectors, strict=True):
        decoded = struct.unpack("<16f", base64.b64decode(datum["embedding"]))
        assert decoded == pytest.approx(vector, rel=1e-6)

    assert short.status_code == 200, short.text
    assert [len(d["embedding"]) for d in short.json()["data"]] == [4, 4]
