"""The one process harness of the tests: children started with ``sys.executable``, their
stdout JSON lines collected as events, and the stacks built from them (a model
worker and ``python -m dynamo_trio.frontend``), a test's own or one a whole module
shares (:func:`shared_stack`; other programs: :func:`shared_processes`).  Tests whose
point is not processes use :mod:`tests._serving` instead.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import trio

from tests._metrics import scrape
from tests._serving import MODELS, first_event, wait_for_models

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence

ROOT = Path(__file__).parents[1]
MODEL_WORKER = ROOT / "tests" / "e2e" / "_model_worker.py"


class _Child(Protocol):
    """A child process, started in a trio loop or outside any (:class:`SharedStack`)."""

    @property
    def returncode(self) -> int | None: ...


class Output:
    """What a child process writes, as it comes: its stdout JSON lines as events, its stderr."""

    def __init__(self, child: _Child, name: str) -> None:
        self._child = child
        self.name = name
        self.events: list[dict[str, Any]] = []
        self.stdout_lines: list[str] = []
        self.stderr = bytearray()
        self.stdout_closed = False
        self._changed = trio.Event()

    async def read_stdout(self, stream: trio.abc.ReceiveStream) -> None:
        buffer = b""
        async for chunk in stream:
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

    async def read_stderr(self, stream: trio.abc.ReceiveStream) -> None:
        async for chunk in stream:
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
                        f"{self.name} exited ({self._child.returncode}) before {event!r}:\n"
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


class Proc(Output):
    """A child process of the test's trio loop, its stdout JSON lines collected as events."""

    def __init__(self, process: trio.Process, name: str) -> None:
        super().__init__(process, name)
        self.process = process

    async def _read_stdout(self) -> None:
        assert self.process.stdout is not None
        await self.read_stdout(self.process.stdout)

    async def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        await self.read_stderr(self.process.stderr)

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


async def frontend_url(frontend: Output, *, within: float = 15) -> str:
    """The URL a frontend process (or ``run``, or a supervisor) says it listens on."""
    with trio.fail_after(within):
        while not any("listening on" in line for line in frontend.stdout_lines):
            if frontend.stdout_closed:
                raise AssertionError(frontend.stderr.decode(errors="replace")[-3000:])
            await frontend._changed.wait()
    line = next(line for line in frontend.stdout_lines if "listening on" in line)
    return line.rsplit(" ", 1)[1]


def model_worker_argv(inter_token_latency_ms: float, ttft_ms: float = 0.0) -> tuple[str, ...]:
    """``tests/e2e/_model_worker.py``'s command line, after the interpreter."""
    latency = ("--inter-token-latency-ms", str(inter_token_latency_ms))
    return (str(MODEL_WORKER), *latency, "--ttft-ms", str(ttft_ms))


def frontend_argv(*flags: str) -> tuple[str, ...]:
    """``python -m dynamo_trio.frontend --http-port 0 *flags``, after the interpreter."""
    return ("-m", "dynamo_trio.frontend", "--http-port", "0", *flags)


async def start_model_worker(
    spawn: Callable[..., Any],
    env: dict[str, str],
    *,
    name: str = "model worker",
    inter_token_latency_ms: float = 20.0,
    ttft_ms: float = 0.0,
) -> tuple[Proc, dict[str, Any]]:
    """A model worker (``tests/e2e/_model_worker.py``), once it has registered."""
    argv = model_worker_argv(inter_token_latency_ms, ttft_ms)
    worker = await spawn(*argv, env=env, name=name)
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
    env = {**env, **(frontend_env or {})}
    frontend = await spawn(*frontend_argv(*flags), env=env, name="frontend")
    return frontend, await listing(frontend, models)


async def listing(frontend: Output, models: frozenset[str] | set[str]) -> str:
    """The URL of a frontend process, once it lists ``models``."""
    url = await frontend_url(frontend, within=60)  # a supervisor's processes start first
    await wait_for_models(url, models, within=20)
    return url


