"""The engine protocol: what the frontend sends a worker, and what the worker streams back.

Everything here is plain JSON on the request plane (dicts, lists, strings,
numbers), described by ``TypedDict`` s so both sides share one definition.
The HTTP APIs (OpenAI, Responses, Anthropic) are translated into these shapes
by the frontend; a worker never sees an HTTP body.

Text generation
===============

Request (:class:`GenerateRequest`)::

    {"model": "m", "request_type": "chat", "messages": [{"role": "user", "content": "hi"}],
     "max_tokens": 16, "min_tokens": 0, "temperature": 0.7, "top_p": 1.0, "top_k": null,
     "seed": 42, "stop": ["\\n\\n"], "ignore_eos": false}

``request_type`` is ``"chat"`` (with ``messages``) or ``"completion"`` (with
``prompt``).  Only ``model`` and ``request_type`` and the text are required;
every sampling field may be absent or null, meaning "the engine's default".
``max_tokens: null`` lets the engine pick its own limit.  ``stop`` sequences
end generation when produced; they are not part of the output text.

Output items (:class:`GenerateOutput`), streamed in order::

    {"text": " quick", "token_ids": [17]}
    {"text": " fox", "token_ids": [23], "finish_reason": "length",
     "usage": {"prompt_tokens": 5, "completion_tokens": 2}}

``text`` is a delta: the concatenation of every item's ``text`` is the
output.  The item carrying ``finish_reason`` is the last one and carries
``usage``; items after it are ignored.  ``finish_reason`` is:

- ``"stop"``: the model ended on its own (end of sequence, or a stop
  sequence: then ``stop_sequence`` names it);
- ``"length"``: ``max_tokens`` was reached;
- ``"cancelled"``: the request's context was *stopped* and the engine ended
  early; the item still carries the usage of what was generated (Dynamo's
  ``LLMEngineOutput::cancelled()``);
- ``"error"``: generation failed; ``error`` says why.

A stream that ends without a ``finish_reason`` is treated as ``"stop"``.
A *killed* request produces no last item at all: its stream is abandoned.

Continuations (request migration)
=================================

A request may carry a ``continuation``: what an earlier attempt at the same
request already generated before its worker was lost (:class:`Continuation`)::

    {..., "max_tokens": 16, "continuation": {"text": "The quick", "token_ids": [2, 17]}}

``token_ids`` are every token the earlier attempt generated, in order, and
``text`` the text of its items (what the client has been sent).  The engine
generates what comes *after* them, as if it had produced them itself:

- they count against ``max_tokens`` and ``min_tokens`` (the limits are for
  the whole generation: here 14 more tokens at most);
- stop sequences are matched across the boundary;
- the items it yields carry only the new text and token ids, so the
  concatenation of both attempts' items is one generation;
- ``usage.completion_tokens`` counts the whole generation (the continued
  tokens included), ``usage.prompt_tokens`` the original prompt.

An engine that works on token ids appends ``token_ids`` to the prompt's; one
that works on text continues ``text``.  A worker announces that it honours
continuations on its model card (``register_model(...,
accepts_continuation=True)``); the frontend migrates a request only to such
workers, since one that ignored the field would repeat the output.

Embeddings
==========

Request (:class:`EmbedRequest`)::

    {"model": "m", "request_type": "embedding", "input": ["a", "b"], "dimensions": 8}

Output, one item (:class:`EmbedOutput`)::

    {"embeddings": [[0.1, ...], [0.3, ...]], "usage": {"prompt_tokens": 2}}

Validation
==========

A worker validates what it receives with :func:`validate_generate_request` /
:func:`validate_embed_request`, which raise :class:`ValueError` (the runtime
reports it to the caller as ``InvalidArgument``).  The frontend validates what
it gets back with :func:`parse_generate_output` / :func:`parse_embed_output`,
which raise :class:`EngineError`, so a buggy worker fails one request with a
500 instead of crashing the server.
"""

from __future__ import annotations

from typing import Annotated, Literal, NotRequired, TypedDict

import msgspec

from .._errors import DynamoError

__all__ = [
    "EmbedOutput",
    "EmbedRequest",
    "EmbedUsage",
    "EngineError",
    "Continuation",
    "EngineMessage",
    "FinishReason",
    "GenerateOutput",
    "GenerateRequest",
    "Usage",
    "parse_embed_output",
    "parse_generate_output",
    "validate_embed_request",
    "validate_generate_request",
]

FinishReason = Literal["stop", "length", "cancelled", "error"]
"""Why a generation ended, as the engine reports it (see the module docstring)."""

_PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
_NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]


class EngineError(DynamoError):
    """A worker's output says generation failed, or is not valid engine output."""

    error_type = "EngineError"


class EngineMessage(TypedDict):
    """One chat message: ``role`` is system, developer, user, assistant or tool."""

    role: str
    content: str


