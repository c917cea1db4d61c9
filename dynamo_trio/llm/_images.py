"""The OpenAI images API (``POST /v1/images/generations`` and ``/v1/images/edits``).

The worker answers with one item after its denoising steps and sends nothing
meanwhile, so until then a lost worker's request can go to another one
(docs/media.md has the fields).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from ._media import engine_object, optional_choice, size
from ._protocol import EngineError
from ._validate import (
    expect_object,
    model_name,
    optional_bool,
    optional_int,
    optional_number,
    optional_object,
    optional_str,
    required_str,
    unsupported,
)

MAX_IMAGES: Final = 10
RESPONSE_FORMATS: Final = ("url", "b64_json")
OUTPUT_FORMATS: Final = ("png", "jpeg", "webp")
_QUALITIES: Final = ("auto", "low", "medium", "high", "standard", "hd")
_BACKGROUNDS: Final = ("auto", "transparent", "opaque")
_STYLES: Final = ("vivid", "natural")
_MAX_PROMPT: Final = 32000


@dataclass(frozen=True, slots=True, kw_only=True)
class ImageRequest:
    """A validated images body; ``body`` keeps every field, known or not, for the worker."""

    model: str
    body: dict[str, Any]
    n: int = 1
    size: str = "auto"
    response_format: str = "url"
    output_format: str = "png"
    stream: ClassVar[bool] = False

    def to_engine(self) -> dict[str, Any]:
        """The worker's request: the client's fields with the defaults filled in."""
        return {
            **self.body,
            "n": self.n,
            "size": self.size,
            "response_format": self.response_format,
            "output_format": self.output_format,
        }


def parse_image_request(body: object) -> ImageRequest:
    """Validate an image generation body (a 400 RequestError naming the parameter, if not)."""
    obj = expect_object(body, None)
    model = model_name(obj)
    required_str(obj, "prompt", nonempty=True, max_length=_MAX_PROMPT)
    n = optional_int(obj, "n", minimum=1, maximum=MAX_IMAGES)
    chosen = size(obj, "size", allow_auto=True)
    response_format = optional_choice(obj, "response_format", RESPONSE_FORMATS)
    output_format = optional_choice(obj, "output_format", OUTPUT_FORMATS)
    optional_int(obj, "output_compression", minimum=0, maximum=100)
    optional_choice(obj, "quality", _QUALITIES)
    optional_choice(obj, "background", _BACKGROUNDS)
    optional_choice(obj, "style", _STYLES)
    optional_str(obj, "user")
    if optional_bool(obj, "stream"):
        raise unsupported("stream", "partial images are not streamed; send stream false.")
    nvext = optional_object(obj, "nvext")
    if nvext is not None:
        optional_str(nvext, "negative_prompt", "nvext")
        optional_int(nvext, "num_inference_steps", "nvext", minimum=1, maximum=1000)
        optional_number(nvext, "guidance_scale", "nvext", minimum=0)
        optional_int(nvext, "seed", "nvext", minimum=0)
    return ImageRequest(
        model=model,
        body=dict(obj),
        n=n or 1,
        size=chosen or "auto",
        response_format=response_format or "url",
        output_format=output_format or "png",
    )


def parse_image_edit_request(body: object) -> ImageRequest:
    """Validate an image edit body: a generation's plus the required ``input_reference``."""
    obj = expect_object(body, None)
    model_name(obj)
    required_str(obj, "input_reference", nonempty=True)
    return parse_image_request(obj)


def _is_image(entry: object) -> bool:
    return isinstance(entry, dict) and ("b64_json" in entry or "url" in entry)


def image_response(request: ImageRequest, items: list[object]) -> dict[str, object]:
    """The images response for the worker's items (the last has the images; else EngineError)."""
    if not items:
        raise EngineError("the worker sent no images")
    item = engine_object(items[-1], "an image result")
    data = item.get("data")
    if not isinstance(data, list) or len(data) != request.n or not all(map(_is_image, data)):
        raise EngineError(f"the worker's image result does not hold {request.n} images")
    return {
        "created": int(time.time()),
        "data": data,
        "background": item.get("background", request.body.get("background")),
        "output_format": request.output_format,
        "size": item.get("size", request.size),
        "quality": item.get("quality", request.body.get("quality")),
        "usage": item.get("usage"),
    }
