"""A worker that registers a key, says "ready", and waits to be SIGKILLed.

Usage: python _crash_child.py BACKEND FILE_KV ETCD_ENDPOINTS LEASE_TTL KEY
(ETCD_ENDPOINTS comma separated).
"""

from __future__ import annotations

import sys
from pathlib import Path

import trio

from dynamo_trio import DiscoveryConfig
from dynamo_trio.discovery import open_discovery


async def main(argv: list[str]) -> None:
    backend, file_kv, endpoints, ttl, key = argv
    config = DiscoveryConfig(
        backend=backend,  # type: ignore[arg-type]
        file_kv=Path(file_kv),
        etcd_endpoints=tuple(endpoints.split(",")),
        lease_ttl=float(ttl),
    )
    async with open_discovery(config) as discovery:
        await discovery.put(key, f"pid {discovery.lease_id}".encode())
        print("ready", flush=True)
        await trio.sleep_forever()


if __name__ == "__main__":
    trio.run(main, sys.argv[1:])
