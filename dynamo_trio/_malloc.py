"""Large buffers given back to the system as soon as they are freed: glibc's mmap
threshold, which otherwise rises to each large mapping freed (moving later buffers to
a heap that rarely shrinks), is fixed at :data:`MMAP_THRESHOLD`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Final

MMAP_THRESHOLD: Final = 1 << 20
"""Bytes from which an allocation is a mapping of its own."""

_M_MMAP_THRESHOLD: Final = -3  # glibc's mallopt parameter (malloc.h)


def give_back_large_buffers() -> bool:
    """Fix glibc's mmap threshold at :data:`MMAP_THRESHOLD` (once, before serving);
    whether it could be set."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt), or no libc found
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
