"""The last line of defence: whatever ends an HTTP request, undelivered work is cancelled.

The view and the SSE body notice a hang-up in the two places quart lets them
(:mod:`._pipeline`), but there is a window between them: after the view has
returned its streaming response and before quart enters the body, quart sends
the response head, and a cancellation arriving there skips the body entirely,
``__aexit__`` included.  Nothing inside quart would then tell the request's
work that nobody is listening.

:class:`HangUpGuard` wraps the ASGI app.  Each HTTP request gets a slot in a
context variable (quart-trio's request tasks inherit it); the pipeline binds
the request's lifecycle to it; and the guard's ``finally``, which runs however
the request ends, calls :meth:`RequestLifecycle.client_gone`.  That is a no-op
for a response that was delivered, or a request already cancelled, so the
common paths are untouched and the window is closed.

The guard also shields the last ``send`` of each HTTP/1.x response.
Hypercorn's h11 protocol restarts a keep-alive connection's idle timer from
inside that send, and quart-trio cancels its request tasks as soon as the
response is out; unshielded, the restart is cancelled with them, and an idle
keep-alive connection then stays open for ever (one file descriptor per idle
client, and a shutdown that waits the whole graceful timeout).  Over h11 the
send only queues bytes (hypercorn already shields its socket writes), so
shielding it delays nothing; the shield still gives up after
``_LAST_SEND_SHIELD`` seconds, so it can never hold a task for ever.

HTTP/2 (reached through an ``Upgrade: h2c`` request or prior knowledge) is
never shielded: there the last send waits until hypercorn's send task has
drained the stream's buffer to the socket, and when the client has gone,
hypercorn closes the connection without ever completing that drain.  A
shielded wait for it was the "frontend ignores SIGTERM after one h2c
request" hang: the request task waited for ever, and hypercorn's shutdown
waited for the request task.  Unshielded, the client's disconnect cancels it.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING, Final

import trio

if TYPE_CHECKING:
    from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, ASGISendEvent, Scope
    from quart_trio import QuartTrio

    from ._lifecycle import RequestLifecycle

__all__ = ["HangUpGuard", "bind_to_request"]

# The longest the last send of an HTTP/1.x response is shielded from cancellation.
_LAST_SEND_SHIELD: Final = 5.0


class _Slot:
    __slots__ = ("lifecycle",)

    def __init__(self) -> None:
        self.lifecycle: RequestLifecycle | None = None


_SLOT: Final[ContextVar[_Slot | None]] = ContextVar("dynamo_trio_request_slot", default=None)


def bind_to_request(lifecycle: RequestLifecycle) -> None:
    """Tie ``lifecycle`` to the HTTP request being handled (no-op outside the guard)."""
    slot = _SLOT.get()
    if slot is not None:
        slot.lifecycle = lifecycle


class HangUpGuard:
    """ASGI middleware: an HTTP request that ends without delivering its response
    cancels its work, and a response's last send survives quart-trio's
    end-of-request cancellation (see the module docstring)."""

    def __init__(self, app: QuartTrio) -> None:
        self.app: Final = app

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        slot = _Slot()
        token = _SLOT.set(slot)

        async def send_last_shielded(message: ASGISendEvent) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                with trio.move_on_after(_LAST_SEND_SHIELD, shield=True):
                    await send(message)
            else:
                await send(message)

        shielded = scope.get("http_version", "1.1") in ("1.0", "1.1")
        try:
            await self.app(scope, receive, send_last_shielded if shielded else send)
        finally:
            _SLOT.reset(token)
            if slot.lifecycle is not None:
                slot.lifecycle.client_gone()
