"""``/health``, ``/live``, ``/metrics`` and ``/debug/requests`` on the frontend's port (SPEC §7)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import trio
import trio.testing
from prometheus_client.parser import text_string_to_metric_families

from tests._memhttp import http_client, open_connection

from .conftest import CHAT_BODY, MODELS, raw_post

if TYPE_CHECKING:
    from tests._serving import Served

    from .conftest import StartStack


async def test_health_and_live(stack: StartStack, autojump_clock: trio.testing.MockClock) -> None:
    running = await stack(memory=True)
    async with http_client(running.url) as http:
        health = await http.get("/health")
        live = await http.get("/live")
    for response in (health, live):
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/json"
    body = health.json()
    assert set(body) == {"status", "uptime", "models"}
    assert body["status"] == "healthy"
    assert 0 < body["uptime"] < 60
    assert body["models"] == sorted(MODELS)
    assert live.json() == {"status": "live"}


# (route, body, endpoint label, request_type label, completion tokens)
SUCCESSES: list[tuple[str, dict[str, Any], str, str, int]] = [
    ("/v1/chat/completions", {**CHAT_BODY, "max_tokens": 2}, "chat_completions", "unary", 2),
    (
        "/v1/chat/completions",
        {**CHAT_BODY, "max_tokens": 3, "stream": True},
        "chat_completions",
        "stream",
        3,
    ),
    (
        "/v1/completions",
        {"model": "mock", "prompt": "a", "max_tokens": 4},
        "completions",
        "unary",
        4,
    ),
    (
        "/v1/completions",
        {"model": "mock", "prompt": "a", "max_tokens": 1, "stream": True},
        "completions",
        "stream",
        1,
    ),
    ("/v1/embeddings", {"model": "mock-embed", "input": ["a", "b"]}, "embeddings", "unary", 0),
    (
        "/v1/responses",
        {"model": "mock", "input": "a", "max_output_tokens": 2, "stream": True},
        "responses",
        "stream",
        2,
    ),
    ("/v1/messages", {**CHAT_BODY, "max_tokens": 5}, "anthropic_messages", "unary", 5),
]


async def test_metrics_count_each_successful_request_once(
    stack: StartStack, autojump_clock: trio.testing.MockClock
) -> None:
    running = await stack(memory=True)
    async with http_client(running.url) as http:
        for path, body, *_ in SUCCESSES:
            assert (await http.post(path, json=body)).status_code == 200
        exposition = await http.get("/metrics")

    assert exposition.status_code == 200
    assert exposition.headers["content-type"].startswith("text/plain; version=0.0.4")
    families = {family.name for family in text_string_to_metric_families(exposition.text)}
    assert {
        "dynamo_frontend_requests",
        "dynamo_frontend_inflight_requests",
        "dynamo_frontend_request_duration_seconds",
        "dynamo_frontend_time_to_first_token_seconds",
        "dynamo_frontend_output_tokens",
        "dynamo_frontend_model_cancellation",
    } <= families, families

    assert await running.metric("dynamo_frontend_requests_total", status="success") == len(
        SUCCESSES
    )
    assert await running.metric("dynamo_frontend_requests_total") == len(SUCCESSES)
    for path, _, endpoint, request_type, _ in SUCCESSES:
        labels: dict[str, Any] = {
            "endpoint": endpoint,
            "request_type": request_type,
            "status": "success",
        }
        expected = sum(1 for s in SUCCESSES if (s[2], s[3]) == (endpoint, request_type))
        assert await running.metric("dynamo_frontend_requests_total", **labels) == expected, path
    assert await running.metric("dynamo_frontend_output_tokens_total", model="mock") == sum(
        s[4] for s in SUCCESSES
    )
    assert await running.metric("dynamo_frontend_request_duration_seconds_count") == len(SUCCESSES)
    assert await running.metric("dynamo_frontend_inflight_requests") == 0
    assert await running.metric("dynamo_frontend_model_cancellation_total") == 0
    assert await running.metric("dynamo_component_cancellation_total", worker=True) == 0


async def debug_requests(running: Served) -> list[dict[str, Any]]:
    async with http_client(running.url) as http:
        response = await http.get("/debug/requests")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    trees: list[dict[str, Any]] = response.json()
    return trees


async def test_debug_requests_lists_requests_in_flight_until_they_end(
    stack: StartStack, autojump_clock: trio.testing.MockClock
) -> None:
    running = await stack(memory=True)
    unary = json.dumps({**CHAT_BODY, "model": "prefill"}).encode()
    streamed = json.dumps({"model": "prefill", "prompt": "hi", "stream": True}).encode()
    clients = []
    for path, body, request_id in (
        ("/v1/chat/completions", unary, "hang-unary"),
        ("/v1/completions", streamed, "hang-stream"),
    ):
        client = await open_connection(running.url)
        clients.append(client)
        await client.send_all(raw_post(path, body, f"x-request-id: {request_id}".encode()))
        await running.worker.wait_for("start", id=request_id)

    trees = sorted(await debug_requests(running), key=lambda tree: tree["id"])
    assert [tree["id"] for tree in trees] == ["hang-stream", "hang-unary"]
    for tree, (route, kind) in zip(
        trees, [("completions", "stream"), ("chat_completions", "unary")], strict=True
    ):
        assert tree["state"] == "live"
        assert tree["reason"] is None
        assert tree["age_s"] > 0
        assert tree["attributes"] == {"model": "prefill", "route": route, "kind": kind}
        # The call to the worker: same id, which endpoint, which instance.
        [call] = tree["children"]
        assert call["id"] == tree["id"]
        assert call["state"] == "live"
        assert call["attributes"]["endpoint"] == "dynamo/prefill/generate"
        assert int(call["attributes"]["instance"], 16) > 0
        assert call["children"] == []

    for client in clients:
        await client.aclose()
    for request_id in ("hang-unary", "hang-stream"):
        await running.worker.wait_for("exit", id=request_id)
    with trio.fail_after(2):
        while await debug_requests(running):  # noqa: ASYNC110 - polling another process over HTTP
            await trio.sleep(0.02)
    assert await running.metric("dynamo_frontend_model_cancellation_total") == 2
