"""Small helpers shared by the discovery tests."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from dynamo_trio.discovery import Watch, WatchEvent

__all__ = ["STEP", "events", "fd_count", "next_event"]

STEP = 3.0
"""Generous bound for one change to reach a watcher (any backend, loaded CI machine)."""


async def next_event(watch: Watch, within: float = STEP) -> WatchEvent:
    """The watch's next event, failing the test if none comes ``within`` seconds."""
    with trio.fail_after(within):
        return await watch.__anext__()


async def events(watch: Watch, count: int, within: float = STEP) -> list[WatchEvent]:
    """The watch's next ``count`` events, ``within`` seconds overall."""
    with trio.fail_after(within):
        return [await watch.__anext__() for _ in range(count)]


def fd_count() -> int:
    """Open file descriptors of this process."""
    return len(os.listdir("/proc/self/fd"))
