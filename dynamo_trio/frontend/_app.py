"""The OpenAI-compatible HTTP frontend: a quart-trio app served by hypercorn's trio worker.

Routes: ``POST /v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``,
``/v1/responses``, ``/v1/messages`` (Anthropic); ``GET /v1/models``,
``/health``, ``/live``, ``/metrics``, ``/debug/requests``.

Everything a client can send is answered with an API-shaped JSON error and
the right status, never a traceback: malformed JSON and invalid fields 400
(bodies are decoded by :func:`~dynamo_trio.llm.decode_json_body`: strict,
depth-limited, no repeated keys), an unknown model 404, a body not finished
within ``body_timeout`` 408, a body over the size limit 413, a request target
or headers over ``max_header_size`` 414/431, a body that is not JSON (or not
UTF-8) 415, no live instance 503, a request cancelled on the worker 499,
anything else 500.  WebSocket handshakes are refused with a 404 (see
:mod:`._gate`).
Each response carries ``x-request-id`` (the client's own if it sent one, else
the request's id) and ``x-dynamo-request-id`` (the request's id): the
request's id is ``x-dynamo-request-id`` if sent, else ``x-request-id``, else a
fresh UUID, and it is the request's context id end to end (see
:func:`~dynamo_trio._tracing.request_ids`).  A ``traceparent`` header makes the
request part of the client's W3C trace; without one it starts a new trace.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Final

import trio
from hypercorn.config import Config as HypercornConfig
from prometheus_client.exposition import choose_encoder
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException, MethodNotAllowed

from .._errors import InvalidRequestId
from .._tracing import (
    TRACEPARENT,
    TRACESTATE,
    X_DYNAMO_REQUEST_ID,
    X_REQUEST_ID,
    RequestIds,
    TraceContext,
    is_valid_request_id,
    request_ids,
)
from ..llm import RequestError, decode_json_body, model_list, reason_phrase
from ._apis import ANTHROPIC_MESSAGES, CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES
from ._gate import Gate, shown
from ._guard import HangUpGuard
from ._http_server import serve_http
from ._pipeline import JsonReply, Pipeline, StreamReply

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from .._config import FrontendConfig
    from ..runtime import DistributedRuntime
    from ._apis import EmbeddingsApi, TextApi

__all__ = ["build_app", "serve_frontend"]

_log = logging.getLogger("dynamo_trio.frontend")

_JSON_TYPES: Final = ("application/json", "application/x-ndjson")
_UTF8: Final = ("utf-8", "utf8")
_SSE_HEADERS: Final = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def build_app(pipeline: Pipeline) -> QuartTrio:
    """The quart-trio app for ``pipeline``'s frontend."""
    config = pipeline.config
    app = QuartTrio("dynamo_trio.frontend")
    app.config.update(
        RESPONSE_TIMEOUT=None,  # quart's 60 s default would cut long SSE streams
        MAX_CONTENT_LENGTH=config.max_body_size,
        BODY_TIMEOUT=config.body_timeout,
        PROVIDE_AUTOMATIC_OPTIONS=False,
    )
    started = time.monotonic()

    def json_response(
        payload: object, status: int = 200, ids: RequestIds | None = None
    ) -> Response:
        response = app.response_class(
            json.dumps(payload, separators=(",", ":")),
            status=status,
            content_type="application/json",
        )
        if ids is not None:
            response.headers.update(ids.response_headers())
        return response

    def reply(result: JsonReply | StreamReply, ids: RequestIds) -> Response:
        if isinstance(result, JsonReply):
            return json_response(result.payload, result.status, ids)
        response = app.response_class(
            result.body, content_type="text/event-stream", headers=_SSE_HEADERS
        )
        response.timeout = None
        response.headers.update(ids.response_headers())
        return response

    def decode_json(body: bytes) -> object:
        content_type = request.mimetype
        if content_type and content_type not in _JSON_TYPES:
            raise RequestError(
                415,
                f"Content-Type must be application/json, not {shown(content_type)!r}.",
                code="unsupported_media_type",
            )
        charset = request.mimetype_params.get("charset")
        if charset is not None and charset.lower() not in _UTF8:
            raise RequestError(
                415,
                f"A JSON body must be UTF-8, not {shown(charset)!r} (RFC 8259).",
                code="unsupported_media_type",
            )
        return decode_json_body(body, max_depth=config.max_json_depth)

    def request_identity() -> tuple[RequestIds, TraceContext]:
        """The request's id (x-dynamo-request-id, x-request-id, or a fresh UUID) and
        its trace (a span under the client's ``traceparent``, or a new trace)."""
        headers = request.headers
        try:
            ids = request_ids(headers.get(X_REQUEST_ID), headers.get(X_DYNAMO_REQUEST_ID))
        except InvalidRequestId as exc:
            raise RequestError(400, exc.message, param=exc.header) from None
        trace = TraceContext.continued(
            headers.get(TRACEPARENT), headers.get(TRACESTATE), x_request_id=ids.x_request_id
        )
        return ids, trace

    def reply_ids() -> RequestIds:
        """The ids an error reply carries: the client's if valid (never echo an invalid one)."""
        given = [request.headers.get(name) for name in (X_REQUEST_ID, X_DYNAMO_REQUEST_ID)]
        plain, dynamo = (value if value and is_valid_request_id(value) else None for value in given)
        return request_ids(plain, dynamo)

    async def generate(api: TextApi | EmbeddingsApi) -> Response:
        # The body is read before anything can refuse the request: see keep_alive_safe.
        body = await request.get_data(cache=False, as_text=False, parse_form_data=False)
        try:
            ids, trace = request_identity()
            payload = decode_json(body)
            if api is EMBEDDINGS:
                result = await pipeline.embeddings(EMBEDDINGS, payload, ids.request_id, trace)
            else:
                result = await pipeline.text(api, payload, ids.request_id, trace)  # type: ignore[arg-type]
        except RequestError as exc:
            return json_response(api.request_error_body(exc), exc.status, reply_ids())
        return reply(result, ids)

    @app.post("/v1/chat/completions")
    async def chat_completions() -> Response:
        return await generate(CHAT)

    @app.post("/v1/completions")
    async def completions() -> Response:
        return await generate(COMPLETIONS)

    @app.post("/v1/embeddings")
    async def embeddings() -> Response:
        return await generate(EMBEDDINGS)

    @app.post("/v1/responses")
    async def responses() -> Response:
        return await generate(RESPONSES)

    @app.post("/v1/messages")
    async def anthropic_messages() -> Response:
        return await generate(ANTHROPIC_MESSAGES)

    @app.get("/v1/models")
    async def models() -> Response:
        models = pipeline.models.models()
        payload = model_list([name for name, _ in models])
        created = dict(models)
        for entry in payload["data"]:  # type: ignore[attr-defined]
            entry["created"] = created[entry["id"]]
        return json_response(payload)

    @app.get("/health")
    async def health() -> Response:
        ready = not pipeline.shutting_down
        payload = {
            "status": "healthy" if ready else "shutting down",
            "uptime": round(time.monotonic() - started, 3),
            "models": [name for name, _ in pipeline.models.models()],
        }
        return json_response(payload, 200 if ready else 503)

    @app.get("/live")
    async def live() -> Response:
        return json_response({"status": "live"})

    @app.get("/metrics")
    async def metrics() -> Response:
        encode, content_type = choose_encoder(request.headers.get("Accept", ""))
        return app.response_class(encode(pipeline.runtime.registry), content_type=content_type)

    @app.get("/debug/requests")
    async def debug_requests() -> Response:
        return json_response(pipeline.runtime.inflight())

    async def keep_alive_safe(response: Response) -> Response:
        """Consume the rest of the request body before answering, or close the connection.

        Hypercorn recycles a keep-alive connection only once the request body
        has been read; otherwise it closes the connection from inside the
        response's send, where quart-trio's end-of-request cancellation
        interrupts it, leaving the socket open but dead: the client's next
        request on it would hang.  A body that cannot be read (over the size
        limit) gets ``Connection: close`` instead, so the client does not reuse it.
        """
        if response.status_code in (408, 413):
            # The body was too slow or too big: reading it again would wait a
            # second body_timeout, or read what the limit refused.
            response.headers["Connection"] = "close"
            return response
        try:
            await request.get_data(cache=False)
        except Exception:
            response.headers["Connection"] = "close"
        return response

    @app.errorhandler(HTTPException)
    async def http_error(error: HTTPException) -> Response:
        status = error.code or 500
        method, path = shown(request.method), shown(request.path)
        message = {
            404: f"No route {method} {path}.",
            405: f"Method {method} is not allowed on {path}.",
            408: f"The request body did not arrive within {config.body_timeout:g} seconds.",
            413: f"The request body exceeds the limit of {config.max_body_size} bytes.",
        }.get(status, error.description or reason_phrase(status))
        api = ANTHROPIC_MESSAGES if request.path == "/v1/messages" else CHAT
        response = json_response(api.error_body(status, message), status, reply_ids())
        if isinstance(error, MethodNotAllowed) and error.valid_methods:
            response.headers["Allow"] = ", ".join(sorted(error.valid_methods))
        return await keep_alive_safe(response)

    @app.errorhandler(Exception)
    async def internal_error(error: Exception) -> Response:
        _log.exception("unhandled error on %s %s", request.method, request.path)
        api = ANTHROPIC_MESSAGES if request.path == "/v1/messages" else CHAT
        response = json_response(api.error_body(500, "Internal server error."), 500, reply_ids())
        return await keep_alive_safe(response)

    return app


