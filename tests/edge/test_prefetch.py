"""The body prefetch: a body already queued by hypercorn, offered to the app without a wait.

Its rules at their boundaries, in memory (a trio memory channel stands for
hypercorn's per-request queue, which is what it is); a fuzz test of the replay;
and the real thing: hypercorn behind the edge, so a hypercorn that stops
queueing bodies this way fails here rather than silently costing passes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import trio
import trio.testing
from hypothesis import given, settings, strategies as st

from dynamo_trio.edge import PREFETCHED_BODY, BodyPrefetch
from tests._fuzz import examples
from tests._memhttp import http_client

from ._serving import answer_lifespan, served

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

Message = dict[str, Any]


def part(body: bytes, *, more: bool) -> Message:
    return {"type": "http.request", "body": body, "more_body": more}


DISCONNECT: Message = {"type": "http.disconnect"}


def scope_for(length: int | None = None) -> dict[str, Any]:
    headers = [(b"host", b"test")]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    return {"type": "http", "method": "POST", "path": "/", "headers": headers}


Queue = tuple[trio.MemorySendChannel[Message], "Callable[[], Awaitable[Message]]"]


def queued(*messages: Message) -> Queue:
    send, receive = trio.open_memory_channel[Message](100)
    for message in messages:
        send.send_nowait(message)
    return send, receive.receive


async def offer(
    scope: dict[str, Any], receive: Any, *, limit: int = 1000, end: float = 10.0
) -> Any:
    return await BodyPrefetch.offer(scope, receive, limit=limit, end_timeout=end)  # type: ignore[arg-type]


async def test_a_queued_body_is_offered_and_the_app_reads_it_as_an_empty_one() -> None:
    scope = scope_for(6)
    send, receive = queued(part(b"abc", more=True), part(b"def", more=True), part(b"", more=False))
    app_receive = await offer(scope, receive)
    assert BodyPrefetch.take(scope) == b"abcdef"
    assert BodyPrefetch.take(scope) is None  # once
    # The app's reader gets the body's end without its bytes (the view holds them),
    # then hypercorn's queue again.
    assert await app_receive() == part(b"", more=False)
    send.send_nowait(DISCONNECT)
    assert await app_receive() == DISCONNECT


async def test_a_body_not_taken_is_replayed_whole_and_in_order() -> None:
    scope = scope_for(3)
    messages = [part(b"ab", more=True), part(b"c", more=False)]
    send, receive = queued(*messages)
    app_receive = await offer(scope, receive)
    assert scope["extensions"][PREFETCHED_BODY] is not None
    assert [await app_receive(), await app_receive()] == messages
    # Taken after the app read it: the view still gets the bytes, without waiting.
    assert BodyPrefetch.take(scope) == b"abc"
    send.send_nowait(DISCONNECT)
    assert await app_receive() == DISCONNECT


async def test_a_single_piece_is_offered_without_a_copy() -> None:
    body = b"x" * 100
    scope = scope_for(100)
    _, receive = queued(part(body, more=True), part(b"", more=False))
    await offer(scope, receive)
    assert BodyPrefetch.take(scope) is body


@pytest.mark.parametrize(
    ("length", "queue"),
    [
        pytest.param(10, [part(b"abc", more=True)], id="declared bytes still on the network"),
        pytest.param(None, [part(b"abc", more=True)], id="chunked, its end not queued"),
        pytest.param(3, [], id="nothing queued yet"),
    ],
)
async def test_it_never_waits_for_bytes_still_on_the_network(
    length: int | None, queue: list[Message]
) -> None:
    scope = scope_for(length)
    send, receive = queued(*queue)
    with trio.CancelScope() as cancelled:
        cancelled.cancel()  # any checkpoint would raise here
        app_receive = await offer(scope, receive)
    assert not cancelled.cancelled_caught
    assert BodyPrefetch.take(scope) is None  # incomplete: the app reads it its own way
    rest = [part(b"defghij", more=False)] if queue else [part(b"abc", more=False)]
    for message in rest:
        send.send_nowait(message)
    assert [await app_receive() for _ in queue + rest] == queue + rest


async def waiting_for_the_end(
    then: Callable[[trio.MemorySendChannel[Message]], Awaitable[None]],
    *,
    limit: int = 1000,
) -> tuple[dict[str, Any], Any]:
    """The prefetch of a body whose declared bytes are all queued, its end not yet:
    ``then`` acts on hypercorn's queue while the prefetch waits.  The request's scope
    and the app's ``receive``."""
    scope = scope_for(3)
    send, receive = queued(part(b"abc", more=True))
    app_receives: list[Any] = []

    async def prefetch() -> None:
        app_receives.append(await offer(scope, receive, limit=limit))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(prefetch)
        await trio.testing.wait_all_tasks_blocked()
        assert not app_receives  # waiting for hypercorn to queue the end
        await then(send)
    return scope, app_receives[0]


