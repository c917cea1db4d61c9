"""The ``dynamo-trio`` command: ``frontend``, ``mocker``, ``run``, and the engine workers.

``dynamo-trio run`` is the quick start: a frontend and N mock workers on one
machine, finding each other through the embedded file discovery (no server to
install), until Ctrl-C.  ``frontend`` and ``mocker`` run one process each, the
way a deployment across machines runs them (with ``DYN_DISCOVERY_BACKEND=etcd``
and ``ETCD_ENDPOINTS``).

Flags override the ``DYN_*`` environment, which overrides the defaults.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import trio

from ._config import Config
from ._gc import tune_gc
from ._lifeline import lifeline
from ._malloc import give_back_large_buffers
from ._signals import killed_on_forced_exit, shut_down_on_signals
from .engines._commands import transformers_main, vllm_main
from .mocker import MockerSettings
from .mocker._worker import serve_mocker
from .runtime import DistributedRuntime
from .runtime._runtime import configure_logging, dynamo_worker

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from .frontend._workers import WorkerView

# The frontend's modules (quart-trio, flask, hypercorn: ~0.25 s of CPU to import)
# are imported by the frontend's functions below, not here: a mock worker
# started from this module never loads them.

__all__ = ["frontend_main", "main", "mocker_main"]

_log = logging.getLogger("dynamo_trio.cli")


# ---------------------------------------------------------------------------- flags


def _discovery_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--discovery-backend",
        choices=["file", "etcd", "mem"],
        help="where processes find each other (DYN_DISCOVERY_BACKEND; default file)",
    )
    parser.add_argument(
        "--namespace", help="the namespace to serve (DYN_NAMESPACE; default dynamo)"
    )


def _frontend_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--http-host", help="address to bind (DYN_HTTP_HOST; default 127.0.0.1)")
    parser.add_argument("--http-port", type=int, help="port to bind (DYN_HTTP_PORT; default 8000)")
    parser.add_argument(
        "--on-disconnect",
        choices=["kill", "stop"],
        help="what a client hang-up does to its request (DYN_ON_DISCONNECT; default kill)",
    )
    parser.add_argument(
        "--stop-grace",
        type=float,
        help="with --on-disconnect stop: seconds to drain before the kill (default 5)",
    )
    parser.add_argument(
        "--sse-keepalive",
        type=float,
        help="seconds of SSE silence before a keep-alive comment, 0 for none (default 15)",
    )
    parser.add_argument(
        "--router-mode",
        choices=["round-robin", "random"],
        help="how requests spread over a model's instances (DYN_ROUTER_MODE)",
    )
    parser.add_argument(
        "--http-workers",
        type=int,
        help="frontend processes serving the port (DYN_HTTP_WORKERS; default 1): raise it, "
        "up to the core count, when the frontend process is the bottleneck",
    )
    parser.add_argument(
        "--stream-writes-per-pass",
        type=_non_negative_int,
        help="running SSE streams that may write per scheduler pass; the rest wait for a "
        "later pass, while a new stream's first write never waits "
        "(DYN_HTTP_STREAM_WRITES_PER_PASS; default 2; 0: no limit)",
    )
    parser.add_argument(
        "--migration-limit",
        type=_non_negative_int,
        help="times a request may move to another worker when its own is lost mid-stream "
        "(DYN_MIGRATION_LIMIT; default 0: a lost worker fails its requests)",
    )
    parser.add_argument(
        "--backend-stream-timeout",
        type=float,
        help="seconds a worker may send nothing before its request fails with 504 "
        "(DYN_HTTP_BACKEND_STREAM_TIMEOUT_SECS; default 0: no bound)",
    )
    parser.add_argument(
        "--max-request-timeout",
        type=float,
        help="the longest deadline a request may have (x-request-timeout is cut to it; "
        "DYN_HTTP_MAX_REQUEST_TIMEOUT_SECS; default 0: none)",
    )
    parser.add_argument(
        "--dead-client-timeout",
        type=float,
        help="seconds within which a client whose network went silent is found out and its "
        "request killed (DYN_HTTP_DEAD_CLIENT_SECS; default 10; 0 turns it off)",
    )
    parser.add_argument(
        "--kserve-grpc-port",
        type=int,
        help="also serve tensor models over KServe v2 gRPC on this port, beside HTTP "
        "(DYN_KSERVE_GRPC_PORT; default: no gRPC server; 0: any free port)",
    )


def _mocker_flags(parser: argparse.ArgumentParser, *, names: bool = True) -> None:
    if names:
        parser.add_argument("--model-name", help="the chat/completions model to serve")
        parser.add_argument("--embedding-model-name", help="an embeddings model to serve")
        parser.add_argument(
            "--tensor-model-name", help="a tensor model to serve (OUTPUT0 = INPUT0; KServe gRPC)"
        )
        _media_names(parser, default=False)
    defaults = MockerSettings()
    parser.add_argument("--ttft-ms", type=float, default=defaults.ttft_ms)
    parser.add_argument(
        "--inter-token-latency-ms", type=float, default=defaults.inter_token_latency_ms
    )
    parser.add_argument("--default-max-tokens", type=int, default=defaults.default_max_tokens)
    parser.add_argument("--embedding-dimensions", type=int, default=defaults.embedding_dimensions)
    parser.add_argument(
        "--context-length",
        type=int,
        default=defaults.context_length,
        help=f"the model's context window in tokens (default {defaults.context_length})",
    )
    parser.add_argument(
        "--max-output-tokens",
        type=int,
        default=defaults.max_output_tokens,
        help=f"the most tokens one request may generate (default {defaults.max_output_tokens})",
    )
    parser.add_argument(
        "--media-step-ms",
        type=float,
        default=defaults.media_step_ms,
        help="time of a denoising step, a video frame or a speech chunk of the media models "
        f"(default {defaults.media_step_ms:g})",
    )
    parser.add_argument(
        "--denoising-steps",
        type=int,
        default=defaults.denoising_steps,
        help="an image's denoising steps when the request names none "
        f"(default {defaults.denoising_steps})",
    )


_MEDIA_MODELS: Final = (
    ("--image-model-name", "mock-image", "an images model to serve (PNG or JPEG pictures)"),
    ("--video-model-name", "mock-video", "a videos model to serve (JPEG frames)"),
    ("--speech-model-name", "mock-speech", "an audio speech model to serve (a WAV or PCM tone)"),
)


def _media_names(parser: argparse.ArgumentParser, *, default: bool) -> None:
    for flag, name, help_text in _MEDIA_MODELS:
        parser.add_argument(flag, default=name if default else None, help=help_text)


def _config(args: argparse.Namespace) -> Config:
    """The environment's config with the given flags applied over it."""
    config = Config.from_env()
    discovery = config.discovery
    if getattr(args, "discovery_backend", None):
        discovery = dataclasses.replace(discovery, backend=args.discovery_backend)
    frontend = config.frontend
    overrides = {
        "host": getattr(args, "http_host", None),
        "port": getattr(args, "http_port", None),
        "namespace": getattr(args, "namespace", None),
        "on_disconnect": getattr(args, "on_disconnect", None),
        "stop_grace": getattr(args, "stop_grace", None),
        "keepalive_interval": getattr(args, "sse_keepalive", None),
        "router_mode": getattr(args, "router_mode", None),
        "http_workers": getattr(args, "http_workers", None),
        "migration_limit": getattr(args, "migration_limit", None),
        "stream_writes_per_pass": getattr(args, "stream_writes_per_pass", None),
        "backend_stream_timeout": getattr(args, "backend_stream_timeout", None),
        "max_request_timeout": getattr(args, "max_request_timeout", None),
        "dead_client_timeout": getattr(args, "dead_client_timeout", None),
        "kserve_grpc_port": getattr(args, "kserve_grpc_port", None),
    }
    frontend = dataclasses.replace(
        frontend, **{key: value for key, value in overrides.items() if value is not None}
    )
    gc_threshold = getattr(args, "gc_threshold", None)
    if gc_threshold is None:
        gc_threshold = config.gc_threshold
    return config.replace(discovery=discovery, frontend=frontend, gc_threshold=gc_threshold)


