"""``x-request-id``: honoured end to end, generated when absent, refused when invalid (SPEC §8.10).

A valid id (1 to 256 printable ASCII characters, no spaces) is the request's
context id: the response echoes it, the response body's id is built from it,
and the worker's handler sees it as ``context.id()``.
"""

from __future__ import annotations

import json
import string
import uuid
from typing import TYPE_CHECKING, Any

import pytest
import trio
import trio.testing

from tests._memhttp import http_client

from .conftest import (
    CHAT_BODY,
    RawConnection,
    assert_no_traceback,
    parse_sse,
    raw_exchange,
    raw_post,
)

if TYPE_CHECKING:
    from tests._serving import Events

    from .conftest import StartStack

LONGEST = "x" * 256
PUNCTUATION = string.ascii_letters + string.digits + string.punctuation


async def test_a_valid_request_id_is_echoed_and_is_the_workers_context_id(
    stack: StartStack, autojump_clock: trio.testing.MockClock
) -> None:
    running = await stack(memory=True)
    # (x-request-id, route, body, the id the response body carries; None for none)
    cases: list[tuple[str, str, dict[str, Any], str | None]] = [
        ("chat-1", "/v1/chat/completions", {**CHAT_BODY, "max_tokens": 2}, "chatcmpl-chat-1"),
        (PUNCTUATION, "/v1/messages", {**CHAT_BODY, "max_tokens": 2}, f"msg_{PUNCTUATION}"),
        (
            LONGEST,
            "/v1/completions",
            {"model": "mock", "prompt": "hi", "max_tokens": 2},
            f"cmpl-{LONGEST}",
        ),
        ("embed-1", "/v1/embeddings", {"model": "mock-embed", "input": "hi"}, None),
        (
            "stream-1",
            "/v1/responses",
            {"model": "mock", "input": "hi", "max_output_tokens": 2, "stream": True},
            None,
        ),
    ]
    async with http_client(running.url) as http:
        for request_id, path, body, body_id in cases:
            response = await http.post(path, json=body, headers={"x-request-id": request_id})
            assert response.status_code == 200, response.text
            assert response.headers["x-request-id"] == request_id
            if body_id is not None:
                assert response.json()["id"] == body_id
            start = await running.worker.wait_for("start", id=request_id)
            assert start["model"] == body["model"]
    events = parse_sse(response.text)
    assert events[0].json()["response"]["id"] == "resp_stream-1"


async def test_a_missing_request_id_is_replaced_by_a_fresh_uuid(
    stack: StartStack, autojump_clock: trio.testing.MockClock
) -> None:
    running = await stack(memory=True)
    async with http_client(running.url) as http:
        first = await http.post("/v1/chat/completions", json={**CHAT_BODY, "max_tokens": 1})
        second = await http.post(
            "/v1/chat/completions", json={**CHAT_BODY, "max_tokens": 1, "stream": True}
        )
    ids = []
    for response in (first, second):
        assert response.status_code == 200, response.text
        request_id = response.headers["x-request-id"]
        assert str(uuid.UUID(request_id)) == request_id
        assert uuid.UUID(request_id).version == 4
        await running.worker.wait_for("start", id=request_id)
        ids.append(request_id)
    assert ids[0] != ids[1]
    assert first.json()["id"] == f"chatcmpl-{ids[0]}"
    assert parse_sse(second.text)[0].json()["id"] == f"chatcmpl-{ids[1]}"


@pytest.mark.parametrize(
    "path",
    ["/v1/chat/completions", "/v1/messages"],
)
async def test_an_invalid_request_id_is_refused_with_400_and_not_echoed(
    stack: StartStack, path: str
) -> None:
    running = await stack(memory=True)
    invalid = [
        b"x" * 257,
        b"has space",
        b"tab\there",
        b"ctl\x01char",
        b"del\x7f",
        b"caf\xc3\xa9",
    ]
    body = json.dumps({**CHAT_BODY, "max_tokens": 1}).encode()
    for request_id in invalid:
        response = await raw_exchange(
            running.url, raw_post(path, body, b"x-request-id: " + request_id)
        )
        raw = response.raw
        assert response.status == 400, (request_id, raw)
        assert response.headers[b"content-type"] == b"application/json"
        # A refused id is never reflected into the response: it gets a fresh one.
        assert request_id not in raw, raw
        assert uuid.UUID(response.headers[b"x-request-id"].decode()).version == 4
        assert_no_traceback(response.body.decode())
        error = json.loads(response.body)
        if path == "/v1/messages":
            assert error["type"] == "error"
            assert error["error"]["type"] == "invalid_request_error"
            assert "x-request-id" in error["error"]["message"]
        else:
            assert error["error"]["type"] == "invalid_request_error"
            assert error["error"]["param"] == "x-request-id"
    # None of them reached the worker; the frontend still serves.
    async with http_client(running.url) as http:
        served = await http.post(path, json={**CHAT_BODY, "max_tokens": 1})
    assert served.status_code == 200, served.text
    await running.worker.wait_for("start", id=served.headers["x-request-id"])
    assert [e["id"] for e in running.worker.events if e["event"] == "start"] == [
        served.headers["x-request-id"]
    ]


async def wait_for_count(worker: Events, event: str, count: int, **fields: Any) -> None:
    with trio.fail_after(5):
        while (
            sum(
                e.get("event") == event and all(e.get(k) == v for k, v in fields.items())
                for e in worker.events
            )
            < count
        ):
            await worker.changed()


async def test_requests_sharing_an_id_are_still_independent(
    stack: StartStack, autojump_clock: trio.testing.MockClock
) -> None:
    running = await stack(memory=True)
    body = json.dumps({**CHAT_BODY, "model": "prefill"}).encode()
    first = await RawConnection.open(running.url)
    second = await RawConnection.open(running.url)
    for connection in (first, second):
        await connection.send(raw_post("/v1/chat/completions", body, b"x-request-id: shared"))
    await wait_for_count(running.worker, "start", 2, id="shared")
    async with http_client(running.url) as http:
        assert [t["id"] for t in (await http.get("/debug/requests")).json()] == ["shared"] * 2
        # One hangs up: only its own work is cancelled.
        await first.aclose()
        await wait_for_count(running.worker, "exit", 1, id="shared")
        # A request after the hang-up, to the end: whatever the hang-up did has reached
        # the worker by then (the frames of one connection are in order).
        after = await http.post(
            "/v1/chat/completions",
            json={**CHAT_BODY, "max_tokens": 1},
            headers={"x-request-id": "after"},
        )
        assert after.status_code == 200, after.text
        await running.worker.wait_for("exit", id="after")
        assert [e["event"] for e in running.worker.events if e.get("id") == "shared"] == [
            "start",
            "start",
            "exit",
        ]
        [survivor] = (await http.get("/debug/requests")).json()
        assert (survivor["id"], survivor["state"]) == ("shared", "live")
        assert len((await http.get(f"{running.worker_status}/debug/requests")).json()) == 1
        await second.aclose()
        await wait_for_count(running.worker, "exit", 2, id="shared")
    assert await running.metric("dynamo_frontend_model_cancellation_total") == 2
    assert await running.metric("dynamo_component_cancellation_total", worker=True) == 2
