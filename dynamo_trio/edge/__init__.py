"""The HTTP edge every HTTP server of dynamo-trio stands on: :func:`serve_http` (or
:func:`serve_stream`: one connection on any stream), :class:`Edge` (the outermost ASGI layer),
:func:`status_routes`, and two short ways for the hot path: :func:`direct_chunks` and
:class:`BodyPrefetch`.
"""

from ._chunks import direct_chunks as direct_chunks
from ._edge import (
    LAST_SEND_SHIELD as LAST_SEND_SHIELD,
    Edge as Edge,
    EdgeRequest as EdgeRequest,
    EdgeResponse as EdgeResponse,
    ErrorBody as ErrorBody,
    Route as Route,
    answer_lifespan as answer_lifespan,
    body_timeout_message as body_timeout_message,
    error_json as error_json,
    json_bytes as json_bytes,
    shown as shown,
)
from ._gone import (
    CONNECTION_GONE as CONNECTION_GONE,
    ConnectionGone as ConnectionGone,
    connection_gone as connection_gone,
)
from ._prefetch import PREFETCHED_BODY as PREFETCHED_BODY, BodyPrefetch as BodyPrefetch
from ._server import (
    dead_peer_options as dead_peer_options,
    listen_sockets as listen_sockets,
    serve_http as serve_http,
    serve_stream as serve_stream,
)
from ._status import (
    Health as Health,
    InflightListing as InflightListing,
    MetricsSource as MetricsSource,
    status_routes as status_routes,
)

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
    "error_json",
    "json_bytes",
    "listen_sockets",
    "serve_http",
    "serve_stream",
    "shown",
    "status_routes",
]
