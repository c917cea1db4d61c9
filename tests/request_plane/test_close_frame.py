"""Issue 12, item 1: a ``close`` frame can never crash a process, on either side.

Before the fix, a peer that sent ``close`` and stayed open made the next
heartbeat's ``send(Ping())`` raise ``RuntimeError: the connection is closed``
out of the connection's nursery: it took the worker down (every request on
every connection), and the other way round the frontend.  These tests use real
sockets, real heartbeats and a healthy connection beside the hostile one.
"""

from __future__ import annotations

import dataclasses

import pytest
import trio

from dynamo_trio import CannotConnect, Disconnected
from dynamo_trio.request_plane import ConnectionPool, RequestPlaneServer
from dynamo_trio.request_plane._frames import (
    NONCE_SIZE,
    PROTOCOL_VERSION,
    Auth,
    Challenge,
    Close,
    Hello,
    Ping,
    RawRequest,
    Request,
    Welcome,
)
from dynamo_trio.request_plane._protocol import client_proof, server_proof

from ._harness import CONFIG, RawPeer, fd_count, open_healthy, streaming_handler, wait_until

TOKEN = "t0ken"
NONCE = b"n" * NONCE_SIZE
# Real time here: heartbeats every 20 ms; a raw bystander's pings count the ticks that
# pass on the other side while a hostile peer lingers after its close.
REAL = dataclasses.replace(CONFIG, heartbeat_interval=0.02, heartbeat_timeout=1.0)

SERVER_STATES = ["before-hello", "after-hello", "after-wrong-auth", "after-welcome", "in-a-stream"]


async def drive_to(peer: RawPeer, state: str, token: str | None) -> None:
    """Take a raw client to ``state`` against a real server."""
    if state == "before-hello":
        return
    await peer.send(Hello(PROTOCOL_VERSION, NONCE, "hostile"))
    challenge = await peer.expect(Challenge)
    if state == "after-hello":
        return
    if state == "after-wrong-auth":
        await peer.send(Auth(b"w" * 32 if token else None))
        return
    proof = None if token is None else client_proof(token, challenge.nonce, NONCE)
    await peer.send(Auth(proof))
    await peer.expect(Welcome)
    if state == "in-a-stream":
        await peer.send(Request(1, "e", 1, "hostile", None, 2))


async def pings(peer: RawPeer, count: int) -> None:
    """Wait until ``peer``, an established raw end, has received ``count`` more pings: as
    many heartbeat ticks of the real end's, which ticks every connection's on one interval.
    Each is answered, so that the real end's heartbeat timeout never ends this one."""
    seen = 0
    with trio.fail_after(30):  # a hang guard only
        while seen < count:
            assert not peer.eof, "the watching connection ended"
            before = len(peer.received)
            await peer._read_once()
            for frame in peer.received[before:]:
                if isinstance(frame, Ping):
                    seen += 1
                    await peer.send(Ping())
            del peer.received[before:]


@pytest.mark.parametrize("token", [None, TOKEN], ids=["no-token", "token"])
@pytest.mark.parametrize("state", SERVER_STATES)
async def test_a_close_from_a_client_ends_that_connection_only(
    state, token, nursery, no_errors_logged
):
    config = dataclasses.replace(REAL, auth_token=token)
    server = RequestPlaneServer(config, streaming_handler)
    host, port = await nursery.start(server.serve)
    pool = ConnectionPool(config, nursery, name="healthy")
    healthy = await open_healthy(pool, f"{host}:{port}", nursery)
    # A raw bystander, established, whose pings count the worker's heartbeat ticks.
    watcher = RawPeer(await trio.open_tcp_stream(host, port))
    await drive_to(watcher, "after-welcome", token)
    baseline = fd_count()

    peer = RawPeer(await trio.open_tcp_stream(host, port))
    await drive_to(peer, state, token)
    await peer.send(Close("bye", "the hostile peer says close"))
    await pings(watcher, 5)  # and stays open: the worker's heartbeats tick meanwhile
    await peer.send(Ping(), Close("again"))  # more frames after the close change nothing
    await peer.read_for(30)  # a hang guard only: it ends at the EOF
    assert peer.eof, "the worker did not end the connection"
    await peer.aclose()

    await healthy.assert_flowing()
    await pings(watcher, 1)  # the bystander is served on, too
    await wait_until(lambda: server.sessions <= 2, 30)  # a hang guard only
    assert fd_count() == baseline
    await watcher.aclose()
    pool.close_all()


