"""The engine protocol: what a worker is sent and streams back, the sampling options every
text API maps onto, and the stop-sequence matching engines do (docs/llm.md)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Annotated, Literal, NotRequired, TypedDict, TypeVar, cast

import msgspec

from .._errors import DynamoError

if TYPE_CHECKING:
    from collections.abc import Sequence

FinishReason = Literal["stop", "length", "cancelled", "error"]
"""Why a generation ended, as the engine reports it (docs/llm.md)."""

_PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
_NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
_T = TypeVar("_T")


class EngineError(DynamoError):
    """A worker's output says generation failed, or is not valid engine output."""

    error_type = "EngineError"


class EngineMessage(TypedDict):
    """One chat message: ``role`` is system, developer, user, assistant or tool."""

    role: str
    content: str


class Continuation(TypedDict):
    """What an interrupted attempt at a request already generated (docs/llm.md)."""

    text: str
    token_ids: list[_NonNegativeInt]


class GenerateRequest(TypedDict):
    """A text-generation request (docs/llm.md)."""

    model: str
    request_type: Literal["chat", "completion"]
    messages: NotRequired[list[EngineMessage]]
    prompt: NotRequired[str]
    max_tokens: NotRequired[_PositiveInt | None]
    min_tokens: NotRequired[_NonNegativeInt | None]
    """Fewest tokens to generate before a stop sequence or end of sequence may end it."""
    temperature: NotRequired[Annotated[float, msgspec.Meta(ge=0.0)] | None]
    top_p: NotRequired[Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | None]
    top_k: NotRequired[_NonNegativeInt | None]
    seed: NotRequired[int | None]
    stop: NotRequired[list[Annotated[str, msgspec.Meta(min_length=1)]]]
    ignore_eos: NotRequired[bool]
    """Keep generating past end of sequence (benchmarks)."""
    continuation: NotRequired[Continuation | None]


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
        leading: list[EngineMessage] = [{"role": "system", "content": system}] if system else []
        return self._request(model, "chat", messages=[*leading, *messages])

    def completion_request(self, model: str, prompt: str) -> GenerateRequest:
        """The engine request to continue ``prompt``."""
        return self._request(model, "completion", prompt=prompt)

    def _request(self, model: str, request_type: str, **prompt: object) -> GenerateRequest:
        options = {field.name: getattr(self, field.name) for field in fields(self)}
        options["stop"] = list(self.stop)
        request = {"model": model, "request_type": request_type, **options, **prompt}
        return cast("GenerateRequest", request)


class Usage(TypedDict):
    """Token counts of one generation."""

    prompt_tokens: int
    completion_tokens: int


class GenerateOutput(TypedDict):
    """One streamed item of a generation (docs/llm.md)."""

    text: NotRequired[str]
    token_ids: NotRequired[list[int]]
    finish_reason: NotRequired[FinishReason | None]
    stop_sequence: NotRequired[str | None]
    """The stop sequence that ended generation, with ``finish_reason == "stop"``."""
    usage: NotRequired[Usage | None]
    """Cumulative usage; required on the last item."""
    error: NotRequired[str]


class EmbedRequest(TypedDict):
    """An embeddings request: one vector per input string."""

    model: str
    request_type: Literal["embedding"]
    input: Annotated[list[str], msgspec.Meta(min_length=1)]
    dimensions: NotRequired[_PositiveInt | None]
    """Length of each vector; ``None`` for the model's own."""


class EmbedUsage(TypedDict):
    """Token counts of an embeddings request."""

    prompt_tokens: int


class EmbedOutput(TypedDict):
    """The single output item of an embeddings request."""

    embeddings: list[list[float]]
    usage: EmbedUsage


def _convert(value: object, kind: type[_T], error: type[Exception], what: str) -> _T:
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as exc:
        raise error(f"{what}: {exc}") from None


def validate_generate_request(request: object) -> GenerateRequest:
    """Check a text-generation request as a worker receives it (ValueError naming the field)."""
    valid = _convert(request, GenerateRequest, ValueError, "invalid generate request")
    max_tokens, min_tokens = valid.get("max_tokens"), valid.get("min_tokens")
    continuation = valid.get("continuation")
    done = 0 if continuation is None else len(continuation["token_ids"])
    if valid["request_type"] == "chat" and not valid.get("messages"):
        problem = "a chat request needs non-empty `messages`"
    elif valid["request_type"] == "completion" and "prompt" not in valid:
        problem = "a completion request needs a `prompt`"
    elif max_tokens is not None and min_tokens is not None and min_tokens > max_tokens:
        problem = f"min_tokens ({min_tokens}) exceeds max_tokens ({max_tokens})"
    elif max_tokens is not None and done > max_tokens:
        problem = f"the continuation has {done} tokens, more than max_tokens ({max_tokens})"
    else:
        return valid
    raise ValueError(f"invalid generate request: {problem}")


def validate_embed_request(request: object) -> EmbedRequest:
    """Check an embeddings request as a worker receives it (ValueError naming the field)."""
    return _convert(request, EmbedRequest, ValueError, "invalid embedding request")


def parse_generate_output(item: object) -> GenerateOutput:
    """Check one output item as the frontend receives it (EngineError if malformed; a
    ``finish_reason`` of ``"error"`` is raised by :class:`~dynamo_trio.llm.Generation`)."""
    return _convert(item, GenerateOutput, EngineError, "malformed engine output")


def parse_embed_output(item: object, *, count: int) -> EmbedOutput:
    """Check the output of an embeddings request of ``count`` inputs (EngineError if not)."""
    output = _convert(item, EmbedOutput, EngineError, "malformed embedding output")
    if (vectors := len(output["embeddings"])) != count:
        raise EngineError(f"malformed embedding output: {vectors} vectors for {count} inputs")
    return output


class StopMatcher:
    """Finds stop sequences in generated text, across token boundaries.

    Text that could still turn into a stop sequence is held back, so text
    already released never has to be taken back::

        matcher = StopMatcher(["\\n\\n"])
        matcher.push("a\\n")   # ("a", None): the "\\n" is held
        matcher.push("\\nb")   # ("", "\\n\\n"): stop; nothing after it is output
    """

    __slots__ = ("_held", "_longest", "_stops")

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._longest = max((len(s) for s in self._stops), default=0)
        self._held = ""

    def push(self, text: str, *, active: bool = True) -> tuple[str, str | None]:
        """Add generated text; ``(released, stop)``: what can be output now (up to a found stop,
        the rest dropped), and the stop found; while not ``active`` (``min_tokens``), all text."""
        pending = self._held + text
        if not active or not self._stops:
            self._held = ""
            return pending, None
        hits = [(at, stop) for stop in self._stops if (at := pending.find(stop)) >= 0]
        if hits:  # the earliest; of stops found at one place, the first given
            at, stop = min(hits, key=lambda hit: hit[0])
            self._held = ""
            return pending[:at], stop
        # Hold back the longest suffix that begins some stop sequence.
        sizes = range(min(len(pending), self._longest - 1), 0, -1)
        keep = next((n for n in sizes if any(s.startswith(pending[-n:]) for s in self._stops)), 0)
        cut = len(pending) - keep
        self._held = pending[cut:]
        return pending[:cut], None

    def flush(self) -> str:
        """Release the held text (generation ended for another reason)."""
        held, self._held = self._held, ""
        return held
