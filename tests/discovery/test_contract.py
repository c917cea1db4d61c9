"""The contract every discovery backend keeps: each test runs on mem, file and etcd.

Watch tests wait for each change before making the next one: the file
backend polls, so changes made between two polls arrive as one state change.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

import pytest
import trio
import trio.testing

from dynamo_trio.discovery import (
    DiscoveryError,
    Instance,
    MemoryStore,
    WatchEvent,
    decode_instance,
    encode_record,
    make_discovery,
    view_prefix,
)

from ._faults import FAULTS
from ._util import STEP, events, fd_count, next_event

if TYPE_CHECKING:
    from pathlib import Path

    from dynamo_trio import DiscoveryConfig
    from dynamo_trio.discovery import Discovery, Watch

    from ._faults import StoreFaults
    from .conftest import OpenInstance


def put(key: str, value: bytes) -> WatchEvent:
    return WatchEvent("put", key, value)


def delete(key: str) -> WatchEvent:
    return WatchEvent("delete", key, None)


async def test_put_get_delete(open_instance: OpenInstance, prefix: str) -> None:
    async with open_instance() as d:
        assert await d.get_prefix(prefix) == {}
        await d.put(prefix + "a", b"1")
        await d.put(prefix + "b", b"")
        await d.put(prefix + "a", b"2")
        assert await d.get_prefix(prefix) == {prefix + "a": b"2", prefix + "b": b""}
        await d.delete(prefix + "a")
        await d.delete(prefix + "never-there")
        assert await d.get_prefix(prefix) == {prefix + "b": b""}


async def test_prefixes_are_isolated(open_instance: OpenInstance, prefix: str) -> None:
    async with open_instance() as d:
        await d.put(prefix + "a/b", b"1")
        await d.put(prefix + "a/bc", b"2")
        await d.put(prefix + "a/b/c", b"3")
        assert await d.get_prefix(prefix + "a/b/") == {prefix + "a/b/c": b"3"}
        assert set(await d.get_prefix(prefix + "a/b")) == {
            prefix + "a/b",
            prefix + "a/bc",
            prefix + "a/b/c",
        }
        async with d.watch_prefix(prefix + "a/b/") as watch:
            assert watch.initial == {prefix + "a/b/c": b"3"}
            await d.put(prefix + "a/bc", b"changed")
            await d.put(prefix + "a/b/d", b"4")
            assert await next_event(watch) == put(prefix + "a/b/d", b"4")


async def test_instances_see_each_others_keys(open_instance: OpenInstance, prefix: str) -> None:
    async with open_instance() as a, open_instance() as b:
        assert a.lease_id != b.lease_id
        for lease_id in (a.lease_id, b.lease_id):
            assert 0 < lease_id < 2**63
        await a.put(prefix + "a", b"from a")
        await b.put(prefix + "b", b"from b")
        expected = {prefix + "a": b"from a", prefix + "b": b"from b"}
        assert await a.get_prefix(prefix) == expected
        assert await b.get_prefix(prefix) == expected


async def test_a_key_belongs_to_the_last_writer(open_instance: OpenInstance, prefix: str) -> None:
    async with open_instance() as a, open_instance() as b:
        await a.put(prefix + "shared", b"a")
        await a.put(prefix + "mine", b"a")
        await b.put(prefix + "shared", b"b")
        await a.aclose()
        assert await b.get_prefix(prefix) == {prefix + "shared": b"b"}


async def test_watch_gives_the_initial_state_then_changes_in_order(
    open_instance: OpenInstance, prefix: str
) -> None:
    async with open_instance() as writer, open_instance() as reader:
        await writer.put(prefix + "a", b"1")
        await writer.put(prefix + "b", b"2")
        async with reader.watch_prefix(prefix) as watch:
            assert watch.initial == {prefix + "a": b"1", prefix + "b": b"2"}
            steps = [
                (writer.put(prefix + "c", b"3"), put(prefix + "c", b"3")),
                (writer.put(prefix + "a", b"1b"), put(prefix + "a", b"1b")),
                (writer.delete(prefix + "b"), delete(prefix + "b")),
                (writer.put(prefix + "b", b"again"), put(prefix + "b", b"again")),
                (writer.delete(prefix + "a"), delete(prefix + "a")),
            ]
            for action, expected in steps:
                await action
                assert await next_event(watch) == expected
        assert await reader.get_prefix(prefix) == {prefix + "b": b"again", prefix + "c": b"3"}


async def test_nothing_is_lost_or_repeated_between_snapshot_and_events(
    open_instance: OpenInstance, prefix: str
) -> None:
    keys = [f"{prefix}{i:03d}" for i in range(60)]

    async with open_instance() as writer, open_instance() as reader:

        async def write_all() -> None:
            for key in keys:
                await writer.put(key, b"v")
                await trio.sleep(0.001)

        async def watch_from(delay: float) -> None:
            await trio.sleep(delay)
            async with reader.watch_prefix(prefix) as watch:
                seen = list(watch.initial)
                with trio.fail_after(10):
                    while len(set(seen)) < len(keys):
                        event = await watch.__anext__()
                        assert event.kind == "put"
                        seen.append(event.key)
            assert sorted(seen) == keys, "a key was reported twice"

        async with trio.open_nursery() as nursery:
            nursery.start_soon(write_all)
            for delay in (0.0, 0.01, 0.03, 0.05):
                nursery.start_soon(watch_from, delay)


async def test_closing_an_instance_deletes_its_keys_for_watchers(
    open_instance: OpenInstance, prefix: str
) -> None:
    async with open_instance() as reader, reader.watch_prefix(prefix) as watch:
        # The owner's lease outlives the hang guard below: deletes seen within it were
        # made by the closing owner, not by the store expiring its lease.
        async with open_instance(lease_ttl=120.0) as owner:
            await owner.put(prefix + "a", b"1")
            await owner.put(prefix + "b", b"2")
            got = await events(watch, 2)
            assert sorted(e.key for e in got) == [prefix + "a", prefix + "b"]
        got = await events(watch, 2, within=60)  # a hang guard only
        assert sorted(got, key=lambda e: e.key) == [delete(prefix + "a"), delete(prefix + "b")]
        assert await reader.get_prefix(prefix) == {}


async def test_a_cancelled_instance_still_revokes_its_lease(
    open_instance: OpenInstance, prefix: str
) -> None:
    async with open_instance() as reader:
        # Cancelled once its key is in; its lease would expire only long after the check.
        with trio.CancelScope() as scope:
            async with open_instance(lease_ttl=120.0) as owner:
                await owner.put(prefix + "k", b"v")
                assert await reader.get_prefix(prefix) == {prefix + "k": b"v"}
                scope.cancel()
                await trio.sleep_forever()
        assert scope.cancelled_caught
        assert await reader.get_prefix(prefix) == {}


async def test_aclose_is_idempotent_and_ends_every_operation(
    open_instance: OpenInstance, prefix: str
) -> None:
    async with open_instance() as d:
        await d.put(prefix + "k", b"v")
        async with d.watch_prefix(prefix) as watch:
            await d.aclose()
            await d.aclose()
            assert d.closed
            # the watch opened before keeps working: it sees the lease's keys go
            assert await next_event(watch) == delete(prefix + "k")
        with pytest.raises(DiscoveryError, match="closed"):
            await d.put(prefix + "k", b"v")
        with pytest.raises(DiscoveryError, match="closed"):
            await d.delete(prefix + "k")
        with pytest.raises(DiscoveryError, match="closed"):
            await d.get_prefix(prefix)
        with pytest.raises(DiscoveryError, match="closed"):
            async with d.watch_prefix(prefix):
                pass


async def test_invalid_keys_and_values_are_refused(open_instance: OpenInstance) -> None:
    async with open_instance() as d:
        with pytest.raises(TypeError):
            await d.put("k", "not bytes")  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            await d.put(b"k", b"v")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="NUL"):
            await d.put("a\0b", b"v")
        with pytest.raises(ValueError, match="UTF-8"):
            await d.put("lone \udc80 surrogate", b"v")


ODD_KEYS = [
    "..",
    "../escape",
    "a/../../b",
    ".hidden",
    "with space",
    "percent%2Fslash",
    "new\nline",
    "ünïcödé/ключ/鍵",
    "emoji/🙂",
    "a//b/",
    "~tilde",
    "x" * 300,
]


async def test_odd_keys_round_trip(
    open_instance: OpenInstance, prefix: str, backend: str, tmp_path: Path
) -> None:
    expected = {prefix + key: key.encode() for key in ODD_KEYS}
    async with open_instance() as writer, open_instance() as reader:
        for key, value in expected.items():
            await writer.put(key, value)
        assert await reader.get_prefix(prefix) == expected
        async with reader.watch_prefix(prefix) as watch:
            assert watch.initial == expected
            await writer.delete(prefix + "../escape")
            assert await next_event(watch) == delete(prefix + "../escape")
        assert await reader.get_prefix(prefix + "..") == {
            prefix + "..": b"..",
        }
    if backend == "file":
        assert os.listdir(tmp_path) == ["kv"], "a key escaped the discovery directory"
        assert sorted(os.listdir(tmp_path / "kv")) == ["kv", "leases"]


async def test_concurrent_watchers_see_the_same_changes(
    open_instance: OpenInstance, prefix: str
) -> None:
    keys = [prefix + name for name in ("a", "b", "c")]
    results: list[list[WatchEvent]] = []
    async with open_instance() as writer, open_instance() as reader:

        async def follow(task_status: trio.TaskStatus[None]) -> None:
            async with reader.watch_prefix(prefix) as watch:
                task_status.started()
                results.append(await events(watch, len(keys)))

        async with trio.open_nursery() as nursery:
            for _ in range(4):
                await nursery.start(follow)
            for key in keys:
                await writer.put(key, b"v")
    assert results == [[put(key, b"v") for key in keys]] * 4


async def test_leaving_a_watch_releases_it(
    open_instance: OpenInstance, prefix: str, backend: str, memory_store: MemoryStore
) -> None:
    async with open_instance() as d:
        await d.put(prefix + "k", b"v")
        await d.get_prefix(prefix)  # let the etcd client's pool settle
        before = fd_count()
        for _ in range(10):
            with trio.move_on_after(0.05):
                async with d.watch_prefix(prefix) as watch:
                    async for _ in watch:
                        pass
        # A reader that stopped reading: the pump is blocked on a full channel.
        async with d.watch_prefix(prefix):
            for i in range(80):
                await d.put(f"{prefix}flood/{i:02d}", b"x")
            await trio.sleep(0.1)
        # etcd's client may keep one or two idle pooled connections; ten
        # leaked watch streams would be ten more descriptors.
        slack = 2 if backend == "etcd" else 0
        with trio.fail_after(30):  # a hang guard only: a leak never gets there
            # Sockets and watches are released in their own time: wait for it.
            while fd_count() > before + slack or memory_store.watch_count:  # noqa: ASYNC110
                await trio.sleep(0.01)


async def test_prefix_view_decodes_and_skips_bad_records(
    open_instance: OpenInstance, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    one = Instance("ns", "comp", "ep", 1, "127.0.0.1:1001")
    two = Instance("ns", "comp", "ep", 2, "127.0.0.1:1002")
    caplog.set_level(logging.WARNING, logger="dynamo_trio.discovery")
    async with open_instance() as d:
        await d.put(prefix + "one", encode_record(one))
        await d.put(prefix + "bad", b"{not json")
        async with view_prefix(d, prefix, decode_instance) as view:
            assert view.items() == {prefix + "one": one}
            assert "bad" in caplog.text
            version = view.version
            with trio.fail_after(STEP):
                await d.put(prefix + "bad", encode_record(two))
                assert await view.wait_changed(version) > version
                assert view.items() == {prefix + "one": one, prefix + "bad": two}
                # a good record replaced by garbage leaves the view
                await d.put(prefix + "one", b'{"namespace": "ns"}')
                await view.wait_until(lambda records: prefix + "one" not in records)
                await d.delete(prefix + "bad")
                assert await view.wait_until(lambda records: not records) == {}


async def test_prefix_view_on_a_closing_instance(open_instance: OpenInstance, prefix: str) -> None:
    one = Instance("ns", "comp", "ep", 1, "127.0.0.1:1001")
    async with open_instance() as reader, view_prefix(reader, prefix, decode_instance) as view:
        async with open_instance() as owner:
            await owner.put(prefix + "one", encode_record(one))
            with trio.fail_after(STEP):
                await view.wait_until(lambda records: len(records) == 1)
        with trio.fail_after(STEP):
            await view.wait_until(lambda records: not records)


async def test_an_instance_is_entered_exactly_once(
    discovery_config: DiscoveryConfig, memory_store: MemoryStore, prefix: str
) -> None:
    discovery = make_discovery(discovery_config, memory_store=memory_store)
    with pytest.raises(DiscoveryError, match="not started"):
        await discovery.put(prefix + "k", b"v")
    async with discovery:
        await discovery.put(prefix + "k", b"v")
    with pytest.raises(RuntimeError, match="only once"):
        async with discovery:
            pass


async def _until_restored(reader: Discovery, prefix: str, expected: dict[str, bytes]) -> None:
    while await reader.get_prefix(prefix) != expected:  # noqa: ASYNC110 - another store
        await trio.sleep(0.01)


async def _catch_up(watch: Watch, state: dict[str, bytes], quiet: float = 0.15) -> None:
    """Apply the watch's events to ``state`` until none has come for ``quiet`` seconds."""
    while True:
        with trio.move_on_after(quiet):
            event = await watch.__anext__()
            if event.value is None:
                state.pop(event.key, None)
            else:
                state[event.key] = event.value
            continue
        return


