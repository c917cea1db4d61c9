"""SSE keep-alive comments fill the silences of a started stream (SPEC §8.8).

A stream starts with the engine's first item; after that, every
``--sse-keepalive`` seconds without output the frontend sends ``: keep-alive``
so proxies keep the connection and a vanished client is found out.  The model
worker here waits 1.5 s between tokens, with keep-alives every 0.2 s (virtual
seconds: over memory streams on the autojump clock).
"""

from __future__ import annotations

import itertools
import statistics
from typing import TYPE_CHECKING

import openai
import pytest
import trio
import trio.testing

from tests._memhttp import http_client, sdk_http_client

from .conftest import CHAT_BODY, openai_client_leaves_generators, parse_sse

if TYPE_CHECKING:
    from .conftest import StartStack

INTERVAL = 0.2
TOKEN_GAP = 1.5


@openai_client_leaves_generators
@pytest.mark.usefixtures("anthropic_inline")
async def test_keepalive_comments_arrive_between_slow_tokens(
    stack: StartStack, autojump_clock: trio.testing.MockClock
) -> None:
    running = await stack(
        "--sse-keepalive", str(INTERVAL), inter_token_latency_ms=TOKEN_GAP * 1000, memory=True
    )
    lines: list[tuple[float, str]] = []
    text = ""

    async def raw_stream() -> None:
        nonlocal text
        async with http_client(running.url, timeout=10) as http:
            body = {**CHAT_BODY, "max_tokens": 2, "stream": True}
            async with http.stream("POST", "/v1/chat/completions", json=body) as response:
                async for line in response.aiter_lines():
                    lines.append((trio.current_time(), line))
        text = "".join(line + "\n" for _, line in lines)

    texts: dict[str, str] = {}

    async def through_openai() -> None:
        client = openai.AsyncOpenAI(
            base_url=f"{running.url}/v1",
            api_key="-",
            max_retries=0,
            http_client=sdk_http_client(running.url),
        )
        async with client:
            stream = await client.chat.completions.create(
                model="mock", messages=CHAT_BODY["messages"], max_tokens=2, stream=True
            )
            chunks = [chunk async for chunk in stream]
        texts["openai"] = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert chunks[-1].choices[0].finish_reason == "length"

    async def through_anthropic() -> None:
        import anthropic

        client = anthropic.AsyncAnthropic(
            base_url=running.url,
            api_key="-",
            max_retries=0,
            http_client=sdk_http_client(running.url),
        )
        async with (
            client,
            client.messages.stream(
                model="mock", messages=CHAT_BODY["messages"], max_tokens=2
            ) as stream,
        ):
            message = await stream.get_final_message()
        texts["anthropic"] = message.content[0].text  # type: ignore[union-attr]
        assert message.stop_reason == "max_tokens"

    # The raw stream alone first: its arrival times are this process's reads, and
    # the SDK clients' first requests block this process's loop for a while (a slow
    # host once made three keep-alives arrive together while they started).
    with trio.fail_after(TOKEN_GAP + 5):
        await raw_stream()
    with trio.fail_after(TOKEN_GAP + 5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(through_openai)
            nursery.start_soon(through_anthropic)

    # The clients ignore the comments: they read the same two tokens.
    events = parse_sse(text)
    data = [event for event in events if event.data is not None]
    assert data[-1].data == "[DONE]"
    streamed = "".join(
        event.json()["choices"][0]["delta"].get("content", "") for event in data[:-1]
    )
    assert texts == {"openai": streamed, "anthropic": streamed}

    # Keep-alives are whole SSE comment blocks, only in the silence between the tokens.
    kinds = ["keep-alive" if event.comments else "data" for event in events]
    assert all(event.comments == ["keep-alive"] for event in events if event.comments)
    assert all(event.data is None for event in events if event.comments)
    first_gap = kinds.index("keep-alive")
    gap = kinds.count("keep-alive")
    assert kinds == ["data"] * first_gap + ["keep-alive"] * gap + ["data"] * (
        len(kinds) - first_gap - gap
    )
    expected = TOKEN_GAP / INTERVAL
    assert expected - 3 <= gap <= expected + 1, kinds
    # Spaced by the interval, not bunched up.  Arrival times are the client's: a read
    # this busy test process makes late shortens the gap after it (33 ms once, in CI),
    # so the typical spacing is checked, and that no silence was left without one.
    times = [at for at, line in lines if line == ": keep-alive"]
    spacing = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert INTERVAL * 0.75 < statistics.median(spacing) < INTERVAL * 1.5, spacing
    assert max(spacing) < INTERVAL * 3, spacing
