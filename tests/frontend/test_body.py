"""The SSE body (StreamBody) in memory: the short way, the hand-over, keep-alives.

The producer side is the pipeline's own emitter; the connection is a recorder
behind a real :class:`~dynamo_trio.edge.ChunkWriter` whose writes yield to the
scheduler at random, so that the producer runs in every gap the body leaves.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import trio
import trio.testing

from dynamo_trio.edge import ChunkWriter
from dynamo_trio.frontend._body import StreamBody
from dynamo_trio.frontend._pipeline import _Emitter
from dynamo_trio.llm import keepalive_comment


class Connection:
    """Records the chunks written; each write yields 0-2 times (seeded)."""

    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)
        self.frames: list[bytes] = []

    async def __call__(self, data: bytes) -> None:
        for _ in range(self.random.randrange(3)):
            await trio.lowlevel.checkpoint()
        await trio.lowlevel.checkpoint_if_cancelled()
        self.frames.append(data)

    def pieces(self) -> list[bytes]:
        """The data of each chunk written (the framing checked on the way)."""
        out = []
        for frame in self.frames:
            size, _, rest = frame.partition(b"\r\n")
            assert rest.endswith(b"\r\n") and int(size, 16) == len(rest) - 2
            out.append(rest[:-2])
        return out


async def usable_writer(connection: Connection) -> ChunkWriter:
    writer = ChunkWriter(connection, head_request=False)

    async def head(message: Any) -> None:
        await trio.lowlevel.checkpoint()

    await writer.watch(head)({"type": "http.response.start", "status": 200, "headers": []})
    assert writer.usable
    return writer


async def produce(emit: _Emitter, events: list[bytes], seed: int) -> None:
    rng = random.Random(seed + 1)
    for event in events:
        await emit(event)
        if rng.random() < 0.5:
            await trio.lowlevel.checkpoint()


@pytest.mark.parametrize("seed", range(40))
async def test_the_hand_over_keeps_every_piece_in_order(seed: int) -> None:
    events = [f"data: {n}\n\n".encode() for n in range(200)]
    send, receive = trio.open_memory_channel[Any](16)
    emit = _Emitter(send)
    connection = Connection(seed)
    writer = await usable_writer(connection)
    body = StreamBody(b"data: first\n\n", receive, keepalive=0, hand_over=emit.hand_over)
    body.write_through(writer)

    async def producer() -> None:
        async with send:
            await produce(emit, events, seed)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(producer)
        async with body:
            assert [piece async for piece in body] == []  # all of it went the short way
    assert b"".join(connection.pieces()) == b"data: first\n\n" + b"".join(events)
    assert emit.sent_any and not emit.broken


async def test_without_a_usable_writer_pieces_go_back_to_quart() -> None:
    send, receive = trio.open_memory_channel[Any](16)
    emit = _Emitter(send)
    body = StreamBody(b"a", receive, keepalive=0, hand_over=emit.hand_over)
    body.write_through(ChunkWriter(Connection(0), head_request=False))  # never started

    async def producer() -> None:
        async with send:
            for piece in (b"b", b"c"):
                await emit(piece)
                await trio.sleep(0.01)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(producer)
        async with body:
            received = b"".join([piece async for piece in body])
    assert received == b"abc"


async def test_after_quart_let_go_of_the_body_the_producer_writes_nothing() -> None:
    send, receive = trio.open_memory_channel[Any](16)
    emit = _Emitter(send)
    connection = Connection(0)
    writer = await usable_writer(connection)
    body = StreamBody(b"a", receive, keepalive=0, hand_over=emit.hand_over)
    body.write_through(writer)
    async with trio.open_nursery() as nursery:

        async def consume() -> None:
            async with body:
                async for _ in body:
                    pass

        nursery.start_soon(consume)
        await emit(b"b")
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()  # the client left: quart-trio cancels the body
    await emit(b"c")
    assert emit.broken
    assert b"".join(connection.pieces()) == b"ab"


async def test_keep_alive_comments_fill_silences_between_whole_pieces(
    autojump_clock: trio.testing.MockClock,
) -> None:
    send, receive = trio.open_memory_channel[Any](16)
    emit = _Emitter(send)
    connection = Connection(3)
    writer = await usable_writer(connection)
    body = StreamBody(b"data: 0\n\n", receive, keepalive=5.0, hand_over=emit.hand_over)
    body.write_through(writer)

    async def producer() -> None:
        async with send:
            await trio.sleep(12)  # two comments (at 5 s and 10 s)
            await emit(b"data: 1\n\n")
            await trio.sleep(3)  # none
            await emit(b"data: 2\n\n")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(producer)
        async with body:
            assert [piece async for piece in body] == []
    comment = keepalive_comment()
    assert connection.pieces() == [b"data: 0\n\n", comment, comment, b"data: 1\n\n", b"data: 2\n\n"]