@pytest.fixture
def mem_in_virtual_time(backend: str) -> trio.testing.MockClock | None:
    """The autojump clock for the ``mem`` backend (trio's time only: its waits for lease
    checks take no real time, and what follows a check is exact); none for ``file`` and
    ``etcd``, whose stores answer in real time (threads, another process)."""
    return trio.testing.MockClock(autojump_threshold=0) if backend == "mem" else None


async def test_owned_keys_lost_by_the_store_are_written_back_within_a_ttl(
    open_instance: OpenInstance,
    prefix: str,
    discovery_config: DiscoveryConfig,
    store_faults: StoreFaults,
    mem_in_virtual_time: trio.testing.MockClock | None,
) -> None:
    """Whatever the store loses while its owner lives comes back within one lease TTL:
    same keys, values, lease and instance id, nothing else, and only once."""
    ttl = discovery_config.lease_ttl
    owned = {prefix + "instance": b"instance record", prefix + "card": b"model card"}
    async with open_instance() as owner, open_instance() as reader:
        lease_id = owner.lease_id
        for key, value in owned.items():
            await owner.put(key, value)
        await owner.put(prefix + "deleted by its owner", b"x")
        await owner.delete(prefix + "deleted by its owner")
        async with reader.watch_prefix(prefix) as watch:
            assert watch.initial == owned
            state = dict(watch.initial)
            took: dict[str, float] = {}
            for fault in ("deleted by another instance", *FAULTS):
                if fault == "deleted by another instance":
                    for key in owned:
                        await reader.delete(key)
                else:
                    await store_faults.inflict(fault, prefix, lease_id)
                lost = trio.current_time()
                with trio.fail_after(ttl + STEP):
                    await _until_restored(reader, prefix, owned)
                took[fault] = trio.current_time() - lost
            # The watch agrees; the owner wrote each key back once per loss, and then
            # leaves them alone (the next check comes ttl/3 after the last repair).
            await _catch_up(watch, state)
            assert state == owned
            with trio.move_on_after(ttl / 3 + 0.2):
                extra = await watch.__anext__()
                pytest.fail(f"the owner keeps rewriting its keys: {extra}")
        assert owner.lease_id == lease_id, "the instance id must never change"
        assert await reader.get_prefix(prefix) == owned
        print(
            f"{store_faults.backend}: restored after "
            + ", ".join(f"{fault}: {seconds:.2f}s" for fault, seconds in took.items())
        )
        for fault, seconds in took.items():
            assert seconds < ttl, f"{fault}: restored after {seconds:.2f}s, past the {ttl}s TTL"
        # An owner gives up a key it deletes, or that another instance overwrites.
        await owner.delete(prefix + "card")
        await reader.put(prefix + "instance", b"taken over")
        await trio.sleep(ttl / 3 + 0.3)  # a check by each
        assert await owner.get_prefix(prefix) == {prefix + "instance": b"taken over"}
        await reader.delete(prefix + "instance")
        await trio.sleep(ttl / 3 + 0.3)
        assert await owner.get_prefix(prefix) == {}
    async with open_instance() as check:
        assert await check.get_prefix(prefix) == {}, "closing still removes every restored key"
