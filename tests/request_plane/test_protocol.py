"""The sans-IO connection state machine: a client and a server talking bytes, no sockets.

Two real ``ProtocolConnection`` objects are piped into each other where the
test is about a conversation; where it is about a misbehaving peer, the peer
is simulated with raw bytes from ``encode_frame`` (which checks nothing).
The handshake, the transition tables and pre-authentication fuzzing have
their own module, ``test_handshake.py``.
"""

from __future__ import annotations

from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings
from msgspec.structs import astuple

from dynamo_trio import InvalidArgument, ProtocolError
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
    encode_frame,
)
from dynamo_trio.request_plane._protocol import ConnectionState, ProtocolConnection, Role
from tests._fuzz import examples

LIMIT = 64 * 1024
# Deeper than any supported Python lets msgspec nest: its limit is the interpreter's
# recursion limit on 3.11 (~1,000 levels) and the C recursion limit on 3.12+ (~10,000).
TOO_DEEP = 20_000
TOKEN = "s3cret"
OPEN = ConnectionState.OPEN
DRAINING = ConnectionState.DRAINING
CLOSED = ConnectionState.CLOSED
NONCE = b"n" * NONCE_SIZE

# ----------------------------------------------------------------- helpers


def make_client(token=None):
    return ProtocolConnection(Role.CLIENT, max_frame_size=LIMIT, token=token, peer_name="frontend")


def make_server(token=None, max_streams=1024):
    return ProtocolConnection(
        Role.SERVER, max_frame_size=LIMIT, max_streams=max_streams, token=token, peer_name="worker"
    )


def pipe(source, sink):
    """Deliver everything ``source`` queued to ``sink``; return what ``sink`` reports."""
    return sink.receive_data(source.data_to_send())


def wire(*frames):
    """Raw bytes for ``frames``, as a peer that ignores every rule would send them."""
    out = bytearray()
    for frame in frames:
        encode_frame(frame, out, LIMIT)
    return bytes(out)


def sent(conn):
    """The frames ``conn`` has queued for its peer (taking them); ``req`` as :class:`Request`."""
    return [
        Request(*astuple(frame)) if isinstance(frame, RawRequest) else frame
        for frame in FrameDecoder(LIMIT).feed(conn.data_to_send())
    ]


def handshake(client, server):
    """Run the four-frame handshake between two real ends."""
    client.start()
    pipe(client, server)  # hello -> challenge
    pipe(server, client)  # challenge -> auth
    pipe(client, server)  # auth: the server holds it
    server.authenticate()
    pipe(server, client)  # welcome


def connected(max_streams=1024, token=None):
    client, server = make_client(token), make_server(token, max_streams=max_streams)
    handshake(client, server)
    assert client.state is OPEN and server.state is OPEN
    return client, server


def open_server(max_streams=1024, token=None):
    """A server past the handshake with a raw-bytes peer; nothing left to send."""
    server = make_server(token, max_streams=max_streams)
    server.receive_data(wire(Hello(PROTOCOL_VERSION, NONCE)))
    server.receive_data(wire(Auth(None)))
    assert server.authenticate()
    server.data_to_send()
    return server


def open_client():
    """A client past the handshake with a raw-bytes peer; nothing left to send."""
    client = make_client()
    client.start()
    client.receive_data(wire(Challenge(PROTOCOL_VERSION, NONCE)))
    client.receive_data(wire(Welcome(PROTOCOL_VERSION)))
    client.data_to_send()
    return client


def request(sid, window=4):
    return Request(sid, "generate", 0x1234, f"req-{sid}", {"prompt": "hi"}, window)


def open_stream(client, server, window=4):
    sid = client.next_sid()
    req = request(sid, window)
    client.send(req)
    assert pipe(client, server) == [req]
    return sid


def client_with_stream(window=4):
    """A client (raw-bytes server) that opened stream 1."""
    client = open_client()
    client.send(request(1, window))
    client.data_to_send()
    return client


def assert_closed_by_protocol_error(conn, code="protocol_error"):
    """``conn`` is CLOSED and the last frame it queued is a ``close`` with ``code``."""
    assert conn.state is CLOSED
    frames = sent(conn)
    assert frames, "no close frame was queued"
    close = frames[-1]
    assert isinstance(close, Close)
    assert close.code == code
    return close


# ----------------------------------------------------------------- streams


def test_a_request_is_returned_and_opens_a_stream():
    client, server = connected()
    sid = open_stream(client, server, window=3)
    assert sid == 1
    assert server.is_open(1) and client.is_open(1)
    assert server.open_streams == 1 and client.open_streams == 1
    assert server.credits(1) == 3
    assert client.next_sid() == 2


