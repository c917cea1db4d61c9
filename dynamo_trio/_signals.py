"""SIGINT and SIGTERM: the first starts a graceful shutdown, a second ends the process now."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from typing import TYPE_CHECKING, Final

import trio

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from types import FrameType

__all__ = ["on_forced_exit", "shut_down_on_signals"]

_log = logging.getLogger("dynamo_trio")

_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM)
_forced_exit_hooks: list[Callable[[], object]] = []


async def shut_down_on_signals(shutdown: Callable[[], object]) -> None:
    """Call ``shutdown()`` on the first SIGINT/SIGTERM; exit the process on the next.

    The second signal is handled by a plain Python signal handler, not by a trio
    task: it ends the process (``os._exit``, status 128 + the signal) even while a
    handler holds the event loop with CPU-bound code or waits in a thread that
    cannot be cancelled.  Run it as a task for as long as the process serves; the
    previous handlers are back when it is cancelled.
    """
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


@contextlib.contextmanager
def on_forced_exit(hook: Callable[[], object]) -> Iterator[None]:
    """Call ``hook()`` (quick, synchronous) before a second signal ends the process:
    a supervisor kills its child processes there, which would otherwise outlive it."""
    _forced_exit_hooks.append(hook)
    try:
        yield
    finally:
        _forced_exit_hooks.remove(hook)


def _exit_now(signum: int, frame: FrameType | None) -> None:
    # No logging here: the signal may have interrupted the logging machinery itself.
    os.write(2, f"second {signal.Signals(signum).name}: exiting now\n".encode())
    for hook in tuple(_forced_exit_hooks):
        with contextlib.suppress(Exception):
            hook()
    os._exit(128 + signum)
