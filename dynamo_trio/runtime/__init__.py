"""The distributed runtime: serving endpoints, calling them, and the response streams between."""

from ._annotated import Annotated as Annotated
from ._client import Client as Client, DataStream as DataStream, ResponseStream as ResponseStream
from ._router import Router as Router, Target as Target
from ._runtime import (
    Component as Component,
    DistributedRuntime as DistributedRuntime,
    Endpoint as Endpoint,
    Namespace as Namespace,
    Transport as Transport,
    configure_dynamo_logging as configure_dynamo_logging,
    dynamo_worker as dynamo_worker,
)

__all__ = [
    "Annotated",
    "Client",
    "Component",
    "DataStream",
    "DistributedRuntime",
    "Endpoint",
    "Namespace",
    "ResponseStream",
    "Router",
    "Target",
    "Transport",
    "configure_dynamo_logging",
    "dynamo_worker",
]
