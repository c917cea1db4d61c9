"""Decoding JSON request bodies: msgspec plus the checks it does not make (docs/llm.md)."""

from __future__ import annotations

import json
import math
import re
from collections import deque
from itertools import chain, islice
from typing import TYPE_CHECKING, Final, cast

import msgspec

from ._errors import RequestError
from ._validate import invalid_value, join

if TYPE_CHECKING:
    from collections.abc import Collection, Iterator

INTEGER_RANGE: Final = (-(2**63), 2**64 - 1)
"""The integers a request may contain: what a signed or unsigned 64-bit field can hold."""

_DECODER: Final = msgspec.json.Decoder()

# A \uD800-\uDBFF escape not followed by a \uDC00-\uDFFF one, or a lone low one,
# outside an escaped backslash.
_LONE_SURROGATE: Final = re.compile(
    rb"(?<!\\)(?:\\\\)*(\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    rb"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2})"
)
_SURROGATE_ESCAPE: Final = re.compile(rb"\\u[dD][89a-fA-F]")  # (a quick first look)
_BYTE_OFFSET: Final = re.compile(r"\(byte (\d+)\)")
_NOT_FINITE: Final = "NaN and Infinity are not JSON numbers"
_PATH_SEARCH_BYTES: Final = 1 << 20  # the largest body whose error is explained in detail
_PATH_SEARCH_VALUES: Final = 20_000  # the values searched for a NaN's path
_CONTAINERS: Final[frozenset[type]] = frozenset({dict, list})
_OBJECTS: Final[frozenset[type]] = frozenset({dict})
_SCAN_IN_C: Final = 16  # above this many items, a container is first checked in C
_NUMBERS: Final[frozenset[type]] = frozenset({int, float, bool})


def decode_json_body(body: bytes, *, max_depth: int) -> object:
    """Decode a request body that must be one JSON value (RFC 8259, UTF-8), ``[]`` depth 1: a
    400 :class:`RequestError` for invalid JSON, deeper nesting or a repeated key; with ``param``
    the path of an integer outside :data:`INTEGER_RANGE` or a NaN/Infinity."""
    try:
        value = _DECODER.decode(body)
    except RecursionError:
        raise _too_deep(max_depth) from None
    except msgspec.DecodeError as exc:  # ValidationError ("Number out of range") included
        raise _not_json(body, str(exc)) from None
    if not isinstance(value, dict | list):
        return value
    members, outside_range = _scan(value, max_depth)
    # Outside strings, every ':' separates a key from its value: fewer members than
    # separators means a repeated key (docs/llm.md, "Request bodies").
    if body.count(b":") != members and _skeleton(body).count(b":") != members:
        raise _duplicate_key(body)
    if outside_range:
        _check_integers(value)
    return value


def _skeleton(body: bytes) -> bytes:
    """``body`` (valid JSON) without its string literals (split on ``"`` once escapes are gone)."""
    if b"\\" in body:
        body = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    return b"".join(body.split(b'"')[::2])


def _scan(value: dict[str, object] | list[object], max_depth: int) -> tuple[int, bool]:
    """The objects' key/value pairs, and whether an integer may be out of range (or too deep)."""
    low, high = INTEGER_RANGE
    members, outside = 0, False
    pending: list[tuple[dict[str, object] | list[object], int]] = [(value, 1)]
    while pending:
        container, depth = pending.pop()
        if depth > max_depth:
            raise _too_deep(max_depth)
        children: Collection[object] = container
        if isinstance(container, dict):
            members += len(container)
            children = container.values()
        if len(children) > _SCAN_IN_C:
            # A long run of scalars is checked in C, without a Python loop per item.
            types = set(map(type, children))
            if types.isdisjoint(_CONTAINERS):
                outside = outside or (int in types and _may_be_outside(children, types))
                continue
            if types == _OBJECTS and depth < max_depth:
                # So is a long run of objects of scalars (chat messages, say).
                objects = cast("Collection[dict[str, object]]", children)
                values = list(chain.from_iterable(map(dict.values, objects)))
                types = set(map(type, values))
                if types.isdisjoint(_CONTAINERS):
                    members += sum(map(len, objects))
                    outside = outside or (int in types and _may_be_outside(values, types))
                    continue
        for child in children:
            if isinstance(child, dict | list):
                pending.append((child, depth + 1))
            elif type(child) is int and not low <= child <= high:
                outside = True
    return members, outside