def test_stream_ids_may_skip_but_must_increase():
    server = open_server()
    assert server.receive_data(wire(request(1), request(5), request(6))) == [
        request(1),
        request(5),
        request(6),
    ]
    assert server.open_streams == 3


@pytest.mark.parametrize(
    ("opened", "sid"),
    [([1, 2], 2), ([1, 2], 1), ([], 0), ([], -1)],
    ids=["equal", "lower", "zero", "negative"],
)
def test_a_request_with_a_stream_id_not_above_the_last_is_a_protocol_error(opened, sid):
    server = open_server()
    server.receive_data(wire(*(request(s) for s in opened)))
    with pytest.raises(ProtocolError, match=f"stream id {sid} is not above the last one"):
        server.receive_data(wire(request(sid)))
    assert_closed_by_protocol_error(server)


@pytest.mark.parametrize("window", [0, -1, 2**24 + 1, 2**63])
def test_a_request_with_a_window_out_of_range_is_refused_as_invalid_argument(window):
    server = open_server()
    assert server.receive_data(wire(request(1, window), request(2))) == [request(2)]
    (refusal,) = sent(server)
    assert isinstance(refusal, Error)
    assert (refusal.sid, refusal.code) == (1, "InvalidArgument")
    assert "`window`" in refusal.message
    assert not server.is_open(1)
    assert server.state is OPEN


@pytest.mark.parametrize(("sid", "window"), [(1, 1), (0, 1), (3, 0), (3, -1)])
def test_client_refuses_to_send_a_request_with_a_bad_sid_or_window(sid, window):
    client = client_with_stream()
    with pytest.raises(RuntimeError):
        client.send(request(sid, window))
    assert client.data_to_send() == b""
    assert client.open_streams == 1


def test_a_request_beyond_max_streams_is_refused_with_resource_exhausted():
    server = open_server(max_streams=2)
    assert server.receive_data(wire(request(1), request(2), request(3))) == [
        request(1),
        request(2),
    ]
    (refusal,) = sent(server)
    assert isinstance(refusal, Error)
    assert (refusal.sid, refusal.code) == (3, "ResourceExhausted")
    assert "limit 2" in refusal.message
    assert not server.is_open(3)
    assert server.state is OPEN


def test_a_refused_stream_reaches_the_client_as_an_error_that_ends_it():
    client, server = connected(max_streams=1)
    open_stream(client, server)
    client.send(request(2))
    assert pipe(client, server) == []
    (refusal,) = pipe(server, client)
    assert isinstance(refusal, Error)
    assert refusal.code == "ResourceExhausted"
    assert not client.is_open(2)
    assert client.is_open(1)


def test_a_slot_freed_by_a_terminal_frame_is_available_again():
    server = open_server(max_streams=1)
    server.receive_data(wire(request(1)))
    server.send(End(1, "complete"))
    assert server.receive_data(wire(request(2))) == [request(2)]


def test_a_refused_stream_id_may_not_be_reused():
    server = open_server(max_streams=0)
    server.receive_data(wire(request(1)))
    with pytest.raises(ProtocolError, match="not above the last one"):
        server.receive_data(wire(request(1)))


def test_after_goaway_new_requests_are_refused_with_engine_shutdown():
    server = open_server()
    server.send(GoAway("draining"))
    assert server.goaway
    assert sent(server) == [GoAway("draining")]
    assert server.receive_data(wire(request(1))) == []
    (refusal,) = sent(server)
    assert isinstance(refusal, Error)
    assert (refusal.sid, refusal.code) == (1, "EngineShutdown")
    assert server.open_streams == 0
    assert server.state is DRAINING


def test_after_goaway_open_streams_carry_on():
    client, server = connected()
    sid = open_stream(client, server)
    server.send(GoAway("draining"))
    server.send(Item(sid, "still here"))
    server.send(End(sid, "complete"))
    assert pipe(server, client) == [
        GoAway("draining"),
        Item(sid, "still here"),
        End(sid, "complete"),
    ]
    client.send(Credit(sid, 1))  # the stream ended on the client: nothing is sent
    assert client.data_to_send() == b""


def test_client_learns_of_goaway():
    client, server = connected()
    server.send(GoAway("draining"))
    assert pipe(server, client) == [GoAway("draining")]
    assert client.goaway
    assert client.state is DRAINING
    assert not client.send(request(1))  # no new stream: dropped, and nothing queued
    assert client.data_to_send() == b""


# ----------------------------------------------------------------- credits


def test_server_cannot_send_an_item_without_credit():
    client, server = connected()
    sid = open_stream(client, server, window=1)
    server.send(Item(sid, "first"))
    assert server.credits(sid) == 0
    with pytest.raises(RuntimeError, match="no credit"):
        server.send(Item(sid, "second"))
    assert pipe(server, client) == [Item(sid, "first")]


