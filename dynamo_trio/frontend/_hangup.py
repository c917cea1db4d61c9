"""Hang-up detection, in one place: a request is cancelled by its client if, and only
if, the client's connection ends before the request's work is complete
(:meth:`RequestLifecycle.completed`, called before the last bytes are handed on).
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, final

from .._context import CancelReason
from .._ratelimit import LogLimiter
from ..edge import connection_gone

if TYPE_CHECKING:
    from hypercorn.typing import (
        ASGIFramework,
        ASGIReceiveCallable,
        ASGIReceiveEvent,
        ASGISendCallable,
        Scope,
    )

    from .._config import DisconnectPolicy
    from .._context import Context, ContextState
    from ..metrics import FrontendRequestTracker

_log = logging.getLogger("dynamo_trio.frontend")
_hangups: Final = LogLimiter(_log, interval=0.1, burst=50)
"""A line per hang-up, at a rate a client resetting streams on end cannot raise."""

_SERVER_ENDINGS: Final = frozenset({CancelReason.DEADLINE, CancelReason.SHUTDOWN})
"""Kill reasons that end a request on the server's side: failures, not cancellations."""


@final
@dataclass(slots=True, eq=False)
class RequestLifecycle:
    """One request's context, its metrics, and what a hang-up does to them."""

    context: Context
    tracker: FrontendRequestTracker
    policy: DisconnectPolicy
    request_kind: str
    client_is_gone: bool = field(default=False, init=False)
    """The request was cancelled by its client."""
    _completed: bool = field(default=False, init=False)

    def completed(self) -> None:
        """The work is complete: what remains is handing the last bytes on."""
        self._completed = True

    def heard_cancel(self, context: Context, state: ContextState, reason: CancelReason) -> None:
        """The context's cancel callback: a request the server ended (deadline, shutdown)
        failed, so a client leaving now cancels nothing."""
        if reason in _SERVER_ENDINGS:
            self.completed()

    def client_gone(self) -> None:
        """The client's connection ended: apply the rule (idempotent)."""
        if self.client_is_gone or self._completed or self.tracker.finished:
            return
        self.client_is_gone = True
        context, stop = self.context, self.policy == "stop"
        _hangups.log(
            logging.INFO,
            "client-gone",
            "request %s: the client went away (%s); %s the request",
            context.id(),
            self.request_kind,
            "stopping" if stop else "killing",
        )
        self.tracker.cancelled(CancelReason.CLIENT_DISCONNECT.value)
        (context.stop if stop else context.kill)(CancelReason.CLIENT_DISCONNECT)


_BOUND: Final[ContextVar[list[RequestLifecycle] | None]] = ContextVar(
    "dynamo_trio_request_lifecycles", default=None
)
"""The lifecycles tied to the HTTP request being handled (``None``: outside the guard)."""


def bind_to_request(lifecycle: RequestLifecycle) -> None:
    """Tie ``lifecycle`` to the HTTP request being handled (no-op outside the guard)."""
    bound = _BOUND.get()
    if bound is not None:
        bound.append(lifecycle)


@final
class HangUpGuard:
    """ASGI middleware: the one owner of hang-up detection (see the module docstring)."""

    def __init__(self, app: ASGIFramework) -> None:
        self.app: Final = app

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        bound: list[RequestLifecycle] = []
        token = _BOUND.set(bound)

        def client_gone() -> None:
            for lifecycle in bound:
                lifecycle.client_gone()

        # Told by the task that read the hang-up, a pass before ``http.disconnect``.
        gone = connection_gone(scope)
        if gone is not None:
            gone.add(client_gone)

        async def watched_receive() -> ASGIReceiveEvent:
            message = await receive()
            if message["type"] == "http.disconnect":
                client_gone()
            return message

        try:
            await self.app(scope, watched_receive, send)
        finally:
            if gone is not None:
                gone.discard(client_gone)
            _BOUND.reset(token)
            client_gone()
