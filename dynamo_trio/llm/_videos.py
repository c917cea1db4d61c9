"""The videos API (``POST /v1/videos`` and ``/v1/videos/stream``), synchronous.

The worker yields one item per frame as it makes it; the frontend answers with
one JSON video object, SSE events, or the MJPEG body itself (docs/media.md has
the fields and the three shapes).
"""

from __future__ import annotations

import base64
import json
import math
import time
from dataclasses import dataclass, replace
from typing import Any, Final

from ._errors import openai_error_body
from ._media import engine_bytes, engine_object, optional_choice, size
from ._protocol import EngineError
from ._sse import DONE, encode_error_event, encode_event
from ._validate import (
    expect_object,
    invalid_type,
    invalid_value,
    model_name,
    optional_bool,
    optional_int,
    optional_object,
    optional_str,
    required_str,
)

MJPEG_TYPE: Final = "multipart/x-mixed-replace; boundary=frame"
_CLOSE: Final = b"--frame--\r\n"
_MAX_SECONDS: Final = 600.0
_MAX_FRAMES: Final = 10_000
_MAX_PROMPT: Final = 32000


@dataclass(frozen=True, slots=True, kw_only=True)
class VideoRequest:
    """A validated videos body; ``body`` keeps every field for the worker."""

    model: str
    body: dict[str, Any]
    stream: bool = False
    response_format: str = "b64_json"

    def to_engine(self) -> dict[str, Any]:
        return {**self.body, "stream": self.stream, "response_format": self.response_format}


def _seconds(obj: Any) -> None:
    value = obj.get("seconds")
    if value is None:
        return
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = math.nan
    elif isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    else:
        raise invalid_type("seconds", "a number or a numeric string", value)
    if not 0 < number <= _MAX_SECONDS:
        raise invalid_value(
            "seconds", f"expected a number above 0 and at most {_MAX_SECONDS:g}, but got {value!r}."
        )


def parse_video_request(body: object) -> VideoRequest:
    """Validate a videos body (a 400 RequestError naming the parameter, if not)."""
    obj = expect_object(body, None)
    model = model_name(obj)
    required_str(obj, "prompt", nonempty=True, max_length=_MAX_PROMPT)
    _seconds(obj)
    size(obj, "size", allow_auto=False)
    optional_str(obj, "input_reference")
    response_format = optional_choice(obj, "response_format", ("url", "b64_json"))
    stream = optional_bool(obj, "stream")
    nvext = optional_object(obj, "nvext")
    if nvext is not None:
        optional_int(nvext, "fps", "nvext", minimum=1, maximum=240)
        optional_int(nvext, "num_frames", "nvext", minimum=1, maximum=_MAX_FRAMES)
        optional_int(nvext, "num_inference_steps", "nvext", minimum=1, maximum=1000)
        optional_int(nvext, "seed", "nvext", minimum=0)
        optional_str(nvext, "negative_prompt", "nvext")
    return VideoRequest(
        model=model,
        body=dict(obj),
        stream=bool(stream),
        response_format=response_format or "b64_json",
    )


def parse_video_stream_request(body: object) -> VideoRequest:
    """Validate a ``/v1/videos/stream`` body: a videos body, always streamed."""
    return replace(parse_video_request(body), stream=True)


def _frame(item: object) -> tuple[dict[str, Any], bytes | None]:
    frame = engine_object(item, "a video frame")
    if frame.get("b64_json") is None:
        return dict(frame), None
    return dict(frame), engine_bytes(frame, "b64_json", "a video frame")


def mjpeg_part(jpeg: bytes, content_type: str = "image/jpeg") -> bytes:
    """One frame of an MJPEG body (a JSON one carries an error)."""
    head = f"--frame\r\nContent-Type: {content_type}\r\nContent-Length: {len(jpeg)}\r\n\r\n"
    return head.encode() + jpeg + b"\r\n"


def video_response(
    request: VideoRequest, request_id: str, items: list[object], started: float
) -> dict[str, object]:
    """The video object for the worker's frames (EngineError for none or a malformed one)."""
    frames = [jpeg for _, jpeg in map(_frame, items) if jpeg is not None]
    if not frames:
        raise EngineError("the worker sent no video frames")
    video = b"".join(map(mjpeg_part, frames)) + _CLOSE
    encoded = base64.b64encode(video).decode("ascii")
    entry: dict[str, object] = {"output_format": "mjpeg"}
    if request.response_format == "url":
        entry["url"] = f"data:multipart/x-mixed-replace;boundary=frame;base64,{encoded}"
    else:
        entry["b64_json"] = encoded
    nvext = request.body.get("nvext")
    if isinstance(nvext, dict) and "fps" in nvext:
        entry["fps"] = nvext["fps"]
    return {
        "id": request_id,
        "object": "video",
        "model": request.model,
        "status": "completed",
        "progress": 100,
        "created": int(time.time()),
        "data": [entry],
        "inference_time_s": round(time.monotonic() - started, 3),
    }


class VideoEventStream:
    """``stream: true``: each worker item as one SSE event, with the request's id and model."""

    content_type: Final = "text/event-stream"
    keepalive: Final = True

    def __init__(self, request: VideoRequest, request_id: str) -> None:
        self._head = {"id": request_id, "object": "video.chunk", "model": request.model}

    def feed(self, item: object) -> bytes:
        frame, _ = _frame(item)
        return encode_event({**frame, **self._head})

    def finish(self) -> bytes:
        return DONE

    def fail(self, status: int, message: str) -> bytes:
        return encode_error_event(openai_error_body(status, message))


class MjpegStream:
    """``/v1/videos/stream``: one JPEG part per frame, then the closing boundary."""

    content_type: Final = MJPEG_TYPE
    keepalive: Final = False

    def __init__(self, request: VideoRequest, request_id: str) -> None:
        """(Nothing to keep: each frame is a part of its own.)"""

    def feed(self, item: object) -> bytes:
        _, jpeg = _frame(item)
        return b"" if jpeg is None else mjpeg_part(jpeg)

    def finish(self) -> bytes:
        return _CLOSE

    def fail(self, status: int, message: str) -> bytes:
        body = json.dumps(openai_error_body(status, message), separators=(",", ":")).encode()
        return mjpeg_part(body, "application/json")