async def test_once_the_declared_bytes_are_in_it_waits_for_the_end_only() -> None:
    async def queue_the_end(send: trio.MemorySendChannel[Message]) -> None:
        send.send_nowait(part(b"", more=False))

    scope, _ = await waiting_for_the_end(queue_the_end)
    assert BodyPrefetch.take(scope) == b"abc"


async def test_bytes_that_come_with_the_awaited_end_count_against_the_limit() -> None:
    async def queue_an_end_with_bytes(send: trio.MemorySendChannel[Message]) -> None:
        send.send_nowait(part(b"d", more=False))  # (hypercorn never does; another server might)

    scope, app_receive = await waiting_for_the_end(queue_an_end_with_bytes, limit=3)
    assert BodyPrefetch.take(scope) is None  # 4 bytes: over the limit, replayed only
    assert [await app_receive(), await app_receive()] == [
        part(b"abc", more=True),
        part(b"d", more=False),
    ]


async def test_the_wait_for_the_end_is_bounded(autojump_clock: trio.testing.MockClock) -> None:
    scope = scope_for(3)
    send, receive = queued(part(b"abc", more=True))
    start = trio.current_time()
    app_receive = await offer(scope, receive, end=5.0)
    assert trio.current_time() - start == pytest.approx(5.0)
    assert BodyPrefetch.take(scope) is None
    assert await app_receive() == part(b"abc", more=True)
    send.send_nowait(part(b"", more=False))
    assert await app_receive() == part(b"", more=False)


async def test_a_queue_closed_while_it_waits_for_the_end_is_left_to_the_app() -> None:
    async def close(send: trio.MemorySendChannel[Message]) -> None:
        await send.aclose()

    scope, app_receive = await waiting_for_the_end(close)
    assert BodyPrefetch.take(scope) is None
    assert await app_receive() == part(b"abc", more=True)
    with pytest.raises(trio.EndOfChannel):  # what the app would have met without the prefetch
        await app_receive()


async def test_a_body_over_the_limit_is_replayed_not_offered() -> None:
    scope = scope_for(11)
    messages = [part(b"0123456789", more=True), part(b"!", more=False)]
    _, receive = queued(*messages)
    app_receive = await offer(scope, receive, limit=10)
    assert BodyPrefetch.take(scope) is None  # the app applies its own limit (413)
    assert [await app_receive(), await app_receive()] == messages


async def test_a_disconnect_ends_the_prefetch_and_reaches_the_app() -> None:
    scope = scope_for(10)
    messages = [part(b"abc", more=True), DISCONNECT]
    _, receive = queued(*messages, part(b"never read", more=False))
    app_receive = await offer(scope, receive)
    assert BodyPrefetch.take(scope) is None
    assert [await app_receive(), await app_receive()] == messages


async def test_a_receive_that_is_not_a_trio_queue_is_passed_on_untouched() -> None:
    async def receive() -> Message:
        raise AssertionError("never called")

    scope = scope_for(0)
    assert await offer(scope, receive) is receive
    assert BodyPrefetch.take(scope) is None


