"""The edge: the one ASGI layer every HTTP server of dynamo-trio stands on (:class:`Edge`)."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Final, cast, final

import trio

from .._contain import contain
from .._ratelimit import LogLimiter
from ._chunks import direct_chunks
from ._prefetch import BodyPrefetch, is_end

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

_log = logging.getLogger("dynamo_trio.edge")
limited_log: Final = LogLimiter(_log)
"""What a request can make the edge log, at a bounded rate."""

LAST_SEND_SHIELD: Final = 5.0
"""The longest the last send of an HTTP/1.x response is shielded from cancellation."""

_WEBSOCKET_RESPONSE: Final = "websocket.http.response"
_POLICY_VIOLATION: Final = 1008
_ECHO_LIMIT: Final = 200
_JSON: Final = b"application/json"


def json_bytes(payload: object) -> bytes:
    """``payload`` as compact JSON bytes (non-JSON values as their ``str``)."""
    return json.dumps(payload, separators=(",", ":"), default=str).encode()


ErrorBody = Callable[[str, int, str, "str | None"], bytes]
"""``(path, status, message, code)`` -> the JSON body of an error the edge answers."""


def error_json(path: str, status: int, message: str, code: str | None = None) -> bytes:
    """A plain JSON error body: ``{"error": {"message", "code"}}``."""
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
    """A ``GET`` route (``HEAD`` too, without the body) answered at the edge by a quick handler."""

    path: str
    handler: Handler


@final
class Edge:
    """The outermost ASGI app of an HTTP server.

    It refuses what no route should see (WebSocket handshakes, heads over
    ``max_header_size``: 414/431) in the API's error shape, answers the fixed routes itself,
    and hands the rest to ``app`` (``None``: 404), whose chunked bodies go straight to the
    connection (:mod:`._chunks`) and whose bodies up to ``max_body_size`` are offered ahead
    (:mod:`._prefetch`).  Whatever a request's code raises (a ``BaseException``, a stale
    ``trio.Cancelled``) ends that request only; ``request_exit`` is called after a
    ``KeyboardInterrupt`` or ``SystemExit``.
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
            except BaseException:
                with contain(lambda failure: self._escaped(scope, failure)):
                    raise
        elif scope["type"] == "websocket":
            await self._refuse_websocket(scope, send)
        elif self.app is not None:
            await self.app(scope, receive, send)
        else:
            await answer_lifespan(receive, send)

    def _escaped(self, scope: HTTPScope, failure: BaseException) -> None:
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

    def _error(
        self, path: str, status: int, message: str, headers: tuple[tuple[bytes, bytes], ...] = ()
    ) -> EdgeResponse:
        return EdgeResponse(status, self._error_body(path, status, message, None), headers=headers)

    async def _http(
        self, scope: HTTPScope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        refusal = self._head_refusal(scope)
        if refusal is not None:
            await _respond(send, self._error(scope["path"], *refusal), close=True)
            return
        http1 = scope.get("http_version", "1.1") in ("1.0", "1.1")
        route = self._routes.get(scope["path"])
        if route is not None:
            answer = partial(self._answer, route, scope, send)
            await (answer(receive) if http1 else _until_disconnect(answer, receive))
        elif self.app is not None:
            if http1:
                send = _shielded_send(direct_chunks(scope, send))
            if self.max_body_size is not None:
                receive = await BodyPrefetch.offer(
                    scope, receive, limit=self.max_body_size, end_timeout=self.body_timeout
                )
            await self.app(scope, receive, send)
        else:
            message = f"No route {shown(scope['method'])} {shown(scope['path'])}."
            await _drain(receive)
            await _respond(send, self._error(scope["path"], 404, message))

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
        self, route: Route, scope: HTTPScope, send: ASGISendCallable, receive: ASGIReceiveCallable
    ) -> None:
        method = scope["method"]
        # A keep-alive connection is reused only once the body is read.
        with trio.move_on_after(self.body_timeout) as reading:
            await _drain(receive)
        if reading.cancelled_caught:
            message = body_timeout_message(self.body_timeout)
            await _respond(send, self._error(route.path, 408, message), close=True)
            return
        if method not in ("GET", "HEAD"):
            message = f"Method {shown(method)} is not allowed on {shown(route.path)}."
            response = self._error(route.path, 405, message, ((b"allow", b"GET, HEAD"),))
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
        message = (
            f"This server does not accept WebSocket connections (no WebSocket route at "
            f"{shown(path)}); its API is plain HTTP."
        )
        body = self._error_body(path, 404, message, "websocket_not_supported")
        await _respond(send, EdgeResponse(404, body), close=True, kind="websocket.http")


async def _until_disconnect(
    answer: Callable[[ASGIReceiveCallable], Awaitable[None]], receive: ASGIReceiveCallable
) -> None:
    """``answer(receive)``, cancelled if the client goes away first (for HTTP/2, whose
    last send waits for the stream to drain to the socket)."""
    messages: trio.MemorySendChannel[ASGIReceiveEvent]
    messages, inbox = trio.open_memory_channel(1)

    async def watch() -> None:
        async with messages:
            while (message := await receive())["type"] != "http.disconnect":
                await messages.send(message)
            nursery.cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        await answer(inbox.receive)
        nursery.cancel_scope.cancel()


def body_timeout_message(seconds: float) -> str:
    """The message of a 408 (one wording for the edge's routes and the app's)."""
    return f"The request body did not arrive within {seconds:g} seconds."


def _shielded_send(send: ASGISendCallable) -> ASGISendCallable:
    """``send``, its last HTTP/1.x body message shielded: that send restarts hypercorn's idle
    timer, and quart-trio cancels its tasks once the response is out."""

    async def send_last_shielded(message: ASGISendEvent) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            with trio.move_on_after(LAST_SEND_SHIELD, shield=True):
                await send(message)
        else:
            await send(message)

    return send_last_shielded


async def _drain(receive: ASGIReceiveCallable) -> None:
    """Read the request body to its end (routes answered here take none)."""
    while not is_end(await receive()):
        pass


async def _respond(
    send: ASGISendCallable,
    response: EdgeResponse,
    *,
    close: bool = False,
    head_only: bool = False,
    kind: str = "http",
) -> None:
    """Send ``response`` whole (``kind``: ``websocket.http`` for a refused handshake)."""
    length = str(len(response.body)).encode()
    headers = [(b"content-type", response.content_type), (b"content-length", length)]
    headers += response.headers
    if close:
        headers += ((b"connection", b"close"), (b"x-request-id", str(uuid.uuid4()).encode()))
    start = {"type": f"{kind}.response.start", "status": response.status, "headers": headers}
    await send(cast("ASGISendEvent", start))
    body = b"" if head_only else response.body
    end = {"type": f"{kind}.response.body", "body": body, "more_body": False}
    await send(cast("ASGISendEvent", end))


async def answer_lifespan(receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
    """The ASGI lifespan of an app with nothing to start or stop."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
