"""The HTTP/2 sending order (:class:`dynamo_trio.edge._h2.RoundRobin`): the active streams in
turn, with the priority tree's interface and errors, so that an ended stream never waits
behind a flow of new ones (hypercorn's tree let it, until 1000 ended the connection)."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import given, strategies as st
from priority.priority import DeadlockError, DuplicateStreamError, MissingStreamError

from dynamo_trio.edge._h2 import RoundRobin

from ._serving import answer_lifespan, served_bare
from .test_h2_whole import calls

if TYPE_CHECKING:
    import trio


def take(scheduler: RoundRobin, count: int) -> list[int]:
    return [next(scheduler) for _ in range(count)]


def test_active_streams_go_in_turn_and_blocked_ones_wait() -> None:
    scheduler = RoundRobin()
    with pytest.raises(DeadlockError):
        next(scheduler)
    for stream_id in (1, 3, 5):
        scheduler.insert_stream(stream_id)
    assert take(scheduler, 6) == [1, 3, 5, 1, 3, 5]
    scheduler.block(3)
    assert take(scheduler, 4) == [1, 5, 1, 5]
    scheduler.unblock(3)
    scheduler.unblock(3)  # already active: still one turn per round
    assert sorted(take(scheduler, 3)) == [1, 3, 5]
    scheduler.remove_stream(1)
    scheduler.block(5)
    assert take(scheduler, 2) == [3, 3]
    scheduler.block(3)
    with pytest.raises(DeadlockError):
        next(scheduler)
    assert len(scheduler) == 2


def test_an_ended_stream_is_reached_however_many_new_ones_come() -> None:
    scheduler = RoundRobin()
    scheduler.insert_stream(1)
    scheduler.block(1)  # waiting for its app, while new streams come and go
    new_ids = itertools.count(3, 2)
    for _ in range(50):
        stream_id = next(new_ids)
        scheduler.insert_stream(stream_id)
        assert next(scheduler) == stream_id
        scheduler.remove_stream(stream_id)
    scheduler.unblock(1)  # it ended: the next turn is its own, before any newcomer
    scheduler.insert_stream(next(new_ids))
    assert next(scheduler) == 1


def test_the_trees_errors() -> None:
    scheduler = RoundRobin()
    scheduler.insert_stream(1)
    with pytest.raises(DuplicateStreamError):
        scheduler.insert_stream(1)
    for operation in (scheduler.remove_stream, scheduler.block, scheduler.unblock):
        with pytest.raises(MissingStreamError):
            operation(7)
    with pytest.raises(MissingStreamError):
        scheduler.reprioritize(7, depends_on=1, weight=200, exclusive=True)
    scheduler.reprioritize(1, depends_on=None, weight=200, exclusive=True)  # ignored
    assert next(scheduler) == 1


@given(st.lists(st.tuples(st.sampled_from("ibur"), st.integers(1, 6)), max_size=60))
def test_a_turn_goes_to_an_active_stream_and_the_line_stays_bounded(
    operations: list[tuple[str, int]],
) -> None:
    scheduler = RoundRobin()
    active: dict[int, bool] = {}
    for operation, stream_id in operations:
        try:
            if operation == "i":
                scheduler.insert_stream(stream_id)
                active[stream_id] = True
            elif operation == "b":
                scheduler.block(stream_id)
                active[stream_id] = False
            elif operation == "u":
                scheduler.unblock(stream_id)
                active[stream_id] = True
            else:
                scheduler.remove_stream(stream_id)
                del active[stream_id]
        except (DuplicateStreamError, MissingStreamError):
            assert (operation == "i") == (stream_id in active)
        live = sorted(s for s, on in active.items() if on)
        if live:
            assert sorted(take(scheduler, len(live))) == live  # one turn each per round
        else:
            with pytest.raises(DeadlockError):
                next(scheduler)
        assert len(scheduler._turns) <= 6


class _Sees:
    """An ASGI app that notes, for each request, the sending order of the HTTP/2 connection
    it came on (reached as :func:`~dynamo_trio.edge._h2.send_whole_response` reaches it)."""

    def __init__(self) -> None:
        self.orders: list[type] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        while (await receive()).get("more_body", False):
            pass
        self.orders.append(type(send.__self__.send.__self__.priority))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def test_the_servers_http2_connections_send_in_turn(nursery: trio.Nursery) -> None:
    """Every HTTP/2 connection the edge serves sends its streams by :class:`RoundRobin`."""
    app = _Sees()
    url = await served_bare(nursery, app, cleartext_http2=True)
    replies = await calls(url, [b"a", b"b", b"c"], trailers=False)
    assert [reply.data for reply in replies] == [b"ok"] * 3
    assert app.orders == [RoundRobin] * 3
