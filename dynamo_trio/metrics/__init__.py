"""Prometheus metrics with Dynamo's exact names, counted once per request, and the status server.

Nothing here is global: each process builds one registry and its metrics on it
and passes them down; per request, a tracker records a cancellation at most once
and the end exactly once (docs/cancellation.md, "Counting cancellations").
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