def test_server_cannot_send_an_item_on_an_unknown_stream():
    server = open_server()
    with pytest.raises(RuntimeError, match="no credit"):
        server.send(Item(1, "x"))
    assert server.data_to_send() == b""
    assert server.credits(1) == 0


def test_credits_count_down_per_item_and_up_on_credit():
    client, server = connected()
    sid = open_stream(client, server, window=3)
    for left in (2, 1):
        server.send(Item(sid, "tok"))
        assert server.credits(sid) == left
    client.send(Credit(sid, 5))
    assert pipe(client, server) == [Credit(sid, 5)]
    assert server.credits(sid) == 6


@pytest.mark.parametrize("items", [0, -3])
def test_a_credit_of_zero_or_less_is_a_protocol_error(items):
    server = open_server()
    server.receive_data(wire(request(1)))
    with pytest.raises(ProtocolError, match=f"credit of {items} items on stream 1"):
        server.receive_data(wire(Credit(1, items)))
    assert_closed_by_protocol_error(server)


def test_client_rejects_more_items_than_it_granted():
    client = client_with_stream(window=2)
    assert client.receive_data(wire(Item(1, "a"), Item(1, "b"))) == [Item(1, "a"), Item(1, "b")]
    with pytest.raises(ProtocolError, match="more items than the 2 credits granted"):
        client.receive_data(wire(Item(1, "c")))
    assert_closed_by_protocol_error(client)


def test_credit_sent_by_the_client_raises_the_items_it_accepts():
    client = client_with_stream(window=1)
    client.send(Credit(1, 2))
    client.receive_data(wire(Item(1, "a"), Item(1, "b"), Item(1, "c")))
    with pytest.raises(ProtocolError, match="3 credits granted"):
        client.receive_data(wire(Item(1, "d")))


def test_an_unencodable_item_raises_invalid_argument_and_keeps_the_credit():
    server = open_server()
    server.receive_data(wire(request(1, window=1)))
    with pytest.raises(InvalidArgument):
        server.send(Item(1, object()))
    assert server.credits(1) == 1
    assert server.data_to_send() == b""
    assert server.state is OPEN


def test_a_too_large_item_raises_invalid_argument_and_keeps_the_credit():
    server = open_server()
    server.receive_data(wire(request(1, window=1)))
    with pytest.raises(InvalidArgument, match="exceeds the limit"):
        server.send(Item(1, "x" * LIMIT))
    assert server.credits(1) == 1
    assert server.data_to_send() == b""
    assert server.state is OPEN


def test_a_deeply_nested_item_raises_invalid_argument_and_leaves_the_outbox_intact():
    value: Any = None
    for _ in range(TOO_DEEP):
        value = [value]
    server = open_server()
    server.receive_data(wire(request(1, window=2)))
    server.send(Ping())
    with pytest.raises(InvalidArgument):
        server.send(Item(1, value))
    assert sent(server) == [Ping()]
    assert server.credits(1) == 2


# ----------------------------------------------------------------- terminal frames


def test_end_closes_the_stream_on_both_sides():
    client, server = connected()
    sid = open_stream(client, server)
    server.send(End(sid, "complete"))
    assert not server.is_open(sid)
    assert pipe(server, client) == [End(sid, "complete")]
    assert not client.is_open(sid)
    assert client.open_streams == 0 and server.open_streams == 0


def test_error_closes_the_stream_on_both_sides():
    client, server = connected()
    sid = open_stream(client, server)
    error = Error(sid, "InvalidArgument", "bad prompt", "ValueError")
    server.send(error)
    assert not server.is_open(sid)
    assert pipe(server, client) == [error]
    assert not client.is_open(sid)


@pytest.mark.parametrize(
    "terminal", [End(1, "complete"), Error(1, "Unknown", "x")], ids=["end", "err"]
)
def test_server_cannot_end_a_stream_twice(terminal):
    server = open_server()
    server.receive_data(wire(request(1)))
    server.send(terminal)
    server.data_to_send()
    with pytest.raises(RuntimeError, match="not open"):
        server.send(terminal)
    assert server.data_to_send() == b""


def test_control_and_credit_that_crossed_the_end_are_dropped_by_the_server():
    client, server = connected()
    sid = open_stream(client, server)
    server.send(End(sid, "complete"))
    in_flight = server.data_to_send()  # on the wire while the client cancels
    client.send(Credit(sid, 2))
    client.send(Control(sid, "kill", "client_disconnect"))
    assert pipe(client, server) == []
    assert server.data_to_send() == b""
    assert server.state is OPEN
    assert client.receive_data(in_flight) == []  # and the client had killed it: dropped


