"""A response's channel (Reply) in memory: the view's first, order, gathering, the
producer told of the end, keep-alives.

The producer yields to the scheduler at random, so that it runs in every gap
the body leaves.
"""

from __future__ import annotations

import random

import pytest
import trio
import trio.testing

from dynamo_trio.frontend._body import Reply
from dynamo_trio.llm import keepalive_comment


async def produce(reply: Reply, events: list[bytes], seed: int) -> None:
    rng = random.Random(seed)
    try:
        for event in events:
            await reply.send(event)
            if rng.random() < 0.5:
                await trio.lowlevel.checkpoint()
    finally:
        reply.close()


@pytest.mark.parametrize("seed", range(20))
async def test_every_piece_arrives_in_order_gathered_into_fewer_writes(seed: int) -> None:
    events = [f"data: {n}\n\n".encode() for n in range(200)]
    reply = Reply()
    rng = random.Random(seed + 1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(produce, reply, events, seed)
        assert await reply.first() == events[0]
        pieces = []
        async with reply.stream(keepalive=0) as body:
            async for piece in body:
                pieces.append(piece)
                for _ in range(rng.randrange(3)):  # the write, yielding now and then
                    await trio.lowlevel.checkpoint()
    assert b"".join(pieces) == b"".join(events)
    assert len(pieces) < len(events)
    assert reply.sent_any and not reply.broken


async def test_an_answer_is_the_first_and_only_thing_the_view_reads() -> None:
    reply = Reply()
    await reply.send({"answer": 1})
    assert await reply.first() == {"answer": 1}
    await reply.send(b"more")
    assert reply.broken  # nobody listens any more


async def test_nothing_sent_is_none() -> None:
    reply = Reply()
    reply.close()
    assert await reply.first() is None
    assert not reply.sent_any


async def test_after_quart_let_go_of_the_body_the_producer_sends_nothing() -> None:
    reply = Reply()
    await reply.send(b"a")
    assert await reply.first() == b"a"
    received: list[bytes] = []
    async with trio.open_nursery() as nursery:

        async def consume() -> None:
            async with reply.stream(keepalive=0) as body:
                async for piece in body:
                    received.append(piece)

        nursery.start_soon(consume)
        await reply.send(b"b")
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()  # the client left: quart-trio cancels the body
    await reply.send(b"c")
    assert reply.broken
    assert b"".join(received) == b"ab"


async def test_keep_alive_comments_fill_silences_between_whole_pieces(
    autojump_clock: trio.testing.MockClock,
) -> None:
    reply = Reply()

    async def producer() -> None:
        try:
            await reply.send(b"data: 0\n\n")
            await trio.sleep(12)  # two comments (at 5 s and 10 s)
            await reply.send(b"data: 1\n\n")
            await trio.sleep(3)  # none
            await reply.send(b"data: 2\n\n")
        finally:
            reply.close()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(producer)
        assert await reply.first() == b"data: 0\n\n"
        async with reply.stream(keepalive=5.0) as body:
            pieces = [piece async for piece in body]
    comment = keepalive_comment()
    assert pieces == [b"data: 0\n\n", comment, comment, b"data: 1\n\n", b"data: 2\n\n"]
