"""Parsing OpenAI chat and completions bodies: every refusal names its parameter."""

from __future__ import annotations

from typing import Any

import pytest

from dynamo_trio.llm import (
    RequestError,
    SamplingParams,
    parse_chat_request,
    parse_completion_request,
)

MESSAGES = [{"role": "user", "content": "hi"}]


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": MESSAGES, **fields}


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": "once upon a time", **fields}


def without(body: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != key}


def message(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}, fields]}


# (body, param, fragment of the message)
BAD_CHAT = [
    pytest.param([], None, "the request body: expected an object", id="body-array"),
    pytest.param("hi", None, "expected an object, but got a string", id="body-string"),
    pytest.param(without(chat(), "model"), "model", "Missing required parameter", id="no-model"),
    pytest.param(chat(model=None), "model", "Missing required parameter", id="model-null"),
    pytest.param(chat(model=3), "model", "expected a string, but got an integer", id="model-int"),
    pytest.param(chat(model=""), "model", "non-empty", id="model-empty"),
    pytest.param(without(chat(), "messages"), "messages", "Missing required", id="no-messages"),
    pytest.param(chat(messages={}), "messages", "expected an array", id="messages-object"),
    pytest.param(chat(messages=[]), "messages", "at least one message", id="messages-empty"),
    pytest.param(chat(messages=["hi"]), "messages[0]", "expected an object", id="message-str"),
    pytest.param(chat(messages=[{"content": "x"}]), "messages[0].role", "Missing", id="no-role"),
    pytest.param(message(role="wizard", content="x"), "messages[1].role", "'wizard'", id="role"),
    pytest.param(message(role=1, content="x"), "messages[1].role", "a string", id="role-int"),
    pytest.param(message(role="user"), "messages[1].content", "needs content", id="no-content"),
    pytest.param(
        message(role="system", content=None), "messages[1].content", "needs content", id="null"
    ),
    pytest.param(
        message(role="user", content=5),
        "messages[1].content",
        "a string or an array of content parts",
        id="content-int",
    ),
    pytest.param(
        message(role="user", content=[]), "messages[1].content", "at least one", id="parts-empty"
    ),
    pytest.param(
        message(role="user", content=["x"]), "messages[1].content[0]", "an object", id="part-str"
    ),
    pytest.param(
        message(role="user", content=[{"type": "image_url", "image_url": {"url": "u"}}]),
        "messages[1].content[0].type",
        "'image_url' are not supported",
        id="part-image",
    ),
    pytest.param(
        message(role="user", content=[{"text": "x"}]),
        "messages[1].content[0].type",
        "Missing",
        id="part-no-type",
    ),
    pytest.param(
        message(role="user", content=[{"type": "text"}]),
        "messages[1].content[0].text",
        "Missing",
        id="part-no-text",
    ),
    pytest.param(
        message(role="user", content=[{"type": "text", "text": 5}]),
        "messages[1].content[0].text",
        "a string",
        id="part-text-int",
    ),
    pytest.param(chat(max_tokens=0), "max_tokens", "integer >= 1, but got 0", id="max-0"),
    pytest.param(chat(max_tokens="5"), "max_tokens", "an integer, but got a string", id="max-s"),
    pytest.param(chat(max_tokens=True), "max_tokens", "but got a boolean", id="max-bool"),
    pytest.param(chat(max_tokens=1.5), "max_tokens", "but got a number", id="max-float"),
    pytest.param(
        chat(max_completion_tokens=-1), "max_completion_tokens", ">= 1", id="max-completion"
    ),
    pytest.param(chat(min_tokens=-1), "min_tokens", ">= 0", id="min-negative"),
    pytest.param(
        chat(max_tokens=4, min_tokens=5), "min_tokens", "at most max_tokens (4)", id="min>max"
    ),
    pytest.param(chat(n=2), "n", "n must be 1", id="n-2"),
    pytest.param(chat(n=0), "n", ">= 1", id="n-0"),
    pytest.param(chat(n="1"), "n", "an integer", id="n-str"),
    pytest.param(chat(stream="yes"), "stream", "a boolean, but got a string", id="stream"),
    pytest.param(
        chat(stream_options={"include_usage": True}),
        "stream_options",
        "only allowed when stream is true",
        id="options-unary",
    ),
    pytest.param(chat(stream=True, stream_options=[]), "stream_options", "an object", id="opts"),
    pytest.param(
        chat(stream=True, stream_options={"include_usage": "y"}),
        "stream_options.include_usage",
        "a boolean",
        id="include-usage",
    ),
    pytest.param(chat(stop=5), "stop", "a string or an array of strings", id="stop-int"),
    pytest.param(chat(stop=""), "stop", "non-empty", id="stop-empty"),
    pytest.param(chat(stop=list("abcde")), "stop", "at most 4 items, but got 5", id="stop-5"),
    pytest.param(chat(stop=["a", 1]), "stop[1]", "a string, but got an integer", id="stop-item"),
    pytest.param(chat(stop=["a", ""]), "stop[1]", "non-empty", id="stop-item-empty"),
    pytest.param(chat(temperature=2.5), "temperature", "<= 2, but got 2.5", id="temp-high"),
    pytest.param(chat(temperature=-0.1), "temperature", ">= 0", id="temp-low"),
    pytest.param(chat(temperature="hot"), "temperature", "a number", id="temp-str"),
    pytest.param(chat(temperature=float("nan")), "temperature", "finite", id="temp-nan"),
    pytest.param(chat(top_p=1.5), "top_p", "<= 1", id="top-p"),
    pytest.param(chat(seed="42"), "seed", "an integer", id="seed-str"),
    pytest.param(chat(seed=4.2), "seed", "an integer", id="seed-float"),
    pytest.param(chat(presence_penalty=3), "presence_penalty", "<= 2", id="presence"),
    pytest.param(chat(frequency_penalty="x"), "frequency_penalty", "a number", id="frequency"),
    pytest.param(chat(logprobs=True), "logprobs", "not supported", id="logprobs"),
    pytest.param(chat(logprobs="yes"), "logprobs", "a boolean", id="logprobs-str"),
    pytest.param(chat(top_logprobs=30), "top_logprobs", "<= 20", id="top-logprobs"),
    pytest.param(chat(ignore_eos="yes"), "ignore_eos", "a boolean", id="ignore-eos"),
]

