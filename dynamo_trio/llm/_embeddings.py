"""The OpenAI embeddings API (``POST /v1/embeddings``): parsing, shape (docs/llm.md)."""

from __future__ import annotations

import base64
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal

from ._protocol import parse_embed_output
from ._validate import (
    expect_object,
    invalid_type,
    invalid_value,
    join,
    model_name,
    optional_int,
    optional_str,
    required,
    unsupported,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._protocol import EmbedRequest

_MAX_INPUTS: Final = 2048

EncodingFormat = Literal["float", "base64"]


@dataclass(frozen=True, slots=True, kw_only=True)
class EmbeddingRequest:
    """A validated ``POST /v1/embeddings`` body."""

    model: str
    inputs: tuple[str, ...]
    encoding_format: EncodingFormat = "float"
    dimensions: int | None = None

    def to_engine(self) -> EmbedRequest:
        """The engine request: one vector per input."""
        return {
            "model": self.model,
            "request_type": "embedding",
            "input": list(self.inputs),
            "dimensions": self.dimensions,
        }


def parse_embedding_request(body: object) -> EmbeddingRequest:
    """Validate an embeddings body (a 400 RequestError naming the parameter, if not)."""
    obj = expect_object(body, None)
    model = model_name(obj)
    inputs = _inputs(required(obj, "input"))
    encoding = optional_str(obj, "encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise invalid_value(
            "encoding_format", f"expected 'float' or 'base64', but got {encoding!r}."
        )
    return EmbeddingRequest(
        model=model,
        inputs=inputs,
        encoding_format="float" if encoding == "float" else "base64",
        dimensions=optional_int(obj, "dimensions", minimum=1),
    )


def _inputs(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        if not value:
            raise invalid_value("input", "expected a non-empty string.")
        return (value,)
    if not isinstance(value, list):
        raise invalid_type("input", "a string or an array of strings", value)
    if not value:
        raise invalid_value("input", "expected at least one input, but got an empty array.")
    if len(value) > _MAX_INPUTS:
        raise invalid_value(
            "input", f"expected at most {_MAX_INPUTS} inputs, but got {len(value)}."
        )
    if any(isinstance(v, int | list) and not isinstance(v, bool) for v in value):
        raise unsupported("input", "token-id inputs are not supported; send the input as text.")
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise invalid_type(join("input", index), "a string", item)
        if not item:
            raise invalid_value(join("input", index), "expected a non-empty string.")
    return tuple(value)


def encode_base64_floats(vector: Sequence[float]) -> str:
    """A vector as base64 of little-endian float32 bytes (``encoding_format="base64"``)."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def embedding_response(request: EmbeddingRequest, output: object) -> dict[str, object]:
    """The embeddings ``list`` object for the engine's output item (EngineError if malformed)."""
    valid = parse_embed_output(output, count=len(request.inputs))
    as_base64 = request.encoding_format == "base64"
    data = [
        {
            "object": "embedding",
            "index": index,
            "embedding": encode_base64_floats(vector) if as_base64 else vector,
        }
        for index, vector in enumerate(valid["embeddings"])
    ]
    prompt_tokens = valid["usage"]["prompt_tokens"]
    return {
        "object": "list",
        "data": data,
        "model": request.model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }
