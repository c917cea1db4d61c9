"""Rotation: an instance this caller cannot reach, though discovery lists it (a split).

Worker B advertises 127.0.0.2 and a relay there forwards to it, or goes
silent (connections accepted, nothing ever answered: a blackholed path).
Once the caller has found B out, no request waits for a connection to it;
a background probe brings it back once the path heals.  (The multi-host
version, with namespaces and a partition, is ``tests/multihost/test_split.py``.)
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import TYPE_CHECKING, Any

import pytest
import trio

from dynamo_trio import Context, DistributedRuntime
from dynamo_trio.runtime import _router

from .conftest import TEST_CONFIG

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from dynamo_trio.discovery import MemoryStore
    from dynamo_trio.runtime import Client

CONNECT_TIMEOUT = 0.5
PROBE_ROUNDS = 3
"""Failed connection attempts to the silenced worker the test waits through."""


class Relay:
    """127.0.0.2:port -> 127.0.0.1:port, forwarding, or silent while cut."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.cut = False
        self._pipes: set[trio.CancelScope] = set()
        self.log: list[tuple[str, int]] = []
        """``("open", n)`` when attempt ``n`` to connect reaches it cut, ``("closed", n)``
        when its caller gave up on it; the test adds its requests' starts and ends."""

    async def serve(self, *, task_status: trio.TaskStatus[None]) -> None:
        listeners = await trio.open_tcp_listeners(self.port, host="127.0.0.2")
        task_status.started()
        await trio.serve_listeners(self._handle, listeners)

    def silence(self) -> None:
        """Stop forwarding, on open connections too (their sockets stay open)."""
        self.cut = True
        for scope in self._pipes:
            scope.cancel()

    async def _handle(self, stream: trio.SocketStream) -> None:
        async with stream:
            if self.cut:
                attempt = sum(1 for what, _ in self.log if what == "open")
                self.log.append(("open", attempt))
                with contextlib.suppress(trio.BrokenResourceError):
                    async for _ in stream:
                        pass  # a hello that is never answered
                self.log.append(("closed", attempt))
                await trio.sleep_forever()
            async with await trio.open_tcp_stream("127.0.0.1", self.port) as target:
                with trio.CancelScope() as scope:
                    self._pipes.add(scope)
                    try:
                        async with trio.open_nursery() as nursery:
                            nursery.start_soon(self._pipe, stream, target)
                            nursery.start_soon(self._pipe, target, stream)
                    finally:
                        self._pipes.discard(scope)
                await trio.sleep_forever()  # cut: hold both ends open, silently

    @staticmethod
    async def _pipe(source: trio.abc.Stream, sink: trio.abc.Stream) -> None:
        try:
            async for data in source:
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass


async def who(client: Client, log: list[tuple[str, int]] | None = None) -> str:
    """One round-robin call: which worker answered (its start and end noted in ``log``)."""
    log = [] if log is None else log
    call = sum(1 for what, _ in log if what == "start")
    log.append(("start", call))
    with trio.fail_after(30):  # a hang guard only
        stream = await client.round_robin({}, context=Context())
        items = [item.data() async for item in stream]
    log.append(("end", call))
    return str(items[0]["who"])


def waited_for(log: list[tuple[str, int]]) -> list[tuple[int, int]]:
    """The (request, attempt) pairs where a whole failed connection attempt (its open and
    its close) came between the request's start and its end: the request waited for it."""
    at = {entry: index for index, entry in enumerate(log)}
    calls = [n for what, n in log if what == "start" and ("end", n) in at]
    attempts = [n for what, n in log if what == "open" and ("closed", n) in at]
    return [
        (call, attempt)
        for call in calls
        for attempt in attempts
        if at[("start", call)] < at[("open", attempt)]
        and at[("closed", attempt)] < at[("end", call)]
    ]


@pytest.fixture
async def split(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Client, Relay]]:
    # Short rests, so that several probe rounds fit in the test.
    monkeypatch.setattr(_router, "_DOWN_FOR", 0.2)
    monkeypatch.setattr(_router, "_MAX_DOWN_FOR", 0.4)
    from dynamo_trio.discovery import MemoryStore

    store: MemoryStore = MemoryStore()
    caller_config = TEST_CONFIG.replace(
        request_plane=dataclasses.replace(
            TEST_CONFIG.request_plane, connect_timeout=CONNECT_TIMEOUT
        )
    )
    b_config = TEST_CONFIG.replace(
        request_plane=dataclasses.replace(TEST_CONFIG.request_plane, advertise_host="127.0.0.2")
    )
    async with (
        DistributedRuntime(TEST_CONFIG, memory_store=store) as a,
        DistributedRuntime(b_config, memory_store=store) as b,
        DistributedRuntime(caller_config, memory_store=store) as caller,
    ):
        for runtime, name in ((a, "a"), (b, "b")):
            endpoint = runtime.namespace("ns").component("c").endpoint("generate")
            await nursery.start(endpoint.serve_endpoint, answering(name))
        assert b.address is not None
        relay = Relay(int(b.address.rsplit(":", 1)[1]))
        await nursery.start(relay.serve)
        client = await caller.namespace("ns").component("c").endpoint("generate").client()
        with trio.fail_after(5):
            await client._view.wait_until(lambda items: len(items) == 2)
        yield client, relay
        nursery.cancel_scope.cancel()


def answering(name: str) -> Any:
    async def handler(request: Any) -> AsyncIterator[Any]:
        await trio.lowlevel.checkpoint()
        yield {"who": name}

    return handler


async def test_an_unreachable_listed_instance_costs_no_request_and_comes_back(
    split: tuple[Client, Relay],
) -> None:
    client, relay = split
    assert {await who(client) for _ in range(4)} == {"a", "b"}

    relay.silence()  # the path to B goes silent; discovery still lists B
    with trio.fail_after(30):  # a hang guard only: heartbeats find it out
        while len(client.live_instance_ids()) == 2:  # noqa: ASYNC110 - polls state
            await trio.sleep(0.05)

    # Several probe rounds (rests of 0.2 s, doubling to 0.4 s), each a connection attempt
    # that fails at the connect timeout: every request meanwhile goes to A, and none
    # waits for an attempt to B (none spans one's whole life).
    log = relay.log
    with trio.fail_after(60):  # a hang guard only
        while sum(1 for what, _ in log if what == "closed") < PROBE_ROUNDS:
            assert await who(client, log) == "a"
            await trio.sleep(0.02)
    assert waited_for(log) == [], log

    relay.cut = False  # the path heals: a probe brings B back, without a request's help
    with trio.fail_after(30):  # a hang guard only
        while len(client.live_instance_ids()) < 2:  # noqa: ASYNC110 - polls state
            await trio.sleep(0.05)
    assert {await who(client) for _ in range(4)} == {"a", "b"}
