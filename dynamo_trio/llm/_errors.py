"""Errors an HTTP request can fail with, and the JSON bodies that report them.

Parsers raise :class:`RequestError` for bad input; it carries the HTTP status
and, for 400s, the ``param`` it is about.  The frontend renders it (or any
other failure, through :func:`status_for_error`) in the shape its API uses:
(:func:`openai_error_body`, :func:`anthropic_error_body`; the same bodies are
the data of the streams' error events).

499 and ``request_cancelled`` follow Dynamo: a request cancelled on its way
(client gone, or the work cancelled for its own reasons) is a 499 "Client
Closed Request", not a 500.  502 ``bad_gateway`` is a worker's failure (output
that is not a valid response, an engine error): the gateway's upstream failed,
not the request.  A message that reaches a client is at most
:data:`MAX_ERROR_MESSAGE` characters (:func:`bounded_message`): a worker's
error text is cut there.
"""

from __future__ import annotations

import http
from typing import Final

from .._errors import (
    Cancelled,
    CannotConnect,
    ConnectionTimeout,
    Disconnected,
    EngineShutdown,
    InvalidArgument,
    ProtocolError,
    ResourceExhausted,
    ResponseTimeout,
    StreamIncomplete,
)
from ._protocol import EngineError

__all__ = [
    "MAX_ERROR_MESSAGE",
    "RequestError",
    "anthropic_error_body",
    "anthropic_error_type",
    "bounded_message",
    "openai_error_body",
    "openai_error_type",
    "reason_phrase",
    "status_for_error",
]


class RequestError(Exception):
    """A request the frontend refuses, with the HTTP status to answer it with.

    Args:
        status: The HTTP status (400 for bad input).
        message: What is wrong, for a human; names the parameter.
        type: The error ``type`` to report; by default derived from ``status``
            for whichever API renders the error.
        code: A machine-readable code (e.g. ``"model_not_found"``), or ``None``
            for the status's default.
        param: The offending parameter as a path (``"messages[0].content"``).
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,
        code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status: Final = status
        self.message: Final = message
        self.type: Final = type
        self.code: Final = code
        self.param: Final = param

    def __repr__(self) -> str:
        return f"RequestError({self.status}, {self.message!r}, param={self.param!r})"

    def openai_body(self) -> dict[str, object]:
        """This error as an OpenAI error body."""
        return openai_error_body(
            self.status, self.message, type=self.type, code=self.code, param=self.param
        )

    def anthropic_body(self) -> dict[str, object]:
        """This error as an Anthropic error body (also the data of an ``error`` event)."""
        return anthropic_error_body(self.status, self.message, type=self.type)


_OPENAI_TYPES: Final[dict[int, str]] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    429: "rate_limit_error",
    499: "request_cancelled",
    502: "bad_gateway",
    503: "service_unavailable",
    529: "service_unavailable",
    504: "timeout_error",
}

_ANTHROPIC_TYPES: Final[dict[int, str]] = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    499: "request_cancelled",
    503: "overloaded_error",
    529: "overloaded_error",
    504: "timeout_error",
}

# Codes the OpenAI body carries when the caller gives none: the ones a client
# can act on without parsing the message.
_OPENAI_DEFAULT_CODES: Final[dict[int, str]] = {
    413: "request_too_large",
    415: "unsupported_media_type",
    499: "request_cancelled",
    502: "bad_gateway",
    503: "service_unavailable",
    504: "timeout",
}

MAX_ERROR_MESSAGE: Final = 1000
"""The longest error message a client is sent, in characters."""

_CUT_MARK: Final = " [...]"


def bounded_message(message: str) -> str:
    """``message`` cut to :data:`MAX_ERROR_MESSAGE` characters (marked as cut), so
    that a worker's error text, whatever its size, reaches a client bounded."""
    if len(message) <= MAX_ERROR_MESSAGE:
        return message
    return message[: MAX_ERROR_MESSAGE - len(_CUT_MARK)] + _CUT_MARK


