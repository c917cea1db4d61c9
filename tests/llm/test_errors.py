"""Error bodies, status mapping, and how the official clients surface them."""

from __future__ import annotations

import httpx2
import openai
import pydantic
import pytest
from openai.types.shared import ErrorObject

from dynamo_trio import (
    Cancelled,
    CannotConnect,
    ConnectionTimeout,
    Disconnected,
    EngineShutdown,
    InvalidArgument,
    NoInstances,
    ProtocolError,
    ResourceExhausted,
    ResponseTimeout,
    StreamIncomplete,
    Unknown,
)
from dynamo_trio._errors import error_from_wire
from dynamo_trio.llm import (
    MAX_ERROR_MESSAGE,
    EngineError,
    RequestError,
    anthropic_error_body,
    anthropic_error_type,
    bounded_message,
    openai_error_body,
    openai_error_type,
    parse_chat_request,
    reason_phrase,
    status_for_error,
)

from ._support import openai_client

TYPES = [
    # status, OpenAI type, Anthropic type
    (400, "invalid_request_error", "invalid_request_error"),
    (401, "authentication_error", "authentication_error"),
    (402, "invalid_request_error", "billing_error"),
    (403, "permission_error", "permission_error"),
    (404, "not_found_error", "not_found_error"),
    (405, "invalid_request_error", "invalid_request_error"),
    (408, "timeout_error", "timeout_error"),
    (413, "invalid_request_error", "request_too_large"),
    (415, "invalid_request_error", "invalid_request_error"),
    (422, "invalid_request_error", "invalid_request_error"),
    (429, "rate_limit_error", "rate_limit_error"),
    (499, "request_cancelled", "request_cancelled"),
    (500, "server_error", "api_error"),
    (502, "bad_gateway", "api_error"),
    (503, "service_unavailable", "overloaded_error"),
    (504, "timeout_error", "timeout_error"),
    (529, "service_unavailable", "overloaded_error"),
]


@pytest.mark.parametrize(("status", "openai_type", "anthropic_type"), TYPES)
def test_status_to_error_type(status: int, openai_type: str, anthropic_type: str) -> None:
    assert openai_error_type(status) == openai_type
    assert anthropic_error_type(status) == anthropic_type
    body = openai_error_body(status, "m")
    ErrorObject.model_validate(body["error"])
    assert anthropic_error_body(status, "m") == {
        "type": "error",
        "error": {"type": anthropic_type, "message": "m"},
    }


@pytest.mark.parametrize(
    "status", [s for s, _, t in TYPES if t not in ("request_too_large", "request_cancelled")]
)
def test_anthropic_bodies_validate_as_the_clients_error_response(status: int) -> None:
    anthropic = pytest.importorskip("anthropic")
    pydantic.TypeAdapter(anthropic.types.ErrorResponse).validate_python(
        anthropic_error_body(status, "m")
    )


@pytest.mark.parametrize(
    ("status", "code"),
    [(400, None), (404, None), (413, "request_too_large"), (415, "unsupported_media_type"),
     (499, "request_cancelled"), (502, "bad_gateway"), (503, "service_unavailable"),
     (504, "timeout")],
)  # fmt: skip
def test_openai_default_codes(status: int, code: str | None) -> None:
    assert openai_error_body(status, "m")["error"] == {
        "message": "m",
        "type": openai_error_type(status),
        "param": None,
        "code": code,
    }


def test_explicit_type_code_and_param_win() -> None:
    error = RequestError(
        404, "The model 'x' does not exist.", type="invalid_request_error", code="model_not_found"
    )
    assert error.openai_body() == {
        "error": {
            "message": "The model 'x' does not exist.",
            "type": "invalid_request_error",
            "param": None,
            "code": "model_not_found",
        }
    }
    assert error.anthropic_body()["error"] == {
        "type": "invalid_request_error",
        "message": "The model 'x' does not exist.",
    }
    assert "404" in repr(error)