def _may_be_outside(scalars: Collection[object], types: set[type]) -> bool:
    low, high = INTEGER_RANGE
    if types <= _NUMBERS:
        numbers = cast("Collection[float]", scalars)
        return min(numbers) < low or max(numbers) > high
    return any(type(x) is int and not low <= x <= high for x in scalars)


def _check_integers(value: object, path: str = "") -> None:
    """Raise for the first integer outside :data:`INTEGER_RANGE`, naming its path."""
    low, high = INTEGER_RANGE
    if type(value) is int and not low <= value <= high:  # never the whole body: path is set
        detail = f"integers must be between -2**63 and 2**64-1, but got {_abbreviate(str(value))}."
        raise invalid_value(path, detail)
    for item, item_path in _children(value, path):
        _check_integers(item, item_path)


def _children(value: object, path: str) -> Iterator[tuple[object, str]]:
    """The items of a JSON object or array, each with its path."""
    if isinstance(value, dict):
        yield from ((item, join(path, key)) for key, item in value.items())
    elif isinstance(value, list):
        yield from ((item, join(path, index)) for index, item in enumerate(value))


def _too_deep(max_depth: int) -> RequestError:
    return RequestError(
        400,
        f"The request body nests arrays and objects more than {max_depth} levels deep; "
        f"this server accepts at most {max_depth}.",
    )


def _duplicate_key(body: bytes) -> RequestError:
    """The error naming the first key that appears twice in one object."""
    repeated: list[str] = []

    def pairs(items: list[tuple[str, object]]) -> dict[str, object]:
        seen: dict[str, object] = {}
        for key, item in items:
            if key in seen and not repeated:
                repeated.append(key)
            seen[key] = item
        return seen

    # The body decoded once already and its depth is bounded: this cannot fail.
    json.loads(body, object_pairs_hook=pairs)
    key = _abbreviate(repeated[0]) if repeated else "?"
    return RequestError(
        400,
        f"The request body is not valid JSON for this API: the key {key!r} appears more "
        "than once in one object.",
    )


def _not_json(body: bytes, reason: str) -> RequestError:
    explanation = _explain(body, reason)
    if explanation.startswith(_NOT_FINITE):
        param = _non_finite_path(body)
        if param is not None:
            return invalid_value(param, f"{explanation}; the request body is not valid JSON.")
    return RequestError(400, f"The request body is not valid JSON: {explanation}.")


def _non_finite_path(body: bytes) -> str | None:
    """The path of the first NaN or Infinity in a body JSON but for them (within bounds)."""
    if len(body) > _PATH_SEARCH_BYTES:
        return None
    try:
        lenient = json.loads(body)  # Python's json reads NaN and Infinity
    except (ValueError, RecursionError):
        return None
    pending: deque[tuple[object, str]] = deque([(lenient, "")])
    budget = _PATH_SEARCH_VALUES
    while pending:
        value, path = pending.popleft()
        if isinstance(value, float) and not math.isfinite(value):
            return path or None
        before = len(pending)
        pending.extend(islice(_children(value, path), budget))
        budget -= len(pending) - before
    return None


def _explain(body: bytes, reason: str) -> str:
    """msgspec's reason, reworded for a client (and made precise where msgspec is vague)."""
    if not body.strip():
        return "the body is empty"
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"it is not UTF-8 (invalid byte at byte {exc.start})"
    small = len(body) <= _PATH_SEARCH_BYTES
    if small and _SURROGATE_ESCAPE.search(body) and (surrogate := _LONE_SURROGATE.search(body)):
        escape = surrogate.group(1).decode("ascii")
        return (
            f"the escape {escape} at byte {surrogate.start(1)} is half of a UTF-16 "
            "surrogate pair without its other half"
        )
    if reason.startswith("Number out of range"):
        return "a number is too large to represent (the largest is about 1.8e308)"
    offset = _BYTE_OFFSET.search(reason)
    if offset is not None and "invalid character" in reason:
        at = int(offset.group(1))
        for start in (at, at - 1):
            if body[start:].startswith((b"NaN", b"Infinity", b"-Infinity")):
                return f"{_NOT_FINITE} (byte {start})"
    if reason == "Input data was truncated":
        return "it ends before the JSON value does"
    return reason.removeprefix("JSON is malformed: ")


def _abbreviate(text: str, limit: int = 64) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
