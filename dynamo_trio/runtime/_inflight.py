"""The requests in flight in one process: for graceful shutdown and for introspection."""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    from collections.abc import Iterator

    from .._context import CancelReason, Context


class InflightRequests:
    """A set of request contexts that can be awaited empty and listed as trees."""

    def __init__(self) -> None:
        self._contexts: set[Context] = set()
        self._idle: trio.Event | None = None

    def __len__(self) -> int:
        return len(self._contexts)

    def __iter__(self) -> Iterator[Context]:
        return iter(tuple(self._contexts))

    def kill_all(self, reason: CancelReason) -> None:
        for context in self:
            context.kill(reason)

    def add(self, context: Context) -> None:
        self._contexts.add(context)

    def discard(self, context: Context) -> None:
        self._contexts.discard(context)
        if not self._contexts and self._idle is not None:
            self._idle.set()
            self._idle = None

    @contextmanager
    def track(self, context: Context) -> Iterator[Context]:
        """Count ``context`` as in flight for the duration of the block."""
        self.add(context)
        try:
            yield context
        finally:
            self.discard(context)

    async def wait_empty(self) -> None:
        """Return once no request is in flight."""
        while self._contexts:
            if self._idle is None:
                self._idle = trio.Event()
            await self._idle.wait()
        await trio.lowlevel.checkpoint()

    def snapshot(self) -> list[dict[str, Any]]:
        """Each in-flight request as a tree (``Context.snapshot()``), oldest first."""
        return [
            context.snapshot()
            for context in sorted(self._contexts, key=lambda context: context.created_at)
        ]