@st.composite
def exchanges(draw: st.DrawFn) -> tuple[list[Message], int | None, int, bool]:
    pieces = draw(st.lists(st.binary(max_size=20), max_size=6))
    messages = [part(piece, more=True) for piece in pieces]
    ending = draw(st.sampled_from(["end", "disconnect", "none"]))
    if ending == "end":
        messages.append(part(draw(st.binary(max_size=20)), more=False))
    elif ending == "disconnect":
        messages.append(DISCONNECT)
    total = sum(len(message.get("body", b"")) for message in messages)
    length = draw(st.sampled_from([None, total, total + 1, max(0, total - 1)]))
    return messages, length, draw(st.integers(0, 150)), draw(st.booleans())


@settings(max_examples=examples(300), deadline=None)
@given(exchanges())
def test_fuzz_the_app_always_reads_the_same_exchange(
    exchange: tuple[list[Message], int | None, int, bool],
) -> None:
    messages, length, limit, take = exchange

    async def main() -> None:
        scope = scope_for(length)
        send, receive = queued(*messages)
        app_receive = await offer(scope, receive, limit=limit, end=0)
        body = b"".join(m.get("body", b"") for m in messages)
        last = messages[-1] if messages else DISCONNECT
        complete = last == part(last.get("body", b""), more=False)
        taken = BodyPrefetch.take(scope) if take else None
        if take:
            assert taken == (body if complete and len(body) <= limit else None)
        send.send_nowait(DISCONNECT)  # what hypercorn queues after the body, if anything
        read = [await app_receive() for _ in range(2 if taken is not None else len(messages) + 1)]
        if taken is not None:
            # The view has the bytes; the app's reader sees an empty body, once.
            assert read == [part(b"", more=False), DISCONNECT]
        else:
            assert read == [*messages, DISCONNECT]

    trio.run(main)


class BodyApp:
    """An ASGI app that records how each request's body reached it."""

    def __init__(self) -> None:
        self.taken: list[bytes | None] = []
        self.read: list[bytes] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        taken = BodyPrefetch.take(scope)
        self.taken.append(taken)
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        self.read.append(body)
        answer = taken if taken is not None else body
        length = str(len(answer)).encode()
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", length)]}
        )
        await send({"type": "http.response.body", "body": answer, "more_body": False})


async def exchange(stream: trio.SocketStream, body: bytes) -> bytes:
    """One POST sent in a single write; the response's body."""
    head = b"POST / HTTP/1.1\r\nhost: test\r\ncontent-length: %d\r\n\r\n" % len(body)
    await stream.send_all(head + body)
    received = b""
    while b"\r\n\r\n" not in received:
        received += await stream.receive_some(65536)
    head, _, rest = received.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(rest) < length:
        rest += await stream.receive_some(65536)
    return rest


async def test_behind_real_hypercorn_a_body_sent_whole_is_offered(nursery: trio.Nursery) -> None:
    app = BodyApp()
    url = await served(nursery, app, max_body_size=1000)
    host, port = url.removeprefix("http://").rsplit(":", 1)
    bodies = [b'{"n": %d}' % n for n in range(20)]
    async with await trio.open_tcp_stream(host, int(port)) as stream:  # one keep-alive connection
        for body in bodies:
            assert await exchange(stream, body) == body
        # Over the limit: not offered, read by the app the usual way.
        assert await exchange(stream, b"y" * 2000) == b"y" * 2000
    assert app.taken == [*bodies, None]
    assert app.read == [b""] * len(bodies) + [b"y" * 2000]


async def test_behind_real_hypercorn_every_body_arrives_however_it_is_sent(
    nursery: trio.Nursery,
) -> None:
    app = BodyApp()
    url = await served(nursery, app, max_body_size=1000)
    async with http_client(url) as client:
        for n in range(10):  # head and body in separate writes; a chunked body
            body = b'{"n": %d}' % n
            assert (await client.post("/", content=body)).content == body

            async def pieces(n: int = n) -> AsyncIterator[bytes]:
                yield b"a" * n
                yield b"b"

            chunked = (await client.post("/", content=pieces())).content
            assert chunked == b"a" * n + b"b"
    for taken, read in zip(app.taken, app.read, strict=True):
        assert (taken is None) != (read == b"")  # offered, or read by the app: never both
