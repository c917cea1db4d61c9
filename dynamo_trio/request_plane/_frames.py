"""The request plane's wire format: frame types and the length-prefixed codec.

Wire format, version 1
======================

A connection is a sequence of *frames* in each direction.  Each frame is::

    +----------------------+-------------------------------------------+
    | length: u32, big end | body: msgpack, ``length`` bytes           |
    +----------------------+-------------------------------------------+

The body is a msgpack array whose first element is a short string tag naming
the frame type, followed by that type's fields in order (``msgspec`` structs
with ``array_like=True, tag=...``).  Optional trailing fields may be omitted.
A body longer than the receiver's ``max_frame_size`` is a protocol error: the
receiver closes the connection without buffering it.

Connection frames:

=========  =========  ==========================================================
tag        direction  meaning
=========  =========  ==========================================================
``hello``  C -> S     first frame: ``version``, optional shared ``token``, ``peer`` name
``welcome`` S -> C    handshake accepted: ``version``, ``peer`` name, server limits
``ping``   both       liveness; each side sends one every heartbeat interval
``goaway`` S -> C     the server takes no new streams (shutting down); open ones go on
``close``  both       the sender is closing the connection: ``code``, ``message``
=========  =========  ==========================================================

Stream frames carry a stream id ``sid`` chosen by the client (strictly
increasing on a connection, never reused):

==========  =========  =========================================================
tag         direction  meaning
==========  =========  =========================================================
``req``     C -> S     open a stream: endpoint, instance, request id, payload,
                       time remaining before the deadline, initial credit window
``item``    S -> C     one response item (``data`` and Dynamo's annotations);
                       costs one credit
``end``     S -> C     terminal: ``outcome`` complete | stopped | killed, ``reason``
``err``     S -> C     terminal: error ``code`` (Dynamo ``ErrorType``), message
``ctl``     C -> S     cancel: ``action`` stop | kill, with the cancel ``reason``
``credit``  C -> S     the consumer took ``items`` more items: the worker may send
                       that many more
==========  =========  =========================================================

A stream is ``req`` -> ``item``* -> (``end`` | ``err``).  A worker sends an
``item`` only while it holds a credit, so a slow consumer slows its own handler
and nothing else.  ``ctl`` and ``credit`` for a stream that already ended are
ignored (they crossed the terminal frame on the wire), as are ``item``/``end``
for a stream the client already killed.
"""

from __future__ import annotations

import struct
from typing import Any, Final, Literal

import msgspec

from .._errors import InvalidArgument, ProtocolError

__all__ = [
    "PROTOCOL_VERSION",
    "Close",
    "Control",
    "Credit",
    "End",
    "Error",
    "Frame",
    "FrameDecoder",
    "GoAway",
    "Hello",
    "Item",
    "Ping",
    "Request",
    "Welcome",
    "encode_frame",
]

PROTOCOL_VERSION: Final = 1

_HEADER: Final = struct.Struct(">I")


class _Frame(msgspec.Struct, array_like=True, frozen=True, gc=False):
    pass


class Hello(_Frame, tag="hello", frozen=True):
    version: int
    token: str | None = None
    peer: str = ""


class Welcome(_Frame, tag="welcome", frozen=True):
    version: int
    peer: str = ""
    max_streams: int = 0
    max_frame_size: int = 0


class Ping(_Frame, tag="ping", frozen=True):
    pass


class GoAway(_Frame, tag="goaway", frozen=True):
    reason: str = ""


class Close(_Frame, tag="close", frozen=True):
    code: str
    message: str = ""


class Request(_Frame, tag="req", frozen=True):
    sid: int
    endpoint: str
    instance_id: int
    request_id: str
    payload: Any
    window: int
    timeout: float | None = None
    headers: dict[str, str] | None = None


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


Frame = Hello | Welcome | Ping | GoAway | Close | Request | Item | End | Error | Control | Credit

_encoder: Final = msgspec.msgpack.Encoder()


def encode_frame(frame: Frame, out: bytearray, max_frame_size: int) -> None:
    """Append ``frame``, length-prefixed, to ``out``.

    Raises:
        InvalidArgument: if the frame holds a value msgpack cannot encode, or
            its body would exceed ``max_frame_size``; ``out`` is left as it was.
    """
    start = len(out)
    out += b"\0\0\0\0"
    try:
        _encoder.encode_into(frame, out, -1)
    except Exception as exc:  # EncodeError, TypeError, OverflowError, RecursionError, ...
        del out[start:]
        raise InvalidArgument(f"cannot encode a {_tag(frame)!r} frame: {exc}") from None
    size = len(out) - start - _HEADER.size
    if size > max_frame_size:
        del out[start:]
        raise InvalidArgument(
            f"a {_tag(frame)!r} frame of {size} bytes exceeds the limit of {max_frame_size} bytes"
        )
    _HEADER.pack_into(out, start, size)


def _tag(frame: Frame) -> str:
    return str(type(frame).__struct_config__.tag)


class FrameDecoder:
    """Incremental decoder: bytes in, whole frames out.

    Args:
        max_frame_size: Largest body accepted; a larger length prefix is a
            protocol error raised as soon as the prefix arrives (at most one
            read's worth of the body is ever held).
    """

    def __init__(self, max_frame_size: int) -> None:
        self._max_frame_size = max_frame_size
        self._buffer = bytearray()
        self._decoder = msgspec.msgpack.Decoder(Frame)

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a whole frame."""
        return len(self._buffer)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Add received bytes; return every frame they complete, in order.

        Raises:
            ProtocolError: on an oversized length prefix or an undecodable body.
        """
        buffer = self._buffer
        buffer += data
        frames: list[Frame] = []
        position = 0
        end = len(buffer)
        with memoryview(buffer) as view:
            while end - position >= _HEADER.size:
                (size,) = _HEADER.unpack_from(view, position)
                if size > self._max_frame_size:
                    raise ProtocolError(
                        f"peer announced a frame of {size} bytes; "
                        f"the limit is {self._max_frame_size} bytes"
                    )
                body_start = position + _HEADER.size
                if end - body_start < size:
                    break
                try:
                    frames.append(self._decoder.decode(view[body_start : body_start + size]))
                except msgspec.DecodeError as exc:
                    raise ProtocolError(f"malformed frame: {exc}") from None
                except RecursionError:
                    raise ProtocolError("malformed frame: values nested too deeply") from None
                position = body_start + size
        del buffer[:position]
        return frames
