"""The request plane's wire format: ``encode_frame`` and ``FrameDecoder``, bytes only.

The decoder returns a ``req`` frame as :class:`RawRequest` (its fields are
checked later, by the protocol); :class:`Decoder` below turns those back into
:class:`Request` so that round trips compare equal.
"""

from __future__ import annotations

import itertools
import struct
from contextlib import suppress
from typing import Any

import hypothesis.strategies as st
import msgspec
import pytest
from hypothesis import given, settings
from msgspec.structs import astuple

from dynamo_trio import InvalidArgument, ProtocolError
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
    WireFrame,
    encode_frame,
)
from tests._fuzz import examples

LIMIT = 1 << 20
# Deeper than any supported Python lets msgspec nest: its limit is the interpreter's
# recursion limit on 3.11 (~1,000 levels) and the C recursion limit on 3.12+ (~10,000).
TOO_DEEP = 20_000
NONCE = bytes(range(NONCE_SIZE))


class Decoder(FrameDecoder):
    """``FrameDecoder`` returning ``req`` frames as :class:`Request` (same fields)."""

    def feed(self, data):
        return [
            Request(*astuple(frame)) if isinstance(frame, RawRequest) else frame
            for frame in super().feed(data)
        ]


# ----------------------------------------------------------------- helpers


def encode(*frames, limit=LIMIT):
    out = bytearray()
    for frame in frames:
        encode_frame(frame, out, limit)
    return bytes(out)


def with_prefix(body: bytes) -> bytes:
    """``body`` behind a correct length prefix, as a peer would send it."""
    return struct.pack(">I", len(body)) + body


def decode_body(body: bytes, limit=LIMIT):
    return Decoder(limit).feed(with_prefix(body))


# ----------------------------------------------------------------- strategies

sids = st.integers(min_value=-(2**63), max_value=2**64 - 1)
small_ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)
texts = st.text(max_size=20)
opt_texts = st.none() | texts

json_like = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=25,
)

frames = st.one_of(
    st.builds(Hello, version=small_ints, nonce=st.binary(max_size=40), peer=texts),
    st.builds(Challenge, version=small_ints, nonce=st.binary(max_size=40)),
    st.builds(Auth, proof=st.none() | st.binary(max_size=40)),
    st.builds(
        Welcome,
        version=small_ints,
        peer=texts,
        max_streams=small_ints,
        max_frame_size=small_ints,
        proof=st.none() | st.binary(max_size=40),
    ),
    st.builds(Ping),
    st.builds(GoAway, reason=texts),
    st.builds(Close, code=texts, message=texts),
    st.builds(
        Request,
        sid=sids,
        endpoint=texts,
        instance_id=small_ints,
        request_id=texts,
        payload=json_like,
        window=small_ints,
        timeout=st.none() | st.floats(allow_nan=False),
        headers=st.none() | st.dictionaries(texts, texts, max_size=4),
    ),
    st.builds(
        Item,
        sid=sids,
        data=json_like,
        id=opt_texts,
        event=opt_texts,
        comment=st.none() | st.lists(texts, max_size=3),
    ),
    st.builds(
        End,
        sid=sids,
        outcome=st.sampled_from(["complete", "stopped", "killed"]),
        reason=opt_texts,
    ),
    st.builds(Error, sid=sids, code=texts, message=texts, caused_by=opt_texts),
    st.builds(
        Control,
        sid=sids,
        action=st.sampled_from(["stop", "kill"]),
        reason=texts,
    ),
    st.builds(Credit, sid=sids, items=small_ints),
)

# One of each frame type, with every field set, for the example-based tests.
EVERY_FRAME_TYPE = [
    Hello(PROTOCOL_VERSION, NONCE, "frontend-1"),
    Challenge(PROTOCOL_VERSION, NONCE[::-1]),
    Auth(b"p" * 32),
    Welcome(PROTOCOL_VERSION, "worker-1", 128, 65536, b"q" * 32),
    Ping(),
    GoAway("draining"),
    Close("protocol_error", "bad frame"),
    Request(
        7,
        "dynamo.backend.generate",
        0x1234,
        "req-7",
        {"prompt": "hi", "max_tokens": 16, "stop": ["\n"], "temperature": 0.5, "echo": None},
        8,
        2.5,
        {"traceparent": "00-abc-def-01"},
    ),
    Item(7, {"token_ids": [1, 2, 3], "text": "a"}, "ev-1", "delta", ["note"]),
    End(7, "stopped", "client_stop"),
    Error(7, "InvalidArgument", "bad prompt", "ValueError"),
    Control(7, "kill", "client_disconnect"),
    Credit(7, 4),
]


# ----------------------------------------------------------------- round trips


