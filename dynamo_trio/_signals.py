"""SIGINT and SIGTERM: the first starts a graceful shutdown, a second ends the process now."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from typing import TYPE_CHECKING, Final, Protocol

import trio

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator
    from types import FrameType

_log = logging.getLogger("dynamo_trio")

_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM)
_children: list[Iterable[_Killable]] = []


async def shut_down_on_signals(shutdown: Callable[[], object]) -> None:
    """Call ``shutdown()`` on the first SIGINT/SIGTERM; exit the process on the next (a plain
    handler, ``os._exit(128 + signal)``, so even a held event loop exits).  Cancelling
    restores the previous handlers."""
    with trio.open_signal_receiver(*_SIGNALS) as signals:  # restores the handlers on exit
        async for signum in signals:
            _log.info(
                "%s: shutting down gracefully (a second signal exits at once)",
                signal.Signals(signum).name,
            )
            break
        for signum in _SIGNALS:
            signal.signal(signum, _exit_now)
        shutdown()
        async for signum in signals:  # one that came with the first, before _exit_now was set
            _exit_now(signum, None)


class _Killable(Protocol):
    def kill(self) -> None: ...


@contextlib.contextmanager
def killed_on_forced_exit(children: Iterable[_Killable]) -> Iterator[None]:
    """Kill ``children`` (a supervisor's child processes, read when the signal comes)
    before a second signal ends the process: they would otherwise outlive it."""
    _children.append(children)
    try:
        yield
    finally:
        _children.remove(children)


def _exit_now(signum: int, frame: FrameType | None) -> None:
    # No logging here: the signal may have interrupted the logging machinery itself.
    os.write(2, f"second {signal.Signals(signum).name}: exiting now\n".encode())
    for children in tuple(_children):
        for child in tuple(children):
            with contextlib.suppress(Exception):
                child.kill()
    os._exit(128 + signum)
