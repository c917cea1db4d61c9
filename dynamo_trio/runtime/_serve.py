"""Serving one request: the handler runs inside its context, and the outcome goes on the wire.

The walk of a request on a worker:

1. The request plane made a :class:`~dynamo_trio.request_plane.ServerStream`
   whose context carries the caller's request id and remaining time.
2. :func:`serve_stream` enters ``context.scope(drain_grace=...)`` and drives the
   handler's async generator inside it.  Each yielded value is sent as one
   item, after waiting for a flow-control credit.
3. However the scope ends, exactly one terminal frame follows:

   ================================  =============================================
   how it ended                      terminal frame
   ================================  =============================================
   the generator returned            ``end complete``, or ``end stopped`` if the
                                     context was stopped (by the caller, or by the
                                     handler itself: a clean end, not an error)
   the context was killed            ``end killed`` with the reason (the scope was
                                     cancelled, the generator closed with ``aclose``)
   the handler raised                ``err`` with Dynamo's error type
   ================================  =============================================

The generator is always closed deterministically (``aclose`` in a ``finally``),
never left to the garbage collector, and the request is counted exactly once
in the endpoint's metrics.
"""

from __future__ import annotations

import inspect
import logging
from typing import TYPE_CHECKING, Any, Final

from .._context import CancelReason
from .._errors import (
    Cancelled,
    Disconnected,
    DynamoError,
    EngineShutdown,
    error_from_exception,
)
from ._annotated import Annotated

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from .._context import Context
    from ..metrics import EndpointMetrics, RequestTracker
    from ..request_plane import ServerStream
    from ._inflight import InflightRequests

__all__ = ["ServedEndpoint", "serve_stream"]

_log = logging.getLogger("dynamo_trio.runtime")


def _wants_context(handler: Callable[..., Any]) -> bool:
    """Dynamo's rule: pass ``context=`` iff the handler has a parameter named ``context``."""
    try:
        return "context" in inspect.signature(handler).parameters
    except (TypeError, ValueError):
        return False


class ServedEndpoint:
    """An endpoint this process serves: the handler, how to call it, its metrics."""

    def __init__(
        self,
        path: str,
        handler: Callable[..., Any],
        metrics: EndpointMetrics,
    ) -> None:
        if not callable(handler):
            raise TypeError(f"the handler for {path} is not callable: {handler!r}")
        self.path: Final = path
        self.handler: Final = handler
        self.metrics: Final = metrics
        self.wants_context: Final = _wants_context(handler)

    def open(self, request: Any, context: Context) -> AsyncIterator[Any]:
        """Call the handler and check it gave back an async iterator."""
        result = (
            self.handler(request, context=context) if self.wants_context else self.handler(request)
        )
        if not hasattr(result, "__anext__"):
            if inspect.iscoroutine(result):
                result.close()
            raise TypeError(
                f"the handler for {self.path} must be an async generator "
                f"(it returned {type(result).__name__})"
            )
        return result  # type: ignore[no-any-return]


async def serve_stream(
    stream: ServerStream,
    endpoint: ServedEndpoint,
    *,
    drain_grace: float,
    inflight: InflightRequests,
) -> None:
    """Run ``endpoint``'s handler for ``stream`` and finish the stream exactly once."""
    context = stream.context
    context.attributes["endpoint"] = endpoint.path
    context.attributes["peer"] = stream.peer
    tracker = endpoint.metrics.start_request()
    if stream.cancel_signal is not None:
        tracker.cancelled(stream.cancel_signal.value)
    stream.on_cancel_signal = lambda reason: tracker.cancelled(reason.value)
    inflight.add(context)
    error: DynamoError | None = None
    try:
        try:
            await _drive(stream, endpoint, context, drain_grace)
        except Disconnected:
            pass  # the connection is gone; the context was killed as "transport lost"
        except Exception as exc:
            if isinstance(exc, Cancelled) and context.is_stopped():
                pass  # Dynamo's convention: raising Cancelled after a stop is a clean end
            else:
                error = error_from_exception(exc)
                log = _log.info if isinstance(exc, DynamoError) else _log.exception
                log("request %s on %s failed: %s", context.id(), endpoint.path, error)
    finally:
        inflight.discard(context)
        _finish(stream, context, tracker, error)


def _finish(
    stream: ServerStream, context: Context, tracker: RequestTracker, error: DynamoError | None
) -> None:
    """Send the one terminal frame and record the one metrics outcome."""
    if error is not None:
        stream.fail(error)
        tracker.finish("error", error_type=error.error_type)
    elif context.is_killed():
        if stream.cancel_signal is CancelReason.SHUTDOWN:
            stream.fail(
                EngineShutdown(f"the worker shut down during the request ({context.reason})")
            )
        else:
            stream.end("killed", context.reason)
        tracker.finish("killed")
    elif context.is_stopped():
        stream.end("stopped", context.reason)
        # A handler that stopped its own context ended on purpose: not a cancellation.
        tracker.finish("stopped" if stream.cancel_signal is not None else "complete")
    else:
        stream.end("complete")
        tracker.finish("complete")


async def _drive(
    stream: ServerStream, endpoint: ServedEndpoint, context: Context, drain_grace: float
) -> None:
    async with context.scope(drain_grace=drain_grace):
        generator = endpoint.open(stream.payload, context)
        try:
            async for item in generator:
                if isinstance(item, Annotated):
                    await stream.send_item(
                        item.data(), id=item.id, event=item.event, comment=item.comment
                    )
                else:
                    await stream.send_item(item)
        finally:
            aclose = getattr(generator, "aclose", None)
            if aclose is not None:
                await aclose()