def _gc_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--gc-threshold",
        type=_non_negative_int,
        help="this process's youngest-generation GC threshold; it also freezes its "
        "startup heap (DYN_GC_THRESHOLD; default 10000; 0: Python's own settings)",
    )


def _non_negative_int(raw: str) -> int:
    value = int(raw)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


def _settings(args: argparse.Namespace) -> MockerSettings:
    return MockerSettings(
        ttft_ms=args.ttft_ms,
        inter_token_latency_ms=args.inter_token_latency_ms,
        default_max_tokens=args.default_max_tokens,
        embedding_dimensions=args.embedding_dimensions,
        context_length=args.context_length,
        max_output_tokens=args.max_output_tokens,
        media_step_ms=args.media_step_ms,
        denoising_steps=args.denoising_steps,
    )


# ---------------------------------------------------------------------------- frontend


async def run_frontend(
    config: Config,
    *,
    stop: trio.Event | None = None,
    view: WorkerView | None = None,
    on_listening: Callable[[str], object] | None = None,
) -> None:
    """Serve the frontend until SIGINT/SIGTERM (or ``stop``), then drain and return.

    ``view``: this process is one of ``--http-workers``' (see
    :mod:`dynamo_trio.frontend._workers`): it shares the port, answers its own
    requests on a private socket, and serves the view of all of them.
    ``on_listening`` is called with the URL once it listens.
    """
    from .edge import listen_sockets
    from .frontend import serve_frontend

    if stop is None:
        stop = trio.Event()
    async with DistributedRuntime(config) as runtime, trio.open_nursery() as nursery:
        nursery.start_soon(shut_down_on_signals, stop.set)
        async with trio.open_nursery() as serving:
            frontend = config.frontend
            host = f"[{frontend.host}]" if ":" in frontend.host else frontend.host
            sockets = listen_sockets([f"{host}:{frontend.port}"], reuse_port=view is not None)
            shared: dict[str, Any] = {}
            # The private socket outlives the drain: siblings list this process's
            # requests in their /debug/requests until its last one has ended.
            drained = trio.Event()
            if view is not None:
                await serving.start(_serve_private, view, runtime, drained)
                nursery.start_soon(view.stop_when_orphaned, stop)

                async def inflight() -> list[dict[str, Any]]:
                    return await view.inflight(runtime.inflight())

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