def test_a_stop_is_returned_to_the_server_and_keeps_the_stream_open():
    client, server = connected()
    sid = open_stream(client, server)
    client.send(Control(sid, "stop", "client_stop"))
    assert client.is_open(sid)
    assert pipe(client, server) == [Control(sid, "stop", "client_stop")]
    assert server.is_open(sid)
    server.send(Item(sid, "last"))
    server.send(End(sid, "stopped", "client_stop"))
    assert pipe(server, client) == [Item(sid, "last"), End(sid, "stopped", "client_stop")]


def test_after_a_kill_the_client_drops_late_items_and_end():
    client, server = connected()
    sid = open_stream(client, server)
    client.send(Control(sid, "kill", "client_disconnect"))
    assert not client.is_open(sid)
    server.send(Item(sid, "late"))  # crossed the kill on the wire
    server.send(End(sid, "complete"))
    assert pipe(server, client) == []
    assert pipe(client, server) == []  # the kill crossed the end: dropped too
    assert client.state is OPEN and server.state is OPEN


def test_after_a_kill_the_client_drops_a_late_error():
    client = client_with_stream()
    client.send(Control(1, "kill"))
    assert client.receive_data(wire(Error(1, "Unknown", "late"))) == []
    assert client.state is OPEN


def test_a_kill_is_returned_to_the_server_which_keeps_the_stream_until_it_ends_it():
    client, server = connected()
    sid = open_stream(client, server)
    client.send(Control(sid, "kill", "client_disconnect"))
    assert pipe(client, server) == [Control(sid, "kill", "client_disconnect")]
    assert server.is_open(sid)
    server.send(End(sid, "killed", "client_disconnect"))
    assert not server.is_open(sid)


@pytest.mark.parametrize(
    "frame",
    [Item(2, "x"), End(2, "complete"), Error(2, "Unknown", "x"), Item(0, "x"), Item(-1, "x")],
    ids=["item-above", "end-above", "err-above", "item-zero", "item-negative"],
)
def test_a_frame_for_a_stream_the_client_never_opened_is_a_protocol_error(frame):
    client = client_with_stream()
    with pytest.raises(ProtocolError, match=f"unknown stream {frame.sid}"):
        client.receive_data(wire(frame))
    assert_closed_by_protocol_error(client)


def test_an_item_for_a_skipped_stream_id_the_client_never_opened_is_a_protocol_error():
    client = open_client()
    client.send(request(1))
    client.send(request(3))  # stream 2 never existed
    client.data_to_send()
    with pytest.raises(ProtocolError):
        client.receive_data(wire(Item(2, "x")))


@pytest.mark.parametrize(
    "late",
    [Item(1, "x"), End(1, "complete"), Error(1, "Unknown", "x")],
    ids=["item", "end", "err"],
)
def test_a_frame_after_the_stream_ended_normally_is_a_protocol_error(late):
    """Only a kill makes late frames a benign race; after an ``end`` they are a peer bug."""
    client = client_with_stream()
    client.receive_data(wire(End(1, "complete")))
    with pytest.raises(ProtocolError):
        client.receive_data(wire(late))


@pytest.mark.parametrize("frame", [Control(5, "stop"), Credit(5, 1)], ids=["control", "credit"])
def test_control_or_credit_for_a_stream_never_opened_is_a_protocol_error(frame):
    """Only frames that crossed a terminal frame are benign; stream 5 never existed."""
    server = open_server()
    server.receive_data(wire(request(1)))
    with pytest.raises(ProtocolError):
        server.receive_data(wire(frame))


def test_a_credit_of_zero_is_a_protocol_error_even_for_an_ended_stream():
    server = open_server()
    server.receive_data(wire(request(1)))
    server.send(End(1, "complete"))
    with pytest.raises(ProtocolError):
        server.receive_data(wire(Credit(1, 0)))


# ----------------------------------------------------------------- direction rules


@pytest.mark.parametrize(
    "frame",
    [request(1), Control(1, "stop"), Credit(1, 1), Hello(PROTOCOL_VERSION, NONCE), Auth()],
    ids=["req", "ctl", "credit", "hello", "auth"],
)
def test_client_rejects_frames_only_a_client_may_send(frame):
    client = client_with_stream()
    with pytest.raises(ProtocolError, match="a server may not send"):
        client.receive_data(wire(frame))
    assert_closed_by_protocol_error(client)


@pytest.mark.parametrize(
    "frame",
    [
        Item(1, "x"),
        End(1, "complete"),
        Error(1, "Unknown", "x"),
        Welcome(PROTOCOL_VERSION),
        Challenge(PROTOCOL_VERSION, NONCE),
        GoAway(),
    ],
    ids=["item", "end", "err", "welcome", "challenge", "goaway"],
)
def test_server_rejects_frames_only_a_server_may_send(frame):
    server = open_server()
    server.receive_data(wire(request(1)))
    with pytest.raises(ProtocolError, match="a client may not send"):
        server.receive_data(wire(frame))
    assert_closed_by_protocol_error(server)


