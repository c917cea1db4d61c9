"""SIGTERM on the frontend: it drains like a worker, then exits 0.

The drain: new requests are refused with a 503 and ``Connection: close``,
``/health`` turns 503 and ``/metrics`` stays scrapeable; requests in flight may
finish for up to ``DYN_SHUTDOWN_GRACE_SECS`` (2 s in the tests), and do, with
their normal, complete ending; those still running then are killed (reason
``shutdown``, which the worker sees) and end with what a client recognises as
a failure: a 503 (OpenAI ``service_unavailable``, Anthropic
``overloaded_error``), the stream's error event, or the Responses API's
``error`` + ``response.failed``; never a ``finish_reason`` that reads as a
complete answer.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest
import trio

from tests._memhttp import http_client
from tests.e2e.conftest import scrape

from ._faults import LiveStream, expected_output
from .conftest import CHAT_BODY, assert_openai_error, openai_client_leaves_generators, parse_sse

if TYPE_CHECKING:
    from .conftest import StartProcStack

pytestmark = pytest.mark.slow

GRACE = 2.0
"""``DYN_SHUTDOWN_GRACE_SECS`` in the tests' environment."""

LONG = 10_000


async def _during_the_drain(url: str) -> dict[str, Any]:
    """What the frontend answers while it drains: health, metrics, a new request.

    Of ``--http-workers``' processes, one with nothing in flight is done draining at once
    and closes its idle connections as it exits: a request sent on one as it closes is
    sent again on a new connection, as a client does after a keep-alive close."""

    async def ask(method: str, path: str, **options: Any) -> httpx.Response:
        try:
            return await http.request(method, path, **options)
        except httpx.RemoteProtocolError:  # (never answered: nothing was done)
            return await http.request(method, path, **options)

    async with http_client(url, timeout=5) as http:
        with trio.fail_after(GRACE):
            while (await ask("GET", "/health")).status_code == 200:  # noqa: ASYNC110
                await trio.sleep(0.02)
        health = await ask("GET", "/health")
        metrics = await ask("GET", "/metrics")
        listed = await ask("GET", "/debug/requests")
        refused = await ask("POST", "/v1/chat/completions", json=CHAT_BODY)
    return {"health": health, "metrics": metrics, "listed": listed, "refused": refused}


@openai_client_leaves_generators
@pytest.mark.parametrize("flags", [(), ("--http-workers", "2")], ids=["one process", "workers"])
async def test_sigterm_lets_requests_in_flight_finish_and_exits_0(
    proc_stack: StartProcStack, flags: tuple[str, ...]
) -> None:
    running = await proc_stack(*flags)
    # 60 tokens at 20 ms: well within the grace.
    chat = {**CHAT_BODY, "max_tokens": 60, "stream": True}
    live = LiveStream("/v1/chat/completions", chat, "chat")
    results: dict[str, Any] = {}

    async def unary() -> None:
        async with http_client(running.url, timeout=10) as http:
            results["unary"] = await http.post(
                "/v1/completions", json={"model": "mock", "prompt": "hi", "max_tokens": 50}
            )

    async def openai_stream() -> None:
        client = openai.AsyncOpenAI(base_url=f"{running.url}/v1", api_key="-", max_retries=0)
        async with client:
            stream = await client.chat.completions.create(
                model="mock", messages=CHAT_BODY["messages"], max_tokens=60, stream=True
            )
            results["openai"] = [chunk async for chunk in stream]

    async with http_client(running.url, timeout=10) as http:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(live.run, http)
            nursery.start_soon(unary)
            nursery.start_soon(openai_stream)
            await live.wait_tokens(3)
            with trio.fail_after(10):  # all three are in flight on the worker
                while sum(e["event"] == "start" for e in running.worker.events) < 3:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            signalled = trio.current_time()
            running.frontend.signal(signal.SIGTERM)
            during = await _during_the_drain(running.url)
        finished = trio.current_time() - signalled
    assert await running.frontend.wait_exit(within=GRACE + 3) == 0
    exited = trio.current_time() - signalled
    print(f"drain: in-flight requests done {finished:.2f}s, process exited {exited:.2f}s")

    # Every request in flight ended as if nothing had happened.
    text, _ = await expected_output(live.path, live.body)
    assert (live.done, live.error, live.text) == (True, None, text)
    assert results["unary"].status_code == 200
    assert results["unary"].json()["usage"]["completion_tokens"] == 50
    assert results["openai"][-1].choices[0].finish_reason == "length"

    # While it drained: unhealthy, scrapeable, refusing work retryably.
    assert during["health"].status_code == 503
    assert during["metrics"].status_code == 200
    assert "dynamo_frontend_inflight_requests" in during["metrics"].text
    # Every request in flight is listed, whichever process holds it.
    assert len(during["listed"].json()) == 3, during["listed"].json()
    refused = during["refused"]
    assert_openai_error(refused, 503, "service_unavailable", code="service_unavailable")
    assert refused.headers["connection"] == "close"
    assert "shutting down" in refused.json()["error"]["message"]

    # The worker saw no cancellation: nothing was stopped or killed.
    assert await scrape(running.worker_status, "dynamo_component_cancellation_total") == 0


