"""Errors an HTTP request can fail with, their statuses and JSON bodies (docs/llm.md, "Errors");
a model's token limits and the errors for requests over them."""

from __future__ import annotations

import http
import math
from dataclasses import KW_ONLY, dataclass
from typing import Final, Protocol

from .._errors import (
    Cancelled,
    CannotConnect,
    ConnectionTimeout,
    Disconnected,
    DynamoError,
    EngineShutdown,
    InvalidArgument,
    ProtocolError,
    ResourceExhausted,
    ResponseTimeout,
    StreamIncomplete,
)
from ._protocol import EngineError


@dataclass(eq=False)
class RequestError(Exception):
    """A request the frontend refuses: its HTTP status, a message naming the parameter,
    and the error ``type`` and ``code`` if not the status's defaults for the API that
    renders it; ``param`` is the offending parameter's path (``"messages[0].content"``)."""

    status: int
    message: str
    _: KW_ONLY
    type: str | None = None
    code: str | None = None
    param: str | None = None

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def openai_body(self) -> dict[str, object]:
        """This error as an OpenAI error body."""
        return openai_error_body(
            self.status, self.message, type=self.type, code=self.code, param=self.param
        )

    def anthropic_body(self) -> dict[str, object]:
        """This error as an Anthropic error body (also the data of an ``error`` event)."""
        return anthropic_error_body(self.status, self.message, type=self.type)


# status: (OpenAI type, Anthropic type, OpenAI code when the caller gives none);
# None: the default for the status class (docs/llm.md, "Errors").
_BY_STATUS: Final[dict[int, tuple[str | None, str | None, str | None]]] = {
    400: ("invalid_request_error", "invalid_request_error", None),
    401: ("authentication_error", "authentication_error", None),
    402: (None, "billing_error", None),
    403: ("permission_error", "permission_error", None),
    404: ("not_found_error", "not_found_error", None),
    408: ("timeout_error", "timeout_error", None),
    413: (None, "request_too_large", "request_too_large"),
    415: (None, None, "unsupported_media_type"),
    429: ("rate_limit_error", "rate_limit_error", None),
    499: ("request_cancelled", "request_cancelled", "request_cancelled"),
    502: ("bad_gateway", None, "bad_gateway"),
    503: ("service_unavailable", "overloaded_error", "service_unavailable"),
    504: ("timeout_error", "timeout_error", "timeout"),
    529: ("service_unavailable", "overloaded_error", None),
}
_UNLISTED: Final = (None, None, None)

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
    """The OpenAI error ``type`` for an HTTP status."""
    default = "server_error" if status >= 500 else "invalid_request_error"
    return _BY_STATUS.get(status, _UNLISTED)[0] or default


def anthropic_error_type(status: int) -> str:
    """The Anthropic error ``type`` for an HTTP status."""
    default = "api_error" if status >= 500 else "invalid_request_error"
    return _BY_STATUS.get(status, _UNLISTED)[1] or default


def openai_error_body(
    status: int,
    message: str,
    *,
    type: str | None = None,
    code: str | None = None,
    param: str | None = None,
) -> dict[str, object]:
    """An OpenAI error body: ``{"error": {"message", "type", "param", "code"}}``;
    ``type`` and ``code`` default from ``status``."""
    return {
        "error": {
            "message": message,
            "type": type or openai_error_type(status),
            "param": param,
            "code": code if code is not None else _BY_STATUS.get(status, _UNLISTED)[2],
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
    try:
        return _EXTRA_PHRASES.get(status) or http.HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


_STATUS_OF: Final[tuple[tuple[tuple[type[BaseException], ...], int], ...]] = (
    ((InvalidArgument,), 400),
    ((Cancelled,), 499),
    ((ProtocolError, EngineError), 502),
    ((CannotConnect, Disconnected, StreamIncomplete, EngineShutdown, ResourceExhausted), 503),
    ((ConnectionTimeout, ResponseTimeout), 504),
)


def status_for_error(exc: BaseException) -> int:
    """The HTTP status a failed request is answered with (docs/llm.md, "Errors")."""
    if isinstance(exc, RequestError):
        return exc.status
    return next((status for kinds, status in _STATUS_OF if isinstance(exc, kinds)), 500)


CONTEXT_LENGTH_EXCEEDED: Final = "context_length_exceeded"
"""The OpenAI error ``code`` of a request whose prompt and output do not fit the context."""


class TokenLimits(Protocol):
    """What a model can take and give, in tokens (a model card has these fields)."""

    @property
    def context_length(self) -> int | None:
        """Prompt plus output, at most; ``None`` if unknown."""

    @property
    def max_output_tokens(self) -> int | None: ...


def check_output_tokens(
    limits: TokenLimits, requested: dict[str, int | None], *, model: str, anthropic: bool = False
) -> None:
    """Refuse (400 naming it) the first of ``requested`` (``{param: count or None}``) over the
    model's limits, worded as Anthropic's API does if ``anthropic``."""
    known = [n for n in (limits.max_output_tokens, limits.context_length) if n is not None]
    ceiling = min(known, default=math.inf)  # the most tokens one request may ask to generate
    for param, value in requested.items():
        if value is None or value <= ceiling:
            continue
        if anthropic:
            message = (
                f"{param}: {value} > {ceiling}, which is the maximum allowed number of "
                f"output tokens for {model}"
            )
        else:
            message = (
                f"{param} is too large: {value}. This model supports at most {ceiling} "
                f"completion tokens, whereas you provided {value}."
            )
        raise RequestError(400, message, param=param, code="invalid_value")


@dataclass(eq=False, kw_only=True)
class ContextLengthExceeded(ValueError):
    """An engine's refusal: the prompt, plus the tokens asked for, exceed the context window;
    ``max_tokens`` is None if the prompt alone does not fit, ``prompt_kind`` names the prompt
    (``"messages"``, ``"prompt"``), and a prompt refused before it was tokenized has
    ``prompt_tokens`` None and ``prompt_chars``: its characters, and the most that could fit."""

    context_length: int
    prompt_tokens: int | None
    max_tokens: int | None
    prompt_kind: str = "messages"
    prompt_chars: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        kind, prompt_tokens, max_tokens = self.prompt_kind, self.prompt_tokens, self.max_tokens
        reduce = kind
        if prompt_tokens is None:
            assert self.prompt_chars is not None, "a prompt refused untokenized needs prompt_chars"
            chars, most = self.prompt_chars
            what = f"your {kind} contains {chars} characters (more than {most}, the most "
            what += f"that {self.context_length} tokens can hold)"
        elif max_tokens is None:
            what = f"your {kind} resulted in {prompt_tokens} tokens"
        else:
            what = f"you requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the "
            what += f"{kind}, {max_tokens} in the completion)"
            reduce += " or completion"
        super().__init__(
            f"This model's maximum context length is {self.context_length} tokens. However, "
            f"{what}. Please reduce the length of the {reduce}."
        )


def context_length_error(error: DynamoError, *, param: str | None) -> RequestError | None:
    """The 400 (blaming ``param``) for a worker's :class:`ContextLengthExceeded`, else None."""
    if error.caused_by != ContextLengthExceeded.__name__:
        return None
    return RequestError(400, error.message, param=param, code=CONTEXT_LENGTH_EXCEEDED)
