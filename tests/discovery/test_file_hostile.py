"""The file backend in a directory anyone can write to: nothing placed there blocks a reader,
each bad file is reported once, and an idle reader touches almost nothing."""

from __future__ import annotations

import errno
import logging
import os
import socket
import stat
import time
from typing import TYPE_CHECKING, Any

import pytest
import trio

from dynamo_trio import DiscoveryConfig
from dynamo_trio.discovery import _file_store as file_store, open_discovery
from dynamo_trio.discovery._file_store import FileLayout, Scanner, key_to_name

from ._util import STEP

if TYPE_CHECKING:
    from pathlib import Path

LIMIT = 4096


def file_config(root: Path, **overrides: Any) -> DiscoveryConfig:
    settings: dict[str, Any] = {
        "backend": "file",
        "file_kv": root,
        "lease_ttl": 2.0,
        "poll_interval": 0.02,
        "max_record_size": LIMIT,
    }
    settings.update(overrides)
    return DiscoveryConfig(**settings)


def skipped(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    """The warnings that named the file ``name`` as skipped."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING
        and r.getMessage().startswith("discovery: skipping")
        and r.getMessage().split(": ")[1].endswith("/" + name)
    ]


@pytest.fixture
def unopenable(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """Paths whose ``open`` fails with EACCES (root can open a mode-000 file, so fake it)."""
    paths: set[str] = set()
    real_open = os.open

    def fake_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if os.fspath(path) in paths:
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", fake_open)  # (the module the store calls)
    return paths


def make_hostile_files(root: Path, unopenable: set[str]) -> dict[str, str]:
    """Every kind of unusable file under the prefix ``p/``; returns {name: expected reason}."""
    layout = FileLayout(root)
    layout.ensure()
    kv = layout.kv_dir

    def path(key: str) -> Path:
        return kv / key_to_name(key)

    reasons = {}
    os.mkfifo(path("p/fifo"))
    reasons[key_to_name("p/fifo")] = "a FIFO"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(os.fspath(path("p/socket")))
    sock.close()
    reasons[key_to_name("p/socket")] = "a socket"
    path("p/directory").mkdir()
    reasons[key_to_name("p/directory")] = "a directory"
    os.symlink("/dev/zero", path("p/symlink"))
    reasons[key_to_name("p/symlink")] = "a symbolic link"
    with open(path("p/huge"), "wb") as f:
        f.truncate(1 << 30)  # sparse: a gigabyte that is never read
    reasons[key_to_name("p/huge")] = "more than the limit"
    path("p/undecodable").write_bytes(b"\xff\xfe\x00garbage")
    reasons[key_to_name("p/undecodable")] = "not a discovery entry"
    path("p/locked").write_bytes(b"{}")
    unopenable.add(os.fspath(path("p/locked")))
    reasons[key_to_name("p/locked")] = "cannot open it"
    try:
        os.mknod(path("p/device"), 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero
        reasons[key_to_name("p/device")] = "a device"
    except PermissionError:
        pass  # not root: the other kinds still run
    # The lease directory too: a FIFO where a referenced lease file should be.
    os.mkfifo(layout.lease_path(0xBAD))
    layout.write_entry("p/of-a-fifo-lease", b"x", 0xBAD)
    reasons[layout.lease_path(0xBAD).name] = "not a lease file"
    os.mkfifo(layout.lease_dir / f"{0xF1F0:016x}.lease")  # unreferenced: swept, not opened
    return reasons


async def test_unusable_files_never_block_and_are_reported_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, unopenable: set[str]
) -> None:
    caplog.set_level(logging.WARNING, logger="dynamo_trio.discovery")
    reasons = make_hostile_files(tmp_path, unopenable)
    async with open_discovery(file_config(tmp_path)) as d:
        await d.put("p/good", b"1")
        with trio.fail_after(STEP):  # a FIFO opened for reading would block here for good
            assert await d.get_prefix("p/") == {"p/good": b"1"}
            async with d.watch_prefix("p/") as watch:
                assert watch.initial == {"p/good": b"1"}
                await trio.sleep(0.3)  # about fifteen polls, and two owner checks
                await d.put("p/later", b"2")
                event = await watch.__anext__()
                assert (event.key, event.value) == ("p/later", b"2")
                await trio.sleep(0.1)
                # A bad file that changes is reported again, once.
                (tmp_path / "kv" / key_to_name("p/undecodable")).write_bytes(b"other garbage")
                await trio.sleep(0.3)
    for name, reason in reasons.items():
        messages = skipped(caplog, name)
        undecodable = name == key_to_name("p/undecodable")
        # once by the process (get_prefix and the watch share its scanner), and once
        # more after the change
        assert len(messages) == (2 if undecodable else 1), (name, messages)
        assert all(reason in message for message in messages), (name, messages)


async def test_a_flood_of_bad_files_is_summarised_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="dynamo_trio.discovery")
    FileLayout(tmp_path).ensure()
    for i in range(40):
        (tmp_path / "kv" / key_to_name(f"p/bad-{i:02d}")).write_bytes(b"garbage")
    async with open_discovery(file_config(tmp_path)) as d, d.watch_prefix("p/") as watch:
        assert watch.initial == {}
        await trio.sleep(0.3)
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(messages) == 11, messages
    assert "skipping 30 more unusable files" in messages[-1]


async def test_the_owner_replaces_whatever_took_its_entrys_place(tmp_path: Path) -> None:
    config = file_config(tmp_path)
    async with open_discovery(config) as owner, open_discovery(config) as reader:
        await owner.put("p/k", b"mine")
        path = tmp_path / "kv" / key_to_name("p/k")
        path.unlink()
        os.mkfifo(path)
        with trio.fail_after(STEP):
            while await reader.get_prefix("p/") != {"p/k": b"mine"}:  # noqa: ASYNC110
                await trio.sleep(0.02)
        assert stat.S_ISREG(os.lstat(path).st_mode)


async def test_records_over_the_size_limit_are_refused_at_put(tmp_path: Path) -> None:
    async with open_discovery(file_config(tmp_path)) as d:
        with pytest.raises(ValueError, match="DYN_DISCOVERY_MAX_RECORD_SIZE"):
            await d.put("p/big", b"x" * LIMIT)
        await d.put("p/small", b"x" * (LIMIT // 2))
        assert await d.get_prefix("p/") == {"p/small": b"x" * (LIMIT // 2)}


def test_the_size_limit_is_configurable() -> None:
    config = DiscoveryConfig()
    assert config.max_record_size == 1024 * 1024
    from dynamo_trio import Config

    env = {"DYN_DISCOVERY_MAX_RECORD_SIZE": "2048"}
    assert Config.from_env(env).discovery.max_record_size == 2048
    with pytest.raises(ValueError, match="DYN_DISCOVERY_MAX_RECORD_SIZE"):
        Config.from_env({"DYN_DISCOVERY_MAX_RECORD_SIZE": "0"})


# -- change detection ---------------------------------------------------------------


class Counting:
    """Counts the scanner's directory listings and file reads."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.listings = 0
        self.reads = 0
        real_scandir = Scanner._scandir
        real_read = file_store.read_regular_file

        def scandir(scanner: Scanner, directory: Path) -> list[os.DirEntry[str]]:
            self.listings += 1
            return real_scandir(scanner, directory)

        def read(*args: Any, **kwargs: Any) -> Any:
            self.reads += 1
            return real_read(*args, **kwargs)

        monkeypatch.setattr(Scanner, "_scandir", scandir)
        monkeypatch.setattr(file_store, "read_regular_file", read)

    def take(self) -> tuple[int, int]:
        counts = (self.listings, self.reads)
        self.listings = self.reads = 0
        return counts


def age(path: Path, seconds: float = 5.0) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_an_idle_scan_lists_and_reads_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = FileLayout(tmp_path)
    layout.create_lease(7, ttl=60.0)
    for i in range(50):
        layout.write_entry(f"p/{i:02d}", b"v", 7)
    (layout.kv_dir / key_to_name("p/bad")).write_bytes(b"garbage")
    age(layout.kv_dir)
    counting = Counting(monkeypatch)
    scanner = Scanner(layout, default_ttl=2.0, full_rescan=3600)
    first = scanner.scan()
    assert len(first) == 50
    # The first scan lists kv/ and leases/, and reads each file and the lease file.
    assert counting.take() == (2, 52)
    for _ in range(5):
        assert scanner.scan() is first, "nothing changed: the same state, not a copy"
    assert counting.take() == (0, 0)

    # A write moves kv/'s mtime: the next scan lists it and reads the one new file.
    layout.write_entry("p/new", b"n", 7)
    second = scanner.scan()
    assert second == {**first, "p/new": b"n"}
    assert counting.take() == (1, 1)
    # A lease that expires changes the state without any listing or read.
    age(layout.kv_dir)
    scanner.scan()  # lists once more (kv/ moved), and trusts that listing from now on
    assert scanner.scan() is scanner.scan()
    counting.take()
    age(layout.lease_path(7), 120)
    assert scanner.scan() == {}
    assert counting.take() == (0, 0)


def test_a_file_edited_in_place_is_seen_at_the_next_full_rescan(tmp_path: Path) -> None:
    layout = FileLayout(tmp_path)
    layout.create_lease(7, ttl=60.0)
    layout.write_entry("p/k", b"old", 7)
    age(layout.kv_dir)
    scanner = Scanner(layout, default_ttl=2.0, full_rescan=0.2)
    assert scanner.scan() == {"p/k": b"old"}
    path = layout.kv_dir / key_to_name("p/k")
    data = path.read_bytes()
    with open(path, "r+b") as f:  # not atomic, no rename: kv/'s mtime does not move
        f.write(layout.encode_entry("p/k", b"new", 7))
        f.truncate()
    assert len(data) == path.stat().st_size
    assert scanner.scan() == {"p/k": b"old"}, "the listing is trusted until the rescan"
    time.sleep(0.25)
    assert scanner.scan() == {"p/k": b"new"}


def test_a_recent_directory_mtime_is_not_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Written within the same timestamp tick, two versions of kv/ can share an mtime."""
    layout = FileLayout(tmp_path)
    layout.create_lease(7, ttl=60.0)
    layout.write_entry("p/a", b"1", 7)
    scanner = Scanner(layout, default_ttl=2.0, full_rescan=3600)
    assert scanner.scan() == {"p/a": b"1"}
    st = os.lstat(layout.kv_dir)
    layout.write_entry("p/b", b"2", 7)
    os.utime(layout.kv_dir, ns=(st.st_atime_ns, st.st_mtime_ns))  # the same tick
    assert scanner.scan() == {"p/a": b"1", "p/b": b"2"}


async def test_a_stale_copy_under_a_dead_lease_is_replaced_by_the_owner(tmp_path: Path) -> None:
    """An old entry file copied back over a live owner's (a backup restored, say) names a
    lease that is gone: the owner takes its key back rather than give it up."""
    config = file_config(tmp_path)
    async with open_discovery(config) as owner, open_discovery(config) as reader:
        await owner.put("p/k", b"mine")
        FileLayout(tmp_path).write_entry("p/k", b"stale", 0xDEAD)  # no such lease file
        with trio.fail_after(STEP):
            while await reader.get_prefix("p/") != {"p/k": b"mine"}:  # noqa: ASYNC110
                await trio.sleep(0.02)


async def test_one_poll_serves_every_watch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """However many prefixes are watched, the directory is scanned once per poll."""
    scans: list[None] = []
    scan = Scanner.scan

    def counted(self: Scanner) -> dict[str, bytes]:
        scans.append(None)
        return scan(self)

    monkeypatch.setattr(Scanner, "scan", counted)
    config = file_config(tmp_path, poll_interval=0.05)
    async with open_discovery(config) as d:
        await d.put("a/1", b"1")
        await d.put("b/1", b"1")
        async with (
            d.watch_prefix("a/") as a,
            d.watch_prefix("b/") as b,
            d.watch_prefix("c/") as c,
            d.watch_prefix("") as everything,
        ):
            assert a.initial == {"a/1": b"1"}
            assert b.initial == {"b/1": b"1"}
            assert c.initial == {}
            assert everything.initial == {"a/1": b"1", "b/1": b"1"}
            scans.clear()
            await trio.sleep(1.0)  # about twenty polls
            polls = len(scans)
            await d.put("b/2", b"2")
            event = await b.__anext__()
            assert (event.key, event.value) == ("b/2", b"2")
            event = await everything.__anext__()
            assert (event.key, event.value) == ("b/2", b"2")
            assert a.pending() == [] and c.pending() == []
    assert 5 <= polls <= 25, polls  # one scan per poll, not one per watch and poll


async def test_bad_files_are_reported_once_however_many_watches_see_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="dynamo_trio.discovery")
    FileLayout(tmp_path).ensure()
    for i in range(3):
        (tmp_path / "kv" / key_to_name(f"p/bad-{i}")).write_bytes(b"garbage")
    async with (
        open_discovery(file_config(tmp_path)) as d,
        d.watch_prefix("p/"),
        d.watch_prefix("p/b"),
        d.watch_prefix(""),
    ):
        await d.get_prefix("p/")
        await trio.sleep(0.3)
    for i in range(3):
        assert len(skipped(caplog, key_to_name(f"p/bad-{i}"))) == 1


def test_entries_of_dead_leases_collected_in_one_scan_are_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dynamo_trio.discovery")
    layout = FileLayout(tmp_path, LIMIT)
    layout.ensure()
    for i in range(50):
        layout.write_entry(f"p/dead-{i:02d}", b"x", 0xDEAD)  # a lease that has no file
    assert Scanner(layout, 2.0).scan() == {}
    assert list(layout.kv_dir.iterdir()) == []
    lines = [r.getMessage() for r in caplog.records if "collected" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "50 entries of dead leases" in lines[0]
