"""Turns: under load, a new stream's first tokens go before the running streams' next ones.

trio runs every runnable task once per scheduler pass, so a saturated
frontend's passes grow with its running streams, and a new request, which
needs about a dozen passes before its first chunk, waits a dozen long ones.
So a running stream's producer takes a *turn* (:meth:`Turns.take`) before it
writes each batch after its first: at most ``per_pass`` per pass, the others
waiting in order for a later pass (a *ticker* task hands those out, only while
someone waits).  A stream's first batch never waits, nor does any other task,
so passes stay short; the waiting streams lose nothing (their tokens gather in
their request-plane queues, bounded by the stream window, and go out in one
larger write).  0 turns the limit off.
"""

from __future__ import annotations

from typing import Final, final

import trio

__all__ = ["Turns"]


@final
class Turns(trio.abc.Instrument):
    """At most ``per_pass`` turns per scheduler pass, first come first served.

    ``per_pass`` 0: no limit (every :meth:`take` is only a cancellation point).
    Between :meth:`install` and :meth:`uninstall` it is a trio instrument, told
    where passes begin (``after_io_wait``, called once per pass); the ticker
    runs in ``nursery`` (the frontend's), only while someone waits.
    """

    __slots__ = ("_installed", "_lot", "_nursery", "_ticking", "_used", "per_pass")

    def __init__(self, per_pass: int, nursery: trio.Nursery) -> None:
        if per_pass < 0:
            raise ValueError(f"turns per pass must be 0 or more, not {per_pass}")
        self.per_pass: Final = per_pass
        self._nursery = nursery
        self._lot = trio.lowlevel.ParkingLot()
        self._used = 0
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

    @property
    def waiting(self) -> int:
        """How many wait for a turn now."""
        return len(self._lot)

    async def take(self) -> None:
        """Return when it is this task's turn: at once if this pass has one left and
        nobody waits, else in a later pass, after those that waited first.

        A cancellation point whichever way (cancelled while waiting: no turn is
        used).
        """
        if self.per_pass == 0 or (self._used < self.per_pass and not self._lot):
            self._used += 1
            await trio.lowlevel.checkpoint_if_cancelled()
            return
        if not self._ticking:
            self._ticking = True
            self._nursery.start_soon(self._tick)
        await self._lot.park()

    async def _tick(self) -> None:
        """Once per pass while anyone waits: hand out that pass's turns, oldest first.

        Being runnable, it also keeps trio from sleeping in its I/O wait while
        streams wait for turns that only a new pass brings.
        """
        try:
            while self._lot:
                self._used += len(self._lot.unpark(count=max(0, self.per_pass - self._used)))
                await trio.lowlevel.checkpoint()  # the next pass
        finally:
            self._ticking = False
