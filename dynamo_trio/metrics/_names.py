"""Metric names, label names and label values, spelled exactly as Dynamo spells them.

Names are whole (prefix joined), so ``grep`` for a name seen on a dashboard finds it;
*dynamo-trio* marks what Dynamo does not measure.  Counters keep their ``_total``.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

# --- label names (``labels``; the frontend ones are literals in http/service/metrics.rs) ------

LABEL_NAMESPACE: Final = "dynamo_namespace"
LABEL_COMPONENT: Final = "dynamo_component"
LABEL_ENDPOINT: Final = "dynamo_endpoint"
LABEL_ERROR_TYPE: Final = "error_type"
LABEL_MODEL: Final = "model"
LABEL_REQUEST_TYPE: Final = "request_type"
LABEL_STATUS: Final = "status"
LABEL_REASON: Final = "reason"
"""dynamo-trio: the :class:`~dynamo_trio.CancelReason` value of a cancellation."""
LABEL_WORKER_ID: Final = "worker_id"
"""The worker's instance id in hex (Dynamo's ``labels::WORKER_ID``, its ``connection_id``)."""

# The frontend's ``endpoint`` label is not Dynamo's ``dynamo_endpoint``: it names the API route.
LABEL_FRONTEND_ENDPOINT: Final = "endpoint"
LABEL_MIGRATION_TYPE: Final = "migration_type"
"""Of ``model_migration_total`` (``http/service/metrics.rs``)."""

# --- worker (``work_handler``, prefixed with ``dynamo_component``) ----------------------------

COMPONENT_REQUESTS_TOTAL: Final = "dynamo_component_requests_total"
COMPONENT_INFLIGHT_REQUESTS: Final = "dynamo_component_inflight_requests"
COMPONENT_REQUEST_DURATION_SECONDS: Final = "dynamo_component_request_duration_seconds"
COMPONENT_ERRORS_TOTAL: Final = "dynamo_component_errors_total"
COMPONENT_CANCELLATION_TOTAL: Final = "dynamo_component_cancellation_total"
COMPONENT_CANCELLED_REQUESTS_TOTAL: Final = "dynamo_component_cancelled_requests_total"
"""dynamo-trio: ``cancellation_total`` split by ``reason`` (same count, one more label)."""
COMPONENT_CANCELLATION_LATENCY_SECONDS: Final = "dynamo_component_cancellation_latency_seconds"
"""dynamo-trio: from the cancel signal reaching the worker to the handler's work having ended."""
COMPONENT_CANCELLING_REQUESTS: Final = "dynamo_component_cancelling_requests"
"""dynamo-trio: requests told to cancel whose work has not ended yet (a stuck one stays up)."""

# --- frontend (``frontend_service``, prefixed with ``dynamo_frontend``) -----------------------

FRONTEND_REQUESTS_TOTAL: Final = "dynamo_frontend_requests_total"
FRONTEND_INFLIGHT_REQUESTS: Final = "dynamo_frontend_inflight_requests"
FRONTEND_REQUEST_DURATION_SECONDS: Final = "dynamo_frontend_request_duration_seconds"
FRONTEND_TIME_TO_FIRST_TOKEN_SECONDS: Final = "dynamo_frontend_time_to_first_token_seconds"
FRONTEND_INTER_TOKEN_LATENCY_SECONDS: Final = "dynamo_frontend_inter_token_latency_seconds"
FRONTEND_OUTPUT_TOKENS_TOTAL: Final = "dynamo_frontend_output_tokens_total"
FRONTEND_MODEL_CANCELLATION_TOTAL: Final = "dynamo_frontend_model_cancellation_total"
FRONTEND_MODEL_MIGRATION_TOTAL: Final = "dynamo_frontend_model_migration_total"
"""Labels ``model``, ``migration_type``; dynamo-trio adds ``reason``."""
FRONTEND_DISCONNECTED_CLIENTS: Final = "dynamo_frontend_disconnected_clients"
"""A gauge that only goes up, as in Dynamo (``prometheus_names.rs``: "not ``_total``")."""
FRONTEND_CANCELLED_REQUESTS_TOTAL: Final = "dynamo_frontend_cancelled_requests_total"
"""dynamo-trio: ``model_cancellation_total`` split by ``reason``."""
FRONTEND_CANCELLATION_LATENCY_SECONDS: Final = "dynamo_frontend_cancellation_latency_seconds"
"""dynamo-trio: from the frontend noticing the cancellation to the request having ended."""

# --- label values -----------------------------------------------------------------------------

FrontendEndpoint = Literal[
    "completions",
    "chat_completions",
    "embeddings",
    "images",
    "videos",
    "audios",
    "responses",
    "anthropic_messages",
    "tensor",
]
"""Values of the frontend ``endpoint`` label (Dynamo's ``Endpoint::as_str``)."""
FRONTEND_ENDPOINTS: Final[frozenset[str]] = frozenset(get_args(FrontendEndpoint))

MigrationType = Literal["new_request", "ongoing_request"]
"""Dynamo's ``migration_type``: moved before its first item, or mid-stream."""
MIGRATION_TYPES: Final[frozenset[str]] = frozenset(get_args(MigrationType))

RequestType = Literal["unary", "stream"]
REQUEST_TYPES: Final[frozenset[str]] = frozenset(get_args(RequestType))

FrontendStatus = Literal["success", "error"]
"""Dynamo has two statuses; a cancelled request is ``error`` with ``error_type="cancelled"``."""
STATUS_SUCCESS: Final = "success"
STATUS_ERROR: Final = "error"

# ``frontend_service::error_type`` and ``work_handler::error_types`` (the ones used here).
ERROR_TYPE_NONE: Final = ""
"""A successful frontend request carries ``error_type=""``, as in Dynamo."""
ERROR_TYPE_CANCELLED: Final = "cancelled"
ERROR_TYPE_INTERNAL: Final = "internal"
ERROR_TYPE_GENERATE: Final = "generate"
"""The worker's error type for a handler that raised."""

UNKNOWN_REASON: Final = "unknown"
"""The ``reason`` of a cancellation that was counted without being announced by ``cancelled()``."""
