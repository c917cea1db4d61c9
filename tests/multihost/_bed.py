"""The multi-host test bed: hosts, an etcd cluster, and real frontend and worker processes.

A :class:`Bed` (one per test session) holds the :class:`~._netns.Network` and
the :class:`~._etcd_cluster.EtcdCluster`.  A :class:`Deployment` (one per
test) starts ``python -m dynamo_trio frontend`` and ``python -m dynamo_trio
mocker`` processes, each inside its own host's namespace, bound to that
host's address and advertising it, all finding each other through the etcd
cluster, in a discovery namespace of the test's own (so that no test sees
another's registrations).

Two vantage points:

* the test process itself sits on the ``client`` host (the fixture moves its
  main thread there), so its HTTP requests to a frontend cross the router like
  a user's would, and are cut like a user's would be;
* :meth:`Bed.inside` reads a URL *from inside a host* (a thread that enters
  the host's namespace), so a process's metrics can be read whatever its
  link is doing, like an operator on the machine's console.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import httpx
import trio

from tests._memhttp import TLS
from tests._metrics import Sample, parse, total

from ..e2e.conftest import Proc
from ._netns import in_netns

if TYPE_CHECKING:
    from ._etcd_cluster import EtcdCluster
    from ._netns import Network

__all__ = ["Bed", "Deployment", "Frontend", "Timings", "Worker"]

ROOT: Final = Path(__file__).parents[2]
MODEL: Final = "mh-model"
HTTP_PORT: Final = 8000
SYSTEM_PORT: Final = 9100
RPC_PORT: Final = 7000


@dataclass(frozen=True)
class Timings:
    """Liveness settings every process of a deployment runs with."""

    lease_ttl: float = 3.0
    heartbeat_interval: float = 0.5
    heartbeat_timeout: float = 2.5
    connect_timeout: float = 2.0

    @property
    def heartbeat_bound(self) -> float:
        """The longest a dead peer can go unnoticed: a timeout plus one tick to see it."""
        return self.heartbeat_timeout + self.heartbeat_interval


@dataclass
class Bed:
    """The network, the etcd cluster and a scratch directory, for the whole session."""

    network: Network
    etcd: EtcdCluster
    scratch: Path
    runs: int = 0

    def environment(self, host: str, namespace: str, timings: Timings) -> dict[str, str]:
        """The ``DYN_*`` environment of a process on ``host``."""
        address = self.network.host(host).address
        env = {key: value for key, value in os.environ.items() if not key.startswith("DYN_")}
        env.pop("ETCD_ENDPOINTS", None)
        env.update(
            DYN_DISCOVERY_BACKEND="etcd",
            ETCD_ENDPOINTS=",".join(self.etcd.endpoints),
            DYN_NAMESPACE=namespace,
            DYN_TCP_RPC_HOST=address,
            DYN_TCP_RPC_ADVERTISE_HOST=address,
            DYN_TCP_RPC_PORT=str(RPC_PORT),
            DYN_HTTP_HOST=address,
            DYN_HTTP_PORT=str(HTTP_PORT),
            DYN_SYSTEM_HOST=address,
            DYN_SYSTEM_PORT=str(SYSTEM_PORT),
            DYN_LEASE_TTL_SECS=str(timings.lease_ttl),
            DYN_HEARTBEAT_INTERVAL_SECS=str(timings.heartbeat_interval),
            DYN_HEARTBEAT_TIMEOUT_SECS=str(timings.heartbeat_timeout),
            DYN_TCP_CONNECT_TIMEOUT_SECS=str(timings.connect_timeout),
            DYN_DRAIN_GRACE_SECS="1",
            DYN_SHUTDOWN_GRACE_SECS="2",
            PYTHONPATH=str(ROOT),
            PYTHONUNBUFFERED="1",
        )
        return env

    def _get_inside(self, host: str, url: str) -> tuple[int, str]:
        with (
            in_netns(self.network.host(host).namespace),
            httpx.Client(verify=TLS, trust_env=False, timeout=5.0) as client,
        ):
            response = client.get(url)
            return response.status_code, response.text

    async def inside(self, host: str, url: str) -> tuple[int, str]:
        """``GET url`` from inside ``host``: ``(status, body)`` (5 s at most)."""
        return await trio.to_thread.run_sync(self._get_inside, host, url)

    def etcd_keys(self, prefix: str) -> dict[str, bytes]:
        """Every key under ``prefix``, read from the first member that answers."""
        import base64

        from dynamo_trio.discovery._etcd import prefix_range

        key, range_end = prefix_range(prefix)
        body = {
            "key": base64.b64encode(key).decode(),
            "range_end": base64.b64encode(range_end).decode(),
        }
        errors = []
        for host in self.etcd.hosts:
            if not self.etcd.running(host) or self.network.cut_off(host):
                continue  # (an isolated member has no leader: it would not answer)
            try:
                with (
                    in_netns(self.network.host(host).namespace),
                    httpx.Client(verify=TLS, trust_env=False, timeout=3.0) as client,
                ):
                    response = client.post(f"{self.etcd.url(host)}/v3/kv/range", json=body)
                reply = response.json()
            except (httpx.HTTPError, ValueError) as exc:
                errors.append(f"{host}: {exc}")
                continue
            if response.status_code != 200 or "header" not in reply:
                errors.append(f"{host}: {response.status_code} {reply}")  # no leader, say
                continue
            return {
                base64.b64decode(kv["key"]).decode(): base64.b64decode(kv.get("value", ""))
                for kv in reply.get("kvs", [])
            }
        raise AssertionError(f"no etcd member answered: {errors}")


parse_metrics = parse
metric_sum = total


@dataclass
class Member:
    """A process of a deployment."""

    bed: Bed
    host: str
    proc: Proc
    log: Path

    @property
    def address(self) -> str:
        return self.bed.network.host(self.host).address

    @property
    def alive(self) -> bool:
        return self.proc.process.returncode is None

    async def metrics(self) -> list[Sample]:
        """This process's metrics, read from inside its host."""
        status, text = await self.bed.inside(self.host, f"{self.metrics_base}/metrics")
        assert status == 200, f"{self.host} /metrics answered {status}"
        return parse_metrics(text)

    async def debug_requests(self) -> list[dict[str, Any]]:
        status, text = await self.bed.inside(self.host, f"{self.metrics_base}/debug/requests")
        assert status == 200, f"{self.host} /debug/requests answered {status}"
        result: list[dict[str, Any]] = json.loads(text)
        return result

    @property
    def metrics_base(self) -> str:
        raise NotImplementedError

    def log_tail(self, size: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-size:]
        except OSError:
            return ""


