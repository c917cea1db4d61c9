"""The hostile-peer suite: every frame type, in every connection state, from each side.

For each side (a hostile client against a real server, a hostile worker
against a real client pool), with and without a token, the hostile end takes
its connection to a state (before hello, after hello, after an auth without or
with a wrong token, after welcome, after goaway, after close) and sends one
frame of every type, plus malformed and oversized bytes.  After each case:

* the test's trio run is alive (nothing escaped into a nursery);
* the connection did what the sans-IO machine in the same state says (a
  *shadow* fed the same bytes): closed on a violation, open otherwise;
* a healthy connection to the same server / from the same pool keeps its
  stream flowing;
* once the hostile end goes away, the server holds only the healthy session.

Everything runs over ``trio.testing.memory_stream_pair`` under the autojump
clock, so the whole matrix takes a few seconds.  Real-socket cases (the accept
path, file descriptors) are in ``test_gate.py`` and ``test_close_frame.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import hypothesis.strategies as st
import msgspec
import pytest
import trio
import trio.testing
from hypothesis import given, settings

from dynamo_trio import CannotConnect, Disconnected, DynamoError, ProtocolError, Unknown
from dynamo_trio._context import CancelReason
from dynamo_trio.request_plane import ConnectionPool, RequestPlaneServer
from dynamo_trio.request_plane._frames import (
    NONCE_SIZE,
    PROTOCOL_VERSION,
    Auth,
    Challenge,
    Close,
    Control,
    Credit,
    End,
    Error,
    FrameDecoder,
    GoAway,
    Hello,
    Item,
    Ping,
    RawRequest,
    Request,
    Welcome,
)
from dynamo_trio.request_plane._protocol import (
    ConnectionState,
    Role,
    client_proof,
    server_proof,
)
from tests._fuzz import examples

from ._harness import (
    CONFIG,
    LIMIT,
    MemoryNetwork,
    RawPeer,
    drain,
    fd_count,
    open_healthy,
    shadow,
    streaming_handler,
    wait_until,
    wire,
)

S = ConnectionState
TOKEN = "the-token"
NONCE = b"h" * NONCE_SIZE


def with_prefix(body):
    """A frame with any msgpack body at all."""
    encoded = msgspec.msgpack.encode(body)
    return len(encoded).to_bytes(4, "big") + encoded


# One of each frame type, plus bytes no frame decoder should accept.
PAYLOADS = {
    "hello": wire(Hello(PROTOCOL_VERSION, NONCE, "x")),
    "challenge": wire(Challenge(PROTOCOL_VERSION, NONCE)),
    "auth": wire(Auth(b"p" * 32)),
    "welcome": wire(Welcome(PROTOCOL_VERSION, "w", 8, LIMIT)),
    "ping": wire(Ping()),
    "goaway": wire(GoAway("bye")),
    "close": wire(Close("bye", "hostile")),
    "req": wire(Request(2, "e", 1, "r", {"p": 1}, 2)),
    "req-nan-timeout": wire(Request(2, "e", 1, "r", None, 2, math.nan)),
    "req-bad-header": with_prefix(["req", 2, "e", 1, "r", None, 2, None, {"a": 1}]),
    "item": wire(Item(1, "x")),
    "end": wire(End(1, "complete")),
    "err": wire(Error(1, "Unknown", "x")),
    "ctl": wire(Control(1, "kill", "hostile")),
    "ctl-never-opened": wire(Control(99, "kill")),
    "credit": wire(Credit(1, 1)),
    "credit-zero": wire(Credit(1, 0)),
    "garbage": b"\x00\x00\x00\x05\xc1\xc1\xc1\xc1\xc1",
    "oversized": (32 * 1024 * 1024).to_bytes(4, "big") + b"x" * 1000,
    "tls-client-hello": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(64),
    "partial": wire(Ping())[:-1],
}


# How long a hostile connection may outlive its peer's last byte.
BOUND = CONFIG.heartbeat_timeout + CONFIG.handshake_timeout + 1


def config(token):
    return dataclasses.replace(CONFIG, auth_token=token)


def predict(conn, data, token):
    """(closed?, the close code the shadow queued or None) after ``data``."""
    with contextlib.suppress(ProtocolError):
        conn.receive_data(data)
    if conn.state is S.AUTHENTICATING:
        # The real server judges a proof made for a nonce nobody could know.
        conn.authenticate() if token is None else conn.send(Close("unauthenticated"))
    queued = FrameDecoder(LIMIT).feed(conn.data_to_send())
    codes = [frame.code for frame in queued if isinstance(frame, Close)]
    return conn.closed, codes[0] if codes else None


# ----------------------------------------------------------------- hostile clients

SERVER_CASES = {
    # state: (what the shadow server is in afterwards, with and without a token)
    "before-hello": (S.AWAIT_HELLO, S.AWAIT_HELLO),
    "after-hello": (S.AWAIT_AUTH, S.AWAIT_AUTH),
    "after-auth-without-proof": (S.CLOSED, S.OPEN),
    "after-auth-wrong-token": (S.CLOSED, S.OPEN),
    "after-welcome": (S.OPEN, S.OPEN),
    "after-goaway": (S.DRAINING, S.DRAINING),
    "after-close": (S.CLOSED, S.CLOSED),
}


async def drive_client(peer, case, token, server):
    """Take a raw client to ``case``; returns once the server's side is there."""
    if case == "before-hello":
        return
    await peer.send(Hello(PROTOCOL_VERSION, NONCE, "hostile"))
    challenge = await peer.expect(Challenge)
    if case == "after-hello":
        return
    if case in ("after-auth-without-proof", "after-auth-wrong-token"):
        proof = None if case == "after-auth-without-proof" else client_proof("nope", NONCE, NONCE)
        await peer.send(Auth(proof))
        if token is None:
            await peer.expect(Welcome)
        else:
            close = await peer.expect(Close)
            assert close.code == "unauthenticated"
        return
    proof = None if token is None else client_proof(token, challenge.nonce, NONCE)
    await peer.send(Auth(proof))
    await peer.expect(Welcome)
    await peer.send(Request(1, "e", 1, "hostile", None, 2))
    await peer.expect(Item)  # stream 1 is served
    if case == "after-goaway":
        server.go_away()
        await peer.expect(GoAway)
    elif case == "after-close":
        await peer.send(Close("bye"))


