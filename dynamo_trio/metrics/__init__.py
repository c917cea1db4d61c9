"""Prometheus metrics with Dynamo's exact names, counted once per request, and the status server.

Nothing here is global: each process builds one registry and its metrics on it
and passes them down; per request, a tracker records a cancellation at most once
and the end exactly once (docs/cancellation.md, "Counting cancellations").
"""

from ._frontend import FrontendMetrics, FrontendRequestTracker
from ._names import FrontendEndpoint, FrontendStatus, RequestType
from ._status import HealthCheck, InflightListing, StatusReport, serve_status
from ._worker import EndpointMetrics, RequestTracker, WorkerMetrics, WorkerOutcome

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