@dataclass
class Worker(Member):
    """A ``dynamo_trio mocker`` process."""

    instance_id: int = 0

    @property
    def metrics_base(self) -> str:
        return f"http://{self.address}:{SYSTEM_PORT}"

    async def inflight(self) -> float:
        return metric_sum(await self.metrics(), "dynamo_component_inflight_requests")

    async def cancelled(self, reason: str | None = None) -> float:
        samples = await self.metrics()
        if reason is None:
            return metric_sum(samples, "dynamo_component_cancellation_total")
        return metric_sum(samples, "dynamo_component_cancelled_requests_total", reason=reason)

    async def requests(self) -> float:
        return metric_sum(await self.metrics(), "dynamo_component_requests_total")


@dataclass
class Frontend(Member):
    """A ``dynamo_trio frontend`` process."""

    @property
    def url(self) -> str:
        return f"http://{self.address}:{HTTP_PORT}"

    @property
    def metrics_base(self) -> str:
        return self.url


@dataclass
class Deployment:
    """The processes of one test, in a discovery namespace of its own."""

    bed: Bed
    nursery: trio.Nursery
    timings: Timings
    namespace: str
    members: list[Member] = field(default_factory=list)

    def _environment(self, host: str) -> dict[str, str]:
        return self.bed.environment(host, self.namespace, self.timings)

    async def _spawn(self, host: str, role: str, argv: list[str]) -> tuple[Proc, Path]:
        log = self.bed.scratch / f"{self.namespace}-{role}-{host}.log"
        stderr = await trio.to_thread.run_sync(log.open, "ab")
        with stderr:  # the child keeps its own copy of the descriptor
            process = await trio.lowlevel.open_process(
                self.bed.network.exec_argv(
                    host, [sys.executable, "-m", "dynamo_trio", role, *argv]
                ),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=self._environment(host),
                cwd=ROOT,
            )
        proc = Proc(process, f"{role}@{host}")
        self.nursery.start_soon(proc._read_stdout)
        return proc, log

    async def start_worker(self, host: str, *flags: str, token_ms: float = 10.0) -> Worker:
        """A mocker on ``host`` serving :data:`MODEL`, a token every ``token_ms``; returns
        once it is registered."""
        argv = ["--model-name", MODEL, "--inter-token-latency-ms", str(token_ms), *flags]
        proc, log = await self._spawn(host, "mocker", argv)
        worker = Worker(self.bed, host, proc, log)
        self.members.append(worker)
        worker.instance_id = await self._registered(worker)
        return worker

    async def _registered(self, worker: Worker) -> int:
        prefix = f"v1/instances/{self.namespace}/mocker/generate/"
        earlier = {f"{w.instance_id:x}" for w in self.workers() if w is not worker}
        with trio.fail_after(30):
            while True:
                if not worker.alive:
                    raise AssertionError(f"{worker.proc.name} exited:\n{worker.log_tail()}")
                keys = await trio.to_thread.run_sync(self.bed.etcd_keys, prefix)
                for key, value in keys.items():
                    if key.rsplit("/", 1)[1] in earlier:
                        continue  # an earlier process on the same host
                    if json.loads(value).get("address", "").startswith(f"{worker.address}:"):
                        models = await trio.to_thread.run_sync(
                            self.bed.etcd_keys, f"v1/models/{self.namespace}/"
                        )
                        instance = key.rsplit("/", 1)[1]
                        if sum(k.endswith(f"/{instance}") for k in models) >= 2:
                            return int(instance, 16)
                await trio.sleep(0.1)

    async def start_frontend(self, host: str, *flags: str) -> Frontend:
        """A frontend on ``host``; returns once it lists :data:`MODEL`."""
        proc, log = await self._spawn(host, "frontend", list(flags))
        frontend = Frontend(self.bed, host, proc, log)
        self.members.append(frontend)
        with trio.fail_after(30):
            while True:
                if not frontend.alive:
                    raise AssertionError(f"{proc.name} exited:\n{frontend.log_tail()}")
                with contextlib.suppress(httpx.HTTPError, OSError, ValueError):
                    status, text = await self.bed.inside(host, f"{frontend.url}/v1/models")
                    if status == 200 and MODEL in {m["id"] for m in json.loads(text)["data"]}:
                        return frontend
                await trio.sleep(0.1)

    async def stop_worker(self, worker: Worker) -> int:
        """SIGTERM ``worker`` (a graceful shutdown: it deregisters) and return its exit code."""
        worker.proc.signal(signal.SIGTERM)
        return await worker.proc.wait_exit(within=15)

    def workers(self) -> list[Worker]:
        return [m for m in self.members if isinstance(m, Worker)]

    def frontends(self) -> list[Frontend]:
        return [m for m in self.members if isinstance(m, Frontend)]

    def worker_on(self, instance_id: int) -> Worker:
        return next(w for w in self.workers() if w.instance_id == instance_id)

    async def stop(self) -> None:
        """SIGKILL every process (the test's teardown) and reap them."""
        for member in self.members:
            if member.alive:
                member.proc.process.send_signal(signal.SIGCONT)
                member.proc.process.kill()
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            for member in self.members:
                await member.proc.process.wait()

    def logs(self) -> str:
        """Every process's log tail (for a failing test's report)."""
        return "\n".join(f"==== {m.proc.name}\n{m.log_tail(3000)}" for m in self.members)


