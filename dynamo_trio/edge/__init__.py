"""The HTTP edge every HTTP server of dynamo-trio stands on: :func:`serve_http` (or
:func:`serve_stream`: one connection on any stream), :class:`Edge` (the outermost ASGI layer),
:func:`status_routes`, and two short ways for the hot path: :func:`direct_chunks` and
:class:`BodyPrefetch`.
"""

from ._chunks import direct_chunks
from ._edge import (
    LAST_SEND_SHIELD,
    Edge,
    EdgeRequest,
    EdgeResponse,
    ErrorBody,
    Route,
    answer_lifespan,
    body_timeout_message,
    error_json,
    json_bytes,
    shown,
)
from ._prefetch import PREFETCHED_BODY, BodyPrefetch
from ._server import (
    CONNECTION_GONE,
    ConnectionGone,
    connection_gone,
    dead_peer_options,
    listen_sockets,
    serve_http,
    serve_stream,
)
from ._status import Health, InflightListing, MetricsSource, status_routes

__all__ = [
    "CONNECTION_GONE",
    "LAST_SEND_SHIELD",
    "PREFETCHED_BODY",
    "BodyPrefetch",
    "ConnectionGone",
    "Edge",
    "EdgeRequest",
    "EdgeResponse",
    "ErrorBody",
    "Health",
    "InflightListing",
    "MetricsSource",
    "Route",
    "answer_lifespan",
    "body_timeout_message",
    "connection_gone",
    "dead_peer_options",
    "direct_chunks",
    "error_json",
    "json_bytes",
    "listen_sockets",
    "serve_http",
    "serve_stream",
    "shown",
    "status_routes",
]