SERVER_MATRIX = [
    (case, token, payload)
    for case in SERVER_CASES
    for token in (None, TOKEN)
    for payload in PAYLOADS
]


@pytest.mark.parametrize(
    ("case", "token", "payload"),
    SERVER_MATRIX,
    ids=[f"{c}-{'token' if t else 'open'}-{p}" for c, t, p in SERVER_MATRIX],
)
async def test_a_hostile_client(case, token, payload, autojump_clock, no_errors_logged):
    async with trio.open_nursery() as nursery:
        server = RequestPlaneServer(config(token), streaming_handler)
        network = MemoryNetwork(nursery)
        network.route("worker:1", lambda s: server.handle_connection(s, peer="10.0.0.1:1"))
        pool = ConnectionPool(config(token), nursery, name="healthy", open_transport=network.open)
        healthy = await open_healthy(pool, "worker:1", nursery)

        client_end, server_end = trio.testing.memory_stream_pair()
        gone = trio.Event()

        async def serve_hostile():
            await server.handle_connection(server_end, peer="10.6.6.6:666")
            gone.set()

        nursery.start_soon(serve_hostile)
        peer = RawPeer(client_end)
        await drive_client(peer, case, token, server)
        state = SERVER_CASES[case][0 if token else 1]
        expect_closed, expect_code = predict(
            shadow(
                Role.SERVER,
                state,
                stream=case not in ("after-auth-without-proof", "after-auth-wrong-token"),
            ),
            PAYLOADS[payload],
            token,
        )

        await peer.send_bytes(PAYLOADS[payload])
        await peer.read_for(0.3)
        await healthy.assert_flowing()
        if expect_closed:
            with trio.fail_after(1):
                await gone.wait()
            if expect_code is not None and state is not S.CLOSED:
                closes = [f for f in peer.received if isinstance(f, Close)]
                assert closes and closes[-1].code == expect_code, peer.received
        else:
            assert not gone.is_set(), "the server closed a connection that broke no rule"
            assert not any(isinstance(f, Close) for f in peer.received)

        # The hostile peer goes quiet, then away: it is dropped, in bounded time.
        with trio.fail_after(BOUND):
            if not gone.is_set():
                await trio.sleep(0.5)
                await peer.aclose()
                await gone.wait()
        assert server.sessions == 1
        assert server.handshaking == 0
        await healthy.assert_flowing()
        pool.close_all()
        server.close_all()
        nursery.cancel_scope.cancel()