@pytest.mark.parametrize("make", [open_client, open_server], ids=["client", "server"])
def test_ping_is_accepted_and_not_returned(make):
    conn = make()
    assert conn.receive_data(wire(Ping(), Ping())) == []
    assert conn.state is OPEN
    assert conn.data_to_send() == b""


@pytest.mark.parametrize("make", [open_client, open_server], ids=["client", "server"])
def test_close_from_the_peer_is_returned_and_closes_the_connection(make):
    conn = make()
    assert conn.receive_data(wire(Close("going_away", "bye"))) == [Close("going_away", "bye")]
    assert conn.state is CLOSED
    assert conn.data_to_send() == b""  # no close is sent back


@pytest.mark.parametrize("make", [open_client, open_server], ids=["client", "server"])
def test_after_a_close_receive_data_returns_nothing(make):
    conn = make()
    conn.receive_data(wire(Close("going_away")))
    assert conn.receive_data(wire(Ping(), request(9), Item(9))) == []
    assert conn.receive_data(b"\xff\xff\xff\xff garbage") == []
    assert conn.state is CLOSED


def test_frames_after_a_close_in_the_same_chunk_are_ignored():
    server = open_server()
    assert server.receive_data(wire(Close("going_away"), request(1))) == [Close("going_away")]
    assert server.open_streams == 0


def test_sending_close_closes_the_connection_and_later_sends_are_dropped():
    client, server = connected()
    client.send(Close("going_away", "bye"))
    assert client.state is CLOSED
    assert pipe(client, server) == [Close("going_away", "bye")]
    assert server.state is CLOSED
    for conn, frame in [(client, Ping()), (client, Credit(1, 1)), (client, request(1))]:
        assert conn.send(frame) is False
    for frame in [Ping(), Item(1), End(1, "complete"), GoAway(), Close("again")]:
        assert server.send(frame) is False
    assert client.data_to_send() == b"" and server.data_to_send() == b""


@pytest.mark.parametrize("make", [open_client, open_server], ids=["client", "server"])
def test_a_close_from_the_peer_makes_every_later_send_a_silent_no_op(make):
    """Issue 12: a peer's close made the next heartbeat's ping raise out of the connection."""
    conn = make()
    conn.receive_data(wire(Close("bye")))
    assert conn.send(Ping()) is False
    assert conn.send(Close("bye too")) is False
    assert conn.data_to_send() == b""


# ----------------------------------------------------------------- after a protocol error

PROTOCOL_ERRORS = [
    pytest.param(open_server, b"\x00\x00\x00\x01\xc1", "malformed frame", id="server-garbage"),
    pytest.param(open_client, b"\x00\x00\x00\x01\xc1", "malformed frame", id="client-garbage"),
    pytest.param(open_server, b"\x7f\xff\xff\xff", "2147483647 bytes", id="server-oversized"),
    pytest.param(open_client, b"\x7f\xff\xff\xff", "2147483647 bytes", id="client-oversized"),
    pytest.param(open_server, wire(GoAway()), "may not send 'goaway'", id="server-direction"),
    pytest.param(open_client, wire(Credit(1, 1)), "may not send 'credit'", id="client-direction"),
    pytest.param(open_server, wire(request(0)), "stream id 0", id="server-sid"),
    pytest.param(open_client, wire(Item(7)), "unknown stream 7", id="client-unknown-sid"),
]


@pytest.mark.parametrize(("make", "data", "words"), PROTOCOL_ERRORS)
def test_a_protocol_error_closes_and_queues_a_close_that_explains_it(make, data, words):
    conn = make()
    with pytest.raises(ProtocolError) as info:
        conn.receive_data(data)
    assert words in info.value.message
    close = assert_closed_by_protocol_error(conn)
    assert close.message == info.value.message


@pytest.mark.parametrize(("make", "data", "words"), PROTOCOL_ERRORS)
def test_after_a_protocol_error_receive_data_returns_nothing(make, data, words):
    conn = make()
    with pytest.raises(ProtocolError, match=words):
        conn.receive_data(data)
    conn.data_to_send()
    assert conn.receive_data(wire(Ping(), Close("x"))) == []
    assert conn.data_to_send() == b""  # and no second close


def test_a_protocol_error_keeps_frames_queued_before_it():
    server = make_server()
    with pytest.raises(ProtocolError):
        server.receive_data(wire(Hello(PROTOCOL_VERSION, NONCE), GoAway()))
    frames = sent(server)
    assert [type(f) for f in frames] == [Challenge, Close]


