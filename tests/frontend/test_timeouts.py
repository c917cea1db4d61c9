"""Timeouts: a silent worker (``DYN_HTTP_BACKEND_STREAM_TIMEOUT_SECS``) and a request's
deadline (``x-request-timeout``, capped by ``DYN_HTTP_MAX_REQUEST_TIMEOUT_SECS``).

Both end the request with a 504 (an error event once streaming), kill the
worker's handler with their own reason (``inactivity``, ``deadline``), and are
counted once: an error on the frontend, one cancellation on the worker, never
a client cancellation.  The deadline travels to the worker as time remaining.
Served over memory streams; the silent worker's test on the autojump clock (a
request's deadline is on ``time.monotonic()``, which that clock does not move).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio
import trio.testing

from tests._memhttp import http_client
from tests._metrics import scrape

from ._faults import LiveStream
from .conftest import CHAT_BODY, assert_anthropic_error, assert_openai_error

if TYPE_CHECKING:
    from .conftest import StartStack


async def _frontend_is_idle(url: str) -> None:
    with trio.fail_after(5):
        while await scrape(url, "dynamo_frontend_inflight_requests"):  # noqa: ASYNC110
            await trio.sleep(0.05)


async def test_a_silent_worker_is_killed_for_inactivity(
    stack: StartStack, autojump_clock: trio.testing.MockClock
) -> None:
    timeout = 1.0
    running = await stack(
        inter_token_latency_ms=10,
        frontend_env={"DYN_HTTP_BACKEND_STREAM_TIMEOUT_SECS": str(timeout)},
        memory=True,
    )
    worker, url = running.worker, running.url
    async with http_client(url, timeout=30) as http:
        # Unary, before any token: a 504.
        started = trio.current_time()
        response = await http.post(
            "/v1/chat/completions",
            json={**CHAT_BODY, "model": "prefill"},
            headers={"x-request-id": "silent"},
        )
        took = trio.current_time() - started
        assert_openai_error(response, 504, "timeout_error", code="timeout")
        assert took >= timeout, took  # not before the timeout (its reason is checked next)
        exit_event = await worker.wait_for("exit", id="silent")
        assert (exit_event["state"], exit_event["reason"]) == ("KILLED", "inactivity")

        # Anthropic's shape for the same failure.
        response = await http.post(
            "/v1/messages",
            json={**CHAT_BODY, "model": "prefill", "max_tokens": 10},
            headers={"x-request-id": "silent-messages"},
        )
        assert_anthropic_error(response, 504, "timeout_error")

        # Mid-stream: three tokens, then silence; the stream ends with a 504 error event.
        stalled = LiveStream(
            "/v1/chat/completions", {**CHAT_BODY, "model": "stall", "stream": True}, "stalled"
        )
        started = trio.current_time()
        await stalled.run(http)
        took = trio.current_time() - started
        assert stalled.text == " t0 t1 t2"
        assert stalled.error is not None
        assert (stalled.error["error"]["type"], stalled.error["error"]["code"]) == (
            "timeout_error",
            "timeout",
        )
        assert not stalled.done
        assert took >= timeout, took
        exit_event = await worker.wait_for("exit", id="stalled")
        assert (exit_event["state"], exit_event["reason"]) == ("KILLED", "inactivity")

        # A worker that keeps talking is never cut, however long it takes.
        response = await http.post(
            "/v1/chat/completions",
            json={**CHAT_BODY, "max_tokens": 150},  # 150 tokens at 10 ms: 1.5 s > timeout
            headers={"x-request-id": "talking"},
        )
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] == 150

    await _frontend_is_idle(url)
    assert await scrape(url, "dynamo_frontend_requests_total", error_type="ResponseTimeout") == 3
    assert await scrape(url, "dynamo_frontend_requests_total", status="success") == 1
    assert await scrape(url, "dynamo_frontend_model_cancellation_total") == 0
    status = running.worker_status
    assert await scrape(status, "dynamo_component_cancellation_total") == 3
    assert (
        await scrape(status, "dynamo_component_cancelled_requests_total", reason="inactivity") == 3
    )


async def test_a_request_deadline_travels_to_the_worker_and_ends_the_request(
    stack: StartStack,
) -> None:
    running = await stack(inter_token_latency_ms=20, memory=True)
    worker, url = running.worker, running.url
    async with http_client(url, timeout=30) as http:
        started = trio.current_time()
        response = await http.post(
            "/v1/chat/completions",
            json={**CHAT_BODY, "model": "prefill"},
            headers={"x-request-id": "deadline", "x-request-timeout": "1.5"},
        )
        took = trio.current_time() - started
        assert_openai_error(response, 504, "timeout_error", code="timeout")
        assert "deadline" in response.json()["error"]["message"]
        assert took >= 1.5, took
        start = await worker.wait_for("start", id="deadline")
        assert 0 < start["remaining"] <= 1.5  # the worker knows its time left
        exit_event = await worker.wait_for("exit", id="deadline")
        assert (exit_event["state"], exit_event["reason"]) == ("KILLED", "deadline")

        # Mid-stream: the stream ends with a 504 error event, what came before intact.
        live = LiveStream(
            "/v1/chat/completions", {**CHAT_BODY, "max_tokens": 10_000, "stream": True}, "mid"
        )
        await live.run(http, headers={"x-request-timeout": "1"})
        assert live.tokens >= 10
        assert live.error is not None
        assert live.error["error"]["type"] == "timeout_error"
        assert not live.done
        exit_event = await worker.wait_for("exit", id="mid")
        assert (exit_event["state"], exit_event["reason"]) == ("KILLED", "deadline")

        # A deadline the request meets changes nothing.
        response = await http.post(
            "/v1/completions",
            json={"model": "mock", "prompt": "hi", "max_tokens": 5},
            headers={"x-request-timeout": "30"},
        )
        assert response.status_code == 200, response.text

        # Not a positive number of seconds: a 400 naming the header, before any work.
        for bad in ("soon", "0", "-1", "nan", "inf", "1e999", ""):
            response = await http.post(
                "/v1/chat/completions",
                json=CHAT_BODY,
                headers={"x-request-timeout": bad, "x-request-id": "bad"},
            )
            assert_openai_error(response, 400, "invalid_request_error", param="x-request-timeout")

    await _frontend_is_idle(url)
    assert await scrape(url, "dynamo_frontend_requests_total", error_type="ResponseTimeout") == 2
    assert await scrape(url, "dynamo_frontend_model_cancellation_total") == 0
    status = running.worker_status
    assert await scrape(status, "dynamo_component_cancelled_requests_total", reason="deadline") == 2
    assert not [e for e in worker.events if e.get("id") == "bad"]


async def test_the_server_maximum_caps_every_deadline(stack: StartStack) -> None:
    # Deadlines long enough that a busy machine still gets each request to the worker in time.
    running = await stack("--max-request-timeout", "3", inter_token_latency_ms=10, memory=True)
    worker, url = running.worker, running.url
    async with http_client(url, timeout=30) as http, trio.open_nursery() as nursery:
        for request_id, headers in (
            ("asks-more", {"x-request-timeout": "60"}),
            ("asks-nothing", {}),
            ("asks-less", {"x-request-timeout": "2"}),
        ):

            async def post(request_id: str, headers: dict[str, str]) -> None:
                response = await http.post(
                    "/v1/chat/completions",
                    json={**CHAT_BODY, "model": "prefill"},
                    headers={"x-request-id": request_id, **headers},
                )
                assert_openai_error(response, 504, "timeout_error")

            nursery.start_soon(post, request_id, headers)
    for request_id, most in (("asks-more", 3.0), ("asks-nothing", 3.0), ("asks-less", 2.0)):
        start = await worker.wait_for("start", id=request_id)
        assert 0 < start["remaining"] <= most, (request_id, start)
        exit_event = await worker.wait_for("exit", id=request_id)
        assert exit_event["reason"] == "deadline"
