"""A request's walk through the frontend: the view answers, a producer does the work
(docs/architecture.md, "A request in the frontend"); :meth:`Pipeline._failed` decides
every ending."""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, cast

import trio

from .._contain import contain, is_cancellation
from .._context import CancelReason, Context
from .._errors import DynamoError, EngineShutdown, ResponseTimeout
from .._tracing import TraceContext
from ..llm import (
    BinaryBody,
    Generation,
    RequestError,
    bounded_message,
    keepalive_comment,
    status_for_error,
)
from ..metrics import FrontendMetrics, RequestType
from ._apis import TextApi
from ._body import Reply
from ._hangup import RequestLifecycle, bind_to_request
from ._models import ModelRegistry, StreamFaults
from ._turns import Turns

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from .._config import FrontendConfig
    from ..runtime import DistributedRuntime
    from ._apis import Api, MediaApi, StreamBody
    from ._models import ModelRoute

_log = logging.getLogger("dynamo_trio.frontend")


@dataclass(frozen=True)
class JsonReply:
    """Answer with this JSON object and status."""

    status: int
    payload: dict[str, object]


@dataclass(frozen=True)
class StreamReply:
    """Answer with this stream, of this content type."""

    body: Reply
    content_type: str


class Pipeline:
    """Runs frontend requests: model lookup, worker call, shaping, cancellation."""

    def __init__(
        self, runtime: DistributedRuntime, config: FrontendConfig, nursery: trio.Nursery
    ) -> None:
        self.runtime: Final = runtime
        self.config: Final = config
        self.metrics: Final = FrontendMetrics(runtime.registry)
        self.models: Final = ModelRegistry(runtime, config.namespace, config.router_mode)
        # (only a text request moves after its first item: see ModelStream)
        self._faults: Final = StreamFaults(
            migration_limit=config.migration_limit,
            idle_timeout=config.backend_stream_timeout or None,
            on_migration=self.metrics.migrated,
        )
        self._nursery = nursery
        self.turns: Final = Turns(
            config.stream_writes_per_pass, nursery, budget=config.stream_pass_budget_ms / 1000
        )
        self._contexts: set[Context] = set()
        self._drained: trio.Event | None = None
        self.shutting_down = False  # new requests are refused, /health is 503
        self.exit_requested: Final = trio.Event()  # see request_exit

    @property
    def in_flight(self) -> int:
        return len(self._contexts)

    async def start(self) -> None:
        await self.models.start()

    def request_exit(self) -> None:
        """Ask the frontend to shut down gracefully (as on SIGTERM)."""
        self.exit_requested.set()

    def begin_drain(self) -> None:
        """Refuse new requests (503); the ones in flight go on (see :meth:`wait_drained`)."""
        self.shutting_down = True

    async def wait_drained(self) -> None:
        """Return once no request is in flight (after :meth:`begin_drain`)."""
        while self._contexts:
            self._drained = trio.Event()
            await self._drained.wait()

    def end_all(self) -> None:
        """Kill every request still in flight (reason ``shutdown``)."""
        for context in tuple(self._contexts):
            context.kill(CancelReason.SHUTDOWN)

    async def serve(
        self,
        api: TextApi | MediaApi,
        payload: object,
        request_id: str,
        trace: TraceContext | None = None,
        *,
        deadline: float | None = None,
    ) -> JsonReply | BinaryBody | StreamReply:
        """Serve one request to a generating route: unary, or streamed (a text API's
        events, or the body a media API opens), the stream's body saying how a failure
        ends it (:meth:`~._apis.StreamBody.fail`); ``deadline`` in ``time.monotonic()`` seconds."""
        if self.shutting_down:
            raise RequestError(
                503,
                "The frontend is shutting down and takes no new requests; send it again.",
                code="service_unavailable",
            )
        request = api.parse(payload)
        route = self.models.route(request.model, api.model_type)
        text = isinstance(api, TextApi)
        if text:
            request.check_limits(route.card)
        # (an embeddings request has no ``stream``, and its API no ``open_stream``)
        stream = api.open_stream is not None and request.stream
        request_type: RequestType = "stream" if stream else "unary"
        context = Context(request_id, trace=trace if trace is not None else TraceContext.new())
        if deadline is not None:
            context.set_deadline(deadline)
        model, label = request.model, api.label
        context.attributes.update(model=model, route=label, kind=request_type)
        tracker = self.metrics.start_request(model, label, request_type)
        lifecycle = RequestLifecycle(
            context, tracker, self.config.on_disconnect, f"{label} {request_type}"
        )
        context.add_cancel_callback(lifecycle.heard_cancel)
        bind_to_request(lifecycle)
        body: StreamBody | None = None
        if stream and isinstance(api, TextApi):
            body = text_body = api.body(api.open_stream(request, request_id), tracker)
            produce: Any = self._stream
            args: tuple[Any, ...] = (text_body, text_body.feed_batch, request, route)
        elif stream and api.open_stream is not None:
            body = media = api.open_stream(request, request_id)

            def encode(batch: list[Any]) -> bytes:
                return b"".join(media.feed(item) for item in batch)

            produce, args = self._stream, (media, encode, request, route)
        else:
            produce, args = (self._unary_text if text else self._unary_media), (api, request, route)
        keepalive = self.config.keepalive_interval if body is not None and body.keepalive else 0.0
        reply = Reply(keepalive=keepalive)
        reply.stream_failure = None if body is None else body.fail
        self._nursery.start_soon(self._produce, lifecycle, reply, api, produce, *args)
        # Cancelled here: the client left (the HangUpGuard applied the hang-up rule).
        first = await reply.first()
        if first is None:  # nothing was produced: the request was cancelled on our side
            return JsonReply(503, api.error_body(503, "the frontend is shutting down"))
        if isinstance(first, bytes) and body is not None:
            return StreamReply(reply, body.content_type)
        return cast("JsonReply | BinaryBody", first)

    async def _produce(
        self, lifecycle: RequestLifecycle, reply: Reply, api: Api, produce: Any, *args: Any
    ) -> None:
        """The producer's side, a task of the frontend's nursery: the request's work, in
        its scope; whatever it raises ends this request only."""
        context = lifecycle.context
        grace = self.config.stop_grace if self.config.on_disconnect == "stop" else None
        failures: list[BaseException] = []
        with self.in_flight_request(context):
            try:
                with self.runtime.track(context):
                    try:
                        with contain(failures.append):
                            async with context.scope(drain_grace=grace):
                                await produce(reply, lifecycle, *args)
                        failure = failures[0] if failures else None
                        status, error_type = await self._failed(failure, reply, lifecycle, api)
                    finally:
                        reply.close()
                lifecycle.tracker.finish(status, error_type)
            finally:
                lifecycle.tracker.finish("error", "cancelled")  # a no-op unless the above ran
                # (the request's one reference cycle: context -> callback -> lifecycle)
                context.remove_cancel_callback(lifecycle.heard_cancel)

    @contextmanager
    def in_flight_request(self, context: Context) -> Iterator[None]:
        """Count ``context`` among the requests a drain waits for, for the block."""
        self._contexts.add(context)
        try:
            yield
        finally:
            self._contexts.discard(context)
            if not self._contexts and self._drained is not None:
                self._drained.set()

    async def _failed(
        self, exc: BaseException | None, reply: Reply, lifecycle: RequestLifecycle, api: Api
    ) -> tuple[Any, str | None]:
        """How the request ended (``exc``: what its work raised), told to the client: the one
        place a failure becomes an HTTP status (``api``'s error body), an error event, a metric."""
        context = lifecycle.context
        if (exc is None or is_cancellation(exc)) and context.is_killed():
            reason = None if lifecycle.client_is_gone else context.reason  # the server's?
            if reason is CancelReason.DEADLINE:
                exc = ResponseTimeout("The request did not complete within its deadline.")
            elif reason is CancelReason.SHUTDOWN:
                exc = EngineShutdown(
                    "The frontend shut down before the request completed; send it again."
                )
            elif exc is None:
                return "error", "cancelled"
        if exc is None:
            return "success", None
        if isinstance(exc, DynamoError):
            status = status_for_error(exc)
            message = bounded_message(
                exc.message or f"{exc.error_type or 'an error'} without a message"
            )
            if not context.is_stopped():
                _log.warning("request %s failed: %s: %s", context.id(), exc.error_type, message)
            error_type = exc.error_type
        elif is_cancellation(exc) and context.is_stopped():
            return "error", "cancelled"  # cancelled as asked, in its own words
        else:
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                _log.warning(
                    "request %s raised %s: shutting the frontend down gracefully",
                    context.id(),
                    type(exc).__name__,
                )
                self.request_exit()
            else:
                # A bug, not a client's doing: answer 500 and keep serving everyone else.
                _log.error(
                    "request %s failed unexpectedly",
                    context.id(),
                    exc_info=(type(exc), exc, exc.__traceback__),
                )
            status, message, error_type = 500, "Internal server error.", "internal"
        lifecycle.completed()  # a failed request is over: a hang-up now cancels nothing
        if reply.sent_any and reply.stream_failure is not None:
            await reply.send(reply.stream_failure(status, message))
        else:
            await reply.send(JsonReply(status, api.error_body(status, message, exc)))
        return "error", error_type

    async def _unary_text(
        self,
        reply: Reply,
        lifecycle: RequestLifecycle,
        api: TextApi,
        request: Any,
        route: ModelRoute,
    ) -> None:
        generation = Generation()
        tracker = lifecycle.tracker
        async with await route.call(request.to_engine(), lifecycle.context, self._faults) as stream:
            while batch := await stream.receive_batch():
                counted = generation.output_tokens
                try:
                    for data in batch:
                        generation.feed(data)
                finally:
                    tracker.tokens(generation.output_tokens - counted)
        lifecycle.completed()
        await reply.send(JsonReply(200, api.unary(request, lifecycle.context.id(), generation)))

    async def _stream(
        self,
        reply: Reply,
        lifecycle: RequestLifecycle,
        body: StreamBody,
        encode: Callable[[list[Any]], bytes],
        request: Any,
        route: ModelRoute,
    ) -> None:
        """Send the model's batches, ``encode``d, to ``reply``: the first from here, then
        pulled by the body itself (:meth:`Reply.lend`), then whatever a departed body left
        (all but the first take turns: :mod:`._turns`); then ``body``'s end."""
        turns = self.turns

        async def pull() -> bytes | None:
            while batch := await stream.receive_batch():
                await turns.take()
                if data := encode(batch):
                    return data
            return keepalive_comment() if batch is None else None  # (a nudge, or the end)

        async with await route.call(request.to_engine(), lifecycle.context, self._faults) as stream:
            batch = await stream.receive_batch()  # (nothing nudges before the lending)
            data = (encode(batch) or await pull()) if batch else None  # no turn for the first
            if data is not None:
                await reply.send(data)
                await reply.lend(pull, stream.nudge)
                while (data := await pull()) is not None:  # what a departed body left
                    await reply.send(data)
        last = body.finish()
        lifecycle.completed()  # before the last bytes go: a hang-up after this cancels nothing
        await reply.send(last)

    async def _unary_media(
        self,
        reply: Reply,
        lifecycle: RequestLifecycle,
        api: MediaApi,
        request: Any,
        route: ModelRoute,
    ) -> None:
        started = time.monotonic()
        items: list[object] = []
        async with await route.call(request.to_engine(), lifecycle.context, self._faults) as stream:
            while batch := await stream.receive_batch():
                items.extend(batch)
        answer = api.unary(request, lifecycle.context.id(), items, started)
        lifecycle.completed()
        await reply.send(answer if isinstance(answer, BinaryBody) else JsonReply(200, answer))
