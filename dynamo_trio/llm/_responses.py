"""The OpenAI Responses API (``POST /v1/responses``): parsing, shapes (docs/llm.md)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Literal

from ._errors import TokenLimits, check_output_tokens
from ._generation import EventStream, Generation
from ._protocol import EngineMessage, GenerateRequest, SamplingParams, Usage
from ._validate import (
    JsonObject,
    expect_list,
    expect_object,
    expect_str,
    invalid_value,
    join,
    message,
    model_name,
    optional_bool,
    optional_int,
    optional_number,
    optional_object,
    optional_str,
    required,
    unsupported,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

_ROLES: Final = ("user", "assistant", "system", "developer")
_PART_TYPES: Final = frozenset({"input_text", "output_text"})
_MAX_METADATA_KEYS: Final = 16
_MAX_METADATA_KEY_LENGTH: Final = 64
_MAX_METADATA_VALUE_LENGTH: Final = 512

ResponseStatus = Literal["completed", "incomplete", "cancelled", "failed", "in_progress"]
_FINISHED_STATUS: Final[dict[str, ResponseStatus]] = {
    "length": "incomplete",
    "cancelled": "cancelled",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponsesRequest:
    """A validated ``POST /v1/responses`` body."""

    model: str
    messages: tuple[EngineMessage, ...]  # from ``input``, without ``instructions``
    instructions: str | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stream: bool = False
    metadata: dict[str, str] = field(default_factory=dict)

    def to_engine(self) -> GenerateRequest:
        """The chat engine request; ``instructions`` become a leading system message."""
        return self.sampling.chat_request(self.model, self.messages, system=self.instructions)

    def check_limits(self, limits: TokenLimits) -> None:
        """Refuse a ``max_output_tokens`` over the model's limits (400 naming it)."""
        requested = {"max_output_tokens": self.sampling.max_tokens}
        check_output_tokens(limits, requested, model=self.model)


def parse_responses_request(body: object) -> ResponsesRequest:
    """Validate a Responses API body (a 400 RequestError naming the parameter, if not)."""
    obj = expect_object(body, None)
    model = model_name(obj)
    messages = _input(required(obj, "input"))
    for key, what in (
        ("previous_response_id", "continuing a stored response"),
        ("conversation", "stored conversations"),
    ):
        if obj.get(key) is not None:
            raise unsupported(
                key,
                f"{what} is not supported: this server stores no responses, "
                "so send the whole conversation in 'input'.",
            )
    if optional_bool(obj, "background"):
        raise unsupported("background", "background responses are not supported by this server.")
    return ResponsesRequest(
        model=model,
        messages=messages,
        instructions=optional_str(obj, "instructions"),
        sampling=SamplingParams(
            max_tokens=optional_int(obj, "max_output_tokens", minimum=1),
            temperature=optional_number(obj, "temperature", minimum=0.0, maximum=2.0),
            top_p=optional_number(obj, "top_p", minimum=0.0, maximum=1.0),
        ),
        stream=bool(optional_bool(obj, "stream")),
        metadata=_metadata(obj),
    )


def _input(value: object) -> tuple[EngineMessage, ...]:
    if isinstance(value, str):
        return ({"role": "user", "content": value},)
    items = expect_list(value, "input")
    if not items:
        raise invalid_value("input", "expected at least one input item, but got an empty array.")
    return tuple(_input_message(item, i) for i, item in enumerate(items))


def _input_message(value: object, index: int) -> EngineMessage:
    if isinstance(value, dict) and value.get("type") not in (None, "", "message"):
        param = join("input", index)
        item_type = optional_str(value, "type", param)
        raise unsupported(
            join(param, "type"),
            f"input items of type {item_type!r} are not supported; "
            "this server accepts only 'message' items.",
        )
    return message(value, "input", index, _ROLES, _PART_TYPES)


def _metadata(obj: JsonObject) -> dict[str, str]:
    metadata = optional_object(obj, "metadata")
    if metadata is None:
        return {}
    if len(metadata) > _MAX_METADATA_KEYS:
        raise invalid_value(
            "metadata", f"expected at most {_MAX_METADATA_KEYS} keys, but got {len(metadata)}."
        )
    checked: dict[str, str] = {}
    for key, value in metadata.items():
        if len(key) > _MAX_METADATA_KEY_LENGTH:
            raise invalid_value(
                "metadata",
                f"expected keys of at most {_MAX_METADATA_KEY_LENGTH} characters, but got a "
                f"key of {len(key)} characters.",
            )
        param = join("metadata", key)
        checked[key] = expect_str(value, param, max_length=_MAX_METADATA_VALUE_LENGTH)
    return checked


