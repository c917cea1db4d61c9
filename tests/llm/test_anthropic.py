"""The Anthropic Messages API: parsing, the message object, the event stream, the client.

Shape checks use the official ``anthropic`` package when it is installed
(it is not a declared test dependency); the parsing tests need nothing.
"""

from __future__ import annotations

from typing import Any

import httpx2
import msgspec
import pydantic
import pytest

from dynamo_trio.llm import (
    EngineError,
    Generation,
    MessagesRequest,
    MessagesStream,
    RequestError,
    message_object,
    parse_messages_request,
)

from ._support import items, sse, stream_response

USER = {"role": "user", "content": "hi"}


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "claude", "max_tokens": 16, "messages": [USER], **fields}


def without(request_body: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in request_body.items() if k != key}


def turn(**fields: Any) -> dict[str, Any]:
    return body(messages=[USER, fields])


BAD = [
    pytest.param("x", None, "expected an object", id="body"),
    pytest.param(without(body(), "model"), "model", "Missing required", id="no-model"),
    pytest.param(without(body(), "max_tokens"), "max_tokens", "Missing required", id="no-max"),
    pytest.param(body(max_tokens=0), "max_tokens", ">= 1", id="max-0"),
    pytest.param(body(max_tokens="16"), "max_tokens", "an integer", id="max-str"),
    pytest.param(without(body(), "messages"), "messages", "Missing required", id="no-messages"),
    pytest.param(body(messages=[]), "messages", "at least one message", id="messages-empty"),
    pytest.param(body(messages="hi"), "messages", "expected an array", id="messages-str"),
    pytest.param(turn(role="system", content="x"), "messages[1].role", "'system'", id="role"),
    pytest.param(turn(content="x"), "messages[1].role", "Missing required", id="no-role"),
    pytest.param(turn(role="assistant"), "messages[1].content", "Missing required", id="no-c"),
    pytest.param(turn(role="user", content=7), "messages[1].content", "a string or", id="c-int"),
    pytest.param(
        turn(role="user", content=[{"type": "image", "source": {}}]),
        "messages[1].content[0].type",
        "'image' are not supported",
        id="image",
    ),
    pytest.param(
        turn(role="user", content=[{"type": "tool_result", "tool_use_id": "t"}]),
        "messages[1].content[0].type",
        "'tool_result' are not supported",
        id="tool-result",
    ),
    pytest.param(
        turn(role="user", content=[{"type": "text", "text": None}]),
        "messages[1].content[0].text",
        "Missing required",
        id="text-null",
    ),
    pytest.param(body(system=5), "system", "a string or an array", id="system-int"),
    pytest.param(body(system=[{"type": "text"}]), "system[0].text", "Missing", id="system-text"),
    pytest.param(
        body(stop_sequences="END"), "stop_sequences", "an array of strings", id="stop-str"
    ),
    pytest.param(body(stop_sequences=[""]), "stop_sequences[0]", "non-empty", id="stop-empty"),
    pytest.param(body(stop_sequences=[1]), "stop_sequences[0]", "a string", id="stop-int"),
    pytest.param(body(temperature=1.5), "temperature", "<= 1", id="temperature"),
    pytest.param(body(top_p=2), "top_p", "<= 1", id="top-p"),
    pytest.param(body(top_k=-1), "top_k", ">= 0", id="top-k"),
    pytest.param(body(top_k=0.5), "top_k", "an integer", id="top-k-float"),
    pytest.param(body(stream="yes"), "stream", "a boolean", id="stream"),
    pytest.param(body(metadata="x"), "metadata", "an object", id="metadata"),
    pytest.param(body(metadata={"user_id": 5}), "metadata.user_id", "a string", id="user-id"),
]


@pytest.mark.parametrize(("request_body", "param", "fragment"), BAD)
def test_bad_messages_request_is_a_400_naming_the_parameter(
    request_body: object, param: str | None, fragment: str
) -> None:
    with pytest.raises(RequestError) as caught:
        parse_messages_request(request_body)
    assert caught.value.status == 400
    assert caught.value.param == param
    assert fragment in caught.value.message
    if param is not None:
        assert f"'{param}'" in caught.value.message
    assert caught.value.anthropic_body()["error"] == {
        "type": "invalid_request_error",
        "message": caught.value.message,
    }


def test_request_to_engine() -> None:
    request = parse_messages_request(
        body(
            system=[{"type": "text", "text": "rules", "cache_control": {"type": "ephemeral"}}],
            messages=[
                USER,
                {"role": "assistant", "content": [{"type": "text", "text": "yo"}]},
                {"role": "user", "content": "and?"},
            ],
            stop_sequences=["END", "\n\nHuman:"],
            temperature=0.2,
            top_p=0.5,
            top_k=40,
            stream=True,
            metadata={"user_id": "u1"},
            thinking={"type": "disabled"},
        )
    )
    assert request.stream
    assert request.to_engine() == {
        "model": "claude",
        "request_type": "chat",
        "messages": [
            {"role": "system", "content": "rules"},
            USER,
            {"role": "assistant", "content": "yo"},
            {"role": "user", "content": "and?"},
        ],
        "max_tokens": 16,
        "min_tokens": None,
        "temperature": 0.2,
        "top_p": 0.5,
        "top_k": 40,
        "seed": None,
        "stop": ["END", "\n\nHuman:"],
        "ignore_eos": False,
    }


