"""Request ids and W3C trace context over HTTP, end to end.

``x-dynamo-request-id`` (Dynamo's header) and ``x-request-id`` both name the
request (the Dynamo one wins when both are sent); a ``traceparent`` makes the
request part of the client's trace, and the worker's context continues it in a
span of its own.  The rules themselves are tested sans I/O in tests/test_tracing.py.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import TYPE_CHECKING, Any

import pytest

from tests._memhttp import http_client

from .conftest import CHAT_BODY, RawConnection, raw_exchange, raw_post

if TYPE_CHECKING:
    import trio.testing

    from .conftest import StartStack

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
SPAN = re.compile(r"[0-9a-f]{16}")
TRACE_ID = re.compile(r"[0-9a-f]{32}")
BODY = {**CHAT_BODY, "max_tokens": 1}


async def test_request_ids_and_traces_reach_the_worker(
    stack: StartStack, autojump_clock: trio.testing.MockClock
) -> None:
    running = await stack(memory=True)
    dynamo_id = str(uuid.uuid4())
    async with http_client(running.url) as http:

        async def post(headers: dict[str, str], path: str = "/v1/chat/completions") -> Any:
            body = {"model": "mock-embed", "input": "hi"} if "embed" in path else BODY
            response = await http.post(path, json=body, headers=headers)
            assert response.status_code == 200, response.text
            return response

        # x-dynamo-request-id alone: it is the id, echoed under both names.
        response = await post({"x-dynamo-request-id": dynamo_id})
        assert response.headers["x-dynamo-request-id"] == dynamo_id
        assert response.headers["x-request-id"] == dynamo_id
        assert response.json()["id"] == f"chatcmpl-{dynamo_id}"
        await running.worker.wait_for("start", id=dynamo_id)

        # Both: the Dynamo header names the request; x-request-id is echoed as sent.
        response = await post({"x-request-id": "from-proxy", "x-dynamo-request-id": "job-7"})
        assert response.headers["x-dynamo-request-id"] == "job-7"
        assert response.headers["x-request-id"] == "from-proxy"
        await running.worker.wait_for("start", id="job-7")

        # A traceparent: the worker is in the client's trace, under the frontend's span.
        traced = await post(
            {"x-request-id": "traced", "traceparent": f"00-{TRACE}-{CLIENT_SPAN}-01"},
            "/v1/embeddings",
        )
        assert traced.headers["x-request-id"] == "traced"
        start = await running.worker.wait_for("start", id="traced")
        assert start["trace_id"] == TRACE
        assert SPAN.fullmatch(start["parent_span_id"]) and SPAN.fullmatch(start["span_id"])
        assert CLIENT_SPAN not in (start["parent_span_id"], start["span_id"])
        assert start["parent_span_id"] != start["span_id"]

        # No traceparent, or an invalid one (W3C: ignored, not an error): a new trace each.
        traces = set()
        for n, headers in enumerate(
            [
                {},
                {"traceparent": "garbage"},
                {"traceparent": f"00-{TRACE.upper()}-{CLIENT_SPAN}-01"},
            ]
        ):
            await post({**headers, "x-request-id": f"untraced-{n}"})
            start = await running.worker.wait_for("start", id=f"untraced-{n}")
            assert TRACE_ID.fullmatch(start["trace_id"]) and start["trace_id"] != TRACE
            assert SPAN.fullmatch(start["parent_span_id"])  # the frontend's span
            traces.add(start["trace_id"])
        assert len(traces) == 3


async def test_an_in_flight_request_is_listed_with_its_trace(
    stack: StartStack, autojump_clock: trio.testing.MockClock
) -> None:
    running = await stack(memory=True)
    body = json.dumps({**CHAT_BODY, "model": "prefill", "stream": True}).encode()
    connection = await RawConnection.open(running.url)
    await connection.send(
        raw_post(
            "/v1/chat/completions",
            body,
            b"x-request-id: stuck",
            f"traceparent: 00-{TRACE}-{CLIENT_SPAN}-01".encode(),
        )
    )
    start = await running.worker.wait_for("start", id="stuck")
    async with http_client(running.url) as http:
        [tree] = (await http.get("/debug/requests")).json()
        assert (tree["id"], tree["trace_id"]) == ("stuck", TRACE)
        [worker_tree] = (await http.get(f"{running.worker_status}/debug/requests")).json()
        assert (worker_tree["id"], worker_tree["trace_id"]) == ("stuck", start["trace_id"])
    await connection.aclose()
    await running.worker.wait_for("exit", id="stuck")


@pytest.mark.parametrize(
    ("header", "value"),
    [("x-dynamo-request-id", b"has space"), ("x-dynamo-request-id", b"x" * 257)],
)
async def test_an_invalid_dynamo_request_id_is_refused_with_400(
    stack: StartStack, header: str, value: bytes
) -> None:
    running = await stack(memory=True)
    body = json.dumps(BODY).encode()
    response = await raw_exchange(
        running.url,
        raw_post("/v1/chat/completions", body, header.encode() + b": " + value),
    )
    assert response.status == 400, response.raw
    error = json.loads(response.body)["error"]
    assert error["param"] == header and header in error["message"]
    assert value not in response.raw  # never reflected
    assert uuid.UUID(response.headers[b"x-dynamo-request-id"].decode()).version == 4
    assert not any(e["event"] == "start" for e in running.worker.events)
