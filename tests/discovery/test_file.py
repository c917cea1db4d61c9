"""What only the file backend does: names on disk, liveness, garbage, collection."""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING
from urllib.parse import unquote

import pytest
import trio
from hypothesis import given, strategies as st

from dynamo_trio import DiscoveryConfig
from dynamo_trio.discovery import DiscoveryError, FileDiscovery, open_discovery
from dynamo_trio.discovery._file_store import (
    FileLayout,
    Scanner,
    _discard_if_unchanged,
    _signature,
    key_to_name,
)

from ._util import STEP

if TYPE_CHECKING:
    from pathlib import Path


def file_config(root: Path, ttl: float = 2.0) -> DiscoveryConfig:
    return DiscoveryConfig(backend="file", file_kv=root, lease_ttl=ttl, poll_interval=0.02)


def age(path: Path, seconds: float) -> None:
    """Make ``path`` look ``seconds`` old."""
    then = time.time() - seconds
    os.utime(path, (then, then))


@given(st.text(min_size=1, max_size=60))
def test_file_names_stay_inside_the_directory(key: str) -> None:
    name = key_to_name(key)
    assert "/" not in name
    assert "\0" not in name
    assert not name.startswith((".", "~")), "reserved for temporary and hashed names"
    assert unquote(name) == key, "the mapping must be one-to-one"


def test_file_names_preserve_prefixes() -> None:
    assert key_to_name("..") == "%2E."
    assert key_to_name("v1/instances/ns/") == "v1%2Finstances%2Fns%2F"
    key = "v1/instances/ns/comp/ep/1f"
    assert key_to_name(key).startswith(key_to_name("v1/instances/ns/"))


async def test_the_directory_is_created(tmp_path: Path) -> None:
    root = tmp_path / "deep" / "er"
    async with open_discovery(file_config(root)) as d:
        await d.put("k", b"v")
    assert (root / "kv").is_dir()
    assert (root / "leases").is_dir()


async def test_an_unusable_directory_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    with pytest.raises(DiscoveryError, match="cannot use"):
        async with open_discovery(file_config(tmp_path / "a-file" / "kv")):
            pytest.fail("should not start")


async def test_corrupt_files_are_skipped_and_logged_once_per_version(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="dynamo_trio.discovery")
    async with open_discovery(file_config(tmp_path)) as d:
        await d.put("p/good", b"1")
        kv = tmp_path / "kv"
        (kv / key_to_name("p/garbage")).write_bytes(b"\x00\x01 not json")
        (kv / key_to_name("p/empty")).write_bytes(b"")
        (kv / key_to_name("p/half")).write_bytes(b'{"key": "p/half", "lease": 1, "val')
        # a valid entry copied under another key's name
        (kv / key_to_name("p/moved")).write_bytes((kv / key_to_name("p/good")).read_bytes())
        async with d.watch_prefix("p/") as watch:
            assert watch.initial == {"p/good": b"1"}
            await trio.sleep(0.2)  # about ten polls
        assert await d.get_prefix("p/") == {"p/good": b"1"}
    corrupt = [
        r
        for r in caplog.records
        if "not a discovery entry" in r.getMessage() and "holds key" not in r.getMessage()
    ]
    # once by the process (its watches and get_prefix share one scanner), not per poll
    assert len(corrupt) == 3
    assert any("holds key 'p/good'" in r.getMessage() for r in caplog.records)


async def test_entries_of_a_stale_or_missing_lease_are_absent_and_collected(
    tmp_path: Path,
) -> None:
    layout = FileLayout(tmp_path)
    layout.create_lease(111, ttl=1.0)
    layout.write_entry("p/stale", b"x", 111)
    age(layout.lease_path(111), 5)
    layout.write_entry("p/orphan", b"x", 222)  # no lease file at all
    async with open_discovery(file_config(tmp_path)) as d:
        await d.put("p/live", b"1")
        assert await d.get_prefix("p/") == {"p/live": b"1"}
    assert not layout.lease_path(111).exists()
    assert sorted(os.listdir(tmp_path / "kv")) == []


async def test_a_live_lease_uses_its_own_ttl(tmp_path: Path) -> None:
    layout = FileLayout(tmp_path)
    layout.create_lease(333, ttl=60.0)
    layout.write_entry("p/patient", b"x", 333)
    age(layout.lease_path(333), 5)  # stale for a 2 s reader, fine for its 60 s owner
    async with open_discovery(file_config(tmp_path, ttl=2.0)) as d:
        assert await d.get_prefix("p/") == {"p/patient": b"x"}


