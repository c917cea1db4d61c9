"""The discovery contract: a key-value store where each process holds one lease
(docs/discovery.md, "The contract")."""

from __future__ import annotations

import abc
import logging
import secrets
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Final, NamedTuple, final

import trio

from .._startup import CannotServe

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
    from contextlib import AbstractAsyncContextManager
    from typing import Any, Self

    from ._watch import Watch

CLOSE_TIMEOUT: Final = 5.0
"""Seconds a backend may spend revoking its lease on exit before giving up."""

NAMED_PER_BATCH: Final = 10
"""Bad records named individually per batch; the rest are counted."""

logger = logging.getLogger("dynamo_trio.discovery")


class DiscoveryError(CannotServe):
    """The backend is unreachable, refused the request, or is closed (corrupt data read is
    logged and skipped, never raised)."""


@final
class BadRecordReport:
    """Names up to :data:`NAMED_PER_BATCH` bad records per batch (a scan, a burst of watch
    events), then counts ``what``: each is reported once per version by readers that cache."""

    def __init__(self, logger: logging.Logger, what: str) -> None:
        self._logger, self._what = logger, what
        self._named = self._more = 0

    def bad(self, where: str, reason: str) -> None:
        """Report one bad record: ``where`` it is and why it was skipped."""
        if self._named < NAMED_PER_BATCH:
            self._named += 1
            self._logger.warning("discovery: skipping %s: %s", where, reason)
        else:
            self._more += 1

    def end_batch(self) -> None:
        """Log the summary of the records not named, and start a new batch."""
        if self._more:
            self._logger.warning(
                "discovery: skipping %d more %s (each is reported once, until it changes)",
                self._more,
                self._what,
            )
        self._named = self._more = 0


def check_key(key: str) -> None:
    """Check that ``key`` (or a prefix) is a ``str`` without NUL that encodes as UTF-8."""
    if not isinstance(key, str):
        raise TypeError(f"discovery keys are str, not {type(key).__name__}")
    if "\0" in key:
        raise ValueError(f"discovery key contains a NUL character: {key!r}")
    try:
        key.encode()
    except UnicodeEncodeError:
        raise ValueError(f"discovery key is not valid UTF-8: {key!r}") from None


def check_value(value: bytes, max_size: int | None = None) -> bytes:
    """Return ``value`` as ``bytes``; TypeError if not bytes-like, ValueError if too long."""
    if not isinstance(value, bytes | bytearray | memoryview):
        raise TypeError(f"discovery values are bytes, not {type(value).__name__}")
    value = bytes(value)
    if max_size is not None and len(value) > max_size:
        raise ValueError(
            f"a discovery value of {len(value)} bytes is more than "
            f"DYN_DISCOVERY_MAX_RECORD_SIZE ({max_size})"
        )
    return value


class Repairs(NamedTuple):
    """Owned keys to write back (lost or changed) and to forget (another live lease took them)."""

    rewrite: tuple[str, ...] = ()
    relinquish: tuple[str, ...] = ()


def plan_repairs(
    owned: Mapping[str, bytes],
    lease_id: int,
    found: Mapping[str, tuple[bytes, int]],
    lease_alive: Callable[[int], bool] = lambda lease: True,
) -> Repairs:
    """Compare what an owner wrote with what the store holds (``{key: (value, lease)}``).

    A key found under another live lease was overwritten by its holder and is
    given up; one under a dead lease (a stale file copied back) is rewritten.
    """
    rewrite: list[str] = []
    relinquish: list[str] = []
    for key, value in owned.items():
        stored, lease = found.get(key, (None, lease_id))
        if lease != lease_id and lease_alive(lease):
            relinquish.append(key)
        elif lease != lease_id or stored != value:
            rewrite.append(key)
    return Repairs(tuple(rewrite), tuple(relinquish))


def random_lease_id() -> int:
    """A random positive 63-bit lease id (for backends without a lease server)."""
    return secrets.randbelow(2**63 - 1) + 1