async def test_a_trickling_client_is_cut_off_at_the_handshake_deadline(autojump_clock):
    server = RequestPlaneServer(config(TOKEN), streaming_handler)
    client_end, server_end = trio.testing.memory_stream_pair()
    peer = RawPeer(client_end)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.handle_connection, server_end, "10.6.6.6:1")
        start = trio.current_time()
        await peer.send(Hello(PROTOCOL_VERSION, NONCE))
        # A byte at a time, never a whole frame: no byte buys more time.
        for byte in wire(Auth(b"x" * 32))[:-1]:
            await trio.sleep(0.1)
            if not await peer.send_bytes(bytes([byte])):
                break
        await peer.read_for(5)
        assert peer.eof
        assert server.sessions == 0
        elapsed = trio.current_time() - start
        assert CONFIG.handshake_timeout <= elapsed < CONFIG.handshake_timeout + 0.5


async def test_a_trickling_authenticated_client_is_cut_off_by_the_heartbeat(autojump_clock):
    """After welcome only whole frames are a sign of life, never stray bytes."""
    server = RequestPlaneServer(config(None), streaming_handler)
    client_end, server_end = trio.testing.memory_stream_pair()
    peer = RawPeer(client_end)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.handle_connection, server_end, "10.6.6.6:1")
        await peer.send(Hello(PROTOCOL_VERSION, NONCE))
        await peer.expect(Challenge)
        await peer.send(Auth())
        await peer.expect(Welcome)
        start = trio.current_time()
        big = wire(Request(1, "e", 1, "r", "x" * 10_000, 1))
        with trio.move_on_after(30):
            for byte in big:
                if not await peer.send_bytes(bytes([byte])):
                    break
                await trio.sleep(0.05)
        elapsed = trio.current_time() - start
        assert CONFIG.heartbeat_timeout <= elapsed < CONFIG.heartbeat_timeout + 0.5
        assert server.sessions == 0


# ----------------------------------------------------------------- hostile workers

CLIENT_CASES = {
    "before-challenge": S.AWAIT_CHALLENGE,
    "after-challenge": S.AWAIT_WELCOME,
    "after-welcome": S.OPEN,
    "after-goaway": S.DRAINING,
    "after-close": S.CLOSED,
}


def hostile_worker(case, token, payload, steps):
    """A worker script: drives to ``case``, sends ``payload``, then holds on."""

    async def serve(stream):
        peer = RawPeer(stream)
        steps["peer"] = peer
        hello = await peer.expect(Hello)
        if case != "before-challenge":
            await peer.send(Challenge(PROTOCOL_VERSION, NONCE))
            await peer.expect(Auth)
            if case != "after-challenge":
                proof = None if token is None else server_proof(token, NONCE, hello.nonce)
                await peer.send(Welcome(PROTOCOL_VERSION, "hostile", 8, LIMIT, proof))
                await peer.expect(RawRequest, seconds=5)  # the caller opened stream 1
                await peer.send(Item(1, "first"))
                await steps["stream_seen_item"].wait()
                if case == "after-goaway":
                    await peer.send(GoAway("bye"))
                elif case == "after-close":
                    await peer.send(Close("bye"))
        await peer.send_bytes(PAYLOADS[payload])
        steps["sent"].set()
        await peer.read_for(60)

    return serve


CLIENT_MATRIX = [
    (case, token, payload)
    for case in CLIENT_CASES
    for token in (None, TOKEN)
    for payload in PAYLOADS
]


@pytest.mark.parametrize(
    ("case", "token", "payload"),
    CLIENT_MATRIX,
    ids=[f"{c}-{'token' if t else 'open'}-{p}" for c, t, p in CLIENT_MATRIX],
)
async def test_a_hostile_worker(case, token, payload, autojump_clock, no_errors_logged):
    async with trio.open_nursery() as nursery:
        server = RequestPlaneServer(config(token), streaming_handler)
        network = MemoryNetwork(nursery)
        network.route("worker:1", lambda s: server.handle_connection(s, peer="10.0.0.1:1"))
        steps = {"sent": trio.Event(), "stream_seen_item": trio.Event()}
        network.route("hostile:1", hostile_worker(case, token, payload, steps))
        pool = ConnectionPool(config(token), nursery, name="caller", open_transport=network.open)
        healthy = await open_healthy(pool, "worker:1", nursery)

        state = CLIENT_CASES[case]
        prediction = shadow(Role.CLIENT, state, token=token)
        expect_closed, _ = predict(prediction, PAYLOADS[payload], token)
        # After goaway, the connection is retired once its last stream has ended.
        retired = prediction.state is S.DRAINING and prediction.open_streams == 0

        if state in (S.AWAIT_CHALLENGE, S.AWAIT_WELCOME):
            if prediction.is_established:
                connection = await pool.connect("hostile:1")
                assert connection.usable or connection.closed
            else:
                with pytest.raises(CannotConnect):
                    await pool.connect("hostile:1")
        else:
            connection = await pool.connect("hostile:1")
            stream = connection.open_stream(
                endpoint="e", instance_id=1, request_id="r", payload=None
            )
            first = await stream.receive()
            assert first is not None and first.data == "first"
            steps["stream_seen_item"].set()
            await steps["sent"].wait()
            await trio.sleep(0.3)
            assert connection.closed == (expect_closed or retired), (
                connection.close_reason,
                prediction.state,
            )
            if retired:
                # Its own terminal frame, not a loss (Disconnected).
                with contextlib.suppress(Unknown) if payload == "err" else contextlib.nullcontext():
                    await drain(stream)
                assert not connection.usable
            elif connection.closed:
                with pytest.raises(Disconnected):
                    await drain(stream)
                assert not connection.usable
        await healthy.assert_flowing()
        assert [c.address for c in pool.connections() if c.usable] in (
            ["worker:1"],
            ["worker:1", "hostile:1"],
        )
        pool.close_all()
        server.close_all()
        nursery.cancel_scope.cancel()


