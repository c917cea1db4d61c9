"""The handshake and the transition tables, sans I/O: bytes in, bytes out.

The four-frame handshake (hello, challenge, auth, welcome) with and without a
token; replayed and forged proofs; version mismatches; the tables that decide
what every frame does in every state; and hypothesis-generated frame
sequences sent by an unauthenticated peer, which must never get anything but
a refusal.
"""

from __future__ import annotations

from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from dynamo_trio import ProtocolError
from dynamo_trio.request_plane._frames import (
    HANDSHAKE_MAX_FRAME_SIZE,
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
    encode_frame,
)
from dynamo_trio.request_plane._protocol import (
    CLIENT_STATES,
    RECEIVE,
    SEND,
    SERVER_STATES,
    ConnectionState,
    ProtocolConnection,
    Receive,
    Role,
    Send,
    client_proof,
    server_proof,
)
from tests._fuzz import examples

S = ConnectionState
LIMIT = 1 << 20
TOKEN = "s3cret-token"
CLIENT_NONCE = b"c" * NONCE_SIZE
SERVER_NONCE = b"s" * NONCE_SIZE


def make_server(token=None, nonce=SERVER_NONCE):
    return ProtocolConnection(
        Role.SERVER,
        max_frame_size=LIMIT,
        max_streams=8,
        token=token,
        peer_name="worker",
        nonce=nonce,
    )


def make_client(token=None, nonce=CLIENT_NONCE):
    return ProtocolConnection(
        Role.CLIENT, max_frame_size=LIMIT, token=token, peer_name="frontend", nonce=nonce
    )


def wire(*frames):
    out = bytearray()
    for frame in frames:
        encode_frame(frame, out, LIMIT)
    return bytes(out)


def sent(conn):
    return FrameDecoder(LIMIT).feed(conn.data_to_send())


def request(sid=1):
    return Request(sid, "generate", 1, f"req-{sid}", {"prompt": "hi"}, 4)


def handshake(client, server):
    client.start()
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    server.receive_data(client.data_to_send())
    ok = server.authenticate()
    client_frames = client.receive_data(server.data_to_send())
    return ok, client_frames


# ----------------------------------------------------------------- the handshake


def test_the_handshake_is_four_frames_and_opens_both_ends():
    client, server = make_client(), make_server()
    client.start()
    assert state_of(client) is S.AWAIT_CHALLENGE
    assert sent(client) == [Hello(PROTOCOL_VERSION, CLIENT_NONCE, "frontend")]
    server.receive_data(wire(Hello(PROTOCOL_VERSION, CLIENT_NONCE, "frontend")))
    assert state_of(server) is S.AWAIT_AUTH
    assert server.peer_name == "frontend"
    assert sent(server) == [Challenge(PROTOCOL_VERSION, SERVER_NONCE)]
    client.receive_data(wire(Challenge(PROTOCOL_VERSION, SERVER_NONCE)))
    assert state_of(client) is S.AWAIT_WELCOME
    assert sent(client) == [Auth(None)]
    assert server.receive_data(wire(Auth(None))) == []
    assert state_of(server) is S.AUTHENTICATING
    assert server.authenticate() is True
    assert state_of(server) is S.OPEN
    welcome = Welcome(PROTOCOL_VERSION, "worker", 8, LIMIT, None)
    assert sent(server) == [welcome]
    assert client.receive_data(wire(welcome)) == [welcome]
    assert state_of(client) is S.OPEN
    assert client.peer_name == "worker"


def test_with_a_token_the_proofs_are_hmacs_over_both_nonces_and_the_token_never_travels():
    client, server = make_client(TOKEN), make_server(TOKEN)
    client.start()
    hello = client.data_to_send()
    server.receive_data(hello)
    challenge = server.data_to_send()
    client.receive_data(challenge)
    auth = client.data_to_send()
    assert FrameDecoder(LIMIT).feed(auth) == [Auth(client_proof(TOKEN, SERVER_NONCE, CLIENT_NONCE))]
    server.receive_data(auth)
    assert server.authenticate()
    welcome = server.data_to_send()
    (frame,) = FrameDecoder(LIMIT).feed(welcome)
    assert isinstance(frame, Welcome)
    assert frame.proof == server_proof(TOKEN, SERVER_NONCE, CLIENT_NONCE)
    assert frame.proof != client_proof(TOKEN, SERVER_NONCE, CLIENT_NONCE)  # never reflected
    client.receive_data(welcome)
    assert client.state is S.OPEN and server.state is S.OPEN
    for data in (hello, challenge, auth, welcome):
        assert TOKEN.encode() not in data


