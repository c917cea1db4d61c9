"""The once-only bookkeeping behind both request trackers.

Exact counting comes down to two facts about a request, each of which must be
decided exactly once, and in an order that cannot be argued with:

* *was it told to cancel, when, and why*: the first signal wins; a kill after
  a stop, or a socket close after a kill frame, is the same cancellation;
* *has it ended*: the end is recorded once, and a signal arriving after the
  end is too late to have cancelled anything.

:class:`_Lifecycle` holds both under one lock, so the two questions are
answered atomically even if a signal and the end race (from a foreign thread,
say).  The trackers only record metrics when a method here says "this call
was the one", which is what makes double counting impossible.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from ._names import UNKNOWN_REASON

__all__ = ["CancelSignal"]


@dataclass(frozen=True, slots=True)
class CancelSignal:
    """The first cancellation a request was told about."""

    reason: str
    """The :class:`~dynamo_trio.CancelReason` value (or any short, low-cardinality string)."""
    at: float
    """When it arrived, on the tracker's clock (``time.monotonic`` unless injected)."""


class _Lifecycle:
    """First-cancel-wins and finish-once, decided under one lock."""

    __slots__ = ("_cancel", "_finished", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cancel: CancelSignal | None = None
        self._finished = False

    @property
    def cancel(self) -> CancelSignal | None:
        return self._cancel

    @property
    def finished(self) -> bool:
        return self._finished

    def mark_cancelled(self, reason: str, at: float) -> CancelSignal | None:
        """Record the signal if it is the first one and the request is still running.

        Returns:
            The recorded signal if this call recorded it, else ``None``.
        """
        with self._lock:
            if self._finished or self._cancel is not None:
                return None
            self._cancel = CancelSignal(reason or UNKNOWN_REASON, at)
            return self._cancel

    def mark_finished(self) -> tuple[bool, CancelSignal | None]:
        """Record the end.

        Returns:
            ``(True, signal_or_None)`` for the call that ended the request,
            ``(False, None)`` for every later call.
        """
        with self._lock:
            if self._finished:
                return False, None
            self._finished = True
            return True, self._cancel
