"""Memory settings for a long-running serving process: the start-up heap frozen, a higher
youngest-generation threshold so most per-request objects are freed by reference counting
before a collection walks them, and large freed buffers given back to the system at once.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from typing import Final

DEFAULT_GEN0_THRESHOLD: Final = 10_000
"""Net container allocations between two collections of the youngest generation."""
MMAP_THRESHOLD: Final = 1 << 20
"""Bytes from which an allocation is a mapping of its own."""
_M_MMAP_THRESHOLD: Final = -3  # glibc's mallopt parameter (malloc.h)


def tune_gc(gen0_threshold: int) -> None:
    """Freeze the heap and set the youngest generation's threshold (``0``: leave all).
    Call once, before the process starts serving (its imports done)."""
    if gen0_threshold < 0:
        raise ValueError(f"a GC threshold must be 0 or more, not {gen0_threshold}")
    if gen0_threshold == 0:
        return
    gc.collect()  # what is garbage now must not be frozen: it could never be freed
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(gen0_threshold, gen1, gen2)


def give_back_large_buffers() -> bool:
    """Fix glibc's mmap threshold at :data:`MMAP_THRESHOLD`, which otherwise rises to each
    large mapping freed (moving later buffers to a heap that rarely shrinks); whether it
    could be set."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt), or no libc found
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def tune_memory(gen0_threshold: int) -> None:
    """:func:`tune_gc` and :func:`give_back_large_buffers`: once, before the frontend or
    the mocker serves."""
    tune_gc(gen0_threshold)
    give_back_large_buffers()