@pytest.mark.parametrize("system", [None, [], ""])
def test_no_system_message_without_system_text(system: object) -> None:
    request = parse_messages_request(body(system=system))
    assert request.to_engine()["messages"] == [USER]


REQUEST = MessagesRequest(model="claude", messages=(USER,))  # type: ignore[arg-type]

STOP_REASONS = [
    pytest.param("stop", None, "end_turn", None, id="stop"),
    pytest.param("stop", "END", "stop_sequence", "END", id="stop-sequence"),
    pytest.param("length", None, "max_tokens", None, id="length"),
    pytest.param("cancelled", None, "end_turn", None, id="cancelled"),
    pytest.param(None, None, "end_turn", None, id="no-finish-reason"),
]


@pytest.mark.parametrize(("finish", "sequence", "reason", "stop_sequence"), STOP_REASONS)
def test_unary_message(finish: Any, sequence: str | None, reason: str, stop_sequence: Any) -> None:
    generation = Generation.collect(items(["Hi", " you"], finish, stop_sequence=sequence))
    message = message_object(REQUEST, "r1", generation)
    assert message["id"] == "msg_r1"
    assert message["content"] == [{"type": "text", "text": "Hi you"}]
    assert (message["stop_reason"], message["stop_sequence"]) == (reason, stop_sequence)
    anthropic = pytest.importorskip("anthropic")
    parsed = anthropic.types.Message.model_validate(message)
    assert parsed.usage.output_tokens == 2


@pytest.mark.parametrize(("finish", "sequence", "reason", "stop_sequence"), STOP_REASONS)
def test_event_stream(finish: Any, sequence: str | None, reason: str, stop_sequence: Any) -> None:
    stream = MessagesStream(REQUEST, "r1")
    events = []
    for engine_item in items(["Hi", "", " you"], finish, stop_sequence=sequence):
        events += stream.feed(engine_item)
    events += stream.finish()
    assert stream.finish() == []
    assert [e["type"] for e in events] == [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    delta = events[-2]
    assert delta["delta"] == {"stop_reason": reason, "stop_sequence": stop_sequence}
    anthropic = pytest.importorskip("anthropic")
    adapter = pydantic.TypeAdapter(anthropic.types.RawMessageStreamEvent)
    for event in events:
        if event["type"] != "ping":
            adapter.validate_python(event)


def test_failure_is_one_error_event() -> None:
    stream = MessagesStream(REQUEST, "r1")
    stream.feed({"text": "partial"})
    with pytest.raises(EngineError):
        stream.feed({"finish_reason": "error"})
    assert stream.fail("engine fell over", status=503) == [
        {"type": "error", "error": {"type": "overloaded_error", "message": "engine fell over"}}
    ]
    assert stream.fail("again") == []
    assert stream.finish() == []


def _serve(engine_items: list[dict[str, Any]], *, fail: str | None = None) -> Any:
    def handler(http_request: httpx2.Request) -> httpx2.Response:
        request = parse_messages_request(msgspec.json.decode(http_request.content))
        if not request.stream:
            generation = Generation.collect(engine_items)
            return httpx2.Response(200, json=message_object(request, "r9", generation))
        stream = MessagesStream(request, "r9")
        events = [e for engine_item in engine_items for e in stream.feed(engine_item)]
        events += stream.fail(fail) if fail else stream.finish()
        return stream_response(sse(events, named=True))

    return handler


def _client(handler: Any) -> Any:
    anthropic = pytest.importorskip("anthropic")
    return anthropic.Anthropic(
        api_key="test",
        base_url="http://frontend.test",
        max_retries=0,
        http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
        _strict_response_validation=True,
    )


def test_official_client_unary() -> None:
    client = _client(_serve(items(["Hi", " you"], "length")))
    message = client.messages.create(model="claude", max_tokens=2, messages=[USER])
    assert message.content[0].text == "Hi you"
    assert message.stop_reason == "max_tokens"


def test_official_client_stream_helper_accumulates_the_message() -> None:
    client = _client(_serve(items(["Hi", " you"], "stop", stop_sequence="END")))
    with client.messages.stream(
        model="claude", max_tokens=8, messages=[USER], stop_sequences=["END"]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Hi you"
    assert final.content[0].text == "Hi you"
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "END")
    assert (final.usage.input_tokens, final.usage.output_tokens) == (7, 2)


def test_official_client_raises_on_the_error_event() -> None:
    anthropic = pytest.importorskip("anthropic")
    client = _client(_serve(items(["Hi"], None), fail="engine fell over"))
    with (
        pytest.raises(anthropic.APIStatusError, match="engine fell over"),
        client.messages.stream(model="claude", max_tokens=8, messages=[USER]) as stream,
    ):
        for _ in stream:
            pass
