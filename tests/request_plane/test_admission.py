"""Who gets in when peers that have proven nothing press on a worker's gate.

In memory, under trio's autojump clock: floods of unauthenticated connections
(silent, trickling, guessing the token) from one address and from many, and
a peer with the right token connecting during them, from another address and
from the same one (a NAT, a shared host).  A peer that has proven nothing must
not deny service to one that can.
"""

from __future__ import annotations

import dataclasses
import itertools

import trio
import trio.testing

from dynamo_trio.request_plane import ConnectionPool, RequestPlaneServer
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

from ._harness import CONFIG, MemoryNetwork, RawPeer, streaming_handler, wait_until

TOKEN = "admission-token"
NONCE = b"a" * NONCE_SIZE
GATED = dataclasses.replace(CONFIG, auth_token=TOKEN, max_handshakes=4, handshake_timeout=1.0)
# Room for every guesser's connection, as the default cap leaves for a few guessing threads.
ROOMY = dataclasses.replace(GATED, max_handshakes=40)


class Flood:
    """Hostile connections, each replaced as soon as the server drops it."""

    def __init__(self, server: RequestPlaneServer, nursery: trio.Nursery) -> None:
        self.server = server
        self.nursery = nursery
        self.opened = 0
        self.verdicts: list[str] = []
        self._ports = itertools.count(1000)

    def connect(self, host: str) -> RawPeer:
        client_end, server_end = trio.testing.memory_stream_pair()
        self.nursery.start_soon(
            self.server.handle_connection, server_end, f"{host}:{next(self._ports)}"
        )
        self.opened += 1
        return RawPeer(client_end)

    async def silent(self, host: str, first_bytes: bytes = b"\x00\x00") -> None:
        """Send a couple of bytes, then nothing; reconnect when dropped."""
        while True:
            peer = self.connect(host)
            await peer.send_bytes(first_bytes)
            await peer.read_for(3600)
            await peer.aclose()
            await trio.sleep(0.01)  # reconnects at once (and lets virtual time pass)

    async def guess(self, host: str) -> None:
        """Guess the token again and again, one handshake at a time."""
        while True:
            peer = self.connect(host)
            await peer.send(Hello(PROTOCOL_VERSION, NONCE))
            try:
                challenge = await peer.expect(Challenge, seconds=5)
            except AssertionError:
                await peer.aclose()
                await trio.sleep(0.01)
                continue
            await peer.send(Auth(client_proof("wrong", challenge.nonce, NONCE)))
            await peer.read_for(5)
            codes = [f.code for f in peer.received if isinstance(f, Close)]
            self.verdicts.append(codes[0] if codes else "dropped")
            assert not any(isinstance(f, Welcome) for f in peer.received)
            await peer.aclose()
            await trio.sleep(0.01)


def gated_network(server: RequestPlaneServer, nursery: trio.Nursery, host: str) -> MemoryNetwork:
    network = MemoryNetwork(nursery)
    ports = itertools.count(1)
    network.route("worker:1", lambda s: server.handle_connection(s, f"{host}:{next(ports)}"))
    return network


async def connect_correctly(network: MemoryNetwork, nursery: trio.Nursery, times: int) -> int:
    """Connect ``times`` times with the right token, each with a fresh pool; how many got in."""
    got_in = 0
    for _ in range(times):
        pool = ConnectionPool(GATED, nursery, name="frontend", open_transport=network.open)
        try:
            connection = await pool.connect("worker:1")
        except Exception:
            continue
        got_in += connection.usable
        pool.close_all()
    return got_in


async def test_silent_connections_filling_the_handshake_slots_do_not_lock_a_correct_peer_out(
    autojump_clock,
):
    async with trio.open_nursery() as nursery:
        server = RequestPlaneServer(GATED, streaming_handler)
        flood = Flood(server, nursery)
        most = []

        async def watch():
            while True:
                most.append(server.handshaking)
                await trio.sleep(0.001)

        nursery.start_soon(watch)
        for index in range(16):  # four times as many as there are slots
            nursery.start_soon(flood.silent, f"10.6.6.{index}")
        await wait_until(lambda: server.handshaking == GATED.max_handshakes)
        network = gated_network(server, nursery, "10.0.0.1")
        assert await connect_correctly(network, nursery, 10) == 10
        assert max(most) <= GATED.max_handshakes
        assert flood.opened > 16  # the flood's connections were dropped, and came back
        nursery.cancel_scope.cancel()


