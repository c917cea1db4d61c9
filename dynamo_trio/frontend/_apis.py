"""The generating HTTP APIs as data: how each parses, answers, streams and fails (one
:class:`TextApi` per text route, one :class:`MediaApi` per other route).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

from .. import llm
from .._errors import DynamoError
from ..edge import json_bytes

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..discovery import ModelType
    from ..metrics import FrontendEndpoint, FrontendRequestTracker


@dataclass(frozen=True, kw_only=True)
class Api:
    """What every generating route has: its metrics label, model type and error shape."""

    label: FrontendEndpoint
    """The ``endpoint`` label of the frontend metrics."""
    model_type: ModelType
    """Which registered model type serves it."""
    parse: Callable[[object], Any]
    """The body to a request with ``model`` (and, but for embeddings, ``stream``)."""
    prompt_param: str | None = None
    """The parameter a worker's refusal of a prompt too long for the context blames."""
    anthropic: bool = False
    """Errors in Anthropic's shape (else OpenAI's)."""

    def request_error_body(self, error: llm.RequestError) -> dict[str, object]:
        return error.anthropic_body() if self.anthropic else error.openai_body()

    def error_body(
        self, status: int, message: str, cause: BaseException | None = None, code: str | None = None
    ) -> dict[str, object]:
        """The API's JSON error body (OpenAI's with ``code``, if given); a worker's refusal
        that names its parameter keeps its ``code`` and ``param``."""
        if self.prompt_param is not None and isinstance(cause, DynamoError):
            refined = llm.context_length_error(cause, param=self.prompt_param)
            if refined is not None:
                return self.request_error_body(refined)
        if self.anthropic:
            return llm.anthropic_error_body(status, message)
        return llm.openai_error_body(status, message, code=code)


def _typed_events(events: list[dict[str, object]]) -> bytes:
    return b"".join(llm.encode_event(event, event=str(event["type"])) for event in events)


class TextBody:
    """A text route's streamed body, as OpenAI's SSE: each batch of engine items as the
    stream's chunks (the tokens they fold counted as they go out), then ``[DONE]``."""

    __slots__ = ("_events", "_generation", "_tracker")

    content_type: Final = "text/event-stream"
    keepalive: Final = True

    def __init__(self, events: Any, tracker: FrontendRequestTracker) -> None:
        self._events = events
        self._generation: llm.Generation = events.generation
        self._tracker = tracker

    def feed_batch(self, batch: list[object]) -> bytes:
        generation = self._generation
        counted = generation.output_tokens
        try:
            return self._encode(batch)
        finally:  # (the tokens folded before an engine error count too)
            self._tracker.tokens(generation.output_tokens - counted)

    def _encode(self, batch: list[object]) -> bytes:
        return self._events.feed_sse(batch)  # type: ignore[no-any-return]

    def finish(self) -> bytes:
        return b"".join(map(llm.encode_event, self._events.finish())) + llm.DONE

    def fail(self, status: int, message: str) -> bytes:
        return b"".join(map(llm.encode_error_event, self._events.fail(message, status=status)))


class _TypedBody(TextBody):
    """Events named by their ``type``, and no ``[DONE]`` (Anthropic's messages)."""

    __slots__ = ()

    def _encode(self, batch: list[object]) -> bytes:
        return _typed_events([event for item in batch for event in self._events.feed(item)])

    def finish(self) -> bytes:
        return _typed_events(self._events.finish())

    def fail(self, status: int, message: str) -> bytes:
        return _typed_events(self._events.fail(message, status=status))


class _ResponsesBody(_TypedBody):
    """The Responses API's: its failure has a ``code``, not a status."""

    __slots__ = ()

    def fail(self, status: int, message: str) -> bytes:
        code = "invalid_request" if status == 400 else "server_error"
        return _typed_events(self._events.fail(message, code=code))


@dataclass(frozen=True, kw_only=True)
class TextApi(Api):
    """One text-generating route."""

    unary: Callable[[Any, str, llm.Generation], dict[str, object]]
    open_stream: Callable[[Any, str], Any]
    """``(request, request_id)`` to the stream of events (:mod:`dynamo_trio.llm`'s)."""
    body: type[TextBody] = TextBody
    """How those events go on the wire."""