async def serve_frontend(
    runtime: DistributedRuntime,
    config: FrontendConfig,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    graceful_timeout: float = 5.0,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the frontend over ``runtime`` until ``shutdown_trigger`` returns.

    Reports the bound URL (``http://host:port``) through ``task_status``.  On
    shutdown, the requests in flight are stopped (they drain, and their scopes
    kill them after ``stop_grace``), and hypercorn gives them
    ``graceful_timeout`` seconds before closing the connections.
    """
    async with trio.open_nursery() as nursery:
        pipeline = Pipeline(runtime, config, nursery)
        await pipeline.start()
        app = build_app(pipeline)

        async def shutdown() -> None:
            async with trio.open_nursery() as either:  # the trigger, or a request asking to exit

                async def then_cancel(wait: Callable[[], Awaitable[object]]) -> None:
                    await wait()
                    either.cancel_scope.cancel()

                if shutdown_trigger is not None:
                    either.start_soon(then_cancel, shutdown_trigger)
                either.start_soon(then_cancel, pipeline.exit_requested.wait)
            _log.info("frontend shutting down: draining %d request(s)", pipeline.in_flight)
            pipeline.shutdown()

        edge = Gate(HangUpGuard(app), max_header_size=config.max_header_size)
        binds: list[str] = await nursery.start(
            serve_http, edge, _hypercorn_config(config, graceful_timeout), shutdown
        )
        _log.info("frontend listening on %s", binds[0])
        task_status.started(binds[0])


def _hypercorn_config(config: FrontendConfig, graceful_timeout: float) -> HypercornConfig:
    host = f"[{config.host}]" if ":" in config.host else config.host
    hypercorn = HypercornConfig()
    hypercorn.bind = [f"{host}:{config.port}"]
    hypercorn.accesslog = None
    hypercorn.errorlog = logging.getLogger("dynamo_trio.frontend.http")
    hypercorn.graceful_timeout = graceful_timeout
    hypercorn.keep_alive_timeout = config.idle_timeout
    # A request head still incomplete past this is refused by h11 (431 and close);
    # a complete one past it, by the Gate.
    hypercorn.h11_max_incomplete_size = config.max_header_size
    hypercorn.h2_max_header_list_size = config.max_header_size
    return hypercorn
