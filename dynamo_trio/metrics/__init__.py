"""Prometheus metrics with Dynamo's exact names, counted once per request, and the status server.

Nothing here is global: each process builds one
:class:`prometheus_client.CollectorRegistry`, one :class:`WorkerMetrics` and/or
:class:`FrontendMetrics` on it, and passes them down.  Per request, a tracker
(:class:`RequestTracker`, :class:`FrontendRequestTracker`) records a
cancellation at most once and the end exactly once, so no code path can count
twice.  :func:`serve_status` exposes a worker's registry, health and in-flight
requests over HTTP.
"""

from ._frontend import (
    FrontendMetrics as FrontendMetrics,
    FrontendRequestTracker as FrontendRequestTracker,
)
from ._names import (
    FrontendEndpoint as FrontendEndpoint,
    FrontendStatus as FrontendStatus,
    RequestType as RequestType,
)
from ._status import (
    HealthCheck as HealthCheck,
    InflightListing as InflightListing,
    StatusReport as StatusReport,
    serve_status as serve_status,
)
from ._worker import (
    EndpointMetrics as EndpointMetrics,
    RequestTracker as RequestTracker,
    WorkerMetrics as WorkerMetrics,
    WorkerOutcome as WorkerOutcome,
)

__all__ = [
    "EndpointMetrics",
    "FrontendEndpoint",
    "FrontendMetrics",
    "FrontendRequestTracker",
    "FrontendStatus",
    "HealthCheck",
    "InflightListing",
    "RequestTracker",
    "RequestType",
    "StatusReport",
    "WorkerMetrics",
    "WorkerOutcome",
    "serve_status",
]