CHAT: Final = TextApi(
    label="chat_completions",
    model_type="chat",
    prompt_param="messages",
    parse=llm.parse_chat_request,
    unary=llm.chat_completion,
    open_stream=llm.ChatCompletionStream,
)

COMPLETIONS: Final = TextApi(
    label="completions",
    model_type="completions",
    prompt_param="prompt",
    parse=llm.parse_completion_request,
    unary=llm.completion,
    open_stream=llm.CompletionStream,
)

RESPONSES: Final = TextApi(
    label="responses",
    model_type="chat",
    prompt_param="input",
    parse=llm.parse_responses_request,
    unary=llm.response_object,
    open_stream=llm.ResponseStream,
    body=_ResponsesBody,
)

ANTHROPIC_MESSAGES: Final = TextApi(
    label="anthropic_messages",
    model_type="chat",
    prompt_param="messages",
    anthropic=True,
    parse=llm.parse_messages_request,
    unary=llm.message_object,
    open_stream=llm.MessagesStream,
    body=_TypedBody,
)


class StreamBody(Protocol):
    """A streamed body (SSE, MJPEG, audio): its content type, whether silences may be filled
    with SSE keep-alive comments, its end, and what ends it after a failure once it has
    started (may be nothing)."""

    @property
    def content_type(self) -> str: ...
    @property
    def keepalive(self) -> bool: ...
    def finish(self) -> bytes: ...
    def fail(self, status: int, message: str) -> bytes: ...


class MediaStream(StreamBody, Protocol):
    """A media route's streamed body: the bytes for each worker item."""

    def feed(self, item: object) -> bytes: ...


@dataclass(frozen=True, kw_only=True)
class MediaApi(Api):
    """One route beyond text: its request says whether it streams (``request.stream``)."""

    unary: Callable[[Any, str, list[object], float], dict[str, object] | llm.BinaryBody]
    """``(request, request_id, items, started)`` to the whole answer."""
    open_stream: Callable[[Any, str], MediaStream] | None = None
    """``(request, request_id)`` to a streamed body (``None``: the route never streams)."""


def _images(request: Any, request_id: str, items: list[object], started: float) -> Any:
    return llm.image_response(request, items)


def _speech(request: Any, request_id: str, items: list[object], started: float) -> Any:
    return llm.speech_body(request, items)


def _embeddings(request: Any, request_id: str, items: list[object], started: float) -> Any:
    return llm.embedding_response(request, items[-1] if items else None)


EMBEDDINGS: Final = MediaApi(
    label="embeddings",
    model_type="embeddings",
    parse=llm.parse_embedding_request,
    prompt_param="input",
    unary=_embeddings,
)
IMAGE_GENERATIONS: Final = MediaApi(
    label="images", model_type="images", parse=llm.parse_image_request, unary=_images
)
IMAGE_EDITS: Final = MediaApi(
    label="images", model_type="images", parse=llm.parse_image_edit_request, unary=_images
)
SPEECH: Final = MediaApi(
    label="audios",
    model_type="audios",
    parse=llm.parse_speech_request,
    unary=_speech,
    open_stream=llm.SpeechStream,
)
VIDEOS: Final = MediaApi(
    label="videos",
    model_type="videos",
    parse=llm.parse_video_request,
    unary=llm.video_response,
    open_stream=llm.VideoEventStream,
)
VIDEOS_MJPEG: Final = MediaApi(
    label="videos",
    model_type="videos",
    parse=llm.parse_video_stream_request,
    unary=llm.video_response,
    open_stream=llm.MjpegStream,
)


def api_for_path(path: str) -> TextApi:
    """The API whose error shape answers a request for ``path`` that no view did:
    Anthropic's on its route, OpenAI's everywhere else."""
    return ANTHROPIC_MESSAGES if path == "/v1/messages" else CHAT


def edge_error_body(path: str, status: int, message: str, code: str | None = None) -> bytes:
    """The frontend's :data:`~dynamo_trio.edge.ErrorBody`: what the HTTP edge answers
    itself (refusals, timeouts) in the shape of ``path``'s API."""
    return json_bytes(api_for_path(path).error_body(status, message, code=code))