async def _serve_private(
    view: WorkerView,
    runtime: DistributedRuntime,
    drained: trio.Event,
    *,
    task_status: trio.TaskStatus[list[str]],
) -> None:
    """This process's own requests, for its siblings, on a Unix socket only they know."""
    from hypercorn.config import Config as HypercornConfig

    from .edge import Edge, serve_http, status_routes

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(view.socket_path)
    sock.setblocking(False)
    config = HypercornConfig()
    config.accesslog = None
    config.graceful_timeout = 1.0
    edge = Edge(
        status_routes(
            health=lambda: (200, {"status": "live"}),
            metrics=runtime.registry,
            inflight=runtime.inflight,
        )
    )
    await serve_http(edge, config, drained.wait, sockets=[sock], task_status=task_status)


def frontend_main(argv: Sequence[str] | None = None) -> None:
    """``python -m dynamo_trio.frontend`` / ``dynamo-trio frontend``."""
    parser = argparse.ArgumentParser(
        prog="dynamo-trio frontend", description="The OpenAI-compatible HTTP frontend."
    )
    _discovery_flags(parser)
    _frontend_flags(parser)
    _gc_flag(parser)
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        config = _config(parser.parse_args(argv))
    except ValueError as exc:  # an invalid DYN_* value or flag combination
        parser.error(str(exc))
    configure_logging(config.log_level)
    from .frontend._workers import (  # before tune_gc: the frontend's modules are frozen too
        SUPERVISOR_ENV,
        WORKER_INDEX_ENV,
        WORKERS_DIR_ENV,
        WorkerView,
        holding_shared,
    )

    index = os.environ.get(WORKER_INDEX_ENV)
    if index is not None or config.frontend.http_workers == 1:  # a process that serves
        # Everything imported is here for good: frozen, and out of every collection.
        tune_gc(config.gc_threshold)
        give_back_large_buffers()  # request bodies of many MiB are not kept once freed
    if index is not None:  # one of --http-workers' processes
        supervisor = os.environ.get(SUPERVISOR_ENV)
        view = WorkerView(
            int(index),
            config.frontend.http_workers,
            Path(os.environ[WORKERS_DIR_ENV]),
            int(supervisor) if supervisor else None,
        )
        with holding_shared(view.shared):
            trio.run(partial(run_frontend, config, view=view))
    elif config.frontend.http_workers > 1:
        trio.run(_run_workers, config, argv)
    else:
        trio.run(run_frontend, config)


async def _run_workers(
    config: Config, argv: list[str], on_listening: Callable[[str], object] | None = None
) -> None:
    from .frontend._workers import run_frontend_workers

    async with trio.open_nursery() as nursery:
        url: str = await nursery.start(partial(run_frontend_workers, config, argv))
        print(f"dynamo-trio frontend listening on {url}", flush=True)
        if on_listening is not None:
            on_listening(url)


# ---------------------------------------------------------------------------- mocker