def responses_usage(usage: Usage) -> dict[str, object]:
    """Responses ``usage``: input/output/total tokens and their (zero) details."""
    prompt, completion = usage["prompt_tokens"], usage["completion_tokens"]
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def response_object(
    request: ResponsesRequest,
    request_id: str,
    generation: Generation,
    *,
    created_at: int | None = None,
) -> dict[str, object]:
    """The unary ``response`` object for a finished generation."""
    return ResponseStream(request, request_id, created_at=created_at)._finished(generation)[1]


def _output_text(text: str) -> dict[str, object]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


class ResponseStream(EventStream[ResponsesRequest]):
    """Turns engine output items into the Responses API's streaming events (the response is
    ``resp_<request_id>``, its message item ``msg_<request_id>``)."""

    __slots__ = ("_created_at", "_item_id", "_sequence")

    def __init__(
        self, request: ResponsesRequest, request_id: str, *, created_at: int | None = None
    ) -> None:
        super().__init__(request, request_id)
        self._item_id = f"msg_{request_id}"
        self._created_at = int(time.time()) if created_at is None else created_at
        self._sequence = 0

    def _event(self, type: str, **fields: object) -> dict[str, object]:
        event: dict[str, object] = {"type": type, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def _response(
        self, status: ResponseStatus, output: Sequence[object], usage: Usage | None, **more: object
    ) -> dict[str, object]:
        """The response object; ``more`` fills in its ``error`` or ``incomplete_details``."""
        request, sampling = self._request, self._request.sampling
        return {
            "id": f"resp_{self._request_id}",
            "object": "response",
            "created_at": self._created_at,
            "status": status,
            "completed_at": int(time.time()) if status == "completed" else None,
            "background": False,
            "error": None,
            "incomplete_details": None,
            "instructions": request.instructions,
            "max_output_tokens": sampling.max_tokens,
            "metadata": dict(request.metadata),
            "model": request.model,
            "output": output,
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "temperature": 1.0 if sampling.temperature is None else sampling.temperature,
            "text": {"format": {"type": "text"}},
            "tool_choice": "auto",
            "tools": [],
            "top_p": 1.0 if sampling.top_p is None else sampling.top_p,
            "truncation": "disabled",
            "usage": None if usage is None else responses_usage(usage),
        } | more

    def _item(self, status: str, text: str | None) -> dict[str, object]:
        """The message item (no content part while ``text`` is None)."""
        return {
            "id": self._item_id,
            "type": "message",
            "role": "assistant",
            "status": status,
            "content": [] if text is None else [_output_text(text)],
        }

    def _finished(self, generation: Generation) -> tuple[dict[str, object], dict[str, object]]:
        """A finished generation's message item, and the response that holds it."""
        status = _FINISHED_STATUS.get(generation.finish_reason, "completed")
        item = self._item("completed" if status == "completed" else "incomplete", generation.text)
        details = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return item, self._response(status, [item], generation.usage, incomplete_details=details)

    def _in_text(self, type: str, **fields: object) -> dict[str, object]:
        return self._event(type, item_id=self._item_id, output_index=0, content_index=0, **fields)

    def _opening(self) -> list[dict[str, object]]:
        in_progress, item = self._response("in_progress", [], None), self._item("in_progress", None)
        part = {"type": "output_text", "text": "", "annotations": []}
        return [
            self._event("response.created", response=in_progress),
            self._event("response.in_progress", response=in_progress),
            self._event("response.output_item.added", output_index=0, item=item),
            self._in_text("response.content_part.added", part=part),
        ]

    def _delta(self, text: str) -> list[dict[str, object]]:
        return [self._in_text("response.output_text.delta", delta=text, logprobs=[])]

    def fail(self, message: str, *, code: str = "server_error") -> list[dict[str, object]]:
        """The events that end the stream with an error, ``error`` then ``response.failed``
        (``[]`` if it already ended); ``code`` is a Responses API error code (``server_error``)."""
        events = self.start()
        if not self._close():
            return events
        text, error = self.generation.text, {"code": code, "message": message}
        output = [self._item("incomplete", text)] if text else []
        failed = self._response("failed", output, self.generation.usage, error=error)
        events.append(self._event("error", **error, param=None))
        return [*events, self._event("response.failed", response=failed)]

    def _closing(self, text: str) -> list[dict[str, object]]:
        events = self._delta(text) if text else []
        item, response = self._finished(self.generation)
        text = self.generation.text
        done = "response.completed" if response["status"] == "completed" else "response.incomplete"
        return [
            *events,
            self._in_text("response.output_text.done", text=text, logprobs=[]),
            self._in_text("response.content_part.done", part=_output_text(text)),
            self._event("response.output_item.done", output_index=0, item=item),
            self._event(done, response=response),
        ]
