"""JSON request bodies: decoding them (msgspec plus the checks it does not make), then their
typed fields; 400s name the parameter (docs/llm.md)."""

from __future__ import annotations

import json
import math
import re
from collections import deque
from collections.abc import Mapping
from itertools import chain, islice
from typing import TYPE_CHECKING, Final, cast

import msgspec

from ._errors import RequestError

if TYPE_CHECKING:
    from collections.abc import Collection, Iterator

    from ._protocol import EngineMessage

JsonObject = Mapping[str, object]

MAX_MODEL_NAME_LENGTH: Final = 256  # (a Hugging Face org/name is at most 96 + 96)
MAX_STOP_SEQUENCE_LENGTH: Final = 1024  # characters: engines match each against every token

_TYPE_NAMES: Final[dict[type, str]] = {
    type(None): "null",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "an array",
    dict: "an object",
}


def join(prefix: str, key: str | int) -> str:
    """The path of ``key`` under ``prefix``: ``messages[0]``, ``stream_options.include_usage``."""
    if isinstance(key, int):
        return f"{prefix}[{key}]"
    return f"{prefix}.{key}" if prefix else key


def _bad_request(param: str | None, message: str, code: str) -> RequestError:
    return RequestError(400, message, param=param, code=code)


def invalid_type(param: str | None, expected: str, value: object) -> RequestError:
    """The error for a value of the wrong JSON type (``param=None`` is the whole body)."""
    where = f"'{param}'" if param else "the request body"
    got = _TYPE_NAMES.get(type(value), type(value).__name__)  # "an integer", "null"...
    message = f"Invalid type for {where}: expected {expected}, but got {got} instead."
    return _bad_request(param, message, "invalid_type")


def invalid_value(param: str, detail: str) -> RequestError:
    """The error for a value of the right type that is not allowed."""
    return _bad_request(param, f"Invalid value for '{param}': {detail}", "invalid_value")


def unsupported(param: str, detail: str) -> RequestError:
    """The error for a valid value that this server does not implement."""
    return _bad_request(param, f"Unsupported value for '{param}': {detail}", "unsupported_value")


def expect_object(value: object, param: str | None) -> JsonObject:
    """``value`` as a JSON object, or a 400 naming ``param``."""
    if not isinstance(value, dict):
        raise invalid_type(param, "an object", value)
    return value


def expect_list(value: object, param: str) -> list[object]:
    """``value`` as a JSON array, or a 400 naming ``param``."""
    if not isinstance(value, list):
        raise invalid_type(param, "an array", value)
    return value


def expect_str(
    value: object, param: str, *, nonempty: bool = False, max_length: int | None = None
) -> str:
    """``value`` as a string, or a 400 naming ``param``; ``nonempty`` refuses ``""``,
    ``max_length`` longer ones."""
    if not isinstance(value, str):
        raise invalid_type(param, "a string", value)
    if nonempty and not value:
        raise invalid_value(param, "expected a non-empty string.")
    if max_length is not None and len(value) > max_length:
        detail = f"expected at most {max_length} characters, but got {len(value)} characters."
        raise invalid_value(param, detail)
    return value


def required(body: JsonObject, key: str, prefix: str = "") -> object:
    """The value of a required field (present and not null)."""
    value = body.get(key)
    if value is None:
        param = join(prefix, key)
        raise _bad_request(
            param, f"Missing required parameter: '{param}'.", "missing_required_parameter"
        )
    return value


def required_str(
    body: JsonObject,
    key: str,
    prefix: str = "",
    *,
    nonempty: bool = False,
    max_length: int | None = None,
) -> str:
    """A required string field (:func:`expect_str`'s checks)."""
    value = required(body, key, prefix)
    return expect_str(value, join(prefix, key), nonempty=nonempty, max_length=max_length)


def read_messages(
    body: JsonObject,
    roles: tuple[str, ...],
    part_types: frozenset[str],
    *,
    contentless: str | None = None,
) -> tuple[EngineMessage, ...]:
    """The required, non-empty ``messages`` array of a chat or Anthropic body."""
    items = expect_list(required(body, "messages"), "messages")
    if not items:
        raise invalid_value("messages", "expected at least one message, but got an empty array.")
    return tuple(
        message(item, "messages", index, roles, part_types, contentless=contentless)
        for index, item in enumerate(items)
    )