def mocker_main(argv: Sequence[str] | None = None) -> None:
    """``python -m dynamo_trio.mocker`` / ``dynamo-trio mocker``."""
    parser = argparse.ArgumentParser(
        prog="dynamo-trio mocker",
        description="A mock LLM worker: deterministic tokens at a configurable rate.",
    )
    _discovery_flags(parser)
    parser.add_argument("--component", default="mocker", help="the component to serve")
    _mocker_flags(parser)
    _gc_flag(parser)
    args = parser.parse_args(argv)
    kinds = ("", "embedding_", "tensor_", "image_", "video_", "speech_")
    if not any(getattr(args, f"{kind}model_name") for kind in kinds):
        parser.error(
            "give --model-name, --embedding-model-name, --tensor-model-name, "
            "--image-model-name, --video-model-name or --speech-model-name"
        )
    config = _config(args)
    settings = _settings(args)
    tune_gc(config.gc_threshold)
    give_back_large_buffers()

    @dynamo_worker(config)
    async def worker(runtime: DistributedRuntime) -> None:
        await serve_mocker(
            runtime,
            settings,
            model_name=args.model_name,
            embedding_model_name=args.embedding_model_name,
            tensor_model_name=args.tensor_model_name,
            image_model_name=args.image_model_name,
            video_model_name=args.video_model_name,
            speech_model_name=args.speech_model_name,
            namespace=config.frontend.namespace,
            component=args.component,
        )

    trio.run(worker)


# ---------------------------------------------------------------------------- run


def run_main(argv: Sequence[str] | None = None) -> None:
    """``dynamo-trio run``: a frontend and N mock workers on this machine."""
    parser = argparse.ArgumentParser(
        prog="dynamo-trio run",
        description="A frontend and N mock workers on one machine (embedded file discovery).",
    )
    parser.add_argument("--workers", type=int, default=2, help="mock workers to start")
    parser.add_argument("--model-name", default="mock-model")
    parser.add_argument("--embedding-model-name", default="mock-embedding")
    parser.add_argument(
        "--tensor-model-name",
        default="mock-tensor",
        help="the tensor model served with --kserve-grpc-port",
    )
    _media_names(parser, default=True)
    _frontend_flags(parser)
    _gc_flag(parser)
    parser.add_argument("--namespace", help="the namespace to serve (default dynamo)")
    _mocker_flags(parser, names=False)
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    env = dict(os.environ)
    env["DYN_DISCOVERY_BACKEND"] = "file"
    own_kv = "DYN_FILE_KV" not in env  # ours to remove on the way out
    if own_kv:
        env["DYN_FILE_KV"] = tempfile.mkdtemp(prefix="dynamo-trio-kv-")
    os.environ.update(env)
    try:
        config = _config(args)
    except ValueError as exc:  # an invalid DYN_* value or flag combination
        if own_kv:
            shutil.rmtree(env["DYN_FILE_KV"], ignore_errors=True)
        parser.error(str(exc))
    configure_logging(config.log_level)
    worker_argv = [
        sys.executable,
        "-m",
        "dynamo_trio.mocker",
        "--model-name",
        args.model_name,
        "--embedding-model-name",
        args.embedding_model_name,
        "--namespace",
        config.frontend.namespace,
        "--ttft-ms",
        str(args.ttft_ms),
        "--inter-token-latency-ms",
        str(args.inter_token_latency_ms),
        "--default-max-tokens",
        str(args.default_max_tokens),
        "--embedding-dimensions",
        str(args.embedding_dimensions),
        "--context-length",
        str(args.context_length),
        "--max-output-tokens",
        str(args.max_output_tokens),
        "--media-step-ms",
        str(args.media_step_ms),
        "--denoising-steps",
        str(args.denoising_steps),
        "--image-model-name",
        args.image_model_name,
        "--video-model-name",
        args.video_model_name,
        "--speech-model-name",
        args.speech_model_name,
        "--gc-threshold",
        str(config.gc_threshold),
    ]
    models = {
        args.model_name,
        args.embedding_model_name,
        args.image_model_name,
        args.video_model_name,
        args.speech_model_name,
    }
    if config.frontend.kserve_grpc_port is not None:
        worker_argv += ["--tensor-model-name", args.tensor_model_name]
        models.add(args.tensor_model_name)
    from .frontend import _workers  # noqa: F401 (loaded before tune_gc freezes it all)

    tune_gc(config.gc_threshold)  # this process is the frontend (or its supervisor)
    give_back_large_buffers()
    try:
        trio.run(_run_all, config, worker_argv, args.workers, env, _frontend_argv(args), models)
    finally:
        if own_kv:
            shutil.rmtree(env["DYN_FILE_KV"], ignore_errors=True)


