"""gRPC framing, sans-IO: whole messages out of bytes in any pieces, and a fuzz of what
a peer can send (only :class:`WireError` may come out, and a declared size over the limit
is refused before its body arrives)."""

from __future__ import annotations

import gzip
import itertools
import zlib
from urllib.parse import unquote

import pytest
from hypothesis import given, settings, strategies as st

from dynamo_trio.kserve._wire import (
    Deframer,
    WireError,
    encode_grpc_message,
    frame,
    parse_timeout,
)
from tests._fuzz import examples

LIMIT = 1024


def pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({cut % (len(data) + 1) for cut in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


@settings(max_examples=examples(300), deadline=None)
@given(
    messages=st.lists(st.binary(max_size=LIMIT), max_size=8),
    cuts=st.lists(st.integers(min_value=0), max_size=20),
)
def test_messages_in_any_pieces_come_out_whole_and_in_order(
    messages: list[bytes], cuts: list[int]
) -> None:
    deframer = Deframer(LIMIT)
    out: list[bytes] = []
    for piece in pieces(b"".join(frame(m) for m in messages), cuts):
        out += deframer.feed(piece)
    assert out == messages
    assert not deframer.pending


@settings(max_examples=examples(500), deadline=None)
@given(data=st.binary(max_size=200), cuts=st.lists(st.integers(min_value=0), max_size=10))
def test_arbitrary_bytes_give_messages_or_a_wire_error(data: bytes, cuts: list[int]) -> None:
    deframer = Deframer(LIMIT)
    total = 0
    failed: WireError | None = None
    try:
        for piece in pieces(data, cuts):
            for message in deframer.feed(piece):
                assert len(message) <= LIMIT
                total += len(message) + 5
    except WireError as error:
        failed = error
    if failed is not None:
        assert str(failed)
    else:
        assert total <= len(data)
        assert deframer.pending == (total < len(data))


@given(length=st.integers(min_value=LIMIT + 1, max_value=2**32 - 1))
def test_a_declared_size_over_the_limit_is_refused_from_its_prefix(length: int) -> None:
    with pytest.raises(WireError) as raised:
        Deframer(LIMIT).feed(b"\x00" + length.to_bytes(4, "big"))
    assert raised.value.too_large


def test_a_compressed_message_without_an_encoding_is_unimplemented_other_flags_invalid() -> None:
    with pytest.raises(WireError) as compressed:
        Deframer(LIMIT).feed(b"\x01\x00\x00\x00\x00")
    assert compressed.value.unimplemented
    assert "gzip" in str(compressed.value)  # what to send instead
    with pytest.raises(WireError) as invalid:
        Deframer(LIMIT).feed(b"\x02\x00\x00\x00\x00")
    assert not invalid.value.unimplemented and not invalid.value.too_large


def compressed(message: bytes, encoding: str) -> bytes:
    """``message`` framed with the compressed flag, as a client compresses it."""
    body = gzip.compress(message) if encoding == "gzip" else zlib.compress(message)
    return b"\x01" + len(body).to_bytes(4, "big") + body


@settings(max_examples=examples(100), deadline=None)
@given(
    messages=st.lists(st.tuples(st.binary(max_size=LIMIT), st.booleans()), max_size=6),
    cuts=st.lists(st.integers(min_value=0), max_size=20),
    encoding=st.sampled_from(["gzip", "deflate"]),
)
def test_compressed_and_plain_messages_in_any_pieces_come_out_whole(
    messages: list[tuple[bytes, bool]], cuts: list[int], encoding: str
) -> None:
    data = b"".join(compressed(m, encoding) if z else frame(m) for m, z in messages)
    deframer = Deframer(LIMIT, encoding=encoding)
    out: list[bytes] = []
    for piece in pieces(data, cuts):
        out += deframer.feed(piece)
    assert out == [message for message, _ in messages]
    assert not deframer.pending


@settings(max_examples=examples(300), deadline=None)
@given(
    body=st.binary(max_size=300),
    encoding=st.sampled_from(["gzip", "deflate"]),
)
def test_a_compressed_body_of_arbitrary_bytes_gives_a_message_or_a_wire_error(
    body: bytes, encoding: str
) -> None:
    failed: WireError | None = None
    try:
        messages = Deframer(LIMIT, encoding=encoding).feed(
            b"\x01" + len(body).to_bytes(4, "big") + body
        )
    except WireError as error:
        failed = error
    if failed is not None:
        assert str(failed)
    else:
        [message] = messages
        assert len(message) <= LIMIT


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_decompression_bomb_is_refused_at_the_limit(encoding: str) -> None:
    """A megabyte of zeros compresses to about a kilobyte: it is inflated only to the
    limit, and refused as too large."""
    bomb = compressed(bytes(1 << 20), encoding)
    assert len(bomb) < 2 * LIMIT
    deframer = Deframer(2 * LIMIT, encoding=encoding)
    with pytest.raises(WireError) as raised:
        deframer.feed(bomb)
    assert raised.value.too_large and "inflates to over the limit" in str(raised.value)


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compressed_bodies_that_are_not_one_whole_stream(encoding: str) -> None:
    whole = compressed(b"hello" * 20, encoding)[5:]
    for body, says in ((whole[:-3], "cut short"), (whole + b"extra", "after its end")):
        with pytest.raises(WireError) as raised:
            Deframer(LIMIT, encoding=encoding).feed(b"\x01" + len(body).to_bytes(4, "big") + body)
        assert says in str(raised.value)
        assert not raised.value.too_large and not raised.value.unimplemented


def test_an_encoding_not_accepted_refuses_the_call_at_its_first_data() -> None:
    with pytest.raises(WireError) as raised:
        Deframer(LIMIT, encoding="zstd").feed(b"")
    assert raised.value.unimplemented
    assert "'zstd'" in str(raised.value) and "gzip" in str(raised.value)


def test_admit_hears_each_message_before_its_body_and_what_inflating_adds() -> None:
    heard: list[int] = []

    def admit(size: int) -> None:
        if size > 500:
            raise WireError("no room", too_large=True)
        heard.append(size)

    deframer = Deframer(LIMIT, encoding="gzip", admit=admit)
    plain = frame(b"ab")
    zipped = compressed(b"z" * 400, "gzip")
    grown = compressed(b"q", "gzip")  # a gzip header and trailer around one byte
    assert deframer.feed(plain + zipped + grown) == [b"ab", b"z" * 400, b"q"]
    expected = [2, len(zipped) - 5, 400 - (len(zipped) - 5), len(grown) - 5, 1 - (len(grown) - 5)]
    assert heard == expected  # each message's share sums to its final size
    with pytest.raises(WireError):
        deframer.feed(b"\x00\x00\x00\x03\x00")  # 768 declared: refused from the prefix
    assert heard == expected


@pytest.mark.parametrize(
    ("header", "seconds"),
    [("100m", 0.1), ("5S", 5.0), ("2M", 120.0), ("1H", 3600.0), ("7u", 7e-6), ("99999999n", 0.1)],
)
def test_grpc_timeout(header: str, seconds: float) -> None:
    assert parse_timeout(header) == pytest.approx(seconds)


@pytest.mark.parametrize("header", ["", "5", "S", "5s", "123456789S", "-1S", "1.5S", "5 S"])
def test_invalid_grpc_timeouts(header: str) -> None:
    with pytest.raises(WireError):
        parse_timeout(header)


@given(st.text(max_size=50))
def test_grpc_message_round_trips_as_printable_ascii(text: str) -> None:
    encoded = encode_grpc_message(text)
    assert encoded.isascii() and all(0x20 <= ord(c) <= 0x7E for c in encoded)
    assert unquote(encoded) == text  # as a gRPC client decodes it