# -- the client side: requests from the ``client`` host ------------------------------------


def chat_body(max_tokens: int, *, stream: bool = True) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello across the network"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


@dataclass
class StreamResult:
    """What a client saw of one streaming request."""

    status: int = 0
    tokens: int = 0
    done: bool = False
    error: str | None = None
    first_token_at: float | None = None
    ended_at: float | None = None
    request_id: str = ""
    events: list[dict[str, Any]] = field(default_factory=list)
    streaming: trio.Event = field(default_factory=trio.Event)
    """Set once ``hang_up_after`` tokens have arrived."""
    hang_up: trio.Event | None = None
    """If given, the client waits for it after ``hang_up_after`` tokens, then hangs up."""


class _HttpStream:
    """A minimal HTTP/1.1 client for one streaming request over a raw trio stream.

    httpx's streaming API leaves a chain of async generators to the garbage
    collector when a reader stops early; a hang-up here is simply closing the
    socket, as a user's client does.
    """

    def __init__(self, stream: trio.abc.Stream) -> None:
        self._stream = stream
        self._buffer = b""
        self._chunked = False
        self._chunk_left = 0
        self._crlf_due = False
        self._eof = False

    async def _fill(self) -> bool:
        data = await self._stream.receive_some(65536)
        if not data:
            self._eof = True
            return False
        self._buffer += data
        return True

    async def head(self) -> tuple[int, dict[str, str]]:
        while b"\r\n\r\n" not in self._buffer:
            if not await self._fill():
                raise ConnectionError("the frontend closed the connection before answering")
        head, self._buffer = self._buffer.split(b"\r\n\r\n", 1)
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        self._chunked = headers.get("transfer-encoding", "").lower() == "chunked"
        return int(status_line.split()[1]), headers

    async def body_bytes(self) -> bytes:
        """The next piece of the body (b"" at its end)."""
        if not self._chunked:
            if not self._buffer and not self._eof:
                await self._fill()
            data, self._buffer = self._buffer, b""
            return data
        while True:
            if self._chunk_left:
                if not self._buffer and not await self._fill():
                    return b""
                data = self._buffer[: self._chunk_left]
                self._buffer = self._buffer[len(data) :]
                self._chunk_left -= len(data)
                self._crlf_due = not self._chunk_left
                return data
            while self._crlf_due or b"\r\n" not in self._buffer:
                if self._crlf_due and len(self._buffer) >= 2:
                    self._buffer, self._crlf_due = self._buffer[2:], False
                elif not await self._fill():
                    return b""
            size_line, self._buffer = self._buffer.split(b"\r\n", 1)
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                return b""
            self._chunk_left = size


