"""Containing whatever a per-request task raises, without ever swallowing a live cancellation.

A *live* :class:`trio.Cancelled` (an enclosing scope cancelling the task now) is
re-raised; a *stale* one, raised after leaving its scope, is contained like
``asyncio.CancelledError``.
"""

from __future__ import annotations

import math
import sys
from contextlib import contextmanager
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


def split_live_cancellation(
    exc: BaseException,
) -> tuple[BaseException | None, BaseException | None]:
    """Split ``exc`` into ``(live cancellation to re-raise, failure to contain)``, either
    of them ``None``; call it in the task that caught ``exc``."""
    if trio.current_effective_deadline() != -math.inf:
        return None, exc  # nothing is cancelling this task: every Cancelled in exc is stale
    if isinstance(exc, trio.Cancelled):
        return exc, None
    if isinstance(exc, BaseExceptionGroup):
        cancelled, rest = exc.split(trio.Cancelled)
        return cancelled, collapse(rest)
    return None, exc


@contextmanager
def contain(on_escape: Callable[[BaseException], None]) -> Iterator[None]:
    """Run the block: a live cancellation propagates, any other failure goes to ``on_escape``."""
    try:
        yield
    except BaseException as exc:
        cancelled, escaped = split_live_cancellation(exc)
        if escaped is not None:
            on_escape(escaped)
        if cancelled is not None:
            raise cancelled from None


def collapse(exc: BaseException | None) -> BaseException | None:
    """Unwrap exception groups that hold a single exception."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def is_cancellation(exc: BaseException) -> bool:
    """Whether ``exc`` is a (contained) cancellation: ``trio.Cancelled`` or asyncio's."""
    asyncio = sys.modules.get("asyncio")  # code that raises asyncio's error has imported it
    return isinstance(exc, trio.Cancelled) or (
        asyncio is not None and isinstance(exc, asyncio.CancelledError)
    )
