"""The KServe v2 gRPC frontend: tensor models behind ``inference.GRPCInferenceService``.

``--kserve-grpc-port`` on ``dynamo-trio frontend`` (or ``run``) serves it beside HTTP, in
the same process and over the same model registry, metrics and drain: :func:`serve_kserve`.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING

import trio
from hypercorn.config import Config as HypercornConfig

from .._hostport import host_port
from ..edge import listen_sockets, serve_http
from ._server import KServeApp

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from ..frontend import Pipeline

__all__ = ["KServeApp", "serve_kserve"]


async def serve_kserve(
    pipeline: Pipeline,
    shutdown_trigger: Callable[[], Awaitable[None]],
    *,
    flush_grace: float,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve gRPC on the frontend's host and ``kserve_grpc_port`` until
    ``shutdown_trigger`` returns (the frontend's drain is over), then give the
    connections ``flush_grace`` seconds.  Reports the bound ``http://host:port``
    addresses through ``task_status``.
    """
    config = pipeline.config
    if config.kserve_grpc_port is None:
        raise ValueError("the frontend's config has no kserve_grpc_port")
    sockets = listen_sockets([host_port(config.host, config.kserve_grpc_port)])
    hypercorn = HypercornConfig()
    hypercorn.accesslog = None
    hypercorn.errorlog = logging.getLogger("dynamo_trio.kserve.http")
    hypercorn.graceful_timeout = flush_grace
    hypercorn.keep_alive_timeout = config.idle_timeout
    # A gRPC channel is one long-lived connection: hypercorn's cap on the requests of
    # a connection (1000) would end it with a GOAWAY under a client's calls.
    hypercorn.keep_alive_max_requests = sys.maxsize
    hypercorn.h2_max_header_list_size = config.max_header_size
    app = KServeApp(pipeline, max_message_size=config.max_body_size)
    await serve_http(
        app,
        hypercorn,
        shutdown_trigger,
        sockets=sockets,
        dead_peer_timeout=config.dead_client_timeout,
        cleartext_http2=True,  # gRPC is HTTP/2 with prior knowledge
        http2_max_resets=config.http2_max_resets,
        task_status=task_status,
    )