def test_random_nonces_differ_between_connections():
    a = ProtocolConnection(Role.SERVER, max_frame_size=LIMIT)
    b = ProtocolConnection(Role.SERVER, max_frame_size=LIMIT)
    for server in (a, b):
        server.receive_data(wire(Hello(PROTOCOL_VERSION, CLIENT_NONCE)))
    (challenge_a,) = sent(a)
    (challenge_b,) = sent(b)
    assert len(challenge_a.nonce) == NONCE_SIZE
    assert challenge_a.nonce != challenge_b.nonce


@pytest.mark.parametrize(
    "proof",
    [None, b"", b"x" * 32, client_proof("wrong", SERVER_NONCE, CLIENT_NONCE)],
    ids=["missing", "empty", "garbage", "wrong-token"],
)
def test_a_server_with_a_token_refuses_a_missing_or_wrong_proof(proof):
    server = make_server(TOKEN)
    server.receive_data(wire(Hello(PROTOCOL_VERSION, CLIENT_NONCE), Auth(proof)))
    server.data_to_send()
    assert server.authenticate() is False
    assert server.state is S.CLOSED
    (close,) = sent(server)  # no welcome
    assert close.code == "unauthenticated"
    assert "token" in close.message


def test_a_replayed_auth_is_worthless():
    """A proof captured from one connection answers a challenge no server sends again."""
    client, server = make_client(TOKEN), make_server(TOKEN)
    client.start()
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    captured_hello_and_auth = wire(Hello(PROTOCOL_VERSION, CLIENT_NONCE)) + client.data_to_send()
    fresh = ProtocolConnection(Role.SERVER, max_frame_size=LIMIT, token=TOKEN)  # a random nonce
    fresh.receive_data(captured_hello_and_auth)
    assert fresh.authenticate() is False
    assert fresh.state is S.CLOSED


def test_a_client_with_a_token_refuses_a_worker_that_cannot_prove_it_knows_it():
    client, server = make_client(TOKEN), make_server(None)
    client.start()
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    server.receive_data(client.data_to_send())
    assert server.authenticate()  # a worker without a token takes anyone
    with pytest.raises(ProtocolError, match="did not prove it knows the request-plane token"):
        client.receive_data(server.data_to_send())
    assert client.state is S.CLOSED
    (close,) = sent(client)
    assert close.code == "unauthenticated"


def test_a_client_refuses_a_forged_server_proof():
    client = make_client(TOKEN)
    client.start()
    client.receive_data(wire(Challenge(PROTOCOL_VERSION, SERVER_NONCE)))
    client.data_to_send()
    forged = client_proof(TOKEN, SERVER_NONCE, CLIENT_NONCE)  # the client's own proof, reflected
    with pytest.raises(ProtocolError, match="did not prove"):
        client.receive_data(wire(Welcome(PROTOCOL_VERSION, "w", 1, LIMIT, forged)))


def test_a_server_without_a_token_ignores_any_proof_and_a_tokenless_client_opens():
    ok, frames = handshake(make_client(), make_server())
    assert ok and isinstance(frames[0], Welcome)
    server = make_server()
    server.receive_data(wire(Hello(PROTOCOL_VERSION, CLIENT_NONCE), Auth(b"anything")))
    assert server.authenticate()


def test_a_tokenless_client_is_told_the_worker_requires_one():
    client, server = make_client(), make_server(TOKEN)
    ok, frames = handshake(client, server)
    assert not ok
    (close,) = frames
    assert close.code == "unauthenticated"
    assert "requires a request-plane token" in close.message
    assert client.state is S.CLOSED
    assert client.close_frame == close


@pytest.mark.parametrize("version", [0, 1, PROTOCOL_VERSION + 1])
def test_the_server_refuses_another_protocol_version(version):
    server = make_server()
    with pytest.raises(ProtocolError, match=f"protocol version {version}"):
        server.receive_data(wire(Hello(version, CLIENT_NONCE)))
    (close,) = sent(server)  # and no challenge
    assert close.code == "protocol_error"
    assert f"speaks version {PROTOCOL_VERSION}" in close.message


