"""A command that cannot serve for a reason outside the program (a port in use, an engine
that did not load) ends with one line on stderr and status 1; a bug with its traceback."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable


class CannotServe(Exception):
    """This process cannot serve, for a reason its operator must fix (the message says which)."""


def run_command(prog: str, fn: Callable[..., Awaitable[object]], *args: Any) -> None:
    """``trio.run(fn, *args)``; a :class:`CannotServe` (alone, or all that a group of
    errors holds) ends the process with ``prog: error: message`` and status 1."""
    try:
        trio.run(fn, *args)
    except BaseException as exc:
        leaves = _leaves(exc)
        if not all(isinstance(leaf, CannotServe) for leaf in leaves):
            raise
        for reason in dict.fromkeys(map(str, leaves)):  # (each once: tasks may share a cause)
            print(f"{prog}: error: {reason}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def _leaves(exc: BaseException) -> list[BaseException]:
    if not isinstance(exc, BaseExceptionGroup):
        return [exc]
    return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