@openai_client_leaves_generators
@pytest.mark.usefixtures("anthropic_inline")
async def test_requests_still_running_after_the_grace_end_recognisably(
    proc_stack: StartProcStack,
) -> None:
    import anthropic

    running = await proc_stack()
    results: dict[str, Any] = {}
    started = trio.Semaphore(0)

    async def sse(name: str, path: str, body: dict[str, Any]) -> None:
        text = ""
        released = False
        async with (
            http_client(running.url, timeout=20) as http,
            http.stream("POST", path, json=body, headers={"x-request-id": name}) as response,
        ):
            async for chunk in response.aiter_text():
                text += chunk
                if not released and text.count("data: ") >= 4:  # events come in batches
                    released = True
                    started.release()
        results[name] = text

    async def unary(name: str, path: str, body: dict[str, Any]) -> None:
        async with http_client(running.url, timeout=20) as http:
            results[name] = await http.post(path, json=body, headers={"x-request-id": name})

    async def anthropic_stream() -> None:
        client = anthropic.AsyncAnthropic(base_url=running.url, api_key="-", max_retries=0)
        async with client:
            try:
                async with client.messages.stream(
                    model="mock", messages=CHAT_BODY["messages"], max_tokens=LONG
                ) as stream:
                    count = 0
                    async for _ in stream:
                        count += 1
                        if count == 4:
                            started.release()
            except anthropic.APIStatusError as exc:
                results["anthropic"] = exc

    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            sse, "chat", "/v1/chat/completions", {**CHAT_BODY, "max_tokens": LONG, "stream": True}
        )
        nursery.start_soon(
            sse, "responses", "/v1/responses", {"model": "mock", "input": "hi", "stream": True,
                                                "max_output_tokens": LONG}
        )  # fmt: skip
        nursery.start_soon(anthropic_stream)
        nursery.start_soon(
            unary, "unary", "/v1/chat/completions", {**CHAT_BODY, "model": "prefill"}
        )
        for _ in range(3):
            await started.acquire()
        await running.worker.wait_for("start", id="unary")
        signalled = trio.current_time()
        running.frontend.signal(signal.SIGTERM)
    ended = trio.current_time() - signalled
    assert await running.frontend.wait_exit(within=5) == 0
    exited = trio.current_time() - signalled
    print(f"drain past the grace: requests ended {ended:.2f}s, process exited {exited:.2f}s")
    assert ended >= GRACE  # they had the whole grace

    # Chat: an error event (which the openai client raises), no [DONE].
    events = parse_sse(results["chat"])
    assert "[DONE]" not in results["chat"]
    assert events[-1].event == "error"
    error = events[-1].json()["error"]
    assert (error["type"], error["code"]) == ("service_unavailable", "service_unavailable")
    assert "shut down" in error["message"]
    assert all(e.json()["choices"][0]["finish_reason"] is None for e in events[:-1] if e.data)

    # Responses: error + response.failed, the partial output kept, with its usage.
    typed = [event.json() for event in parse_sse(results["responses"])]
    assert [event["type"] for event in typed[-2:]] == ["error", "response.failed"]
    assert typed[-1]["response"]["status"] == "failed"
    assert typed[-1]["response"]["usage"]["output_tokens"] >= 3

    # Anthropic: its overloaded error (a retryable status for its client).
    failure = results["anthropic"]
    assert isinstance(failure, anthropic.APIStatusError)
    body: Any = failure.body
    assert body["error"]["type"] == "overloaded_error"

    # Unary: a 503 JSON error.
    assert_openai_error(results["unary"], 503, "service_unavailable")

    # Each worker handler was killed for the shutdown, and counted once as cancelled.
    for name in ("chat", "responses", "unary"):
        exit_event = await running.worker.wait_for("exit", id=name)
        assert (exit_event["state"], exit_event["reason"]) == ("KILLED", "shutdown"), exit_event
    status = running.worker_status
    assert await scrape(status, "dynamo_component_cancelled_requests_total", reason="shutdown") == 4
    assert await scrape(status, "dynamo_component_inflight_requests") == 0
    assert running.worker.process.returncode is None
