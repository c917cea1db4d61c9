"""gRPC framing, sans-IO: whole messages out of bytes in any pieces, and a fuzz of what
a peer can send (only :class:`WireError` may come out, and a declared size over the limit
is refused before its body arrives)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings, strategies as st

from dynamo_trio.kserve._wire import (
    Deframer,
    WireError,
    decode_grpc_message,
    encode_grpc_message,
    frame,
    parse_timeout,
)

LIMIT = 1024


def pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({cut % (len(data) + 1) for cut in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


@settings(max_examples=300, deadline=None)
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


@settings(max_examples=500, deadline=None)
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


def test_a_compressed_message_is_unimplemented_and_other_flags_invalid() -> None:
    with pytest.raises(WireError) as compressed:
        Deframer(LIMIT).feed(b"\x01\x00\x00\x00\x00")
    assert compressed.value.unimplemented
    with pytest.raises(WireError) as invalid:
        Deframer(LIMIT).feed(b"\x02\x00\x00\x00\x00")
    assert not invalid.value.unimplemented and not invalid.value.too_large


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
    assert decode_grpc_message(encoded) == text
