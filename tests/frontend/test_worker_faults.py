"""What a broken or hostile worker can make the frontend answer, in one process.

A worker's failure is the gateway's trouble, not the client's request: it is
answered 502 with an API error body, its text bounded, and an end the frontend
did not ask for is never a normal finish.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
import trio

from dynamo_trio import DynamoError
from dynamo_trio._config import FrontendConfig
from dynamo_trio.llm import MAX_ERROR_MESSAGE

from ._inprocess import CHAT, chat, frontend_with_worker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable


async def stops_itself(request: Any, context: Any) -> AsyncIterator[Any]:
    """Two tokens, then the worker stops the stream on its own: ``end stopped``."""
    for token in ("a", "b"):
        await trio.lowlevel.checkpoint()
        yield {"text": token, "token_ids": [1]}
    context.stop_generating()


def sse_events(body: bytes) -> list[str]:
    return [line[6:] for line in body.decode().splitlines() if line.startswith("data: ")]


async def test_a_stream_the_worker_stopped_unasked_is_not_a_complete_unary_answer(nursery):
    app = await frontend_with_worker(nursery, stops_itself)
    response = await app.test_client().post(CHAT, json=chat())
    body = await response.get_json()
    assert response.status_code != 200, body
    assert response.status_code >= 500, body
    assert set(body) == {"error"}, body


async def test_a_stream_the_worker_stopped_unasked_ends_with_an_error_event(nursery):
    app = await frontend_with_worker(nursery, stops_itself)
    response = await app.test_client().post(CHAT, json=chat(stream=True))
    events = sse_events(await response.get_data(as_text=False))
    assert '"finish_reason":"stop"' not in "".join(events), events
    assert "[DONE]" not in events, events
    assert '"error"' in events[-1], events


async def test_a_stream_the_worker_stopped_unasked_moves_when_migration_is_on(nursery):
    calls: list[str] = []

    async def first_stops_itself(request: Any, context: Any) -> AsyncIterator[Any]:
        calls.append("stops" if not calls else "completes")
        if calls[-1] == "stops":
            async for item in stops_itself(request, context):
                yield item
            return
        done = len(request.get("continuation", {}).get("token_ids", []))
        for _ in range(done, 4):
            yield {"text": "x", "token_ids": [1]}
        yield {"text": "", "finish_reason": "length"}

    app = await frontend_with_worker(
        nursery, first_stops_itself, config=FrontendConfig(migration_limit=1), instances=2
    )
    response = await app.test_client().post(CHAT, json=chat(max_tokens=4))
    body = await response.get_json()
    assert response.status_code == 200, body
    assert body["choices"][0]["message"]["content"] == "abxx"
    assert body["choices"][0]["finish_reason"] == "length"
    assert calls == ["stops", "completes"]


# ----------------------------------------------------------------- a worker's failures: 502


class NotACode(DynamoError):
    error_type = "NoSuchErrorCode"


class EmptyCode(DynamoError):
    error_type = ""


LONG = "w" * 5000


def yielding(*items: Any) -> Callable[..., Any]:
    async def handler(request: Any) -> AsyncIterator[Any]:
        for item in items:
            await trio.lowlevel.checkpoint()
            yield item

    return handler


def raising(error: BaseException) -> Callable[..., Any]:
    async def handler(request: Any) -> AsyncIterator[Any]:
        await trio.lowlevel.checkpoint()
        raise error
        yield  # an async generator

    return handler


WORKER_FAULTS = {
    "data-null": yielding(None),
    "data-a-string": yielding("text"),
    "data-a-list": yielding([1, 2]),
    "text-not-a-string": yielding({"text": 5}),
    "unknown-finish-reason": yielding({"text": "a", "finish_reason": "bogus"}),
    "finish-reason-error": yielding({"finish_reason": "error"}),
    "finish-reason-error-long": yielding({"finish_reason": "error", "error": LONG}),
    "err-unknown-code": raising(NotACode("strange")),
    "err-empty-code": raising(EmptyCode("")),
    "err-unknown-code-long": raising(NotACode(LONG)),
}


@pytest.mark.parametrize("fault", WORKER_FAULTS)
@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
async def test_a_workers_failure_is_a_502_with_an_api_body_and_bounded_text(
    nursery, fault: str, stream: bool
):
    app = await frontend_with_worker(nursery, WORKER_FAULTS[fault])
    response = await app.test_client().post(CHAT, json=chat(stream=stream))
    body = await response.get_json()
    assert response.status_code == 502, body
    assert set(body) == {"error"}, body
    error = body["error"]
    assert error["type"] == "bad_gateway", error
    assert error["code"] == "bad_gateway", error
    assert 0 < len(error["message"]) <= MAX_ERROR_MESSAGE, len(error["message"])
    assert LONG not in error["message"]


async def test_a_workers_failure_mid_stream_is_an_error_event_with_bounded_text(nursery):
    async def handler(request: Any) -> AsyncIterator[Any]:
        yield {"text": "a"}
        await trio.sleep(0.2)  # the first chunk goes out on its own
        yield {"finish_reason": "error", "error": LONG}

    app = await frontend_with_worker(nursery, handler)
    response = await app.test_client().post(CHAT, json=chat(stream=True))
    events = sse_events(await response.get_data(as_text=False))
    assert response.status_code == 200
    assert "[DONE]" not in events, events
    last = json.loads(events[-1])
    assert last["error"]["code"] == "bad_gateway", last
    assert 0 < len(last["error"]["message"]) <= MAX_ERROR_MESSAGE


# ----------------------------------------------------------------- encodings we do not take


@pytest.mark.parametrize("encoding", ["gzip", "br", "deflate, gzip"])
async def test_a_compressed_body_is_a_415_naming_the_encoding(nursery, encoding: str):
    app = await frontend_with_worker(nursery, yielding({"text": "a", "finish_reason": "stop"}))
    response = await app.test_client().post(
        CHAT, json=chat(), headers={"Content-Encoding": encoding}
    )
    body = await response.get_json()
    assert response.status_code == 415, body
    assert body["error"]["code"] == "unsupported_media_type"
    assert "Content-Encoding" in body["error"]["message"]


@pytest.mark.parametrize("encoding", ["identity", "IDENTITY", ""])
async def test_an_identity_body_is_served(nursery, encoding: str):
    app = await frontend_with_worker(nursery, yielding({"text": "a", "finish_reason": "stop"}))
    response = await app.test_client().post(
        CHAT, json=chat(), headers={"Content-Encoding": encoding}
    )
    assert response.status_code == 200, await response.get_json()
