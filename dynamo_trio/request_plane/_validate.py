"""Checks on the fields of a received ``req`` frame: a bad value fails that stream alone,
naming the field (docs/protocol.md tables the ranges)."""

from __future__ import annotations

import math
from typing import Any, Final

from .._errors import InvalidArgument
from .._tracing import MAX_HEADER_NAME_LENGTH, MAX_HEADER_VALUE_LENGTH, MAX_HEADERS
from ._frames import RawRequest, Request

MAX_WINDOW: Final = 1 << 24  # the largest initial credit window a stream may ask for
MAX_CREDIT: Final = 1 << 32  # the most credits a stream may hold (more: a protocol error)
MAX_NAME_LENGTH: Final = 4096

_SCALARS: Final = frozenset({str, int, float, bool, type(None)})


def validate_request(raw: RawRequest) -> Request:
    """The checked :class:`Request` for ``raw`` (InvalidArgument naming the first bad field)."""
    endpoint = _name("endpoint", raw.endpoint)
    instance_id = raw.instance_id
    if type(instance_id) is not int or not 0 <= instance_id < 2**64:
        raise _invalid("instance_id", "an integer in 0 .. 2**64-1", instance_id)
    request_id = _name("request_id", raw.request_id)
    window = raw.window
    if type(window) is not int or not 1 <= window <= MAX_WINDOW:
        raise _invalid("window", f"an integer in 1 .. {MAX_WINDOW}", window)
    timeout = raw.timeout
    if timeout is not None:
        if type(timeout) not in (int, float) or not math.isfinite(timeout) or timeout < 0:
            raise _invalid("timeout", "absent, or a finite number of seconds >= 0", timeout)
        timeout = float(timeout)
    if raw.headers is not None:
        _check_headers(raw.headers)
    if (problem := json_problem(raw.payload)) is not None:
        raise InvalidArgument(f"invalid request frame: `payload` {problem}")
    return Request(
        raw.sid, endpoint, instance_id, request_id, raw.payload, window, timeout, raw.headers
    )


def _name(field: str, value: Any) -> str:
    if type(value) is not str or not 1 <= len(value) <= MAX_NAME_LENGTH:
        raise _invalid(field, f"a string of 1 to {MAX_NAME_LENGTH} characters", value)
    return value


def _check_headers(headers: Any) -> None:
    if type(headers) is not dict:
        raise _invalid("headers", "absent, or a map of strings to strings", headers)
    if len(headers) > MAX_HEADERS:
        raise InvalidArgument(
            f"invalid request frame: `headers` has {len(headers)} entries; "
            f"the limit is {MAX_HEADERS}"
        )
    for name, value in headers.items():
        if type(name) is not str or not 1 <= len(name) <= MAX_HEADER_NAME_LENGTH:
            raise _invalid("headers", f"names of 1 to {MAX_HEADER_NAME_LENGTH} characters", name)
        if type(value) is not str or len(value) > MAX_HEADER_VALUE_LENGTH:
            expected = f"a string of at most {MAX_HEADER_VALUE_LENGTH} characters"
            raise _invalid(f"headers[{_short(name)}]", expected, value)


def _invalid(field: str, expected: str, value: Any) -> InvalidArgument:
    got = _short(value)
    return InvalidArgument(f"invalid request frame: `{field}` must be {expected} (got {got})")


def _short(value: Any) -> str:
    if type(value) in _SCALARS:
        text = repr(value)
        return text if len(text) <= 40 else f"{text[:37]}..."
    return f"a {type(value).__name__}"


_Link = tuple["_Link | None", str | int] | None  # (parent link, key): a path, built backwards


def json_problem(value: Any) -> str | None:
    """Why ``value`` is not JSON-like (naming an offending path), or ``None`` if it is;
    iterative and linear in the size of the value, however deep."""
    if type(value) in _SCALARS:
        return None
    stack: list[tuple[Any, _Link]] = [(value, None)]
    while stack:
        node, link = stack.pop()
        kind = type(node)
        if kind is not dict and kind is not list:
            return f"must be JSON-like: {_path(link)} is a {kind.__name__}"
        for key, child in node.items() if kind is dict else enumerate(node):
            if kind is dict and type(key) is not str:
                return f"must be JSON-like: a map key at {_path(link)} is {_short(key)}"
            if type(child) not in _SCALARS:
                stack.append((child, (link, key)))
    return None


def _path(link: _Link) -> str:
    parts: list[str | int] = []
    while link is not None:
        link, key = link
        parts.append(key)
    return "payload" + "".join(f"[{part!r}]" for part in reversed(parts))