@pytest.mark.parametrize(
    ("status", "phrase"),
    [(400, "Bad Request"), (499, "Client Closed Request"), (503, "Service Unavailable"),
     (529, "Overloaded"), (599, "Unknown")],
)  # fmt: skip
def test_reason_phrase(status: int, phrase: str) -> None:
    assert reason_phrase(status) == phrase


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (RequestError(413, "too big"), 413),
        (InvalidArgument("bad"), 400),
        (Cancelled("gone"), 499),
        (NoInstances("none"), 503),
        (CannotConnect("no instance could be reached"), 503),
        (EngineShutdown("bye"), 503),
        (ResourceExhausted("full"), 503),
        (ConnectionTimeout("slow"), 504),
        (ResponseTimeout("slow"), 504),
        (Disconnected("lost"), 503),
        (StreamIncomplete("cut"), 503),
        (ProtocolError("garbage"), 502),
        (Unknown("?"), 500),
        (EngineError("oom"), 502),
        (RuntimeError("bug"), 500),
    ],
)
def test_status_for_error(error: BaseException, status: int) -> None:
    assert status_for_error(error) == status


def test_an_error_subclassed_outside_the_package_travels_as_its_parents_code() -> None:
    class PromptTooLong(InvalidArgument):
        pass

    class Overloaded(ResourceExhausted):
        pass

    for error, parent in (
        (PromptTooLong("long"), InvalidArgument),
        (Overloaded("busy"), ResourceExhausted),
    ):
        assert error.error_type == parent.__name__
        again = error_from_wire(error.error_type, error.message)
        assert type(again) is parent
        assert again.message == error.message


def _reject(error: RequestError) -> httpx2.Response:
    return httpx2.Response(error.status, json=error.openai_body())


def test_openai_client_raises_bad_request_with_the_param() -> None:
    def handler(request: httpx2.Request) -> httpx2.Response:
        try:
            parse_chat_request({"model": "m", "messages": [], "max_tokens": 5})
        except RequestError as exc:
            return _reject(exc)
        raise AssertionError("the body is invalid")

    with pytest.raises(openai.BadRequestError) as caught:
        openai_client(handler).chat.completions.create(model="m", messages=[])
    assert caught.value.param == "messages"
    assert caught.value.type == "invalid_request_error"
    assert "at least one message" in caught.value.message


@pytest.mark.parametrize(
    ("status", "exception"),
    [(404, openai.NotFoundError), (499, openai.APIStatusError), (503, openai.InternalServerError)],
)
def test_openai_client_maps_statuses(status: int, exception: type[openai.APIStatusError]) -> None:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return _reject(RequestError(status, "nope"))

    with pytest.raises(exception) as caught:
        openai_client(handler).models.list()
    assert caught.value.status_code == status


def test_anthropic_client_raises_bad_request_with_the_message() -> None:
    anthropic = pytest.importorskip("anthropic")

    def handler(request: httpx2.Request) -> httpx2.Response:
        error = RequestError(400, "Missing required parameter: 'max_tokens'.", param="max_tokens")
        return httpx2.Response(400, json=error.anthropic_body())

    client = anthropic.Anthropic(
        api_key="test",
        base_url="http://frontend.test",
        max_retries=0,
        http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
    )
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        client.messages.create(model="c", max_tokens=1, messages=[])


@pytest.mark.parametrize("code", ["", "NoSuchCode", "unknown", "x" * 500])
def test_an_error_code_the_wire_format_does_not_define_is_a_protocol_error(code: str) -> None:
    error = error_from_wire(code, "what it said")
    assert isinstance(error, ProtocolError)
    assert status_for_error(error) == 502
    assert "what it said" in error.message
    assert len(error.message) < 200


def test_a_known_code_keeps_its_type() -> None:
    assert type(error_from_wire("Unknown", "x")) is Unknown
    assert type(error_from_wire("InvalidArgument", "x")) is InvalidArgument


@pytest.mark.parametrize("size", [0, 10, MAX_ERROR_MESSAGE, MAX_ERROR_MESSAGE + 1, 5000])
def test_a_message_is_bounded(size: int) -> None:
    message = "m" * size
    bounded = bounded_message(message)
    assert len(bounded) <= MAX_ERROR_MESSAGE
    assert bounded == message if size <= MAX_ERROR_MESSAGE else bounded.endswith("[...]")
