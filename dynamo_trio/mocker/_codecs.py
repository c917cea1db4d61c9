"""Small encoders for the mock media engines: PNG, baseline JPEG, WAV and PCM.

Standard library only, so the mocker has no imaging dependency: the pictures
are simple, but every file is real and any decoder reads it.
"""

from __future__ import annotations

import math
import struct
import zlib
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Callable

Rgb = tuple[int, int, int]

SAMPLE_RATE: Final = 24000
"""Samples per second of the speech audio (16-bit mono, OpenAI's pcm format)."""


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png(width: int, height: int, row_colour: Callable[[int], Rgb]) -> bytes:
    """An RGB PNG of ``width`` x ``height`` whose row ``y`` is all ``row_colour(y)``."""
    raw = b"".join(b"\x00" + bytes(row_colour(y)) * width for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", header)
        + _png_chunk(b"IDAT", zlib.compress(raw, 6))
        + _png_chunk(b"IEND", b"")
    )


# The standard luminance DC table (ITU T.81, K.3): code lengths 2..9 for categories 0..11.
_DC_BITS: Final = (0, 1, 5, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0)
_DC_VALUES: Final = tuple(range(12))
# An AC table with the one symbol a flat block needs: end-of-block (0x00), code "0".
_AC_BITS: Final = (1,) + (0,) * 15
_AC_VALUES: Final = (0,)


def _codes(bits: tuple[int, ...], values: tuple[int, ...]) -> dict[int, tuple[int, int]]:
    """The canonical Huffman codes, ``value -> (code, length)``, of a JPEG table."""
    codes: dict[int, tuple[int, int]] = {}
    code, index = 0, 0
    for length, count in enumerate(bits, start=1):
        for _ in range(count):
            codes[values[index]] = (code, length)
            code += 1
            index += 1
        code <<= 1
    return codes


_DC_CODES: Final = _codes(_DC_BITS, _DC_VALUES)


def _segment(marker: int, data: bytes) -> bytes:
    return struct.pack(">HH", 0xFF00 | marker, len(data) + 2) + data


def _ycbcr(colour: Rgb) -> tuple[int, int, int]:
    r, g, b = colour
    y = 0.299 * r + 0.587 * g + 0.114 * b
    cb = 128 - 0.168736 * r - 0.331264 * g + 0.5 * b
    cr = 128 + 0.5 * r - 0.418688 * g - 0.081312 * b
    return tuple(min(255, max(0, round(v))) for v in (y, cb, cr))  # type: ignore[return-value]


def jpeg(width: int, height: int, block_colour: Callable[[int, int], Rgb]) -> bytes:
    """A baseline JPEG of ``width`` x ``height`` whose 8x8 block ``(bx, by)`` is
    all ``block_colour(bx, by)``."""
    acc, nbits = 0, 0
    out = bytearray()

    def put(code: int, length: int) -> None:
        nonlocal acc, nbits
        acc = (acc << length) | code
        nbits += length
        while nbits >= 8:
            nbits -= 8
            byte = (acc >> nbits) & 0xFF
            out.append(byte)
            if byte == 0xFF:
                out.append(0)  # byte stuffing
        acc &= (1 << nbits) - 1

    previous = [0, 0, 0]
    for by in range((height + 7) // 8):
        for bx in range((width + 7) // 8):
            for component, level in enumerate(_ycbcr(block_colour(bx, by))):
                # With a quantiser of 8, a flat block's DC coefficient is its level - 128.
                dc = level - 128
                diff, previous[component] = dc - previous[component], dc
                category = abs(diff).bit_length()
                put(*_DC_CODES[category])
                if category:
                    put(diff if diff > 0 else diff + (1 << category) - 1, category)
                put(0, 1)  # end of block
    if nbits:
        put((1 << (8 - nbits)) - 1, 8 - nbits)  # pad with 1 bits
    components = b"".join(bytes((index, 0x11, 0)) for index in (1, 2, 3))
    table = bytes((0,)) + bytes((8,)) * 64
    dht = (
        bytes((0x00,)) + bytes(_DC_BITS) + bytes(_DC_VALUES)
        + bytes((0x10,)) + bytes(_AC_BITS) + bytes(_AC_VALUES)
    )  # fmt: skip
    scan = bytes((3,)) + b"".join(bytes((index, 0x00)) for index in (1, 2, 3)) + bytes((0, 63, 0))
    return (
        b"\xff\xd8"
        + _segment(0xE0, b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00")
        + _segment(0xDB, table)
        + _segment(0xC0, struct.pack(">BHHB", 8, height, width, 3) + components)
        + _segment(0xC4, dht)
        + _segment(0xDA, scan)
        + bytes(out)
        + b"\xff\xd9"
    )


def wav_header(samples: int) -> bytes:
    """The 44-byte header of a 16-bit mono WAV of ``samples`` samples at :data:`SAMPLE_RATE`."""
    data = samples * 2
    return (
        struct.pack("<4sI4s", b"RIFF", 36 + data, b"WAVE")
        + struct.pack("<4sIHHIIHH", b"fmt ", 16, 1, 1, SAMPLE_RATE, SAMPLE_RATE * 2, 2, 16)
        + struct.pack("<4sI", b"data", data)
    )


def pcm_tone(start: int, count: int, frequency: float) -> bytes:
    """Samples ``start`` to ``start + count`` of a sine tone, 16-bit little-endian."""
    step = 2 * math.pi * frequency / SAMPLE_RATE
    samples = (round(9000 * math.sin(step * n)) for n in range(start, start + count))
    return struct.pack(f"<{count}h", *samples)