@pytest.mark.parametrize("frame", EVERY_FRAME_TYPE, ids=lambda f: type(f).__name__)
def test_every_frame_type_round_trips(frame):
    assert Decoder(LIMIT).feed(encode(frame)) == [frame]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (["ping"], Ping()),
        (["hello", 2, b"n"], Hello(2, b"n", "")),
        (["auth"], Auth(None)),
        (["welcome", 1], Welcome(1, "", 0, 0, None)),
        (["goaway"], GoAway("")),
        (["close", "going_away"], Close("going_away", "")),
        (["req", 1, "e", 2, "r", None, 3], Request(1, "e", 2, "r", None, 3, None, None)),
        (["item", 1], Item(1, None, None, None, None)),
        (["end", 1, "complete"], End(1, "complete", None)),
        (["err", 1, "Unknown", "boom"], Error(1, "Unknown", "boom", None)),
        (["ctl", 1, "stop"], Control(1, "stop", "")),
    ],
    ids=lambda v: v[0] if isinstance(v, list) else "",
)
def test_optional_trailing_fields_may_be_omitted(body, expected):
    assert decode_body(msgspec.msgpack.encode(body)) == [expected]


def test_a_body_is_a_msgpack_array_tagged_with_the_frame_type():
    data = encode(Credit(3, 5))
    assert data[:4] == struct.pack(">I", len(data) - 4)
    assert msgspec.msgpack.decode(data[4:]) == ["credit", 3, 5]


@given(frame=frames)
def test_any_frame_round_trips(frame):
    assert Decoder(LIMIT).feed(encode(frame)) == [frame]


@given(payload=json_like)
def test_any_json_like_request_payload_round_trips(payload):
    request = Request(1, "e", 0, "r", payload, 1)
    (decoded,) = Decoder(LIMIT).feed(encode(request))
    assert decoded.payload == payload


@given(data=json_like)
def test_any_json_like_item_data_round_trips(data):
    (decoded,) = Decoder(LIMIT).feed(encode(Item(1, data)))
    assert decoded.data == data


def test_encode_frame_appends_to_the_output_buffer():
    out = bytearray(b"already queued")
    encode_frame(Ping(), out, LIMIT)
    assert out[:14] == b"already queued"
    assert Decoder(LIMIT).feed(out[14:]) == [Ping()]


# ----------------------------------------------------------------- incremental decoding

STREAM = encode(*EVERY_FRAME_TYPE)


def test_one_feed_with_many_frames_returns_them_in_order():
    decoder = Decoder(LIMIT)
    assert decoder.feed(STREAM) == EVERY_FRAME_TYPE
    assert decoder.buffered == 0


def test_feeding_byte_by_byte_yields_the_same_frames():
    decoder = Decoder(LIMIT)
    decoded = []
    for i in range(len(STREAM)):
        decoded += decoder.feed(STREAM[i : i + 1])
    assert decoded == EVERY_FRAME_TYPE
    assert decoder.buffered == 0


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_feed_accepts_any_bytes_like(kind):
    assert Decoder(LIMIT).feed(kind(STREAM)) == EVERY_FRAME_TYPE


def test_feed_returns_nothing_until_a_frame_is_complete():
    data = encode(Ping())
    decoder = Decoder(LIMIT)
    assert decoder.feed(data[:-1]) == []
    assert decoder.feed(data[-1:]) == [Ping()]


def test_buffered_counts_bytes_not_yet_part_of_a_whole_frame():
    first, second = encode(Credit(1, 1)), encode(Item(1, "x" * 50))
    decoder = Decoder(LIMIT)
    assert decoder.buffered == 0
    assert decoder.feed(first + second[:3]) == [Credit(1, 1)]
    assert decoder.buffered == 3  # a partial header
    assert decoder.feed(second[3:10]) == []
    assert decoder.buffered == 10  # the header and part of the body
    assert decoder.feed(second[10:]) == [Item(1, "x" * 50)]
    assert decoder.buffered == 0


@given(
    sent=st.lists(frames, min_size=1, max_size=6),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12),
)
def test_any_split_of_the_stream_yields_the_same_frames(sent, cuts):
    data = encode(*sent)
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    decoder = Decoder(LIMIT)
    decoded = []
    for start, stop in itertools.pairwise(bounds):
        decoded += decoder.feed(data[start:stop])
        whole = len(encode(*decoded))
        assert decoder.buffered == stop - whole
    assert decoded == sent
    assert decoder.buffered == 0


# ----------------------------------------------------------------- frame size limit


def test_a_body_of_exactly_the_limit_is_accepted():
    data = encode(Item(1, "x" * 100))
    body_size = len(data) - 4
    assert Decoder(body_size).feed(data) == [Item(1, "x" * 100)]