BAD_COMPLETION = [
    pytest.param(without(completion(), "prompt"), "prompt", "Missing required", id="no-prompt"),
    pytest.param(completion(prompt=5), "prompt", "a string or an array", id="prompt-int"),
    pytest.param(completion(prompt=[]), "prompt", "empty array", id="prompt-empty"),
    pytest.param(completion(prompt=[1, 2, 3]), "prompt", "token-id prompts", id="token-ids"),
    pytest.param(completion(prompt=[[1, 2]]), "prompt", "token-id prompts", id="token-batch"),
    pytest.param(completion(prompt=["a", "b"]), "prompt", "got 2 prompts", id="batch"),
    pytest.param(completion(prompt=["a", None]), "prompt[1]", "but got null", id="item-null"),
    pytest.param(completion(n=3), "n", "n must be 1", id="n"),
    pytest.param(completion(best_of=2), "best_of", "best_of must be 1", id="best-of"),
    pytest.param(completion(echo=True), "echo", "not supported", id="echo"),
    pytest.param(completion(logprobs=2), "logprobs", "not supported", id="logprobs"),
    pytest.param(completion(logprobs=9), "logprobs", "<= 5", id="logprobs-range"),
    pytest.param(completion(suffix="end"), "suffix", "not supported", id="suffix"),
    pytest.param(completion(suffix=5), "suffix", "a string", id="suffix-int"),
    pytest.param(completion(max_tokens=0), "max_tokens", ">= 1", id="max-tokens"),
    pytest.param(completion(stream=1), "stream", "a boolean, but got an integer", id="stream"),
    pytest.param({"prompt": "x"}, "model", "Missing required parameter: 'model'", id="no-model"),
]


