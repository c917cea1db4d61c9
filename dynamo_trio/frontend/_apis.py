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
    from ..metrics import FrontendEndpoint


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
        self, status: int, message: str, cause: BaseException | None = None
    ) -> dict[str, object]:
        """The API's JSON error body; a worker's refusal that names its parameter keeps
        its ``code`` and ``param``."""
        if self.prompt_param is not None and isinstance(cause, DynamoError):
            refined = llm.context_length_error(cause, param=self.prompt_param)
            if refined is not None:
                return self.request_error_body(refined)
        if self.anthropic:
            return llm.anthropic_error_body(status, message)
        return llm.openai_error_body(status, message)


def _data_events(events: list[dict[str, object]]) -> bytes:
    return b"".join(llm.encode_event(event) for event in events)


def _typed_events(events: list[dict[str, object]]) -> bytes:
    return b"".join(llm.encode_event(event, event=str(event["type"])) for event in events)


def _openai_items(stream: Any, items: list[object]) -> bytes:
    return stream.feed_sse(items)  # type: ignore[no-any-return]


def _typed_items(stream: Any, items: list[object]) -> bytes:
    return _typed_events([event for item in items for event in stream.feed(item)])


def _openai_failure(stream: Any, status: int, message: str) -> bytes:
    return b"".join(llm.encode_error_event(body) for body in stream.fail(message, status=status))


def _responses_failure(stream: Any, status: int, message: str) -> bytes:
    code = "invalid_request" if status == 400 else "server_error"
    return _typed_events(stream.fail(message, code=code))


def _anthropic_failure(stream: Any, status: int, message: str) -> bytes:
    return _typed_events(stream.fail(message, status=status))


@dataclass(frozen=True, kw_only=True)
class TextApi(Api):
    """One text-generating route (its defaults are OpenAI's SSE)."""

    unary: Callable[[Any, str, llm.Generation], dict[str, object]]
    open_stream: Callable[[Any, str], Any]
    encode: Callable[[list[dict[str, object]]], bytes] = _data_events
    """SSE bytes for a batch of events."""
    encode_items: Callable[[Any, list[object]], bytes] = _openai_items
    """SSE bytes for a batch of engine items fed to the stream: ``(stream, items)``."""
    fail_stream: Callable[[Any, int, str], bytes] = _openai_failure
    """SSE bytes that end a failed stream: ``(stream, status, message)``."""
    done: bytes = llm.DONE
    """What ends a successful stream after its events (OpenAI's ``[DONE]``)."""


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
    encode=_typed_events,
    encode_items=_typed_items,
    fail_stream=_responses_failure,
    done=b"",
)

ANTHROPIC_MESSAGES: Final = TextApi(
    label="anthropic_messages",
    model_type="chat",
    prompt_param="messages",
    anthropic=True,
    parse=llm.parse_messages_request,
    unary=llm.message_object,
    open_stream=llm.MessagesStream,
    encode=_typed_events,
    encode_items=_typed_items,
    fail_stream=_anthropic_failure,
    done=b"",
)


class MediaStream(Protocol):
    """A streamed media body (SSE, MJPEG, audio): the bytes for each worker item."""

    @property
    def content_type(self) -> str: ...
    @property
    def keepalive(self) -> bool:
        """Whether silences may be filled with SSE keep-alive comments."""
        ...

    def feed(self, item: object) -> bytes: ...
    def finish(self) -> bytes: ...
    def fail(self, status: int, message: str) -> bytes:
        """What ends the body after a failure once it has started (may be nothing)."""
        ...


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

_ANTHROPIC_PATH: Final = "/v1/messages"


def api_for_path(path: str) -> TextApi:
    """The API whose error shape answers a request for ``path`` that no view did:
    Anthropic's on its route, OpenAI's everywhere else."""
    return ANTHROPIC_MESSAGES if path == _ANTHROPIC_PATH else CHAT


def edge_error_body(path: str, status: int, message: str, code: str | None = None) -> bytes:
    """The frontend's :data:`~dynamo_trio.edge.ErrorBody`: what the HTTP edge answers
    itself (refusals, timeouts) in the shape of ``path``'s API."""
    if api_for_path(path).anthropic:
        return json_bytes(llm.anthropic_error_body(status, message))
    return json_bytes(llm.openai_error_body(status, message, code=code))
