"""Issue 12, item 4: the connection pool's shared attempts, under failures and churn.

Before the fix, when a shared connection attempt failed, its waiters each
started their own and overwrote one another's entry; ``connect()`` then raised
``KeyError`` and some callers waited forever (60 s in the soak).  Now callers
for one address share exactly one attempt, its failure reaches every waiter as
``CannotConnect``, the next caller after a failure starts a fresh attempt, and
nothing waits beyond the connect timeout.
"""

from __future__ import annotations

import dataclasses
import random

import hypothesis.strategies as st
import pytest
import trio
import trio.testing
from hypothesis import given, settings

from dynamo_trio import CannotConnect
from dynamo_trio.request_plane import ConnectionPool, RequestPlaneServer
from tests._fuzz import examples

from ._harness import CONFIG, MemoryNetwork, fd_count, streaming_handler, wait_until

SHORT = dataclasses.replace(CONFIG, connect_timeout=0.5, heartbeat_interval=0.05)


async def silent_listener(nursery):
    """An address that accepts TCP but never answers the handshake; counts accepts."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    accepted = []

    async def hold(stream):
        accepted.append(stream)
        async with stream:
            await trio.sleep_forever()

    nursery.start_soon(trio.serve_listeners, hold, listeners)
    return f"127.0.0.1:{port}", accepted


async def outcome(pool, address):
    start = trio.current_time()
    try:
        await pool.connect(address)
    except CannotConnect as exc:
        return "CannotConnect", trio.current_time() - start, str(exc)
    except BaseException as exc:  # the bug: KeyError, or anything else
        return type(exc).__name__, trio.current_time() - start, repr(exc)
    return "connected", trio.current_time() - start, ""


async def test_three_at_once_then_a_fourth_later_all_fail_cleanly_in_time(autojump_clock, nursery):
    """The issue's reproduction, with a 0.5 s connect timeout instead of 5 s, on the
    autojump clock: each caller waits exactly the connect timeout, never more."""
    network = MemoryNetwork(nursery)

    async def silent(stream):
        async with stream:
            await trio.sleep_forever()

    network.route("worker:1", silent)
    pool = ConnectionPool(SHORT, nursery, name="caller", open_transport=network.open)
    results = []

    async def call():
        results.append(await outcome(pool, "worker:1"))

    async with trio.open_nursery() as calls:
        for _ in range(3):
            calls.start_soon(call)
        await trio.sleep(0.7)  # the "7 s later", scaled to the timeout
        calls.start_soon(call)
    assert [kind for kind, _, _ in results] == ["CannotConnect"] * 4, results
    assert [elapsed for _, elapsed, _ in results] == [pytest.approx(SHORT.connect_timeout)] * 4
    assert all("no answer" in message for _, _, message in results), results
    # One shared attempt for the three, a fresh one for the fourth.
    assert network.opened == {"worker:1": 2}
    assert pool._attempts == {}


async def test_a_failure_reaches_every_waiter_of_the_attempt(nursery):
    address, accepted = await silent_listener(nursery)
    pool = ConnectionPool(SHORT, nursery, name="caller")
    results = []

    async def call():
        results.append((await outcome(pool, address))[0])

    async with trio.open_nursery() as calls:
        for _ in range(20):
            calls.start_soon(call)
    assert results == ["CannotConnect"] * 20
    assert len(accepted) == 1


async def test_a_refused_address_fails_every_waiter_at_once(nursery):
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    for listener in listeners:
        await listener.aclose()  # nothing listens there now
    pool = ConnectionPool(SHORT, nursery, name="caller")
    results = []

    async def call():
        results.append(await outcome(pool, f"127.0.0.1:{port}"))

    async with trio.open_nursery() as calls:
        for _ in range(5):
            calls.start_soon(call)
    assert [kind for kind, _, _ in results] == ["CannotConnect"] * 5
    assert all("cannot connect" in message for _, _, message in results)


async def test_a_cancelled_waiter_does_not_cancel_the_attempt_for_the_others(autojump_clock):
    async with trio.open_nursery() as nursery:
        server = RequestPlaneServer(SHORT, streaming_handler)
        network = MemoryNetwork(nursery)
        gate = trio.Event()

        async def slow_then_real(stream):
            await gate.wait()  # the worker answers late
            await server.handle_connection(stream, "10.0.0.1:1")

        network.route("worker:1", slow_then_real)
        pool = ConnectionPool(SHORT, nursery, name="caller", open_transport=network.open)
        got = []

        async def patient():
            got.append(await pool.connect("worker:1"))

        nursery.start_soon(patient)
        with trio.move_on_after(0.1):
            await pool.connect("worker:1")  # gives up first
        gate.set()
        await wait_until(lambda: bool(got), 1)
        assert got[0].usable
        assert network.opened == {"worker:1": 1}
        pool.close_all()
        nursery.cancel_scope.cancel()


async def test_the_next_caller_after_a_failure_makes_a_fresh_attempt_that_can_succeed(
    autojump_clock,
):
    async with trio.open_nursery() as nursery:
        server = RequestPlaneServer(SHORT, streaming_handler)
        network = MemoryNetwork(nursery)
        pool = ConnectionPool(SHORT, nursery, name="caller", open_transport=network.open)
        with pytest.raises(CannotConnect, match="connection refused"):
            await pool.connect("worker:1")  # nothing there yet
        network.route("worker:1", lambda s: server.handle_connection(s, "10.0.0.1:1"))
        connection = await pool.connect("worker:1")
        assert connection.usable
        assert await pool.connect("worker:1") is connection  # and it is shared
        pool.close_all()
        nursery.cancel_scope.cancel()


# ----------------------------------------------------------------- churn

BEHAVIOURS = st.sampled_from(["serve", "serve", "refuse", "stall", "hang-up", "die-later"])


@settings(max_examples=examples(40), deadline=None)
@given(
    plan=st.lists(
        st.tuples(BEHAVIOURS, st.integers(1, 6), st.sampled_from([0.0, 0.05, 0.3, 0.7])),
        min_size=1,
        max_size=8,
    ),
    seed=st.integers(0, 2**16),
)
def test_churn_every_caller_gets_a_connection_or_cannot_connect_in_time(plan, seed):
    """A worker address that, connection after connection, serves, refuses, stalls,
    hangs up mid-handshake, or dies after serving; waves of concurrent callers."""
    rng = random.Random(seed)

    async def main():
        async with trio.open_nursery() as nursery:
            server = RequestPlaneServer(SHORT, streaming_handler)
            behaviour = {"now": "serve"}

            async def worker(stream):
                kind = behaviour["now"]
                if kind == "stall":
                    await trio.sleep_forever()
                if kind == "hang-up":
                    await trio.sleep(rng.random() * 0.1)
                    await stream.aclose()
                    return
                if kind == "die-later":
                    with trio.move_on_after(rng.random() * 0.5):
                        await server.handle_connection(stream, "10.0.0.1:1")
                    await stream.aclose()
                    return
                await server.handle_connection(stream, "10.0.0.1:1")

            network = MemoryNetwork(nursery)
            pool = ConnectionPool(SHORT, nursery, name="caller", open_transport=network.open)
            results = []

            async def call():
                start = trio.current_time()
                try:
                    connection = await pool.connect("worker:1")
                except CannotConnect:
                    results.append(("CannotConnect", trio.current_time() - start))
                else:
                    results.append(("connected", trio.current_time() - start))
                    assert connection.address == "worker:1"

            for kind, callers, pause in plan:
                behaviour["now"] = kind
                if kind == "refuse":
                    network._routes.pop("worker:1", None)
                else:
                    network.route("worker:1", worker)
                async with trio.open_nursery() as wave:
                    for _ in range(callers):
                        wave.start_soon(call)
                        await trio.sleep(rng.choice([0, 0, 0.01, 0.2]))
                await trio.sleep(pause)
            assert len(results) == sum(callers for _, callers, _ in plan)
            # A caller waits for at most one attempt, which the connect timeout bounds.
            assert all(elapsed <= SHORT.connect_timeout + 0.3 for _, elapsed in results), results
            assert pool._attempts == {}
            pool.close_all()
            server.close_all()
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


async def test_no_file_descriptor_outlives_failed_attempts(nursery):
    address, accepted = await silent_listener(nursery)
    baseline = fd_count()
    pool = ConnectionPool(SHORT, nursery, name="caller")
    for _ in range(3):
        with pytest.raises(CannotConnect):
            await pool.connect(address)
    for stream in accepted:
        await stream.aclose()
    assert fd_count() == baseline