@pytest.mark.parametrize("frame", [Challenge(1, SERVER_NONCE), Challenge(3, SERVER_NONCE)])
def test_the_client_refuses_another_protocol_version(frame):
    client = make_client()
    client.start()
    client.data_to_send()
    with pytest.raises(ProtocolError, match=f"protocol version {frame.version}"):
        client.receive_data(wire(frame))
    assert client.state is S.CLOSED


@pytest.mark.parametrize("nonce", [b"", b"short", b"x" * (NONCE_SIZE + 1)])
def test_a_nonce_of_the_wrong_size_is_a_protocol_error(nonce):
    server = make_server()
    with pytest.raises(ProtocolError, match="nonce"):
        server.receive_data(wire(Hello(PROTOCOL_VERSION, nonce)))
    client = make_client()
    client.start()
    with pytest.raises(ProtocolError, match="nonce"):
        client.receive_data(wire(Challenge(PROTOCOL_VERSION, nonce)))


def test_nothing_may_follow_auth_before_the_verdict():
    server = make_server()
    with pytest.raises(ProtocolError, match="nothing after 'auth'"):
        server.receive_data(wire(Hello(PROTOCOL_VERSION, CLIENT_NONCE), Auth(), request(1)))
    assert server.state is S.CLOSED


def test_not_even_a_partial_frame_may_follow_auth_before_the_verdict():
    server = make_server()
    tail = wire(request(1))[:5]
    with pytest.raises(ProtocolError, match="bytes after 'auth'"):
        server.receive_data(wire(Hello(PROTOCOL_VERSION, CLIENT_NONCE), Auth()) + tail)


def test_before_welcome_a_frame_may_be_at_most_a_few_kib():
    server = make_server()
    with pytest.raises(ProtocolError, match=f"limit is {HANDSHAKE_MAX_FRAME_SIZE} bytes"):
        server.receive_data((32 * 1024 * 1024).to_bytes(4, "big") + b"\x00" * 100)
    client = make_client()
    client.start()
    with pytest.raises(ProtocolError, match=f"limit is {HANDSHAKE_MAX_FRAME_SIZE} bytes"):
        client.receive_data((HANDSHAKE_MAX_FRAME_SIZE + 1).to_bytes(4, "big"))


def test_after_welcome_the_configured_frame_size_applies():
    client, server = make_client(), make_server()
    handshake(client, server)
    big = Request(1, "generate", 1, "r", "x" * (HANDSHAKE_MAX_FRAME_SIZE * 4), 4)
    client.send(big)
    assert server.receive_data(client.data_to_send()) == [big]
    server.send(Item(1, "y" * (HANDSHAKE_MAX_FRAME_SIZE * 4)))
    assert client.receive_data(server.data_to_send()) == [
        Item(1, "y" * (HANDSHAKE_MAX_FRAME_SIZE * 4))
    ]


def test_authenticate_and_start_refuse_to_run_out_of_turn():
    server = make_server()
    with pytest.raises(RuntimeError):
        server.authenticate()
    with pytest.raises(RuntimeError):
        server.start()
    client = make_client()
    client.start()
    with pytest.raises(RuntimeError):
        client.start()
    with pytest.raises(RuntimeError):
        client.authenticate()


# ----------------------------------------------------------------- the tables

FRAME_TYPES = [
    Hello,
    Challenge,
    Auth,
    Welcome,
    Ping,
    GoAway,
    Close,
    RawRequest,
    Item,
    End,
    Error,
    Control,
    Credit,
]
HANDSHAKE_FRAMES = {Hello, Challenge, Auth, Welcome}


@pytest.mark.parametrize("table", [RECEIVE, SEND], ids=["receive", "send"])
def test_every_role_state_and_frame_type_has_an_explicit_entry(table):
    expected = {
        (role, state, frame_type)
        for role, states in ((Role.SERVER, SERVER_STATES), (Role.CLIENT, CLIENT_STATES))
        for state in states
        for frame_type in FRAME_TYPES
    }
    assert set(table) == expected


def test_before_welcome_a_server_accepts_only_the_next_handshake_step_or_close():
    for state in (S.AWAIT_HELLO, S.AWAIT_AUTH, S.AUTHENTICATING):
        allowed = {
            frame_type
            for frame_type in FRAME_TYPES
            if RECEIVE[Role.SERVER, state, frame_type][0] is not Receive.VIOLATION
        }
        steps: dict[ConnectionState, set[type]] = {
            S.AWAIT_HELLO: {Hello},
            S.AWAIT_AUTH: {Auth},
            S.AUTHENTICATING: set(),
        }
        step = steps[state]
        assert allowed == step | {Close}, state


