"""The OpenAI chat completions, completions, models and embeddings APIs: parsing, shapes
(docs/llm.md)."""

from __future__ import annotations

import base64
import struct
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal, cast

import msgspec

from ._errors import TokenLimits, check_output_tokens, openai_error_body
from ._generation import EventStream, Generation, plain_text
from ._protocol import (
    EmbedRequest,
    EngineMessage,
    FinishReason,
    GenerateRequest,
    SamplingParams,
    Usage,
    parse_embed_output,
)
from ._sse import encode_event
from ._validate import (
    JsonObject,
    expect_object,
    expect_str,
    invalid_type,
    invalid_value,
    join,
    model_name,
    optional_bool,
    optional_int,
    optional_number,
    optional_object,
    optional_str,
    read_messages,
    required,
    stop_sequences,
    unsupported,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

_CHAT_ROLES: Final = ("system", "developer", "user", "assistant", "tool")
_CHAT_PART_TYPES: Final = frozenset({"text"})
_MAX_STOP_SEQUENCES: Final = 4
_MAX_LOGIT_BIAS: Final = 300
_MAX_EMBEDDING_INPUTS: Final = 2048

OpenAIFinishReason = Literal["stop", "length"]
EncodingFormat = Literal["float", "base64"]


@dataclass(frozen=True, slots=True, kw_only=True)
class _OpenAIRequest:
    """What a chat and a completions body share."""

    model: str
    sampling: SamplingParams
    stream: bool = False
    include_usage: bool = False
    """``stream_options.include_usage``: end the stream with a usage chunk."""
    max_tokens_param: str = "max_tokens"
    """Which parameter set ``sampling.max_tokens`` (``max_completion_tokens`` wins)."""

    def check_limits(self, limits: TokenLimits) -> None:
        """Refuse token counts over the model's limits (400 naming the parameter)."""
        sampling = self.sampling
        requested = {self.max_tokens_param: sampling.max_tokens, "min_tokens": sampling.min_tokens}
        check_output_tokens(limits, requested, model=self.model)


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatRequest(_OpenAIRequest):
    """A validated ``POST /v1/chat/completions`` body."""

    messages: tuple[EngineMessage, ...]

    def to_engine(self) -> GenerateRequest:
        return self.sampling.chat_request(self.model, self.messages)


@dataclass(frozen=True, slots=True, kw_only=True)
class CompletionRequest(_OpenAIRequest):
    """A validated ``POST /v1/completions`` body (one text prompt)."""

    prompt: str

    def to_engine(self) -> GenerateRequest:
        return self.sampling.completion_request(self.model, self.prompt)


def parse_chat_request(body: object) -> ChatRequest:
    """Validate a chat completions body (a 400 RequestError naming the parameter, if not)."""
    obj = expect_object(body, None)
    model = model_name(obj)
    messages = read_messages(obj, _CHAT_ROLES, _CHAT_PART_TYPES, contentless="assistant")
    _refuse_choices(obj, "n")
    if optional_bool(obj, "logprobs"):
        raise unsupported("logprobs", "log probabilities are not supported by this server.")
    optional_int(obj, "top_logprobs", minimum=0, maximum=20)
    stream, include_usage = _stream_flags(obj)
    sampling, max_param = _sampling(obj)
    return ChatRequest(
        model=model,
        messages=messages,
        sampling=sampling,
        stream=stream,
        include_usage=include_usage,
        max_tokens_param=max_param,
    )


def parse_completion_request(body: object) -> CompletionRequest:
    """Validate a (legacy) completions body with one text prompt (batch, token ids: 400)."""
    obj = expect_object(body, None)
    model = model_name(obj)
    prompt = _prompt(required(obj, "prompt"))
    _refuse_choices(obj, "n")
    _refuse_choices(obj, "best_of")
    if optional_bool(obj, "echo"):
        raise unsupported("echo", "echoing the prompt is not supported by this server.")
    if optional_int(obj, "logprobs", minimum=0, maximum=5):
        raise unsupported("logprobs", "log probabilities are not supported by this server.")
    if optional_str(obj, "suffix"):
        raise unsupported("suffix", "insertion (a suffix) is not supported by this server.")
    stream, include_usage = _stream_flags(obj)
    return CompletionRequest(
        model=model,
        prompt=prompt,
        sampling=_sampling(obj)[0],
        stream=stream,
        include_usage=include_usage,
    )


def _prompt(value: object) -> str:
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise invalid_type("prompt", "a string or an array of strings", value)
    if not value:
        raise invalid_value("prompt", "expected a prompt, but got an empty array.")
    if any(isinstance(p, list) for p in value) or all(type(p) is int for p in value):
        raise unsupported("prompt", "token-id prompts are not supported; send the prompt as text.")
    for index, item in enumerate(value):
        expect_str(item, join("prompt", index))
    if len(value) > 1:
        raise unsupported(
            "prompt",
            f"batch prompts are not supported (got {len(value)} prompts); "
            "send one prompt per request.",
        )
    return str(value[0])


def _refuse_choices(obj: JsonObject, key: str) -> None:
    count = optional_int(obj, key, minimum=1)
    if count is not None and count != 1:
        raise unsupported(key, f"this server returns one choice per request, so {key} must be 1.")


def _refuse_logit_bias(obj: JsonObject) -> None:
    """Check ``logit_bias``, then refuse a non-empty one (the engine protocol cannot carry it)."""
    bias = optional_object(obj, "logit_bias")
    if not bias:
        return
    if len(bias) > _MAX_LOGIT_BIAS:
        raise invalid_value(
            "logit_bias", f"expected at most {_MAX_LOGIT_BIAS} entries, but got {len(bias)}."
        )
    for token in bias:
        param = join("logit_bias", token)
        if not (token.isascii() and token.isdigit() and len(token) <= 10):
            raise invalid_value(param, "expected a token id (a non-negative integer) as key.")
        optional_number(bias, token, "logit_bias", minimum=-100.0, maximum=100.0)
    raise unsupported("logit_bias", "biasing token probabilities is not supported by this server.")


def _stream_flags(obj: JsonObject) -> tuple[bool, bool]:
    stream = bool(optional_bool(obj, "stream"))
    options = optional_object(obj, "stream_options")
    if options is None:
        return stream, False
    if not stream:
        raise invalid_value("stream_options", "stream_options is only allowed when stream is true.")
    return True, bool(optional_bool(options, "include_usage", "stream_options"))


def _sampling(obj: JsonObject) -> tuple[SamplingParams, str]:
    """The sampling options, and which parameter set ``max_tokens``."""
    max_tokens = optional_int(obj, "max_completion_tokens", minimum=1)
    legacy = optional_int(obj, "max_tokens", minimum=1)  # checked even when overridden
    max_key = "max_completion_tokens" if max_tokens is not None else "max_tokens"
    max_tokens = legacy if max_tokens is None else max_tokens
    min_tokens = optional_int(obj, "min_tokens", minimum=0)
    if min_tokens is not None and max_tokens is not None and min_tokens > max_tokens:
        raise invalid_value(
            "min_tokens", f"expected at most {max_key} ({max_tokens}), but got {min_tokens}."
        )
    optional_number(obj, "presence_penalty", minimum=-2.0, maximum=2.0)
    optional_number(obj, "frequency_penalty", minimum=-2.0, maximum=2.0)
    _refuse_logit_bias(obj)
    return SamplingParams(
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        temperature=optional_number(obj, "temperature", minimum=0.0, maximum=2.0),
        top_p=optional_number(obj, "top_p", minimum=0.0, maximum=1.0),
        seed=optional_int(obj, "seed"),
        stop=stop_sequences(obj, "stop", max_items=_MAX_STOP_SEQUENCES, allow_string=True),
        ignore_eos=bool(optional_bool(obj, "ignore_eos")),
    ), max_key


def openai_finish_reason(reason: FinishReason) -> OpenAIFinishReason:
    """The OpenAI ``finish_reason`` for an engine one; ``"cancelled"`` becomes ``"stop"``."""
    return "length" if reason == "length" else "stop"


def openai_usage(usage: Usage) -> dict[str, int]:
    """OpenAI ``usage`` (``prompt_tokens``, ``completion_tokens``, ``total_tokens``)."""
    prompt, completion = usage["prompt_tokens"], usage["completion_tokens"]
    total = prompt + completion
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": total}


def _now(created: int | None) -> int:
    return int(time.time()) if created is None else created


def chat_completion(
    request: ChatRequest, request_id: str, generation: Generation, *, created: int | None = None
) -> dict[str, object]:
    """The unary ``chat.completion`` object for a finished generation."""
    return _unary(f"chatcmpl-{request_id}", "chat.completion", request.model, generation, created)


def completion(
    request: CompletionRequest,
    request_id: str,
    generation: Generation,
    *,
    created: int | None = None,
) -> dict[str, object]:
    """The unary ``text_completion`` object for a finished generation."""
    return _unary(f"cmpl-{request_id}", "text_completion", request.model, generation, created)


def _unary(id: str, kind: str, model: str, gen: Generation, when: int | None) -> dict[str, object]:
    text, reason = gen.text, openai_finish_reason(gen.finish_reason)
    message = {"role": "assistant", "content": text, "refusal": None}
    content = {"message": message} if kind == "chat.completion" else {"text": text}
    return {
        "id": id,
        "object": kind,
        "created": _now(when),
        "model": model,
        "choices": [{"index": 0, **content, "logprobs": None, "finish_reason": reason}],
        "usage": openai_usage(gen.usage),
    }


class _ChunkStream(EventStream[_OpenAIRequest]):
    """What the chat and completion chunk streams share: the chunk, the SSE fast path, the end."""

    __slots__ = ("_created", "_id", "_include_usage", "_template")

    _object: str
    _id_prefix: str
    _text_chunk: Callable[[str, OpenAIFinishReason | None], dict[str, object]]

    def __init__(
        self, request: _OpenAIRequest, request_id: str, *, created: int | None = None
    ) -> None:
        super().__init__(request, request_id)
        self._id = self._id_prefix + request_id
        self._include_usage = request.include_usage
        self._created = _now(created)
        # A plain text item's chunk: this prefix, the JSON string of its text, this suffix.
        chunk = _JSON.encode(self._text_chunk(_MARK, None))
        prefix, _, suffix = chunk.partition(_JSON.encode(_MARK))
        self._template = (b"data: " + prefix, suffix + b"\n\n")

    def _chunk(self, choice: dict[str, object] | None, **usage: object) -> dict[str, object]:
        chunk: dict[str, object] = {
            "id": self._id,
            "object": self._object,
            "created": self._created,
            "model": self._request.model,
            "choices": [] if choice is None else [choice],
        }
        if self._include_usage:
            chunk["usage"] = None
        return chunk | usage

    def _choice(self, reason: OpenAIFinishReason | None, **content: object) -> dict[str, object]:
        return self._chunk({"index": 0, **content, "logprobs": None, "finish_reason": reason})

    def _delta(self, text: str) -> list[dict[str, object]]:
        return [self._text_chunk(text, None)]

    def _closing(self, text: str) -> list[dict[str, object]]:
        return [self._text_chunk(text, openai_finish_reason(self.generation.finish_reason))]

    def feed_sse(self, items: Iterable[object]) -> bytes:
        """The SSE bytes of :meth:`feed` for a batch of items (a plain text item fills a
        pre-encoded chunk template)."""
        parts = [encode_event(chunk) for chunk in self.start()]
        for item in items:
            if self._closed:
                break
            text = plain_text(item)
            if text is None:
                parts.extend(encode_event(chunk) for chunk in self.feed(item))
                continue
            self.generation.feed_plain(text, item.get("token_ids"))  # type: ignore[attr-defined]
            if text:
                prefix, suffix = self._template
                parts.append(prefix + _JSON.encode(text) + suffix)
        return b"".join(parts)

    def finish(self) -> list[dict[str, object]]:
        """The chunks that end the stream (finish, usage if asked); send ``data: [DONE]`` after."""
        chunks = super().finish()
        if self._include_usage:
            chunks.append(self._chunk(None, usage=openai_usage(self.generation.usage)))
            self._include_usage = False  # at most once
        return chunks

    def fail(self, message: str, *, status: int = 500) -> list[dict[str, object]]:
        """The error that ends a failed stream (``[]`` if it already ended): send it with
        :func:`~dynamo_trio.llm.encode_error_event`, and no ``[DONE]`` after it."""
        if not self._close():
            return []
        self._include_usage = False
        return [openai_error_body(status, message)]


_JSON: Final = msgspec.json.Encoder()
_MARK: Final = "\x00text\x00"  # no engine text is this: a NUL-delimited placeholder


class ChatCompletionStream(_ChunkStream):
    """Turns engine output items into ``chat.completion.chunk`` objects: the assistant role
    first (empty content), then a content chunk per text delta, ``finish_reason`` last."""

    __slots__ = ()
    _object = "chat.completion.chunk"
    _id_prefix = "chatcmpl-"

    def _opening(self) -> list[dict[str, object]]:
        return [self._choice(None, delta={"role": "assistant", "content": ""})]

    def _text_chunk(self, text: str, finish_reason: OpenAIFinishReason | None) -> dict[str, object]:
        return self._choice(finish_reason, delta={"content": text} if text else {})


class CompletionStream(_ChunkStream):
    """Turns engine output items into streamed ``text_completion`` objects."""

    __slots__ = ()
    _object = "text_completion"
    _id_prefix = "cmpl-"

    def _text_chunk(self, text: str, finish_reason: OpenAIFinishReason | None) -> dict[str, object]:
        return self._choice(finish_reason, text=text)


def model_object(model: str, *, created: int | None = None) -> dict[str, object]:
    """One ``model`` object, as in ``GET /v1/models/{model}``."""
    return {"id": model, "object": "model", "created": _now(created), "owned_by": "dynamo-trio"}


def model_list(models: Iterable[str], *, created: int | None = None) -> dict[str, object]:
    """The ``GET /v1/models`` body: each name once, in the order given."""
    when = _now(created)
    data = [model_object(model, created=when) for model in dict.fromkeys(models)]
    return {"object": "list", "data": data}


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
    encoding = cast("EncodingFormat", optional_str(obj, "encoding_format") or "float")
    if encoding not in ("float", "base64"):
        detail = f"expected 'float' or 'base64', but got {encoding!r}."
        raise invalid_value("encoding_format", detail)
    dims = optional_int(obj, "dimensions", minimum=1)
    return EmbeddingRequest(model=model, inputs=inputs, encoding_format=encoding, dimensions=dims)


def _inputs(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        return (expect_str(value, "input", nonempty=True),)
    if not isinstance(value, list):
        raise invalid_type("input", "a string or an array of strings", value)
    if not value:
        raise invalid_value("input", "expected at least one input, but got an empty array.")
    if len(value) > _MAX_EMBEDDING_INPUTS:
        raise invalid_value(
            "input", f"expected at most {_MAX_EMBEDDING_INPUTS} inputs, but got {len(value)}."
        )
    if any(isinstance(v, int | list) and not isinstance(v, bool) for v in value):
        raise unsupported("input", "token-id inputs are not supported; send the input as text.")
    return tuple(
        expect_str(item, join("input", index), nonempty=True) for index, item in enumerate(value)
    )


def encode_base64_floats(vector: Sequence[float]) -> str:
    """A vector as base64 of little-endian float32 bytes (``encoding_format="base64"``)."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def embedding_response(request: EmbeddingRequest, output: object) -> dict[str, object]:
    """The embeddings ``list`` object for the engine's output item (EngineError if malformed)."""
    valid = parse_embed_output(output, count=len(request.inputs))
    encode = encode_base64_floats if request.encoding_format == "base64" else None
    data = [
        {"object": "embedding", "index": index, "embedding": encode(v) if encode else v}
        for index, v in enumerate(valid["embeddings"])
    ]
    tokens = valid["usage"]["prompt_tokens"]
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return {"object": "list", "data": data, "model": request.model, "usage": usage}
