"""The SSE body (StreamBody) in memory: order, gathering, the producer told of the end,
keep-alives.

The producer side is the pipeline's own emitter, yielding to the scheduler at
random, so that it runs in every gap the body leaves.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import trio
import trio.testing

from dynamo_trio.frontend._body import StreamBody
from dynamo_trio.frontend._pipeline import _Emitter
from dynamo_trio.llm import keepalive_comment


async def produce(emit: _Emitter, events: list[bytes], seed: int) -> None:
    rng = random.Random(seed)
    for event in events:
        await emit(event)
        if rng.random() < 0.5:
            await trio.lowlevel.checkpoint()


@pytest.mark.parametrize("seed", range(20))
async def test_every_piece_arrives_in_order_gathered_into_fewer_writes(seed: int) -> None:
    events = [f"data: {n}\n\n".encode() for n in range(200)]
    send, receive = trio.open_memory_channel[Any](16)
    emit = _Emitter(send)
    body = StreamBody(b"data: first\n\n", receive, keepalive=0)

    async def producer() -> None:
        async with send:
            await produce(emit, events, seed)

    rng = random.Random(seed + 1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(producer)
        async with body:
            pieces = []
            async for piece in body:
                pieces.append(piece)
                for _ in range(rng.randrange(3)):  # the write, yielding now and then
                    await trio.lowlevel.checkpoint()
    assert b"".join(pieces) == b"data: first\n\n" + b"".join(events)
    assert len(pieces) <= len(events)
    assert emit.sent_any and not emit.broken


async def test_after_quart_let_go_of_the_body_the_producer_sends_nothing() -> None:
    send, receive = trio.open_memory_channel[Any](16)
    emit = _Emitter(send)
    body = StreamBody(b"a", receive, keepalive=0)
    received: list[bytes] = []
    async with trio.open_nursery() as nursery:

        async def consume() -> None:
            async with body:
                async for piece in body:
                    received.append(piece)

        nursery.start_soon(consume)
        await emit(b"b")
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()  # the client left: quart-trio cancels the body
    await emit(b"c")
    assert emit.broken
    assert b"".join(received) == b"ab"


async def test_keep_alive_comments_fill_silences_between_whole_pieces(
    autojump_clock: trio.testing.MockClock,
) -> None:
    send, receive = trio.open_memory_channel[Any](16)
    emit = _Emitter(send)
    body = StreamBody(b"data: 0\n\n", receive, keepalive=5.0)

    async def producer() -> None:
        async with send:
            await trio.sleep(12)  # two comments (at 5 s and 10 s)
            await emit(b"data: 1\n\n")
            await trio.sleep(3)  # none
            await emit(b"data: 2\n\n")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(producer)
        async with body:
            pieces = [piece async for piece in body]
    comment = keepalive_comment()
    assert pieces == [b"data: 0\n\n", comment, comment, b"data: 1\n\n", b"data: 2\n\n"]
