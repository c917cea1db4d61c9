"""The Responses API: parsing, the response object, the event stream, the official client."""

from __future__ import annotations

from typing import Any

import httpx2
import msgspec
import pydantic
import pytest
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseCreatedEvent,
    ResponseIncompleteEvent,
    ResponseStreamEvent,
)

from dynamo_trio.llm import (
    EngineError,
    Generation,
    RequestError,
    ResponsesRequest,
    ResponseStream,
    parse_responses_request,
    response_object,
)

from ._support import items, openai_client, sse, stream_response

EVENT = pydantic.TypeAdapter(ResponseStreamEvent)


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "input": "hi", **fields}


def item(**fields: Any) -> dict[str, Any]:
    return body(input=[{"role": "user", "content": "hi"}, fields])


BAD = [
    pytest.param([1], None, "expected an object", id="body"),
    pytest.param({"model": "m"}, "input", "Missing required parameter", id="no-input"),
    pytest.param({"input": "x"}, "model", "Missing required parameter", id="no-model"),
    pytest.param(body(input=5), "input", "expected an array", id="input-int"),
    pytest.param(body(input=[]), "input", "at least one input item", id="input-empty"),
    pytest.param(body(input=["hi"]), "input[0]", "expected an object", id="item-str"),
    pytest.param(
        item(type="function_call_output", call_id="c", output="x"),
        "input[1].type",
        "'function_call_output' are not supported",
        id="item-type",
    ),
    pytest.param(item(type=3), "input[1].type", "a string", id="item-type-int"),
    pytest.param(item(content="x"), "input[1].role", "Missing required", id="no-role"),
    pytest.param(item(role="tool", content="x"), "input[1].role", "'tool'", id="role"),
    pytest.param(item(role="user"), "input[1].content", "Missing required", id="no-content"),
    pytest.param(item(role="user", content=1), "input[1].content", "a string or an array", id="c"),
    pytest.param(
        item(role="user", content=[{"type": "input_image", "image_url": "u"}]),
        "input[1].content[0].type",
        "'input_image' are not supported",
        id="image",
    ),
    pytest.param(
        item(role="user", content=[{"type": "input_text"}]),
        "input[1].content[0].text",
        "Missing required",
        id="part-no-text",
    ),
    pytest.param(body(instructions=5), "instructions", "a string", id="instructions"),
    pytest.param(body(max_output_tokens=0), "max_output_tokens", ">= 1", id="max-0"),
    pytest.param(body(max_output_tokens="9"), "max_output_tokens", "an integer", id="max-str"),
    pytest.param(body(temperature=2.5), "temperature", "<= 2", id="temperature"),
    pytest.param(body(top_p=-1), "top_p", ">= 0", id="top-p"),
    pytest.param(body(stream="true"), "stream", "a boolean", id="stream"),
    pytest.param(
        body(previous_response_id="resp_1"),
        "previous_response_id",
        "stores no responses",
        id="previous",
    ),
    pytest.param(body(conversation="conv_1"), "conversation", "stores no responses", id="conv"),
    pytest.param(body(background=True), "background", "not supported", id="background"),
    pytest.param(body(metadata=[]), "metadata", "an object", id="metadata"),
    pytest.param(body(metadata={"k": 1}), "metadata.k", "a string", id="metadata-value"),
    pytest.param(
        body(metadata={str(i): "v" for i in range(17)}), "metadata", "at most 16", id="meta-17"
    ),
]


@pytest.mark.parametrize(("request_body", "param", "fragment"), BAD)
def test_bad_responses_request_is_a_400_naming_the_parameter(
    request_body: object, param: str | None, fragment: str
) -> None:
    with pytest.raises(RequestError) as caught:
        parse_responses_request(request_body)
    assert caught.value.status == 400
    assert caught.value.param == param
    assert fragment in caught.value.message
    if param is not None:
        assert f"'{param}'" in caught.value.message


