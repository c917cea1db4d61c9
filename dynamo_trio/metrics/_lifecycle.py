"""The once-only bookkeeping behind both request trackers (docs/cancellation.md)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Self, TypeVar

from ._names import UNKNOWN_REASON

if TYPE_CHECKING:
    from prometheus_client.metrics import MetricWrapperBase

_Child = TypeVar("_Child", bound="MetricWrapperBase")


class LabelChildren(dict[str | tuple[str, ...], _Child]):
    """A family's children under fixed leading labels, each bound on first use: a dict
    lookup on the hot path instead of ``labels()`` and its lock."""

    def __init__(self, family: _Child, *leading: str) -> None:
        super().__init__()
        self._family = family
        self._leading = leading

    def __missing__(self, key: str | tuple[str, ...]) -> _Child:
        rest = key if isinstance(key, tuple) else (key,)
        child = self[key] = self._family.labels(*self._leading, *rest)
        return child


@dataclass(frozen=True, slots=True)
class CancelSignal:
    """The first cancellation a request was told about."""

    reason: str
    """The :class:`~dynamo_trio.CancelReason` value (or any short, low-cardinality string)."""
    at: float
    """When it arrived, on the tracker's clock (``time.monotonic`` unless injected)."""


class _Lifecycle:
    """A tracker's first-cancel-wins and finish-once, decided under one lock."""

    __slots__ = ("_cancel", "_finished", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cancel: CancelSignal | None = None
        self._finished = False

    @property
    def cancel_reason(self) -> str | None:
        return None if self._cancel is None else self._cancel.reason

    @property
    def finished(self) -> bool:
        return self._finished

    def _mark_cancelled(self, reason: str, at: float) -> CancelSignal | None:
        """Record the signal if it is the first and the request runs: it if recorded, else None."""
        with self._lock:
            if self._finished or self._cancel is not None:
                return None
            self._cancel = CancelSignal(reason or UNKNOWN_REASON, at)
            return self._cancel

    def _mark_finished(self) -> tuple[bool, CancelSignal | None]:
        """Record the end: ``(True, signal or None)`` the first time, then ``(False, None)``."""
        with self._lock:
            if self._finished:
                return False, None
            self._finished = True
            return True, self._cancel

    def __enter__(self) -> Self:
        return self
