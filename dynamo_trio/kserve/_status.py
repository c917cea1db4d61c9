"""gRPC status codes, and the one mapping from a failure to the status a call ends with.

The frontend's own errors keep the HTTP status the OpenAI routes answer with, translated
once in :data:`_FROM_HTTP`, so the two frontends never disagree on what a failure means.
"""

from __future__ import annotations

import enum
from typing import Final, final

from google.protobuf.message import DecodeError

from .._errors import DynamoError
from ..llm import RequestError, status_for_error
from ._wire import WireError


class Status(enum.IntEnum):
    """The gRPC status codes this server sends."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    RESOURCE_EXHAUSTED = 8
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14


@final
class GrpcError(Exception):
    """A call's failure decided by the gRPC server itself, with its status."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


_FROM_HTTP: Final = {
    400: Status.INVALID_ARGUMENT,
    404: Status.NOT_FOUND,
    413: Status.RESOURCE_EXHAUSTED,
    499: Status.CANCELLED,
    502: Status.UNAVAILABLE,
    503: Status.UNAVAILABLE,
    504: Status.DEADLINE_EXCEEDED,
}


def status_for(exc: BaseException) -> tuple[Status, str]:
    """The status and message a call that failed with ``exc`` ends with."""
    if isinstance(exc, GrpcError):
        return exc.status, exc.message
    if isinstance(exc, WireError):
        if exc.too_large:
            return Status.RESOURCE_EXHAUSTED, str(exc)
        return (Status.UNIMPLEMENTED if exc.unimplemented else Status.INVALID_ARGUMENT), str(exc)
    if isinstance(exc, DecodeError):
        return Status.INVALID_ARGUMENT, f"the message is not valid protobuf: {exc}"
    if isinstance(exc, RequestError | DynamoError):
        message = exc.message if isinstance(exc, DynamoError) and exc.message else str(exc)
        return _FROM_HTTP.get(status_for_error(exc), Status.INTERNAL), message
    return Status.INTERNAL, "Internal server error."
