"""Real processes over real sockets: the fixtures of :mod:`tests._procs`, the one
process harness (its names are re-exported for the packages that import them from here)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from dynamo_trio import Config
from tests._metrics import scrape as scrape
from tests._procs import (
    MODEL_WORKER as MODEL_WORKER,
    ROOT as ROOT,
    Proc as Proc,
    Stack as Stack,
    e2e_environment as e2e_environment,
    spawner,
    start_stack,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    import trio

PROCS = Path(__file__).with_name("_procs.py")


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return e2e_environment(tmp_path)


@pytest.fixture
def config(env: dict[str, str]) -> Config:
    """This test process's own runtime settings, matching its children's."""
    return Config.from_env(env)


@pytest.fixture
async def spawn(nursery: trio.Nursery) -> AsyncIterator[Callable[..., Any]]:
    """``await spawn(*argv, env=...)`` starts a child; every child is killed at the end."""
    async with spawner(nursery) as start:
        yield start


async def start_worker(
    spawn: Callable[..., Any], env: dict[str, str]
) -> tuple[Proc, dict[str, Any]]:
    """``tests/e2e/_procs.py worker``, once it has registered."""
    worker = await spawn(str(PROCS), "worker", env=env, name="worker")
    ready = await worker.wait_for("ready")
    return worker, ready


@pytest.fixture
async def stack(spawn: Callable[..., Any], env: dict[str, str]) -> Callable[..., Any]:
    """``await stack(*frontend_flags)`` starts a worker and a frontend and waits for the models."""

    async def start(*frontend_flags: str, inter_token_latency_ms: float = 20.0) -> Stack:
        return await start_stack(
            spawn, env, *frontend_flags, inter_token_latency_ms=inter_token_latency_ms
        )

    return start
