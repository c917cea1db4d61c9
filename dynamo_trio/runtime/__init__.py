"""The distributed runtime: serving endpoints, calling them, and the response streams between."""

from ._client import Annotated, Client, DataStream, ResponseStream
from ._router import Router, Target
from ._runtime import (
    Component,
    DistributedRuntime,
    Endpoint,
    Namespace,
    Transport,
    configure_dynamo_logging,
    dynamo_worker,
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
