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
    NoInstances as NoInstances,
    ProtocolError as ProtocolError,
    ResourceExhausted as ResourceExhausted,
    ResponseTimeout as ResponseTimeout,
    StreamIncomplete as StreamIncomplete,
    TransportError as TransportError,
    Unknown as Unknown,
)
from .runtime import (
    Annotated as Annotated,
    Client as Client,
    Component as Component,
    DistributedRuntime as DistributedRuntime,
    Endpoint as Endpoint,
    Namespace as Namespace,
    ResponseStream as ResponseStream,
    dynamo_worker as dynamo_worker,
)

__version__ = "0.1.0"

__all__ = [
    "Annotated",
    "CancelReason",
    "CannotConnect",
    "Cancelled",
    "Client",
    "Component",
    "Config",
    "ConnectionTimeout",
    "Context",
    "ContextState",
    "Disconnected",
    "DiscoveryConfig",
    "DistributedRuntime",
    "DynamoError",
    "Endpoint",
    "EngineShutdown",
    "FrontendConfig",
    "InvalidArgument",
    "Namespace",
    "NoInstances",
    "ProtocolError",
    "RequestPlaneConfig",
    "ResourceExhausted",
    "ResponseStream",
    "ResponseTimeout",
    "StreamIncomplete",
    "SystemConfig",
    "TransportError",
    "Unknown",
    "WorkerConfig",
    "dynamo_worker",
]
