"""The discovery contract: a key-value store where each process holds one lease.

A :class:`Discovery` owns one lease for as long as its context lasts; every key
it puts is attached to it and written back if the store loses it while the
owner lives (docs/discovery.md, "The contract").
"""

from __future__ import annotations

import abc
import logging
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import trio

from ._watch import Watch, WatchEvent

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from contextlib import AbstractAsyncContextManager
    from types import TracebackType
    from typing import Self

__all__ = [
    "Discovery",
    "DiscoveryError",
    "Watch",
    "WatchEvent",
    "Repairs",
    "check_key",
    "check_value",
    "log_repairs",
    "plan_repairs",
    "random_lease_id",
]

CLOSE_TIMEOUT: Final = 5.0
"""Seconds a backend may spend revoking its lease on exit before giving up."""

logger = logging.getLogger("dynamo_trio.discovery")


class DiscoveryError(Exception):
    """The discovery backend failed: unreachable, refused the request, or closed.

    Raised at startup when the backend cannot be reached (e.g. no etcd endpoint
    answers), by operations on a closed :class:`Discovery`, and by operations
    the backend rejected.  Corrupt data found while reading is never raised:
    it is logged and skipped.
    """


def check_key(key: str) -> str:
    """Validate a key (or prefix, which may be empty) and return it.

    Keys are stored as UTF-8, so every backend sees the same bytes.

    Raises:
        TypeError: if ``key`` is not a ``str``.
        ValueError: if ``key`` contains a NUL character or cannot be encoded
            as UTF-8 (a lone surrogate).
    """
    if not isinstance(key, str):
        raise TypeError(f"discovery keys are str, not {type(key).__name__}")
    if "\0" in key:
        raise ValueError(f"discovery key contains a NUL character: {key!r}")
    try:
        key.encode()
    except UnicodeEncodeError:
        raise ValueError(f"discovery key is not valid UTF-8: {key!r}") from None
    return key


def check_value(value: bytes, max_size: int | None = None) -> bytes:
    """Validate a value and return it as immutable ``bytes``.

    Raises:
        TypeError: if ``value`` is not bytes-like.
        ValueError: if it is longer than ``max_size`` (``DYN_DISCOVERY_MAX_RECORD_SIZE``).
    """
    if not isinstance(value, bytes | bytearray | memoryview):
        raise TypeError(f"discovery values are bytes, not {type(value).__name__}")
    value = bytes(value)
    if max_size is not None and len(value) > max_size:
        raise ValueError(
            f"a discovery value of {len(value)} bytes is more than "
            f"DYN_DISCOVERY_MAX_RECORD_SIZE ({max_size})"
        )
    return value


@dataclass(frozen=True)
class Repairs:
    """What an owner must do to get its keys back into the store (see :func:`plan_repairs`).

    Attributes:
        rewrite: Owned keys the store lost (or holds with another value under
            the owner's own lease): write them back.
        relinquish: Owned keys another instance has overwritten since: they
            are that instance's now, forget them.
    """

    rewrite: tuple[str, ...] = ()
    relinquish: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.rewrite or self.relinquish)


def plan_repairs(
    owned: Mapping[str, bytes],
    lease_id: int,
    found: Mapping[str, tuple[bytes, int]],
    lease_alive: Callable[[int], bool] = lambda lease: True,
) -> Repairs:
    """Compare what an owner wrote with what the store holds.

    Args:
        owned: ``{key: value}`` the owner put and has not deleted.
        lease_id: The lease its keys must be attached to.
        found: ``{key: (value, lease)}`` for each owned key the store holds
            (absent keys are missing from it).
        lease_alive: Whether another lease is alive.  A key found under a
            live lease was overwritten by its holder and is given up; one
            under a dead lease (a stale file copied back) is rewritten.
    """
    rewrite: list[str] = []
    relinquish: list[str] = []
    for key, value in owned.items():
        stored = found.get(key)
        if stored is None:
            rewrite.append(key)
        elif stored[1] != lease_id:
            (relinquish if lease_alive(stored[1]) else rewrite).append(key)
        elif stored[0] != value:
            rewrite.append(key)
    return Repairs(tuple(rewrite), tuple(relinquish))


def log_repairs(repairs: Repairs, lease_id: int) -> None:
    """Say what an owner is about to repair (once per repair, never per check)."""
    if repairs.rewrite:
        logger.warning(
            "discovery: %d key(s) of lease %x were lost from the store; writing them back: %s",
            len(repairs.rewrite),
            lease_id,
            ", ".join(repr(key) for key in repairs.rewrite[:5])
            + (" ..." if len(repairs.rewrite) > 5 else ""),
        )
    for key in repairs.relinquish:
        logger.info("discovery: %r was overwritten by another instance; no longer ours", key)


