"""The knobs of the mock engine: latency and sizes."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields


@dataclass(frozen=True, slots=True, kw_only=True)
class MockerSettings:
    """How the mock engine behaves; each field is the CLI flag of the same name (checked)."""

    ttft_ms: float = 0.0
    """Time to first token; also the latency of an embeddings request."""
    inter_token_latency_ms: float = 10.0
    """Time between two tokens; 0 generates as fast as possible."""
    default_max_tokens: int = 64
    """Tokens generated when a request sets no ``max_tokens``."""
    embedding_dimensions: int = 16
    """Length of an embedding vector, and the most a request may ask for."""
    context_length: int = 32768
    """The model's context window (prompt plus output tokens), on its card."""
    max_output_tokens: int = 16384
    """The most tokens one request may ask for, on the model card: more is refused."""
    media_step_ms: float = 20.0
    """One step of the media models: a denoising step, a video frame, a chunk of speech."""
    denoising_steps: int = 8
    """An image's steps when the request sets no ``nvext.num_inference_steps``."""

    def __post_init__(self) -> None:
        for item in fields(self):  # the float fields are times, the int fields counts
            value = getattr(self, item.name)
            if item.type == "float" and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{item.name} must be a finite number >= 0, not {value!r}")
            if item.type == "int" and value < 1:
                raise ValueError(f"{item.name} must be >= 1, not {value!r}")
