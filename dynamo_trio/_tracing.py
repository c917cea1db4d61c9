"""Trace context and request ids, with no I/O (docs/tracing.md): W3C ``traceparent``
parsing, which header names a request's id, and the headers a call carries."""

from __future__ import annotations

import random
import re
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal, final

from ._errors import InvalidArgument, InvalidRequestId

if TYPE_CHECKING:
    from collections.abc import Mapping

TRACEPARENT: Final = "traceparent"
TRACESTATE: Final = "tracestate"
X_REQUEST_ID: Final = "x-request-id"
X_DYNAMO_REQUEST_ID: Final = "x-dynamo-request-id"
REQUEST_ID: Final = "request-id"
"""The header Dynamo's ``Context.trace_headers()`` names the request id with."""
METADATA_PREFIX: Final = "meta:"

MAX_REQUEST_ID_LENGTH: Final = 256
MAX_TRACESTATE_LENGTH: Final = 512
"""W3C: a ``tracestate`` of up to 512 characters must be propagated; longer ones are dropped."""

# The most a call carries in its req frame's headers (request_plane._validate refuses more).
MAX_HEADERS: Final = 64
MAX_HEADER_NAME_LENGTH: Final = 256
MAX_HEADER_VALUE_LENGTH: Final = 8192
_TRACE_HEADERS: Final = (TRACEPARENT, TRACESTATE, X_REQUEST_ID)

MAX_METADATA_ENTRIES: Final = MAX_HEADERS - len(_TRACE_HEADERS)
MAX_METADATA_KEY_LENGTH: Final = MAX_HEADER_NAME_LENGTH - len(METADATA_PREFIX)
MAX_METADATA_VALUE_LENGTH: Final = MAX_HEADER_VALUE_LENGTH

_REQUEST_ID_RE: Final = re.compile(rf"[\x21-\x7e]{{1,{MAX_REQUEST_ID_LENGTH}}}")
_TRACEPARENT_RE: Final = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_TRACESTATE_RE: Final = re.compile(r"[\x20-\x7e]*")
_ZERO_TRACE: Final = "0" * 32
_ZERO_SPAN: Final = "0" * 16
_random_bits: Final = random.getrandbits
_SAMPLED: Final = 0x01
_OWS: Final = " \t"


@final
@dataclass(frozen=True, slots=True)
class ParsedTraceParent:
    """The fields of a valid ``traceparent`` header."""

    version: int
    trace_id: str
    parent_id: str
    flags: int


def parse_traceparent(value: str | None) -> ParsedTraceParent | None:
    """The fields of a W3C ``traceparent`` header, or ``None`` if it is absent or invalid."""
    value = (value or "").strip(_OWS)
    match = _TRACEPARENT_RE.match(value)
    if match is None:
        return None
    version_hex, trace_id, parent_id, flags_hex = match.groups()
    if version_hex == "ff" or trace_id == _ZERO_TRACE or parent_id == _ZERO_SPAN:
        return None
    version = int(version_hex, 16)
    rest = value[match.end() :]
    if rest and (version == 0 or not rest.startswith("-")):
        return None  # version 00 is exactly 55 characters; later ones extend after a '-'
    return ParsedTraceParent(version, trace_id, parent_id, int(flags_hex, 16))


def new_trace_id() -> str:
    """A random W3C trace id: 32 lowercase hex digits, never all zeros.  Random, not
    secret, as OpenTelemetry's SDKs make them (no system call; reseeded after fork)."""
    return _random_hex(128)


def new_span_id() -> str:
    """A random W3C span id: 16 lowercase hex digits, never all zeros."""
    return _random_hex(64)


def _random_hex(bits: int) -> str:
    while not (value := _random_bits(bits)):  # pragma: no cover - 2**-64 at most
        pass
    return f"{value:0{bits // 4}x}"


@final
@dataclass(frozen=True, slots=True)
class TraceContext:
    """Where a request is in its trace, on one process: what a Context's trace fields read.
    Built with :meth:`new` (a new trace) or :meth:`continued` (a new span under a parent)."""

    trace_id: str
    """The W3C trace id (32 hex digits), the same on every hop of the request."""
    span_id: str
    """This hop's span id (16 hex digits)."""
    parent_span_id: str | None = None
    """The span id of the hop that called this one, or ``None`` where the trace began."""
    flags: int = _SAMPLED
    """W3C trace flags (bit 0: sampled), passed on as received."""
    tracestate: str | None = None
    """The W3C ``tracestate`` received with the ``traceparent``, passed on unchanged."""
    x_request_id: str | None = None
    """The HTTP client's ``x-request-id``, carried along with the trace (as in Dynamo)."""

    @classmethod
    def new(cls, *, x_request_id: str | None = None) -> TraceContext:
        """A new trace, sampled (as Dynamo starts them), this hop its root span."""
        return cls(new_trace_id(), new_span_id(), x_request_id=x_request_id)

    @classmethod
    def continued(
        cls,
        traceparent: str | None,
        tracestate: str | None = None,
        *,
        x_request_id: str | None = None,
    ) -> TraceContext:
        """A new span under ``traceparent``; a new trace if it is absent or invalid."""
        parent = parse_traceparent(traceparent)
        if parent is None:
            return cls.new(x_request_id=x_request_id)
        state = (tracestate or "").strip(_OWS)
        if len(state) > MAX_TRACESTATE_LENGTH or not _TRACESTATE_RE.fullmatch(state):
            state = ""
        span = new_span_id()
        return cls(
            parent.trace_id, span, parent.parent_id, parent.flags, state or None, x_request_id
        )

    @property
    def sampled(self) -> bool:
        return bool(self.flags & _SAMPLED)

    def traceparent(self) -> str:
        """The ``traceparent`` naming this span as the parent of the next hop."""
        return f"00-{self.trace_id}-{self.span_id}-{self.flags:02x}"

    def headers(self) -> dict[str, str]:
        """The headers that carry this trace to the next hop."""
        headers = {TRACEPARENT: self.traceparent()}
        if self.tracestate is not None:
            headers[TRACESTATE] = self.tracestate
        if self.x_request_id is not None:
            headers[X_REQUEST_ID] = self.x_request_id
        return headers


