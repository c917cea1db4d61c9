"""The knobs of the mock engine: latency and sizes."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["MockerSettings"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MockerSettings:
    """How the mock engine behaves; each field is the CLI flag of the same name (checked)."""

    ttft_ms: float = 0.0
    """Time to first token (``--ttft-ms``); also the latency of an embeddings request."""
    inter_token_latency_ms: float = 10.0
    """Time between two tokens (``--inter-token-latency-ms``); 0 generates as fast as possible."""
    default_max_tokens: int = 64
    """Tokens generated when a request sets no ``max_tokens`` (``--default-max-tokens``)."""
    embedding_dimensions: int = 16
    """Length of an embedding vector, and the most a request may ask for
    (``--embedding-dimensions``)."""
    context_length: int = 32768
    """The model's context window: prompt plus output tokens (``--context-length``).
    Registered on the model card; a longer request is refused."""
    max_output_tokens: int = 16384
    """The most tokens one request may ask for (``--max-output-tokens``).  Registered on
    the model card; a larger ``max_tokens`` is refused."""
    media_step_ms: float = 20.0
    """Time of one step of the media models (``--media-step-ms``): a denoising step of an
    image or a video frame, a chunk of speech."""
    denoising_steps: int = 8
    """Denoising steps of an image when the request sets no ``nvext.num_inference_steps``
    (``--denoising-steps``)."""

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "inter_token_latency_ms", "media_step_ms"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, not {value!r}")
        for name in (
            "default_max_tokens",
            "embedding_dimensions",
            "context_length",
            "max_output_tokens",
            "denoising_steps",
        ):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"{name} must be >= 1, not {value!r}")
