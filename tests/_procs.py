"""The one process harness of the tests: children started with ``sys.executable``, their
stdout JSON lines collected as events, and the stacks built from them (a model
worker and ``python -m dynamo_trio.frontend``).  Tests whose point is not
processes use :mod:`tests._serving` instead.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from tests._metrics import scrape
from tests._serving import MODELS, first_event, wait_for_models

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

ROOT = Path(__file__).parents[1]
MODEL_WORKER = ROOT / "tests" / "e2e" / "_model_worker.py"


class Proc:
    """A child process whose stdout JSON lines are collected as events."""

    def __init__(self, process: trio.Process, name: str) -> None:
        self.process = process
        self.name = name
        self.events: list[dict[str, Any]] = []
        self.stdout_lines: list[str] = []
        self.stderr = bytearray()
        self.stdout_closed = False
        self._changed = trio.Event()

    async def _read_stdout(self) -> None:
        assert self.process.stdout is not None
        buffer = b""
        async for chunk in self.process.stdout:
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for raw in lines:
                line = raw.decode(errors="replace")
                self.stdout_lines.append(line)
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if isinstance(event, dict):
                    self.events.append(event)
            self._notify()
        self.stdout_closed = True
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        async for chunk in self.process.stderr:
            self.stderr += chunk
            self._notify()

    async def wait_for(self, event: str, *, within: float = 10.0, **fields: Any) -> dict[str, Any]:
        """The first event named ``event`` whose fields match, waiting up to ``within`` s."""
        with trio.fail_after(within):
            while True:
                found = first_event(self.events, event, fields)
                if found is not None:
                    return found
                if self.stdout_closed:
                    raise AssertionError(
                        f"{self.name} exited ({self.process.returncode}) before {event!r}:\n"
                        f"{self.stderr.decode(errors='replace')[-3000:]}"
                    )
                await self._changed.wait()

    async def changed(self) -> None:
        """Wait until it writes something more (on stdout or stderr), or exits."""
        await self._changed.wait()

    async def wait_for_log(self, text: str, *, within: float = 10.0) -> None:
        """Wait up to ``within`` s for ``text`` to appear on the process's stderr."""
        with trio.fail_after(within):
            while text.encode() not in self.stderr:
                await self._changed.wait()

    def signal(self, signum: int) -> None:
        if self.process.returncode is None:
            self.process.send_signal(signum)

    async def wait_exit(self, within: float = 10.0) -> int:
        with trio.fail_after(within):
            return await self.process.wait()


def e2e_environment(tmp_path: Path, **overrides: str) -> dict[str, str]:
    """The environment of a test's children: test-speed DYN_* settings, file discovery
    under ``tmp_path``, and their temporary files there too (nothing left in /tmp)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("DYN_")}
    (tmp_path / "children-tmp").mkdir(exist_ok=True)
    env.update(
        TMPDIR=str(tmp_path / "children-tmp"),
        DYN_DISCOVERY_BACKEND="file",
        DYN_FILE_KV=str(tmp_path / "kv"),
        DYN_FILE_KV_POLL_SECS="0.05",
        DYN_LEASE_TTL_SECS="1.5",
        DYN_HEARTBEAT_INTERVAL_SECS="0.2",
        DYN_HEARTBEAT_TIMEOUT_SECS="1",
        DYN_DRAIN_GRACE_SECS="1",
        DYN_SHUTDOWN_GRACE_SECS="2",
        DYN_SYSTEM_PORT="0",
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
    )
    env.update(overrides)
    return env


@asynccontextmanager
async def spawner(nursery: trio.Nursery) -> AsyncIterator[Callable[..., Any]]:
    """``await spawn(*argv, env=...)`` starts a child; every child is killed at the end."""
    procs: list[Proc] = []

    async def start(*argv: str, env: dict[str, str], name: str | None = None) -> Proc:
        process = await trio.lowlevel.open_process(
            [sys.executable, *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=ROOT,
        )
        proc = Proc(process, name or " ".join(argv))
        procs.append(proc)
        nursery.start_soon(proc._read_stdout)
        nursery.start_soon(proc._read_stderr)
        return proc

    try:
        yield start
    finally:
        for proc in procs:
            if proc.process.returncode is None:
                proc.process.send_signal(signal.SIGCONT)
                proc.process.kill()
        with trio.CancelScope(shield=True), trio.move_on_after(5):
            for proc in procs:
                await proc.process.wait()


async def frontend_url(frontend: Proc, *, within: float = 15) -> str:
    """The URL a frontend process (or ``run``, or a supervisor) says it listens on."""
    with trio.fail_after(within):
        while not any("listening on" in line for line in frontend.stdout_lines):
            if frontend.stdout_closed:
                raise AssertionError(frontend.stderr.decode(errors="replace")[-3000:])
            await frontend._changed.wait()
    line = next(line for line in frontend.stdout_lines if "listening on" in line)
    return line.rsplit(" ", 1)[1]


async def start_model_worker(
    spawn: Callable[..., Any],
    env: dict[str, str],
    *,
    name: str = "model worker",
    inter_token_latency_ms: float = 20.0,
    ttft_ms: float = 0.0,
) -> tuple[Proc, dict[str, Any]]:
    """A model worker (``tests/e2e/_model_worker.py``), once it has registered."""
    worker = await spawn(
        str(MODEL_WORKER),
        "--inter-token-latency-ms",
        str(inter_token_latency_ms),
        "--ttft-ms",
        str(ttft_ms),
        env=env,
        name=name,
    )
    ready = await worker.wait_for("ready", within=20)
    return worker, ready


async def start_frontend(
    spawn: Callable[..., Any],
    env: dict[str, str],
    *flags: str,
    frontend_env: dict[str, str] | None = None,
    models: frozenset[str] | set[str] = MODELS,
) -> tuple[Proc, str]:
    """``python -m dynamo_trio.frontend --http-port 0 *flags``, once it lists ``models``."""
    frontend = await spawn(
        "-m",
        "dynamo_trio.frontend",
        "--http-port",
        "0",
        *flags,
        env={**env, **(frontend_env or {})},
        name="frontend",
    )
    url = await frontend_url(frontend, within=60)  # a supervisor's processes start first
    await wait_for_models(url, models, within=20)
    return frontend, url


class Stack:
    """A frontend process and a model-worker process, as a user would run them."""

    def __init__(self, frontend: Proc, worker: Proc, url: str, worker_status: str) -> None:
        self.frontend = frontend
        self.worker = worker
        self.url = url
        self.worker_status = worker_status

    async def metric(self, name: str, *, worker: bool = False, **labels: str) -> float:
        """Sum of the samples of ``name`` (matching ``labels``) on the frontend or worker."""
        return await scrape(self.worker_status if worker else self.url, name, **labels)


async def start_stack(
    spawn: Callable[..., Any],
    env: dict[str, str],
    *frontend_flags: str,
    inter_token_latency_ms: float = 20.0,
    frontend_env: dict[str, str] | None = None,
) -> Stack:
    """A model worker and a frontend started at once; returned once every model is listed."""
    worker = await spawn(
        str(MODEL_WORKER),
        "--inter-token-latency-ms",
        str(inter_token_latency_ms),
        env=env,
        name="model worker",
    )
    frontend, url = await start_frontend(spawn, env, *frontend_flags, frontend_env=frontend_env)
    ready = await worker.wait_for("ready", within=15)
    return Stack(frontend, worker, url, ready["status_url"])