def is_valid_request_id(value: str) -> bool:
    """1 to 256 printable ASCII characters, without spaces."""
    return _REQUEST_ID_RE.fullmatch(value) is not None


@final
@dataclass(frozen=True, slots=True)
class RequestIds:
    """What :func:`request_ids` decided for one HTTP request."""

    request_id: str
    """The request's id: its Context's ``id()`` on every process."""
    x_request_id: str | None
    """The client's own ``x-request-id``, if it sent one."""
    source: Literal["x-dynamo-request-id", "x-request-id", "generated"]
    """Where :attr:`request_id` came from."""

    def response_headers(self) -> list[tuple[str, str]]:
        """What the response carries: ``x-request-id`` (the client's own, else the
        request's id) and ``x-dynamo-request-id`` (the request's id)."""
        echoed = self.x_request_id if self.x_request_id is not None else self.request_id
        return [(X_REQUEST_ID, echoed), (X_DYNAMO_REQUEST_ID, self.request_id)]


def _given(header: str, value: str | None) -> str | None:
    if value is not None and not is_valid_request_id(value):
        limits = f"1 to {MAX_REQUEST_ID_LENGTH} printable ASCII characters without spaces"
        raise InvalidRequestId(header, f"{header} must be {limits}.")
    return value


def request_ids(x_request_id: str | None, x_dynamo_request_id: str | None) -> RequestIds:
    """Decide a request's id from its ``x-request-id`` and ``x-dynamo-request-id`` headers;
    both are checked (InvalidRequestId), ``x-request-id`` first, whichever is used."""
    plain = _given(X_REQUEST_ID, x_request_id)
    dynamo = _given(X_DYNAMO_REQUEST_ID, x_dynamo_request_id)
    if dynamo is not None:
        return RequestIds(dynamo, plain, X_DYNAMO_REQUEST_ID)
    if plain is not None:
        return RequestIds(plain, plain, X_REQUEST_ID)
    return RequestIds(str(uuid.uuid4()), None, "generated")


def check_metadata(metadata: Mapping[Any, Any]) -> None:
    """Refuse (InvalidArgument) context metadata that cannot travel in a request frame."""
    if len(metadata) > MAX_METADATA_ENTRIES:
        raise InvalidArgument(
            f"context metadata has {len(metadata)} entries; at most "
            f"{MAX_METADATA_ENTRIES} travel with a request"
        )
    for key, value in metadata.items():
        if not isinstance(key, str) or len(key) > MAX_METADATA_KEY_LENGTH:
            raise InvalidArgument(
                f"context metadata keys must be strings of at most "
                f"{MAX_METADATA_KEY_LENGTH} characters (got {_short(key)})"
            )
        if not isinstance(value, str) or len(value) > MAX_METADATA_VALUE_LENGTH:
            raise InvalidArgument(
                f"context metadata[{_short(key)}] must be a string of at most "
                f"{MAX_METADATA_VALUE_LENGTH} characters"
            )


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def request_headers(
    trace: TraceContext | None, metadata: Mapping[str, str]
) -> dict[str, str] | None:
    """The ``headers`` of a call's ``req`` frame (``None`` when there is nothing to send);
    ``metadata`` must have passed :func:`check_metadata`."""
    if trace is None and not metadata:
        return None
    headers = trace.headers() if trace is not None else {}
    for key, value in metadata.items():
        headers[METADATA_PREFIX + key] = value
    return headers


def read_request_headers(headers: Mapping[str, str]) -> tuple[TraceContext, dict[str, str]]:
    """A worker's own span of the caller's trace (or a new trace), and the caller's metadata;
    unknown header names are ignored (a newer caller may send more)."""
    trace = TraceContext.continued(
        headers.get(TRACEPARENT), headers.get(TRACESTATE), x_request_id=headers.get(X_REQUEST_ID)
    )
    prefix = METADATA_PREFIX
    metadata = {name[len(prefix) :]: v for name, v in headers.items() if name.startswith(prefix)}
    return trace, metadata