def _frontend_argv(args: argparse.Namespace) -> list[str]:
    """The frontend flags set in ``args``, as a frontend process's command line."""
    parser = argparse.ArgumentParser(add_help=False)
    _discovery_flags(parser)
    _frontend_flags(parser)
    _gc_flag(parser)
    argv: list[str] = []
    for action in parser._actions:
        value = getattr(args, action.dest, None)
        if action.option_strings and value is not None:
            argv += [action.option_strings[0], str(value)]
    return argv


async def _run_all(
    config: Config,
    worker_argv: list[str],
    workers: int,
    env: dict[str, str],
    frontend_argv: list[str],
    models: set[str],
) -> None:
    async with trio.open_nursery() as nursery:

        def on_listening(url: str) -> None:
            nursery.start_soon(_announce_ready, url, models)

        processes: list[trio.Process] = []
        # Each worker holds a lifeline to this process: if it dies without
        # stopping them (SIGKILL), they shut down on their own.
        with contextlib.ExitStack() as lifelines:
            for _ in range(workers):
                process = await trio.lowlevel.open_process(
                    worker_argv, stdin=subprocess.DEVNULL, **lifelines.enter_context(lifeline(env))
                )
                processes.append(process)
            _log.info(
                "started %d mock worker(s); file discovery in %s", workers, env["DYN_FILE_KV"]
            )
            try:
                with killed_on_forced_exit(processes):
                    if config.frontend.http_workers > 1:  # --http-workers N: N processes
                        await _run_workers(config, frontend_argv, on_listening)
                    else:
                        await run_frontend(config, on_listening=on_listening)
            finally:
                with trio.CancelScope(shield=True):
                    await _stop_workers(processes, config.worker.shutdown_grace + 2)
        nursery.cancel_scope.cancel()


READY_TIMEOUT: Final = 60.0
"""Seconds ``run`` waits for its workers' models to be listed before saying so."""


async def _announce_ready(url: str, models: set[str]) -> None:
    """Print ``dynamo-trio ready: ...`` once the frontend at ``url`` lists ``models``
    (the mock workers register a moment after the frontend listens; until then a
    request for them is a 404), or warn after :data:`READY_TIMEOUT` seconds."""
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=5.0) as http:
        with trio.move_on_after(READY_TIMEOUT):
            while True:
                try:
                    listed = {
                        model["id"] for model in (await http.get("/v1/models")).json()["data"]
                    }
                except (httpx.HTTPError, ValueError, LookupError, TypeError):
                    listed = set()
                if models <= listed:
                    print(f"dynamo-trio ready: {', '.join(sorted(models))} at {url}", flush=True)
                    return
                await trio.sleep(0.1)
    _log.warning(
        "the workers' models (%s) are not listed after %.0f s: see their log lines above",
        ", ".join(sorted(models)),
        READY_TIMEOUT,
    )


async def _stop_workers(processes: list[trio.Process], grace: float) -> None:
    for process in processes:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
    with trio.move_on_after(grace):
        for process in processes:
            await process.wait()
    for process in processes:
        if process.returncode is None:
            process.kill()
            await process.wait()


# ---------------------------------------------------------------------------- dispatch


def main(argv: Sequence[str] | None = None) -> None:
    """The ``dynamo-trio`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    commands: dict[str, Any] = {
        "frontend": frontend_main,
        "mocker": mocker_main,
        "run": run_main,
        "transformers": transformers_main,
        "vllm": vllm_main,
    }
    if not argv or argv[0] not in commands:
        print(
            "usage: dynamo-trio {frontend,mocker,run,transformers,vllm} [options]\n\n"
            "  run           a frontend and N mock workers on this machine (the quick start)\n"
            "  frontend      the OpenAI-compatible HTTP frontend\n"
            "  mocker        a mock LLM worker\n"
            "  transformers  a worker serving a Hugging Face transformers checkpoint\n"
            "  vllm          a worker serving a checkpoint with vLLM\n\n"
            "`dynamo-trio COMMAND --help` for a command's options.",
            file=sys.stderr if argv and argv[0] not in ("-h", "--help") else sys.stdout,
        )
        raise SystemExit(0 if argv and argv[0] in ("-h", "--help") else 2)
    commands[argv[0]](argv[1:])


if __name__ == "__main__":
    main()