def random_lease_id() -> int:
    """A random positive 63-bit lease id (for backends without a lease server)."""
    while True:
        lease_id = secrets.randbits(63)
        if lease_id:
            return lease_id


class Discovery(abc.ABC):
    """A key-value store where this process holds one lease (docs/discovery.md has the contract).

    Use as an async context manager; the operations below are valid inside the
    context, until :meth:`aclose`.  Every operation can be cancelled; a
    cancelled ``put`` or ``delete`` may or may not have taken effect.
    """

    def __init__(self) -> None:
        self._started = False
        self._closed = False
        self._lifetime_cm: AbstractAsyncContextManager[None] | None = None

    # -- the contract ---------------------------------------------------------

    @property
    @abc.abstractmethod
    def lease_id(self) -> int:
        """A positive 63-bit integer unique to this instance (the runtime's instance id).

        It never changes, even when a backend has to re-acquire a lost lease.
        The mem and file backends choose it at construction; etcd grants it
        when the context is entered, and raises :class:`DiscoveryError` if
        asked earlier.
        """

    @abc.abstractmethod
    async def put(self, key: str, value: bytes) -> None:
        """Set ``key`` to ``value``, attached to this instance's lease.

        Raises:
            DiscoveryError: if the discovery is closed or the backend failed.
            ValueError: if the key is invalid.
        """

    @abc.abstractmethod
    async def delete(self, key: str) -> None:
        """Remove ``key`` (whichever lease it is attached to); absent keys are fine.

        The caller gives the key up if it owned it.  A key owned by another
        live instance is written back by that owner within its lease TTL.

        Raises:
            DiscoveryError: if the discovery is closed or the backend failed.
        """

    @abc.abstractmethod
    async def get_prefix(self, prefix: str) -> dict[str, bytes]:
        """Every live key starting with ``prefix``, with its value.

        Raises:
            DiscoveryError: if the discovery is closed or the backend failed.
        """

    @abc.abstractmethod
    def watch_prefix(self, prefix: str) -> AbstractAsyncContextManager[Watch]:
        """Watch the keys starting with ``prefix``.

        ``async with discovery.watch_prefix(p) as watch:`` gives a
        :class:`~dynamo_trio.discovery.Watch` whose ``initial`` is the state
        when the watch started and which iterates over every change after it.
        Leaving the context stops the watch and releases what it holds (tasks,
        connections, threads).

        Raises:
            DiscoveryError: on entry, if the discovery is closed or the
                backend failed to take the initial snapshot.
        """

    @abc.abstractmethod
    def _lifetime(self) -> AbstractAsyncContextManager[None]:
        """Acquire the lease, keep it alive while the context lasts, revoke it on exit.

        Implementations run their keepalive task in a nursery they own and
        call :meth:`aclose` (shielded, bounded by :data:`CLOSE_TIMEOUT`) on
        exit.

        Raises:
            DiscoveryError: on entry, if the lease cannot be acquired.
        """

    @abc.abstractmethod
    async def _revoke_lease(self) -> None:
        """Drop the lease and every key attached to it (called once, by :meth:`aclose`)."""

    # -- lifecycle ------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` was called (the lease is gone)."""
        return self._closed

    async def aclose(self) -> None:
        """Revoke the lease: this instance's keys vanish for every reader at once.

        Idempotent.  Watches opened through this instance keep working until
        their own contexts are left; every other operation raises
        :class:`DiscoveryError` afterwards.  Leaving the ``async with`` block
        calls this too.
        """
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        await self._revoke_lease()

    def _check_open(self) -> None:
        """Raise :class:`DiscoveryError` unless the context is entered and not closed."""
        if self._closed:
            raise DiscoveryError(f"{type(self).__name__} is closed")
        if not self._started:
            raise DiscoveryError(f"{type(self).__name__} is not started (use `async with`)")

    async def __aenter__(self) -> Self:
        if self._lifetime_cm is not None or self._closed:
            raise RuntimeError(f"a {type(self).__name__} can be entered only once")
        lifetime = self._lifetime()
        self._lifetime_cm = lifetime
        await lifetime.__aenter__()
        self._started = True
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        lifetime = self._lifetime_cm
        if lifetime is None:
            raise RuntimeError(f"{type(self).__name__} was not entered")
        return await lifetime.__aexit__(exc_type, exc_value, traceback)
