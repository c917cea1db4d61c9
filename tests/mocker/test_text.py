"""The mock engine's text: pseudo-tokens, prompt rendering, token stream, stop matching."""

from __future__ import annotations

import trio
from hypothesis import given, strategies as st

from dynamo_trio.llm import StopMatcher
from dynamo_trio.mocker import VOCABULARY, TokenSource, count_tokens, render_prompt
from dynamo_trio.mocker._text import count_tokens_yielding


def test_count_tokens_counts_words_and_punctuation() -> None:
    assert count_tokens("") == 0
    assert count_tokens("Hello, world!") == 4
    assert count_tokens("  spaced   out  ") == 2
    assert count_tokens("<|user|>") == 5


def test_render_prompt() -> None:
    assert render_prompt({"model": "m", "request_type": "completion", "prompt": "p q"}) == "p q"
    chat = render_prompt(
        {
            "model": "m",
            "request_type": "chat",
            "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
        }
    )
    assert chat == "<|system|>\ns\n<|user|>\nu\n<|assistant|>\n"


def test_vocabulary_has_64_distinct_words() -> None:
    assert len(VOCABULARY) == 64
    assert len(set(VOCABULARY)) == 64
    assert all(word and " " not in word for word in VOCABULARY)


def take(source: TokenSource, count: int) -> list[tuple[int, str]]:
    return [source.next() for _ in range(count)]


def test_token_source_is_deterministic_and_reads_as_words() -> None:
    first = take(TokenSource("prompt", 7), 20)
    assert first == take(TokenSource("prompt", 7), 20)
    assert first != take(TokenSource("prompt", 8), 20)
    assert first != take(TokenSource("prompt!", 7), 20)
    assert first != take(TokenSource("prompt", None), 20)
    assert first[0][1] == VOCABULARY[first[0][0]]  # no leading space on the first token
    assert all(text == " " + VOCABULARY[index] for index, text in first[1:])


def test_stop_matcher_holds_back_a_possible_stop() -> None:
    matcher = StopMatcher(["\n\n"])
    assert matcher.push("a\n") == ("a", None)
    assert matcher.push("\nb") == ("", "\n\n")


def test_stop_matcher_releases_held_text_that_did_not_stop() -> None:
    matcher = StopMatcher(["END"])
    assert matcher.push("xE") == ("x", None)
    assert matcher.push("N") == ("", None)
    assert matcher.push("D!") == ("", "END")
    matcher = StopMatcher(["END"])
    assert matcher.push("EN") == ("", None)
    assert matcher.push("x") == ("ENx", None)
    assert matcher.push("E") == ("", None)
    assert matcher.flush() == "E"
    assert matcher.flush() == ""


def test_inactive_matcher_releases_everything() -> None:
    matcher = StopMatcher(["a"])
    assert matcher.push("banana", active=False) == ("banana", None)
    assert matcher.push("cab") == ("c", "a")


def test_earliest_stop_wins_within_one_push() -> None:
    assert StopMatcher(["c", "ab"]).push("xabc") == ("x", "ab")
    assert StopMatcher([]).push("abc") == ("abc", None)
    assert StopMatcher([""]).push("abc") == ("abc", None)


pieces = st.lists(st.text("abc \n", max_size=4), max_size=12)
stops = st.text("abc \n", min_size=1, max_size=3)


def run(matcher: StopMatcher, texts: list[str]) -> tuple[str, str | None]:
    released = []
    for text in texts:
        out, stop = matcher.push(text)
        released.append(out)
        if stop is not None:
            return "".join(released), stop
    released.append(matcher.flush())
    return "".join(released), None


@given(pieces, stops)
def test_one_stop_cuts_the_text_before_its_first_occurrence(texts: list[str], stop: str) -> None:
    full = "".join(texts)
    released, found = run(StopMatcher([stop]), texts)
    if stop in full:
        assert (released, found) == (full[: full.index(stop)], stop)
    else:
        assert (released, found) == (full, None)


@given(pieces, st.lists(stops, min_size=1, max_size=3))
def test_released_text_never_contains_a_stop(texts: list[str], stop_list: list[str]) -> None:
    full = "".join(texts)
    released, found = run(StopMatcher(stop_list), texts)
    assert not any(stop in released for stop in stop_list)
    if found is None:
        assert released == full
    else:
        assert full.startswith(released + found)


@given(st.lists(st.sampled_from(["word", "x" * 70_000, " ", "\n", ",", "é", "  "]), max_size=12))
def test_counting_in_pieces_counts_the_same(parts: list[str]) -> None:
    text = "".join(parts)
    assert trio.run(count_tokens_yielding, text) == count_tokens(text)


async def test_a_long_text_is_counted_in_turns_with_other_tasks() -> None:
    text = "hello, world " * 100_000  # 1.3 MB: about 20 pieces
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(tick)
        await trio.lowlevel.checkpoint()
        before = ticks
        assert await count_tokens_yielding(text) == 300_000
        during = ticks - before
        nursery.cancel_scope.cancel()
    assert during >= 10
