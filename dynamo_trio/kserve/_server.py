"""The KServe v2 gRPC server of the frontend: ``inference.GRPCInferenceService`` as ASGI.

One call is one :class:`_Call`: in the call's nursery a reader deframes the request's
DATA and watches for the client leaving while the handler runs.  Each inference has its
own :class:`~dynamo_trio.Context` (the call's ``grpc-timeout`` its deadline), to which a
client's cancel applies the frontend's hang-up rule, counted once under
``endpoint="tensor"``; failures end a call through :func:`~._status.status_for`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, final

import trio

from .._contain import split_live_cancellation
from .._context import CancelReason, Context, ContextState
from .._tracing import (
    TRACEPARENT,
    TRACESTATE,
    X_DYNAMO_REQUEST_ID,
    X_REQUEST_ID,
    TraceContext,
    request_ids,
)
from ..edge import answer_lifespan
from ..edge._h2 import send_whole_response
from ..frontend._hangup import RequestLifecycle
from ._messages import DATA_TYPES, SERVICE, message_class
from ._status import GrpcError, Status, status_for
from ._tensors import kserve_dtype, response_message, worker_request
from ._wire import ACCEPT_ENCODING, Deframer, WireError, encode_grpc_message, frame, parse_timeout

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, Scope

    from ..discovery import ModelCard, TensorModelConfig, TensorSpec
    from ..frontend._models import ModelRoute
    from ..frontend._pipeline import Pipeline

_log = logging.getLogger("dynamo_trio.kserve")

_ModelInferRequest: Final = message_class("ModelInferRequest")
_ModelInferResponse: Final = message_class("ModelInferResponse")
_ModelStreamInferResponse: Final = message_class("ModelStreamInferResponse")

_GRPC_HEADERS: Final = [
    (b"content-type", b"application/grpc"),
    (b"grpc-accept-encoding", ACCEPT_ENCODING.encode()),
]
_OK_TRAILERS: Final = [(b"grpc-status", b"0")]

MAX_STREAM_INFERENCES: Final = 1024
"""Inferences one ``ModelStreamInfer`` call may have running; a request beyond that is
answered ``RESOURCE_EXHAUSTED`` at once (the call's reader is never held up, so it always
sees the client leave)."""

STREAM_BUDGET: Final = 4
"""The bytes of requests one ``ModelStreamInfer`` call may have running, in largest
messages (the frontend's ``max_body_size``); one request is always let run."""

PROCESS_BUDGET: Final = 16
"""The bytes of requests all the calls of the process may hold, in largest messages, each
from its message's prefix (before its body is buffered): a unary call's to the call's end,
a streamed request's until its inference ends or it is refused.  A message beyond is
refused at once and holds nothing: it ends its call ``RESOURCE_EXHAUSTED``."""


@final
class _Budget:
    """Bytes held against a bound; whatever is held, one more request is let in alone."""

    __slots__ = ("held", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def take(self, size: int) -> bool:
        """Hold ``size`` more bytes, or refuse them (``False``, nothing held)."""
        if self.held and self.held + size > self.limit:
            return False
        self.held += size
        return True

    def give(self, size: int) -> None:
        self.held -= size


@final
class _Call:
    """One gRPC call: its messages in, its responses out, and whether its client left."""

    def __init__(
        self,
        receive: ASGIReceiveCallable,
        send: ASGISendCallable,
        max_size: int,
        encoding: str,
        budget: _Budget,
    ):
        self._receive = receive
        self._send = send
        self._budget = budget
        self.held = 0
        """The bytes of ``budget`` this call holds: its messages, from their prefixes."""
        self._deframer = Deframer(max_size, encoding=encoding, admit=self._admit)
        self._sending = trio.Lock()
        self._started = False
        self._ended = False
        self.gone = False
        """The client ended the call (``RST_STREAM``, a dropped connection)."""
        self.live: set[RequestLifecycle] = set()
        """The call's inferences still running (the hang-up rule applies to them)."""
        self.running = 0
        """Inferences of a ``ModelStreamInfer`` call started and not yet ended."""
        self.running_bytes = 0
        """The size of their requests."""
        self._incoming, self.messages = trio.open_memory_channel[bytes | WireError](0)
        self.deadline: float | None = None
        """When (``time.monotonic()``) the call's ``grpc-timeout`` ends it, if it has one."""
        self.request_id: str | None = None
        """The id the client gave the call (``x-dynamo-request-id``, ``x-request-id``)."""
        self.trace: TraceContext | None = None
        """The call's trace (from :meth:`identify`): a span under the client's
        ``traceparent``, or a new trace."""

    def _admit(self, size: int) -> None:
        if size <= 0:  # a message that inflated to less than it took
            self.give(-size)
        elif self._budget.take(size):
            self.held += size
        else:
            raise WireError(
                f"the calls of this server hold {self._budget.held} bytes of requests; "
                f"{size} more would pass its bound of {self._budget.limit}",
                too_large=True,
            )

    def give(self, size: int) -> None:
        """Give back ``size`` of the bytes the call holds (a streamed request's)."""
        self._budget.give(size)
        self.held -= size

    def release(self) -> None:
        """Give back all the call holds of the process's budget (its end)."""
        self.give(self.held)

    def identify(self, headers: dict[str, bytes]) -> None:
        """Read the call's id and trace from its metadata, as the HTTP routes read theirs.

        Raises:
            InvalidRequestId: an id that is not one (``INVALID_ARGUMENT``).
        """

        def text(name: str) -> str | None:
            value = headers.get(name)
            return None if value is None else value.decode("latin-1")

        ids = request_ids(text(X_REQUEST_ID), text(X_DYNAMO_REQUEST_ID))
        if ids.source != "generated":
            self.request_id = ids.request_id
        self.trace = TraceContext.continued(
            text(TRACEPARENT), text(TRACESTATE), x_request_id=ids.x_request_id
        )

    async def read(self, cancel: trio.CancelScope | None) -> None:
        """Take the request apart into messages until its end.

        On the client's end of the call, apply the hang-up rule to every live
        inference and end the request's messages; then cancel ``cancel`` (the
        call), or with ``None`` (the stop policy) let the inferences drain, as
        their contexts' drain grace allows.
        """
        incoming = self._incoming
        reading = True  # until the request's end, or a framing error
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self.gone = True
                for lifecycle in tuple(self.live):
                    lifecycle.client_gone()
                incoming.close()
                if cancel is not None:
                    cancel.cancel()
                return
            if message["type"] != "http.request" or not reading:
                continue  # after a framing error or the end: only the disconnect matters
            try:
                for body in self._deframer.feed(message.get("body", b"")):
                    await incoming.send(body)
                if not message.get("more_body", False):
                    if self._deframer.pending:
                        raise WireError("the request ended inside a message")
                    reading = False
                    incoming.close()
            except WireError as exc:
                reading = False
                await incoming.send(exc)
                incoming.close()

    async def respond(self, message: Any) -> None:
        """Send one response message."""
        await self._respond(frame(message.SerializeToString()))

    async def _respond(self, data: bytes) -> None:
        async with self._sending:
            await self._start()
            await self._send({"type": "http.response.body", "body": data, "more_body": True})

    async def answer(self, message: Any) -> None:
        """Send a unary call's one response message, then end the call ``OK``.

        In the usual case (nothing sent yet, a response one HTTP/2 frame takes) the
        edge sends it whole, in one write; otherwise as :meth:`respond` then
        :meth:`finish` send it.
        """
        if self.gone:
            return
        data = frame(message.SerializeToString())
        if not self._started and await send_whole_response(
            self._send, _GRPC_HEADERS, data, _OK_TRAILERS
        ):
            self._started = self._ended = True
            return
        await self._respond(data)
        await self.finish(Status.OK)

    async def finish(self, status: Status, text: str = "") -> None:
        """End the call with ``status`` (a no-op once the client left, or it ended)."""
        if self.gone or self._ended:
            return
        self._ended = True
        trailers = [(b"grpc-status", str(int(status)).encode())]
        if text:
            trailers.append((b"grpc-message", encode_grpc_message(text).encode("ascii")))
        async with self._sending:
            await self._start()
            await self._send({"type": "http.response.body", "body": b"", "more_body": False})
            await self._send(
                {"type": "http.response.trailers", "headers": trailers, "more_trailers": False}
            )

    async def _start(self) -> None:
        if not self._started:
            self._started = True
            await self._send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": _GRPC_HEADERS,
                    "trailers": True,
                }
            )