# ----------------------------------------------------------------- random sequences

FRAMES = st.one_of(
    st.builds(Hello, version=st.sampled_from([1, 2, 3]), nonce=st.sampled_from([NONCE, b""])),
    st.builds(Challenge, version=st.sampled_from([2, 3]), nonce=st.sampled_from([NONCE, b"x"])),
    st.builds(Auth, proof=st.none() | st.binary(max_size=33)),
    st.builds(Welcome, version=st.sampled_from([2, 3])),
    st.builds(Ping),
    st.builds(GoAway),
    st.builds(Close, code=st.just("bye")),
    st.builds(
        Request,
        sid=st.integers(-1, 4),
        endpoint=st.just("e"),
        instance_id=st.just(1),
        request_id=st.sampled_from(["r", ""]),
        payload=st.none(),
        window=st.integers(-1, 3),
        timeout=st.none() | st.floats(),
    ),
    st.builds(Item, sid=st.integers(-1, 4)),
    st.builds(End, sid=st.integers(-1, 4), outcome=st.just("complete")),
    st.builds(Error, sid=st.integers(-1, 4), code=st.just("Unknown"), message=st.just("x")),
    st.builds(Control, sid=st.integers(-1, 4), action=st.sampled_from(["stop", "kill"])),
    st.builds(Credit, sid=st.integers(-1, 4), items=st.integers(-1, 3)),
)
CHUNK = st.one_of(
    st.lists(FRAMES, min_size=1, max_size=4).map(lambda frames: wire(*frames)),
    st.binary(min_size=1, max_size=64),
)
# A plausible opening (a real handshake) followed by anything, or anything at all.
SEQUENCES = st.tuples(
    st.booleans(), st.lists(st.tuples(CHUNK, st.sampled_from([0, 0.01, 0.3])), max_size=6)
)


def run_in_trio(test):
    trio.run(test, clock=trio.testing.MockClock(autojump_threshold=0))


@settings(max_examples=examples(60), deadline=None)
@given(sequence=SEQUENCES, token=st.sampled_from([None, TOKEN]))
def test_random_sequences_from_a_client_never_disturb_the_server(sequence, token):
    handshake_first, chunks = sequence

    async def main():
        async with trio.open_nursery() as nursery:
            server = RequestPlaneServer(config(token), streaming_handler)
            network = MemoryNetwork(nursery)
            network.route("worker:1", lambda s: server.handle_connection(s, peer="10.0.0.1:1"))
            pool = ConnectionPool(config(token), nursery, name="h", open_transport=network.open)
            healthy = await open_healthy(pool, "worker:1", nursery)
            client_end, server_end = trio.testing.memory_stream_pair()
            nursery.start_soon(server.handle_connection, server_end, "10.6.6.6:6")
            peer = RawPeer(client_end)
            if handshake_first:
                await drive_client(peer, "after-welcome", token, server)
            for data, pause in chunks:
                if not await peer.send_bytes(data):
                    break
                await trio.sleep(pause)
            await healthy.assert_flowing()
            await peer.aclose()
            await wait_until(lambda: server.sessions <= 1, BOUND)
            await healthy.assert_flowing()
            pool.close_all()
            server.close_all()
            nursery.cancel_scope.cancel()

    run_in_trio(main)


