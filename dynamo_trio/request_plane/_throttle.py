"""Pacing failed authentications in total, without locking anyone out: guessing a token
is slow, and guessers cannot keep out a peer that knows it."""

from __future__ import annotations

import ipaddress
import math
from collections import OrderedDict, deque
from typing import TYPE_CHECKING, Final, final

import trio
from trio.lowlevel import ParkingLot

if TYPE_CHECKING:
    from collections.abc import Callable


def source_key(host: str) -> str:
    """The unit turns go round by: the IPv4 host, or the IPv6 /64 prefix."""
    try:
        address = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):  # an IPv4-mapped one is that IPv4 host
        return str(address.ipv4_mapped or ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


@final
class AuthTurns:
    """Whose proof is judged next, and when: failures at most 16 per ``penalty`` seconds in
    total (0: no pacing), after a ``burst`` judged back to back."""

    def __init__(self, penalty: float, *, burst: int = 4) -> None:
        self.interval: Final = penalty / 16
        self.burst: Final = burst
        self._due = -math.inf  # when the pace would allow the next failure, bursts aside
        self._sources: OrderedDict[str, deque[ParkingLot]] = OrderedDict()  # waiters by source
        self.failures = 0  # judged so far

    def __len__(self) -> int:  # connections waiting for their turn
        return sum(len(waiting) for waiting in self._sources.values())

    def _head(self) -> ParkingLot | None:
        return next((waiting[0] for waiting in self._sources.values()), None)

    async def judge(self, key: str, verdict: Callable[[], bool], *, deadline: float) -> bool | None:
        """Wait for ``key``'s turn until ``deadline``, then return ``verdict()`` (called once,
        with no checkpoint before it); ``None`` if no turn came in time.  A failed verdict
        spends a turn; a successful one does not."""
        waiter = ParkingLot()  # unparked when it becomes the head
        waiting = self._sources.setdefault(key, deque())
        waiting.append(waiter)
        judged: bool | None = None
        try:
            while True:
                now = trio.current_time()
                wake_at = deadline
                if self._head() is waiter:
                    # When the next failure may be judged (a burst may come early).
                    free_at = self._due - (self.burst - 1) * self.interval
                    if now >= free_at:
                        judged = verdict()
                        if not judged:
                            self._due = max(self._due, now) + self.interval
                            self.failures += 1
                        return judged
                    wake_at = min(deadline, free_at)
                if now >= deadline:
                    return None
                with trio.move_on_at(wake_at):
                    await waiter.park()
        finally:
            was_head = self._head() is waiter
            waiting.remove(waiter)
            if not waiting:
                del self._sources[key]
            elif judged is not None:  # its next connection waits its turn again
                self._sources.move_to_end(key)
            if was_head and (head := self._head()) is not None:
                head.unpark()
