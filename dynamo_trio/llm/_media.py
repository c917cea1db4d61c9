"""What the image, video and speech APIs share: sizes, engine items carrying bytes,
and a response body that is not JSON."""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from ._protocol import EngineError
from ._validate import invalid_value, optional_str

if TYPE_CHECKING:
    from ._validate import JsonObject

MAX_SIDE: Final = 4096
"""The largest width or height an image or video may be asked for, in pixels."""

_SIZE: Final = re.compile(r"([1-9][0-9]{0,4})x([1-9][0-9]{0,4})")


@dataclass(frozen=True, slots=True)
class BinaryBody:
    """A whole response body that is not JSON (audio bytes), with its content type."""

    content: bytes
    content_type: str


def size(body: JsonObject, key: str, *, allow_auto: bool, max_side: int = MAX_SIDE) -> str | None:
    """An optional ``"WxH"`` field (or ``"auto"`` where allowed), each side 1 to ``max_side``."""
    value = optional_str(body, key)
    if value is None or (allow_auto and value == "auto"):
        return value
    match = _SIZE.fullmatch(value)
    if match is None or max(int(match[1]), int(match[2])) > max_side:
        auto = "'auto' or " if allow_auto else ""
        raise invalid_value(
            key,
            f"expected {auto}WIDTHxHEIGHT with each side from 1 to {max_side} pixels, "
            f"but got {value[:40]!r}.",
        )
    return value


def optional_choice(body: JsonObject, key: str, choices: tuple[str, ...]) -> str | None:
    """An optional string field that must be one of ``choices``."""
    value = optional_str(body, key)
    if value is not None and value not in choices:
        raise invalid_value(
            key, f"expected one of {', '.join(map(repr, choices))}, but got {value[:40]!r}."
        )
    return value


def engine_object(item: object, what: str) -> JsonObject:
    """A worker's item as an object (EngineError: it is not one)."""
    if not isinstance(item, dict):
        raise EngineError(f"the worker sent {what} that is not an object")
    return item


def engine_bytes(item: JsonObject, key: str, what: str) -> bytes:
    """The base64 field ``key`` of a worker's item, decoded (EngineError if missing or invalid)."""
    value = item.get(key)
    if not isinstance(value, str):
        raise EngineError(f"the worker sent {what} without a base64 {key!r}")
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error:
        raise EngineError(f"the worker sent {what} whose {key!r} is not base64") from None