def test_an_oversized_length_prefix_fails_as_soon_as_the_header_arrives():
    decoder = Decoder(100)
    assert decoder.feed(struct.pack(">I", 101)[:3]) == []
    with pytest.raises(ProtocolError, match=r"101 bytes.*limit is 100 bytes"):
        decoder.feed(struct.pack(">I", 101)[3:])  # no body byte was sent


def test_an_oversized_length_prefix_fails_even_after_earlier_good_frames():
    decoder = Decoder(100)
    with pytest.raises(ProtocolError, match="4294967295"):
        decoder.feed(encode(Ping()) + b"\xff\xff\xff\xff")


def test_encode_frame_of_exactly_the_limit_succeeds():
    size = len(encode(Item(1, "x" * 100))) - 4
    out = bytearray()
    encode_frame(Item(1, "x" * 100), out, size)
    assert len(out) == size + 4


def test_encode_frame_too_large_raises_and_leaves_the_buffer_unchanged():
    frame = Item(1, "x" * 100)
    size = len(encode(frame)) - 4
    out = bytearray(b"queued before")
    expected = rf"{size} bytes exceeds the limit of {size - 1} bytes"
    with pytest.raises(InvalidArgument, match=expected):
        encode_frame(frame, out, size - 1)
    assert out == b"queued before"


def test_encode_frame_too_large_is_not_a_protocol_error():
    """Our own oversized frame is a bad argument, not a misbehaving peer."""
    with pytest.raises(InvalidArgument) as info:
        encode_frame(Item(1, "x" * 100), bytearray(), 10)
    assert not isinstance(info.value, ProtocolError)


@pytest.mark.parametrize(
    "value",
    [object(), 1j, 2**64, -(2**63) - 1, {"nested": [object()]}],
    ids=["object", "complex", "int-too-big", "int-too-small", "nested-object"],
)
def test_encode_frame_of_an_unencodable_value_raises_and_leaves_the_buffer(value):
    out = bytearray(b"queued before")
    with pytest.raises(InvalidArgument, match="cannot encode a 'item' frame"):
        encode_frame(Item(1, value), out, LIMIT)
    assert out == b"queued before"


def test_encode_frame_of_a_deeply_nested_value_raises_and_leaves_the_buffer():
    value: Any = None
    for _ in range(TOO_DEEP):
        value = [value]
    out = bytearray(b"queued before")
    with pytest.raises(InvalidArgument):
        encode_frame(Item(1, value), out, LIMIT)
    assert out == b"queued before"


# ----------------------------------------------------------------- malformed bodies


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"", "truncated"),
        (b"\xc1", "malformed"),  # a byte msgpack never uses
        (b"\x93\xa4item\x01", "truncated"),  # an array cut short
        (msgspec.msgpack.encode(42), "Expected `array`"),
        (msgspec.msgpack.encode({"sid": 1}), "Expected `array`"),
        (msgspec.msgpack.encode([]), "at least length 1"),
        (msgspec.msgpack.encode(["nope", 1]), "Invalid value 'nope'"),
        (msgspec.msgpack.encode([1, 1]), "$[0]"),
        (msgspec.msgpack.encode(["item", "1"]), "Expected `int`, got `str` - at `$[1]`"),
        (msgspec.msgpack.encode(["item", True]), "Expected `int`, got `bool`"),
        (msgspec.msgpack.encode(["item", 1.5]), "Expected `int`, got `float`"),
        (msgspec.msgpack.encode(["end", 1, "finished"]), "'finished'"),
        (msgspec.msgpack.encode(["ctl", 1, "pause"]), "'pause'"),
        (msgspec.msgpack.encode(["credit", 1, "5"]), "$[2]"),
        (msgspec.msgpack.encode(["req", "1", "e", 0, "r", None, 1]), "$[1]"),
        (msgspec.msgpack.encode(["hello", "2", b"n"]), "$[1]"),
        (msgspec.msgpack.encode(["hello", 2, "a string"]), "Expected `bytes`, got `str`"),
        (msgspec.msgpack.encode(["hello", 1, "token", "frontend"]), "$[2]"),  # version 1
        (msgspec.msgpack.encode(["item"]), "at least length 2"),
        (msgspec.msgpack.encode(["req", 1, "e"]), "at least length 7"),
        (msgspec.msgpack.encode(["close"]), "at least length 2"),
        (msgspec.msgpack.encode(["credit", 1]), "at least length 3"),
        (b"\x92\xa4item\x01\xc0", "malformed"),  # a valid frame followed by junk in the body
        (b"\x93\xa4item\x01\x81\x80\x00", "hashable"),  # data = {{}: None}
    ],
    ids=[
        "empty",
        "invalid-opcode",
        "truncated",
        "int",
        "map",
        "empty-array",
        "unknown-tag",
        "non-string-tag",
        "sid-as-string",
        "sid-as-bool",
        "sid-as-float",
        "bad-outcome",
        "bad-action",
        "items-as-string",
        "req-sid-as-string",
        "version-as-string",
        "nonce-as-string",
        "a-version-1-hello",
        "item-without-sid",
        "req-missing-fields",
        "close-without-code",
        "credit-without-items",
        "trailing-bytes",
        "unhashable-map-key",
    ],
)
def test_a_malformed_body_is_a_protocol_error_naming_the_problem(body, words):
    with pytest.raises(ProtocolError, match="malformed frame") as info:
        decode_body(body)
    assert words in str(info.value)


