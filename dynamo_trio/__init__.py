"""dynamo-trio: a trio-native request-cancellation runtime for distributed LLM serving.

The public surface is re-exported here; everything under a ``_`` name is private.
"""

from ._config import (
    Config,
    DiscoveryConfig,
    FrontendConfig,
    RequestPlaneConfig,
    SystemConfig,
    WorkerConfig,
)
from ._context import CancelReason, Context, ContextMetadata, ContextState
from ._errors import (
    Cancelled,
    CannotConnect,
    ConnectionTimeout,
    Disconnected,
    DynamoError,
    EngineShutdown,
    InvalidArgument,
    InvalidRequestId,
    NoInstances,
    ProtocolError,
    ResourceExhausted,
    ResponseTimeout,
    StreamIncomplete,
    TransportError,
    Unknown,
)
from ._logcontext import RequestLogFilter
from ._tracing import TraceContext
from .runtime import (
    Annotated,
    Client,
    Component,
    DataStream,
    DistributedRuntime,
    Endpoint,
    Namespace,
    ResponseStream,
    configure_dynamo_logging,
    dynamo_worker,
)

__version__ = "0.1.0"

__all__ = [
    "Annotated",
    "CancelReason",
    "Cancelled",
    "CannotConnect",
    "Client",
    "Component",
    "Config",
    "ConnectionTimeout",
    "Context",
    "ContextMetadata",
    "ContextState",
    "DataStream",
    "Disconnected",
    "DiscoveryConfig",
    "DistributedRuntime",
    "DynamoError",
    "Endpoint",
    "EngineShutdown",
    "FrontendConfig",
    "InvalidArgument",
    "InvalidRequestId",
    "Namespace",
    "NoInstances",
    "ProtocolError",
    "RequestLogFilter",
    "RequestPlaneConfig",
    "ResourceExhausted",
    "ResponseStream",
    "ResponseTimeout",
    "StreamIncomplete",
    "SystemConfig",
    "TraceContext",
    "TransportError",
    "Unknown",
    "WorkerConfig",
    "configure_dynamo_logging",
    "dynamo_worker",
]
