"""Watch events and the :class:`Watch` handle every backend hands out.

A backend implements ``watch_prefix`` by taking a consistent snapshot of the
prefix (``Watch.initial``) and then feeding every later change into a trio
memory channel.  :class:`Watch` is the consumer end of that channel; the
producer end belongs to the backend's pump (a task in a nursery owned by the
``watch_prefix`` context manager, or the in-memory store itself).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, final

import trio

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Self

__all__ = ["Watch", "WatchEvent", "diff_events"]


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change under a watched prefix.

    Attributes:
        kind: ``"put"`` (the key was created or its value replaced) or
            ``"delete"`` (the key is gone: deleted, or its lease ended).
        key: The full key.
        value: The new value for a put, ``None`` for a delete.
    """

    kind: Literal["put", "delete"]
    key: str
    value: bytes | None


@final
class Watch:
    """The state of a prefix when the watch started, then every change after it.

    Iterate with ``async for event in watch``.  Applying the events in order to
    a copy of :attr:`initial` always gives the backend's current view of the
    prefix: no change is lost or repeated between the snapshot and the first
    event.  The iteration ends only when the watch's context is left.

    Args:
        initial: The snapshot, ``{key: value}``.
        events: The receiving end of the channel the backend sends changes to.
    """

    __slots__ = ("_events", "initial")

    def __init__(
        self, initial: dict[str, bytes], events: trio.MemoryReceiveChannel[WatchEvent]
    ) -> None:
        self.initial: dict[str, bytes] = initial
        self._events = events

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> WatchEvent:
        """Wait for the next change (cancellable; a checkpoint even if one is queued)."""
        try:
            return await self._events.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise StopAsyncIteration from None

    def pending(self) -> list[WatchEvent]:
        """The changes already queued, in order, taken without waiting (maybe none)."""
        queued: list[WatchEvent] = []
        while True:
            try:
                queued.append(self._events.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                return queued


def diff_events(old: Mapping[str, bytes], new: Mapping[str, bytes]) -> list[WatchEvent]:
    """The events that turn ``old`` into ``new``, sorted by key.

    Used by backends that learn about changes by comparing snapshots (the file
    backend's polling, the etcd backend's resynchronisation after compaction).
    """
    events: list[WatchEvent] = []
    for key in sorted(old.keys() | new.keys()):
        value = new.get(key)
        if value is None:
            events.append(WatchEvent("delete", key, None))
        elif old.get(key) != value:
            events.append(WatchEvent("put", key, value))
    return events