def test_no_stream_frame_is_ever_acted_on_before_welcome():
    for role, states in ((Role.SERVER, SERVER_STATES), (Role.CLIENT, CLIENT_STATES)):
        for state in states:
            if not state.handshaking:
                continue
            for frame_type in (RawRequest, Item, End, Error, Control, Credit, Ping, GoAway):
                assert RECEIVE[role, state, frame_type][0] is Receive.VIOLATION


def test_close_ends_every_state_in_order_and_closed_drops_everything():
    for role, states in ((Role.SERVER, SERVER_STATES), (Role.CLIENT, CLIENT_STATES)):
        for state in states:
            if state is S.CLOSED:
                assert all(RECEIVE[role, state, t][0] is Receive.DROP for t in FRAME_TYPES)
            else:
                assert RECEIVE[role, state, Close] == (Receive.PEER_CLOSE, S.CLOSED)


def test_in_closed_every_frame_a_role_may_send_is_dropped_never_an_error():
    for role, states in ((Role.SERVER, SERVER_STATES), (Role.CLIENT, CLIENT_STATES)):
        sendable = {
            t for t in FRAME_TYPES if any(SEND[role, s, t][0] is not Send.BUG for s in states)
        }
        for frame_type in sendable:
            assert SEND[role, S.CLOSED, frame_type][0] is Send.DROP, (role, frame_type)


def test_handshake_frames_are_never_sent_through_send():
    for (_, _, frame_type), (action, _) in SEND.items():
        if frame_type in HANDSHAKE_FRAMES:
            assert action is Send.BUG


# One valid instance of each frame type, to check the machine against the table.
SAMPLES = {
    Hello: Hello(PROTOCOL_VERSION, CLIENT_NONCE),
    Challenge: Challenge(PROTOCOL_VERSION, SERVER_NONCE),
    Auth: Auth(None),
    Welcome: Welcome(PROTOCOL_VERSION, "w", 8, LIMIT),
    Ping: Ping(),
    GoAway: GoAway("bye"),
    Close: Close("bye"),
    RawRequest: request(2),
    Item: Item(1, "x"),
    End: End(1, "complete"),
    Error: Error(1, "Unknown", "x"),
    Control: Control(1, "stop"),
    Credit: Credit(1, 1),
}


def state_of(conn: ProtocolConnection) -> ConnectionState:
    """``conn.state``, read afresh (mypy would keep an earlier narrowing of the attribute)."""
    return conn.state


def reach(role, state):
    """A fresh end in ``state`` with stream 1 open; nothing left to send."""
    if role is Role.SERVER:
        conn = make_server()
        steps: dict[ConnectionState, list[Any]] = {
            S.AWAIT_HELLO: [],
            S.AWAIT_AUTH: [Hello(PROTOCOL_VERSION, CLIENT_NONCE)],
            S.AUTHENTICATING: [Hello(PROTOCOL_VERSION, CLIENT_NONCE), Auth()],
        }
        if state in steps:
            conn.receive_data(wire(*steps[state]))
        elif state is S.CLOSED:
            conn.receive_data(wire(Close("bye")))
        else:
            conn.receive_data(wire(Hello(PROTOCOL_VERSION, CLIENT_NONCE), Auth()))
            conn.authenticate()
            conn.receive_data(wire(request(1)))
            if state is S.DRAINING:
                conn.send(GoAway())
    else:
        conn = make_client()
        conn.start()
        if state is S.AWAIT_WELCOME:
            conn.receive_data(wire(Challenge(PROTOCOL_VERSION, SERVER_NONCE)))
        elif state is S.CLOSED:
            conn.receive_data(wire(Close("bye")))
        elif state is not S.AWAIT_CHALLENGE:
            conn.receive_data(wire(Challenge(PROTOCOL_VERSION, SERVER_NONCE)))
            conn.receive_data(wire(Welcome(PROTOCOL_VERSION)))
            conn.send(request(1))
            if state is S.DRAINING:
                conn.receive_data(wire(GoAway()))
    conn.data_to_send()
    assert conn.state is state
    return conn


CASES = [
    (role, state, frame_type)
    for role, states in ((Role.SERVER, SERVER_STATES), (Role.CLIENT, CLIENT_STATES))
    for state in states
    for frame_type in FRAME_TYPES
]


