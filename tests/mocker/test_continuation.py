"""Continuations: a migrated request's output is exactly the uninterrupted stream's.

The property (hypothesis): for any request and any cut, the items of the
uninterrupted stream after the cut are exactly the items of the request sent
again with the items before the cut as its ``continuation``: same texts, same
token ids, same finish reason, and the usage of the whole generation.  The
request plane, stop sequences spanning the cut, text held back for a possible
stop, ``min_tokens`` and the end by ``max_tokens`` all included.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given, settings, strategies as st

from dynamo_trio import Context
from dynamo_trio.llm import Generation, validate_generate_request
from dynamo_trio.mocker import VOCABULARY, MockEngine, MockerSettings
from tests._fuzz import examples

FAST = MockerSettings(inter_token_latency_ms=0.0)


async def run(engine: MockEngine, request: dict[str, Any]) -> list[dict[str, Any]]:
    return [dict(item) async for item in engine.generate(request, Context())]


def continuation_of(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "text": "".join(item.get("text", "") for item in items),
        "token_ids": [token for item in items for token in item.get("token_ids", [])],
    }


REQUESTS = st.fixed_dictionaries(
    {
        "model": st.just("mock"),
        "request_type": st.just("completion"),
        "prompt": st.text(alphabet="abc .", max_size=20),
        "seed": st.none() | st.integers(0, 5),
        "max_tokens": st.integers(1, 40),
        "min_tokens": st.none() | st.integers(0, 10),
        # Stops made of the engine's words, so they do happen (and span tokens).
        "stop": st.lists(
            st.sampled_from(VOCABULARY).map(lambda w: " " + w)
            | st.tuples(st.sampled_from(VOCABULARY), st.sampled_from(VOCABULARY)).map(
                lambda ws: f"{ws[0][-2:]} {ws[1][:2]}"
            ),
            max_size=3,
        ),
    }
)


@settings(max_examples=examples(200), deadline=None)
@given(request=REQUESTS, cut=st.floats(0.0, 1.0))
def test_a_continuation_yields_exactly_the_rest_of_the_uninterrupted_stream(
    request: dict[str, Any], cut: float
) -> None:
    if request["min_tokens"] is not None and request["min_tokens"] > request["max_tokens"]:
        request["min_tokens"] = request["max_tokens"]

    async def main() -> None:
        engine = MockEngine(FAST)
        whole = await run(engine, request)
        at = min(int(cut * len(whole)), len(whole) - 1)  # the last item is never delivered
        before = whole[:at]
        rest = await run(engine, {**request, "continuation": continuation_of(before)})
        assert rest == whole[at:]
        # One generation across the cut: the text, and the usage of the whole of it.
        generation = Generation.collect(before + rest)
        assert generation.text == Generation.collect(whole).text
        assert generation.usage == whole[-1]["usage"]

    trio.run(main)


async def test_every_cut_of_one_long_stream() -> None:
    request = {
        "model": "mock",
        "request_type": "chat",
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": 120,
        "stop": ["fox jumps"],
        "seed": 7,
    }
    engine = MockEngine(FAST)
    whole = await run(engine, request)
    for at in range(len(whole)):
        rest = await run(engine, {**request, "continuation": continuation_of(whole[:at])})
        assert rest == whole[at:], at


async def test_continued_tokens_count_against_max_tokens_and_in_usage() -> None:
    request = {"model": "mock", "request_type": "completion", "prompt": "Once", "max_tokens": 10}
    engine = MockEngine(FAST)
    whole = await run(engine, request)
    rest = await run(engine, {**request, "continuation": continuation_of(whole[:7])})
    assert len(rest) == 3
    assert rest[-1]["finish_reason"] == "length"
    assert rest[-1]["usage"]["completion_tokens"] == 10


async def test_a_continuation_holding_every_token_just_ends() -> None:
    request = {"model": "mock", "request_type": "completion", "prompt": "Once", "max_tokens": 4}
    engine = MockEngine(FAST)
    whole = await run(engine, request)
    ended = await run(engine, {**request, "continuation": continuation_of(whole)})
    assert ended == [
        {"text": "", "token_ids": [], "finish_reason": "length", "usage": whole[-1]["usage"]}
    ]


async def test_a_continuation_waits_for_the_first_token_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    request = {"model": "mock", "request_type": "completion", "prompt": "Once", "max_tokens": 6}
    engine = MockEngine(MockerSettings(ttft_ms=500, inter_token_latency_ms=10))
    whole = await run(engine, request)
    started = trio.current_time()
    rest = await run(engine, {**request, "continuation": continuation_of(whole[:2])})
    assert rest == whole[2:]
    assert trio.current_time() - started == pytest.approx(0.5 + 3 * 0.01)


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (lambda c: {**c, "token_ids": [*c["token_ids"][:-1], (c["token_ids"][-1] + 1) % 64]},
         "token 3 is"),
        (lambda c: {**c, "token_ids": c["token_ids"] + c["token_ids"][-1:]}, "token 4 is"),
        (lambda c: {**c, "text": c["text"] + " again"}, "text does not match"),
        (lambda c: {**c, "text": c["text"][: -len(" x")]}, "text does not match"),
    ],
)  # fmt: skip
async def test_a_continuation_that_is_not_this_requests_is_refused(
    change: Any, fragment: str
) -> None:
    request = {"model": "mock", "request_type": "completion", "prompt": "Once", "max_tokens": 9}
    engine = MockEngine(FAST)
    whole = await run(engine, request)
    continuation = change(continuation_of(whole[:3]))
    with pytest.raises(ValueError, match=fragment):
        await run(engine, {**request, "continuation": continuation})


async def test_a_continuation_of_another_prompt_is_refused() -> None:
    request = {"model": "mock", "request_type": "completion", "prompt": "Once", "max_tokens": 9}
    engine = MockEngine(FAST)
    other = await run(engine, {**request, "prompt": "Twice"})
    with pytest.raises(ValueError, match="invalid continuation"):
        await run(engine, {**request, "continuation": continuation_of(other[:4])})


def test_the_protocol_checks_continuations() -> None:
    base = {"model": "m", "request_type": "completion", "prompt": "p", "max_tokens": 2}
    valid = validate_generate_request({**base, "continuation": {"text": "a", "token_ids": [1]}})
    assert valid["continuation"] == {"text": "a", "token_ids": [1]}
    assert validate_generate_request({**base, "continuation": None})["continuation"] is None
    for bad, fragment in [
        ({"text": "a"}, "token_ids"),
        ({"text": 1, "token_ids": []}, "text"),
        ({"text": "", "token_ids": [-1]}, "token_ids"),
        ({"text": "", "token_ids": [1, 2, 3]}, "more than max_tokens"),
    ]:
        with pytest.raises(ValueError, match=fragment):
            validate_generate_request({**base, "continuation": bad})
