"""gRPC on the wire, sans-IO: length-prefixed messages, ``grpc-timeout``, ``grpc-message``.

A gRPC message on an HTTP/2 stream is a 5-byte prefix (a compressed flag,
then the length as a big-endian ``uint32``) and that many bytes of protobuf.
:class:`Deframer` takes the stream's DATA in whatever pieces it arrives and
gives back whole messages.  It refuses a declared length over its limit
*before* buffering the body, so a peer announcing four gigabytes costs
nothing; a compressed message (``grpc-encoding`` ``gzip`` or ``deflate``) is
inflated to at most the same limit, so a decompression bomb costs no more.
"""

from __future__ import annotations

import re
import zlib
from typing import TYPE_CHECKING, Final, final
from urllib.parse import quote

if TYPE_CHECKING:
    from collections.abc import Callable

PREFIX_SIZE: Final = 5

ENCODINGS: Final = {"identity": None, "deflate": zlib.MAX_WBITS, "gzip": 16 + zlib.MAX_WBITS}
"""The ``grpc-encoding`` values accepted, with their ``zlib`` window bits (``deflate``
is the zlib format in gRPC)."""

ACCEPT_ENCODING: Final = ", ".join(ENCODINGS)
"""``grpc-accept-encoding``: what a client may compress its messages with."""

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
    ``encoding`` is the call's ``grpc-encoding``: one not in :data:`ENCODINGS`
    refuses the call at its first data (``UNIMPLEMENTED``).  ``admit``, if given,
    is told the bytes each message is about to take (its declared length before
    its body is buffered, then what inflating it adds, or takes away if it is
    negative) and may refuse more by raising :class:`WireError`.
    """

    __slots__ = ("_admit", "_buffer", "_compressed", "_encoding", "_max_size", "_need")

    def __init__(
        self,
        max_size: int,
        *,
        encoding: str = "identity",
        admit: Callable[[int], None] | None = None,
    ) -> None:
        self._max_size = max_size
        self._encoding = encoding
        self._admit = admit
        self._buffer = bytearray()
        self._need: int | None = None  # the body length once its prefix is read
        self._compressed = False  # the prefix's flag

    @property
    def pending(self) -> bool:
        """Whether part of a message has arrived but not all of it."""
        return bool(self._buffer) or self._need is not None

    def feed(self, data: bytes) -> list[bytes]:
        """The messages that ``data`` completes, in order.

        Raises:
            WireError: an encoding not accepted, a message declared or inflated
                over the limit, one that does not inflate, or one ``admit`` refused.
        """
        if self._encoding not in ENCODINGS:
            raise WireError(
                f"grpc-encoding {self._encoding[:40]!r} is not accepted ({ACCEPT_ENCODING})",
                unimplemented=True,
            )
        self._buffer += data
        messages: list[bytes] = []
        while True:
            if self._need is None:
                if len(self._buffer) < PREFIX_SIZE:
                    return messages
                flag = self._buffer[0]
                length = int.from_bytes(self._buffer[1:PREFIX_SIZE], "big")
                if flag == 1 and ENCODINGS[self._encoding] is None:
                    raise WireError(
                        "a compressed message without a grpc-encoding "
                        f"(send one of {ACCEPT_ENCODING})",
                        unimplemented=True,
                    )
                if flag not in (0, 1):
                    raise WireError(f"invalid message flag {flag} (0 or 1)")
                if length > self._max_size:
                    raise WireError(
                        f"a message of {length} bytes is over the limit of {self._max_size}",
                        too_large=True,
                    )
                if self._admit is not None:
                    self._admit(length)
                del self._buffer[:PREFIX_SIZE]
                self._need, self._compressed = length, flag == 1
            if len(self._buffer) < self._need:
                return messages
            message = bytes(self._buffer[: self._need])
            del self._buffer[: self._need]
            if self._compressed:
                message = self._inflate(message)
            messages.append(message)
            self._need = None

    def _inflate(self, message: bytes) -> bytes:
        inflater = zlib.decompressobj(ENCODINGS[self._encoding] or 0)
        try:
            inflated = inflater.decompress(message, self._max_size + 1)
        except zlib.error as exc:
            raise WireError(f"a message does not inflate as {self._encoding}: {exc}") from None
        if len(inflated) > self._max_size:
            raise WireError(
                f"a {self._encoding} message inflates to over the limit of {self._max_size} bytes",
                too_large=True,
            )
        if not inflater.eof or inflater.unused_data:
            raise WireError(
                f"a message is not one whole {self._encoding} stream "
                f"({'data after its end' if inflater.eof else 'it is cut short'})"
            )
        if self._admit is not None:
            self._admit(len(inflated) - len(message))
        return inflated


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