class Continuation(TypedDict):
    """What an interrupted attempt at a request already generated (see the module docstring)."""

    text: str
    """The text of the items already generated (what the client has been sent)."""
    token_ids: list[_NonNegativeInt]
    """Every token already generated, in order; they count against ``max_tokens``."""


class GenerateRequest(TypedDict):
    """A text-generation request (see the module docstring)."""

    model: str
    request_type: Literal["chat", "completion"]
    messages: NotRequired[list[EngineMessage]]
    """The conversation (``request_type == "chat"``)."""
    prompt: NotRequired[str]
    """The text to continue (``request_type == "completion"``)."""
    max_tokens: NotRequired[_PositiveInt | None]
    """Most tokens to generate; ``None`` for the engine's default."""
    min_tokens: NotRequired[_NonNegativeInt | None]
    """Fewest tokens to generate before a stop sequence or end of sequence may end it."""
    temperature: NotRequired[Annotated[float, msgspec.Meta(ge=0.0)] | None]
    top_p: NotRequired[Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | None]
    top_k: NotRequired[_NonNegativeInt | None]
    seed: NotRequired[int | None]
    stop: NotRequired[list[Annotated[str, msgspec.Meta(min_length=1)]]]
    """Stop sequences; generation ends before the first one produced."""
    ignore_eos: NotRequired[bool]
    """Keep generating past end of sequence (benchmarks)."""
    continuation: NotRequired[Continuation | None]
    """Continue an interrupted generation after these tokens (request migration)."""


class Usage(TypedDict):
    """Token counts of one generation."""

    prompt_tokens: int
    completion_tokens: int


class GenerateOutput(TypedDict):
    """One streamed item of a generation (see the module docstring)."""

    text: NotRequired[str]
    """The text delta (absent means empty)."""
    token_ids: NotRequired[list[int]]
    """The ids of the tokens generated for this item."""
    finish_reason: NotRequired[FinishReason | None]
    stop_sequence: NotRequired[str | None]
    """The stop sequence that ended generation, with ``finish_reason == "stop"``."""
    usage: NotRequired[Usage | None]
    """Cumulative usage; required on the last item."""
    error: NotRequired[str]
    """Why generation failed, with ``finish_reason == "error"``."""


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


def validate_generate_request(request: object) -> GenerateRequest:
    """Check a text-generation request as a worker receives it.

    Returns:
        The request, with unknown keys dropped and integers accepted for floats.

    Raises:
        ValueError: with a message naming the offending field.
    """
    try:
        valid = msgspec.convert(request, GenerateRequest)
    except msgspec.ValidationError as exc:
        raise ValueError(f"invalid generate request: {exc}") from None
    if valid["request_type"] == "chat":
        if not valid.get("messages"):
            raise ValueError("invalid generate request: a chat request needs non-empty `messages`")
    elif "prompt" not in valid:
        raise ValueError("invalid generate request: a completion request needs a `prompt`")
    max_tokens, min_tokens = valid.get("max_tokens"), valid.get("min_tokens")
    if max_tokens is not None and min_tokens is not None and min_tokens > max_tokens:
        raise ValueError(
            f"invalid generate request: min_tokens ({min_tokens}) exceeds max_tokens ({max_tokens})"
        )
    continuation = valid.get("continuation")
    if continuation is not None and max_tokens is not None:
        done = len(continuation["token_ids"])
        if done > max_tokens:
            raise ValueError(
                f"invalid generate request: the continuation has {done} tokens, "
                f"more than max_tokens ({max_tokens})"
            )
    return valid


def validate_embed_request(request: object) -> EmbedRequest:
    """Check an embeddings request as a worker receives it.

    Raises:
        ValueError: with a message naming the offending field.
    """
    try:
        return msgspec.convert(request, EmbedRequest)
    except msgspec.ValidationError as exc:
        raise ValueError(f"invalid embedding request: {exc}") from None


def parse_generate_output(item: object) -> GenerateOutput:
    """Check one output item as the frontend receives it.

    Raises:
        EngineError: if the item is malformed.  A ``finish_reason`` of
            ``"error"`` is *not* raised here; see :class:`~dynamo_trio.llm.Generation`.
    """
    try:
        return msgspec.convert(item, GenerateOutput)
    except msgspec.ValidationError as exc:
        raise EngineError(f"malformed engine output: {exc}") from None


def parse_embed_output(item: object, *, count: int) -> EmbedOutput:
    """Check the output of an embeddings request that had ``count`` inputs.

    Raises:
        EngineError: if the item is malformed or has the wrong number of vectors.
    """
    try:
        output = msgspec.convert(item, EmbedOutput)
    except msgspec.ValidationError as exc:
        raise EngineError(f"malformed embedding output: {exc}") from None
    if len(output["embeddings"]) != count:
        raise EngineError(
            f"malformed embedding output: {len(output['embeddings'])} vectors for {count} inputs"
        )
    return output
