"""Which instance a call goes to: the one router of a process, for clients and the frontend
(its rules, and why, are in ``docs/architecture.md``, "Routing")."""

from __future__ import annotations

import contextlib
import itertools
import logging
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, TypeVar, final

from .._errors import CannotConnect, DynamoError, NoInstances

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Collection, Hashable, Mapping

    import trio

    from .._config import RouterMode

_log = logging.getLogger("dynamo_trio.runtime")

_R = TypeVar("_R")

Target = tuple[str, int]
"""``(endpoint path, instance id)``: one place a call can go."""

_DOWN_FOR: Final = 2.0  # a failed target's rest before a probe; each failed probe doubles it
_MAX_DOWN_FOR: Final = 8.0


@dataclass(slots=True)
class _Resting:
    """A target out of rotation until (``time.monotonic()``) a probe may try it again."""

    until: float
    failures: int  # in a row: the first, then each failed probe
    probing: bool = False


@final
class Router:
    """Chooses targets and keeps the rotation, for every caller of one runtime (probing
    resting targets with ``connect``, in ``nursery()``)."""

    def __init__(
        self, connect: Callable[[str], Awaitable[object]], nursery: Callable[[], trio.Nursery]
    ) -> None:
        self._connect = connect
        self._nursery = nursery
        self._resting: dict[Target, _Resting] = {}
        self._turns: dict[Hashable, int] = {}

    def is_live(self, target: Target) -> bool:
        """Whether ``target`` is in rotation."""
        return target not in self._resting

    def forget(self, path: str, listed: Collection[int]) -> None:
        """Forget the targets of ``path`` whose instance discovery no longer lists."""
        for gone in [t for t in self._resting if t[0] == path and t[1] not in listed]:
            del self._resting[gone]

    def choose(
        self,
        candidates: Mapping[Target, str],
        tried: Collection[Target] = (),
        *,
        mode: RouterMode = "round-robin",
        turn: Hashable = None,
    ) -> Target | None:
        """A live untried target of ``candidates`` (``{target: address}``), taken in
        ``turn``'s turn or at random; else the untried one whose rest ended first (its
        probe is under way); else ``None``.  Starts the probes that are due."""
        live, due = self._split(candidates, tried)
        if live:
            if mode == "random":
                return random.choice(live)
            count = self._turns.get(turn, 0)
            self._turns[turn] = (count + 1) % (1 << 62)
            return live[count % len(live)]
        return min(due)[1] if due else None

    def live(self, candidates: Mapping[Target, str]) -> list[Target]:
        """The targets of ``candidates`` in rotation; starts the probes that are due."""
        return self._split(candidates, ())[0]

    def _split(
        self, candidates: Mapping[Target, str], tried: Collection[Target]
    ) -> tuple[list[Target], list[tuple[float, Target]]]:
        """The untried live candidates and the untried rested ones (with when); starts probes."""
        now = time.monotonic()
        live: list[Target] = []
        due: list[tuple[float, Target]] = []
        for target, address in candidates.items():
            resting = self._resting.get(target)
            if resting is None:
                if target not in tried:
                    live.append(target)
            elif resting.until <= now:
                if not resting.probing:
                    self._start_probe(target, address, resting)
                if target not in tried:
                    due.append((resting.until, target))
        return live, due

    async def send(
        self,
        candidates: Callable[[], Awaitable[Mapping[Target, str]]],
        send: Callable[[Target], Awaitable[_R]],
        tried: set[Target],
        *,
        mode: RouterMode = "round-robin",
        turn: Hashable = None,
        attempts: int | None = None,
        last_error: DynamoError | None = None,
        nobody: str,
    ) -> _R:
        """``send`` to a chosen target, and to the next while it raises ``CannotConnect``
        (at most ``attempts`` times); then re-raise the last, or ``NoInstances(nobody)``."""
        for _ in itertools.repeat(None) if attempts is None else range(attempts):
            target = self.choose(await candidates(), tried, mode=mode, turn=turn)
            if target is None:
                break
            tried.add(target)
            try:
                return await send(target)
            except CannotConnect as exc:
                last_error = exc
        if last_error is not None:
            raise last_error
        raise NoInstances(nobody)

    def failed(self, target: Target, reason: str, *, expected: bool = False) -> None:
        """Take ``target`` out of rotation (once per event: a no-op while it is out)."""
        resting = self._resting.get(target)
        if resting is not None and (resting.probing or resting.until > time.monotonic()):
            return  # every stream of a lost connection fails at once: one event
        log = _log.info if expected else _log.warning
        log("instance %x of %s taken out of rotation: %s", target[1], target[0], reason)
        self._rest(target, 1 if resting is None else resting.failures + 1)

    def connected(self, target: Target) -> None:
        """A connection to ``target`` was made: it is in rotation."""
        if self._resting.pop(target, None) is not None:
            _log.info("instance %x of %s back in rotation", target[1], target[0])

    def _rest(self, target: Target, failures: int) -> float:
        """Rest ``target`` after ``failures`` failures in a row (doubling each time); how long."""
        rest = min(_DOWN_FOR * 2.0 ** min(failures - 1, 16), _MAX_DOWN_FOR)
        self._resting[target] = _Resting(time.monotonic() + rest, failures)
        return rest

    def _start_probe(self, target: Target, address: str, resting: _Resting) -> None:
        with contextlib.suppress(RuntimeError):  # the runtime is closing
            self._nursery().start_soon(self._probe, target, address, name=f"probe {address}")
            resting.probing = True

    async def _probe(self, target: Target, address: str) -> None:
        """Try to connect to a resting target: back in rotation, or rest longer."""
        try:
            await self._connect(address)
            self.connected(target)
        except CannotConnect as exc:
            resting = self._resting.get(target)
            if resting is None:
                return  # it came back (or left discovery) meanwhile
            rest = self._rest(target, resting.failures + 1)
            _log.info(
                "instance %x of %s still unreachable (%s); next try in %.0fs",
                target[1],
                target[0],
                exc,
                rest,
            )
