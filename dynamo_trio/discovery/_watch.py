"""Watch events, the :class:`Watch` every backend hands out (``initial``, then a memory
channel of the later changes), and the live decoded view built on it."""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Generic, Literal, TypeVar, final

import trio

from ._base import BadRecordReport, DiscoveryError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Mapping
    from typing import Self

    from ._base import Discovery

logger = logging.getLogger(__name__)

T = TypeVar("T")

WATCH_BUFFER: Final = 64
"""Events a backend's watch may queue ahead of its reader before it stops reading changes."""


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change under a watched prefix: a put, or a delete (``value`` None; maybe a lease end)."""

    kind: Literal["put", "delete"]
    key: str
    value: bytes | None


@final
@dataclass(eq=False, slots=True)
class Watch:
    """The state of a prefix when the watch started, then (``async for``) every change after it.

    Applying the events in order to :attr:`initial` gives the backend's current
    view: none lost or repeated.  Iteration ends when the watch's context is left.
    """

    initial: dict[str, bytes]
    _events: trio.MemoryReceiveChannel[WatchEvent]

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
    changed = (key for key in sorted(old.keys() | new.keys()) if old.get(key) != new.get(key))
    return [WatchEvent("put" if key in new else "delete", key, new.get(key)) for key in changed]


@final
class PrefixView(Generic[T]):
    """The decoded records under a prefix, kept current by :func:`view_prefix` (any task reads).

    Readers take copies and wait by version, so they never miss a change between looking and
    waiting: ``while True: route_to(view.items()); version = await view.wait_changed(version)``.
    """

    def __init__(self, prefix: str, decode: Callable[[bytes], T]) -> None:
        self.prefix = prefix
        self._decode = decode
        self._raw: dict[str, bytes] = {}
        self._records: dict[str, T] = {}
        self._version = 0
        self._changed = trio.Event()
        self._ended: str | None = None
        self._report = BadRecordReport(logger, f"undecodable records under {prefix!r}")

    @property
    def version(self) -> int:
        """Bumped every time the set of records changes (0 for the initial state)."""
        return self._version

    def items(self) -> dict[str, T]:
        """A copy of the current records, ``{key: record}``."""
        return dict(self._records)

    async def wait_changed(self, since_version: int) -> int:
        """Wait until :attr:`version` differs from ``since_version``; return it (DiscoveryError
        if the watch ended)."""
        await self._wait(lambda: self._version != since_version)
        return self._version

    async def wait_until(self, predicate: Callable[[Mapping[str, T]], bool]) -> dict[str, T]:
        """Wait until ``predicate(records)`` holds; return a copy (DiscoveryError: watch ended)."""
        await self._wait(lambda: predicate(self._records))
        return dict(self._records)

    async def _wait(self, done: Callable[[], bool]) -> None:
        await trio.lowlevel.checkpoint()
        while not done():
            if self._ended is not None:
                raise DiscoveryError(f"the watch of {self.prefix!r} ended: {self._ended}")
            await self._changed.wait()

    def _apply(self, events: list[WatchEvent]) -> None:
        changed = False
        for event in events:
            if event.kind == "put" and event.value is not None:
                changed |= self._store(event.key, event.value)
            elif self._raw.pop(event.key, None) is not None:
                changed |= self._records.pop(event.key, None) is not None
        self._report.end_batch()
        if changed:
            self._bump()

    def _store(self, key: str, value: bytes) -> bool:
        if self._raw.get(key) == value:
            return False
        self._raw[key] = value
        try:
            record = self._decode(value)
        except Exception as exc:  # a bad record must never take the view down
            self._report.bad(f"the undecodable record at {key!r}", str(exc))
            return self._records.pop(key, None) is not None
        self._records[key] = record
        return True

    def _bump(self) -> None:
        self._version += 1
        self._changed.set()
        self._changed = trio.Event()


@asynccontextmanager
async def view_prefix(
    discovery: Discovery, prefix: str, decode: Callable[[bytes], T]
) -> AsyncIterator[PrefixView[T]]:
    """Keep a live ``{key: decode(value)}`` view of ``prefix`` (records ``decode`` rejects are
    logged and skipped)."""
    view: PrefixView[T] = PrefixView(prefix, decode)
    async with discovery.watch_prefix(prefix) as watch, trio.open_nursery() as nursery:
        for key in sorted(watch.initial):
            view._store(key, watch.initial[key])
        view._report.end_batch()

        async def pump() -> None:
            async for event in watch:
                view._apply([event, *watch.pending()])
            view._ended = "the backend stopped sending events"
            view._bump()

        nursery.start_soon(pump)
        try:
            yield view
        finally:
            nursery.cancel_scope.cancel(reason="prefix view closed")
