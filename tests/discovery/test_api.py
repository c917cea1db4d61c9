"""The public surface of ``dynamo_trio.discovery`` and backend selection."""

from __future__ import annotations

from pathlib import Path

import pytest

import dynamo_trio.discovery as discovery
from dynamo_trio import DiscoveryConfig
from dynamo_trio.discovery import (
    EtcdDiscovery,
    FileDiscovery,
    MemoryDiscovery,
    MemoryStore,
    default_memory_store,
    make_discovery,
    open_discovery,
)


def test_all_lists_exactly_the_public_names() -> None:
    lazy = {"EtcdDiscovery"}  # loaded on first use (it brings httpx)
    public = {name for name in vars(discovery) if not name.startswith("_")} | lazy
    assert sorted(discovery.__all__) == discovery.__all__
    assert set(discovery.__all__) == public
    assert all(getattr(discovery, name) is not None for name in discovery.__all__)


@pytest.mark.parametrize(
    ("backend", "kind"),
    [("mem", MemoryDiscovery), ("file", FileDiscovery), ("etcd", EtcdDiscovery)],
)
def test_the_backend_is_chosen_by_the_config(backend: str, kind: type) -> None:
    config = DiscoveryConfig(backend=backend, file_kv=Path("/nonexistent"))  # type: ignore[arg-type]
    assert isinstance(make_discovery(config), kind)


def test_an_unknown_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown discovery backend"):
        make_discovery(DiscoveryConfig(backend="zookeeper"))  # type: ignore[arg-type]


async def test_mem_instances_share_the_default_store() -> None:
    assert default_memory_store() is default_memory_store()
    config = DiscoveryConfig(backend="mem")
    async with open_discovery(config) as a, open_discovery(config) as b:
        await a.put("api-test/k", b"v")
        assert await b.get_prefix("api-test/") == {"api-test/k": b"v"}
    assert default_memory_store().snapshot("api-test/") == {}


async def test_mem_stores_are_separate() -> None:
    config = DiscoveryConfig(backend="mem")
    async with (
        open_discovery(config, memory_store=MemoryStore()) as a,
        open_discovery(config, memory_store=MemoryStore()) as b,
    ):
        await a.put("k", b"v")
        assert await b.get_prefix("") == {}
