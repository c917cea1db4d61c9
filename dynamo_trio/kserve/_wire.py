"""gRPC on the wire, sans-IO: length-prefixed messages, ``grpc-timeout``, ``grpc-message``.

A gRPC message on an HTTP/2 stream is a 5-byte prefix (a compressed flag,
then the length as a big-endian ``uint32``) and that many bytes of protobuf.
:class:`Deframer` takes the stream's DATA in whatever pieces it arrives and
gives back whole messages; it refuses a compressed message (no
``grpc-encoding`` is accepted) and a declared length over its limit *before*
buffering the body, so a peer announcing four gigabytes costs nothing.
"""

from __future__ import annotations

import re
from typing import Final, final
from urllib.parse import quote, unquote

__all__ = [
    "PREFIX_SIZE",
    "Deframer",
    "WireError",
    "decode_grpc_message",
    "encode_grpc_message",
    "frame",
    "parse_timeout",
]

PREFIX_SIZE: Final = 5

_TIMEOUT: Final = re.compile(r"(\d{1,8})([HMSmun])")
_UNITS: Final = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}


@final
class WireError(ValueError):
    """Bytes that are not a valid gRPC message stream.

    ``too_large`` tells a declared length over the limit (``RESOURCE_EXHAUSTED``)
    from other malformations (``INVALID_ARGUMENT``/``UNIMPLEMENTED``).
    """

    def __init__(self, message: str, *, too_large: bool = False, unimplemented: bool = False):
        super().__init__(message)
        self.too_large = too_large
        self.unimplemented = unimplemented


def frame(message: bytes) -> bytes:
    """``message`` as it goes on the wire: uncompressed, length-prefixed."""
    return b"\x00" + len(message).to_bytes(4, "big") + message


@final
class Deframer:
    """Whole messages out of a byte stream that arrives in arbitrary pieces.

    States: reading a prefix, or reading the body whose length it declared.
    """

    __slots__ = ("_buffer", "_max_size", "_need")

    def __init__(self, max_size: int) -> None:
        self._max_size = max_size
        self._buffer = bytearray()
        self._need: int | None = None  # the body length once its prefix is read

    @property
    def pending(self) -> bool:
        """Whether part of a message has arrived but not all of it."""
        return bool(self._buffer) or self._need is not None

    def feed(self, data: bytes) -> list[bytes]:
        """The messages that ``data`` completes, in order.

        Raises:
            WireError: a compressed message, or one declared longer than the limit.
        """
        self._buffer += data
        messages: list[bytes] = []
        while True:
            if self._need is None:
                if len(self._buffer) < PREFIX_SIZE:
                    return messages
                flag = self._buffer[0]
                length = int.from_bytes(self._buffer[1:PREFIX_SIZE], "big")
                if flag == 1:
                    raise WireError(
                        "compressed messages are not accepted (send no grpc-encoding)",
                        unimplemented=True,
                    )
                if flag != 0:
                    raise WireError(f"invalid message flag {flag} (0 or 1)")
                if length > self._max_size:
                    raise WireError(
                        f"a message of {length} bytes is over the limit of {self._max_size}",
                        too_large=True,
                    )
                del self._buffer[:PREFIX_SIZE]
                self._need = length
            if len(self._buffer) < self._need:
                return messages
            messages.append(bytes(self._buffer[: self._need]))
            del self._buffer[: self._need]
            self._need = None


def parse_timeout(value: str) -> float:
    """Seconds from a ``grpc-timeout`` header (``100m``, ``5S``: at most 8 digits, a unit).

    Raises:
        WireError: anything else.
    """
    match = _TIMEOUT.fullmatch(value.strip())
    if match is None:
        raise WireError(f"invalid grpc-timeout {value[:40]!r}")
    return int(match[1]) * _UNITS[match[2]]


def encode_grpc_message(text: str) -> str:
    """``grpc-message`` as sent: percent-encoded, printable ASCII only."""
    return quote(text, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~")


def decode_grpc_message(value: str) -> str:
    """The text of a received ``grpc-message``."""
    return unquote(value)