def test_request_to_engine() -> None:
    request = parse_responses_request(
        body(
            input=[
                {"role": "developer", "content": "terse"},
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "q"}],
                },
                {
                    "type": "message",
                    "role": "assistant",
                    "id": "msg_1",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "a", "annotations": []}],
                },
            ],
            instructions="be kind",
            max_output_tokens=20,
            temperature=0.5,
            top_p=0.9,
            stream=True,
            store=False,
            tools=[],
            metadata={"k": "v"},
        )
    )
    assert request.stream
    assert request.metadata == {"k": "v"}
    engine = request.to_engine()
    assert engine["messages"] == [
        {"role": "system", "content": "be kind"},
        {"role": "developer", "content": "terse"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
    ]
    assert (engine["max_tokens"], engine["temperature"], engine["top_p"]) == (20, 0.5, 0.9)


def test_string_input_is_one_user_message() -> None:
    request = parse_responses_request(body(previous_response_id=None, background=False))
    assert request.to_engine()["messages"] == [{"role": "user", "content": "hi"}]


REQUEST = ResponsesRequest(model="m", messages=({"role": "user", "content": "hi"},))

OUTCOMES = [
    pytest.param("stop", "completed", None, "response.completed", id="stop"),
    pytest.param(
        "length",
        "incomplete",
        {"reason": "max_output_tokens"},
        "response.incomplete",
        id="length",
    ),
    pytest.param("cancelled", "cancelled", None, "response.incomplete", id="cancelled"),
    pytest.param(None, "completed", None, "response.completed", id="no-finish-reason"),
]


@pytest.mark.parametrize(("finish", "status", "details", "terminal"), OUTCOMES)
def test_unary_response_validates(finish: Any, status: str, details: object, terminal: str) -> None:
    generation = Generation.collect(items(["Hel", "lo"], finish))
    payload = response_object(REQUEST, "r1", generation, created_at=5)
    response = Response.model_validate(payload)
    assert response.id == "resp_r1"
    assert response.status == status
    assert payload["incomplete_details"] == details
    assert response.output_text == "Hello"
    assert response.usage is not None
    # Without a last item the engine reported no usage: only token ids were counted.
    prompt_tokens = 0 if finish is None else 7
    assert (response.usage.input_tokens, response.usage.output_tokens) == (prompt_tokens, 2)
    assert response.usage.total_tokens == prompt_tokens + 2
    message = response.output[0]
    assert message.type == "message"
    assert message.status == ("completed" if status == "completed" else "incomplete")


@pytest.mark.parametrize(("finish", "status", "details", "terminal"), OUTCOMES)
def test_event_sequence_validates(finish: Any, status: str, details: object, terminal: str) -> None:
    stream = ResponseStream(REQUEST, "r1", created_at=5)
    events = []
    for engine_item in items(["Hel", "", "lo"], finish):
        events += stream.feed(engine_item)
    events += stream.finish()
    assert stream.finish() == []
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        terminal,
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    parsed = [EVENT.validate_python(e) for e in events]
    first, final = parsed[0], parsed[-1]
    assert isinstance(first, ResponseCreatedEvent)
    assert first.response.status == "in_progress"
    assert isinstance(final, ResponseCompletedEvent | ResponseIncompleteEvent)
    assert final.type == terminal
    assert final.response.status == status
    assert final.response.output_text == "Hello"


def test_start_is_sent_once_and_early() -> None:
    stream = ResponseStream(REQUEST, "r1")
    assert len(stream.start()) == 4
    assert stream.start() == []
    assert [e["type"] for e in stream.feed({"text": "x"})] == ["response.output_text.delta"]


def test_failure_ends_with_error_and_response_failed() -> None:
    stream = ResponseStream(REQUEST, "r1")
    stream.feed({"text": "partial"})
    with pytest.raises(EngineError, match="out of memory"):
        stream.feed({"finish_reason": "error", "error": "out of memory"})
    events = stream.fail("out of memory")
    assert [e["type"] for e in events] == ["error", "response.failed"]
    failed = EVENT.validate_python(events[1])
    assert failed.type == "response.failed"
    assert failed.response.status == "failed"
    assert failed.response.error is not None
    assert failed.response.error.code == "server_error"
    assert failed.response.output_text == "partial"
    assert stream.fail("again") == []
    assert stream.finish() == []


def _serve(engine_items: list[dict[str, Any]]) -> Any:
    def handler(http_request: httpx2.Request) -> httpx2.Response:
        request = parse_responses_request(msgspec.json.decode(http_request.content))
        generation = Generation.collect(engine_items)
        if not request.stream:
            return httpx2.Response(200, json=response_object(request, "r9", generation))
        stream = ResponseStream(request, "r9")
        events = [e for engine_item in engine_items for e in stream.feed(engine_item)]
        return stream_response(sse(events + stream.finish(), named=True))

    return handler


def test_official_client_unary() -> None:
    client = openai_client(_serve(items(["Hello", " there"])))
    response = client.responses.create(model="m", input="hi", instructions="x")
    assert response.output_text == "Hello there"
    assert response.status == "completed"


def test_official_client_stream_helper_accumulates_the_response() -> None:
    client = openai_client(_serve(items(["Hello", " there"])))
    with client.responses.stream(model="m", input="hi") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert deltas == ["Hello", " there"]
    assert final.output_text == "Hello there"
    assert final.id == "resp_r9"


def test_official_client_raw_stream_sees_a_cancelled_response() -> None:
    client = openai_client(_serve(items(["Hel"], "cancelled")))
    events = list(client.responses.create(model="m", input="hi", stream=True))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.status == "cancelled"
