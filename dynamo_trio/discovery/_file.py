"""The ``file`` backend's trio side (the on-disk rules are :mod:`._file_store`'s): blocking
calls in worker threads, and one poller serving every watch, which therefore reports states
rather than every change (docs/discovery.md)."""

from __future__ import annotations

import logging
import math
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, final

import trio

from ._base import Discovery, DiscoveryError, check_key, random_lease_id
from ._file_store import FileLayout, Scanner, Signature
from ._watch import WATCH_BUFFER, Watch, WatchEvent, diff_events

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from .._config import DiscoveryConfig

logger = logging.getLogger(__name__)


@final
class FileDiscovery(Discovery):
    """Discovery through the shared directory ``config.file_kv`` (created if missing)."""

    def __init__(self, config: DiscoveryConfig) -> None:
        super().__init__()
        self._layout = FileLayout(config.file_kv, config.max_record_size)
        self._ttl = config.lease_ttl
        self._poll_interval = config.poll_interval
        self._lease_id = random_lease_id()
        self._written: dict[str, Signature] = {}  # each owned file as last written or checked
        self._last_problem: str | None = None  # keepalive failures are logged once each
        self._touched_at = -math.inf  # trio clock
        self._scanner = Scanner(self._layout, self._ttl)  # one thread at a time: _scan_lock
        self._scan_lock = trio.Lock()
        self._latest: dict[str, bytes] = {}  # a new object whenever a scan's result changed
        self._scanned = trio.Event()  # set and replaced when _latest is
        self._watches = 0
        self._watch_opened = trio.Event()  # set and replaced: the poll runs only while watched

    async def _put(self, key: str, value: bytes) -> None:
        self._layout.encode_entry(key, value, self._lease_id)  # ValueError if too large
        self._written.pop(key, None)
        try:
            written = await trio.to_thread.run_sync(self._write, key, value, dict(self._owned))
        except OSError as exc:
            raise DiscoveryError(f"cannot write {key!r} in {self._layout.root}: {exc}") from exc
        self._touched_at = trio.current_time()
        self._written.update(written)

    def _write(self, key: str, value: bytes, owned: dict[str, bytes]) -> dict[str, Signature]:
        """Refresh the lease, then write ``key`` (never under a lease readers may judge stale);
        the signatures written (every owned key's, ``key`` included, if the lease had been lost)."""
        recovered = self._refresh_lease(owned)
        return recovered or {key: self._layout.write_entry(key, value, self._lease_id)}

    def _refresh_lease(self, owned: dict[str, bytes]) -> dict[str, Signature]:
        """Touch the lease file; if it had gone, recreate it and rewrite ``owned`` (rule 5),
        returning their signatures (none if the lease was there)."""
        if self._layout.touch_lease(self._lease_id):
            return {}
        logger.warning(
            "discovery: lease %016x was lost; re-registering %d keys", self._lease_id, len(owned)
        )
        self._layout.create_lease(self._lease_id, self._ttl)
        return {k: self._layout.write_entry(k, v, self._lease_id) for k, v in owned.items()}

    async def _delete(self, key: str) -> None:
        self._written.pop(key, None)
        try:
            await trio.to_thread.run_sync(self._layout.delete_entry, key)
        except OSError as exc:
            raise DiscoveryError(f"cannot delete {key!r} in {self._layout.root}: {exc}") from exc

    async def get_prefix(self, prefix: str) -> dict[str, bytes]:
        check_key(prefix)
        self._check_open()
        return _under(await self._scan(), prefix)

    @asynccontextmanager
    async def watch_prefix(self, prefix: str) -> AsyncIterator[Watch]:
        check_key(prefix)
        self._check_open()
        latest = await self._scan()
        send_channel, receive_channel = trio.open_memory_channel[WatchEvent](WATCH_BUFFER)
        self._watches += 1
        opened, self._watch_opened = self._watch_opened, trio.Event()
        opened.set()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._forward, prefix, latest, send_channel)
                try:
                    yield Watch(_under(latest, prefix), receive_channel)
                finally:
                    nursery.cancel_scope.cancel(reason="watch closed")
                    receive_channel.close()
        finally:
            self._watches -= 1

    async def _scan(self) -> dict[str, bytes]:
        """The directory's live entries now (one scan, shared with every caller)."""
        async with self._scan_lock:
            try:
                latest = await trio.to_thread.run_sync(self._scanner.scan)
            except OSError as exc:
                raise DiscoveryError(f"cannot read {self._layout.root}: {exc}") from exc
            if latest is not self._latest:  # something changed
                self._latest = latest
                scanned, self._scanned = self._scanned, trio.Event()
                scanned.set()
            return latest

    async def _poll(self) -> None:
        """Every ``poll_interval`` while watched, one scan for all; failures logged once each."""
        failure: str | None = None
        while True:
            if not self._watches:
                await self._watch_opened.wait()
            await trio.sleep(self._poll_interval)
            try:
                await self._scan()
            except Exception as exc:  # a live cancellation is not an Exception
                told = isinstance(exc, DiscoveryError)  # an unexpected one gets its traceback
                if (problem := str(exc) if told else repr(exc)) != failure:  # once, not per poll
                    logger.warning("discovery: %s", problem, exc_info=None if told else exc)
                failure = problem
                continue
            if failure is not None:
                logger.info("discovery: scan of %s works again", self._layout.root)
                failure = None

    async def _forward(
        self, prefix: str, seen: dict[str, bytes], send_channel: trio.MemorySendChannel[WatchEvent]
    ) -> None:
        """Turn the scans' changes under ``prefix`` since ``seen`` into one watch's events."""
        state = _under(seen, prefix)
        async with send_channel:
            while True:
                while seen is self._latest:
                    await self._scanned.wait()
                seen = self._latest
                old, state = state, _under(seen, prefix)
                for event in diff_events(old, state):
                    await send_channel.send(event)

    @asynccontextmanager
    async def _lifetime(self) -> AsyncIterator[None]:
        try:
            await trio.to_thread.run_sync(self._layout.create_lease, self._lease_id, self._ttl)
        except OSError as exc:
            raise DiscoveryError(f"cannot use {self._layout.root} for discovery: {exc}") from exc
        self._touched_at = trio.current_time()
        async with self._run_while_open(self._keepalive, self._poll):
            yield

    async def _keepalive(self) -> None:
        """Every ttl/3, :meth:`_restore` the lease and the owned entries; failures logged once."""
        while True:
            # Due after the last refresh, so a stalled loop refreshes as soon as it resumes.
            await trio.sleep_until(self._touched_at + self._ttl / 3)
            async with self._lock:
                if self._closed:
                    return
                self._touched_at = trio.current_time()
                problem = None
                try:
                    await self._restore()
                except OSError as exc:
                    problem = f"cannot keep lease {self._lease_id:016x} and its keys: {exc}"
                if problem is None and self._last_problem is not None:
                    logger.info("discovery: lease %016x and its keys are back", self._lease_id)
                elif problem != self._last_problem:  # each failure once, not every tick
                    logger.warning("discovery: %s", problem)
                self._last_problem = problem

    async def _restore(self) -> None:
        """Touch the lease file (recreating it and every entry if lost), else write back the
        owned entries the directory lost (rule 5; lock held)."""
        if recovered := await trio.to_thread.run_sync(self._refresh_lease, dict(self._owned)):
            self._written = recovered
            return
        async with self._scan_lock:  # the scanner judges the other leases
            found, signatures, alive = await trio.to_thread.run_sync(
                self._scanner.audit, dict(self._owned), dict(self._written), self._lease_id
            )
        self._written.update(signatures)
        repairs = self._repair(found, alive.__contains__)
        for key in repairs.relinquish:
            self._written.pop(key, None)
        for key in repairs.rewrite:
            self._written.pop(key, None)
            self._written[key] = await trio.to_thread.run_sync(
                self._layout.write_entry, key, self._owned[key], self._lease_id
            )

    async def _revoke_lease(self) -> None:
        self._written.clear()
        try:
            await trio.to_thread.run_sync(self._layout.revoke, self._lease_id, list(self._owned))
        except OSError as exc:
            logger.warning("discovery: cannot revoke lease %016x: %s", self._lease_id, exc)


def _under(entries: dict[str, bytes], prefix: str) -> dict[str, bytes]:
    return {key: value for key, value in entries.items() if key.startswith(prefix)}
