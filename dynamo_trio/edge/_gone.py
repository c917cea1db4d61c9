"""A connection's hang-up, told to the app by the task that reads it: a scheduler pass
before ``http.disconnect`` reaches the app (its :class:`ConnectionGone` is in the request's
``scope["state"]`` under :data:`CONNECTION_GONE`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final, final

from .._ratelimit import LogLimiter

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

CONNECTION_GONE: Final = "dynamo_trio.connection_gone"
"""The key of the connection's :class:`ConnectionGone` in its ASGI state."""

_failures: Final = LogLimiter(logging.getLogger("dynamo_trio.http"))


@final
class ConnectionGone:
    """Callbacks to run, each once, in the order added, when the client ends the
    connection (its EOF, or a reset); one added after that runs at once."""

    __slots__ = ("_callbacks", "gone")

    def __init__(self) -> None:
        self._callbacks: dict[Callable[[], object], None] = {}
        self.gone = False
        """Whether the client has ended the connection."""

    def add(self, callback: Callable[[], object]) -> None:
        """Run ``callback`` when the client ends the connection (now if it has)."""
        if self.gone:
            _run(callback)
        else:
            self._callbacks[callback] = None

    def discard(self, callback: Callable[[], object]) -> None:
        """Forget ``callback`` (a request that ended no longer needs telling)."""
        self._callbacks.pop(callback, None)

    def fire(self) -> None:
        """The client has ended the connection: run the callbacks (idempotent)."""
        self.gone = True
        callbacks = tuple(self._callbacks)
        self._callbacks.clear()
        for callback in callbacks:
            _run(callback)


def connection_gone(scope: Mapping[str, Any]) -> ConnectionGone | None:
    """The :class:`ConnectionGone` of ``scope``'s connection (``None`` off the edge's server)."""
    gone = (scope.get("state") or {}).get(CONNECTION_GONE)
    return gone if isinstance(gone, ConnectionGone) else None


def _run(callback: Callable[[], object]) -> None:
    try:
        callback()
    except Exception as exc:
        _failures.error("connection-gone", "a hang-up callback %r failed", callback, exc_info=exc)
