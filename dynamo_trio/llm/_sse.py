"""Server-sent events: an event's bytes, a comment, a stream's end (docs/llm.md)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

import msgspec

DONE: Final = b"data: [DONE]\n\n"
"""The last event of a successful OpenAI chat or completions stream."""

_LINE_BREAK: Final = re.compile(rb"\r\n|\r|\n")
_ENCODER: Final = msgspec.json.Encoder()


def _field(name: bytes, value: str) -> bytes:
    if "\n" in value or "\r" in value:
        raise ValueError(f"an SSE {name.decode()} field cannot contain a line break: {value!r}")
    return name + b": " + value.encode() + b"\n"


def encode_event(
    data: str | bytes | Mapping[str, object], event: str | None = None, *, id: str | None = None
) -> bytes:
    """The bytes of one SSE event: ``data`` a JSON object (compact) or text (maybe multi-line);
    ValueError for a line break in ``event`` or ``id`` or a NUL in ``id``."""
    head = b"" if event is None else _field(b"event", event)
    if id is not None:
        if "\0" in id:
            raise ValueError(f"an SSE id field cannot contain NUL: {id!r}")
        head += _field(b"id", id)
    if isinstance(data, Mapping):
        return head + b"data: " + _ENCODER.encode(data) + b"\n\n"
    raw = data.encode() if isinstance(data, str) else data
    lines = b"".join(b"data: " + line + b"\n" for line in _LINE_BREAK.split(raw))
    return head + lines + b"\n"


def encode_error_event(body: Mapping[str, object]) -> bytes:
    """An ``event: error`` SSE event carrying an API error body (docs/llm.md)."""
    return encode_event(body, event="error")


def encode_comment(text: str = "") -> bytes:
    """An SSE comment (ignored by clients); multi-line text becomes several comment lines."""
    lines = _LINE_BREAK.split(text.encode())
    return b"".join(b": " + line + b"\n" if line else b":\n" for line in lines) + b"\n"


def keepalive_comment() -> bytes:
    """``: keep-alive``, the comment a stream sends while it has nothing else to say."""
    return b": keep-alive\n\n"
