"""A worker that dies mid-request: every client in flight gets a clean, prompt error (SPEC §3, §6).

The worker is SIGKILLed with many requests in flight at once, of every kind.
A stream that has started ends with its API's error event (which the official
clients raise); a request that has not answered yet gets a 503 JSON error in
its API's shape: the server's trouble, which a client may retry (no other
instance could take the request over: migration is off by default, and there
is no other instance here).  Nothing hangs.  A worker's death is not a client
cancellation, so the cancellation counter stays at zero.
"""

from __future__ import annotations

import json
import signal
from typing import TYPE_CHECKING, Any

import openai
import pytest
import trio

from tests._memhttp import http_client

from .conftest import (
    CHAT_BODY,
    assert_anthropic_error,
    assert_openai_error,
    openai_client_leaves_generators,
    parse_sse,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterable, Awaitable, Callable

    import httpx

    from tests.e2e.conftest import Stack

    from .conftest import StartProcStack

pytestmark = pytest.mark.slow

BOUND = 20.0
"""Seconds by which every client must have its outcome: a timeout for a hang, not a
measure of promptness (each outcome's wording says what ended it)."""

LONG = 10_000

LOST = "stream ended before generation completed"
"""How the frontend words a worker lost mid-request."""


class Scenario:
    """Runs requests that each report ready, then kills the worker and collects the outcomes."""

    def __init__(self, running: Stack) -> None:
        self.running = running
        self.killed = False
        self.outcomes: list[str] = []
        self._tasks: list[tuple[str, Callable[[trio.Event], Awaitable[None]], trio.Event]] = []

    def add(self, name: str, run: Callable[[trio.Event], Awaitable[None]]) -> None:
        self._tasks.append((name, run, trio.Event()))

    async def _run(
        self, name: str, run: Callable[[trio.Event], Awaitable[None]], ready: trio.Event
    ) -> None:
        await run(ready)
        assert self.killed, f"{name} ended before the kill"
        self.outcomes.append(name)

    async def kill_worker_when_ready(self) -> None:
        with trio.fail_after(BOUND):
            async with trio.open_nursery() as nursery:
                for name, run, ready in self._tasks:
                    nursery.start_soon(self._run, name, run, ready)
                for _, _, ready in self._tasks:
                    await ready.wait()
                self.killed = True
                self.running.worker.signal(signal.SIGKILL)
        assert sorted(self.outcomes) == sorted(name for name, _, _ in self._tasks)


async def read_all(stream: AsyncIterable[object], ready: trio.Event, *, after: int) -> None:
    """Read ``stream`` to its end, setting ``ready`` after ``after`` items."""
    count = 0
    async for _ in stream:
        count += 1
        if count == after:
            ready.set()


async def wait_started(running: Stack, request_id: str, ready: trio.Event) -> None:
    await running.worker.wait_for("start", id=request_id)
    ready.set()


@openai_client_leaves_generators
@pytest.mark.usefixtures("anthropic_inline")
async def test_streams_in_flight_end_with_an_error_event(proc_stack: StartProcStack) -> None:
    import anthropic

    running = await proc_stack()
    scenario = Scenario(running)
    openai_client = openai.AsyncOpenAI(
        base_url=f"{running.url}/v1", api_key="unused", max_retries=0, timeout=10
    )
    anthropic_client = anthropic.AsyncAnthropic(
        base_url=running.url, api_key="unused", max_retries=0, timeout=10
    )

    async def sse_until_the_end(
        http: httpx.AsyncClient, path: str, body: dict[str, Any], ready: trio.Event
    ) -> str:
        events = 0
        text = ""
        async with http.stream("POST", path, json=body) as response:
            assert response.status_code == 200
            async for chunk in response.aiter_text():
                text += chunk
                events = text.count("data: ")
                if events >= 3:
                    ready.set()
        return text

    async def chat_over_httpx(ready: trio.Event) -> None:
        async with http_client(running.url, timeout=10) as http:
            body = {**CHAT_BODY, "max_tokens": LONG, "stream": True}
            text = await sse_until_the_end(http, "/v1/chat/completions", body, ready)
        events = parse_sse(text)
        assert "[DONE]" not in text
        assert events[-1].event == "error", events[-1]
        error = events[-1].json()
        assert set(error) == {"error"}
        assert error["error"]["type"] == "service_unavailable"  # retryable: the server's trouble
        assert LOST in error["error"]["message"]
        assert all(event.event is None for event in events[:-1])

    async def responses_over_httpx(ready: trio.Event) -> None:
        async with http_client(running.url, timeout=10) as http:
            body = {"model": "mock", "input": "hi", "max_output_tokens": LONG, "stream": True}
            text = await sse_until_the_end(http, "/v1/responses", body, ready)
        events = [event.json() for event in parse_sse(text)]
        assert [event["type"] for event in events[-2:]] == ["error", "response.failed"]
        assert events[-2]["code"] == "server_error"
        failed = events[-1]["response"]
        assert failed["status"] == "failed"
        assert failed["error"]["code"] == "server_error"
        # What was generated before the death is kept, with its usage.
        deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
        assert failed["output"][0]["content"][0]["text"] == deltas
        assert failed["usage"]["output_tokens"] >= 1

    async def chat_over_openai(ready: trio.Event) -> None:
        stream = await openai_client.chat.completions.create(
            model="mock", messages=[{"role": "user", "content": "hi"}], max_tokens=LONG, stream=True
        )
        with pytest.raises(openai.APIError) as raised:
            await read_all(stream, ready, after=3)
        assert not isinstance(raised.value, openai.APIConnectionError)
        assert isinstance(raised.value.body, dict)
        assert raised.value.body["type"] == "service_unavailable"
        assert LOST in raised.value.message

    async def completions_over_openai(ready: trio.Event) -> None:
        stream = await openai_client.completions.create(
            model="mock", prompt="hi", max_tokens=LONG, stream=True
        )
        with pytest.raises(openai.APIError) as raised:
            await read_all(stream, ready, after=3)
        assert isinstance(raised.value.body, dict)
        assert raised.value.body["type"] == "service_unavailable"

    async def messages_over_anthropic(ready: trio.Event) -> None:
        async with anthropic_client.messages.stream(
            model="mock", messages=[{"role": "user", "content": "hi"}], max_tokens=LONG
        ) as stream:
            with pytest.raises(anthropic.APIStatusError) as raised:
                await read_all(stream, ready, after=5)
        body: Any = raised.value.body
        assert body == {
            "type": "error",
            "error": {"type": "overloaded_error", "message": body["error"]["message"]},
        }
        assert LOST in body["error"]["message"]

    async with openai_client, anthropic_client:
        scenario.add("chat over httpx", chat_over_httpx)
        scenario.add("responses over httpx", responses_over_httpx)
        scenario.add("chat over openai", chat_over_openai)
        scenario.add("completions over openai", completions_over_openai)
        scenario.add("messages over anthropic", messages_over_anthropic)
        await scenario.kill_worker_when_ready()

    assert await running.metric("dynamo_frontend_requests_total", status="error") == 5
    assert await running.metric("dynamo_frontend_requests_total", error_type="Disconnected") == 5
    assert await running.metric("dynamo_frontend_model_cancellation_total") == 0
    assert await running.metric("dynamo_frontend_inflight_requests") == 0


async def test_requests_not_yet_answered_get_a_503_json_error(proc_stack: StartProcStack) -> None:
    running = await proc_stack()
    scenario = Scenario(running)

    def add_request(
        path: str, body: dict[str, Any], check: Callable[[httpx.Response], None]
    ) -> None:
        request_id = f"{path.rsplit('/', 1)[1]}-{'stream' if body.get('stream') else 'unary'}"

        async def run(ready: trio.Event) -> None:
            async with (
                http_client(running.url, timeout=10) as http,
                trio.open_nursery() as nursery,
            ):
                nursery.start_soon(wait_started, running, request_id, ready)
                response = await http.post(path, json=body, headers={"x-request-id": request_id})
            assert response.headers["x-request-id"] == request_id
            check(response)
            assert LOST in response.text

        scenario.add(request_id, run)

    def openai_503(response: httpx.Response) -> None:
        assert_openai_error(
            response, 503, "service_unavailable", param=None, code="service_unavailable"
        )

    def anthropic_503(response: httpx.Response) -> None:
        assert_anthropic_error(response, 503, "overloaded_error")

    prefill = {**CHAT_BODY, "model": "prefill", "max_tokens": LONG}
    add_request("/v1/chat/completions", prefill, openai_503)
    # A stream that has produced nothing yet is still a plain HTTP error, not SSE.
    add_request("/v1/completions", {"model": "prefill", "prompt": "hi", "stream": True}, openai_503)
    add_request("/v1/embeddings", {"model": "slow-embed", "input": "hi"}, openai_503)
    add_request("/v1/messages", prefill, anthropic_503)
    add_request("/v1/responses", {"model": "prefill", "input": "hi", "stream": True}, openai_503)
    await scenario.kill_worker_when_ready()

    assert await running.metric("dynamo_frontend_requests_total", error_type="Disconnected") == 5
    assert await running.metric("dynamo_frontend_model_cancellation_total") == 0
    assert json.loads((await _get(running, "/debug/requests")).text) == []


async def _get(running: Stack, path: str) -> httpx.Response:
    async with http_client(running.url) as http:
        return await http.get(path)
