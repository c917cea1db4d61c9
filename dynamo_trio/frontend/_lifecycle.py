"""One HTTP request's life: its context, its metrics, and what a hang-up does to it.

The frontend notices a client hanging up in two places (the two phases of
Dynamo's design): the view is cancelled before the response starts (every
unary request, and a streaming one before its first byte), or the SSE body is
cancelled mid-stream.  Both call :meth:`RequestLifecycle.client_gone`, which
applies the configured policy to the request's context exactly once:

* ``kill`` (the default): the context is killed with reason
  ``client disconnect``; the kill reaches the worker at once and its handler is
  cancelled mid-``await``.
* ``stop``: the context is stopped, so the worker drains (a last item with its
  usage, for billing); the request's scope kills it if it has not finished
  ``stop_grace`` seconds later.

Either way the frontend's cancellation counter goes up once, and the request is
finished in the metrics once, whichever of the HTTP side and the work side
gets there first.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

from .._context import CancelReason

if TYPE_CHECKING:
    from .._config import DisconnectPolicy
    from .._context import Context
    from ..metrics import FrontendRequestTracker

__all__ = ["RequestLifecycle"]

_log = logging.getLogger("dynamo_trio.frontend")


class RequestLifecycle:
    """Binds a request's context to its metrics tracker and the disconnect policy."""

    __slots__ = ("_delivered", "_gone", "_policy", "context", "request_kind", "tracker")

    def __init__(
        self,
        context: Context,
        tracker: FrontendRequestTracker,
        *,
        policy: DisconnectPolicy,
        request_kind: str,
    ) -> None:
        self.context: Final = context
        self.tracker: Final = tracker
        self.request_kind: Final = request_kind
        self._policy: Final = policy
        self._gone = False
        self._delivered = False

    @property
    def client_is_gone(self) -> bool:
        return self._gone

    def delivered(self) -> None:
        """The whole response was handed to the HTTP server: a later hang-up is moot."""
        self._delivered = True

    def client_gone(self) -> None:
        """The client hung up before the response was complete (idempotent, synchronous).

        A no-op once the response was delivered or the request had ended.
        """
        if self._gone or self._delivered or self.tracker.finished:
            return
        self._gone = True
        context = self.context
        _log.info(
            "request %s: the client went away (%s); %s the request",
            context.id(),
            self.request_kind,
            "stopping" if self._policy == "stop" else "killing",
        )
        self.tracker.cancelled(CancelReason.CLIENT_DISCONNECT.value)
        if self._policy == "stop":
            context.stop(CancelReason.CLIENT_DISCONNECT)
        else:
            context.kill(CancelReason.CLIENT_DISCONNECT)
