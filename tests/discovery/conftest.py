"""Fixtures for the discovery tests: a real etcd, and a factory for any backend.

etcd comes from ``ETCD_ENDPOINTS`` if set, else an ``etcd`` binary on PATH is
started on free loopback ports for the session.  With neither, etcd tests are
skipped, unless ``DYNAMO_REQUIRE_ETCD=1`` (set by CI), which makes them fail.
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

import pytest

from dynamo_trio import DiscoveryConfig
from dynamo_trio.discovery import Discovery, MemoryStore, open_discovery

from ._etcd_server import EtcdServer, etcd_binary
from ._faults import StoreFaults

if TYPE_CHECKING:
    from pathlib import Path

BACKENDS = ["mem", "file", pytest.param("etcd", marks=pytest.mark.etcd)]

OpenInstance = Callable[..., AbstractAsyncContextManager[Discovery]]


def _no_etcd(reason: str) -> None:
    if os.environ.get("DYNAMO_REQUIRE_ETCD") == "1":
        pytest.fail(f"DYNAMO_REQUIRE_ETCD=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def etcd_endpoints(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, ...]]:
    """Endpoints of a live etcd: ``ETCD_ENDPOINTS``, or one started for the session."""
    configured = os.environ.get("ETCD_ENDPOINTS", "").strip()
    if configured:
        yield tuple(
            (url if "://" in url else f"http://{url}").rstrip("/")
            for url in (part.strip() for part in configured.split(","))
            if url
        )
        return
    binary = etcd_binary()
    if binary is None:
        _no_etcd("no etcd: set ETCD_ENDPOINTS or put an etcd binary on PATH")
        return
    server = EtcdServer(binary, tmp_path_factory.mktemp("etcd"))
    server.start()
    try:
        yield (server.url,)
    finally:
        server.stop()


@pytest.fixture
def etcd_binary_path() -> str:
    """The etcd executable, for tests that run their own server."""
    binary = etcd_binary()
    if binary is None:
        if os.environ.get("ETCD_ENDPOINTS", "").strip():
            pytest.skip("this test restarts etcd: it needs an etcd binary, not ETCD_ENDPOINTS")
        _no_etcd("no etcd binary on PATH")
    assert binary is not None
    return binary


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Each backend in turn."""
    name: str = request.param
    return name


@pytest.fixture
def prefix() -> str:
    """A key prefix of this test's own (etcd is shared by the session)."""
    return f"test/{uuid.uuid4().hex[:12]}/"


@pytest.fixture
def discovery_config(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> DiscoveryConfig:
    """Settings for ``backend`` with short ttl and poll interval."""
    endpoints: tuple[str, ...] = ("http://127.0.0.1:1",)
    if backend == "etcd":
        endpoints = request.getfixturevalue("etcd_endpoints")
    return DiscoveryConfig(
        backend=backend,  # type: ignore[arg-type]
        file_kv=tmp_path / "kv",
        etcd_endpoints=endpoints,
        lease_ttl=2.0,
        poll_interval=0.02,
    )


@pytest.fixture
def memory_store() -> MemoryStore:
    """A store of this test's own for the ``mem`` backend."""
    return MemoryStore()


@pytest.fixture
def open_instance(discovery_config: DiscoveryConfig, memory_store: MemoryStore) -> OpenInstance:
    """``open_instance(**config_overrides)`` opens a Discovery of the parametrized backend.

    Instances opened by one test share a store (mem), directory (file) or
    cluster (etcd), so they see each other like processes would.
    """

    def factory(**overrides: Any) -> AbstractAsyncContextManager[Discovery]:
        config = dataclasses.replace(discovery_config, **overrides)
        return open_discovery(config, memory_store=memory_store)

    return factory


@pytest.fixture
def store_faults(
    backend: str, discovery_config: DiscoveryConfig, memory_store: MemoryStore
) -> StoreFaults:
    """Ways to make the parametrized backend's store lose keys behind their owner's back."""
    return StoreFaults(backend, discovery_config, memory_store)
