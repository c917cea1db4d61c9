"""SIGTERM on the frontend: streams in flight are stopped gracefully and finish; it exits 0.

Shutting down stops (not kills) every request in flight with reason
``shutdown``: the worker drains (its last item carries the usage so far), the
client reads a well-formed end of its stream, and the process exits cleanly.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING

import anthropic
import httpx
import openai
import pytest
import trio

from .conftest import CHAT_BODY, openai_client_leaves_generators, parse_sse

if TYPE_CHECKING:
    from .conftest import StartStack

pytestmark = pytest.mark.slow

LONG = 10_000


@openai_client_leaves_generators
async def test_sigterm_lets_streams_in_flight_finish_and_exits_0(stack: StartStack) -> None:
    running = await stack()
    started = trio.Semaphore(0)
    results: dict[str, object] = {}

    async def raw_chat() -> None:
        text = ""
        async with (
            httpx.AsyncClient(base_url=running.url, timeout=10) as http,
            http.stream(
                "POST",
                "/v1/chat/completions",
                json={**CHAT_BODY, "max_tokens": LONG, "stream": True},
                headers={"x-request-id": "raw-chat"},
            ) as response,
        ):
            async for chunk in response.aiter_text():
                text += chunk
                if text.count("data: ") == 3:
                    started.release()
        results["raw-chat"] = text

    async def openai_completions() -> None:
        client = openai.AsyncOpenAI(base_url=f"{running.url}/v1", api_key="-", max_retries=0)
        async with client:
            stream = await client.completions.create(
                model="mock",
                prompt="hi",
                max_tokens=LONG,
                stream=True,
                stream_options={"include_usage": True},
                extra_headers={"x-request-id": "openai-completions"},
            )
            chunks = []
            async for chunk in stream:
                chunks.append(chunk)
                if len(chunks) == 3:
                    started.release()
        results["openai-completions"] = chunks

    async def anthropic_messages() -> None:
        client = anthropic.AsyncAnthropic(base_url=running.url, api_key="-", max_retries=0)
        async with (
            client,
            client.messages.stream(
                model="mock",
                messages=CHAT_BODY["messages"],
                max_tokens=LONG,
                extra_headers={"x-request-id": "anthropic-messages"},
            ) as stream,
        ):
            events = 0
            async for _ in stream:
                events += 1
                if events == 5:
                    started.release()
            results["anthropic-messages"] = await stream.get_final_message()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(raw_chat)
            nursery.start_soon(openai_completions)
            nursery.start_soon(anthropic_messages)
            for _ in range(3):
                await started.acquire()
            running.frontend.signal(signal.SIGTERM)
        # Drained at once (the mock engine stops on request): well within the grace (2 s).
        assert await running.frontend.wait_exit(within=3) == 0

    # Each worker handler was stopped (not killed) for the shutdown, and drained.
    exits = {}
    for request_id in results:
        exit_event = await running.worker.wait_for("exit", id=request_id)
        assert (exit_event["state"], exit_event["reason"], exit_event["how"]) == (
            "STOPPED",
            "shutdown",
            "returned",
        ), exit_event
        assert exit_event["last"]["finish_reason"] == "cancelled"
        exits[request_id] = exit_event
    generated = {rid: e["last"]["usage"]["completion_tokens"] for rid, e in exits.items()}
    assert all(3 <= tokens < LONG for tokens in generated.values()), generated

    # The raw stream ends like any finished stream: a finish chunk, then [DONE].
    text = results["raw-chat"]
    assert isinstance(text, str)
    events = parse_sse(text)
    assert events[-1].data == "[DONE]"
    assert all(event.event is None for event in events), "no error event"
    assert events[-2].json()["choices"][0]["finish_reason"] == "stop"

    # The openai client read a stream that ended normally, usage included and exact.
    chunks = results["openai-completions"]
    assert isinstance(chunks, list)
    *text_chunks, usage_chunk = chunks
    assert text_chunks[-1].choices[0].finish_reason == "stop"
    assert usage_chunk.choices == []
    assert usage_chunk.usage.completion_tokens == generated["openai-completions"]

    # The anthropic client assembled a complete message.
    message = results["anthropic-messages"]
    assert isinstance(message, anthropic.types.Message)
    assert message.stop_reason == "end_turn"
    assert message.usage.output_tokens == generated["anthropic-messages"]

    # The worker lives on, its handlers all done.
    assert running.worker.process.returncode is None
    assert await running.metric("dynamo_component_inflight_requests", worker=True) == 0
