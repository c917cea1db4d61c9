"""A SIGKILLed worker's keys vanish when its lease expires (real processes, file and etcd)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import trio

from dynamo_trio import DiscoveryConfig
from dynamo_trio.discovery import WatchEvent, open_discovery

from ._util import next_event

if TYPE_CHECKING:
    from trio.abc import ReceiveStream

CHILD = Path(__file__).with_name("_crash_child.py")
HANG_GUARD = 60.0
"""Seconds past the TTL after which a test is stopped as hung (not a bound on speed)."""


async def _read_line(stream: ReceiveStream) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = await stream.receive_some(1024)
        if not chunk:
            break
        data += chunk
    return data


async def _crash_and_watch(config: DiscoveryConfig, key: str) -> None:
    """Start a child that registers ``key``, SIGKILL it, and see its key deleted: by the
    lease's expiry, since a killed child deletes nothing."""
    args = [
        sys.executable,
        str(CHILD),
        config.backend,
        str(config.file_kv),
        ",".join(config.etcd_endpoints),
        str(config.lease_ttl),
        key,
    ]
    async with open_discovery(config) as reader, reader.watch_prefix(key) as watch:
        process = await trio.lowlevel.open_process(args, stdout=subprocess.PIPE)
        try:
            assert process.stdout is not None
            with trio.fail_after(HANG_GUARD):
                assert await _read_line(process.stdout) == b"ready\n"
                if key not in watch.initial:
                    event = await watch.__anext__()
                    assert (event.kind, event.key) == ("put", key)
            process.send_signal(signal.SIGKILL)
            await process.wait()
            event = await next_event(watch, within=config.lease_ttl + HANG_GUARD)
            assert event == WatchEvent("delete", key, None)
            assert await reader.get_prefix(key) == {}
        finally:
            process.kill()
            with trio.CancelScope(shield=True):
                await process.wait()
                if process.stdout is not None:
                    await process.stdout.aclose()


async def test_file_worker_killed_loses_its_keys(tmp_path: Path) -> None:
    config = DiscoveryConfig(
        backend="file", file_kv=tmp_path / "kv", lease_ttl=1.0, poll_interval=0.05
    )
    await _crash_and_watch(config, "crash/file/worker")
    assert list((tmp_path / "kv" / "kv").iterdir()) == [], "the dead entry was not collected"


@pytest.mark.etcd
async def test_etcd_worker_killed_loses_its_keys(
    etcd_endpoints: tuple[str, ...], prefix: str
) -> None:
    # 2 s is etcd's minimum TTL with default election settings.
    config = DiscoveryConfig(backend="etcd", etcd_endpoints=etcd_endpoints, lease_ttl=2.0)
    await _crash_and_watch(config, prefix + "worker")
