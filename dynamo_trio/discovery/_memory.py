"""The ``mem`` backend: discovery inside one process, for tests and single-process setups.

A :class:`MemoryStore` holds the keys, which lease each belongs to, and the
open watches.  Every operation runs to completion without an await in
between, so a watch's snapshot and its registration for later changes happen
atomically and no event can fall between them.  Watch channels are unbounded
because a writer must never wait for a slow reader; a reader that stops
reading only grows its own queue, and leaving the watch frees it.
"""

from __future__ import annotations

import math
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Final, final

import trio

from ._base import CLOSE_TIMEOUT, Discovery, check_key, check_value, random_lease_id
from ._watch import Watch, WatchEvent

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

__all__ = ["MemoryDiscovery", "MemoryStore", "default_memory_store"]


@final
class _Subscriber:
    """One open watch: its prefix and the channel its events go to."""

    __slots__ = ("prefix", "send_channel")

    def __init__(self, prefix: str, send_channel: trio.MemorySendChannel[WatchEvent]) -> None:
        self.prefix: Final = prefix
        self.send_channel: Final = send_channel


@final
class MemoryStore:
    """The keys, leases and watches of the ``mem`` backend (one per process, or per test).

    Not thread-safe: use it from one trio run.
    """

    def __init__(self) -> None:
        self._values: dict[str, bytes] = {}
        self._owner: dict[str, int] = {}
        self._leases: set[int] = set()
        self._subscribers: set[_Subscriber] = set()

    def new_lease(self) -> int:
        """Allocate a lease id not in use in this store."""
        while True:
            lease_id = random_lease_id()
            if lease_id not in self._leases:
                self._leases.add(lease_id)
                return lease_id

    def put(self, key: str, value: bytes, lease_id: int) -> None:
        """Set ``key`` and attach it to ``lease_id`` (the last writer's lease wins)."""
        self._values[key] = value
        self._owner[key] = lease_id
        self._notify(WatchEvent("put", key, value))

    def delete(self, key: str) -> None:
        """Remove ``key``; nothing happens (and nobody is notified) if it is absent."""
        if self._values.pop(key, None) is not None:
            del self._owner[key]
            self._notify(WatchEvent("delete", key, None))

    def revoke(self, lease_id: int) -> None:
        """End ``lease_id``: every key attached to it is deleted at once."""
        self._leases.discard(lease_id)
        for key in sorted(key for key, owner in self._owner.items() if owner == lease_id):
            self.delete(key)

    def snapshot(self, prefix: str) -> dict[str, bytes]:
        """Every key starting with ``prefix``."""
        return {key: value for key, value in self._values.items() if key.startswith(prefix)}

    def subscribe(
        self, prefix: str, send_channel: trio.MemorySendChannel[WatchEvent]
    ) -> tuple[dict[str, bytes], _Subscriber]:
        """Snapshot ``prefix`` and register ``send_channel`` for every later change, atomically."""
        subscriber = _Subscriber(prefix, send_channel)
        self._subscribers.add(subscriber)
        return self.snapshot(prefix), subscriber

    def unsubscribe(self, subscriber: _Subscriber) -> None:
        """Stop sending events to ``subscriber`` (idempotent)."""
        self._subscribers.discard(subscriber)

    @property
    def watch_count(self) -> int:
        """How many watches are open (tests use it to check that watches release)."""
        return len(self._subscribers)

    def _notify(self, event: WatchEvent) -> None:
        for subscriber in list(self._subscribers):
            if event.key.startswith(subscriber.prefix):
                try:
                    subscriber.send_channel.send_nowait(event)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    self._subscribers.discard(subscriber)


_default_store: MemoryStore | None = None


def default_memory_store() -> MemoryStore:
    """The process-wide store used when none is given (``mem`` means one process)."""
    global _default_store
    if _default_store is None:
        _default_store = MemoryStore()
    return _default_store


@final
class MemoryDiscovery(Discovery):
    """Discovery in one process's memory.

    Several instances on one :class:`MemoryStore` see each other's keys, as
    separate processes would through etcd.  There is nothing to keep alive: a
    lease ends only when its instance is closed.

    Args:
        store: Where the keys live; defaults to :func:`default_memory_store`.
    """

    def __init__(self, store: MemoryStore | None = None) -> None:
        super().__init__()
        self._store = default_memory_store() if store is None else store
        self._lease_id = self._store.new_lease()

    @property
    def lease_id(self) -> int:
        return self._lease_id

    async def put(self, key: str, value: bytes) -> None:
        check_key(key)
        value = check_value(value)
        await trio.lowlevel.checkpoint()
        self._check_open()
        self._store.put(key, value, self._lease_id)

    async def delete(self, key: str) -> None:
        check_key(key)
        await trio.lowlevel.checkpoint()
        self._check_open()
        self._store.delete(key)

    async def get_prefix(self, prefix: str) -> dict[str, bytes]:
        check_key(prefix)
        await trio.lowlevel.checkpoint()
        self._check_open()
        return self._store.snapshot(prefix)

    @asynccontextmanager
    async def watch_prefix(self, prefix: str) -> AsyncIterator[Watch]:
        check_key(prefix)
        await trio.lowlevel.checkpoint()
        self._check_open()
        send_channel, receive_channel = trio.open_memory_channel[WatchEvent](math.inf)
        initial, subscriber = self._store.subscribe(prefix, send_channel)
        try:
            yield Watch(initial, receive_channel)
        finally:
            self._store.unsubscribe(subscriber)
            send_channel.close()
            receive_channel.close()

    @asynccontextmanager
    async def _lifetime(self) -> AsyncIterator[None]:
        try:
            yield
        finally:
            with trio.move_on_after(CLOSE_TIMEOUT, shield=True):
                await self.aclose()

    async def _revoke_lease(self) -> None:
        await trio.lowlevel.checkpoint()
        self._store.revoke(self._lease_id)