async def test_a_close_from_a_client_kills_its_streams_as_transport_lost(nursery):
    seen = []

    async def handler(stream):
        seen.append(stream)
        await streaming_handler(stream)

    server = RequestPlaneServer(REAL, handler)
    host, port = await nursery.start(server.serve)
    peer = RawPeer(await trio.open_tcp_stream(host, port))
    await drive_to(peer, "in-a-stream", None)
    await wait_until(lambda: bool(seen), 30)  # a hang guard only
    await peer.send(Close("bye"))
    await wait_until(lambda: bool(seen[0].context.is_killed()), 30)  # a hang guard only
    assert seen[0].cancel_signal.value == "transport lost"
    await peer.aclose()


# ----------------------------------------------------------------- the client side

CLIENT_STATES = ["before-challenge", "after-challenge", "after-welcome", "in-a-stream"]


async def welcome(peer: RawPeer, token: str | None) -> None:
    """Play a worker's part of the handshake, up to its welcome."""
    hello = await peer.expect(Hello, seconds=30)
    await peer.send(Challenge(PROTOCOL_VERSION, NONCE))
    await peer.expect(Auth, seconds=30)
    proof = None if token is None else server_proof(token, NONCE, hello.nonce)
    await peer.send(Welcome(PROTOCOL_VERSION, "fake", 8, 1 << 20, proof))


async def fake_worker(
    stream: trio.SocketStream,
    state: str,
    token: str | None,
    connected: trio.Event,
    leave: trio.Event,
) -> None:
    """A worker that sends ``close`` at ``state`` (once the caller holds the connection,
    ``connected``) and then stays open until told to ``leave``."""
    peer = RawPeer(stream)
    if state == "before-challenge":
        await peer.expect(Hello, seconds=30)
    elif state == "after-challenge":
        await peer.expect(Hello, seconds=30)
        await peer.send(Challenge(PROTOCOL_VERSION, NONCE))
        await peer.expect(Auth, seconds=30)
    else:
        await welcome(peer, token)
        if state == "in-a-stream":
            await peer.expect(RawRequest, seconds=30)
        else:
            await connected.wait()
    await peer.send(Close("bye", "the fake worker says close"))
    with trio.move_on_after(30):  # a hang guard only
        async with trio.open_nursery() as nursery:
            nursery.start_soon(peer.read_for, 30)  # stays open while the caller's heartbeats tick
            await leave.wait()
            nursery.cancel_scope.cancel()
    await peer.aclose()


async def ping_counter(stream: trio.SocketStream, token: str | None, peers: list[RawPeer]) -> None:
    """A worker that welcomes the caller and then only answers its pings (see :func:`pings`)."""
    peer = RawPeer(stream)
    await welcome(peer, token)
    peers.append(peer)
    await trio.sleep_forever()


@pytest.mark.parametrize("token", [None, TOKEN], ids=["no-token", "token"])
@pytest.mark.parametrize("state", CLIENT_STATES)
async def test_a_close_from_a_worker_ends_that_connection_only(
    state, token, nursery, no_errors_logged
):
    config = dataclasses.replace(REAL, auth_token=token)
    server = RequestPlaneServer(config, streaming_handler)
    host, port = await nursery.start(server.serve)
    connected, leave = trio.Event(), trio.Event()
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    fake_port = listeners[0].socket.getsockname()[1]
    nursery.start_soon(
        trio.serve_listeners, lambda s: fake_worker(s, state, token, connected, leave), listeners
    )
    counters: list[RawPeer] = []
    counter_listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    counter_port = counter_listeners[0].socket.getsockname()[1]
    nursery.start_soon(
        trio.serve_listeners, lambda s: ping_counter(s, token, counters), counter_listeners
    )
    pool = ConnectionPool(config, nursery, name="caller")
    healthy = await open_healthy(pool, f"{host}:{port}", nursery)
    # A raw bystander the caller is connected to, whose pings count its heartbeat ticks.
    await pool.connect(f"127.0.0.1:{counter_port}")
    await wait_until(lambda: bool(counters), 30)  # a hang guard only
    [counter] = counters
    baseline = fd_count()

    address = f"127.0.0.1:{fake_port}"
    if state in ("before-challenge", "after-challenge"):
        with pytest.raises(CannotConnect, match="refused the connection: bye"):
            await pool.connect(address)
    else:
        connection = await pool.connect(address)
        connected.set()
        if state == "in-a-stream":
            stream = connection.open_stream(
                endpoint="e", instance_id=1, request_id="r", payload=None
            )
            with pytest.raises(Disconnected, match="the fake worker says close"):
                await stream.receive()
        await wait_until(lambda: bool(connection.closed), 30)  # a hang guard only
        assert "the fake worker says close" in (connection.close_reason or "")
    await pings(counter, 5)  # the fake worker lingers; the caller's heartbeats tick
    leave.set()
    await healthy.assert_flowing()
    await wait_until(lambda: fd_count() <= baseline, 30)  # a hang guard only
    pool.close_all()
