"""The garbage collector's settings for a long-running serving process.

CPython's cyclic collector runs its youngest generation every 700 net (2,000 on 3.13)
allocations of container objects (dicts, lists, coroutines, cancel scopes...),
and every so often a full collection that walks every object in the heap,
including the tens of thousands that only exist because modules were imported.
A frontend under load allocates a few hundred such objects per request (its
tasks, scopes, channels and contexts) that live as long as the request, so
they are walked again and again while it runs.

:func:`tune_gc` does what long-running Python servers commonly do:

* ``gc.collect()`` then ``gc.freeze()`` once, before the process starts
  serving: what exists then (modules, classes, functions) moves to a
  permanent generation that no collection walks again;
* the youngest generation's threshold is raised (:data:`DEFAULT_GEN0_THRESHOLD`),
  so most per-request objects are freed by reference counting before a
  collection ever walks them.  The older generations keep Python's settings.

Cyclic garbage is still collected, in larger batches; the pauses are as many and
as long as before, the time spent far less (``benchmarks/RESULTS.md``).
"""

from __future__ import annotations

import gc
from typing import Final

__all__ = ["DEFAULT_GEN0_THRESHOLD", "tune_gc"]

DEFAULT_GEN0_THRESHOLD: Final = 10_000
"""Net container allocations between two collections of the youngest generation."""


def tune_gc(gen0_threshold: int) -> None:
    """Freeze the heap as it is and set the youngest generation's threshold.

    Call once, before the process starts serving (its imports done).  ``0`` leaves the
    collector exactly as Python set it (nothing is frozen).

    Raises:
        ValueError: ``gen0_threshold`` is negative.
    """
    if gen0_threshold < 0:
        raise ValueError(f"a GC threshold must be 0 or more, not {gen0_threshold}")
    if gen0_threshold == 0:
        return
    gc.collect()  # what is garbage now must not be frozen: it could never be freed
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(gen0_threshold, gen1, gen2)
