"""One error hierarchy for everything a caller can see go wrong (on :class:`DynamoError`).

Names and wire codes are Dynamo's ``ErrorType``.  Cancellation caused by *this*
caller is never an error: the stream just ends; :class:`Cancelled` is for work
cancelled on the other side for its own reasons.  A live :class:`trio.Cancelled`
is never caught or converted.
"""

from __future__ import annotations

from typing import ClassVar, Final


class DynamoError(Exception):
    """Base of every error this package raises for a request (docs/api.md has the tree);
    ``caused_by`` names the remote exception type if a handler raised it (``"ValueError"``)."""

    error_type: ClassVar[str] = "Unknown"
    """The wire code (Dynamo's ``ErrorType`` name): each class of this module's own name
    unless it sets one; a subclass made elsewhere keeps its parent's, which peers know."""

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        if cls.__module__ == __name__ and "error_type" not in vars(cls):
            cls.error_type = cls.__name__

    def __init__(self, message: str = "", *, caused_by: str | None = None) -> None:
        super().__init__(message)
        self.message: Final = message
        self.caused_by: Final = caused_by

    def __str__(self) -> str:
        detail = f"{self.caused_by}: {self.message}" if self.caused_by else self.message
        return f"{self.error_type}: {detail}"


class InvalidArgument(DynamoError):
    """The request was malformed, or the handler rejected it (``ValueError``/``TypeError``)."""


class InvalidRequestId(InvalidArgument):
    """A request-id header (``x-request-id``, ``x-dynamo-request-id``) is not a valid id;
    ``header`` is its name, lower case (the HTTP layer reports it as the offending parameter)."""

    error_type = InvalidArgument.error_type

    def __init__(self, header: str, message: str) -> None:
        super().__init__(message)
        self.header: Final = header


class Cancelled(DynamoError):
    """The work was cancelled on the remote side for its own reasons (not by this caller)."""


class EngineShutdown(DynamoError):
    """The worker is shutting down: it refused the request or abandoned it."""


class ResourceExhausted(DynamoError):
    """A limit was reached (too many concurrent streams, a full queue)."""


class ConnectionTimeout(DynamoError):
    """The handler raised ``TimeoutError``, or a connection attempt timed out."""


class ResponseTimeout(DynamoError):
    """No response arrived within a configured bound: the worker went silent for
    longer than the caller's inactivity timeout, or the request's deadline passed."""


class StreamIncomplete(DynamoError):
    """The worker ended the stream before the work was complete, for a reason it gave:
    it stopped the request to shut down.  The output so far is valid but partial."""


class Unknown(DynamoError):
    """The handler raised an exception with no more specific mapping."""


class TransportError(DynamoError):
    """The request plane itself failed."""


class CannotConnect(TransportError):
    """No connection could be made to the worker."""


class NoInstances(CannotConnect):
    """No live instance serves the endpoint."""


class Disconnected(TransportError):
    """The connection to the worker was lost before the stream's terminal frame."""


class ProtocolError(TransportError):
    """A peer sent bytes that are not a valid frame sequence; the connection is closed."""


# Each class above that its code names.
_BY_CODE: Final = {
    cls.error_type: cls
    for cls in list(globals().values())
    if isinstance(cls, type) and issubclass(cls, DynamoError) and cls.error_type == cls.__name__
}


def error_from_wire(code: str, message: str, caused_by: str | None = None) -> DynamoError:
    """Rebuild an error from its wire code; a code the wire format does not define is a
    peer breaking the protocol: :class:`ProtocolError`, which says what it sent."""
    known = _BY_CODE.get(code)
    if known is not None:
        return known(message, caused_by=caused_by)
    said = f": {message}" if message else " and no message"
    return ProtocolError(f"the worker sent an error with the unknown code {code[:64]!r}{said}")


def error_from_exception(exc: BaseException) -> DynamoError:
    """The error a handler's exception is for its caller, mapped as Dynamo's Python bindings
    map them; a :class:`DynamoError` (a sub-request's, say) passes through as it is."""
    if isinstance(exc, DynamoError):
        return exc
    name = type(exc).__name__
    message = str(exc)
    if isinstance(exc, ValueError | TypeError):
        return InvalidArgument(message, caused_by=name)
    if isinstance(exc, TimeoutError):
        return ConnectionTimeout(message, caused_by=name)
    if isinstance(exc, ConnectionRefusedError):
        return CannotConnect(message, caused_by=name)
    if isinstance(exc, ConnectionError):
        return Disconnected(message, caused_by=name)
    if isinstance(exc, GeneratorExit):
        return EngineShutdown("engine shutting down", caused_by=name)
    return Unknown(message, caused_by=name)