_EXTRA_PHRASES: Final[dict[int, str]] = {499: "Client Closed Request", 529: "Overloaded"}


def openai_error_type(status: int) -> str:
    """The OpenAI error ``type`` for an HTTP status (and :func:`anthropic_error_type`
    the Anthropic one):

    =======================  ========================  =========================
    status                   OpenAI ``type``           Anthropic ``type``
    =======================  ========================  =========================
    400, 405, 415, 422       invalid_request_error     invalid_request_error
    401                      authentication_error      authentication_error
    402                      invalid_request_error     billing_error
    403                      permission_error          permission_error
    404                      not_found_error           not_found_error
    408, 504                 timeout_error             timeout_error
    413                      invalid_request_error     request_too_large
    429                      rate_limit_error          rate_limit_error
    499 Client Closed Req.   request_cancelled         request_cancelled
    502                      bad_gateway               api_error
    503, 529                 service_unavailable       overloaded_error
    other 4xx                invalid_request_error     invalid_request_error
    other 5xx                server_error              api_error
    =======================  ========================  =========================
    """
    return _OPENAI_TYPES.get(status) or (
        "server_error" if status >= 500 else "invalid_request_error"
    )


def anthropic_error_type(status: int) -> str:
    """The Anthropic error ``type`` for an HTTP status (see :func:`openai_error_type`)."""
    return _ANTHROPIC_TYPES.get(status) or (
        "api_error" if status >= 500 else "invalid_request_error"
    )


def openai_error_body(
    status: int,
    message: str,
    *,
    type: str | None = None,
    code: str | None = None,
    param: str | None = None,
) -> dict[str, object]:
    """An OpenAI error body: ``{"error": {"message", "type", "param", "code"}}``.

    ``type`` defaults from ``status``; ``code`` defaults to a code for the
    statuses a client may want to tell apart (413, 415, 499, 502, 503, 504), else null.
    """
    return {
        "error": {
            "message": message,
            "type": type or openai_error_type(status),
            "param": param,
            "code": code if code is not None else _OPENAI_DEFAULT_CODES.get(status),
        }
    }


def anthropic_error_body(
    status: int, message: str, *, type: str | None = None
) -> dict[str, object]:
    """An Anthropic error body: ``{"type": "error", "error": {"type", "message"}}``."""
    return {
        "type": "error",
        "error": {"type": type or anthropic_error_type(status), "message": message},
    }


def reason_phrase(status: int) -> str:
    """The HTTP reason phrase, including the non-standard 499 and 529."""
    if status in _EXTRA_PHRASES:
        return _EXTRA_PHRASES[status]
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


def status_for_error(exc: BaseException) -> int:
    """The HTTP status a failed request is answered with.

    :class:`RequestError` keeps its own status.  Request-plane errors map as
    the spec says: invalid argument 400, cancelled 499, no instances (none
    listed, or none that can be connected to), a shutting-down or saturated
    worker, or a worker lost mid-request that no other instance could take over
    (:class:`~dynamo_trio.Disconnected`, :class:`~dynamo_trio.StreamIncomplete`)
    503: the server's trouble, not the request's, so a client may retry it;
    a worker's failure, bytes or output from a worker that are not a valid
    response (:class:`~dynamo_trio.ProtocolError`, an
    :class:`~dynamo_trio.llm.EngineError`) 502; timeouts 504; anything else 500.
    """
    if isinstance(exc, RequestError):
        return exc.status
    if isinstance(exc, InvalidArgument):
        return 400
    if isinstance(exc, Cancelled):
        return 499
    if isinstance(exc, ProtocolError | EngineError):
        return 502
    # CannotConnect (NoInstances is one): the request reached no worker; Disconnected
    # and StreamIncomplete: the worker serving it was lost and none could take it over.
    if isinstance(
        exc,
        CannotConnect | Disconnected | StreamIncomplete | EngineShutdown | ResourceExhausted,
    ):
        return 503
    if isinstance(exc, ConnectionTimeout | ResponseTimeout):
        return 504
    return 500
