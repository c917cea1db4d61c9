"""Choosing and running a backend from the configuration."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from ._file import FileDiscovery
from ._memory import MemoryDiscovery

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from .._config import DiscoveryConfig
    from ._base import Discovery
    from ._memory import MemoryStore


def make_discovery(
    config: DiscoveryConfig, *, memory_store: MemoryStore | None = None
) -> Discovery:
    """Build (not start) the backend named by ``config.backend`` (``mem`` uses ``memory_store``)."""
    match config.backend:
        case "mem":
            return MemoryDiscovery(
                memory_store, lease_ttl=config.lease_ttl, max_record_size=config.max_record_size
            )
        case "file":
            return FileDiscovery(config)
        case "etcd":
            # Imported here: httpx is only needed by processes that use etcd.
            from ._etcd import EtcdDiscovery

            return EtcdDiscovery(config)
        case other:
            raise ValueError(f"unknown discovery backend {other!r} (mem, file or etcd)")


@asynccontextmanager
async def open_discovery(
    config: DiscoveryConfig, *, memory_store: MemoryStore | None = None
) -> AsyncIterator[Discovery]:
    """Hold a lease in the backend named by ``config.backend`` while the context lasts."""
    async with make_discovery(config, memory_store=memory_store) as discovery:
        yield discovery
