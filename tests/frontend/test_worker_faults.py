"""What a broken or hostile worker can make the frontend answer, in one process.

A worker's failure is the gateway's trouble, not the client's request: it is
answered 502 with an API error body, its text bounded, and an end the frontend
did not ask for is never a normal finish.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

from dynamo_trio._config import FrontendConfig

from ._inprocess import CHAT, chat, frontend_with_worker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


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
    events = sse_events(await response.get_data())
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
