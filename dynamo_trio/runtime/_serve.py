"""Serving one request: the handler runs inside its context, counted in flight, and the outcome
goes on the wire (docs/architecture.md, "Serving a request", has the table of endings)."""

from __future__ import annotations

import inspect
import logging
import math
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final

import trio

from .._contain import collapse, is_cancellation, split_live_cancellation
from .._context import CancelReason
from .._errors import (
    Cancelled,
    Disconnected,
    DynamoError,
    EngineShutdown,
    InvalidArgument,
    error_from_exception,
)
from .._logcontext import bind_request
from .._ratelimit import LogLimiter
from .._tracing import read_request_headers
from ._client import Annotated

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from .._context import Context
    from ..metrics import EndpointMetrics, RequestTracker
    from ..request_plane import ServerStream

_log = logging.getLogger("dynamo_trio.runtime")
_bugs: Final = LogLimiter(_log, interval=60.0, burst=1)


class InflightRequests:
    """The requests in flight in one process (for graceful shutdown and introspection): a set
    of contexts that can be awaited empty and listed as trees."""

    def __init__(self) -> None:
        self._contexts: set[Context] = set()
        self._idle: trio.Event | None = None

    def __len__(self) -> int:
        return len(self._contexts)

    def __iter__(self) -> Iterator[Context]:
        return iter(tuple(self._contexts))

    def kill_all(self, reason: CancelReason) -> None:
        for context in self:
            context.kill(reason)

    @contextmanager
    def track(self, context: Context) -> Iterator[Context]:
        """Count ``context`` as in flight for the duration of the block."""
        self._contexts.add(context)
        try:
            yield context
        finally:
            self._contexts.discard(context)
            if not self._contexts and self._idle is not None:
                self._idle.set()
                self._idle = None

    async def wait_empty(self) -> None:
        """Return once no request is in flight."""
        while self._contexts:
            if self._idle is None:
                self._idle = trio.Event()
            await self._idle.wait()
        await trio.lowlevel.checkpoint()

    def snapshot(self) -> list[dict[str, Any]]:
        """Each in-flight request as a tree (``Context.snapshot()``), oldest first."""
        return [
            context.snapshot()
            for context in sorted(self._contexts, key=lambda context: context.created_at)
        ]


class ServedEndpoint:
    """An endpoint this process serves: the handler, how to call it, its metrics."""

    def __init__(
        self,
        path: str,
        handler: Callable[..., Any],
        metrics: EndpointMetrics,
        *,
        graceful_shutdown: bool = True,
    ) -> None:
        if not callable(handler):
            raise TypeError(f"the handler for {path} is not callable: {handler!r}")
        self.path: Final = path
        self.handler: Final = handler
        self.metrics: Final = metrics
        try:  # Dynamo's rule: pass ``context=`` iff the handler has a ``context`` parameter
            wants_context = "context" in inspect.signature(handler).parameters
        except (TypeError, ValueError):
            wants_context = False
        self.wants_context: Final = wants_context
        self.graceful_shutdown: Final = graceful_shutdown  # else a shutdown kills its requests


async def serve_stream(
    stream: ServerStream,
    endpoint: ServedEndpoint,
    *,
    drain_grace: float,
    inflight: InflightRequests,
    on_exit_request: Callable[[], None],
) -> None:
    """Run ``endpoint``'s handler for ``stream`` and finish the stream exactly once, counted
    once; whatever the handler raises ends this stream only.  Only a live cancellation
    propagates; ``KeyboardInterrupt`` or ``SystemExit`` calls ``on_exit_request``."""
    context = stream.context
    trace, metadata = read_request_headers(stream.headers)
    context._set_trace(trace)
    if metadata:
        context.metadata = metadata
    context.attributes.update(endpoint=endpoint.path, peer=stream.peer)
    tracker = endpoint.metrics.start_request()
    if stream.cancel_signal is not None:
        tracker.cancelled(stream.cancel_signal.value)
    stream.on_cancel_signal = lambda reason: tracker.cancelled(reason.value)
    error: DynamoError | None = None
    with inflight.track(context), bind_request(context):  # log lines name it and its trace
        try:  # contain(), written out; the stream's task nursery hosts the watcher
            await context.run(
                _relay,
                stream,
                endpoint,
                context,
                drain_grace=drain_grace,
                watchers=stream.task_nursery,
            )
        except BaseException as exc:
            cancelled, escaped = split_live_cancellation(exc)
            if escaped is not None:
                error = _outcome_of(escaped, context, endpoint.path, on_exit_request)
            if cancelled is not None:
                raise cancelled from None
        finally:
            _finish(stream, context, tracker, error)


def _outcome_of(
    exc: BaseException, context: Context, path: str, on_exit_request: Callable[[], None]
) -> DynamoError | None:
    """The error a handler's exception ends its stream with; ``None`` for a clean end."""
    exc = collapse(exc) or exc
    if isinstance(exc, Disconnected):
        return None  # the connection is gone; the context was killed as "transport lost"
    if is_cancellation(exc) or isinstance(exc, _StaleCancelled):
        if context.is_stopped():
            return None  # cancelled as asked: the stream ends stopped/killed, counted once
        _log.info("request %s on %s: the handler cancelled itself", context.id(), path)
        caused_by = "Cancelled" if isinstance(exc, _StaleCancelled) else _name(exc)
        return Cancelled("the handler cancelled the request", caused_by=caused_by)
    if isinstance(exc, Cancelled) and context.is_stopped():
        return None  # Dynamo's convention: raising Cancelled after a stop is a clean end
    if isinstance(exc, KeyboardInterrupt | SystemExit):
        _log.warning(
            "request %s on %s: the handler raised %s; shutting the worker down gracefully",
            context.id(),
            path,
            _name(exc),
        )
        on_exit_request()
        return EngineShutdown("the worker is shutting down", caused_by=_name(exc))
    error = error_from_exception(exc)
    if isinstance(exc, DynamoError) or isinstance(error, InvalidArgument):
        _log.info("request %s on %s failed: %s", context.id(), path, error)
    else:  # a handler's own failure: one traceback per endpoint and type per interval
        _bugs.error(
            f"{path} {_name(exc)}",
            "request %s on %s failed: %s",
            context.id(),
            path,
            error,
            exc_info=exc,
        )
    return error


def _name(exc: BaseException) -> str:
    return type(exc).__name__


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


class _StaleCancelled(Exception):
    """A stale :class:`trio.Cancelled` from the handler (its way of saying "cancelled"),
    carried out of the context's nursery, which would absorb it as its own."""


async def _relay(stream: ServerStream, endpoint: ServedEndpoint, context: Context) -> None:
    """The handler's items onto the stream (inside the context's scope)."""
    request, handler = stream.payload, endpoint.handler
    generator = handler(request, context=context) if endpoint.wants_context else handler(request)
    if not hasattr(generator, "__anext__"):
        if inspect.iscoroutine(generator):
            generator.close()
        raise TypeError(
            f"the handler for {endpoint.path} must be an async generator "
            f"(it returned {type(generator).__name__})"
        )
    try:
        async for item in generator:
            if isinstance(item, Annotated):
                await stream.send_item(
                    item.data(), id=item.id, event=item.event, comment=item.comment
                )
            else:
                await stream.send_item(item)
    except trio.Cancelled as exc:
        if trio.current_effective_deadline() == -math.inf:
            raise  # a live cancellation: the context's kill, or a scope around it
        raise _StaleCancelled(str(exc)) from exc
    finally:
        aclose = getattr(generator, "aclose", None)
        if aclose is not None:
            await aclose()
