"""Label names and label values, spelled exactly as Dynamo spells them.

Metric names are spelled whole where each family is made (``_frontend``, ``_worker``),
so ``grep`` for a name seen on a dashboard finds it; counters keep their ``_total``.
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
