"""The edge: the one ASGI layer every HTTP server of dynamo-trio stands on.

:class:`Edge`, the outermost ASGI app of the frontend and of a worker's status
server, does what is the same everywhere: **refusals** in the server's API's
JSON error shape, without a traceback (WebSocket handshakes; a request target
or headers over ``max_header_size``, 414/431, which hypercorn's parser lets
through when a head arrives whole); **fixed routes** from a table
(:class:`Route`: ``/health``, ``/live``, ``/metrics``, ``/debug/requests``),
answered here at about a bare ASGI app's cost, never behind the app;
**everything else** to the wrapped app, its chunked bodies written straight to
the connection (:mod:`._chunks`), a body that has already arrived offered
ahead (:mod:`._prefetch`), and its last send shielded (:func:`_shielded_send`);
and **containment**: whatever a request's code raises (a ``BaseException``, a
stale ``trio.Cancelled``, which hypercorn would let end the server) ends that
request only, logged at a bounded rate; a live cancellation goes on.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, final

import trio

from .._contain import split_live_cancellation
from .._ratelimit import LogLimiter
from ._chunks import direct_chunks
from ._prefetch import BodyPrefetch

if TYPE_CHECKING:
    from hypercorn.typing import (
        ASGIFramework,
        ASGIReceiveCallable,
        ASGIReceiveEvent,
        ASGISendCallable,
        ASGISendEvent,
        HTTPScope,
        Scope,
        WebsocketScope,
    )

__all__ = [
    "LAST_SEND_SHIELD",
    "Edge",
    "EdgeRequest",
    "EdgeResponse",
    "ErrorBody",
    "Route",
    "answer_lifespan",
    "body_timeout_message",
    "error_json",
    "json_bytes",
    "shown",
]

_log = logging.getLogger("dynamo_trio.edge")
limited_log: Final = LogLimiter(_log)
"""What a request can make the edge log, at a bounded rate."""

LAST_SEND_SHIELD: Final = 5.0
"""The longest the last send of an HTTP/1.x response is shielded from cancellation."""

_WEBSOCKET_RESPONSE: Final = "websocket.http.response"
# A close code for "policy violation", used when the denial response extension is absent.
_POLICY_VIOLATION: Final = 1008
_ECHO_LIMIT: Final = 200
_JSON: Final = b"application/json"


def json_bytes(payload: object) -> bytes:
    """``payload`` as compact JSON bytes (non-JSON values as their ``str``)."""
    return json.dumps(payload, separators=(",", ":"), default=str).encode()


ErrorBody = Callable[[str, int, str, "str | None"], bytes]
"""``(path, status, message, code)`` -> the JSON body of an error the edge answers."""


def error_json(path: str, status: int, message: str, code: str | None = None) -> bytes:
    """A plain JSON error body: ``{"error": {"message", "code"}}`` (``code`` defaults to
    the status)."""
    return json_bytes({"error": {"message": message, "code": code or status}})


def shown(text: str) -> str:
    """``text`` (a path, a method) as an error message may quote it: at most 200 characters."""
    return text if len(text) <= _ECHO_LIMIT else f"{text[:_ECHO_LIMIT]}..."


@dataclass(frozen=True, slots=True)
class EdgeRequest:
    """What a fixed route is given: the request head (its body, if any, was read)."""

    method: str
    path: str
    query: bytes
    headers: Mapping[bytes, bytes]
    """Header names lower-cased; the last value wins."""


@dataclass(frozen=True, slots=True)
class EdgeResponse:
    """What a fixed route answers."""

    status: int
    body: bytes
    content_type: bytes = _JSON
    headers: tuple[tuple[bytes, bytes], ...] = ()

    @classmethod
    def json(cls, payload: object, status: int = 200) -> EdgeResponse:
        return cls(status, json_bytes(payload))


Handler = Callable[[EdgeRequest], EdgeResponse | Awaitable[EdgeResponse]]


@dataclass(frozen=True, slots=True)
class Route:
    """A route answered at the edge: a path, its methods, and a handler.

    The handler is a plain function (or a coroutine function) of the
    :class:`EdgeRequest`; it must be quick (it runs in the connection's task).
    ``HEAD`` is answered wherever ``GET`` is, without the body.
    """

    path: str
    handler: Handler
    methods: frozenset[str] = field(default=frozenset({"GET"}))


@final
class Edge:
    """The outermost ASGI app of an HTTP server (see the module docstring).

    Args:
        routes: The fixed routes answered here.
        app: Where every other request goes; ``None`` answers them 404.
        max_header_size: The most bytes a request's path and query, and
            separately its headers (names and values), may take.
        body_timeout: Seconds a fixed route waits for a request body to end
            (a route takes none, but a keep-alive connection is reused only once
            it is read): a body that does not end in time is a 408, and the
            connection is closed.
        max_body_size: The largest body offered to the app ahead of its own
            reading (:class:`~._prefetch.BodyPrefetch`; the app's own limit
            should be the same); ``None`` offers none.
        request_exit: Called when a request's code raised ``KeyboardInterrupt``
            or ``SystemExit`` (the request itself ends as a failed one).
        error_body: The body of an error the edge answers itself, in the shape
            of the server's API (default: :func:`error_json`).
    """

    def __init__(
        self,
        routes: list[Route],
        app: ASGIFramework | None = None,
        *,
        max_header_size: int = 16 * 1024,
        body_timeout: float = 30.0,
        max_body_size: int | None = None,
        request_exit: Callable[[], object] | None = None,
        error_body: ErrorBody = error_json,
    ) -> None:
        self.app: Final = app
        self._error_body: Final = error_body
        self.request_exit: Final = request_exit
        self.max_header_size: Final = max_header_size
        self.body_timeout: Final = body_timeout
        self.max_body_size: Final = max_body_size
        self._routes: Final[dict[str, Route]] = {route.path: route for route in routes}

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if scope["type"] == "http":
            try:
                await self._http(scope, receive, send)
            except Exception:
                raise  # hypercorn's to answer (a 500) and log
            except BaseException as exc:
                self._contain(scope, exc)
        elif scope["type"] == "websocket":
            await self._refuse_websocket(scope, send)
        elif self.app is not None:
            await self.app(scope, receive, send)
        else:
            await answer_lifespan(receive, send)

    def _contain(self, scope: HTTPScope, exc: BaseException) -> None:
        """End the request that raised ``exc`` (not an ``Exception``), and only it;
        a live cancellation goes on (see the module docstring)."""
        live, failure = split_live_cancellation(exc)
        if live is not None:
            raise live from None
        if failure is None:
            return
        limited_log.error(
            "request-escape",
            "%s %s raised %s; ending that request only",
            shown(scope["method"]),
            shown(scope["path"]),
            type(failure).__name__,
            exc_info=failure,
        )
        if isinstance(failure, KeyboardInterrupt | SystemExit) and self.request_exit is not None:
            self.request_exit()

    async def _http(
        self, scope: HTTPScope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        refusal = self._head_refusal(scope)
        if refusal is not None:
            status, message = refusal
            body = self._error_body(scope["path"], status, message, None)
            await _respond(send, EdgeResponse(status, body), close=True)
            return
        route = self._routes.get(scope["path"])
        if route is not None:
            if scope.get("http_version", "1.1") in ("1.0", "1.1"):
                await self._answer(route, scope, receive, send)
            else:
                await _until_disconnect(self._answer, route, scope, receive, send)
        elif self.app is not None:
            if scope.get("http_version", "1.1") in ("1.0", "1.1"):
                send = _shielded_send(direct_chunks(scope, send))
            if self.max_body_size is not None:
                receive = await BodyPrefetch.offer(
                    scope, receive, limit=self.max_body_size, end_timeout=self.body_timeout
                )
            await self.app(scope, receive, send)
        else:
            path, method = shown(scope["path"]), shown(scope["method"])
            body = self._error_body(scope["path"], 404, f"No route {method} {path}.", None)
            await _drain(receive)
            await _respond(send, EdgeResponse(404, body))

    def _head_refusal(self, scope: HTTPScope) -> tuple[int, str] | None:
        limit = self.max_header_size
        target = len(scope["raw_path"]) + len(scope["query_string"])
        if target > limit:
            return 414, f"The request target is {target} bytes long; the limit is {limit} bytes."
        size = sum(len(name) + len(value) for name, value in scope["headers"])
        if size > limit:
            return 431, f"The request headers take {size} bytes; the limit is {limit} bytes."
        return None

    async def _answer(
        self, route: Route, scope: HTTPScope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        method = scope["method"]
        allowed = route.methods | ({"HEAD"} if "GET" in route.methods else set())
        # A keep-alive connection is reused only once the body is read, and a body that
        # never ends (an unterminated chunked one) must not hold the connection for ever.
        with trio.move_on_after(self.body_timeout) as reading:
            await _drain(receive)
        if reading.cancelled_caught:
            message = body_timeout_message(self.body_timeout)
            response = EdgeResponse(408, self._error_body(route.path, 408, message, None))
            await _respond(send, response, close=True)
            return
        if method not in allowed:
            message = f"Method {shown(method)} is not allowed on {shown(route.path)}."
            allow = ", ".join(sorted(allowed)).encode()
            response = EdgeResponse(
                405, self._error_body(route.path, 405, message, None), headers=((b"allow", allow),)
            )
        else:
            request = EdgeRequest(
                method, scope["path"], scope["query_string"], dict(scope["headers"])
            )
            answer = route.handler(request)
            response = answer if isinstance(answer, EdgeResponse) else await answer
        await _respond(send, response, head_only=method == "HEAD")

    async def _refuse_websocket(self, scope: WebsocketScope, send: ASGISendCallable) -> None:
        if _WEBSOCKET_RESPONSE not in scope.get("extensions", {}):
            await send({"type": "websocket.close", "code": _POLICY_VIOLATION, "reason": ""})
            return
        path = scope["path"]
        body = self._error_body(
            path,
            404,
            f"This server does not accept WebSocket connections (no WebSocket route at "
            f"{shown(path)}); its API is plain HTTP.",
            "websocket_not_supported",
        )
        await send(
            {
                "type": "websocket.http.response.start",
                "status": 404,
                "headers": [
                    (b"content-type", _JSON),
                    (b"content-length", str(len(body)).encode()),
                    (b"x-request-id", str(uuid.uuid4()).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "websocket.http.response.body", "body": body, "more_body": False})


async def _until_disconnect(
    answer: Callable[[Route, HTTPScope, ASGIReceiveCallable, ASGISendCallable], Awaitable[None]],
    route: Route,
    scope: HTTPScope,
    receive: ASGIReceiveCallable,
    send: ASGISendCallable,
) -> None:
    """``answer``, cancelled if the client goes away first (HTTP/2 only).

    Over HTTP/2 the last send waits until hypercorn has drained the stream to
    the socket, which never happens once the client has gone; over HTTP/1.x a
    send only queues bytes, so the watcher (a task per request) is not needed.
    """
    messages: trio.MemorySendChannel[ASGIReceiveEvent]
    messages, inbox = trio.open_memory_channel(1)

    async def watch() -> None:
        async with messages:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    nursery.cancel_scope.cancel()
                    return
                await messages.send(message)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        await answer(route, scope, inbox.receive, send)
        nursery.cancel_scope.cancel()


def body_timeout_message(seconds: float) -> str:
    """The message of a 408: the body did not arrive within ``seconds`` (one wording for
    the edge's routes and the app's)."""
    return f"The request body did not arrive within {seconds:g} seconds."


def _shielded_send(send: ASGISendCallable) -> ASGISendCallable:
    """``send``, with the last send of a response shielded (for up to
    :data:`LAST_SEND_SHIELD` seconds).

    hypercorn's h11 protocol restarts a keep-alive connection's idle timer from
    inside the last send of a response, and quart-trio cancels its request
    tasks as soon as the response is out; unshielded, the restart is cancelled
    with them, and an idle keep-alive connection stays open for ever.  Over h11
    the send only queues bytes, so shielding it delays nothing.  HTTP/2 is never
    shielded (its last send waits for the stream to drain to a client that may
    be gone); routes answered at the edge run outside quart-trio's nursery.
    """

    async def send_last_shielded(message: ASGISendEvent) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            with trio.move_on_after(LAST_SEND_SHIELD, shield=True):
                await send(message)
        else:
            await send(message)

    return send_last_shielded


async def _drain(receive: ASGIReceiveCallable) -> None:
    """Read the request body to its end (routes answered here take none)."""
    while True:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            return


async def _respond(
    send: ASGISendCallable, response: EdgeResponse, *, close: bool = False, head_only: bool = False
) -> None:
    headers = [
        (b"content-type", response.content_type),
        (b"content-length", str(len(response.body)).encode()),
        *response.headers,
    ]
    if close:
        headers.append((b"connection", b"close"))
        headers.append((b"x-request-id", str(uuid.uuid4()).encode()))
    await send(
        {
            "type": "http.response.start",
            "status": response.status,
            "headers": headers,
            "trailers": False,
        }
    )
    body = b"" if head_only else response.body
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def answer_lifespan(receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
    """The ASGI lifespan of an app with nothing to start or stop."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
