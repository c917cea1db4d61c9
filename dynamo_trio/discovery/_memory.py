"""The ``mem`` backend: discovery inside one process, for tests and single-process setups.

Operations never await midway (a watch's snapshot and registration are atomic), and watch
channels are unbounded (a writer never waits for a reader).
"""

from __future__ import annotations

import functools
import math
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, final

import trio

from ._base import Discovery, check_key, random_lease_id
from ._watch import Watch, WatchEvent

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from contextlib import AbstractAsyncContextManager


@final
class MemoryStore:
    """The keys, leases and watches of the ``mem`` backend (per process or test; one trio run)."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[bytes, int]] = {}  # key -> (value, lease)
        self._leases: set[int] = set()
        self._watches: dict[trio.MemorySendChannel[WatchEvent], str] = {}  # channel -> prefix

    def new_lease(self) -> int:
        lease_id = next(i for i in iter(random_lease_id, 0) if i not in self._leases)
        self._leases.add(lease_id)
        return lease_id

    def lease_alive(self, lease_id: int) -> bool:
        return lease_id in self._leases

    def restore_lease(self, lease_id: int) -> None:
        """Bring a revoked lease back (its owner is alive and re-registering)."""
        self._leases.add(lease_id)

    def lookup(self, key: str) -> tuple[bytes, int] | None:
        return self._entries.get(key)

    def put(self, key: str, value: bytes, lease_id: int) -> None:
        """Set ``key`` and attach it to ``lease_id`` (the last writer's lease wins)."""
        self._entries[key] = (value, lease_id)
        self._notify(WatchEvent("put", key, value))

    def delete(self, key: str) -> None:
        """Remove ``key``; watchers hear only of keys that existed."""
        if self._entries.pop(key, None) is not None:
            self._notify(WatchEvent("delete", key, None))

    def revoke(self, lease_id: int) -> None:
        """End ``lease_id``: every key attached to it is deleted at once."""
        self._leases.discard(lease_id)
        for key in sorted(key for key, (_, owner) in self._entries.items() if owner == lease_id):
            self.delete(key)

    def snapshot(self, prefix: str) -> dict[str, bytes]:
        return {key: value for key, (value, _) in self._entries.items() if key.startswith(prefix)}

    def subscribe(
        self, prefix: str, send_channel: trio.MemorySendChannel[WatchEvent]
    ) -> dict[str, bytes]:
        """Snapshot ``prefix`` and register ``send_channel`` for every later change, atomically."""
        self._watches[send_channel] = prefix
        return self.snapshot(prefix)

    def unsubscribe(self, send_channel: trio.MemorySendChannel[WatchEvent]) -> None:
        self._watches.pop(send_channel, None)

    @property
    def watch_count(self) -> int:
        """How many watches are open (tests use it to check that watches release)."""
        return len(self._watches)

    def _notify(self, event: WatchEvent) -> None:
        for send_channel, prefix in list(self._watches.items()):
            if event.key.startswith(prefix):
                try:
                    send_channel.send_nowait(event)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    self.unsubscribe(send_channel)


@functools.cache
def default_memory_store() -> MemoryStore:
    """The process-wide store used when none is given (``mem`` means one process)."""
    return MemoryStore()


@final
class MemoryDiscovery(Discovery):
    """Discovery in one process's memory; instances on one :class:`MemoryStore` see each other.

    A lease revoked in the store (not by closing) is restored with its keys within ``lease_ttl``.
    """

    def __init__(
        self,
        store: MemoryStore | None = None,
        *,
        lease_ttl: float = 10.0,
        max_record_size: int | None = None,
    ) -> None:
        super().__init__(max_record_size)
        if not lease_ttl > 0:
            raise ValueError(f"lease_ttl must be positive, not {lease_ttl}")
        self._store = default_memory_store() if store is None else store
        self._lease_id = self._store.new_lease()
        self._ttl = lease_ttl

    async def _put(self, key: str, value: bytes) -> None:
        self._store.restore_lease(self._lease_id)
        self._store.put(key, value, self._lease_id)

    async def _delete(self, key: str) -> None:
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
        with send_channel, receive_channel:
            try:
                yield Watch(self._store.subscribe(prefix, send_channel), receive_channel)
            finally:
                self._store.unsubscribe(send_channel)

    def _lifetime(self) -> AbstractAsyncContextManager[None]:
        return self._run_while_open(self._keep_owned_keys)

    async def _keep_owned_keys(self) -> None:
        """Every ttl/3: restore the lease and the owned keys if the store lost them."""
        while True:
            await trio.sleep(self._ttl / 3)
            if self._closed:
                return
            store = self._store
            found = {key: stored for key in self._owned if (stored := store.lookup(key))}
            store.restore_lease(self._lease_id)
            for key in self._repair(found, store.lease_alive).rewrite:
                store.put(key, self._owned[key], self._lease_id)

    async def _revoke_lease(self) -> None:
        self._store.revoke(self._lease_id)