def message(
    value: object,
    key: str,
    index: int,
    roles: tuple[str, ...],
    part_types: frozenset[str],
    *,
    contentless: str | None = None,
) -> EngineMessage:
    """Item ``index`` under ``key`` as an engine message (the usual one read with no path built);
    only a ``contentless`` role may have null content (a turn of tool calls)."""
    if type(value) is dict:
        role, content = value.get("role"), value.get("content")
        if type(role) is str and role in roles and type(content) is str:
            return {"role": role, "content": content}
    param = join(key, index)
    item = expect_object(value, param)
    role = required_str(item, "role", param)
    if role not in roles:
        expected = ", ".join(repr(r) for r in roles)
        raise invalid_value(join(param, "role"), f"expected one of {expected}, but got {role!r}.")
    content = item.get("content")
    if content is None and contentless is not None:
        if role != contentless:
            raise invalid_value(join(param, "content"), f"a {role!r} message needs content.")
        return {"role": role, "content": ""}
    content = required(item, "content", param)
    text = text_content(content, join(param, "content"), part_types=part_types)
    return {"role": role, "content": text}


def model_name(body: JsonObject) -> str:
    """The required ``model`` field: a non-empty string of at most 256 characters."""
    return required_str(body, "model", nonempty=True, max_length=MAX_MODEL_NAME_LENGTH)


def optional_str(body: JsonObject, key: str, prefix: str = "") -> str | None:
    value = body.get(key)
    return None if value is None else expect_str(value, join(prefix, key))


def optional_bool(body: JsonObject, key: str, prefix: str = "") -> bool | None:
    value = body.get(key)
    if value is None or isinstance(value, bool):
        return value
    raise invalid_type(join(prefix, key), "a boolean", value)


def optional_object(body: JsonObject, key: str, prefix: str = "") -> JsonObject | None:
    value = body.get(key)
    return None if value is None else expect_object(value, join(prefix, key))


def optional_int(
    body: JsonObject,
    key: str,
    prefix: str = "",
    *,
    minimum: int | None = None,
    maximum: int | None = None,
) -> int | None:
    """An optional integer field within ``[minimum, maximum]``."""
    value = _number(body, key, prefix, minimum, maximum, integer=True)
    return None if value is None else int(value)


def optional_number(
    body: JsonObject,
    key: str,
    prefix: str = "",
    *,
    minimum: float | None = None,
    maximum: float | None = None,
) -> float | None:
    """An optional finite number field within ``[minimum, maximum]``, as a float."""
    value = _number(body, key, prefix, minimum, maximum, integer=False)
    return None if value is None else float(value)


def _number(
    body: JsonObject, key: str, prefix: str, low: float | None, high: float | None, integer: bool
) -> float | None:
    """Field ``key``: an integer (or, not ``integer``, any finite number) in ``[low, high]``."""
    value = body.get(key)
    if value is None:
        return None
    param = join(prefix, key)
    noun, spec = ("an integer", "") if integer else ("a number", "g")
    if not isinstance(value, int if integer else int | float) or isinstance(value, bool):
        raise invalid_type(param, noun, value)
    if isinstance(value, float) and not math.isfinite(value):
        raise invalid_value(param, f"expected a finite number, but got {value}.")
    if low is not None and value < low:
        raise invalid_value(param, f"expected {noun} >= {low:{spec}}, but got {value}.")
    if high is not None and value > high:
        raise invalid_value(param, f"expected {noun} <= {high:{spec}}, but got {value}.")
    return value


def stop_sequences(
    body: JsonObject, key: str, *, max_items: int, allow_string: bool
) -> tuple[str, ...]:
    """A stop-sequence field: an array of at most ``max_items`` strings, or (``allow_string``)
    one string; each non-empty and at most :data:`MAX_STOP_SEQUENCE_LENGTH` characters."""
    value = body.get(key)
    if value is None:
        return ()
    if allow_string and isinstance(value, str):
        return (expect_str(value, key, nonempty=True, max_length=MAX_STOP_SEQUENCE_LENGTH),)
    if not isinstance(value, list):
        expected = "a string or an array of strings" if allow_string else "an array of strings"
        raise invalid_type(key, expected, value)
    if len(value) > max_items:
        raise invalid_value(key, f"expected at most {max_items} items, but got {len(value)}.")
    return tuple(
        expect_str(item, join(key, index), nonempty=True, max_length=MAX_STOP_SEQUENCE_LENGTH)
        for index, item in enumerate(value)
    )


def text_content(value: object, param: str, *, part_types: frozenset[str]) -> str:
    """Message content: a string, or text parts (``{"type": t, "text": ...}``, ``t`` in
    ``part_types``; images, audio, tool results: unsupported) joined by newlines."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise invalid_type(param, "a string or an array of content parts", value)
    if not value:
        raise invalid_value(param, "expected at least one content part.")
    texts = []
    for index, part in enumerate(value):
        part_param = join(param, index)
        part_body = expect_object(part, part_param)
        part_type = required_str(part_body, "type", part_param)
        if part_type not in part_types:
            supported = ", ".join(repr(t) for t in sorted(part_types))
            raise unsupported(
                join(part_param, "type"),
                f"content parts of type {part_type!r} are not supported; "
                f"this server accepts only {supported}.",
            )
        texts.append(required_str(part_body, "text", part_param))
    return "\n".join(texts)


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
