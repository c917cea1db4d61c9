"""The engine protocol: validation on both ends, and folding items into a generation."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, strategies as st

from dynamo_trio.llm import (
    EngineError,
    Generation,
    parse_chat_request,
    parse_completion_request,
    parse_embedding_request,
    parse_generate_output,
    parse_messages_request,
    parse_responses_request,
    validate_embed_request,
    validate_generate_request,
)
from dynamo_trio.llm._generation import plain_text

CHAT = {"model": "m", "request_type": "chat", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "m", "request_type": "completion", "prompt": "p"}


def test_minimal_requests_are_valid_and_unknown_keys_dropped() -> None:
    assert validate_generate_request({**CHAT, "nvext": {"x": 1}}) == CHAT
    assert validate_generate_request(COMPLETION) == COMPLETION


def test_integers_are_accepted_for_floats() -> None:
    valid = validate_generate_request({**COMPLETION, "temperature": 1, "top_p": 1})
    assert valid["temperature"] == 1.0
    assert isinstance(valid["temperature"], float)


@pytest.mark.parametrize(
    ("request_body", "fragment"),
    [
        pytest.param([], "Expected `object`", id="not-an-object"),
        pytest.param({"request_type": "chat"}, "`model`", id="no-model"),
        pytest.param({**CHAT, "request_type": "embedding"}, "request_type", id="type"),
        pytest.param({"model": "m", "request_type": "chat"}, "non-empty `messages`", id="no-msgs"),
        pytest.param({**CHAT, "messages": []}, "non-empty `messages`", id="empty-messages"),
        pytest.param({"model": "m", "request_type": "completion"}, "`prompt`", id="no-prompt"),
        pytest.param(
            {**CHAT, "messages": [{"role": "user", "content": 1}]},
            "$.messages[0].content",
            id="content",
        ),
        pytest.param({**CHAT, "max_tokens": 0}, "$.max_tokens", id="max-tokens"),
        pytest.param({**CHAT, "max_tokens": True}, "$.max_tokens", id="max-tokens-bool"),
        pytest.param({**CHAT, "min_tokens": -1}, "$.min_tokens", id="min-tokens"),
        pytest.param(
            {**CHAT, "max_tokens": 2, "min_tokens": 3}, "min_tokens (3) exceeds", id="min>max"
        ),
        pytest.param({**CHAT, "temperature": -1}, "$.temperature", id="temperature"),
        pytest.param({**CHAT, "top_p": 2}, "$.top_p", id="top-p"),
        pytest.param({**CHAT, "stop": [""]}, "$.stop[0]", id="stop"),
        pytest.param({**CHAT, "stop": "x"}, "$.stop", id="stop-str"),
        pytest.param({**CHAT, "seed": "1"}, "$.seed", id="seed"),
        pytest.param({**CHAT, "ignore_eos": 1}, "$.ignore_eos", id="ignore-eos"),
    ],
)
def test_invalid_generate_requests_raise_value_error(request_body: object, fragment: str) -> None:
    with pytest.raises(ValueError, match="invalid generate request") as caught:
        validate_generate_request(request_body)
    assert fragment in str(caught.value)


@pytest.mark.parametrize(
    ("request_body", "fragment"),
    [
        pytest.param(
            {"model": "m", "request_type": "embedding", "input": []}, "$.input", id="empty"
        ),
        pytest.param(
            {"model": "m", "request_type": "chat", "input": ["a"]}, "request_type", id="t"
        ),
        pytest.param(
            {"model": "m", "request_type": "embedding", "input": ["a"], "dimensions": 0},
            "$.dimensions",
            id="dimensions",
        ),
    ],
)
def test_invalid_embed_requests_raise_value_error(request_body: object, fragment: str) -> None:
    with pytest.raises(ValueError, match="invalid embedding request") as caught:
        validate_embed_request(request_body)
    assert fragment in str(caught.value)


@pytest.mark.parametrize(
    "engine_request",
    [
        parse_chat_request({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
        parse_chat_request(
            {
                "model": "m",
                "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 3,
                "temperature": 0.5,
                "stop": ["a"],
                "seed": 1,
            }
        ),
        parse_completion_request({"model": "m", "prompt": ["x"], "min_tokens": 1}),
        parse_responses_request({"model": "m", "input": "x", "instructions": "y"}),
        parse_messages_request(
            {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}
        ),
    ],
    ids=["chat", "chat-sampling", "completion", "responses", "anthropic"],
)
def test_every_api_makes_valid_plain_json_engine_requests(engine_request: Any) -> None:
    wire = msgspec.json.decode(msgspec.json.encode(engine_request.to_engine()))
    assert validate_generate_request(wire) == engine_request.to_engine()


def test_embedding_api_makes_a_valid_engine_request() -> None:
    request = parse_embedding_request({"model": "e", "input": ["a", "b"]})
    wire = msgspec.json.decode(msgspec.json.encode(request.to_engine()))
    assert validate_embed_request(wire) == request.to_engine()


def test_output_items_are_validated() -> None:
    assert parse_generate_output({"text": "a", "extra": 1}) == {"text": "a"}
    with pytest.raises(EngineError, match="malformed engine output"):
        parse_generate_output({"token_ids": ["1"]})


_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=4),
    st.lists(st.one_of(st.integers(), st.booleans(), st.text(max_size=2)), max_size=3),
)
_ITEMS = st.one_of(
    st.dictionaries(
        st.sampled_from(["text", "token_ids", "finish_reason", "usage", "error", "other"]),
        _VALUES,
    ),
    _VALUES,
)


def _folded_slowly(items: list[Any]) -> tuple[object, ...]:
    """What a generation of ``items`` is, every item fully validated."""
    pieces: list[str] = []
    counted = 0
    for item in items:
        output = parse_generate_output(item)  # raises for what the fast path must refuse
        assert not output.get("finish_reason")
        counted += len(output.get("token_ids") or ())
        pieces.append(output.get("text", ""))
    return "".join(pieces), counted


@given(st.lists(_ITEMS, max_size=4))
def test_the_plain_item_fast_path_agrees_with_full_validation(items: list[Any]) -> None:
    # Generation.feed skips the full validation for items plain_text accepts: it
    # must accept only items the full validation accepts, and fold them the same.
    plain = [item for item in items if plain_text(item) is not None]
    for item in plain:
        assert parse_generate_output(item).get("text", "") == plain_text(item)
    generation = Generation.collect(plain)
    assert (generation.text, generation.usage["completion_tokens"]) == _folded_slowly(plain)
    untokenized = sum(1 for item in plain if "token_ids" not in item and item.get("text"))
    assert generation.output_tokens == generation.usage["completion_tokens"] + untokenized
    for item in items:
        if (
            plain_text(item) is None
            and isinstance(item, dict)
            and item.keys() <= {"text", "token_ids"}
        ):
            with pytest.raises(EngineError):  # ill-typed: the full validation refuses it
                Generation().feed(item)


def test_generation_folds_text_usage_and_finish() -> None:
    generation = Generation()
    assert (generation.text, generation.finished, generation.finish_reason) == ("", False, "stop")
    assert generation.feed({"text": "a", "token_ids": [1, 2]}) == "a"
    assert generation.feed({}) == ""
    assert generation.usage == {"prompt_tokens": 0, "completion_tokens": 2}
    assert generation.text == "a"
    generation.feed(
        {
            "text": "b",
            "token_ids": [3],
            "finish_reason": "stop",
            "stop_sequence": "\n",
            "usage": {"prompt_tokens": 5, "completion_tokens": 4},
        }
    )
    assert generation.finished
    assert (generation.finish_reason, generation.stop_sequence) == ("stop", "\n")
    assert generation.usage == {"prompt_tokens": 5, "completion_tokens": 4}  # the engine's word
    assert generation.feed({"text": "late", "finish_reason": "error"}) == ""  # ignored
    assert generation.text == "ab"


def test_output_tokens_count_token_ids_else_one_per_text_piece_until_the_finish() -> None:
    # What the frontend's output-token metrics count, from the fold itself.
    generation = Generation()
    generation.feed({"text": "a", "token_ids": [1, 2]})  # the fast path
    generation.feed({"text": "b"})  # text, no token ids: one
    generation.feed({"token_ids": []})
    generation.feed({"text": "", "token_ids": [3], "index": 0})  # the full validation
    generation.feed({"text": "c", "finish_reason": "length"})  # one, and the end
    generation.feed({"text": "late", "token_ids": [4, 5]})  # after the end: never sent
    assert generation.output_tokens == 2 + 1 + 0 + 1 + 1
    assert generation.usage["completion_tokens"] == 3  # usage counts token ids only


def test_an_error_item_raises_with_the_engines_message() -> None:
    generation = Generation.collect([{"text": "a"}])
    with pytest.raises(EngineError) as caught:
        generation.feed({"finish_reason": "error", "error": "CUDA error"})
    assert caught.value.message == "CUDA error"
    assert not generation.finished
