"""Issue 12, item 7: what a connection may take before it has authenticated.

Real sockets and the real accept path: the connection caps, the handshake
deadline, pacing of failed authentications, and logs that do not flood.  The
sans-IO parts (the throttle, the log limiter) are tested against a fake clock.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import TYPE_CHECKING, Any

import pytest
import trio
import trio.lowlevel
import trio.testing

from dynamo_trio import CannotConnect, Config
from dynamo_trio._ratelimit import LogLimiter
from dynamo_trio.request_plane import ConnectionPool, RequestPlaneServer
from dynamo_trio.request_plane._connection import describe_close
from dynamo_trio.request_plane._frames import (
    NONCE_SIZE,
    PROTOCOL_VERSION,
    Auth,
    Challenge,
    Close,
    Hello,
    Welcome,
)
from dynamo_trio.request_plane._protocol import client_proof
from dynamo_trio.request_plane._throttle import AuthTurns, source_key

from ._harness import CONFIG, RawPeer, fd_count, open_healthy, streaming_handler, wait_until

if TYPE_CHECKING:
    from collections.abc import Callable

TOKEN = "gate-token"
NONCE = b"g" * NONCE_SIZE
REAL = dataclasses.replace(CONFIG, heartbeat_interval=0.05, heartbeat_timeout=2.0)


async def start(nursery, **changes):
    config = dataclasses.replace(REAL, **changes)
    server = RequestPlaneServer(config, streaming_handler)
    host, port = await nursery.start(server.serve)
    return server, config, host, port


async def guess(host, port, token):
    """One full handshake with ``token``; the close code, or "welcome"."""
    peer = RawPeer(await trio.open_tcp_stream(host, port))
    try:
        await peer.send(Hello(PROTOCOL_VERSION, NONCE))
        challenge = await peer.expect(Challenge, seconds=30)  # a hang guard only
        await peer.send(Auth(client_proof(token, challenge.nonce, NONCE)))
        with trio.fail_after(30):  # a hang guard only
            while True:
                for frame in peer.received:
                    if isinstance(frame, Welcome):
                        return "welcome"
                    if isinstance(frame, Close):
                        return frame.code
                if peer.eof:
                    return "eof"
                await peer.read_for(0.05)
    finally:
        await peer.aclose()


# ----------------------------------------------------------------- caps


async def test_a_connection_beyond_the_handshake_cap_takes_the_oldest_ones_slot(nursery, caplog):
    caplog.set_level(logging.WARNING, logger="dynamo_trio")
    server, config, host, port = await start(nursery, max_handshakes=3, handshake_timeout=5)
    pool = ConnectionPool(config, nursery, name="healthy")
    healthy = await open_healthy(pool, f"{host}:{port}", nursery)
    baseline = fd_count()

    silent = []
    for count in range(1, 4):  # one after the other: their age is their order
        silent.append(RawPeer(await trio.open_tcp_stream(host, port)))
        await wait_until(_handshaking(server, count))
    newcomer = ConnectionPool(config, nursery, name="newcomer")
    connection = await newcomer.connect(f"{host}:{port}")  # the oldest silent one makes room
    assert connection.usable
    await silent[0].read_for(1)
    assert silent[0].eof
    assert not silent[1].eof and not silent[2].eof
    assert server.handshaking == 2
    evictions = [r for r in caplog.records if "dropping the oldest" in r.getMessage()]
    assert len(evictions) == 1
    await healthy.assert_flowing()  # an established connection is never crowded out

    for peer in silent:
        await peer.aclose()
    await wait_until(lambda: server.handshaking == 0)
    newcomer.close_all()
    await wait_until(lambda: server.sessions == 1)
    await wait_until(lambda: fd_count() <= baseline)
    pool.close_all()


async def test_connections_beyond_the_connection_cap_are_refused(nursery):
    server, config, host, port = await start(nursery, max_connections=3)
    pools = [ConnectionPool(config, nursery, name=f"c{i}") for i in range(4)]
    for pool in pools[:3]:
        await pool.connect(f"{host}:{port}")
    assert server.sessions == 3
    with pytest.raises(CannotConnect, match=r"too many connections \(limit 3\)"):
        await pools[3].connect(f"{host}:{port}")
    pools[0].close_all()
    await wait_until(lambda: server.sessions == 2)
    assert (await pools[3].connect(f"{host}:{port}")).usable
    for pool in pools:
        pool.close_all()


async def test_a_flood_of_handshakes_logs_a_few_lines_not_a_flood(nursery, caplog):
    caplog.set_level(logging.WARNING, logger="dynamo_trio")
    server, _, host, port = await start(nursery, max_handshakes=1, handshake_timeout=5)
    first = await trio.open_tcp_stream(host, port)
    await wait_until(lambda: server.handshaking == 1)
    baseline = fd_count()
    held = []
    for _ in range(60):
        stream = await trio.open_tcp_stream(host, port)
        held.append(stream)
    await wait_until(lambda: server.sessions == 1)  # each took the slot of the one before
    assert server.handshaking == 1
    evictions = [r for r in caplog.records if "dropping the oldest" in r.getMessage()]
    assert 1 <= len(evictions) <= 6, [r.getMessage() for r in evictions]
    for stream in held:
        await stream.aclose()
    await first.aclose()
    await wait_until(lambda: server.sessions == 0)
    await wait_until(lambda: fd_count() <= baseline)


async def test_tricklers_are_held_only_until_the_handshake_deadline(nursery):
    """Many connections trickling a byte now and then of a frame that would take far
    longer than the test: at most the handshake cap is held at once, and every one is
    cut off (the last ones, which nobody came after to evict, by the deadline alone)."""
    server, _, host, port = await start(nursery, max_handshakes=8, handshake_timeout=0.5)
    held = []
    cut = 0

    async def trickle():
        nonlocal cut
        stream = await trio.open_tcp_stream(host, port)
        try:
            await stream.send_all(b"\x00\x00\xff\xff")  # a 64 KiB frame, a byte at a time
            while True:
                await trio.sleep(0.05)
                await stream.send_all(b"x")
        except (trio.BrokenResourceError, OSError):
            cut += 1
        finally:
            await stream.aclose()

    async def watch():
        while True:
            held.append(server.handshaking)
            await trio.sleep(0.02)

    with trio.fail_after(60):  # a hang guard only
        async with trio.open_nursery() as watching:
            watching.start_soon(watch)
            async with trio.open_nursery() as tricklers:
                for _ in range(30):
                    tricklers.start_soon(trickle)
            watching.cancel_scope.cancel()
    assert cut == 30
    assert max(held) <= 8
    await wait_until(lambda: server.sessions == 0)


# ----------------------------------------------------------------- failed authentications


async def test_failed_authentications_are_refused_and_paced(nursery):
    server, _, host, port = await start(nursery, auth_token=TOKEN, auth_penalty=0.2)
    judged = []

    async def guesser():
        while True:
            code = await guess(host, port, "wrong")
            judged.append((trio.current_time(), code))

    started = trio.current_time()
    async with trio.open_nursery() as guessers:
        for _ in range(8):  # in parallel: the pace is in total, not per connection
            guessers.start_soon(guesser)
        await trio.sleep(2.0)
        guessers.cancel_scope.cancel()
    # However long the machine made that take: the bound is a rate over it.
    elapsed = trio.current_time() - started
    failures = [t for t, code in judged if code == "unauthenticated"]
    assert failures, judged
    assert {code for _, code in judged} <= {"unauthenticated", "throttled"}
    # One judged failure per 0.2 / 16 s in total, after a burst: however many
    # connections guess at once.
    turns = server.throttle
    assert len(failures) <= elapsed / turns.interval + turns.burst + 1, len(failures)
    assert await guess(host, port, TOKEN) == "welcome"
    assert len(server.throttle) == 0  # nobody waits for a turn any more
    await wait_until(lambda: server.sessions == 0)


async def test_a_proof_whose_turn_does_not_come_in_time_is_refused_at_its_deadline(nursery):
    server, _, host, port = await start(
        nursery, auth_token=TOKEN, auth_penalty=16.0, handshake_timeout=1.0
    )
    codes = [await guess(host, port, "wrong") for _ in range(server.throttle.burst)]
    assert codes == ["unauthenticated"] * server.throttle.burst  # the burst
    assert await guess(host, port, "wrong") == "throttled"  # the next turn is 1 s away


# ----------------------------------------------------------------- sans-IO parts


async def judge_at(turns, key, verdict, deadline=math.inf):
    result = await turns.judge(key, lambda: verdict, deadline=deadline)
    return trio.current_time(), key, result


async def test_failures_come_in_a_burst_then_one_per_interval(autojump_clock):
    turns = AuthTurns(1.6, burst=2)  # one per 0.1 s
    results = []

    async def one(key, verdict):
        results.append(await judge_at(turns, key, verdict))

    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(one, "a", False)
            await trio.lowlevel.checkpoint()
    times = [round(t, 6) for t, _, _ in results]
    assert times == [0.0, 0.0, 0.1, 0.2, 0.3]
    assert turns.failures == 5


async def test_a_success_costs_no_turn(autojump_clock):
    turns = AuthTurns(1.6, burst=1)
    assert (await judge_at(turns, "a", False))[2] is False  # t = 0
    assert await judge_at(turns, "b", True) == (pytest.approx(0.1), "b", True)
    assert await judge_at(turns, "c", False) == (pytest.approx(0.1), "c", False)  # at once


async def test_turns_go_round_the_sources_oldest_first_within_one(autojump_clock):
    turns = AuthTurns(1.6, burst=1)
    order = []

    async def one(key, name):
        def refuse() -> bool:
            order.append(name)
            return False

        await turns.judge(key, refuse, deadline=math.inf)

    async with trio.open_nursery() as nursery:
        for name in ("a1", "a2", "a3", "a4"):
            nursery.start_soon(one, "a", name)
            await trio.lowlevel.checkpoint()
        nursery.start_soon(one, "b", "b1")  # behind a flood from another source
        await trio.lowlevel.checkpoint()
        nursery.start_soon(one, "a", "a5")
    assert order == ["a1", "a2", "b1", "a3", "a4", "a5"]  # a1 was judged before b1 came
    assert len(turns) == 0


async def test_no_turn_before_the_deadline_is_none_and_leaves_the_queue(autojump_clock):
    turns = AuthTurns(16.0, burst=1)
    assert (await judge_at(turns, "a", False))[2] is False
    assert await judge_at(turns, "a", True, deadline=0.5) == (0.5, "a", None)
    assert len(turns) == 0
    assert await judge_at(turns, "a", True) == (1.0, "a", True)


@pytest.mark.parametrize(
    ("host", "key"),
    [
        ("10.1.2.3", "10.1.2.3"),
        ("::1", "::/64"),
        ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:bbbb::9", "2001:db8:1:2::/64"),
        ("::ffff:10.1.2.3", "10.1.2.3"),
        ("fe80::1%eth0", "fe80::/64"),
        ("not-an-ip", "not-an-ip"),
    ],
)
def test_sources_are_ipv4_hosts_or_ipv6_prefixes(host, key):
    assert source_key(host) == key


def test_the_log_limiter_lets_a_burst_through_then_one_line_per_interval(caplog):
    now = [0.0]
    logger = logging.getLogger("dynamo_trio.test_limiter")
    limiter = LogLimiter(logger, interval=10, burst=3, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger=logger.name)
    logged = [limiter.warning("kind", "event %d", i) for i in range(100)]
    assert logged.count(True) == 3
    assert limiter.warning("other", "another kind is counted apart")
    now[0] = 10.0
    assert limiter.warning("kind", "event after the interval")
    assert caplog.records[-1].getMessage() == (
        "event after the interval (97 more like this suppressed)"
    )
    assert not limiter.warning("kind", "too soon")


def test_the_new_limits_come_from_the_environment():
    config = Config.from_env(
        {
            "DYN_TCP_MAX_CONNECTIONS": "100",
            "DYN_TCP_MAX_HANDSHAKES": "10",
            "DYN_TCP_HANDSHAKE_TIMEOUT_SECS": "2.5",
            "DYN_TCP_AUTH_PENALTY_SECS": "0",
        }
    ).request_plane
    assert (config.max_connections, config.max_handshakes) == (100, 10)
    assert (config.handshake_timeout, config.auth_penalty) == (2.5, 0.0)
    with pytest.raises(ValueError, match="DYN_TCP_MAX_HANDSHAKES"):
        Config.from_env({"DYN_TCP_MAX_HANDSHAKES": "0"})
    with pytest.raises(ValueError, match="DYN_TCP_HANDSHAKE_TIMEOUT_SECS"):
        Config.from_env({"DYN_TCP_HANDSHAKE_TIMEOUT_SECS": "nan"})


async def test_closing_the_server_drops_connections_still_in_their_handshake(
    autojump_clock, no_errors_logged
):
    server = RequestPlaneServer(CONFIG, streaming_handler)
    ends = [trio.testing.memory_stream_pair() for _ in range(3)]
    async with trio.open_nursery() as nursery:
        for _, server_end in ends:
            nursery.start_soon(server.handle_connection, server_end, "10.0.0.9:1")
        peer = RawPeer(ends[0][0])
        await peer.send(Hello(PROTOCOL_VERSION, NONCE))
        await peer.expect(Challenge)  # one is mid-handshake, two never spoke
        assert server.handshaking == 3
        server.close_all()
        await wait_until(lambda: server.sessions == 0)
        assert server.handshaking == 0
        await peer.read_for(1)
        assert peer.eof


def test_text_a_peer_chose_cannot_forge_log_lines():
    close = Close("bye\nERROR forged line", "é\x1b[31m" + "x" * 1000)
    text = describe_close(close)
    assert "\n" not in text and "\x1b" not in text
    assert text.isascii() and len(text) <= 300
    assert text.startswith("bye\\nERROR forged line: \\xe9\\x1b[31m")


def _handshaking(server: Any, count: int) -> Callable[[], bool]:
    """Whether ``server`` holds ``count`` connections in their handshake."""
    return lambda: server.handshaking == count
