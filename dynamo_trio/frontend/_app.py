"""The OpenAI-compatible HTTP frontend: hypercorn -> Edge (refusals, status routes) ->
HangUpGuard -> quart (the route table); a client's errors get API-shaped JSON, no traceback.
"""

from __future__ import annotations

import inspect
import logging
import time
from contextlib import ExitStack
from functools import partial
from typing import TYPE_CHECKING, Any, Final, final

import trio
from hypercorn.config import Config as HypercornConfig
from quart import Response, request
from quart_trio import QuartTrio
from quart_trio.asgi import TrioASGIHTTPConnection
from werkzeug.exceptions import HTTPException, MethodNotAllowed

from .._hostport import host_port
from ..edge import Edge, body_timeout_message, listen_sockets, serve_http, shown, status_routes
from ..llm import reason_phrase
from ._apis import api_for_path, edge_error_body
from ._hangup import HangUpGuard
from ._pipeline import Pipeline
from ._routes import API_ROUTES, generate_view, json_response, models_view, reply_ids

if TYPE_CHECKING:
    import socket
    from collections.abc import Awaitable, Callable

    from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable

    from .._config import FrontendConfig
    from ..edge import MetricsSource
    from ..runtime import DistributedRuntime

_log = logging.getLogger("dynamo_trio.frontend")


def build_app(pipeline: Pipeline) -> QuartTrio:
    """The quart-trio app serving ``pipeline``'s API routes (:data:`~._routes.API_ROUTES`)."""
    config = pipeline.config
    app = QuartTrio("dynamo_trio.frontend")
    if VIEW_FIRST:
        app.asgi_http_class = _ViewFirst
    app.config.update(
        RESPONSE_TIMEOUT=None,  # quart's 60 s default would cut long SSE streams
        MAX_CONTENT_LENGTH=config.max_body_size,
        BODY_TIMEOUT=config.body_timeout,
        PROVIDE_AUTOMATIC_OPTIONS=False,
    )
    for path, name, api in API_ROUTES:
        app.add_url_rule(path, name, partial(generate_view, pipeline, api), methods=["POST"])
    app.add_url_rule("/v1/models", "models", partial(models_view, pipeline), methods=["GET"])
    app.register_error_handler(HTTPException, partial(_http_error, config))
    app.register_error_handler(Exception, _internal_error)
    return app


def build_edge(
    pipeline: Pipeline,
    app: QuartTrio,
    *,
    metrics: MetricsSource | None = None,
    inflight: Callable[[], Any] | None = None,
) -> Edge:
    """The frontend's outermost ASGI app: the edge's routes over the guarded quart app."""
    started = time.monotonic()

    def health() -> tuple[int, dict[str, Any]]:
        ready = not pipeline.shutting_down
        payload = {
            "status": "healthy" if ready else "shutting down",
            "uptime": round(time.monotonic() - started, 3),
            "models": [name for name, _ in pipeline.models.models()],
        }
        return (200 if ready else 503), payload

    routes = status_routes(
        health=health,
        live=lambda: (200, {"status": "live"}),
        metrics=metrics if metrics is not None else pipeline.runtime.registry,
        inflight=inflight if inflight is not None else pipeline.runtime.inflight,
    )
    return Edge(
        routes,
        HangUpGuard(app),
        max_header_size=pipeline.config.max_header_size,
        body_timeout=pipeline.config.body_timeout,
        max_body_size=pipeline.config.max_body_size,
        request_exit=pipeline.request_exit,
        error_body=edge_error_body,
    )


@final
class _ViewFirst(TrioASGIHTTPConnection):
    """quart-trio's HTTP request handling, with the view run in the task that got the
    request (one scheduler pass sooner; only the message reader is a task of its own)."""

    async def __call__(self, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        request = self._create_request_from_scope(send)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.handle_messages, nursery, request, receive)
            await self.handle_request(nursery, request, send)


def _view_first_fits(base: type[TrioASGIHTTPConnection]) -> bool:
    """Whether quart-trio still has the methods :class:`_ViewFirst` calls, as in 0.12."""
    expected = {  # name: (async?, parameters)
        "_create_request_from_scope": (False, ["self", "send"]),
        "handle_messages": (True, ["self", "nursery", "request", "receive"]),
        "handle_request": (True, ["self", "nursery", "request", "send"]),
    }
    try:
        return all(
            inspect.iscoroutinefunction(method := getattr(base, name)) is is_async
            and list(inspect.signature(method).parameters) == parameters
            for name, (is_async, parameters) in expected.items()
        )
    except (AttributeError, TypeError, ValueError):  # missing, or not a function
        return False


VIEW_FIRST: Final = _view_first_fits(TrioASGIHTTPConnection)
"""Whether the app runs the view in the request's task (else quart-trio's own way)."""
if not VIEW_FIRST:
    _log.warning(
        "this quart-trio's request handling differs from 0.12's: "
        "its own is used (the view starts a scheduler pass later)"
    )


async def _error_reply(status: int, message: str) -> Response:
    """The request's API-shaped error, sent once the rest of its body is consumed, or closing
    the connection (else hypercorn closes it inside the response's send, which quart-trio's
    cancellation leaves open but dead)."""
    body = api_for_path(request.path).error_body(status, message)
    response = json_response(body, status, reply_ids())
    if status in (408, 413):  # (the body is what failed)
        response.headers["Connection"] = "close"
        return response
    try:
        await request.get_data(cache=False)
    except Exception:
        response.headers["Connection"] = "close"
    return response


