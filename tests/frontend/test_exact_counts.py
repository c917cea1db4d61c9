"""Exact counts under every client: a completed request is never a cancellation.

The rule (``dynamo_trio/frontend/_hangup.py``): a request counts as cancelled by
its client iff the client's connection ends before the request's work is
complete.  The official ``openai`` client stops at ``data: [DONE]`` and closes
the response without reading the chunked terminator; a hand-written client may
close at any byte after ``[DONE]``, with a FIN or a reset.  None of that is a
cancellation.  A client that hangs up before ``[DONE]`` always is, once each.
"""

from __future__ import annotations

import socket
import struct
from typing import TYPE_CHECKING, Any

import openai
import pytest
import trio

from tests._memhttp import http_client

from .conftest import CHAT_BODY, raw_post

if TYPE_CHECKING:
    from tests._serving import Served

    from .conftest import StartStack

pytestmark = [
    pytest.mark.slow,
    # The openai client leaves its generator chain to the garbage collector
    # after [DONE] (see conftest): exactly those warnings, and nothing else.
    pytest.mark.filterwarnings(
        r"ignore:Exception ignored in. <async_generator object"
        r":pytest.PytestUnraisableExceptionWarning"
    ),
]

DONE = b"data: [DONE]\n\n"
TAIL = b"\r\n0\r\n\r\n"  # what follows [DONE] on the wire: its chunk's end, the terminator
STREAM = {**CHAT_BODY, "max_tokens": 3, "stream": True}
CANCELLATIONS = "dynamo_frontend_model_cancellation_total"
REQUESTS = "dynamo_frontend_requests_total"


async def stream_then_close(url: str, after_done: int, *, rst: bool) -> None:
    """Read a streaming chat up to ``[DONE]`` plus ``after_done`` more bytes, then close."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    try:
        await stream.send_all(raw_post("/v1/chat/completions", _json(STREAM)))
        received = b""
        with trio.fail_after(10):
            # One byte at a time once [DONE] could be near: the close lands exactly
            # ``after_done`` bytes after it, whatever the server has sent by then.
            while DONE not in received:
                chunk = await stream.receive_some(1 if b"[DONE" in received[-8:] else 4096)
                assert chunk, received[-300:]
                received += chunk
            tail = received.split(DONE, 1)[1]
            while len(tail) < after_done:
                chunk = await stream.receive_some(1)
                assert chunk, tail
                tail += chunk
        assert TAIL.startswith(tail[:after_done])
        if rst:
            stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        await stream.aclose()


def _json(body: dict[str, Any]) -> bytes:
    import json

    return json.dumps(body).encode()


async def settled(running: Served, total: int) -> None:
    """Every request has been counted by the frontend (it counts as the work ends)."""
    with trio.fail_after(10):
        while await running.metric(REQUESTS) < total:  # noqa: ASYNC110 - another process
            await trio.sleep(0.02)


async def test_closing_at_every_byte_after_done_is_never_a_cancellation(
    stack: StartStack,
) -> None:
    running = await stack(inter_token_latency_ms=0)
    total = 0
    for rst in (False, True):
        for after_done in range(len(TAIL) + 1):
            for _ in range(15 if not rst else 5):
                await stream_then_close(running.url, after_done, rst=rst)
                total += 1
    await settled(running, total)
    assert await running.metric(CANCELLATIONS) == 0
    assert await running.metric(REQUESTS, status="success") == total


async def test_the_official_clients_and_httpx_reading_to_done_are_never_cancellations(
    stack: StartStack,
) -> None:
    running = await stack(inter_token_latency_ms=0)
    base = f"{running.url}/v1"
    rounds = 40

    async with openai.AsyncOpenAI(base_url=base, api_key="unused", max_retries=0) as client:
        for _ in range(rounds):
            stream = await client.chat.completions.create(
                model="mock", messages=CHAT_BODY["messages"], max_tokens=3, stream=True
            )
            async for _ in stream:
                pass

    def sync_client() -> None:
        with openai.OpenAI(base_url=base, api_key="unused", max_retries=0) as client:
            for _ in range(rounds):
                for _ in client.chat.completions.create(
                    model="mock", messages=CHAT_BODY["messages"], max_tokens=3, stream=True
                ):
                    pass

    await trio.to_thread.run_sync(sync_client)

    async with http_client(running.url) as http:
        for _ in range(rounds):
            async with http.stream("POST", "/v1/chat/completions", json=STREAM) as response:
                async for line in response.aiter_lines():
                    if line == "data: [DONE]":
                        break  # leave without reading the terminator

    await settled(running, 3 * rounds)
    assert await running.metric(CANCELLATIONS) == 0
    assert await running.metric(REQUESTS, status="success") == 3 * rounds


async def test_hanging_up_before_done_is_one_cancellation_each(stack: StartStack) -> None:
    running = await stack(inter_token_latency_ms=2)
    body = _json({**CHAT_BODY, "max_tokens": 5000, "stream": True})
    hang_ups = 30
    host, port = running.url.removeprefix("http://").rsplit(":", 1)
    for i in range(hang_ups):
        stream = await trio.open_tcp_stream(host, int(port))
        await stream.send_all(raw_post("/v1/chat/completions", body))
        received = b""
        with trio.fail_after(10):
            while received.count(b"data: ") < 1 + i % 5:
                chunk = await stream.receive_some(4096)
                assert chunk
                received += chunk
        if i % 2:
            stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await stream.aclose()
    await settled(running, hang_ups)
    assert await running.metric(CANCELLATIONS) == hang_ups
    assert await running.metric(REQUESTS, status="success") == 0
    with trio.fail_after(10):
        while await running.metric("dynamo_component_inflight_requests", worker=True):  # noqa: ASYNC110
            await trio.sleep(0.02)
    assert await running.metric("dynamo_component_cancellation_total", worker=True) == hang_ups