def test_the_close_message_is_truncated_to_1000_characters():
    server = open_server()
    body = b"\x92\xda\x13\x88" + b"x" * 5000 + b"\x01"  # ["xxx…", 1]: an unknown tag
    with pytest.raises(ProtocolError):
        server.receive_data(len(body).to_bytes(4, "big") + body)
    close = assert_closed_by_protocol_error(server)
    assert 100 < len(close.message) <= 1000


def test_a_deeply_nested_payload_is_a_protocol_error_that_closes_the_connection():
    nested = b"\x91" * TOO_DEEP + b"\xc0"  # [[[…[None]…]]], 20 KB
    body = b"\x97\xa3req\x01\xa1e\x00\xa1r" + nested + b"\x01"  # ["req", 1, "e", 0, "r", …, 1]
    server = open_server()
    with pytest.raises(ProtocolError):
        server.receive_data(len(body).to_bytes(4, "big") + body)
    assert_closed_by_protocol_error(server)


# ----------------------------------------------------------------- random conversations


def test_a_conversation_is_the_same_however_the_bytes_are_split():
    client, server = connected()
    for _ in range(3):
        open_stream(client, server, window=2)
    server.send(Item(1, {"t": 1}))
    server.send(Ping())
    server.send(Item(2, [1, 2]))
    server.send(End(1, "complete"))
    server.send(GoAway("bye"))
    server.send(Error(3, "Unknown", "boom"))
    data = bytes(server.data_to_send())
    expected = [Item(1, {"t": 1}), Item(2, [1, 2]), End(1, "complete"), GoAway("bye")]
    expected.append(Error(3, "Unknown", "boom"))

    def replay(chunks):
        fresh = open_client()
        for sid in (1, 2, 3):
            fresh.send(request(sid, window=2))
        fresh.data_to_send()
        return [frame for chunk in chunks for frame in fresh.receive_data(chunk)]

    assert replay([data]) == expected
    assert replay([data[i : i + 1] for i in range(len(data))]) == expected
    assert replay([data[i : i + 7] for i in range(0, len(data), 7)]) == expected


SIDS = st.integers(min_value=-1, max_value=6)
SMALL = st.integers(min_value=-1, max_value=3)
TEXT = st.sampled_from(["", "a", "reason"])

VERSIONS = st.sampled_from([PROTOCOL_VERSION, PROTOCOL_VERSION + 1])
NONCES = st.sampled_from([NONCE, b"", b"short"])

ANY_FRAME = st.one_of(
    st.builds(Hello, version=VERSIONS, nonce=NONCES, peer=TEXT),
    st.builds(Challenge, version=VERSIONS, nonce=NONCES),
    st.builds(Auth, proof=st.none() | st.binary(max_size=32)),
    st.builds(Welcome, version=VERSIONS),
    st.builds(Ping),
    st.builds(GoAway, reason=TEXT),
    st.builds(Close, code=st.sampled_from(["going_away", "protocol_error"]), message=TEXT),
    st.builds(
        Request,
        sid=SIDS,
        endpoint=st.just("generate"),
        instance_id=st.just(1),
        request_id=TEXT,
        payload=st.none() | st.integers(-5, 5),
        window=SMALL,
    ),
    st.builds(Item, sid=SIDS, data=st.none() | st.integers(-5, 5)),
    st.builds(End, sid=SIDS, outcome=st.sampled_from(["complete", "stopped", "killed"])),
    st.builds(Error, sid=SIDS, code=st.sampled_from(["Unknown", "Cancelled"]), message=TEXT),
    st.builds(Control, sid=SIDS, action=st.sampled_from(["stop", "kill"]), reason=TEXT),
    st.builds(Credit, sid=SIDS, items=SMALL),
)


def misbehaves(data):
    """One step in eight, the peer sends anything at all."""
    return data.draw(st.integers(min_value=0, max_value=7), label="misbehave") == 0


def some_sid(data, known, last_sid):
    """A stream id the peer plausibly talks about, or any small one."""
    plausible = st.sampled_from(sorted(known) if known else [last_sid, last_sid + 1])
    return data.draw(st.one_of(plausible, plausible, plausible, SIDS), label="sid")


def client_frame(data, model):
    """What a client might send to a server in ``model``'s state."""
    if misbehaves(data):
        return data.draw(ANY_FRAME, label="anything")
    kind = data.draw(st.sampled_from(["req", "req", "credit", "ctl", "ping"]), label="kind")
    if kind == "req":
        sid = model.last_sid + data.draw(st.sampled_from([1, 1, 2]), label="step")
        return request(sid, window=data.draw(st.integers(1, 3), label="window"))
    if kind == "ping":
        return Ping()
    sid = some_sid(data, model.credits, model.last_sid)
    if kind == "credit":
        return Credit(sid, data.draw(st.integers(1, 3), label="items"))
    return Control(sid, data.draw(st.sampled_from(["stop", "kill"]), label="action"))


