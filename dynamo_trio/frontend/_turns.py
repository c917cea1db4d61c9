"""Turns: under load, a new stream's first tokens go before the running streams' next ones
(docs/architecture.md, "The HTTP edge").
"""

from __future__ import annotations

from time import perf_counter
from typing import Final, final

import trio


@final
class Turns(trio.abc.Instrument):
    """At most ``per_pass`` turns (0: no limit) per scheduler pass, first come first served,
    once the pass is older than ``budget`` seconds (before, every asker has one at once).
    A trio instrument told where passes begin; the ticker that hands out waiting turns runs
    in ``nursery`` only while someone waits."""

    __slots__ = (
        "_free_until",
        "_installed",
        "_lot",
        "_nursery",
        "_ticking",
        "_used",
        "budget",
        "per_pass",
    )

    def __init__(self, per_pass: int, nursery: trio.Nursery, *, budget: float = 0.0) -> None:
        if per_pass < 0:
            raise ValueError(f"turns per pass must be 0 or more, not {per_pass}")
        if not budget >= 0:
            raise ValueError(f"a pass's budget must be 0 or more seconds, not {budget}")
        self.per_pass: Final = per_pass
        self.budget: Final = budget
        self._nursery = nursery
        self._lot = trio.lowlevel.ParkingLot()
        self._used = 0
        self._free_until = 0.0
        self._ticking = False
        self._installed = False

    def install(self) -> None:
        """From now on, each scheduler pass starts with all its turns free (in trio)."""
        if self.per_pass and not self._installed:
            trio.lowlevel.add_instrument(self)
            self._installed = True

    def uninstall(self) -> None:
        """Undo :meth:`install` (idempotent)."""
        if self._installed:
            self._installed = False
            trio.lowlevel.remove_instrument(self)

    def after_io_wait(self, timeout: float) -> None:
        """A pass begins (trio calls this once per pass, before it runs any task)."""
        self._used = 0
        if self.budget:
            self._free_until = perf_counter() + self.budget

    @property
    def waiting(self) -> int:
        """How many wait for a turn now."""
        return len(self._lot)

    async def take(self) -> None:
        """Return when it is this task's turn: at once if nobody waits and this pass has a
        turn left or is younger than the budget, else in a later pass, in order."""
        if self.per_pass == 0 or (
            not self._lot
            and (self._used < self.per_pass or (self.budget and perf_counter() < self._free_until))
        ):
            self._used += 1
            await trio.lowlevel.checkpoint_if_cancelled()
            return
        if not self._ticking:
            self._ticking = True
            self._nursery.start_soon(self._tick)
        await self._lot.park()

    async def _tick(self) -> None:
        """Once per pass while anyone waits: hand out that pass's turns, oldest first."""
        try:
            while self._lot:
                self._used += len(self._lot.unpark(count=max(0, self.per_pass - self._used)))
                await trio.lowlevel.checkpoint()  # the next pass
        finally:
            self._ticking = False
