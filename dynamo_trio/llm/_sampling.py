"""The sampling options every text API maps onto, and the engine request built from them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._protocol import EngineMessage, GenerateRequest


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplingParams:
    """How to generate, as parsed from any text API; ``None`` means the engine's default."""

    max_tokens: int | None = None
    min_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False

    def chat_request(
        self, model: str, messages: Sequence[EngineMessage], *, system: str | None = None
    ) -> GenerateRequest:
        """The engine request for a conversation; ``system`` becomes a leading system message."""
        request = self._request(model, "chat")
        leading: list[EngineMessage] = [{"role": "system", "content": system}] if system else []
        request["messages"] = [*leading, *messages]  # the parsers' own fresh dicts
        return request

    def completion_request(self, model: str, prompt: str) -> GenerateRequest:
        """The engine request to continue ``prompt``."""
        request = self._request(model, "completion")
        request["prompt"] = prompt
        return request

    def _request(self, model: str, request_type: Literal["chat", "completion"]) -> GenerateRequest:
        return {
            "model": model,
            "request_type": request_type,
            "max_tokens": self.max_tokens,
            "min_tokens": self.min_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": self.seed,
            "stop": list(self.stop),
            "ignore_eos": self.ignore_eos,
        }