def server_frame(data, model):
    """What a server might send to a client in ``model``'s state."""
    if misbehaves(data):
        return data.draw(ANY_FRAME, label="anything")
    kind = data.draw(
        st.sampled_from(["item", "item", "item", "end", "err", "goaway", "ping"]), label="kind"
    )
    if kind == "goaway":
        return GoAway("draining")
    if kind == "ping":
        return Ping()
    sid = some_sid(data, {*model.streams, *model.killed}, model.last_sid)
    if kind == "item":
        return Item(sid, "tok")
    if kind == "end":
        return End(sid, data.draw(st.sampled_from(["complete", "stopped", "killed"])))
    return Error(sid, "Unknown", "boom")


# What a frame from the peer must do: be returned, be dropped, or raise.  A frame
# for a stream that never existed or already ended normally is DROP_OR_FAIL here:
# the explicit tests above pin the strict answer; this test checks everything else.
ACCEPT, DROP, FAIL, DROP_OR_FAIL = "accept", "drop", "fail", "drop-or-fail"


class ServerModel:
    """What a server past its handshake must do with each frame."""

    def __init__(self, max_streams):
        self.max_streams = max_streams
        self.state = "open"
        self.last_sid = 0
        self.credits = {}
        self.goaway = False

    def receive(self, frame):
        """Return (verdict, frames the server must queue, close code if it fails)."""
        if self.state == "closed":
            return DROP, [], None
        if isinstance(frame, Close):
            self.state = "closed"
            return ACCEPT, [], None
        if not isinstance(frame, Request | Control | Credit | Ping):
            return FAIL, [], "protocol_error"  # handshake frames, and server-only frames
        if isinstance(frame, Ping):
            return DROP, [], None
        if isinstance(frame, Request):
            if frame.sid <= self.last_sid:
                return FAIL, [], "protocol_error"
            self.last_sid = frame.sid
            if frame.window <= 0 or not frame.request_id:
                return DROP, [(frame.sid, "InvalidArgument")], None
            if self.goaway:
                return DROP, [(frame.sid, "EngineShutdown")], None
            if len(self.credits) >= self.max_streams:
                return DROP, [(frame.sid, "ResourceExhausted")], None
            self.credits[frame.sid] = frame.window
            return ACCEPT, [], None
        if frame.sid in self.credits:
            if isinstance(frame, Credit):
                if frame.items <= 0:
                    return FAIL, [], "protocol_error"
                self.credits[frame.sid] += frame.items
            return ACCEPT, [], None
        crossed_end = 0 < frame.sid <= self.last_sid
        if crossed_end and not (isinstance(frame, Credit) and frame.items <= 0):
            return DROP, [], None
        return DROP_OR_FAIL, [], "protocol_error"


class ClientModel:
    """What a client past its handshake must do with each frame."""

    def __init__(self):
        self.state = "open"
        self.last_sid = 0
        self.streams = {}  # sid -> [granted, received]
        self.killed = set()
        self.goaway = False

    def receive(self, frame):
        if self.state == "closed":
            return DROP, [], None
        if isinstance(frame, Close):
            self.state = "closed"
            return ACCEPT, [], None
        if not isinstance(frame, Item | End | Error | GoAway | Ping):
            return FAIL, [], "protocol_error"  # handshake frames, and client-only frames
        if isinstance(frame, Ping):
            return DROP, [], None
        if isinstance(frame, GoAway):
            if self.goaway:
                return DROP, [], None  # a repeated goaway changes nothing
            self.goaway = True
            return ACCEPT, [], None
        stream = self.streams.get(frame.sid)
        if stream is not None:
            if isinstance(frame, Item):
                if stream[1] + 1 > stream[0]:
                    return FAIL, [], "protocol_error"
                stream[1] += 1
            else:
                del self.streams[frame.sid]
            return ACCEPT, [], None
        if frame.sid in self.killed:
            if not isinstance(frame, Item):
                self.killed.discard(frame.sid)  # the killed stream's terminal frame
            return DROP, [], None
        return FAIL, [], "protocol_error"  # never opened, ended normally, or skipped


