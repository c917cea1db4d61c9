"""Following an etcd prefix without missing or repeating a change, across broken streams.

A watch follows revisions, resumes from the first one it has not seen, and
resynchronises from a fresh read after a compaction or a replaced cluster; its
reader and deliverer are separate tasks because of how httpx's streams close
(docs/discovery.md, "Watches").
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING, Final, final

import httpx
import msgspec
import trio

from ._base import DiscoveryError
from ._etcd_gateway import WatchMessage, decode_key
from ._watch import WatchEvent, diff_events

if TYPE_CHECKING:
    from ._etcd_gateway import EtcdGateway, WatchResult

logger = logging.getLogger(__name__)

_MIN_BACKOFF: Final = 0.05
_MAX_BACKOFF: Final = 2.0
_MAX_PENDING: Final = 10_000
"""Events queued for a slow consumer before they are coalesced into a state difference."""

_watch_decoder: Final = msgspec.json.Decoder(WatchMessage, strict=False)


@final
class WatchPump:
    """Feeds every change under ``prefix`` from ``next_revision`` on into ``send_channel``.

    ``state`` is the prefix at ``next_revision - 1`` (the consumer's ``Watch.initial``).
    """

    def __init__(
        self,
        gateway: EtcdGateway,
        prefix: str,
        state: dict[str, bytes],
        next_revision: int,
        send_channel: trio.MemorySendChannel[WatchEvent],
    ) -> None:
        self._gateway = gateway
        self._prefix = prefix
        self._send_channel = send_channel
        self.next_revision = next_revision
        # reader side
        self._latest = dict(state)
        self._stop_reason = ""
        self._must_resync = False
        self._progress = False
        # between the two tasks
        self._queue: deque[WatchEvent] = deque()
        self._overflowed = False
        self._wakeup = trio.Event()
        # deliverer side
        self._delivered = dict(state)

    async def run(self) -> None:
        """Follow the prefix until cancelled (never returns otherwise)."""
        async with self._send_channel, trio.open_nursery() as nursery:
            nursery.start_soon(self._deliver)
            await self._read()

    async def _read(self) -> None:
        backoff = _MIN_BACKOFF
        while True:
            self._progress = False
            try:
                await self._follow()
            except DiscoveryError as exc:
                logger.warning(
                    "discovery: watch of %r interrupted (%s); resuming from revision %d",
                    self._prefix,
                    exc,
                    self.next_revision,
                )
            if self._must_resync:
                try:
                    await self.resync()
                except DiscoveryError as exc:
                    logger.warning("discovery: resync of %r failed: %s", self._prefix, exc)
                else:
                    backoff = _MIN_BACKOFF
                    continue
            if self._progress:
                backoff = _MIN_BACKOFF
            await trio.sleep(backoff)
            backoff = min(backoff * 2, _MAX_BACKOFF)

    async def _follow(self) -> None:
        """Read one watch stream; it only ends by :class:`DiscoveryError` (saying why)."""
        broke: BaseException | None = None
        async with self._gateway.watch(self._prefix, self.next_revision) as (endpoint, lines):
            with trio.CancelScope() as own_scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._leave_when_abandoned, endpoint, own_scope)
                    try:
                        async for line in lines:
                            # No await and no raise in here (docs/discovery.md, "Watches").
                            if own_scope.cancel_called or not line.strip():
                                continue
                            result = self._result_of(line)
                            if isinstance(result, str):
                                self._stop_reason = result
                                own_scope.cancel(reason=result)
                            else:
                                self._progress = True
                                self._apply(result)
                    except (httpx.TransportError, httpx.StreamError) as exc:
                        broke = exc
                    nursery.cancel_scope.cancel()
            if broke is not None:
                raise DiscoveryError(f"stream broke: {type(broke).__name__}: {broke}") from broke
            if own_scope.cancel_called:  # dropped on purpose (maybe just as it ended)
                raise DiscoveryError(self._stop_reason)
        raise DiscoveryError("stream ended")

    async def _leave_when_abandoned(self, endpoint: str, own_scope: trio.CancelScope) -> None:
        """Drop the stream once the process's requests have failed over from its endpoint."""
        await self._gateway.wait_moved_from(endpoint)
        self._stop_reason = f"requests failed over from {endpoint} to {self._gateway.endpoint}"
        own_scope.cancel(reason=self._stop_reason)

    def _result_of(self, line: str) -> WatchResult | str:
        """The line's watch result, or why the stream must be dropped."""
        try:
            message = _watch_decoder.decode(line)
        except msgspec.DecodeError as exc:
            return f"etcd sent an unreadable watch message: {exc}"
        if message.error is not None:
            return f"etcd ended the watch: {message.error.message}"
        result = message.result
        if result is None:
            return "etcd sent a watch message without a result"
        if result.compact_revision:
            self._must_resync = True
            return f"history up to revision {result.compact_revision} was compacted"
        if result.created and 0 < result.header.revision < self.next_revision - 1:
            self._must_resync = True
            return (
                f"etcd's revision went back from {self.next_revision - 1} to "
                f"{result.header.revision} (a new cluster?)"
            )
        if result.canceled:
            return f"etcd cancelled the watch: {result.cancel_reason or '?'}"
        return result

    def _apply(self, result: WatchResult) -> None:
        # Compare with the cursor as it was before this response: all events
        # of one response may share a revision.
        floor = self.next_revision
        for event in result.events:
            revision = event.kv.mod_revision
            key = decode_key(event.kv.key)
            if key is None or revision < floor:
                continue
            if event.type == "DELETE":
                if self._latest.pop(key, None) is not None:
                    self._enqueue(WatchEvent("delete", key, None))
            else:
                self._latest[key] = event.kv.value
                self._enqueue(WatchEvent("put", key, event.kv.value))
            self.next_revision = max(self.next_revision, revision + 1)

    async def resync(self) -> None:
        """Read the prefix afresh and queue the differences from ``latest`` (step 4)."""
        fresh, revision = await self._gateway.range_prefix(self._prefix)
        self._must_resync = False
        for event in diff_events(self._latest, fresh):
            self._enqueue(event)
        self._latest = fresh
        self.next_revision = revision + 1

    def _enqueue(self, event: WatchEvent) -> None:
        if len(self._queue) >= _MAX_PENDING:
            if not self._overflowed:
                logger.warning(
                    "discovery: watcher of %r is %d events behind; coalescing",
                    self._prefix,
                    len(self._queue),
                )
            self._queue.clear()
            self._overflowed = True
        elif not self._overflowed:
            self._queue.append(event)
        self._wakeup.set()

    async def _deliver(self) -> None:
        while True:
            if self._overflowed:
                self._overflowed = False
                self._queue.clear()
                batch = diff_events(self._delivered, self._latest)
            elif self._queue:
                batch = [self._queue.popleft()]
            else:
                self._wakeup = trio.Event()
                await self._wakeup.wait()
                continue
            for event in batch:
                await self._send_channel.send(event)
                if event.value is None:
                    self._delivered.pop(event.key, None)
                else:
                    self._delivered[event.key] = event.value
