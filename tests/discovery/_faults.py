"""Losing keys behind their owner's back, the way each backend's store can lose them."""

from __future__ import annotations

import base64
import shutil
from typing import TYPE_CHECKING, Any, Final

import httpx
import trio

from dynamo_trio.discovery._etcd import prefix_range
from dynamo_trio.discovery._file_store import FileLayout, key_to_name, parse_entry
from tests._memhttp import TLS

if TYPE_CHECKING:
    from dynamo_trio import DiscoveryConfig
    from dynamo_trio.discovery import MemoryStore

__all__ = ["FAULTS", "StoreFaults"]

FAULTS: Final = ("deleted in the store", "lease revoked", "store wiped")


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


async def _etcd(endpoint: str, path: str, body: dict[str, Any]) -> None:
    async with httpx.AsyncClient(verify=TLS, trust_env=False) as client:
        response = await client.post(endpoint + path, json=body)
        response.raise_for_status()


class StoreFaults:
    """``await faults.inflict(fault, prefix, lease_id)`` for one backend's store."""

    def __init__(self, backend: str, config: DiscoveryConfig, memory_store: MemoryStore) -> None:
        self.backend = backend
        self._config = config
        self._memory = memory_store

    async def inflict(self, fault: str, prefix: str, lease_id: int) -> None:
        """Make the store lose the keys under ``prefix`` (and ``lease_id``, as ``fault`` says)."""
        match self.backend:
            case "mem":
                self._mem(fault, prefix, lease_id)
                await trio.lowlevel.checkpoint()
            case "file":
                await trio.to_thread.run_sync(self._file, fault, prefix, lease_id)
            case "etcd":
                await self._etcd(fault, prefix, lease_id)
            case other:
                raise AssertionError(other)

    def _mem(self, fault: str, prefix: str, lease_id: int) -> None:
        store = self._memory
        if fault in ("deleted in the store", "store wiped"):
            for key in store.snapshot(prefix):
                store.delete(key)
        if fault in ("lease revoked", "store wiped"):
            store.revoke(lease_id)

    def _file(self, fault: str, prefix: str, lease_id: int) -> None:
        layout = FileLayout(self._config.file_kv)
        match fault:
            case "deleted in the store":
                for key in _stored_keys(layout, prefix):
                    layout.delete_entry(key)
            case "lease revoked":
                layout.remove_lease(lease_id)  # as a reader collecting a stale lease does
            case "store wiped":
                shutil.rmtree(layout.kv_dir)
                shutil.rmtree(layout.lease_dir)

    async def _etcd(self, fault: str, prefix: str, lease_id: int) -> None:
        endpoint = self._config.etcd_endpoints[0]
        key, range_end = prefix_range(prefix)
        if fault in ("deleted in the store", "store wiped"):
            body = {"key": _b64(key), "range_end": _b64(range_end)}
            await _etcd(endpoint, "/v3/kv/deleterange", body)
        if fault in ("lease revoked", "store wiped"):
            await _etcd(endpoint, "/v3/lease/revoke", {"ID": str(lease_id)})


def _stored_keys(layout: FileLayout, prefix: str) -> list[str]:
    """The keys stored under ``prefix``, read straight from the entry files."""
    name_prefix = key_to_name(prefix)
    return [
        parse_entry(path.read_bytes()).key
        for path in sorted(layout.kv_dir.iterdir())
        if path.name.startswith(name_prefix)
    ]