def deliver(conn, model, frame):
    """Feed one peer frame to ``conn`` and check it against ``model``."""
    verdict, queued, close_code = model.receive(frame)
    try:
        returned = conn.receive_data(wire(frame))
    except ProtocolError:
        assert verdict in (FAIL, DROP_OR_FAIL), f"{frame} should not fail"
        model.state = "closed"
        assert_closed_by_protocol_error(conn, close_code)
        return
    assert verdict != FAIL, f"{frame} should have raised ProtocolError"
    assert returned == ([frame] if verdict == ACCEPT else [])
    out = sent(conn)
    if queued and isinstance(queued[0], tuple):
        assert all(isinstance(f, Error) for f in out)
        assert [(f.sid, f.code) for f in out] == queued
    else:
        assert out == queued


def expected_state(model):
    return "draining" if model.state == "open" and model.goaway else model.state


def check_server_matches(server, model):
    assert server.state.value == expected_state(model)
    assert server.goaway == model.goaway
    assert server.open_streams == len(model.credits)
    for sid in range(-1, 8):
        assert server.is_open(sid) == (sid in model.credits)
        assert server.credits(sid) == model.credits.get(sid, 0)


def check_client_matches(client, model):
    assert client.state.value == expected_state(model)
    assert client.goaway == model.goaway
    assert client.open_streams == len(model.streams)
    assert client.next_sid() == model.last_sid + 1
    for sid in range(-1, 8):
        assert client.is_open(sid) == (sid in model.streams)


@settings(max_examples=examples(120), deadline=None)
@given(data=st.data())
def test_server_state_machine_follows_the_rules_whatever_the_peer_sends(data):
    token = data.draw(st.sampled_from([None, TOKEN]), label="token")
    max_streams = data.draw(st.integers(min_value=0, max_value=4), label="max_streams")
    server = open_server(max_streams, token) if token is None else connected(max_streams, token)[1]
    model = ServerModel(max_streams)
    for _ in range(data.draw(st.integers(min_value=0, max_value=30), label="steps")):
        if model.state == "open" and data.draw(st.booleans(), label="act locally"):
            server_acts(server, model, data)
        else:
            deliver(server, model, client_frame(data, model))
        check_server_matches(server, model)


def server_acts(server, model, data):
    sid = some_sid(data, model.credits, model.last_sid)
    frame = data.draw(
        st.sampled_from(
            [Item(sid, "x"), End(sid, "complete"), Error(sid, "Unknown", "x"), GoAway(), Ping()]
        ),
        label="server sends",
    )
    if isinstance(frame, Item):
        allowed = model.credits.get(sid, 0) > 0
    elif isinstance(frame, End | Error):
        allowed = sid in model.credits
    else:
        allowed = True
    if not allowed:
        with pytest.raises(RuntimeError):
            server.send(frame)
        assert server.data_to_send() == b""
        return
    if isinstance(frame, GoAway) and model.goaway:
        assert server.send(frame) is False  # once is enough
        assert server.data_to_send() == b""
        return
    assert server.send(frame) is True
    assert sent(server) == [frame]
    if isinstance(frame, Item):
        model.credits[sid] -= 1
    elif isinstance(frame, End | Error):
        del model.credits[sid]
    elif isinstance(frame, GoAway):
        model.goaway = True


@settings(max_examples=examples(120), deadline=None)
@given(data=st.data())
def test_client_state_machine_follows_the_rules_whatever_the_peer_sends(data):
    client = open_client()
    model = ClientModel()
    for _ in range(data.draw(st.integers(min_value=0, max_value=30), label="steps")):
        if model.state == "open" and (
            not model.streams or data.draw(st.booleans(), label="act locally")
        ):
            client_acts(client, model, data)
        else:
            deliver(client, model, server_frame(data, model))
        check_client_matches(client, model)


def client_acts(client, model, data):
    actions = ["request", "request", "credit", "stop", "kill"] if model.streams else ["request"]
    action = data.draw(st.sampled_from(actions), label="client")
    if action == "request":
        sid = client.next_sid() + data.draw(st.sampled_from([0, 0, 0, 1]), label="skip")
        frame = request(sid, window=data.draw(st.integers(1, 3), label="window"))
        if model.goaway:
            assert client.send(frame) is False  # no new streams after goaway
            assert client.data_to_send() == b""
            return
        assert client.send(frame) is True
        model.last_sid = sid
        model.streams[sid] = [frame.window, 0]
        assert sent(client) == [frame]
        return
    sid = some_sid(data, {*model.streams, *model.killed}, model.last_sid)
    if action == "credit":
        frame = Credit(sid, data.draw(st.integers(1, 3), label="items"))
    else:
        frame = Control(sid, action)
    client.send(frame)
    if sid not in model.streams:
        assert client.data_to_send() == b""  # nothing to say about a finished stream
        return
    assert sent(client) == [frame]
    if isinstance(frame, Credit):
        model.streams[sid][0] += frame.items
    elif frame.action == "kill":
        del model.streams[sid]
        model.killed.add(sid)