@settings(max_examples=examples(60), deadline=None)
@given(sequence=SEQUENCES, token=st.sampled_from([None, TOKEN]))
def test_random_sequences_from_a_worker_never_disturb_the_caller(sequence, token):
    handshake_first, chunks = sequence

    async def main():
        async with trio.open_nursery() as nursery:
            server = RequestPlaneServer(config(token), streaming_handler)
            network = MemoryNetwork(nursery)
            network.route("worker:1", lambda s: server.handle_connection(s, peer="10.0.0.1:1"))

            async def hostile(stream):
                peer = RawPeer(stream)
                hello = await peer.expect(Hello)
                if handshake_first:
                    await peer.send(Challenge(PROTOCOL_VERSION, NONCE))
                    await peer.expect(Auth)
                    proof = None if token is None else server_proof(token, NONCE, hello.nonce)
                    await peer.send(Welcome(PROTOCOL_VERSION, "h", 8, LIMIT, proof))
                for data, pause in chunks:
                    if not await peer.send_bytes(data):
                        return
                    await trio.sleep(pause)
                await peer.read_for(2)
                await peer.aclose()

            network.route("hostile:1", hostile)
            pool = ConnectionPool(config(token), nursery, name="h", open_transport=network.open)
            healthy = await open_healthy(pool, "worker:1", nursery)
            try:
                connection = await pool.connect("hostile:1")
            except CannotConnect:
                pass
            else:
                if connection.usable:
                    stream = connection.open_stream(
                        endpoint="e", instance_id=1, request_id="r", payload=None
                    )
                    try:  # the stream ends, or errs with a typed error, nothing else
                        with trio.move_on_after(3):
                            while await stream.receive() is not None:
                                pass
                    except DynamoError:
                        pass
                    stream.kill(CancelReason.STREAM_CLOSED)
            await healthy.assert_flowing()
            pool.close_all()
            server.close_all()
            nursery.cancel_scope.cancel()

    run_in_trio(main)


# ----------------------------------------------------------------- the same over real sockets


@pytest.mark.parametrize("case", ["before-hello", "after-welcome"])
async def test_every_payload_over_real_sockets_leaves_no_descriptor_behind(
    case, nursery, no_errors_logged
):
    """The accept path and real file descriptors: each payload from its own
    connection, one after another, beside a healthy stream."""
    real = dataclasses.replace(config(TOKEN), heartbeat_interval=0.05, heartbeat_timeout=2.0)
    server = RequestPlaneServer(real, streaming_handler)
    host, port = await nursery.start(server.serve)
    pool = ConnectionPool(real, nursery, name="healthy")
    healthy = await open_healthy(pool, f"{host}:{port}", nursery)
    baseline = fd_count()
    for name, data in PAYLOADS.items():
        peer = RawPeer(await trio.open_tcp_stream(host, port))
        await drive_client(peer, case, TOKEN, server)
        await peer.send_bytes(data)
        await peer.read_for(0.05)
        await peer.aclose()
        await wait_until(lambda: server.sessions == 1)
        assert fd_count() <= baseline, name
        await healthy.assert_flowing(at_least=1)
    pool.close_all()


async def test_every_payload_from_a_real_worker_socket_leaves_no_descriptor_behind(
    nursery, no_errors_logged
):
    real = dataclasses.replace(config(TOKEN), heartbeat_interval=0.05, heartbeat_timeout=2.0)
    server = RequestPlaneServer(real, streaming_handler)
    host, port = await nursery.start(server.serve)
    pool = ConnectionPool(real, nursery, name="caller")
    healthy = await open_healthy(pool, f"{host}:{port}", nursery)
    for name in PAYLOADS:
        steps = {"sent": trio.Event(), "stream_seen_item": trio.Event()}
        script = hostile_worker("after-welcome", TOKEN, name, steps)
        baseline = fd_count()
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        hostile_port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as fake:
            fake.start_soon(trio.serve_listeners, script, listeners)
            connection = await pool.connect(f"127.0.0.1:{hostile_port}")
            stream = connection.open_stream(
                endpoint="e", instance_id=1, request_id="r", payload=None
            )
            first = await stream.receive()
            assert first is not None and first.data == "first"
            steps["stream_seen_item"].set()
            await steps["sent"].wait()
            await trio.sleep(0.05)
            stream.kill(CancelReason.STREAM_CLOSED)
            connection.close("done")
            fake.cancel_scope.cancel()

        def back_to_baseline(limit: int = baseline) -> bool:
            return fd_count() <= limit

        await wait_until(back_to_baseline)  # the listener too
        await healthy.assert_flowing(at_least=1)
    pool.close_all()