async def _one_message(call: _Call) -> bytes:
    """A unary call's only message.

    Raises:
        GrpcError: none, or more than one; WireError: a malformed request.
    """
    found: bytes | None = None
    async for message in call.messages:
        if isinstance(message, WireError):
            raise message
        if found is not None:
            raise GrpcError(Status.INVALID_ARGUMENT, "a unary call takes one message, not more")
        found = message
    if found is None:
        raise GrpcError(Status.INVALID_ARGUMENT, "a unary call takes one message, not none")
    return found


@dataclass(frozen=True, slots=True)
class _Method:
    """One unary method of the service: its request type, and what answers it
    (given the call and its request)."""

    request: str
    respond: Callable[[KServeApp, _Call, Any], Awaitable[Any]]


@final
class KServeApp:
    """The ASGI app of the gRPC port (see the module docstring)."""

    def __init__(self, pipeline: Pipeline, *, max_message_size: int) -> None:
        self._pipeline = pipeline
        self._max_message_size = max_message_size
        self._budget = _Budget(PROCESS_BUDGET * max_message_size)

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # a WebSocket: refused by ending it unanswered
        try:
            await self._serve(scope, receive, send)
        except BaseException as exc:
            live, failure = split_live_cancellation(exc)
            if live is not None:
                raise live from None
            _log.error("a gRPC call failed unexpectedly", exc_info=failure)

    async def _serve(
        self, scope: Any, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if scope["http_version"] != "2":
            await _plain(send, 505, b"This port serves gRPC: HTTP/2 with prior knowledge.\n")
            return
        headers = {name.decode("latin-1"): value for name, value in scope["headers"]}
        content_type = headers.get("content-type", b"")
        if scope["method"] != "POST" or not content_type.startswith(b"application/grpc"):
            await _plain(send, 415, b"Send gRPC: POST with content-type application/grpc.\n")
            return
        encoding = headers.get("grpc-encoding", b"identity").decode("latin-1")
        call = _Call(receive, send, self._max_message_size, encoding, self._budget)
        draining = self._pipeline.config.on_disconnect == "stop"
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(call.read, None if draining else nursery.cancel_scope)
                try:
                    call.deadline = self._deadline(headers.get("grpc-timeout"))
                    call.identify(headers)
                    await self._dispatch(call, scope["path"])
                except BaseException as exc:
                    status, text = _failed(exc, "a gRPC call")
                    await call.finish(status, text)
                nursery.cancel_scope.cancel()
        finally:
            call.release()

    def _deadline(self, value: bytes | None) -> float | None:
        """When (``time.monotonic()``) a call with ``grpc-timeout: value`` ends; the
        frontend's ``max_request_timeout`` bounds it, as it bounds HTTP requests'."""
        limit = self._pipeline.config.max_request_timeout
        seconds = None if value is None else parse_timeout(value.decode("latin-1"))
        if limit and (seconds is None or seconds > limit):
            seconds = limit
        return None if seconds is None else time.monotonic() + seconds

    async def _dispatch(self, call: _Call, path: str) -> None:
        if path == f"/{SERVICE}/ModelStreamInfer":
            await self._stream_infer(call)
            return
        service, _, name = path.lstrip("/").partition("/")
        method = _METHODS.get(name) if service == SERVICE else None
        if method is None:
            raise GrpcError(Status.UNIMPLEMENTED, f"no method {path[:100]!r} is served")
        request = message_class(method.request).FromString(await _one_message(call))
        await call.answer(await method.respond(self, call, request))

    # ------------------------------------------------------------------ metadata

    async def _server_live(self, call: _Call, request: Any) -> Any:
        return message_class("ServerLiveResponse")(live=True)

    async def _server_ready(self, call: _Call, request: Any) -> Any:
        return message_class("ServerReadyResponse")(ready=not self._pipeline.shutting_down)

    async def _model_ready(self, call: _Call, request: Any) -> Any:
        ready = bool(self._pipeline.models.cards(request.name, "tensor"))
        return message_class("ModelReadyResponse")(ready=ready)

    def _card(self, name: str) -> tuple[ModelCard, TensorModelConfig]:
        card = self._route(name).card
        if card.tensor_model_config is None:
            raise GrpcError(Status.INTERNAL, f"the model {name!r} has no tensor_model_config")
        return card, card.tensor_model_config

    def _route(self, name: str) -> ModelRoute:
        return self._pipeline.models.route(name, "tensor")

    async def _model_metadata(self, call: _Call, request: Any) -> Any:
        card, config = self._card(request.name)
        response = message_class("ModelMetadataResponse")(
            name=card.name, versions=["1"], platform="dynamo"
        )
        for specs, into in ((config.inputs, response.inputs), (config.outputs, response.outputs)):
            for spec in specs:
                into.add(name=spec.name, datatype=_kserve_name(spec), shape=list(spec.shape))
        return response

    async def _model_config(self, call: _Call, request: Any) -> Any:
        card, config = self._card(request.name)
        response = message_class("ModelConfigResponse")()
        model = response.config
        model.name = card.name
        model.platform = model.backend = "dynamo"
        for specs, into in ((config.inputs, model.input), (config.outputs, model.output)):
            for spec in specs:
                into.add(name=spec.name, data_type=_enum(spec), dims=list(spec.shape))
        return response

    # ------------------------------------------------------------------ inference

    async def _infer(self, call: _Call, request: Any) -> Any:
        """``ModelInfer``: exactly one response, or the call's status."""
        responses: list[Any] = []

        async def keep(response: Any) -> None:
            if responses:
                raise GrpcError(Status.INTERNAL, "the worker answered a unary infer more than once")
            responses.append(response)

        await self._run_inference(call, request, "unary", keep)
        if not responses:
            raise GrpcError(Status.INTERNAL, "the worker answered the infer with nothing")
        return responses[0]

    async def _stream_infer(self, call: _Call) -> None:
        """``ModelStreamInfer``: each request an inference of its own, run beside the
        others; each response (or ``error_message``) tagged with its request's id.

        Each request starts its inference at once, up to :data:`MAX_STREAM_INFERENCES`
        running and :data:`STREAM_BUDGET` largest messages of requests; one beyond is
        refused at once.  So the call's reader is never held up (it always sees the
        client leave), and a call holds a bounded amount of memory.
        """
        failure: WireError | None = None
        async with trio.open_nursery() as inferences:
            async for message in call.messages:
                if isinstance(message, WireError):
                    failure = message
                    break
                inferences.start_soon(self._stream_one, call, message)
        if failure is not None:
            raise failure
        await call.finish(Status.OK)

    async def _stream_one(self, call: _Call, data: bytes) -> None:
        request_id = ""
        # Admitted or refused before this task first yields, and a refused request holds
        # nothing: so what another request finds running never counts one being refused.
        # (The call has held its bytes of the process's budget since its prefix.)
        budget = STREAM_BUDGET * self._max_message_size
        too_many = call.running >= MAX_STREAM_INFERENCES
        too_large = call.running > 0 and call.running_bytes + len(data) > budget
        admitted = not (too_many or too_large)
        if admitted:
            call.running += 1
            call.running_bytes += len(data)
        else:
            call.give(len(data))
        try:
            request = _ModelInferRequest.FromString(data)
            request_id = request.id
            if too_many:
                raise GrpcError(
                    Status.RESOURCE_EXHAUSTED,
                    f"{MAX_STREAM_INFERENCES} inferences are running on this call already",
                )
            if too_large:
                raise GrpcError(
                    Status.RESOURCE_EXHAUSTED,
                    f"the requests running on this call would hold over {budget} bytes",
                )

            async def send(response: Any) -> None:
                await call.respond(_ModelStreamInferResponse(infer_response=response))

            await self._run_inference(call, request, "stream", send)
        except BaseException as exc:
            status, text = _failed(exc, "a streamed infer")
            if not call.gone:
                error = _ModelStreamInferResponse(
                    error_message=f"{status.name}: {text}",
                    infer_response=_ModelInferResponse(id=request_id),
                )
                await call.respond(error)
        finally:
            if admitted:
                call.running -= 1
                call.running_bytes -= len(data)
                call.give(len(data))

    async def _run_inference(
        self, call: _Call, request: Any, request_type: Any, send: Callable[[Any], Awaitable[None]]
    ) -> None:
        """One inference: validated, sent to a worker under its own context, its
        responses passed to ``send``; counted and ended as the module docstring says.

        Raises:
            GrpcError and the frontend's errors: the inference failed.
        """
        pipeline = self._pipeline
        if pipeline.shutting_down:
            raise GrpcError(Status.UNAVAILABLE, "the frontend is shutting down")
        route = self._route(request.model_name)
        config = route.card.tensor_model_config
        inputs = None if config is None else {spec.name for spec in config.inputs}
        worker_input, raw = worker_request(request, inputs)
        # A unary call's inference takes the call's id; a stream's each have their own.
        context_id = call.request_id if request_type == "unary" else None
        context = Context(context_id, trace=call.trace)
        if call.deadline is not None:
            context.set_deadline(call.deadline)
        context.attributes.update(model=route.name, route="tensor", kind=request_type)
        tracker = pipeline.metrics.start_request(route.name, "tensor", request_type)
        lifecycle = RequestLifecycle(
            context,
            tracker,
            policy=pipeline.config.on_disconnect,
            request_kind=f"tensor {request_type}",
        )

        complete = False  # the worker's responses have all been passed on

        def heard(context: Context, state: ContextState, reason: CancelReason) -> None:
            if reason is CancelReason.DEADLINE and not complete:  # the client's: a cancellation
                tracker.cancelled(reason.value)

        context.add_cancel_callback(heard)
        grace = pipeline.config.stop_grace if pipeline.config.on_disconnect == "stop" else None
        call.live.add(lifecycle)
        if call.gone:
            lifecycle.client_gone()
        try:
            with pipeline.in_flight_request(context), pipeline.runtime.track(context):
                async with context.scope(drain_grace=grace):
                    async with await route.call(worker_input, context) as stream:
                        while batch := await stream.receive_batch():
                            for data in batch:
                                await send(response_message(data, _ModelInferResponse, raw=raw))
                    complete = True
                    lifecycle.completed()
            if lifecycle.client_is_gone or not complete:  # cancelled, or killed
                raise _ending(context)
            tracker.finish("success")
        except BaseException as exc:
            tracker.finish("error", _error_type(exc, tracker.cancel_reason))
            raise
        finally:
            call.live.discard(lifecycle)
            context.remove_cancel_callback(heard)


def _ending(context: Context) -> GrpcError:
    """The status of an inference that was killed before its response was complete."""
    if context.reason is CancelReason.DEADLINE:
        return GrpcError(Status.DEADLINE_EXCEEDED, "the call's deadline passed")
    if context.reason is CancelReason.SHUTDOWN:
        return GrpcError(Status.UNAVAILABLE, "the frontend shut down; send it again")
    return GrpcError(Status.CANCELLED, "the call was cancelled")


def _error_type(exc: BaseException, cancel_reason: str | None) -> str:
    """The ``error_type`` of an inference that failed with ``exc`` (``cancelled`` only
    for one that was cancelled, which then counts as one)."""
    if cancel_reason is not None:
        return "cancelled"
    status, _ = status_for(exc)
    return {
        Status.CANCELLED: "cancelled",
        Status.INVALID_ARGUMENT: "validation",
        Status.NOT_FOUND: "not_found",
        Status.UNAVAILABLE: "unavailable",
        Status.DEADLINE_EXCEEDED: "response_timeout",
    }.get(status, "internal")


def _kserve_name(spec: TensorSpec) -> str:
    return kserve_dtype(spec.data_type).kserve


def _enum(spec: TensorSpec) -> int:
    return DATA_TYPES.index(kserve_dtype(spec.data_type).config)


_METHODS: Final = {
    "ServerLive": _Method("ServerLiveRequest", KServeApp._server_live),
    "ServerReady": _Method("ServerReadyRequest", KServeApp._server_ready),
    "ModelReady": _Method("ModelReadyRequest", KServeApp._model_ready),
    "ModelMetadata": _Method("ModelMetadataRequest", KServeApp._model_metadata),
    "ModelConfig": _Method("ModelConfigRequest", KServeApp._model_config),
    "ModelInfer": _Method("ModelInferRequest", KServeApp._infer),
}
"""The service's unary methods, by name (``ModelStreamInfer`` is the one other)."""


async def _plain(send: ASGISendCallable, status: int, body: bytes) -> None:
    """Answer what is not a gRPC call with a plain HTTP status."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _failed(exc: BaseException, what: str) -> tuple[Status, str]:
    """The status a failure ends ``what`` with (logged when it is an internal error);
    a live cancellation in ``exc`` is raised instead."""
    live, failure = split_live_cancellation(exc)
    if live is not None:
        raise live from None
    assert failure is not None
    status, text = status_for(failure)
    if status is Status.INTERNAL:
        _log.error("%s failed", what, exc_info=failure)
    return status, text