async def _http_error(config: FrontendConfig, error: HTTPException) -> Response:
    status = error.code or 500
    method, path = shown(request.method), shown(request.path)
    message = {
        404: f"No route {method} {path}.",
        405: f"Method {method} is not allowed on {path}.",
        408: body_timeout_message(config.body_timeout),
        413: f"The request body exceeds the limit of {config.max_body_size} bytes.",
    }.get(status, error.description or reason_phrase(status))
    response = await _error_reply(status, message)
    if isinstance(error, MethodNotAllowed) and error.valid_methods:
        response.headers["Allow"] = ", ".join(sorted(error.valid_methods))
    return response


async def _internal_error(error: Exception) -> Response:
    _log.exception("unhandled error on %s %s", request.method, request.path)
    return await _error_reply(500, "Internal server error.")


async def serve_frontend(
    runtime: DistributedRuntime,
    config: FrontendConfig,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    shutdown_grace: float = 5.0,
    sockets: list[socket.socket] | None = None,
    metrics: MetricsSource | None = None,
    inflight: Callable[[], Any] | None = None,
    on_grpc_listening: Callable[[str], object] | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the frontend over ``runtime`` until ``shutdown_trigger`` returns, then drain
    (docs/operations.md, "Shutdown"); ``http://host:port`` goes to ``task_status``.

    With ``config.kserve_grpc_port`` also serves KServe gRPC (its address to
    ``on_grpc_listening``); ``metrics``/``inflight`` replace this process's views.
    """
    with ExitStack() as cleanup:  # (exits after the nursery)
        async with trio.open_nursery() as nursery:
            pipeline = Pipeline(runtime, config, nursery)
            pipeline.turns.install()  # until the last request has ended
            cleanup.callback(pipeline.turns.uninstall)
            await pipeline.start()
            app = build_app(pipeline)
            drained = trio.Event()

            async def shutdown() -> None:  # on the trigger, or a request asking to exit
                async with trio.open_nursery() as either:

                    async def then_cancel(wait: Callable[[], Awaitable[object]]) -> None:
                        await wait()
                        either.cancel_scope.cancel()

                    if shutdown_trigger is not None:
                        either.start_soon(then_cancel, shutdown_trigger)
                    either.start_soon(then_cancel, pipeline.exit_requested.wait)
                await _drain(pipeline, shutdown_grace)
                drained.set()

            edge = build_edge(pipeline, app, metrics=metrics, inflight=inflight)
            if sockets is None:
                sockets = listen_sockets([host_port(config.host, config.port)])
            binds: list[str] = await nursery.start(
                partial(
                    serve_http,
                    edge,
                    _hypercorn_config(config, FLUSH_GRACE),
                    shutdown,
                    sockets=sockets,
                    dead_peer_timeout=config.dead_client_timeout,
                    cleartext_http2=config.cleartext_http2,
                    http2_max_resets=config.http2_max_resets,
                )
            )
            _log.info("frontend listening on %s", binds[0])
            if config.kserve_grpc_port is not None:
                from ..kserve import serve_kserve

                grpc_binds: list[str] = await nursery.start(
                    partial(serve_kserve, pipeline, drained.wait, flush_grace=FLUSH_GRACE)
                )
                address = grpc_binds[0].removeprefix("http://")
                _log.info("KServe gRPC listening on %s", address)
                if on_grpc_listening is not None:
                    on_grpc_listening(address)
            task_status.started(binds[0])


FLUSH_GRACE: Final = 2.0
"""Seconds connections get to deliver their last bytes once the drain is over."""

_END_SETTLE: Final = 2.0
"""Seconds requests ended at the end of the grace get to write their endings."""

DRAIN_OVERHEAD: Final = _END_SETTLE + FLUSH_GRACE
"""The most a frontend's shutdown takes beyond its grace."""


async def _drain(pipeline: Pipeline, grace: float) -> None:
    """Refuse new requests, let those in flight finish for ``grace`` s, end the rest."""
    _log.info(
        "frontend shutting down: refusing new requests, letting %d in flight finish "
        "for up to %.1fs",
        pipeline.in_flight,
        grace,
    )
    pipeline.begin_drain()
    with trio.move_on_after(grace):
        await pipeline.wait_drained()
    if left := pipeline.in_flight:
        _log.warning(
            "ending %d request(s) still running after the %.1fs shutdown grace", left, grace
        )
        pipeline.end_all()
        with trio.move_on_after(_END_SETTLE):
            await pipeline.wait_drained()
    _log.info("frontend drained")


def _hypercorn_config(config: FrontendConfig, graceful_timeout: float) -> HypercornConfig:
    hypercorn = HypercornConfig()  # (no access log: hypercorn's default)
    hypercorn.errorlog = logging.getLogger("dynamo_trio.frontend.http")
    hypercorn.graceful_timeout = graceful_timeout
    hypercorn.keep_alive_timeout = config.idle_timeout
    hypercorn.backlog = config.backlog
    # (a head still incomplete past this is refused by h11, a complete one by the Edge)
    hypercorn.h11_max_incomplete_size = config.max_header_size
    hypercorn.h2_max_header_list_size = config.max_header_size
    return hypercorn
