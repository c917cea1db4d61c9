"""The mock media models: images, videos and speech, one step at a time.

Each handler works in steps of ``settings.media_step_ms`` and looks at its
context between two: a stop ends the work where it is, a kill cancels the step
it is waiting in.  A format the mock cannot encode is a ``ValueError``.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any, Final, final

import trio

from ._codecs import SAMPLE_RATE, jpeg, pcm_tone, png, wav_header
from ._engine import wait_until

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from .._context import Context
    from ._codecs import Rgb
    from ._settings import MockerSettings

_AUTO_SIZE: Final = (512, 512)
_VIDEO_SIZE: Final = (256, 144)
_VIDEO_FPS: Final = 8
_VIDEO_FRAMES: Final = 8
_CHUNK_SAMPLES: Final = SAMPLE_RATE // 10
_SECONDS_PER_CHARACTER: Final = 0.05
_VOICES: Final = {"alloy": 440.0, "echo": 330.0, "nova": 523.25}


def _size(value: str | None, default: tuple[int, int]) -> tuple[int, int]:
    if value is None or value == "auto":
        return default
    width, height = value.split("x")
    return int(width), int(height)


def _hue(seed: int, position: float) -> Rgb:
    shift = (seed * 37 + int(position * 255)) % 256
    return shift, (shift + 85) % 256, (255 - shift) % 256


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _picture(output_format: str, width: int, height: int, seed: int) -> bytes:
    """A picture of bands of colour, as PNG or JPEG."""
    if output_format == "png":
        return png(width, height, lambda y: _hue(seed, y / height))
    return jpeg(width, height, lambda _, by: _hue(seed, 8 * by / height))


@final
class MediaEngine:
    """The handlers of ``mock-image``, ``mock-video`` and ``mock-speech``."""

    def __init__(self, settings: MockerSettings) -> None:
        self._step: Final = settings.media_step_ms / 1000
        self._denoising_steps: Final = settings.denoising_steps

    async def images(self, request: dict[str, Any], context: Context) -> AsyncIterator[Any]:
        """``n`` pictures of the asked size after the denoising steps, in one item."""
        output_format = request.get("output_format", "png")
        if output_format not in ("png", "jpeg"):
            raise ValueError(f"mock images are png or jpeg, not {output_format}")
        nvext = request.get("nvext") or {}
        steps = nvext.get("num_inference_steps") or self._denoising_steps
        seed = nvext.get("seed") or 0
        for _ in range(steps):
            if await wait_until(trio.current_time() + self._step, context):
                return
        width, height = _size(request.get("size"), _AUTO_SIZE)
        data = []
        for index in range(request.get("n", 1)):
            image = _picture(output_format, width, height, seed + index)
            entry = {"revised_prompt": request.get("prompt")}
            if request.get("response_format") == "b64_json":
                entry["b64_json"] = _b64(image)
            else:
                entry["url"] = f"data:image/{output_format};base64,{_b64(image)}"
            data.append(entry)
        yield {
            "data": data,
            "size": f"{width}x{height}",
            "quality": request.get("quality") or "auto",
            "background": request.get("background") or "opaque",
        }

    async def videos(self, request: dict[str, Any], context: Context) -> AsyncIterator[Any]:
        """JPEG frames of a progress bar filling up, each with its ``progress``, a frame
        every ``nvext.num_inference_steps`` steps (default 1)."""
        nvext = request.get("nvext") or {}
        fps = nvext.get("fps") or _VIDEO_FPS
        frames = nvext.get("num_frames")
        if frames is None:
            seconds = request.get("seconds")
            frames = max(1, round(float(seconds) * fps)) if seconds is not None else _VIDEO_FRAMES
        width, height = _size(request.get("size"), _VIDEO_SIZE)
        blocks = (width + 7) // 8
        seed = nvext.get("seed") or 0
        steps = nvext.get("num_inference_steps") or 1
        for index in range(frames):
            for _ in range(steps):
                if await wait_until(trio.current_time() + self._step, context):
                    return
            filled = (index + 1) * blocks // frames

            def colour(bx: int, by: int, filled: int = filled) -> Rgb:
                return _hue(seed, by / blocks) if bx < filled else (16, 16, 16)

            yield {
                "index": index,
                "progress": round(100 * (index + 1) / frames, 2),
                "b64_json": _b64(jpeg(width, height, colour)),
            }

    async def speech(self, request: dict[str, Any], context: Context) -> AsyncIterator[Any]:
        """A tone as long as the input takes to say, a tenth of a second a step."""
        response_format = request.get("response_format", "wav")
        if response_format not in ("wav", "pcm"):
            raise ValueError(f"mock speech is wav or pcm, not {response_format}")
        frequency = _VOICES.get(request.get("voice") or "", 440.0)
        seconds = len(request["input"]) * _SECONDS_PER_CHARACTER / request.get("speed", 1.0)
        total = max(_CHUNK_SAMPLES, round(seconds * SAMPLE_RATE))
        head = wav_header(total) if response_format == "wav" else b""
        for start in range(0, total, _CHUNK_SAMPLES):
            if await wait_until(trio.current_time() + self._step, context):
                return
            chunk = pcm_tone(start, min(_CHUNK_SAMPLES, total - start), frequency)
            yield {"audio": _b64(head + chunk)}
            head = b""
