"""Token limits and sane bounds: each API refuses what no model can do, naming the parameter.

The messages are OpenAI's (and Anthropic's for Messages), checked word for
word against the errors those services return.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from dynamo_trio import InvalidArgument
from dynamo_trio._errors import error_from_exception
from dynamo_trio.llm import (
    CONTEXT_LENGTH_EXCEEDED,
    ContextLengthExceeded,
    RequestError,
    check_output_tokens,
    context_length_error,
    parse_chat_request,
    parse_completion_request,
    parse_embedding_request,
    parse_messages_request,
    parse_responses_request,
)


@dataclass(frozen=True)
class Limits:
    context_length: int | None = None
    max_output_tokens: int | None = None


USER = {"role": "user", "content": "hi"}
CHAT = {"model": "m", "messages": [USER]}


def refused(parse: Any, body: dict[str, Any]) -> RequestError:
    with pytest.raises(RequestError) as caught:
        parse(body)
    assert caught.value.status == 400
    return caught.value


def refused_by_limits(request: Any, limits: Limits) -> RequestError:
    with pytest.raises(RequestError) as caught:
        request.check_limits(limits)
    assert caught.value.status == 400
    return caught.value


# ---------------------------------------------------------------------------- output tokens


@pytest.mark.parametrize("value", [4097, 2**31, 2**63, 2**64 - 1])
def test_chat_max_tokens_over_the_model_limit_is_openais_error(value: int) -> None:
    request = parse_chat_request({**CHAT, "max_tokens": value})
    error = refused_by_limits(request, Limits(context_length=8192, max_output_tokens=4096))
    assert (error.param, error.code) == ("max_tokens", "invalid_value")
    assert error.message == (
        f"max_tokens is too large: {value}. This model supports at most 4096 completion "
        f"tokens, whereas you provided {value}."
    )
    assert error.openai_body()["error"] == {
        "message": error.message,
        "type": "invalid_request_error",
        "param": "max_tokens",
        "code": "invalid_value",
    }


def test_max_completion_tokens_is_named_when_it_is_the_one_given() -> None:
    request = parse_chat_request({**CHAT, "max_completion_tokens": 5000, "max_tokens": 10})
    error = refused_by_limits(request, Limits(max_output_tokens=4096))
    assert error.param == "max_completion_tokens"
    assert error.message.startswith("max_completion_tokens is too large: 5000.")


def test_the_context_length_bounds_the_output_when_no_output_limit_is_known() -> None:
    request = parse_completion_request({"model": "m", "prompt": "p", "max_tokens": 2049})
    error = refused_by_limits(request, Limits(context_length=2048))
    assert "at most 2048 completion tokens" in error.message
    parse_completion_request({"model": "m", "prompt": "p", "max_tokens": 2048}).check_limits(
        Limits(context_length=2048)
    )


def test_min_tokens_is_bounded_too() -> None:
    request = parse_chat_request({**CHAT, "min_tokens": 10_000})
    error = refused_by_limits(request, Limits(max_output_tokens=100))
    assert error.param == "min_tokens"


def test_responses_max_output_tokens() -> None:
    request = parse_responses_request({"model": "m", "input": "hi", "max_output_tokens": 2**40})
    error = refused_by_limits(request, Limits(max_output_tokens=4096, context_length=8192))
    assert (error.param, error.code) == ("max_output_tokens", "invalid_value")
    assert error.message.startswith(f"max_output_tokens is too large: {2**40}.")


def test_anthropic_max_tokens_in_anthropics_words() -> None:
    request = parse_messages_request({**CHAT, "model": "claude-x", "max_tokens": 100_000})
    error = refused_by_limits(request, Limits(max_output_tokens=64_000))
    assert error.message == (
        "max_tokens: 100000 > 64000, which is the maximum allowed number of output tokens "
        "for claude-x"
    )
    assert error.anthropic_body() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": error.message},
    }


@pytest.mark.parametrize(
    "limits", [Limits(), Limits(context_length=100), Limits(max_output_tokens=100)]
)
def test_within_limits_or_without_known_limits_nothing_is_refused(limits: Limits) -> None:
    for request in (
        parse_chat_request({**CHAT, "max_tokens": 100, "min_tokens": 100}),
        parse_completion_request({"model": "m", "prompt": "p"}),
        parse_responses_request({"model": "m", "input": "hi", "max_output_tokens": 100}),
        parse_messages_request({**CHAT, "max_tokens": 100}),
    ):
        request.check_limits(limits)


def test_check_output_tokens_names_the_first_parameter_over() -> None:
    with pytest.raises(RequestError) as caught:
        check_output_tokens(
            Limits(max_output_tokens=10), {"a": 5, "b": None, "c": 11, "d": 12}, model="m"
        )
    assert caught.value.param == "c"


# ---------------------------------------------------------------------------- context length


def test_context_length_exceeded_in_openais_words() -> None:
    error = ContextLengthExceeded(context_length=8192, prompt_tokens=7390, max_tokens=1000)
    assert isinstance(error, ValueError)
    assert str(error) == (
        "This model's maximum context length is 8192 tokens. However, you requested 8390 "
        "tokens (7390 in the messages, 1000 in the completion). Please reduce the length of "
        "the messages or completion."
    )
    alone = ContextLengthExceeded(
        context_length=4097, prompt_tokens=4294, max_tokens=None, prompt_kind="prompt"
    )
    assert str(alone) == (
        "This model's maximum context length is 4097 tokens. However, your prompt resulted "
        "in 4294 tokens. Please reduce the length of the prompt."
    )


def test_a_workers_context_length_error_becomes_a_400_with_its_code() -> None:
    raised = ContextLengthExceeded(context_length=10, prompt_tokens=8, max_tokens=5)
    remote = error_from_exception(raised)  # what the caller sees after the request plane
    assert isinstance(remote, InvalidArgument)
    refined = context_length_error(remote, param="messages")
    assert refined is not None
    assert (refined.status, refined.param, refined.code) == (
        400,
        "messages",
        CONTEXT_LENGTH_EXCEEDED,
    )
    assert refined.message == str(raised)
    # Any other refusal keeps its plain shape.
    assert context_length_error(InvalidArgument("no", caused_by="ValueError"), param="x") is None


# ---------------------------------------------------------------------------- bounds


@pytest.mark.parametrize(
    ("parse", "body"),
    [
        (parse_chat_request, CHAT),
        (parse_completion_request, {"model": "m", "prompt": "p"}),
        (parse_embedding_request, {"model": "m", "input": "x"}),
        (parse_responses_request, {"model": "m", "input": "x"}),
        (parse_messages_request, {**CHAT, "max_tokens": 5}),
    ],
)
def test_model_names_are_at_most_256_characters(parse: Any, body: dict[str, Any]) -> None:
    parse({**body, "model": "m" * 256})
    error = refused(parse, {**body, "model": "m" * 100_000})
    assert (error.param, error.code) == ("model", "invalid_value")
    assert error.message == (
        "Invalid value for 'model': expected at most 256 characters, but got 100000 characters."
    )


@pytest.mark.parametrize(
    ("parse", "body", "key", "param"),
    [
        (parse_chat_request, CHAT, "stop", "stop"),
        (parse_completion_request, {"model": "m", "prompt": "p"}, "stop", "stop"),
        (parse_messages_request, {**CHAT, "max_tokens": 5}, "stop_sequences", "stop_sequences[0]"),
    ],
)
def test_stop_sequences_are_at_most_1024_characters(
    parse: Any, body: dict[str, Any], key: str, param: str
) -> None:
    parse({**body, key: ["s" * 1024]})
    value: object = ["s" * 1025] if key == "stop_sequences" else "s" * 1025
    error = refused(parse, {**body, key: value})
    assert error.param == param
    assert "expected at most 1024 characters" in error.message
    if key == "stop":
        assert refused(parse, {**body, key: ["a", "s" * 5000]}).param == "stop[1]"


def test_anthropic_stop_sequences_are_at_most_64() -> None:
    body = {**CHAT, "max_tokens": 5}
    parse_messages_request({**body, "stop_sequences": [str(i) for i in range(64)]})
    error = refused(parse_messages_request, {**body, "stop_sequences": ["x"] * 65})
    assert error.param == "stop_sequences"


@pytest.mark.parametrize(
    ("bias", "param", "code"),
    [
        ([1], "logit_bias", "invalid_type"),
        ({"x": 1}, "logit_bias.x", "invalid_value"),
        ({"-1": 1}, "logit_bias.-1", "invalid_value"),
        ({"12345678901": 1}, "logit_bias.12345678901", "invalid_value"),
        ({"5": 101}, "logit_bias.5", "invalid_value"),
        ({"5": "1"}, "logit_bias.5", "invalid_type"),
        ({str(i): 1 for i in range(301)}, "logit_bias", "invalid_value"),
        ({"50256": -100}, "logit_bias", "unsupported_value"),
    ],
)
def test_logit_bias_is_checked_then_refused(bias: object, param: str, code: str) -> None:
    for parse, body in (
        (parse_chat_request, CHAT),
        (parse_completion_request, {"model": "m", "prompt": "p"}),
    ):
        error = refused(parse, {**body, "logit_bias": bias})
        assert (error.param, error.code) == (param, code)
    parse_chat_request({**CHAT, "logit_bias": {}})


@pytest.mark.parametrize(
    ("metadata", "param"),
    [
        ({"k" * 65: "v"}, "metadata"),
        ({"k": "v" * 513}, "metadata.k"),
    ],
)
def test_responses_metadata_sizes(metadata: dict[str, str], param: str) -> None:
    parse_responses_request({"model": "m", "input": "x", "metadata": {"k" * 64: "v" * 512}})
    error = refused(parse_responses_request, {"model": "m", "input": "x", "metadata": metadata})
    assert (error.param, error.code) == (param, "invalid_value")
