"""dynamo-trio: a trio-native request-cancellation runtime for distributed LLM serving.

The public surface is re-exported here; everything under a ``_`` name is private.
"""

from ._config import (
    Config as Config,
    DiscoveryConfig as DiscoveryConfig,
    FrontendConfig as FrontendConfig,
    RequestPlaneConfig as RequestPlaneConfig,
    SystemConfig as SystemConfig,
    WorkerConfig as WorkerConfig,
)
from ._context import (
    CancelReason as CancelReason,
    Context as Context,
    ContextMetadata as ContextMetadata,
    ContextState as ContextState,
)
from ._errors import (
    Cancelled as Cancelled,
    CannotConnect as CannotConnect,
    ConnectionTimeout as ConnectionTimeout,
    Disconnected as Disconnected,
    DynamoError as DynamoError,
    EngineShutdown as EngineShutdown,
    InvalidArgument as InvalidArgument,
    InvalidRequestId as InvalidRequestId,
    NoInstances as NoInstances,
    ProtocolError as ProtocolError,
    ResourceExhausted as ResourceExhausted,
    ResponseTimeout as ResponseTimeout,
    StreamIncomplete as StreamIncomplete,
    TransportError as TransportError,
    Unknown as Unknown,
)
from ._logcontext import RequestLogFilter as RequestLogFilter
from ._tracing import TraceContext as TraceContext
from .runtime import (
    Annotated as Annotated,
    Client as Client,
    Component as Component,
    DataStream as DataStream,
    DistributedRuntime as DistributedRuntime,
    Endpoint as Endpoint,
    Namespace as Namespace,
    ResponseStream as ResponseStream,
    configure_dynamo_logging as configure_dynamo_logging,
    dynamo_worker as dynamo_worker,
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
