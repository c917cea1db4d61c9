"""``--http-workers N``: one port (``SO_REUSEPORT``), N frontend processes under a
supervisor that restarts them; ``/metrics`` and ``/debug/requests`` cover them all
(docs/operations.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import trio
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from .._hostport import host_port
from .._lifeline import lifeline, parent_gone, take_lifeline
from .._signals import killed_on_forced_exit, shut_down_on_signals
from ..edge import listen_sockets
from ._app import DRAIN_OVERHEAD

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from .._config import Config

_log = logging.getLogger("dynamo_trio.frontend")

WORKER_INDEX_ENV: Final = "DYN_HTTP_WORKER_INDEX"
"""Set by the supervisor: which of its processes this one is (0-based)."""
WORKERS_DIR_ENV: Final = "DYN_HTTP_WORKERS_DIR"
"""Set by the supervisor: the directory its processes share (their metrics)."""
WORKERS_ENV: Final = "DYN_HTTP_WORKERS"
"""The number of processes (the supervisor passes its own count on)."""

_MAX_BACKOFF: Final = 10.0
_STARTUP_TIMEOUT: Final = 60.0
_GATHER_TIMEOUT: Final = 2.0
_LIST_REQUESTS: Final = b"GET /debug/requests HTTP/1.1\r\nHost: local\r\nConnection: close\r\n\r\n"


async def run_frontend_workers(
    config: Config,
    argv: Sequence[str],
    *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``config.frontend.http_workers`` frontend processes (each given ``argv``) on
    one port until a signal comes; the URL once every one listens."""
    frontend = config.frontend
    count = frontend.http_workers
    # Held (bound, not listening) for our whole life: the port stays ours between restarts.
    [holder] = listen_sockets([host_port(frontend.host, frontend.port)], reuse_port=True)
    port = holder.getsockname()[1]
    url = f"http://{host_port(frontend.host, port)}"
    shared = Path(tempfile.mkdtemp(prefix="dynamo-trio-frontend-"))
    (shared / "metrics").mkdir()
    stop = trio.Event()
    children = [_Child(index, count, argv, port, shared) for index in range(count)]
    try:
        # Held while we live; we remove the directory ourselves (below).
        with holding_shared(shared, remove=False), killed_on_forced_exit(children):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(shut_down_on_signals, stop.set)
                with trio.fail_after(_STARTUP_TIMEOUT):
                    for child in children:
                        await nursery.start(child.supervise, stop)
                if not stop.is_set():
                    _log.info("%d frontend processes listening on %s", count, url)
                    task_status.started(url)
                await stop.wait()
                for child in children:
                    child.terminate()
                # Each drains (the grace), ends what is left, and flushes its connections.
                with trio.move_on_after(config.worker.shutdown_grace + DRAIN_OVERHEAD + 5):
                    for child in children:
                        await child.exited.wait()
                for child in children:
                    child.kill()
                nursery.cancel_scope.cancel()
    finally:
        holder.close()
        shutil.rmtree(shared, ignore_errors=True)