class Served:
    """A frontend and a model worker, seen through their output and their metrics."""

    def __init__(self, frontend: Output, worker: Output, url: str, worker_status: str) -> None:
        self.frontend = frontend
        self.worker = worker
        self.url = url
        self.worker_status = worker_status

    async def metric(self, name: str, *, worker: bool = False, **labels: str) -> float:
        """Sum of the samples of ``name`` (matching ``labels``) on the frontend or worker."""
        return await scrape(self.worker_status if worker else self.url, name, **labels)


class Stack(Served):
    """A frontend process and a model-worker process, as a user would run them."""

    frontend: Proc
    worker: Proc

    def __init__(self, frontend: Proc, worker: Proc, url: str, worker_status: str) -> None:
        super().__init__(frontend, worker, url, worker_status)


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


class _FileTail(trio.abc.ReceiveStream):
    """A file a child started outside trio writes, read from ``offset``: the stream ends once
    the child has exited and everything it wrote is read."""

    def __init__(self, path: Path, offset: int, child: subprocess.Popen[bytes]) -> None:
        self._file = path.open("rb", buffering=0)
        self._file.seek(offset)
        self._child = child

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        while True:
            exited = self._child.poll() is not None
            chunk = self._file.read(max_bytes or 65536)
            if chunk or exited:
                return chunk
            await trio.sleep(0.01)  # a regular file is always readable: nothing to wait on

    async def aclose(self) -> None:
        self._file.close()
        await trio.lowlevel.checkpoint()


class SharedProcesses:
    """Processes that a whole test module shares.  pytest-trio runs each test in a trio
    loop of its own, so they are started outside any (:func:`shared_processes`), their
    output goes to files, and each test reads those in its own loop (:meth:`follow`)."""

    def __init__(
        self, logs: Path, children: dict[str, subprocess.Popen[bytes]], env: dict[str, str]
    ) -> None:
        self._logs = logs
        self._children = children
        self.env = env
        """Their environment: a test's own children and runtime use it to reach them."""

    def log(self, name: str) -> Path:
        """The stderr of the process called ``name``, all of it so far."""
        return self._logs / f"{name}.err"

    def follow(self, nursery: trio.Nursery, *, from_start: bool = False) -> dict[str, Output]:
        """Each process's output by name, read in ``nursery`` from its start or from the
        last whole line written so far."""
        outputs = {}
        for name, child in self._children.items():
            output = Output(child, name)
            for suffix, read in (("out", output.read_stdout), ("err", output.read_stderr)):
                path = self._logs / f"{name}.{suffix}"
                offset = 0 if from_start else path.read_bytes().rfind(b"\n") + 1
                nursery.start_soon(_read_to_end, read, _FileTail(path, offset, child))
            outputs[name] = output
        return outputs

    def returncode(self, name: str) -> int | None:
        """The exit status of the process called ``name``; ``None`` while it runs."""
        return self._children[name].poll()

    def terminate(self, name: str) -> int:
        """SIGTERM the process called ``name``; its exit status once it has exited."""
        child = self._children[name]
        child.send_signal(signal.SIGTERM)
        return child.wait(timeout=15)  # a hang guard only


