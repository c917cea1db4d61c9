"""Steady client traffic through a frontend while a fault happens, and what it saw."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import count
from typing import TYPE_CHECKING

import trio

from ._bed import StreamResult, stream_chat

if TYPE_CHECKING:
    from ._bed import Frontend


@dataclass
class Sent:
    """One request of the traffic: when it started and what came of it."""

    started: float
    result: StreamResult

    @property
    def latency(self) -> float:
        assert self.result.ended_at is not None
        return self.result.ended_at - self.started

    @property
    def ok(self) -> bool:
        return self.result.done and self.result.error is None


@dataclass
class Traffic:
    """Short streaming requests, one after another, through ``frontends`` in turn."""

    frontends: list[Frontend]
    tokens: int = 5
    pause: float = 0.05
    sent: list[Sent] = field(default_factory=list)
    _serial: count[int] = field(default_factory=count)

    _stop: trio.Event = field(default_factory=trio.Event)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Send until :meth:`stop` (one request in flight at a time per frontend)."""
        task_status.started()
        async with trio.open_nursery() as nursery:
            for frontend in self.frontends:
                nursery.start_soon(self._loop, frontend)

    def stop(self) -> None:
        """Send no more requests; :meth:`run` returns once the ones in flight have ended."""
        self._stop.set()

    async def _loop(self, frontend: Frontend) -> None:
        while not self._stop.is_set():
            sent = Sent(trio.current_time(), StreamResult())
            self.sent.append(sent)
            await stream_chat(
                frontend,
                self.tokens,
                request_id=f"traffic-{frontend.host}-{next(self._serial)}",
                result=sent.result,
                give_up_after=30,
            )
            await trio.sleep(self.pause)

    def finished(self) -> list[Sent]:
        return [s for s in self.sent if s.result.ended_at is not None]

    def failures(self) -> list[Sent]:
        return [s for s in self.finished() if not s.ok]

    def slowest(self, after: float = 0.0) -> float:
        return max((s.latency for s in self.finished() if s.started >= after), default=0.0)