@pytest.mark.parametrize(
    ("role", "state", "frame_type"),
    CASES,
    ids=[f"{r.value}-{s.name}-{t.__name__}" for r, s, t in CASES],
)
def test_receiving_each_frame_in_each_state_does_what_the_table_says(role, state, frame_type):
    conn = reach(role, state)
    action, next_state = RECEIVE[role, state, frame_type]
    received_before = conn.frames_received
    if action is Receive.VIOLATION:
        with pytest.raises(ProtocolError):
            conn.receive_data(wire(SAMPLES[frame_type]))
        (close,) = sent(conn)
        assert isinstance(close, Close) and close.code == "protocol_error"
        assert conn.state is S.CLOSED
        return
    conn.receive_data(wire(SAMPLES[frame_type]))
    if action is Receive.DROP:
        assert conn.frames_received == received_before
        assert conn.data_to_send() == b""
    else:
        assert conn.frames_received == received_before + 1
    assert conn.state is (next_state or state)


# ----------------------------------------------------------------- unauthenticated fuzzing

NONCES = st.sampled_from([CLIENT_NONCE, SERVER_NONCE, b"", b"x" * 40])
ANY_FRAME = st.one_of(
    st.builds(Hello, version=st.integers(0, 3), nonce=NONCES, peer=st.text(max_size=5)),
    st.builds(Challenge, version=st.integers(0, 3), nonce=NONCES),
    st.builds(Auth, proof=st.none() | st.binary(max_size=33)),
    st.builds(Welcome, version=st.integers(0, 3), proof=st.none() | st.binary(max_size=33)),
    st.builds(Ping),
    st.builds(GoAway, reason=st.text(max_size=5)),
    st.builds(Close, code=st.text(max_size=5), message=st.text(max_size=5)),
    st.builds(
        Request,
        sid=st.integers(-1, 3),
        endpoint=st.just("e"),
        instance_id=st.integers(0, 2),
        request_id=st.just("r"),
        payload=st.none(),
        window=st.integers(-1, 3),
    ),
    st.builds(Item, sid=st.integers(-1, 3)),
    st.builds(End, sid=st.integers(-1, 3), outcome=st.just("complete")),
    st.builds(Error, sid=st.integers(-1, 3), code=st.just("Unknown"), message=st.just("x")),
    st.builds(Control, sid=st.integers(-1, 3), action=st.sampled_from(["stop", "kill"])),
    st.builds(Credit, sid=st.integers(-1, 3), items=st.integers(-1, 3)),
)
CHUNKS = st.lists(
    st.one_of(
        st.lists(ANY_FRAME, min_size=1, max_size=3).map(lambda fs: wire(*fs)),
        st.binary(min_size=1, max_size=40),
    ),
    max_size=8,
)


@settings(max_examples=examples(300), deadline=None)
@given(chunks=CHUNKS, token=st.sampled_from([None, TOKEN]), judge=st.booleans())
def test_an_unauthenticated_peer_gets_nothing_but_the_handshake_or_a_refusal(chunks, token, judge):
    """Whatever a peer that does not know the token sends, the server never opens
    a stream, never welcomes it, and fails only with ProtocolError, closed."""
    server = make_server(token)
    for chunk in chunks:
        try:
            returned = server.receive_data(chunk)
        except ProtocolError:
            assert server.state is S.CLOSED
            assert isinstance(sent(server)[-1], Close)
            return
        assert all(isinstance(frame, Close) for frame in returned)
        if server.state is S.AUTHENTICATING and judge:
            assert server.authenticate() is (token is None)
        if token is not None:
            assert server.state not in (S.OPEN, S.DRAINING)
            assert not any(isinstance(f, Welcome) for f in sent(server))
        assert server.open_streams == 0


@settings(max_examples=examples(300), deadline=None)
@given(chunks=CHUNKS, token=st.sampled_from([None, TOKEN]))
def test_a_client_facing_any_server_bytes_fails_only_with_a_protocol_error(chunks, token):
    """A hostile worker before welcome: the client never opens without a valid
    server proof (with a token), and fails only with ProtocolError, closed."""
    client = make_client(token)
    client.start()
    for chunk in chunks:
        try:
            returned = client.receive_data(chunk)
        except ProtocolError:
            assert client.state is S.CLOSED
            return
        assert all(isinstance(frame, Close | Welcome | GoAway) for frame in returned)
        if token is not None:
            assert client.state not in (S.OPEN, S.DRAINING)  # nobody computed a valid proof