class SharedStack:
    """A frontend process and a model-worker process that a whole test module shares
    (:func:`shared_stack`), read in each test's own trio loop (:meth:`served`)."""

    def __init__(self, processes: SharedProcesses) -> None:
        self._processes = processes
        self.url = ""
        self.worker_status = ""
        """The worker's status URL, if it reports one (the model worker's ``ready``)."""

    @property
    def frontend_log(self) -> Path:
        """The frontend's stderr, all of it so far."""
        return self._processes.log("frontend")

    def _follow(self, nursery: trio.Nursery, *, from_start: bool) -> tuple[Output, Output]:
        outputs = self._processes.follow(nursery, from_start=from_start)
        return outputs["frontend"], outputs["model-worker"]

    async def _started(self, models: frozenset[str] | set[str], reports_ready: bool) -> None:
        async with trio.open_nursery() as nursery:
            frontend, worker = self._follow(nursery, from_start=True)
            self.url = await listing(frontend, models)
            if reports_ready:
                self.worker_status = (await worker.wait_for("ready", within=15))["status_url"]
            nursery.cancel_scope.cancel()

    async def served(self, nursery: trio.Nursery) -> Served:
        """The stack seen from the calling test's trio loop (its output from here on, read
        in ``nursery``), once no request is in flight on it: whatever an earlier test left
        has ended, and its counts are in."""
        frontend, worker = self._follow(nursery, from_start=False)
        inflight = [(self.url, "dynamo_frontend_inflight_requests")]
        if self.worker_status:
            inflight.append((self.worker_status, "dynamo_component_inflight_requests"))
        await until_idle(*inflight)  # the frontend's first: the worker's come from it
        return Served(frontend, worker, self.url, self.worker_status)


async def until_idle(*inflight: tuple[str, str]) -> None:
    """Wait until each ``(url, gauge)`` of requests in flight reads 0, in turn: whatever was
    sent before has ended, and its counts are in (polled: they are other processes)."""
    with trio.fail_after(30):  # a hang guard only
        for url, gauge in inflight:
            while await scrape(url, gauge) != 0:  # noqa: ASYNC110 - polls other processes
                await trio.sleep(0.02)


async def _read_to_end(
    read: Callable[[trio.abc.ReceiveStream], Awaitable[None]], stream: trio.abc.ReceiveStream
) -> None:
    async with stream:
        await read(stream)


@contextmanager
def shared_processes(
    tmp_path: Path,
    programs: Mapping[str, Sequence[str]],
    *,
    overrides: dict[str, str] | None = None,
) -> Iterator[SharedProcesses]:
    """``programs`` (each an argv after the interpreter, by name) for a whole test module,
    started at once outside any trio loop, their output in files under ``tmp_path``;
    killed and reaped at the end.  ``overrides`` go over :func:`e2e_environment`'s settings."""
    env = e2e_environment(tmp_path, **(overrides or {}))
    logs = tmp_path / "logs"
    logs.mkdir()
    children: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, argv in programs.items():
            with (logs / f"{name}.out").open("wb") as out, (logs / f"{name}.err").open("wb") as err:
                children[name] = subprocess.Popen(
                    [sys.executable, *argv],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    env=env,
                    cwd=ROOT,
                )
        yield SharedProcesses(logs, children, env)
    finally:
        for child in children.values():
            child.kill()
        for child in children.values():
            child.wait()


@contextmanager
def shared_stack(
    tmp_path: Path,
    *frontend_flags: str,
    inter_token_latency_ms: float = 20.0,
    worker: Sequence[str] | None = None,
    models: frozenset[str] | set[str] = MODELS,
    overrides: dict[str, str] | None = None,
    sigterm_frontend: bool = False,
) -> Iterator[SharedStack]:
    """:func:`start_stack`'s processes for a whole test module (:func:`shared_processes`).

    ``worker`` is another worker's argv (after the interpreter), one serving ``models``
    (a worker other than the model worker reports no status URL).  With
    ``sigterm_frontend`` the frontend gets a SIGTERM first at the end, and must exit 0.
    """
    programs = {
        "model-worker": worker or model_worker_argv(inter_token_latency_ms),
        "frontend": frontend_argv(*frontend_flags),
    }
    with shared_processes(tmp_path, programs, overrides=overrides) as processes:
        shared = SharedStack(processes)
        trio.run(shared._started, models, worker is None)
        yield shared
        if sigterm_frontend:
            code = processes.terminate("frontend")
            assert code == 0, shared.frontend_log.read_text(errors="replace")[-4000:]