async def stream_chat(
    frontend: Frontend,
    max_tokens: int,
    *,
    request_id: str,
    hang_up_after: int | None = None,
    result: StreamResult | None = None,
    give_up_after: float = 60.0,
) -> StreamResult:
    """Stream one chat completion from the client host; hang up after ``hang_up_after`` tokens.

    ``result`` (if given) is filled in as the stream goes, so that another
    task can watch it.  Connection failures are recorded in ``result.error``.
    """
    result = result if result is not None else StreamResult()
    result.request_id = request_id
    body = json.dumps(chat_body(max_tokens)).encode()
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {frontend.address}:{HTTP_PORT}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        f"x-request-id: {request_id}\r\nConnection: close\r\n\r\n"
    ).encode() + body
    try:
        with trio.fail_after(give_up_after):
            stream = await trio.open_tcp_stream(frontend.address, HTTP_PORT)
            async with stream:
                await stream.send_all(request)
                http = _HttpStream(stream)
                result.status, _ = await http.head()
                pending = b""
                while True:
                    data = await http.body_bytes()
                    if not data:
                        if result.status != 200:
                            result.error = pending.decode(errors="replace")
                        return result
                    pending += data
                    if result.status != 200:
                        continue
                    *lines, pending = pending.split(b"\n")
                    for raw in lines:
                        if _take_sse_line(raw.decode().strip(), result):
                            return result
                        if hang_up_after is not None and result.tokens >= hang_up_after:
                            result.streaming.set()
                            if result.hang_up is not None:
                                await result.hang_up.wait()
                            return result  # leaving ``async with stream`` closes it: a hang-up
    except (OSError, trio.BrokenResourceError, trio.TooSlowError, ConnectionError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        result.ended_at = trio.current_time()
    return result


def _take_sse_line(line: str, result: StreamResult) -> bool:
    """Record one SSE line; ``True`` at ``[DONE]``."""
    if not line.startswith("data: "):
        return False
    data = line[len("data: ") :]
    if data == "[DONE]":
        result.done = True
        return True
    event = json.loads(data)
    if "error" in event:
        result.error = json.dumps(event["error"])
        result.events.append(event)
        return False
    if event.get("choices") and event["choices"][0].get("delta", {}).get("content"):
        result.tokens += 1
        if result.first_token_at is None:
            result.first_token_at = trio.current_time()
    return False


async def until(
    predicate: Any, *, within: float, interval: float = 0.05, what: str = "condition"
) -> float:
    """Poll ``await predicate()`` until true; return how long it took (bounded by ``within``)."""
    start = trio.current_time()
    with trio.move_on_after(within):
        while True:
            if await predicate():
                return trio.current_time() - start
            await trio.sleep(interval)
    raise AssertionError(f"{what} did not hold within {within}s")


def monotonic() -> float:
    return time.monotonic()
