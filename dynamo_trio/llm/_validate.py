"""Typed fields of a decoded JSON body; 400s name the parameter (docs/llm.md)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

from ._errors import RequestError

if TYPE_CHECKING:
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
