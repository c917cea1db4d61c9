"""Watch events and the :class:`Watch` handle every backend hands out.

A backend snapshots the prefix (``Watch.initial``) and feeds every later change
into a memory channel whose receiving end the :class:`Watch` holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal, final

import trio

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Self

WATCH_BUFFER: Final = 64
"""Events a backend's watch may queue ahead of its reader before it stops reading changes."""


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change under a watched prefix: a put, or a delete (``value`` None; maybe a lease end)."""

    kind: Literal["put", "delete"]
    key: str
    value: bytes | None


@final
class Watch:
    """The state of a prefix when the watch started, then (``async for``) every change after it.

    Applying the events in order to :attr:`initial` gives the backend's current
    view: none lost or repeated.  Iteration ends when the watch's context is left.
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
    """The events that turn ``old`` into ``new``, sorted by key (backends comparing snapshots)."""
    events: list[WatchEvent] = []
    for key in sorted(old.keys() | new.keys()):
        value = new.get(key)
        if value is None:
            events.append(WatchEvent("delete", key, None))
        elif old.get(key) != value:
            events.append(WatchEvent("put", key, value))
    return events