def test_a_deeply_nested_body_is_a_protocol_error():
    """1,000 nested arrays fit in 1 KiB; a hostile peer must not crash the reader."""
    body = b"\x93\xa4item\x01" + b"\x91" * TOO_DEEP + b"\xc0"
    with pytest.raises(ProtocolError):
        decode_body(body)


@settings(max_examples=examples(300))
@given(body=st.binary(max_size=200))
def test_arbitrary_bytes_after_a_valid_prefix_raise_only_protocol_error(body):
    try:
        decoded = decode_body(body)
    except ProtocolError:
        return
    assert len(decoded) == 1


@given(body=st.binary(max_size=100), tag=st.sampled_from([b"\xa4item", b"\xa3req", b"\xa5hello"]))
def test_arbitrary_fields_after_a_valid_tag_raise_only_protocol_error(body, tag):
    for length in range(1, 5):
        with suppress(ProtocolError):
            decode_body(bytes([0x90 + length]) + tag + body)


# ----------------------------------------------------------------- lazy decoding, fuzzing


def test_frames_are_decoded_one_at_a_time_so_a_bad_one_fails_only_when_reached():
    decoder = FrameDecoder(LIMIT)
    frames = decoder.frames(encode(Ping(), Close("bye")) + with_prefix(b"\xc1"))
    assert next(frames) == Ping()
    assert next(frames) == Close("bye")
    with pytest.raises(ProtocolError, match="malformed frame"):
        next(frames)


def test_an_abandoned_iteration_keeps_the_rest_for_the_next_feed():
    decoder = FrameDecoder(LIMIT)
    frames = decoder.frames(encode(Ping(), Credit(1, 2)))
    assert next(frames) == Ping()
    del frames
    assert decoder.buffered == len(encode(Credit(1, 2)))
    assert decoder.feed(b"") == [Credit(1, 2)]
    assert decoder.buffered == 0


def test_the_limit_may_be_raised_between_feeds():
    """The protocol reads at most a few KiB per frame until the handshake is over."""
    big = encode(Item(1, "x" * 10_000))
    decoder = FrameDecoder(HANDSHAKE_MAX_FRAME_SIZE)
    with pytest.raises(ProtocolError, match="limit is 4096 bytes"):
        decoder.feed(big)
    decoder = FrameDecoder(HANDSHAKE_MAX_FRAME_SIZE)
    decoder.max_frame_size = LIMIT
    assert decoder.feed(big) == [Item(1, "x" * 10_000)]


def test_a_tls_client_hello_is_named_in_the_error():
    client_hello = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(32)
    with pytest.raises(ProtocolError, match="a TLS handshake"):
        FrameDecoder(HANDSHAKE_MAX_FRAME_SIZE).feed(client_hello)


@settings(max_examples=examples(400))
@given(
    data=st.binary(max_size=600)
    | st.lists(frames, max_size=4).map(lambda fs: encode(*fs))
    | st.tuples(st.lists(frames, max_size=3), st.binary(max_size=60)).map(
        lambda pair: encode(*pair[0]) + pair[1]
    ),
    cuts=st.lists(st.integers(min_value=0, max_value=700), max_size=8),
    limit=st.sampled_from([16, 300, HANDSHAKE_MAX_FRAME_SIZE, LIMIT]),
)
def test_any_bytes_in_any_chunks_decode_to_frames_or_one_protocol_error(data, cuts, limit):
    """The decoder's contract under fuzzing: frames or ProtocolError, nothing else,
    and it never holds more than one frame's worth of bytes past a whole frame."""
    decoder = FrameDecoder(limit)
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    decoded = []
    try:
        for start, stop in itertools.pairwise(bounds):
            decoded += decoder.feed(data[start:stop])
            assert decoder.buffered < limit + 4  # at most one partial frame
    except ProtocolError:
        return
    assert all(isinstance(frame, WireFrame) for frame in decoded)
