"""The LLM wire shapes: the engine protocol and the three HTTP APIs, sans-IO.

Layout (each module has one job; nothing here does I/O):

- ``_protocol``: the engine protocol between frontend and workers (requests,
  output items, validation on both ends);
- ``_generation``: folding engine output items into text, finish reason, usage;
- ``_sampling``: the sampling options every text API maps onto;
- ``_validate``: reading JSON fields with 400 errors that name the parameter;
- ``_errors``: :class:`RequestError` and the OpenAI / Anthropic error bodies;
- ``_json``: decoding request bodies (strict, depth-limited, 400s that say why);
- ``_limits``: a model's token limits and the errors for requests over them;
- ``_openai``: chat completions, completions and models;
- ``_embeddings``: embeddings;
- ``_images``, ``_speech``, ``_videos``: images, audio speech and videos (``_media``:
  what they share);
- ``_responses``: the Responses API;
- ``_anthropic``: the Anthropic Messages API;
- ``_sse``: server-sent event encoding;
- ``_stops``: stop-sequence matching for engines.
"""

from ._anthropic import (
    MessagesRequest as MessagesRequest,
    MessagesStream as MessagesStream,
    anthropic_stop_reason as anthropic_stop_reason,
    message_object as message_object,
    parse_messages_request as parse_messages_request,
)
from ._embeddings import (
    EmbeddingRequest as EmbeddingRequest,
    embedding_response as embedding_response,
    encode_base64_floats as encode_base64_floats,
    parse_embedding_request as parse_embedding_request,
)
from ._errors import (
    MAX_ERROR_MESSAGE as MAX_ERROR_MESSAGE,
    RequestError as RequestError,
    anthropic_error_body as anthropic_error_body,
    anthropic_error_type as anthropic_error_type,
    bounded_message as bounded_message,
    openai_error_body as openai_error_body,
    openai_error_type as openai_error_type,
    reason_phrase as reason_phrase,
    status_for_error as status_for_error,
)
from ._generation import Generation as Generation
from ._images import (
    ImageRequest as ImageRequest,
    image_response as image_response,
    parse_image_edit_request as parse_image_edit_request,
    parse_image_request as parse_image_request,
)
from ._json import INTEGER_RANGE as INTEGER_RANGE, decode_json_body as decode_json_body
from ._limits import (
    CONTEXT_LENGTH_EXCEEDED as CONTEXT_LENGTH_EXCEEDED,
    ContextLengthExceeded as ContextLengthExceeded,
    TokenLimits as TokenLimits,
    check_output_tokens as check_output_tokens,
    context_length_error as context_length_error,
)
from ._media import BinaryBody as BinaryBody
from ._openai import (
    ChatCompletionStream as ChatCompletionStream,
    ChatRequest as ChatRequest,
    CompletionRequest as CompletionRequest,
    CompletionStream as CompletionStream,
    chat_completion as chat_completion,
    completion as completion,
    model_list as model_list,
    model_object as model_object,
    openai_finish_reason as openai_finish_reason,
    openai_usage as openai_usage,
    parse_chat_request as parse_chat_request,
    parse_completion_request as parse_completion_request,
)
from ._protocol import (
    Continuation as Continuation,
    EmbedOutput as EmbedOutput,
    EmbedRequest as EmbedRequest,
    EmbedUsage as EmbedUsage,
    EngineError as EngineError,
    EngineMessage as EngineMessage,
    FinishReason as FinishReason,
    GenerateOutput as GenerateOutput,
    GenerateRequest as GenerateRequest,
    Usage as Usage,
    parse_embed_output as parse_embed_output,
    parse_generate_output as parse_generate_output,
    validate_embed_request as validate_embed_request,
    validate_generate_request as validate_generate_request,
)
from ._responses import (
    ResponsesRequest as ResponsesRequest,
    ResponseStream as ResponseStream,
    parse_responses_request as parse_responses_request,
    response_object as response_object,
    responses_usage as responses_usage,
)
from ._sampling import SamplingParams as SamplingParams
from ._speech import (
    AUDIO_TYPES as AUDIO_TYPES,
    SpeechRequest as SpeechRequest,
    SpeechStream as SpeechStream,
    parse_speech_request as parse_speech_request,
    speech_body as speech_body,
)
from ._sse import (
    DONE as DONE,
    encode_comment as encode_comment,
    encode_error_event as encode_error_event,
    encode_event as encode_event,
    keepalive_comment as keepalive_comment,
)
from ._stops import StopMatcher as StopMatcher
from ._videos import (
    MJPEG_TYPE as MJPEG_TYPE,
    MjpegStream as MjpegStream,
    VideoEventStream as VideoEventStream,
    VideoRequest as VideoRequest,
    mjpeg_part as mjpeg_part,
    parse_video_request as parse_video_request,
    parse_video_stream_request as parse_video_stream_request,
    video_response as video_response,
)

__all__ = [
    "ImageRequest",
    "image_response",
    "parse_image_edit_request",
    "parse_image_request",
    "BinaryBody",
    "AUDIO_TYPES",
    "SpeechRequest",
    "SpeechStream",
    "parse_speech_request",
    "speech_body",
    "MJPEG_TYPE",
    "MjpegStream",
    "VideoEventStream",
    "VideoRequest",
    "mjpeg_part",
    "parse_video_request",
    "parse_video_stream_request",
    "video_response",
    "CONTEXT_LENGTH_EXCEEDED",
    "DONE",
    "INTEGER_RANGE",
    "MAX_ERROR_MESSAGE",
    "ChatCompletionStream",
    "ChatRequest",
    "CompletionRequest",
    "CompletionStream",
    "ContextLengthExceeded",
    "Continuation",
    "EmbedOutput",
    "EmbedRequest",
    "EmbedUsage",
    "EmbeddingRequest",
    "EngineError",
    "EngineMessage",
    "FinishReason",
    "GenerateOutput",
    "GenerateRequest",
    "Generation",
    "MessagesRequest",
    "MessagesStream",
    "RequestError",
    "ResponseStream",
    "ResponsesRequest",
    "SamplingParams",
    "StopMatcher",
    "TokenLimits",
    "Usage",
    "anthropic_error_body",
    "anthropic_error_type",
    "bounded_message",
    "anthropic_stop_reason",
    "chat_completion",
    "check_output_tokens",
    "completion",
    "context_length_error",
    "decode_json_body",
    "embedding_response",
    "encode_base64_floats",
    "encode_comment",
    "encode_error_event",
    "encode_event",
    "keepalive_comment",
    "message_object",
    "model_list",
    "model_object",
    "openai_error_body",
    "openai_error_type",
    "openai_finish_reason",
    "openai_usage",
    "parse_chat_request",
    "parse_completion_request",
    "parse_embed_output",
    "parse_embedding_request",
    "parse_generate_output",
    "parse_messages_request",
    "parse_responses_request",
    "reason_phrase",
    "response_object",
    "responses_usage",
    "status_for_error",
    "validate_embed_request",
    "validate_generate_request",
]
