"""``dynamo-trio run``: the quick start, a frontend and N mock workers on one machine.

They meet through file discovery in a temporary directory and run until Ctrl-C; the
workers are ``python -m dynamo_trio.mocker`` processes holding a lifeline to this one.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import subprocess
import sys
import tempfile
from typing import TYPE_CHECKING, Final

import trio

from ._config import Config, add_flags, flag_environment
from ._gc import tune_memory
from ._lifeline import lifeline
from ._signals import killed_on_forced_exit
from ._startup import run_command
from .frontend._main import run_frontend, run_workers
from .mocker._main import MODELS, add_mocker_flags, mocker_argv
from .runtime._runtime import configure_logging

if TYPE_CHECKING:
    from collections.abc import Sequence

_log = logging.getLogger("dynamo_trio.run")

READY_TIMEOUT: Final = 60.0
"""Seconds ``run`` waits for its workers' models to be listed before saying so."""


def main(argv: Sequence[str] | None = None) -> None:
    """``dynamo-trio run [--workers N] [flags]``."""
    parser = argparse.ArgumentParser(
        prog="dynamo-trio run",
        description="A frontend and N mock workers on one machine (embedded file discovery).",
    )
    parser.add_argument("--workers", type=int, default=2, help="mock workers to start")
    add_mocker_flags(parser, named=True)
    add_flags(parser)
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    # The flags reach this process and every child through the environment.
    os.environ.update({"DYN_DISCOVERY_BACKEND": "file", **flag_environment(args)})
    with contextlib.ExitStack() as cleanup:
        if "DYN_FILE_KV" not in os.environ:  # the embedded file discovery's, removed at the end
            kv = tempfile.TemporaryDirectory(prefix="dynamo-trio-kv-", ignore_cleanup_errors=True)
            os.environ["DYN_FILE_KV"] = cleanup.enter_context(kv)
        try:
            config = Config.from_env()
        except ValueError as exc:  # an invalid DYN_* value or combination of settings
            parser.error(str(exc))
        configure_logging(config.log_level)
        kserve = config.frontend.kserve_grpc_port is not None  # the tensor model's only client
        served = [name for name, _, _ in MODELS if kserve or name != "tensor_model_name"]
        worker = [sys.executable, "-m", "dynamo_trio.mocker", *mocker_argv(args, served)]
        tune_memory(config.gc_threshold)  # this process is the frontend (or its supervisor)
        models = {getattr(args, name) for name in served}
        run_command(parser.prog, _run_all, config, worker, args.workers, models)


async def _run_all(config: Config, worker: list[str], workers: int, models: set[str]) -> None:
    async with trio.open_nursery() as nursery:

        def on_listening(url: str) -> None:
            nursery.start_soon(_announce_ready, url, models)

        processes: list[trio.Process] = []
        with contextlib.ExitStack() as lifelines:
            for _ in range(workers):
                options = lifelines.enter_context(lifeline(dict(os.environ)))
                processes.append(
                    await trio.lowlevel.open_process(worker, stdin=subprocess.DEVNULL, **options)
                )
            _log.info(
                "started %d mock worker(s); file discovery in %s",
                workers,
                os.environ["DYN_FILE_KV"],
            )
            try:
                with killed_on_forced_exit(processes):
                    if config.frontend.http_workers > 1:  # --http-workers N: N processes
                        await run_workers(config, [], on_listening)
                    else:
                        await run_frontend(config, on_listening=on_listening)
            finally:
                with trio.CancelScope(shield=True):
                    await _stop_workers(processes, config.worker.shutdown_grace + 2)
        nursery.cancel_scope.cancel()


async def _announce_ready(url: str, models: set[str]) -> None:
    """Print ``dynamo-trio ready: ...`` once the frontend at ``url`` lists ``models`` (the
    workers register after it listens), or warn after :data:`READY_TIMEOUT` seconds."""
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=5.0) as http:
        with trio.move_on_after(READY_TIMEOUT):
            while True:
                listed: set[str] = set()
                with contextlib.suppress(httpx.HTTPError, ValueError, LookupError, TypeError):
                    reply = (await http.get("/v1/models")).json()
                    listed = {model["id"] for model in reply["data"]}
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
        process.terminate()  # (one that has exited is not signalled)
    with trio.move_on_after(grace):
        for process in processes:
            await process.wait()
    for process in processes:
        process.kill()
        await process.wait()
