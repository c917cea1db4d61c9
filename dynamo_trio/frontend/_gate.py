"""The gate: what the frontend refuses before quart sees a request.

:class:`Gate` is the outermost ASGI layer.  It answers, in the API's own
JSON error shape and without a traceback, what quart and the views are not
built for:

* **WebSocket** handshakes, on any path: the frontend serves plain HTTP.  They
  get a 404 JSON response through the ASGI ``websocket.http.response``
  extension (hypercorn has it), else a close before accept (hypercorn's 403).
  Passed on, quart would look for a WebSocket route, find none, and fail in
  its error handler (a 500 with an empty body and two tracebacks per request).
* **Oversized request heads**: a path and query over ``max_header_size``
  bytes get 414, headers over it 431, each with ``Connection: close`` (the
  body is never read).
  hypercorn's h11 parser enforces the same limit only on a head still
  incomplete in its buffer; one that arrives whole in a single read (up to
  64 KiB) would reach the app, where every header is copied and some are
  echoed into error messages.

Everything else goes to the wrapped app unchanged.
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Final

from ..llm import anthropic_error_body, openai_error_body

if TYPE_CHECKING:
    from hypercorn.typing import (
        ASGIFramework,
        ASGIReceiveCallable,
        ASGISendCallable,
        HTTPScope,
        Scope,
        WebsocketScope,
    )

__all__ = ["Gate", "error_json"]

_WEBSOCKET_RESPONSE: Final = "websocket.http.response"
# A close code for "policy violation", used when the denial response extension is absent.
_POLICY_VIOLATION: Final = 1008
_ECHO_LIMIT: Final = 200


def error_json(path: str, status: int, message: str, code: str | None = None) -> bytes:
    """The JSON error body for ``path``'s API: Anthropic's for ``/v1/messages``, else OpenAI's."""
    if path == "/v1/messages":
        body = anthropic_error_body(status, message)
    else:
        body = openai_error_body(status, message, code=code)
    return json.dumps(body, separators=(",", ":")).encode()


def shown(path: str) -> str:
    """``path`` as an error message may quote it: at most 200 characters."""
    return path if len(path) <= _ECHO_LIMIT else f"{path[:_ECHO_LIMIT]}..."


class Gate:
    """ASGI middleware: refuse WebSocket handshakes and oversized request heads.

    Args:
        app: The ASGI app to pass everything else to.
        max_header_size: The most bytes a request's path and query, and
            separately its headers (names and values), may take.
    """

    def __init__(self, app: ASGIFramework, *, max_header_size: int) -> None:
        self.app: Final = app
        self.max_header_size: Final = max_header_size

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if scope["type"] == "websocket":
            await self._refuse_websocket(scope, send)
        elif scope["type"] == "http" and (refusal := self._head_refusal(scope)) is not None:
            status, message = refusal
            await _send_http_error(send, status, error_json(scope["path"], status, message))
        else:
            await self.app(scope, receive, send)

    def _head_refusal(self, scope: HTTPScope) -> tuple[int, str] | None:
        limit = self.max_header_size
        target = len(scope["raw_path"]) + len(scope["query_string"])
        if target > limit:
            return 414, f"The request target is {target} bytes long; the limit is {limit} bytes."
        size = sum(len(name) + len(value) for name, value in scope["headers"])
        if size > limit:
            return 431, f"The request headers take {size} bytes; the limit is {limit} bytes."
        return None

    @staticmethod
    async def _refuse_websocket(scope: WebsocketScope, send: ASGISendCallable) -> None:
        if _WEBSOCKET_RESPONSE not in scope.get("extensions", {}):
            await send({"type": "websocket.close", "code": _POLICY_VIOLATION, "reason": ""})
            return
        path = scope["path"]
        body = error_json(
            path,
            404,
            f"This server does not accept WebSocket connections (no WebSocket route at "
            f"{shown(path)}); its API is plain HTTP.",
            code="websocket_not_supported",
        )
        await send(
            {
                "type": "websocket.http.response.start",
                "status": 404,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"x-request-id", str(uuid.uuid4()).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "websocket.http.response.body", "body": body, "more_body": False})


async def _send_http_error(send: ASGISendCallable, status: int, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"x-request-id", str(uuid.uuid4()).encode()),
                (b"connection", b"close"),
            ],
            "trailers": False,
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})
