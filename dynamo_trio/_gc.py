"""The garbage collector's settings for a long-running serving process: the start-up
heap frozen, and a higher youngest-generation threshold so most per-request objects
are freed by reference counting before a collection walks them.  :func:`tune_memory`
adds large buffers given back to the system (:mod:`._malloc`).
"""

from __future__ import annotations

import gc
from typing import Final

from ._malloc import give_back_large_buffers

DEFAULT_GEN0_THRESHOLD: Final = 10_000
"""Net container allocations between two collections of the youngest generation."""


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


def tune_memory(gen0_threshold: int) -> None:
    """:func:`tune_gc`, and freed request bodies of many MiB given back at once
    (:func:`give_back_large_buffers`): once, before the frontend or the mocker serves."""
    tune_gc(gen0_threshold)
    give_back_large_buffers()