async def test_a_trickling_flood_does_not_lock_a_correct_peer_out(autojump_clock):
    async with trio.open_nursery() as nursery:
        server = RequestPlaneServer(GATED, streaming_handler)
        flood = Flood(server, nursery)
        hello_half = b"\x00\x00\x00\x30" + b"x" * 10  # a frame header, then part of it
        for index in range(16):
            nursery.start_soon(flood.silent, f"10.6.6.{index}", hello_half)
        await wait_until(lambda: server.handshaking == GATED.max_handshakes)
        network = gated_network(server, nursery, "10.0.0.1")
        assert await connect_correctly(network, nursery, 10) == 10
        nursery.cancel_scope.cancel()


async def test_guessing_from_the_same_address_does_not_lock_a_correct_peer_out(autojump_clock):
    """Eight guessers on 127.0.0.1, and a frontend with the right token on it too
    (a NAT, a shared host): the frontend gets in every time, and the guesses stay paced
    in total."""
    async with trio.open_nursery() as nursery:
        server = RequestPlaneServer(ROOMY, streaming_handler)
        flood = Flood(server, nursery)
        for _ in range(8):
            nursery.start_soon(flood.guess, "127.0.0.1")
        await wait_until(lambda: len(flood.verdicts) >= 20, 30)
        network = gated_network(server, nursery, "127.0.0.1")
        started = trio.current_time()
        failed_before = flood.verdicts.count("unauthenticated")
        assert await connect_correctly(network, nursery, 5) == 5
        judged = flood.verdicts.count("unauthenticated") - failed_before
        elapsed = trio.current_time() - started
        # Paced in total: at most one judged failure per interval, plus the burst.
        assert judged <= elapsed / server.throttle.interval + server.throttle.burst + 1
        nursery.cancel_scope.cancel()


async def test_guessing_from_many_addresses_does_not_lock_a_correct_peer_out(autojump_clock):
    """32 guessers, each from its own address."""
    async with trio.open_nursery() as nursery:
        server = RequestPlaneServer(ROOMY, streaming_handler)
        flood = Flood(server, nursery)
        for index in range(32):
            nursery.start_soon(flood.guess, f"10.6.{index}.1")
        await wait_until(lambda: len(flood.verdicts) >= 20, 30)
        network = gated_network(server, nursery, "10.0.0.1")
        assert await connect_correctly(network, nursery, 5) == 5
        nursery.cancel_scope.cancel()


async def test_judged_failures_are_paced_in_total_however_many_addresses_guess(autojump_clock):
    async with trio.open_nursery() as nursery:
        server = RequestPlaneServer(ROOMY, streaming_handler)
        flood = Flood(server, nursery)
        for index in range(32):
            nursery.start_soon(flood.guess, f"10.6.{index}.1")
        await trio.sleep(1.0)
        failed_at_start = flood.verdicts.count("unauthenticated")
        await trio.sleep(2.0)
        judged = flood.verdicts.count("unauthenticated") - failed_at_start
        assert 0 < judged <= 2.0 / server.throttle.interval + server.throttle.burst + 1
        nursery.cancel_scope.cancel()


async def test_with_no_handshake_slots_every_connection_is_refused_with_a_reason(
    autojump_clock,
):
    async with trio.open_nursery() as nursery:
        server = RequestPlaneServer(dataclasses.replace(GATED, max_handshakes=0), streaming_handler)
        peer = Flood(server, nursery).connect("10.0.0.1")
        close = await peer.expect(Close)
        assert close.code == "unavailable"
        await peer.aclose()
        assert server.sessions == 0
        nursery.cancel_scope.cancel()
