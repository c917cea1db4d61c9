"""``dynamo-trio frontend`` (``python -m dynamo_trio.frontend``): one frontend process,
or ``--http-workers N`` of them under a supervisor.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio
from hypercorn.config import Config as HypercornConfig

from .._config import Config, add_flags, config_from_args
from .._gc import tune_memory
from .._hostport import host_port
from .._signals import shut_down_on_signals
from .._startup import run_command
from ..edge import Edge, listen_sockets, serve_http, status_routes
from ..runtime import DistributedRuntime
from ..runtime._runtime import configure_logging
from ._app import serve_frontend
from ._workers import (
    WORKER_INDEX_ENV,
    WORKERS_DIR_ENV,
    WorkerView,
    holding_shared,
    run_frontend_workers,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

_log = logging.getLogger("dynamo_trio.frontend")


def main(argv: Sequence[str] | None = None) -> None:
    """``dynamo-trio frontend [flags]``."""
    parser = argparse.ArgumentParser(
        prog="dynamo-trio frontend", description="The OpenAI-compatible HTTP frontend."
    )
    add_flags(parser)
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        config = config_from_args(parser.parse_args(argv))
    except ValueError as exc:  # an invalid DYN_* value or combination of settings
        parser.error(str(exc))
    configure_logging(config.log_level)
    index = os.environ.get(WORKER_INDEX_ENV)
    workers = config.frontend.http_workers
    if index is not None or workers == 1:  # a process that serves: what it imported stays
        tune_memory(config.gc_threshold)
    if index is not None:  # one of --http-workers' processes
        view = WorkerView(int(index), workers, Path(os.environ[WORKERS_DIR_ENV]))
        with holding_shared(view.shared):
            run_command(parser.prog, partial(run_frontend, config, view=view))
    elif workers > 1:
        run_command(parser.prog, run_workers, config, argv)
    else:
        run_command(parser.prog, run_frontend, config)


async def run_frontend(
    config: Config,
    *,
    view: WorkerView | None = None,
    on_listening: Callable[[str], object] | None = None,
) -> None:
    """Serve the frontend until SIGINT/SIGTERM, then drain and return; ``view``: this
    process is one of ``--http-workers``' (:mod:`._workers`)."""
    stop = trio.Event()
    async with DistributedRuntime(config) as runtime, trio.open_nursery() as nursery:
        nursery.start_soon(shut_down_on_signals, stop.set)
        async with trio.open_nursery() as serving:
            frontend = config.frontend
            sockets = listen_sockets(
                [host_port(frontend.host, frontend.port)], reuse_port=view is not None
            )
            shared: dict[str, Any] = {}
            # The private socket outlives the drain: siblings list this process's
            # requests in their /debug/requests until its last one has ended.
            drained = trio.Event()
            if view is not None:
                await serving.start(_serve_private, view, runtime, drained)
                nursery.start_soon(view.stop_when_orphaned, stop)
                inflight = partial(view.inflight, runtime.inflight)
                shared = {"metrics": view.metrics, "inflight": inflight}

            async def serve(*, task_status: trio.TaskStatus[str]) -> None:
                try:
                    await serve_frontend(
                        runtime,
                        frontend,
                        shutdown_trigger=stop.wait,
                        shutdown_grace=config.worker.shutdown_grace,
                        sockets=sockets,
                        on_grpc_listening=grpc.append,
                        task_status=task_status,
                        **shared,
                    )
                finally:
                    drained.set()

            grpc: list[str] = []
            url: str = await serving.start(serve)
            print(f"dynamo-trio frontend listening on {url}", flush=True)
            for address in grpc:  # after the HTTP line, which scripts read first
                print(f"dynamo-trio kserve grpc listening on {address}", flush=True)
            if on_listening is not None:
                on_listening(url)
        nursery.cancel_scope.cancel()  # served and drained: stop watching for signals
    _log.info("frontend stopped")


async def run_workers(
    config: Config, argv: list[str], on_listening: Callable[[str], object] | None = None
) -> None:
    """``--http-workers N``: supervise N frontend processes started with ``argv``."""
    async with trio.open_nursery() as nursery:
        url: str = await nursery.start(partial(run_frontend_workers, config, argv))
        print(f"dynamo-trio frontend listening on {url}", flush=True)
        if on_listening is not None:
            on_listening(url)


async def _serve_private(
    view: WorkerView,
    runtime: DistributedRuntime,
    drained: trio.Event,
    *,
    task_status: trio.TaskStatus[list[str]],
) -> None:
    """This process's own requests, for its siblings, on a Unix socket only they know."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(view.socket_path)
    sock.setblocking(False)
    config = HypercornConfig()  # (no access log: hypercorn's default)
    config.graceful_timeout = 1.0
    edge = Edge(
        status_routes(
            health=lambda: (200, {"status": "live"}),
            metrics=runtime.registry,
            inflight=runtime.inflight,
        )
    )
    await serve_http(edge, config, drained.wait, sockets=[sock], task_status=task_status)