class Discovery(abc.ABC):
    """A key-value store where this process holds one lease (docs/discovery.md has the contract).

    Operations are valid inside ``async with``, until :meth:`aclose`; a
    cancelled ``put`` or ``delete`` may or may not have taken effect.
    """

    def __init__(self, max_record_size: int | None = None) -> None:
        self._started = self._closed = False
        self._lifetime_cm: AbstractAsyncContextManager[None] | None = None
        self._lease_id = 0  # set by the backend, at construction or (etcd) on entry
        self._owned: dict[str, bytes] = {}  # what this owner put: written back if lost
        self._lock = trio.Lock()  # put/delete against lease recovery and revocation
        self._max_record_size = max_record_size

    @property
    def lease_id(self) -> int:
        """This instance's positive 63-bit id; it never changes (:class:`DiscoveryError` if the
        backend has none yet: etcd's is granted on entry)."""
        if not self._lease_id:
            raise DiscoveryError(f"{type(self).__name__} has no lease before it is started")
        return self._lease_id

    async def put(self, key: str, value: bytes) -> None:
        """Set ``key`` to ``value``, attached to this instance's lease."""
        check_key(key)
        value = check_value(value, self._max_record_size)
        self._check_open()
        async with self._lock:
            self._check_open()
            # Recorded first: recovery rewrites an interrupted write rather than forget it.
            previous = self._owned.get(key)
            self._owned[key] = value
            try:
                await self._put(key, value)
            except Exception:
                self._owned.pop(key, None)
                if previous is not None:
                    self._owned[key] = previous
                raise

    async def delete(self, key: str) -> None:
        """Remove ``key`` whatever its lease; another live owner writes it back within its TTL."""
        check_key(key)
        self._check_open()
        async with self._lock:
            self._check_open()
            self._owned.pop(key, None)
            await self._delete(key)

    @abc.abstractmethod
    async def _put(self, key: str, value: bytes) -> None:
        """Store ``key`` under the lease (lock held, ``key`` already owned)."""

    @abc.abstractmethod
    async def _delete(self, key: str) -> None:
        """Remove ``key`` from the store (lock held, ``key`` no longer owned)."""

    @abc.abstractmethod
    async def get_prefix(self, prefix: str) -> dict[str, bytes]:
        """Every live key starting with ``prefix``, with its value."""

    @abc.abstractmethod
    def watch_prefix(self, prefix: str) -> AbstractAsyncContextManager[Watch]:
        """A :class:`Watch` of the keys under ``prefix``: ``initial``, then every change.

        Leaving the context releases what the watch holds (tasks, connections, threads).
        """

    @abc.abstractmethod
    def _lifetime(self) -> AbstractAsyncContextManager[None]:
        """Acquire the lease, keep it alive in an owned nursery, and :meth:`aclose` on exit."""

    @abc.abstractmethod
    async def _revoke_lease(self) -> None:
        """Drop the lease and every key attached to it (called once, by :meth:`aclose`, lock
        held; the owned keys are forgotten after it)."""

    @asynccontextmanager
    async def _run_while_open(self, *tasks: Callable[[], Awaitable[None]]) -> AsyncIterator[None]:
        """Run ``tasks`` in an owned nursery while the context lasts, then :meth:`aclose`."""
        try:
            async with trio.open_nursery() as nursery:
                for task in tasks:
                    nursery.start_soon(task)
                try:
                    yield
                finally:
                    nursery.cancel_scope.cancel(reason="discovery closing")
        finally:
            with trio.move_on_after(CLOSE_TIMEOUT, shield=True):
                await self.aclose()

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` was called (the lease is gone)."""
        return self._closed

    async def aclose(self) -> None:
        """Revoke the lease (idempotent): this instance's keys vanish for every reader at once.

        Open watches keep working until left; other operations raise :class:`DiscoveryError`.
        """
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        async with self._lock:
            await self._revoke_lease()
            self._owned.clear()

    def _repair(
        self,
        found: Mapping[str, tuple[bytes, int]],
        lease_alive: Callable[[int], bool] = lambda lease: True,
    ) -> Repairs:
        """:func:`plan_repairs` for the owned keys, logged; the relinquished keys are forgotten."""
        repairs = plan_repairs(self._owned, self._lease_id, found, lease_alive)
        if rewrite := repairs.rewrite:
            logger.warning(
                "discovery: %d key(s) of lease %x were lost from the store; writing them back: %s",
                len(rewrite),
                self._lease_id,
                ", ".join(repr(key) for key in rewrite[:5]) + (" ..." if len(rewrite) > 5 else ""),
            )
        for key in repairs.relinquish:
            logger.info("discovery: %r was overwritten by another instance; no longer ours", key)
            del self._owned[key]
        return repairs

    def _check_open(self) -> None:
        if self._closed:
            raise DiscoveryError(f"{type(self).__name__} is closed")
        if not self._started:
            raise DiscoveryError(f"{type(self).__name__} is not started (use `async with`)")

    async def __aenter__(self) -> Self:
        if self._lifetime_cm is not None or self._closed:
            raise RuntimeError(f"a {type(self).__name__} can be entered only once")
        self._lifetime_cm = self._lifetime()
        await self._lifetime_cm.__aenter__()
        self._started = True
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        assert self._lifetime_cm is not None, "exited without entering"
        return await self._lifetime_cm.__aexit__(*exc_info)