@pytest.mark.parametrize(("body", "param", "fragment"), BAD_CHAT)
def test_bad_chat_request_is_a_400_naming_the_parameter(
    body: object, param: str | None, fragment: str
) -> None:
    with pytest.raises(RequestError) as caught:
        parse_chat_request(body)
    assert caught.value.status == 400
    assert caught.value.param == param
    assert fragment in caught.value.message
    if param is not None:
        assert f"'{param}'" in caught.value.message


@pytest.mark.parametrize(("body", "param", "fragment"), BAD_COMPLETION)
def test_bad_completion_request_is_a_400_naming_the_parameter(
    body: object, param: str, fragment: str
) -> None:
    with pytest.raises(RequestError) as caught:
        parse_completion_request(body)
    assert caught.value.status == 400
    assert caught.value.param == param
    assert fragment in caught.value.message
    assert f"'{param}'" in caught.value.message


def test_chat_request_to_engine() -> None:
    request = parse_chat_request(
        chat(
            messages=[
                {"role": "developer", "content": "be brief"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
                {"role": "assistant", "content": None, "tool_calls": []},
                {"role": "user", "content": "c", "name": "bob"},
            ],
            max_tokens=8,
            min_tokens=2,
            temperature=0,
            top_p=1,
            seed=-3,
            stop="\n",
            ignore_eos=True,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert request.stream
    assert request.include_usage
    assert request.to_engine() == {
        "model": "m",
        "request_type": "chat",
        "messages": [
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": "a\nb"},
            {"role": "assistant", "content": ""},
            {"role": "user", "content": "c"},
        ],
        "max_tokens": 8,
        "min_tokens": 2,
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": None,
        "seed": -3,
        "stop": ["\n"],
        "ignore_eos": True,
    }


def test_chat_defaults_and_ignored_extras() -> None:
    request = parse_chat_request(
        chat(
            tools=[{"type": "function"}],
            user="u",
            response_format={"type": "text"},
            stream=False,
            stream_options=None,
            n=1,
            logprobs=False,
            frobnicate={"any": "thing"},
        )
    )
    assert not request.stream
    assert not request.include_usage
    assert request.sampling == SamplingParams()


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    request = parse_chat_request(chat(max_tokens=100, max_completion_tokens=5))
    assert request.sampling.max_tokens == 5
    with pytest.raises(RequestError) as caught:
        parse_chat_request(chat(max_tokens="x", max_completion_tokens=5))
    assert caught.value.param == "max_tokens"


def test_stream_options_without_usage() -> None:
    request = parse_chat_request(chat(stream=True, stream_options={}))
    assert request.stream
    assert not request.include_usage


@pytest.mark.parametrize("prompt", ["text", ["text"]])
def test_completion_request_to_engine(prompt: object) -> None:
    request = parse_completion_request(completion(prompt=prompt, max_tokens=3, stop=["x", "y"]))
    assert request.to_engine() == {
        "model": "m",
        "request_type": "completion",
        "prompt": "text",
        "max_tokens": 3,
        "min_tokens": None,
        "temperature": None,
        "top_p": None,
        "top_k": None,
        "seed": None,
        "stop": ["x", "y"],
        "ignore_eos": False,
    }


def test_completion_accepts_neutral_values_of_refused_options() -> None:
    request = parse_completion_request(
        completion(n=1, best_of=1, echo=False, logprobs=0, suffix="", stream=True)
    )
    assert request.stream
    assert request.prompt == "once upon a time"


def test_request_error_renders_in_both_shapes() -> None:
    with pytest.raises(RequestError) as caught:
        parse_chat_request(chat(temperature=9))
    assert caught.value.openai_body() == {
        "error": {
            "message": caught.value.message,
            "type": "invalid_request_error",
            "param": "temperature",
            "code": "invalid_value",
        }
    }
    assert caught.value.anthropic_body() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": caught.value.message},
    }