@contextlib.contextmanager
def holding_shared(shared: Path, *, remove: bool = True) -> Iterator[None]:
    """Hold the supervisor's directory (a shared ``flock``) in this block; ``remove`` it
    on the way out if nobody else holds it (the last process of a SIGKILLed supervisor)."""
    fd = os.open(shared, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
        if not remove:
            return
        fcntl.flock(fd, fcntl.LOCK_UN)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another process still uses it; it removes it
            return
        shutil.rmtree(shared, ignore_errors=True)
    finally:
        os.close(fd)


class _Child:
    """One frontend process, restarted when it dies before the supervisor stops."""

    def __init__(
        self, index: int, count: int, argv: Sequence[str], port: int, shared: Path
    ) -> None:
        self.index = index
        # The port held for it comes after argv's own: the last one wins.
        self._argv = [sys.executable, "-m", "dynamo_trio.frontend", *argv, "--http-port", str(port)]
        self._env = {
            **os.environ,
            WORKER_INDEX_ENV: str(index),
            WORKERS_ENV: str(count),
            WORKERS_DIR_ENV: str(shared),
            "PROMETHEUS_MULTIPROC_DIR": str(shared / "metrics"),
        }
        self._metrics = shared / "metrics"
        self._process: trio.Process | None = None
        self._stopping = False
        self.exited = trio.Event()

    async def supervise(self, stop: trio.Event, *, task_status: trio.TaskStatus[None]) -> None:
        backoff = 0.5
        started = False
        try:
            while True:
                with lifeline(self._env) as options:  # it goes down with the supervisor
                    process = await trio.lowlevel.open_process(
                        self._argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, **options
                    )
                    self._process = process
                    assert process.stdout is not None
                    listening = await _read_until_listening(process.stdout)
                    if not started and listening:
                        started = True
                        task_status.started()
                    async with trio.open_nursery() as output:
                        output.start_soon(_discard, process.stdout)
                        code = await process.wait()
                mark_process_dead(process.pid, str(self._metrics))  # type: ignore[no-untyped-call]
                if self._stopping or stop.is_set():
                    return
                if not started:
                    raise RuntimeError(f"frontend process {self.index} failed to start ({code})")
                _log.error(
                    "frontend process %d (pid %d) exited with %s; restarting in %.1fs",
                    self.index,
                    process.pid,
                    code,
                    backoff,
                )
                await trio.sleep(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF)
        finally:
            self.exited.set()

    def terminate(self) -> None:
        self._stopping = True
        self.kill(signal.SIGTERM)

    def kill(self, signum: int = signal.SIGKILL) -> None:
        if self._process is not None and self._process.returncode is None:
            self._process.send_signal(signum)


async def _read_until_listening(stdout: trio.abc.ReceiveStream) -> bool:
    """Read a child's output until it says it listens (``True``) or ends (``False``)."""
    buffer = b""
    async for chunk in stdout:
        buffer += chunk
        if b"listening on" in buffer:
            return True
    return False


async def _discard(stdout: trio.abc.ReceiveStream) -> None:
    async for _ in stdout:
        pass


class WorkerView:
    """In one of the supervisor's processes: ``/metrics`` and ``/debug/requests`` for all."""

    def __init__(self, index: int, count: int, shared: Path) -> None:
        self.index: Final = index
        self.count: Final = count
        self.shared: Final = shared
        self.socket_path: Final = self.socket_of(index)

    async def stop_when_orphaned(self, stop: trio.Event) -> None:
        """Set ``stop`` (a graceful drain) once the supervisor is gone (SIGKILLed, say):
        its lifeline (:mod:`dynamo_trio._lifeline`) ends."""
        fd = take_lifeline()
        if fd is None:
            return
        await parent_gone(fd)
        _log.warning("frontend process %d: its supervisor is gone; shutting down", self.index)
        stop.set()

    def socket_of(self, index: int) -> str:
        """The private socket of process ``index`` (an abstract Unix socket name)."""
        return f"\0dynamo-trio-{self.shared.name}-{index}"

    async def metrics(self, accept: bytes) -> tuple[bytes, bytes]:
        """Every process's metrics, summed (prometheus-client's multiprocess mode)."""

        def collect() -> tuple[bytes, bytes]:
            registry = CollectorRegistry()
            MultiProcessCollector(registry, path=str(self.shared / "metrics"))  # type: ignore[no-untyped-call]
            encode, content_type = choose_encoder(accept.decode("latin-1"))
            return encode(registry), content_type.encode()

        return await trio.to_thread.run_sync(collect)

    async def inflight(self, local: Callable[[], list[dict[str, Any]]]) -> list[dict[str, Any]]:
        """This process's requests (``local()``) and its siblings', each tree saying which
        process holds it."""
        trees = [_tagged(tree, self.index) for tree in local()]

        async def ask(index: int) -> None:
            with trio.move_on_after(_GATHER_TIMEOUT):
                try:
                    listed = await _requests_over_unix(self.socket_of(index))
                except (OSError, ValueError, trio.BrokenResourceError) as exc:
                    # Restarting, say: its requests are listed again once it is back.
                    _log.warning("cannot list the requests of frontend process %d: %s", index, exc)
                    return
                trees.extend(_tagged(tree, index) for tree in listed)

        async with trio.open_nursery() as nursery:
            for index in range(self.count):
                if index != self.index:
                    nursery.start_soon(ask, index)
        return trees


def _tagged(tree: dict[str, Any], index: int) -> dict[str, Any]:
    return {**tree, "attributes": {**(tree.get("attributes") or {}), "http_worker": str(index)}}


async def _requests_over_unix(path: str) -> Any:
    """``GET /debug/requests`` of a sibling's status server (an Edge), at Unix socket ``path``."""
    async with await trio.open_unix_socket(path) as stream:
        await stream.send_all(_LIST_REQUESTS)
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise ValueError(f"unexpected answer: {head[:100]!r}")
    return json.loads(body)
