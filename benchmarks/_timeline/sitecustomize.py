"""Timestamps for ``vllm_side_by_side.py --timeline``: on the path of every process the
benchmark starts, it records when a Context is killed, when ``AsyncLLM.abort`` is called
and when vLLM's stat logger records 0 running requests, one file per process in
``$DYN_BENCH_TIMELINE``.  Nothing happens without that variable."""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import time
from typing import Any

_DIR = os.environ.get("DYN_BENCH_TIMELINE")


def _mark(what: str) -> None:
    with open(os.path.join(_DIR or ".", str(os.getpid())), "a") as log:
        log.write(f"{time.perf_counter():.6f} {what}\n")


def _patch_context(module: Any) -> None:
    kill = module.Context.kill

    def marked_kill(self: Any, *args: Any, **kwargs: Any) -> Any:
        _mark("kill")
        return kill(self, *args, **kwargs)

    module.Context.kill = marked_kill


def _patch_async_llm(module: Any) -> None:
    abort = module.AsyncLLM.abort

    async def marked_abort(self: Any, *args: Any, **kwargs: Any) -> Any:
        _mark("abort")
        return await abort(self, *args, **kwargs)

    module.AsyncLLM.abort = marked_abort


def _patch_loggers(module: Any) -> None:
    record = module.PrometheusStatLogger.record

    def marked_record(self: Any, scheduler_stats: Any, *args: Any, **kwargs: Any) -> Any:
        if scheduler_stats is not None and scheduler_stats.num_running_reqs == 0:
            _mark("idle")
        return record(self, scheduler_stats, *args, **kwargs)

    module.PrometheusStatLogger.record = marked_record


_PATCHES = {
    "dynamo_trio._context": _patch_context,
    "vllm.v1.engine.async_llm": _patch_async_llm,
    "vllm.v1.metrics.loggers": _patch_loggers,
}


class _Finder(importlib.abc.MetaPathFinder):
    """Patches each module of ``_PATCHES`` right after it is executed."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        patch = _PATCHES.get(name)
        if patch is None:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            execute(module)
            patch(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if _DIR:
    sys.meta_path.insert(0, _Finder())
