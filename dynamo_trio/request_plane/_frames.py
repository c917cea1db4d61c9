"""The request plane's wire format: frame types and the length-prefixed codec."""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any, Final, Literal

import msgspec

from .._errors import InvalidArgument, ProtocolError

if TYPE_CHECKING:
    from collections.abc import Generator

PROTOCOL_VERSION: Final = 2
HANDSHAKE_MAX_FRAME_SIZE: Final = 4096  # the largest frame body before the handshake completes
NONCE_SIZE: Final = 32  # bytes in each handshake nonce
_HEADER: Final = struct.Struct(">I")


class _Frame(msgspec.Struct, array_like=True, frozen=True, gc=False): ...


class Hello(_Frame, tag="hello", frozen=True):
    version: int
    nonce: bytes
    peer: str = ""


class Challenge(_Frame, tag="challenge", frozen=True):
    version: int
    nonce: bytes


class Auth(_Frame, tag="auth", frozen=True):
    proof: bytes | None = None


class Welcome(_Frame, tag="welcome", frozen=True):
    version: int
    peer: str = ""
    max_streams: int = 0
    max_frame_size: int = 0
    proof: bytes | None = None


class Ping(_Frame, tag="ping", frozen=True): ...


class GoAway(_Frame, tag="goaway", frozen=True):
    reason: str = ""


class Close(_Frame, tag="close", frozen=True):
    code: str
    message: str = ""


class Request(_Frame, tag="req", frozen=True):
    """A ``req`` frame as sent, and as returned by the protocol once validated."""

    sid: int
    endpoint: str
    instance_id: int
    request_id: str
    payload: Any
    window: int
    timeout: float | None = None
    headers: dict[str, str] | None = None


class RawRequest(_Frame, tag="req", frozen=True):
    """A ``req`` frame as received: only ``sid`` is typed by the decoder, so a bad field
    fails that stream (the protocol checks the rest), not the connection."""

    sid: int
    endpoint: Any
    instance_id: Any
    request_id: Any
    payload: Any
    window: Any
    timeout: Any = None
    headers: Any = None


class Item(_Frame, tag="item", frozen=True):
    sid: int
    data: Any = None
    id: str | None = None
    event: str | None = None
    comment: list[str] | None = None


Outcome = Literal["complete", "stopped", "killed"]


class End(_Frame, tag="end", frozen=True):
    sid: int
    outcome: Outcome
    reason: str | None = None


class Error(_Frame, tag="err", frozen=True):
    sid: int
    code: str
    message: str
    caused_by: str | None = None


class Control(_Frame, tag="ctl", frozen=True):
    sid: int
    action: Literal["stop", "kill"]
    reason: str = ""


class Credit(_Frame, tag="credit", frozen=True):
    sid: int
    items: int


_ConnectionFrame = Hello | Challenge | Auth | Welcome | Ping | GoAway | Close
_StreamFrame = Item | End | Error | Control | Credit  # ``req`` aside
Frame = _ConnectionFrame | Request | _StreamFrame
"""Every frame type, as this end builds and sends them."""
WireFrame = _ConnectionFrame | RawRequest | _StreamFrame
"""Every frame type, as :class:`FrameDecoder` returns them (``req`` not yet validated)."""

_encoder: Final = msgspec.msgpack.Encoder()


def encode_frame(frame: Frame | WireFrame, out: bytearray, max_frame_size: int) -> None:
    """Append ``frame``, length-prefixed, to ``out`` (InvalidArgument, ``out`` unchanged, if
    it cannot be encoded or exceeds ``max_frame_size``)."""
    start = len(out)
    out += b"\0\0\0\0"
    try:
        _encoder.encode_into(frame, out, -1)
    except Exception as exc:  # EncodeError, TypeError, OverflowError, RecursionError, ...
        del out[start:]
        raise InvalidArgument(f"cannot encode a {frame_tag(frame)!r} frame: {exc}") from None
    size = len(out) - start - _HEADER.size
    if size > max_frame_size:
        del out[start:]
        raise InvalidArgument(
            f"a {frame_tag(frame)!r} frame of {size} bytes exceeds the limit of "
            f"{max_frame_size} bytes"
        )
    _HEADER.pack_into(out, start, size)


def frame_tag(frame: Frame | WireFrame) -> str:
    """The wire tag of ``frame`` (``"req"``, ``"item"``, ...)."""
    return str(type(frame).__struct_config__.tag)


class FrameDecoder:
    """Incremental decoder: bytes in, whole frames out; a length prefix over ``max_frame_size``
    (changeable between calls) is a ProtocolError as soon as it arrives."""

    def __init__(self, max_frame_size: int) -> None:
        self.max_frame_size = max_frame_size
        self._buffer = bytearray()
        self._position = 0  # where the next frame starts in _buffer
        self._decoder = msgspec.msgpack.Decoder(WireFrame)

    @property
    def buffered(self) -> int:
        return len(self._buffer) - self._position

    def feed(self, data: bytes | bytearray | memoryview) -> list[WireFrame]:
        """Add received bytes; return every frame they complete, in order."""
        return list(self.frames(data))

    def frames(self, data: bytes | bytearray | memoryview) -> Generator[WireFrame]:
        """Add received bytes; iterate over the frames they complete, decoding each on demand."""
        buffer = self._buffer
        buffer += data
        decode = self._decoder.decode
        # One view per batch (the buffer is not resized until then), released before the trim.
        view = memoryview(buffer)
        try:
            while True:
                position = self._position
                if len(buffer) - position < _HEADER.size:
                    break
                (size,) = _HEADER.unpack_from(buffer, position)
                if size > self.max_frame_size:
                    # A TLS record starts with content type 22 (handshake), major version 3.
                    tls = buffer[position] == 0x16 and buffer[position + 1] == 0x03
                    hint = " (a TLS handshake? this end does not use TLS)" if tls else ""
                    raise ProtocolError(
                        f"peer announced a frame of {size} bytes; "
                        f"the limit is {self.max_frame_size} bytes{hint}"
                    )
                start = position + _HEADER.size
                if len(buffer) - start < size:
                    break
                self._position = start + size
                try:
                    frame: WireFrame = decode(view[start : start + size])
                except msgspec.DecodeError as exc:
                    raise ProtocolError(f"malformed frame: {exc}") from None
                except RecursionError:
                    raise ProtocolError("malformed frame: values nested too deeply") from None
                yield frame
        finally:
            view.release()
        del buffer[: self._position]
        self._position = 0
