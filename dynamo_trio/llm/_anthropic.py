"""The Anthropic Messages API (``POST /v1/messages``): parsing, shapes (docs/llm.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Literal

from ._errors import TokenLimits, anthropic_error_body, check_output_tokens
from ._generation import EventStream, Generation
from ._protocol import EngineMessage, GenerateRequest, SamplingParams
from ._validate import (
    expect_object,
    model_name,
    optional_bool,
    optional_int,
    optional_number,
    optional_object,
    optional_str,
    read_messages,
    required,
    stop_sequences,
    text_content,
)

_ROLES: Final = ("user", "assistant")
_BLOCK_TYPES: Final = frozenset({"text"})
_MAX_STOP_SEQUENCES: Final = 64

AnthropicStopReason = Literal["end_turn", "max_tokens", "stop_sequence"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MessagesRequest:
    """A validated ``POST /v1/messages`` body."""

    model: str
    messages: tuple[EngineMessage, ...]
    system: str | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stream: bool = False

    def to_engine(self) -> GenerateRequest:
        """The chat engine request; ``system`` becomes a leading system message."""
        return self.sampling.chat_request(self.model, self.messages, system=self.system)

    def check_limits(self, limits: TokenLimits) -> None:
        """Refuse a ``max_tokens`` over the model's limits (400, in Anthropic's words)."""
        requested = {"max_tokens": self.sampling.max_tokens}
        check_output_tokens(limits, requested, model=self.model, anthropic=True)


def parse_messages_request(body: object) -> MessagesRequest:
    """Validate a Messages API body (a 400 RequestError naming the parameter, if not)."""
    obj = expect_object(body, None)
    model = model_name(obj)
    required(obj, "max_tokens")
    max_tokens = optional_int(obj, "max_tokens", minimum=1)
    messages = read_messages(obj, _ROLES, _BLOCK_TYPES)
    optional_str(optional_object(obj, "metadata") or {}, "user_id", "metadata")  # (checked only)
    return MessagesRequest(
        model=model,
        messages=messages,
        system=_system(obj.get("system")),
        sampling=SamplingParams(
            max_tokens=max_tokens,
            temperature=optional_number(obj, "temperature", minimum=0.0, maximum=1.0),
            top_p=optional_number(obj, "top_p", minimum=0.0, maximum=1.0),
            top_k=optional_int(obj, "top_k", minimum=0),
            stop=stop_sequences(
                obj, "stop_sequences", max_items=_MAX_STOP_SEQUENCES, allow_string=False
            ),
        ),
        stream=bool(optional_bool(obj, "stream")),
    )


def _system(value: object) -> str | None:
    if value is None or value == []:
        return None
    return text_content(value, "system", part_types=_BLOCK_TYPES)


def anthropic_stop_reason(generation: Generation) -> tuple[AnthropicStopReason, str | None]:
    """``(stop_reason, stop_sequence)`` for a finished generation."""
    reason = generation.finish_reason
    if reason == "length":
        return "max_tokens", None
    if reason == "stop" and generation.stop_sequence is not None:
        return "stop_sequence", generation.stop_sequence
    return "end_turn", None


def message_object(
    request: MessagesRequest, request_id: str, generation: Generation
) -> dict[str, object]:
    """The unary ``message`` object for a finished generation; its id is ``msg_<request_id>``."""
    stop_reason, stop_sequence = anthropic_stop_reason(generation)
    return {
        "id": f"msg_{request_id}",
        "type": "message",
        "role": "assistant",
        "model": request.model,
        "content": [{"type": "text", "text": generation.text}],
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": _usage(generation),
    }


def _usage(generation: Generation) -> dict[str, object]:
    usage = generation.usage
    return {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"]}


class MessagesStream(EventStream[MessagesRequest]):
    """Turns engine output items into the Messages API's streaming events (``msg_<request_id>``)."""

    __slots__ = ()

    def _opening(self) -> list[dict[str, object]]:
        # The message as it starts: an empty generation's, with no content or stop reason yet.
        empty = message_object(self._request, self._request_id, Generation())
        message = empty | {"content": [], "stop_reason": None}
        block = {"type": "text", "text": ""}
        return [
            {"type": "message_start", "message": message},
            {"type": "content_block_start", "index": 0, "content_block": block},
            {"type": "ping"},
        ]

    def _delta(self, text: str) -> list[dict[str, object]]:
        delta = {"type": "text_delta", "text": text}
        return [{"type": "content_block_delta", "index": 0, "delta": delta}]

    def fail(self, message: str, *, status: int = 500) -> list[dict[str, object]]:
        """The ``error`` event that ends a failed stream (``[]`` if it already ended); ``status``
        picks the error type (500 ``api_error``, 503 ``overloaded_error``...)."""
        return [anthropic_error_body(status, message)] if self._close() else []

    def _closing(self, text: str) -> list[dict[str, object]]:
        events = self._delta(text) if text else []
        stop_reason, stop_sequence = anthropic_stop_reason(self.generation)
        delta = {"stop_reason": stop_reason, "stop_sequence": stop_sequence}
        return [
            *events,
            {"type": "content_block_stop", "index": 0},
            {"type": "message_delta", "delta": delta, "usage": _usage(self.generation)},
            {"type": "message_stop"},
        ]
