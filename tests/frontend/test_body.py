"""A response's channel (Reply) in memory: the view's first, order, gathering, the
producer told of the end, keep-alives, and a source lent to the body.

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
        async with reply as body:
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
            async with reply as body:
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
    reply = Reply(keepalive=5.0)

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
        async with reply as body:
            pieces = [piece async for piece in body]
    comment = keepalive_comment()
    assert pieces == [b"data: 0\n\n", comment, comment, b"data: 1\n\n", b"data: 2\n\n"]


class Source:
    """A stream's source as the pipeline lends it: pieces from a channel, ``None`` at
    the end; a nudge makes a waiting pull return a keep-alive comment."""

    def __init__(self) -> None:
        self.send, self._receive = trio.open_memory_channel[bytes | None](100)
        self.pulled_by: list[str] = []
        self.nudges = 0

    async def pull(self) -> bytes | None:
        self.pulled_by.append(trio.lowlevel.current_task().name)
        piece = await self._receive.receive()
        if piece == b"boom":
            raise RuntimeError("the engine failed")
        return piece

    def nudge(self) -> None:
        self.nudges += 1
        self.send.send_nowait(keepalive_comment())


async def test_a_lent_source_is_pulled_by_the_body_and_given_back_at_its_end() -> None:
    reply, source = Reply(), Source()
    events: list[str] = []

    async def producer() -> None:
        try:
            await reply.send(b"first ")
            await reply.lend(source.pull, source.nudge)
            events.append("given back")
            await reply.send(b"last")
        finally:
            reply.close()

    for piece in (b"a ", b"b ", b"c ", None):
        source.send.send_nowait(piece)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(producer, name="producer")
        assert await reply.first() == b"first "
        async with reply as body:
            pieces = [piece async for piece in body]
    assert b"".join(pieces) == b"first a b c last"
    assert events == ["given back"]
    assert source.pulled_by and "producer" not in source.pulled_by  # the body pulled


async def test_what_a_pull_raises_is_raised_in_the_producer_which_ends_the_stream() -> None:
    reply, source = Reply(), Source()
    raised: list[BaseException] = []

    async def producer() -> None:
        try:
            await reply.send(b"first ")
            try:
                await reply.lend(source.pull, source.nudge)
            except RuntimeError as exc:
                raised.append(exc)
                await reply.send(b"error event")
        finally:
            reply.close()

    source.send.send_nowait(b"a ")
    source.send.send_nowait(b"boom")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(producer)
        assert await reply.first() == b"first "
        async with reply as body:
            pieces = [piece async for piece in body]
    assert b"".join(pieces) == b"first a error event"
    assert [str(exc) for exc in raised] == ["the engine failed"]


async def test_a_body_that_leaves_mid_pull_gives_the_source_back_untouched(
    autojump_clock: trio.testing.MockClock,
) -> None:
    reply, source = Reply(), Source()
    after: list[bytes | None] = []

    async def producer() -> None:
        try:
            await reply.send(b"first ")
            await reply.lend(source.pull, source.nudge)
            # The body left: the producer reads the rest itself; its sends are dropped.
            while (piece := await source.pull()) is not None:
                after.append(piece)
                await reply.send(piece)
        finally:
            reply.close()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(producer)
        assert await reply.first() == b"first "
        with trio.move_on_after(1) as leaving:  # the client leaves while the body waits
            async with reply as body:
                async for _ in body:
                    pass
        assert leaving.cancelled_caught
        for piece in (b"x", b"y", None):
            source.send.send_nowait(piece)
    assert after == [b"x", b"y"]
    assert reply.broken


async def test_a_producer_cancelled_while_lending_takes_the_source_back() -> None:
    reply, source = Reply(), Source()
    killed = trio.CancelScope()

    async def producer() -> None:
        try:
            await reply.send(b"first ")
            with killed:
                await reply.lend(source.pull, source.nudge)
            # As the call dies with its request: a piece the body pulls now is dropped.
            source.send.send_nowait(b"dropped ")
            await reply.send(b"error event")
        finally:
            reply.close()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(producer)
        assert await reply.first() == b"first "

        async def kill_while_the_body_pulls() -> None:
            await trio.testing.wait_all_tasks_blocked()
            assert source.pulled_by  # the body waits in the lent source
            killed.cancel()

        nursery.start_soon(kill_while_the_body_pulls)
        async with reply as body:
            pieces = [piece async for piece in body]
    assert b"".join(pieces) == b"first error event"


async def test_a_silent_lent_source_is_nudged_into_keep_alives(
    autojump_clock: trio.testing.MockClock,
) -> None:
    reply, source = Reply(keepalive=5.0), Source()
    arrivals: list[tuple[float, bytes]] = []

    async def producer() -> None:
        try:
            await reply.send(b"first")
            await reply.lend(source.pull, source.nudge)
        finally:
            reply.close()

    async def engine() -> None:
        await trio.sleep(12)
        source.send.send_nowait(b"late")
        await trio.sleep(3)
        source.send.send_nowait(None)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(producer)
        nursery.start_soon(engine)
        assert await reply.first() == b"first"
        async with reply as body:
            async for piece in body:
                arrivals.append((trio.current_time(), piece))
    comment = keepalive_comment()
    assert [piece for _, piece in arrivals] == [b"first", comment, comment, b"late"]
    assert [round(at) for at, piece in arrivals if piece == comment] == [5, 10]
    assert source.nudges == 2
