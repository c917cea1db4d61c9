"""The OpenAI speech API (``POST /v1/audio/speech``): parsing and the audio body.

The worker yields the file's bytes as it makes them; pcm and wav at speed 1
stream chunk by chunk, other formats (a codec that needs the whole signal, or
a tempo change) are one body (docs/media.md has the fields).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from ._media import BinaryBody, engine_bytes, engine_object, optional_choice
from ._validate import expect_object, model_name, optional_number, optional_str, required_str

AUDIO_TYPES: Final = {
    "wav": "audio/wav",
    "mp3": "audio/mpeg",
    "pcm": "audio/pcm",
    "flac": "audio/flac",
    "aac": "audio/aac",
    "opus": "audio/opus",
}
"""Each ``response_format`` and the content type its body is sent with."""
_STREAMABLE: Final = ("wav", "pcm")
_MAX_INPUT: Final = 4096


@dataclass(frozen=True, slots=True, kw_only=True)
class SpeechRequest:
    """A validated speech body; ``body`` keeps every field for the worker."""

    model: str
    body: dict[str, Any]
    response_format: str = "wav"
    speed: float = 1.0

    @property
    def stream(self) -> bool:
        """Whether the body streams as the worker makes it (pcm or wav at speed 1)."""
        return self.response_format in _STREAMABLE and self.speed == 1.0

    @property
    def content_type(self) -> str:
        return AUDIO_TYPES[self.response_format]

    def to_engine(self) -> dict[str, Any]:
        return {**self.body, "response_format": self.response_format, "speed": self.speed}


def parse_speech_request(body: object) -> SpeechRequest:
    """Validate a speech body (a 400 RequestError naming the parameter, if not)."""
    obj = expect_object(body, None)
    model = model_name(obj)
    required_str(obj, "input", nonempty=True, max_length=_MAX_INPUT)
    response_format = optional_choice(obj, "response_format", tuple(AUDIO_TYPES))
    speed = optional_number(obj, "speed", minimum=0.25, maximum=4.0)
    for key in ("voice", "instructions", "language"):
        optional_str(obj, key)
    return SpeechRequest(
        model=model,
        body=dict(obj),
        response_format=response_format or "wav",
        speed=1.0 if speed is None else speed,
    )


def _chunk(item: object) -> bytes:
    return engine_bytes(engine_object(item, "an audio chunk"), "audio", "an audio chunk")


def speech_body(request: SpeechRequest, items: list[object]) -> BinaryBody:
    """The whole audio file from the worker's chunks (EngineError: a chunk is malformed)."""
    return BinaryBody(b"".join(_chunk(item) for item in items), request.content_type)


class SpeechStream:
    """The streamed audio body: each chunk's bytes as they come; nothing else to say.

    Audio has no way to carry an error: a stream that fails after its first
    chunk just ends (a WAV's header gave its full length, so the file reads as
    cut short).
    """

    keepalive: Final = False

    def __init__(self, request: SpeechRequest, request_id: str) -> None:
        self.content_type: Final = request.content_type

    def feed(self, item: object) -> bytes:
        return _chunk(item)

    def finish(self) -> bytes:
        return b""

    def fail(self, status: int, message: str) -> bytes:
        return b""
