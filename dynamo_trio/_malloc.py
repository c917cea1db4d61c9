"""Large buffers given back to the system as soon as they are freed.

glibc serves an allocation of at least its mmap threshold with a mapping of its
own, unmapped when it is freed.  But the threshold moves: each time such a
mapping is freed, the threshold rises to its size (up to 32 MiB on 64-bit), so
later buffers of that size come from the heap instead, and a heap rarely
shrinks.  A frontend that received a few request bodies of 16 MiB would keep
tens of MiB it no longer uses, for good.

:func:`give_back_large_buffers` fixes the threshold (fixing it also stops it
moving): every buffer of :data:`MMAP_THRESHOLD` or more is a mapping of its
own, returned when freed.  Small objects are not affected (Python's own
allocator serves them).  Where the C library is not glibc, nothing changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Final

__all__ = ["MMAP_THRESHOLD", "give_back_large_buffers"]

MMAP_THRESHOLD: Final = 1 << 20
"""Bytes from which an allocation is a mapping of its own."""

_M_MMAP_THRESHOLD: Final = -3
"""glibc's ``mallopt`` parameter (``malloc.h``)."""


def give_back_large_buffers() -> bool:
    """Fix glibc's mmap threshold at :data:`MMAP_THRESHOLD`; whether it could be set.

    Call once, before the process starts serving.
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt), or no libc found
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