async def test_a_corrupt_lease_file_gets_the_readers_ttl(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    layout = FileLayout(tmp_path)
    layout.ensure()
    layout.lease_path(444).write_bytes(b"garbage")
    layout.write_entry("p/k", b"x", 444)
    async with open_discovery(file_config(tmp_path, ttl=2.0)) as d:
        assert await d.get_prefix("p/") == {"p/k": b"x"}
        age(layout.lease_path(444), 3)
        assert await d.get_prefix("p/") == {}
    assert "corrupt lease file" in caplog.text


async def test_a_collected_lease_is_recreated_with_its_keys(tmp_path: Path) -> None:
    """An owner paused past its TTL finds its lease collected and re-registers.

    A reader's watch sees the key go and come back; or, when the owner re-registers
    before the reader's next poll (this backend polls: a slow host made it happen in
    CI), nothing at all, or only the put.  Never anything else.
    """
    config = file_config(tmp_path, ttl=0.6)
    async with open_discovery(config) as owner, open_discovery(config) as reader:
        await owner.put("p/a", b"1")
        async with reader.watch_prefix("p/") as watch:
            layout = FileLayout(tmp_path)
            layout.remove_lease(owner.lease_id)
            layout.delete_entry("p/a")
            with trio.fail_after(STEP):
                # Bounded; polls the files the owner's keepalive task writes.
                while not layout.lease_path(owner.lease_id).exists():  # noqa: ASYNC110
                    await trio.sleep(0.02)
                while await reader.get_prefix("p/") != {"p/a": b"1"}:  # noqa: ASYNC110
                    await trio.sleep(0.02)
            seen = []
            with trio.move_on_after(1.0):  # several polls: whatever the watch saw arrives
                async for event in watch:
                    seen.append((event.kind, event.key, event.value))
    put = ("put", "p/a", b"1")
    assert seen in ([("delete", "p/a", None), put], [put], []), seen


async def test_abandoned_temporary_files_are_removed(tmp_path: Path) -> None:
    layout = FileLayout(tmp_path)
    layout.ensure()
    old = tmp_path / "kv" / ".tmp-crashed"
    old.write_bytes(b"half")
    age(old, 3600)
    fresh = tmp_path / "kv" / ".tmp-in-flight"
    fresh.write_bytes(b"half")
    async with open_discovery(file_config(tmp_path)) as d:
        assert await d.get_prefix("") == {}
    assert not old.exists()
    assert fresh.exists()


def test_collection_never_removes_a_newer_write(tmp_path: Path) -> None:
    layout = FileLayout(tmp_path)
    layout.write_entry("k", b"old", 1)
    path = tmp_path / "kv" / key_to_name("k")
    judged = _signature(os.stat(path))
    layout.write_entry("k", b"new", 2)  # a live owner rewrote it after it was judged
    assert not _discard_if_unchanged(path, judged)
    assert b'"lease":2' in path.read_bytes()
    assert sorted(os.listdir(tmp_path / "kv")) == [key_to_name("k")]
    assert _discard_if_unchanged(path, _signature(os.stat(path)))
    assert not path.exists()


def test_long_keys_are_hashed_and_still_found(tmp_path: Path) -> None:
    layout = FileLayout(tmp_path)
    layout.create_lease(5, ttl=60.0)
    long_key = "p/" + "ы" * 200
    layout.write_entry(long_key, b"v", 5)
    (name,) = os.listdir(tmp_path / "kv")
    assert name.startswith("~")
    scanner = Scanner(layout, default_ttl=1.0)
    assert scanner.scan() == {long_key: b"v"}


async def test_puts_are_attached_to_the_lease_file(tmp_path: Path) -> None:
    discovery = FileDiscovery(file_config(tmp_path))
    async with discovery:
        assert FileLayout(tmp_path).lease_path(discovery.lease_id).exists()
    assert not FileLayout(tmp_path).lease_path(discovery.lease_id).exists()


async def test_an_owner_whose_loop_stalled_registers_under_a_fresh_lease(tmp_path: Path) -> None:
    """A worker's event loop blocked past its TTL right after start (a slow import on a
    loaded machine) must not write its registrations under a lease that readers already
    judge expired: they would collect them at once."""
    config = file_config(tmp_path, ttl=0.6)
    async with open_discovery(config) as owner, open_discovery(config) as reader:
        time.sleep(1.0)  # noqa: ASYNC251 - the stall itself: no task runs meanwhile
        await owner.put("p/k", b"v")
        assert await reader.get_prefix("p/") == {"p/k": b"v"}
        layout = FileLayout(tmp_path)
        assert layout.lease_path(owner.lease_id).exists()
