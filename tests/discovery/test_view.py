"""PrefixView semantics (on the mem backend; the shared suite runs it on every backend)."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, cast

import pytest
import trio
import trio.testing

from dynamo_trio.discovery import (
    Discovery,
    DiscoveryError,
    MemoryDiscovery,
    MemoryStore,
    Watch,
    WatchEvent,
    view_prefix,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


def decode_int(data: bytes) -> int:
    return int(data)


async def test_version_counts_changes_and_items_is_a_copy() -> None:
    store = MemoryStore()
    async with MemoryDiscovery(store) as d:
        await d.put("p/a", b"1")
        async with view_prefix(d, "p/", decode_int) as view:
            assert view.version == 0
            items = view.items()
            items["p/zzz"] = 0
            assert view.items() == {"p/a": 1}

            await d.put("p/b", b"2")
            assert await view.wait_changed(0) == 1
            # same value again, a delete of an absent key, a key outside: no change
            await d.put("p/b", b"2")
            await d.delete("p/nothing")
            await d.put("q/x", b"3")
            await d.put("p/c", b"3")
            assert await view.wait_changed(1) == 2
            assert view.items() == {"p/a": 1, "p/b": 2, "p/c": 3}


async def test_wait_changed_returns_at_once_for_an_old_version(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Virtual time: a wait that blocked at all would reach its fail_after.
    async with MemoryDiscovery(MemoryStore()) as d, view_prefix(d, "p/", decode_int) as view:
        await d.put("p/a", b"1")
        with trio.fail_after(1):
            await view.wait_changed(0)
        with trio.fail_after(1):
            assert await view.wait_changed(0) == view.version  # no wait this time


async def test_wait_until_checks_the_current_state_first_and_is_cancellable(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Virtual time: a wait that blocked at all would reach its fail_after.
    async with MemoryDiscovery(MemoryStore()) as d:
        await d.put("p/a", b"1")
        async with view_prefix(d, "p/", decode_int) as view:
            with trio.fail_after(1):
                assert await view.wait_until(lambda r: r.get("p/a") == 1) == {"p/a": 1}
            with trio.move_on_after(0.05) as scope:
                await view.wait_until(lambda r: "p/never" in r)
            assert scope.cancelled_caught

            async def later() -> None:
                await trio.sleep(0.01)
                await d.put("p/b", b"41")
                await d.put("p/b", b"42")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(later)
                with trio.fail_after(1):
                    assert (await view.wait_until(lambda r: r.get("p/b") == 42))["p/b"] == 42


async def test_a_decoder_that_raises_anything_only_skips_the_record(
    caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    def picky(data: bytes) -> int:
        if data == b"boom":
            raise RuntimeError("decoder bug")
        return int(data)

    async with MemoryDiscovery(MemoryStore()) as d:
        await d.put("p/a", b"boom")
        async with view_prefix(d, "p/", picky) as view:
            assert view.items() == {}
            await d.put("p/a", b"1")
            with trio.fail_after(1):
                await view.wait_until(lambda r: r == {"p/a": 1})
    assert "decoder bug" in caplog.text


class _EndingDiscovery:
    """A stand-in whose watch ends after one event (as if its backend went away)."""

    @asynccontextmanager
    async def watch_prefix(self, prefix: str) -> AsyncIterator[Watch]:
        send_channel, receive_channel = trio.open_memory_channel[WatchEvent](1)
        send_channel.send_nowait(WatchEvent("put", prefix + "a", b"1"))
        send_channel.close()
        yield Watch({}, receive_channel)


async def test_waiting_on_a_view_whose_watch_ended_raises(
    autojump_clock: trio.testing.MockClock,
) -> None:
    fake = cast("Discovery", _EndingDiscovery())
    async with view_prefix(fake, "p/", decode_int) as view:
        with trio.fail_after(1), pytest.raises(DiscoveryError, match="ended"):
            await view.wait_until(lambda r: "p/b" in r)
        assert view.items() == {"p/a": 1}
