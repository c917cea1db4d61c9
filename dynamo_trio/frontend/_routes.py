"""The frontend's API routes, as a table (:data:`ROUTES`), and the views that serve them."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Final

from quart import Response, current_app, request

from .._errors import InvalidRequestId
from .._tracing import (
    TRACEPARENT,
    TRACESTATE,
    X_DYNAMO_REQUEST_ID,
    X_REQUEST_ID,
    RequestIds,
    TraceContext,
    is_valid_request_id,
    request_ids,
)
from ..edge import BodyPrefetch, json_bytes, shown
from ..llm import BinaryBody, RequestError, decode_json_body, model_object
from ._apis import (
    ANTHROPIC_MESSAGES,
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    IMAGE_EDITS,
    IMAGE_GENERATIONS,
    RESPONSES,
    SPEECH,
    VIDEOS,
    VIDEOS_MJPEG,
)
from ._pipeline import JsonReply, StreamReply

if TYPE_CHECKING:
    from ._apis import MediaApi, TextApi
    from ._pipeline import Pipeline

_JSON_TYPES: Final = ("application/json", "application/x-ndjson")
_UTF8: Final = ("utf-8", "utf8")
_SSE_HEADERS: Final = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
REQUEST_TIMEOUT_HEADER: Final = "x-request-timeout"


def json_response(payload: object, status: int = 200, ids: RequestIds | None = None) -> Response:
    """A compact JSON response, with the request's id headers when given."""
    response: Response = current_app.response_class(
        json_bytes(payload), status=status, content_type="application/json"
    )
    if ids is not None:
        response.headers.update(ids.response_headers())
    return response


def reply_ids() -> RequestIds:
    """The ids an error reply carries: the client's if valid (never echo an invalid one)."""
    given = [request.headers.get(name) for name in (X_REQUEST_ID, X_DYNAMO_REQUEST_ID)]
    plain, dynamo = (value if value and is_valid_request_id(value) else None for value in given)
    return request_ids(plain, dynamo)


def _identity() -> tuple[RequestIds, TraceContext]:
    """The request's id (``x-dynamo-request-id``, ``x-request-id``, or a fresh UUID) and
    its trace (a span under the client's ``traceparent``, or a new trace)."""
    headers = request.headers
    try:
        ids = request_ids(headers.get(X_REQUEST_ID), headers.get(X_DYNAMO_REQUEST_ID))
    except InvalidRequestId as exc:
        raise RequestError(400, exc.message, param=exc.header) from None
    trace = TraceContext.continued(
        headers.get(TRACEPARENT), headers.get(TRACESTATE), x_request_id=ids.x_request_id
    )
    return ids, trace


def request_deadline(raw: str | None, max_timeout: float, now: float) -> float | None:
    """The deadline (``now`` plus seconds) an ``x-request-timeout`` of ``raw`` asks for,
    capped by ``max_timeout`` (0: none); 400 unless a positive, finite number."""
    timeout = max_timeout or None
    if raw is not None:
        try:
            asked = float(raw)
        except ValueError:
            asked = math.nan
        if not 0 < asked < math.inf:
            raise RequestError(
                400,
                f"{REQUEST_TIMEOUT_HEADER} must be a positive number of seconds, "
                f"not {shown(raw)!r}.",
                param=REQUEST_TIMEOUT_HEADER,
            )
        timeout = asked if timeout is None else min(asked, timeout)
    return None if timeout is None else now + timeout


def _decode_json(body: bytes, max_depth: int) -> object:
    coding = request.headers.get("Content-Encoding", "").strip().lower()
    content_type = request.mimetype
    charset = request.mimetype_params.get("charset")
    refusal = None
    if coding not in ("", "identity"):
        refusal = (
            f"Content-Encoding {shown(coding)!r} is not accepted: send the body "
            "uncompressed (identity)."
        )
    elif content_type and content_type not in _JSON_TYPES:
        refusal = f"Content-Type must be application/json, not {shown(content_type)!r}."
    elif charset is not None and charset.lower() not in _UTF8:
        refusal = f"A JSON body must be UTF-8, not {shown(charset)!r} (RFC 8259)."
    if refusal is not None:
        raise RequestError(415, refusal, code="unsupported_media_type")
    return decode_json_body(body, max_depth=max_depth)


def _reply(result: JsonReply | BinaryBody | StreamReply, ids: RequestIds) -> Response:
    if isinstance(result, JsonReply):
        return json_response(result.payload, result.status, ids)
    response: Response
    if isinstance(result, BinaryBody):
        response = current_app.response_class(result.content, content_type=result.content_type)
    else:
        response = current_app.response_class(
            result.body, content_type=result.content_type, headers=_SSE_HEADERS
        )
        response.timeout = None
    response.headers.update(ids.response_headers())
    return response


async def generate_view(pipeline: Pipeline, api: TextApi | MediaApi) -> Response:
    """``POST`` to a generating route: read the whole body first (a refusal leaves the
    keep-alive connection reusable), then parse, route, run, answer (JSON, SSE, media)."""
    body = BodyPrefetch.take(request.scope)
    if body is None:
        body = await request.get_data(cache=False, as_text=False, parse_form_data=False)
    else:
        request.body.clear()  # quart-trio's copy, if its reader took one before the view ran
    try:
        ids, trace = _identity()
        deadline = request_deadline(
            request.headers.get(REQUEST_TIMEOUT_HEADER),
            pipeline.config.max_request_timeout,
            time.monotonic(),
        )
        payload = _decode_json(body, pipeline.config.max_json_depth)
        result = await pipeline.serve(api, payload, ids.request_id, trace, deadline=deadline)
        response = _reply(result, ids)
    except RequestError as exc:
        response = json_response(api.request_error_body(exc), exc.status, reply_ids())
    if pipeline.shutting_down:
        response.headers["Connection"] = "close"  # so the client's next request goes elsewhere
    return response


async def models_view(pipeline: Pipeline) -> Response:
    """``GET /v1/models``: every model with a live instance."""
    data = [model_object(name, created=created) for name, created in pipeline.models.models()]
    return json_response({"object": "list", "data": data})


API_ROUTES: Final = (
    ("/v1/chat/completions", "chat_completions", CHAT),
    ("/v1/completions", "completions", COMPLETIONS),
    ("/v1/responses", "responses", RESPONSES),
    ("/v1/messages", "anthropic_messages", ANTHROPIC_MESSAGES),
    ("/v1/embeddings", "embeddings", EMBEDDINGS),
    ("/v1/images/generations", "images_generations", IMAGE_GENERATIONS),
    ("/v1/images/edits", "images_edits", IMAGE_EDITS),
    ("/v1/audio/speech", "audio_speech", SPEECH),
    ("/v1/videos", "videos", VIDEOS),
    ("/v1/videos/stream", "videos_stream", VIDEOS_MJPEG),
)
"""The generating routes, ``(path, endpoint name, API)``, each a ``POST``, registered in
this order (then ``GET /v1/models``)."""
