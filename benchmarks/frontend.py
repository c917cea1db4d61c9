"""Frontend benchmark: dynamo-trio's frontend beside Dynamo 1.6.1's, one system at a time.

Run: ``python3 benchmarks/frontend.py [--runs 3] [--systems both|trio|dynamo]``

Each run starts one system's processes from scratch (fresh file discovery), measures it,
stops it, and then does the same for the other system: A B A B ..., so the two never
compete for the machine and both see the same slow drifts of its load.

dynamo-trio: ``python -m dynamo_trio frontend`` + ``python -m dynamo_trio mocker
--ttft-ms 0 --inter-token-latency-ms 0`` (model ``bench``), and ``_model_worker.py``
(model ``slow``, 10 ms per token, reports when its handler is cancelled).

Dynamo 1.6.1 (when ``benchmarks/setup_dynamo.sh`` has installed it): ``python -m
dynamo.frontend`` (Rust HTTP frontend, tokenizer and router) + ``_dynamo_worker.py``
(a Python worker on Dynamo's runtime under uvloop, yielding tokens without sleeping,
model ``bench``), and the same worker as model ``slow`` (10 ms per token, reports when
its context is killed or stopped).  Both on file discovery, the TCP request plane and
loopback only.

Figures, from one load generator (a minimal HTTP/1.1 client on raw trio sockets, closed
loop: each connection sends its next request when the last one ends), measured over a
window of ``--duration`` seconds after a ramp in which the connections start staggered:

- SSE chunks/s at 1/32/128 concurrent 256-token chat streams: SSE events carrying a
  token, counted as they arrive inside the window (each system's stream shape, i.e.
  which events carry tokens, is learned from a fully parsed stream first; every stream
  is then checked to have exactly that many events, and every ``--verify-every``-th is
  parsed and checked to hold exactly ``--stream-tokens`` tokens and end ``length``);
- TTFC p50: time from sending a request to its first token-carrying event, for the
  streams sent inside the window (in the steady state, not the opening burst);
- unary req/s at 1/32 concurrent 16-token chats (each answer's usage checked); at 32,
  beside a bare quart-trio app on stock hypercorn that parses each request's JSON and
  answers one of the system's own unary answers (``_bare_quart.py``), measured right
  after it in the same run: what the mandated HTTP stack serves with no engine behind it;
- frontend process CPU per SSE chunk at 32 streams: utime+stime from /proc/<pid>/stat
  of the frontend (and any child processes) over the window, divided by the chunks
  delivered in it; the worker's CPU the same way;
- ``GET /health`` p50, sequential on one keep-alive connection of an idle frontend,
  beside a bare ASGI app on stock hypercorn answering the same bytes (``_bare_asgi.py``),
  measured right after it in the same run;
- paced streams: ``--paced-streams`` (64) concurrent ``--paced-tokens``-token (100)
  streams of the ``slow`` model, one token per 10 ms: the regime of a real engine, where
  every SSE write carries one token.  Chunks/s, TTFC p50, and the frontend's CPU per
  chunk, which here is the whole per-token cost (nothing is batched); beside two
  baselines streaming the system's own captured events at the same pace, with no engine
  behind them: a bare quart-trio app on stock hypercorn (``_bare_quart.py``, the
  mandated HTTP stack) and a bare HTTP/1.1 server on trio sockets (``_bare_trio.py``,
  one wake-up and one write per token: the floor of any frontend on trio);
- hang-up -> worker observes: a client closes its socket after the 2nd SSE event of a
  stream of the ``slow`` model; the time until the worker's handler sees the kill.

The machine is shared: read the medians, and the ratios, which pair the two systems'
runs made minutes apart.  The load average is printed beside each run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import shlex
import socket
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from _bootstrap import ensure_project_python

ensure_project_python()

import trio  # noqa: E402
from _harness import (  # noqa: E402
    DEFAULT_DYNAMO_VENV,
    DYNAMO_VERSION,
    HERE,
    REPO,
    Child,
    Figure,
    Runs,
    dynamo_env,
    dynamo_model_dir,
    dynamo_python,
    free_port,
    git_describe,
    load_average,
    machine_busy_seconds,
    now_stamp,
    percentile,
    print_table,
    python_env,
    settle,
    spawn,
    stop_all,
    tree_cpu_seconds,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Sequence

TRIO = "dynamo-trio"
DYNAMO = f"Dynamo {DYNAMO_VERSION}"
PROMPT = [{"role": "user", "content": "benchmark"}]
STEP_TIMEOUT = 60.0
"""Seconds one request may take outside the load levels before the run is abandoned."""


# ---------------------------------------------------------------------------- the client


class Connection:
    """One keep-alive HTTP/1.1 client connection on a raw trio socket: cheap on purpose.

    A minimal response reader (status line, ``content-length`` or chunked bodies) instead
    of h11: the load generator shares the machine's two cores with the systems it
    measures, and h11's per-event work cost as much as a frontend's work per token.
    """

    quickack = False
    """Set TCP_QUICKACK around every read (``--quickack``): no delayed ACKs from this client."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self._buffer = b""
        self._at = 0.0  # when the last bytes arrived (time.perf_counter())
        self.closed = False

    @classmethod
    async def open(cls, port: int) -> Connection:
        return cls(await trio.open_tcp_stream("127.0.0.1", port))

    def _quickack(self) -> None:
        with contextlib.suppress(OSError):
            self._stream.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)

    async def _more(self, pos: int) -> int:
        """Read more bytes after ``self._buffer[pos:]``; return the new position of ``pos``."""
        if self.quickack:
            self._quickack()
        data = await self._stream.receive_some(262144)
        self._at = time.perf_counter()
        if self.quickack:
            self._quickack()
        if not data:
            self.closed = True
            raise ConnectionError("the server closed the connection")
        self._buffer = self._buffer[pos:] + data
        return 0

    async def exchange(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: Sequence[tuple[str, str]] = (),
        on_data: Callable[[bytes, float], None] | None = None,
    ) -> tuple[int, bytes]:
        """Send a request, read its whole response: ``(status, body)``.

        With ``on_data``, each piece of the body is passed to it with its arrival time
        (``time.perf_counter()`` after the read that completed it) instead of being
        collected.  ``closed`` is true afterwards if the server closes the connection.

        Raises:
            ConnectionError: the connection is closed, or the server answered what this
                reader does not take (then ``closed`` is true).
        """
        if self.closed:
            raise ConnectionError("the connection is closed")
        head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        head += "".join(f"{name}: {value}\r\n" for name, value in headers)
        if body:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        await self._stream.send_all(head.encode() + b"\r\n" + body)
        pos = 0
        while (end := self._buffer.find(b"\r\n\r\n", pos)) < 0:
            if len(self._buffer) > 65536:
                self.closed = True
                raise ConnectionError("a response head over 64 KiB")
            pos = await self._more(pos)
        lines = self._buffer[pos:end].decode("latin-1").split("\r\n")
        pos = end + 4
        try:
            status = int(lines[0].split(" ", 2)[1])
        except (IndexError, ValueError):
            self.closed = True
            raise ConnectionError(f"not an HTTP/1.1 status line: {lines[0]!r}") from None
        fields = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip().lower()
        parts: list[bytes] = []
        if fields.get("transfer-encoding") == "chunked":
            while True:
                while (eol := self._buffer.find(b"\r\n", pos)) < 0:
                    pos = await self._more(pos)
                try:
                    size = int(self._buffer[pos:eol].split(b";", 1)[0], 16)
                except ValueError:
                    self.closed = True
                    raise ConnectionError(f"a bad chunk size: {self._buffer[pos:eol]!r}") from None
                if size == 0:  # the last chunk, then trailers (none expected) and CRLF
                    while (end := self._buffer.find(b"\r\n\r\n", eol)) < 0:
                        eol -= pos
                        pos = await self._more(pos)
                    pos = end + 4
                    break
                while len(self._buffer) < eol + 4 + size:
                    eol -= pos
                    pos = await self._more(pos)
                data = self._buffer[eol + 2 : eol + 2 + size]
                pos = eol + 4 + size
                if on_data is None:
                    parts.append(data)
                else:
                    on_data(data, self._at)
        elif "content-length" in fields:
            length = int(fields["content-length"])
            while len(self._buffer) < pos + length:
                pos = await self._more(pos)
            data = self._buffer[pos : pos + length]
            pos += length
            if on_data is None:
                parts.append(data)
            elif data:
                on_data(data, self._at)
        else:
            self.closed = True
            raise ConnectionError(f"a response without a length: {fields}")
        self._buffer = self._buffer[pos:]
        if fields.get("connection") == "close":
            self.closed = True
        return status, b"".join(parts)

    async def aclose(self) -> None:
        self.closed = True
        await self._stream.aclose()


def chat_body(model: str, max_tokens: int, stream: bool) -> bytes:
    return json.dumps(
        {"model": model, "messages": PROMPT, "max_tokens": max_tokens, "stream": stream}
    ).encode()


# ---------------------------------------------------------------------------- stream shape


def parse_sse(body: bytes) -> list[Any]:
    """The ``data:`` payloads of an SSE body, JSON-decoded (``"[DONE]"`` kept as is)."""
    events: list[Any] = []
    for block in body.replace(b"\r\n", b"\n").split(b"\n\n"):
        for line in block.split(b"\n"):
            if line.startswith(b"data: "):
                payload = line[6:]
                events.append("[DONE]" if payload == b"[DONE]" else json.loads(payload))
    return events


def token_flags(body: bytes, tokens: int) -> list[bool]:
    """Which data events of a complete chat stream carry generated text; checks the stream.

    Raises:
        ValueError: unless the stream holds exactly ``tokens`` text-carrying events, ends
            with ``finish_reason: "length"`` and then ``[DONE]``.
    """
    events = parse_sse(body)
    if not events or events[-1] != "[DONE]":
        raise ValueError(f"the stream does not end with [DONE]: {body[-200:]!r}")
    flags, finish = [], None
    for event in events[:-1]:
        if not isinstance(event, dict):
            raise ValueError(f"a second [DONE] or a non-object event: {event!r}")
        if "error" in event:
            raise ValueError(f"an error event: {event!r}")
        choices = event.get("choices") or [{}]
        delta = choices[0].get("delta") or {}
        flags.append(bool(delta.get("content")))
        finish = choices[0].get("finish_reason") or finish
    if sum(flags) != tokens or finish != "length":
        raise ValueError(
            f"expected {tokens} tokens ending 'length', got {sum(flags)} ending {finish!r}"
        )
    return flags


@dataclass(frozen=True)
class Shape:
    """What every stream of one system looks like: its data events, which carry a token."""

    flags: tuple[bool, ...]

    @property
    def events(self) -> int:
        """Data events per stream, ``[DONE]`` included."""
        return len(self.flags) + 1

    @property
    def first_token(self) -> int:
        return self.flags.index(True)

    def prefix(self) -> list[int]:
        """``prefix[k]``: tokens carried by the first ``k`` events (``[DONE]`` carries none)."""
        sums = [0]
        for flag in (*self.flags, False):
            sums.append(sums[-1] + flag)
        return sums


# ---------------------------------------------------------------------------- load levels


@dataclass
class Window:
    """One load level: what happened between ``t0`` and ``t1`` (``time.perf_counter()``)."""

    t0: float = math.inf
    t1: float = math.inf
    tokens: int = 0
    completed: int = 0
    ttfc: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)
    awaiting_first: int = 0  # streams sent inside the window still without a first token
    closed: trio.Event = field(default_factory=trio.Event)  # set at t1
    drained: trio.Event = field(default_factory=trio.Event)  # closed, none awaiting first

    @property
    def seconds(self) -> float:
        return self.t1 - self.t0

    def first_token_settled(self) -> None:
        """One stream sent inside the window has its first token, or has ended."""
        self.awaiting_first -= 1
        if self.awaiting_first == 0 and self.closed.is_set():
            self.drained.set()


class StreamTally:
    """Counts one stream's data events as they arrive, and the window's tokens among them."""

    __slots__ = (
        "_carry",
        "_prefix",
        "_window",
        "body",
        "events",
        "first_token_at",
        "inside",
        "sent",
        "shape",
    )

    def __init__(self, shape: Shape, prefix: list[int], window: Window, keep: bool) -> None:
        self.shape = shape
        self._prefix = prefix
        self._window = window
        self._carry = b""
        self.events = 0
        self.first_token_at: float | None = None
        self.body: list[bytes] | None = [] if keep else None
        self.sent = time.perf_counter()
        self.inside = window.t0 <= self.sent < window.t1
        """Sent inside the window: its time to first token counts."""
        if self.inside:
            window.awaiting_first += 1

    def ended(self) -> None:
        """The stream ended (or was cut) before its first token."""
        if self.inside and self.first_token_at is None:
            self._window.first_token_settled()

    def feed(self, data: bytes, now: float) -> None:
        joined = self._carry + data
        n = joined.count(b"data: ")
        self._carry = joined[-5:]  # shorter than b"data: ": nothing is counted twice
        if self.body is not None:
            self.body.append(data)
        if not n:
            return
        k, self.events = self.events, self.events + n
        window, last = self._window, len(self._prefix) - 1
        if window.t0 <= now < window.t1:
            window.tokens += self._prefix[min(k + n, last)] - self._prefix[min(k, last)]
        if self.first_token_at is None and self.events > self.shape.first_token:
            self.first_token_at = now
            if self.inside:
                window.ttfc.append(now - self.sent)
                window.first_token_settled()


async def _sample_cpu(
    window: Window, start: float, ramp: float, duration: float, pids: dict[str, list[int]]
) -> None:
    """Open the window after ``ramp``, close it ``duration`` later; CPU time at both ends."""
    await trio.sleep_until(trio.current_time() + (start + ramp - time.perf_counter()))
    before = {name: tree_cpu_seconds(p) for name, p in pids.items()}
    usage = resource.getrusage(resource.RUSAGE_SELF)
    client_before = usage.ru_utime + usage.ru_stime
    busy_before = machine_busy_seconds()
    window.t0 = time.perf_counter()
    await trio.sleep(duration)
    window.t1 = time.perf_counter()
    busy = machine_busy_seconds() - busy_before
    usage = resource.getrusage(resource.RUSAGE_SELF)
    window.cpu = {name: tree_cpu_seconds(p) - before[name] for name, p in pids.items()}
    window.cpu["client"] = usage.ru_utime + usage.ru_stime - client_before
    window.cpu["others"] = max(0.0, busy - sum(window.cpu.values()))
    window.closed.set()
    if window.awaiting_first == 0:
        window.drained.set()


async def _finish(window: Window, nursery: trio.Nursery, grace: float = 10.0) -> None:
    """After the window: let streams sent inside it get their first token, then cut all."""
    await window.closed.wait()
    with trio.move_on_after(grace):
        await window.drained.wait()
    nursery.cancel_scope.cancel()


async def sse_level(
    port: int,
    shape: Shape,
    concurrency: int,
    *,
    tokens: int,
    ramp: float,
    duration: float,
    verify_every: int,
    pids: dict[str, list[int]],
    model: str = "bench",
) -> Window:
    """``concurrency`` connections streaming chats back to back; the window's figures."""
    window = Window()
    prefix = shape.prefix()
    body = chat_body(model, tokens, stream=True)
    sent_streams = 0

    async def client(i: int) -> None:
        nonlocal sent_streams
        if ramp and concurrency > 1:
            await trio.sleep(ramp * i / concurrency)
        connection: Connection | None = None
        try:
            while time.perf_counter() < window.t1:
                if connection is None or connection.closed:
                    if connection is not None:
                        await connection.aclose()
                    connection = await Connection.open(port)
                sent_streams += 1
                tally = StreamTally(
                    shape, prefix, window, keep=(sent_streams - 1) % verify_every == 0
                )
                try:
                    status, _ = await connection.exchange(
                        "POST", "/v1/chat/completions", body, on_data=tally.feed
                    )
                except (ConnectionError, OSError, trio.BrokenResourceError) as e:
                    window.errors.append(f"{type(e).__name__}: {e}")
                    await connection.aclose()
                    connection = None
                    continue
                finally:
                    tally.ended()
                if status != 200:
                    window.errors.append(f"HTTP {status}")
                elif tally.events != shape.events:
                    window.errors.append(f"a stream of {tally.events} events, not {shape.events}")
                elif tally.body is not None:
                    try:
                        token_flags(b"".join(tally.body), tokens)
                    except ValueError as e:
                        window.errors.append(str(e))
                window.completed += 1
        finally:
            if connection is not None:
                await connection.aclose()

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_sample_cpu, window, start, ramp, duration, pids)
        nursery.start_soon(_finish, window, nursery)
        for i in range(concurrency):
            nursery.start_soon(client, i)
    return window


async def unary_level(
    port: int,
    concurrency: int,
    *,
    tokens: int,
    ramp: float,
    duration: float,
    pids: dict[str, list[int]],
) -> Window:
    """``concurrency`` connections sending non-streaming chats back to back."""
    window = Window()
    body = chat_body("bench", tokens, stream=False)

    async def client(i: int) -> None:
        if ramp and concurrency > 1:
            await trio.sleep(ramp * i / concurrency)
        connection: Connection | None = None
        try:
            while time.perf_counter() < window.t1:
                if connection is None or connection.closed:
                    if connection is not None:
                        await connection.aclose()
                    connection = await Connection.open(port)
                try:
                    status, answer = await connection.exchange("POST", "/v1/chat/completions", body)
                except (ConnectionError, OSError, trio.BrokenResourceError) as e:
                    window.errors.append(f"{type(e).__name__}: {e}")
                    await connection.aclose()
                    connection = None
                    continue
                done = time.perf_counter()
                try:
                    reply = json.loads(answer)
                    usage = reply["usage"]["completion_tokens"]
                    finish = reply["choices"][0]["finish_reason"]
                except (ValueError, KeyError, IndexError, TypeError):
                    usage, finish = None, None
                if status != 200 or usage != tokens or finish != "length":
                    window.errors.append(f"HTTP {status}: {answer[:200]!r}")
                elif window.t0 <= done < window.t1:
                    window.completed += 1
        finally:
            if connection is not None:
                await connection.aclose()

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_sample_cpu, window, start, ramp, duration, pids)
        for i in range(concurrency):
            nursery.start_soon(client, i)
        await window.closed.wait()
        nursery.cancel_scope.cancel()
    return window


async def health_p50(port: int, samples: int) -> tuple[float, bytes]:
    """p50 of ``GET /health`` (ms), sequential on one keep-alive connection; the last body."""
    connection = await Connection.open(port)
    latencies, answer = [], b""
    try:
        for i in range(samples + 20):
            start = time.perf_counter()
            with trio.fail_after(STEP_TIMEOUT):
                status, answer = await connection.exchange("GET", "/health")
            elapsed = time.perf_counter() - start
            if status != 200:
                raise RuntimeError(f"GET /health: HTTP {status}: {answer[:200]!r}")
            if connection.closed:
                raise RuntimeError("GET /health: the server does not keep the connection alive")
            if i >= 20:  # the first few warm the connection
                latencies.append(elapsed * 1000)
    finally:
        await connection.aclose()
    return statistics.median(latencies), answer


async def hang_up_latencies(port: int, worker: Child, samples: int) -> tuple[list[float], int]:
    """Hang up after the 2nd SSE event of a ``slow`` stream; ms until the worker sees it."""
    latencies, missed = [], 0
    body = chat_body("slow", 10_000, stream=True)
    for _ in range(samples):
        request_id = str(uuid.uuid4())
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n"
            b"x-request-id: %s\r\nx-dynamo-request-id: %s\r\n\r\n%s"
            % (len(body), request_id.encode(), request_id.encode(), body)
        )
        received = b""
        with trio.fail_after(30):
            while received.count(b"data: ") < 2:
                data = await stream.receive_some(65536)
                if not data:
                    raise RuntimeError(f"the frontend closed a slow stream: {received[:300]!r}")
                received += data
        hung_up_at = time.monotonic()
        await stream.aclose()
        try:
            observed = await worker.wait_for("cancelled", within=10, id=request_id)
        except trio.TooSlowError:
            missed += 1
        else:
            latencies.append((observed["t"] - hung_up_at) * 1000)
        await trio.sleep(0.02)
    return latencies, missed


# ---------------------------------------------------------------------------- systems


@dataclass
class Deployment:
    port: int
    frontend: Child
    workers: list[Child]
    slow: Child

    @property
    def children(self) -> list[Child]:
        return [self.frontend, *self.workers, self.slow]

    def pids(self) -> dict[str, list[int]]:
        """Whose CPU time is measured: each is a process tree."""
        return {
            "frontend": [self.frontend.pid],
            "worker": [w.pid for w in self.workers],
            "slow": [self.slow.pid],
        }


class System:
    """One side of the comparison: how to start its frontend and workers."""

    name: str

    async def start(self, nursery: trio.Nursery, workdir: Path) -> Deployment:
        raise NotImplementedError


class TrioSystem(System):
    """``python -m dynamo_trio frontend`` + ``--mockers`` x ``python -m dynamo_trio mocker``."""

    def __init__(self, name: str, frontend_args: Sequence[str], mockers: int) -> None:
        self.name = name
        self.frontend_args = list(frontend_args)
        self.mockers = mockers

    async def start(self, nursery: trio.Nursery, workdir: Path) -> Deployment:
        env = python_env()
        env.update(
            DYN_DISCOVERY_BACKEND="file",
            DYN_FILE_KV=str(workdir / "kv"),
            DYN_LOG="warning",
            PYTHONPATH=str(REPO),
        )
        port = free_port()
        py = sys.executable
        frontend = await spawn(
            nursery,
            [
                *(py, "-m", "dynamo_trio", "frontend"),
                *("--http-host", "127.0.0.1", "--http-port", str(port)),
                *self.frontend_args,
            ],
            env,
            name="trio-frontend",
            logdir=workdir,
        )
        workers = [
            await spawn(
                nursery,
                [
                    *(py, "-m", "dynamo_trio", "mocker", "--model-name", "bench"),
                    *("--ttft-ms", "0", "--inter-token-latency-ms", "0"),
                    *("--context-length", "32768", "--max-output-tokens", "16384"),
                ],
                env,
                name=f"trio-mocker-{i}",
                logdir=workdir,
            )
            for i in range(self.mockers)
        ]
        slow = await spawn(
            nursery,
            [
                *(py, str(HERE / "_model_worker.py"), "--model-name", "slow"),
                *("--inter-token-latency-ms", "10"),
            ],
            env,
            name="trio-slow-worker",
            logdir=workdir,
        )
        return Deployment(port, frontend, workers, slow)


class DynamoSystem(System):
    """``python -m dynamo.frontend`` + ``_dynamo_worker.py`` (Dynamo's Python runtime)."""

    name = DYNAMO

    def __init__(self, python: Path, model_dir: Path, frontend_args: Sequence[str]) -> None:
        self.python = str(python)
        self.model_dir = str(model_dir)
        self.frontend_args = list(frontend_args)

    async def start(self, nursery: trio.Nursery, workdir: Path) -> Deployment:
        env = dynamo_env(str(workdir / "kv"))
        port = free_port()
        worker_argv = [self.python, str(HERE / "_dynamo_worker.py"), "--model-path", self.model_dir]
        frontend = await spawn(
            nursery,
            [
                *(self.python, "-m", "dynamo.frontend"),
                *("--http-host", "127.0.0.1", "--http-port", str(port)),
                *self.frontend_args,
            ],
            env,
            name="dynamo-frontend",
            logdir=workdir,
        )
        worker = await spawn(
            nursery,
            [*worker_argv, "--model-name", "bench"],
            env,
            name="dynamo-worker",
            logdir=workdir,
        )
        slow = await spawn(
            nursery,
            [*worker_argv, "--model-name", "slow", "--inter-token-latency-ms", "10"],
            env,
            name="dynamo-slow-worker",
            logdir=workdir,
        )
        return Deployment(port, frontend, [worker], slow)


async def wait_until_serving(deployment: Deployment, within: float = 90.0) -> None:
    """Until both models answer a chat (the workers registered and the frontend routes)."""
    deadline = trio.current_time() + within
    pending = {"bench", "slow"}
    while pending:
        for child in deployment.children:
            if child.process.returncode is not None:
                raise RuntimeError(f"{child.describe()} exited at startup:\n{child.log_tail()}")
        if trio.current_time() > deadline:
            raise RuntimeError(f"models {sorted(pending)} not served after {within:.0f} s")
        try:
            connection = await Connection.open(deployment.port)
        except OSError:
            await trio.sleep(0.2)
            continue
        try:
            for model in sorted(pending):
                with trio.fail_after(10):
                    status, _ = await connection.exchange(
                        "POST", "/v1/chat/completions", chat_body(model, 2, stream=False)
                    )
                if status == 200:
                    pending.discard(model)
        except (ConnectionError, OSError, trio.BrokenResourceError, trio.TooSlowError):
            pass
        finally:
            await connection.aclose()
        if pending:
            await trio.sleep(0.2)


async def learn_shape(port: int, tokens: int, model: str = "bench") -> Shape:
    return Shape(tuple(token_flags(await capture_stream(port, tokens, model), tokens)))


async def capture_stream(port: int, tokens: int, model: str) -> bytes:
    """One whole chat stream of ``tokens`` tokens from the system on ``port``."""
    connection = await Connection.open(port)
    try:
        with trio.fail_after(STEP_TIMEOUT):
            status, body = await connection.exchange(
                "POST", "/v1/chat/completions", chat_body(model, tokens, stream=True)
            )
    finally:
        await connection.aclose()
    if status != 200:
        raise RuntimeError(f"a {tokens}-token stream: HTTP {status}: {body[:300]!r}")
    return body


@contextlib.asynccontextmanager
async def bare_app(
    script: str, body: bytes, workdir: Path, stream: bytes | None = None
) -> AsyncIterator[tuple[int, int]]:
    """Run the baseline app ``script`` (answering ``body``, and ``stream`` if given)
    until the block ends; its port and pid."""
    files = []
    for suffix, content in (("body", body), ("stream", stream)):
        if content is not None:
            files.append(workdir / f"{Path(script).stem}-{suffix}")
            files[-1].write_bytes(content)
    port = free_port()
    env = python_env()
    env["PYTHONPATH"] = str(REPO)
    async with trio.open_nursery() as nursery:
        bare = await spawn(
            nursery,
            [sys.executable, str(HERE / script), str(port), *map(str, files)],
            env,
            name=Path(script).stem.lstrip("_"),
            logdir=workdir,
        )
        try:
            await bare.wait_for("ready")
            yield port, bare.pid
        finally:
            await stop_all([bare], grace=3)


async def bare_health_p50(body: bytes, workdir: Path, samples: int) -> float:
    async with bare_app("_bare_asgi.py", body, workdir) as (port, _):
        p50, answer = await health_p50(port, samples)
    if answer != body:
        raise RuntimeError("the bare app answered other bytes")
    return p50


async def bare_quart_unary(
    port: int, concurrency: int, tokens: int, workdir: Path, duration: float
) -> float:
    """Unary chats/s of a bare quart-trio app (``_bare_quart.py``) answering the bytes
    of one unary chat of the system on ``port``, at ``concurrency``."""
    connection = await Connection.open(port)
    try:
        with trio.fail_after(STEP_TIMEOUT):
            status, answer = await connection.exchange(
                "POST", "/v1/chat/completions", chat_body("bench", tokens, stream=False)
            )
    finally:
        await connection.aclose()
    if status != 200:
        raise RuntimeError(f"a unary chat: HTTP {status}: {answer[:300]!r}")
    async with bare_app("_bare_quart.py", answer, workdir) as (bare_port, _):
        window = await unary_level(
            bare_port, concurrency, tokens=tokens, ramp=0.5, duration=duration, pids={}
        )
    if window.errors:
        raise RuntimeError(f"the bare quart-trio app: {window.errors[0]}")
    return window.completed / window.seconds


BARE_PACED = {"_bare_quart.py": "bare quart-trio app", "_bare_trio.py": "bare trio server"}


async def bare_paced(
    script: str,
    stream: bytes,
    shape: Shape,
    concurrency: int,
    tokens: int,
    workdir: Path,
    duration: float,
    verify_every: int,
) -> Window:
    """The paced window of a baseline (``BARE_PACED``) streaming the events of ``stream``
    (one paced chat of the system measured, of ``shape``), one every 10 ms, at
    ``concurrency``; its CPU under ``"frontend"``."""
    async with bare_app(script, b"{}", workdir, stream) as (bare_port, pid):
        window = await sse_level(
            bare_port,
            shape,
            concurrency,
            tokens=tokens,
            ramp=tokens * 0.010,
            duration=duration,
            verify_every=verify_every,
            pids={"frontend": [pid]},
            model="slow",
        )
    if window.errors or not window.tokens:
        raise RuntimeError(f"{BARE_PACED[script]}, paced: {(window.errors or ['no chunk'])[0]}")
    return window


# ---------------------------------------------------------------------------- one run


def sse_label(n: int) -> str:
    return f"SSE chunks/s, {n} stream{'s' if n > 1 else ''}"


def ttfc_label(n: int) -> str:
    return f"TTFC p50, {n} stream{'s' if n > 1 else ''}"


def ttfc99_label(n: int) -> str:
    return f"TTFC p99, {n} stream{'s' if n > 1 else ''}"


def paced_label(n: int) -> str:
    return f"paced SSE chunks/s, {n} streams"


def paced_ttfc_label(n: int, q: int) -> str:
    """``q`` 0: the label of the level's TTFC samples."""
    return f"paced TTFC p{q}, {n} streams" if q else f"paced TTFC, {n} streams"


def paced_chunk_label(n: int) -> str:
    return f"frontend CPU per SSE chunk, paced, {n} streams"


def paced_worker_label(n: int) -> str:
    return f"worker CPU per SSE chunk, paced, {n} streams"


def bare_paced_label(script: str, n: int) -> str:
    return f"{BARE_PACED[script]}, CPU per SSE chunk, paced, {n} streams"


def client_label(n: int) -> str:
    return f"load generator CPU, {n} stream{'s' if n > 1 else ''}"


def unary_label(n: int) -> str:
    return f"unary req/s, {n} concurrent"


CPU_CHUNK = "frontend CPU per SSE chunk, 32 streams"
CPU_CORE = "frontend CPU, 32 streams"
WORKER_CHUNK = "worker CPU per SSE chunk, 32 streams"
WORKER_CORE = "worker CPU, 32 streams"
OTHERS_CORE = "other processes' CPU, 32 streams"
OTHERS_ALL = "other processes' CPU, all windows"
IDLE_OTHERS = "other processes' CPU before the run"
ERRORS = "errors"
HEALTH = "GET /health p50, keep-alive"
BARE = "bare hypercorn, same bytes, p50"
BARE_QUART = "bare quart-trio app, same unary answer, 32 concurrent"
HEALTH_RATIO = "GET /health / bare hypercorn"
HANG50 = "hang-up -> worker observes, p50"
HANG99 = "hang-up -> worker observes, p99"


async def measure(
    system: System,
    args: argparse.Namespace,
    workdir: Path,
    log: Callable[[str], None],
    samples: dict[str, list[float]],
) -> dict[str, float]:
    """Start ``system``, measure every figure once, stop it; every time to first chunk
    (seconds) is added to ``samples`` under its level's label."""
    results: dict[str, float] = {}
    async with trio.open_nursery() as nursery:
        deployment = await system.start(nursery, workdir)
        try:
            await wait_until_serving(deployment)
            port = deployment.port
            pids = deployment.pids()
            everyone = [pid for group in pids.values() for pid in group]
            shape = await learn_shape(port, args.stream_tokens)
            extra = shape.events - 1 - args.stream_tokens
            log(f"    a stream: {shape.events - 1} data events + [DONE] ({extra} without text)")
            # warm up, and estimate a stream's duration for the ramps
            warm = await sse_level(
                port,
                shape,
                8,
                tokens=args.stream_tokens,
                ramp=0.5,
                duration=1.5,
                verify_every=args.verify_every,
                pids=pids,
            )
            rate = warm.tokens / warm.seconds if warm.tokens else 1000.0
            await settle(everyone)

            p50, body = await health_p50(port, args.health_samples)
            results[HEALTH] = p50
            if not args.no_bare:
                bare = await bare_health_p50(body, workdir, args.health_samples)
                results[BARE] = bare
                results[HEALTH_RATIO] = p50 / bare

            errors: list[str] = []
            others = seconds = 0.0
            for n in args.levels:
                ramp = min(args.max_ramp, max(0.5, n * args.stream_tokens / max(rate, 100.0)))
                window = await sse_level(
                    port,
                    shape,
                    n,
                    tokens=args.stream_tokens,
                    ramp=ramp,
                    duration=args.duration,
                    verify_every=args.verify_every,
                    pids=pids,
                )
                rate = window.tokens / window.seconds
                results[sse_label(n)] = rate
                if window.ttfc:
                    results[ttfc_label(n)] = percentile(window.ttfc, 0.5) * 1000
                    results[ttfc99_label(n)] = percentile(window.ttfc, 0.99) * 1000
                    samples.setdefault(ttfc_label(n), []).extend(window.ttfc)
                results[client_label(n)] = window.cpu["client"] / window.seconds * 100
                if not window.tokens:
                    window.errors.append(f"no chunk arrived in the {n}-stream window")
                elif n == 32:
                    results[CPU_CHUNK] = window.cpu["frontend"] / window.tokens * 1e6
                    results[CPU_CORE] = window.cpu["frontend"] / window.seconds * 100
                    results[WORKER_CHUNK] = window.cpu["worker"] / window.tokens * 1e6
                    results[WORKER_CORE] = window.cpu["worker"] / window.seconds * 100
                    results[OTHERS_CORE] = window.cpu["others"] / window.seconds * 100
                errors += window.errors
                others += window.cpu["others"]
                seconds += window.seconds
                log(
                    f"    {n:>3} streams: {rate:,.0f} chunks/s, TTFC p50 "
                    f"{results.get(ttfc_label(n), math.nan):.1f} ms "
                    f"({len(window.ttfc)} streams sent in the window), frontend "
                    f"{window.cpu['frontend'] / window.seconds:.0%} of a core, worker "
                    f"{window.cpu['worker'] / window.seconds:.0%}, client "
                    f"{window.cpu['client'] / window.seconds:.0%}, other processes "
                    f"{window.cpu['others'] / window.seconds:.0%}"
                )
                await settle(everyone)
            for n in args.unary_levels:
                window = await unary_level(
                    port,
                    n,
                    tokens=args.unary_tokens,
                    ramp=0.5 if n > 1 else 0.2,
                    duration=args.duration,
                    pids=pids,
                )
                results[unary_label(n)] = window.completed / window.seconds
                errors += window.errors
                others += window.cpu["others"]
                seconds += window.seconds
                log(
                    f"    unary {n:>3}: {window.completed / window.seconds:,.0f} req/s, frontend "
                    f"{window.cpu['frontend'] / window.seconds:.0%} of a core "
                    f"({window.cpu['frontend'] / max(window.completed, 1) * 1e6:,.0f} us per "
                    f"request), worker {window.cpu['worker'] / window.seconds:.0%}, client "
                    f"{window.cpu['client'] / window.seconds:.0%}, other processes "
                    f"{window.cpu['others'] / window.seconds:.0%}"
                )
                await settle(everyone)
                if n == 32 and not args.no_bare:
                    bare_rate = await bare_quart_unary(
                        port, n, args.unary_tokens, workdir, args.duration
                    )
                    results[BARE_QUART] = bare_rate
                    log(f"    bare quart-trio app, unary {n}: {bare_rate:,.0f} req/s")
                    await settle(everyone)
            for n in args.paced_levels:
                paced_stream = await capture_stream(port, args.paced_tokens, "slow")
                paced_shape = Shape(tuple(token_flags(paced_stream, args.paced_tokens)))
                window = await sse_level(
                    port,
                    paced_shape,
                    n,
                    tokens=args.paced_tokens,
                    ramp=args.paced_tokens * 0.010,  # one stream's duration
                    duration=args.duration,
                    verify_every=args.verify_every,
                    pids=pids,
                    model="slow",
                )
                if window.tokens:
                    results[paced_label(n)] = window.tokens / window.seconds
                    results[paced_chunk_label(n)] = window.cpu["frontend"] / window.tokens * 1e6
                    results[paced_worker_label(n)] = window.cpu["slow"] / window.tokens * 1e6
                else:
                    window.errors.append(f"no chunk arrived in the {n}-stream paced window")
                if window.ttfc:
                    results[paced_ttfc_label(n, 50)] = percentile(window.ttfc, 0.5) * 1000
                    results[paced_ttfc_label(n, 99)] = percentile(window.ttfc, 0.99) * 1000
                    samples.setdefault(paced_ttfc_label(n, 0), []).extend(window.ttfc)
                errors += window.errors
                others += window.cpu["others"]
                seconds += window.seconds
                log(
                    f"    paced {n:>3}: {results.get(paced_label(n), 0.0):,.0f} chunks/s, TTFC "
                    f"p50/p99 {results.get(paced_ttfc_label(n, 50), math.nan):.1f}/"
                    f"{results.get(paced_ttfc_label(n, 99), math.nan):.1f} ms, frontend "
                    f"{results.get(paced_chunk_label(n), math.nan):.1f} us per chunk, "
                    f"{window.cpu['frontend'] / window.seconds:.0%} of a core, worker "
                    f"{window.cpu['slow'] / window.seconds:.0%}, client "
                    f"{window.cpu['client'] / window.seconds:.0%}, other processes "
                    f"{window.cpu['others'] / window.seconds:.0%}"
                )
                await settle(everyone)
                for script in BARE_PACED if not args.no_bare else ():
                    baseline = await bare_paced(
                        script,
                        paced_stream,
                        paced_shape,
                        n,
                        args.paced_tokens,
                        workdir,
                        args.duration,
                        args.verify_every,
                    )
                    bare_cpu = baseline.cpu["frontend"] / baseline.tokens * 1e6
                    results[bare_paced_label(script, n)] = bare_cpu
                    log(
                        f"    {BARE_PACED[script]}, paced {n}: "
                        f"{baseline.tokens / baseline.seconds:,.0f} chunks/s, "
                        f"{bare_cpu:.1f} us per chunk"
                    )
                    await settle(everyone)
            results[OTHERS_ALL] = others / seconds * 100 if seconds else 0.0
            if args.hangups:
                latencies, missed = await hang_up_latencies(port, deployment.slow, args.hangups)
                if latencies:
                    results[HANG50] = percentile(latencies, 0.5)
                    results[HANG99] = percentile(latencies, 0.99)
                if missed:
                    errors.append(f"{missed} of {args.hangups} hang-ups never seen by the worker")
            if errors:
                log(f"    ERRORS ({len(errors)}): " + "; ".join(sorted(set(errors))[:5]))
            results[ERRORS] = len(errors)
        except BaseException:
            for child in deployment.children:
                tail = child.log_tail()
                if tail:
                    print(f"--- {child.describe()}:\n{tail}", file=sys.stderr)
            raise
        finally:
            with trio.CancelScope(shield=True):
                await stop_all(deployment.children)
            nursery.cancel_scope.cancel()
    return results


# ---------------------------------------------------------------------------- report


def at_least(x: float) -> Callable[[float | None, float | None], str]:
    return lambda _mine, ratio: (
        "-" if ratio is None else (f"{'met' if ratio >= x else 'NOT met'} (>= {x:g}x)")
    )


def at_most_ratio(x: float) -> Callable[[float | None, float | None], str]:
    return lambda _mine, ratio: (
        "-" if ratio is None else (f"{'met' if ratio <= x else 'NOT met'} (<= {x:g}x)")
    )


def at_most_value(x: float, unit: str) -> Callable[[float | None, float | None], str]:
    return lambda mine, _ratio: (
        "-" if mine is None else (f"{'met' if mine <= x else 'NOT met'} (<= {x:g}{unit})")
    )


def figures(args: argparse.Namespace) -> list[Figure]:
    rows = [Figure(sse_label(n), target=at_least(2) if n >= 32 else None) for n in args.levels]
    rows += [
        Figure(label(n), "ms", higher_is_better=False, digits=1, target=at_most_ratio(1))
        for label in (ttfc_label, ttfc99_label)
        for n in args.levels
    ]
    rows += [Figure(unary_label(n), target=at_least(1.5)) for n in args.unary_levels]
    if 32 in args.unary_levels and not args.no_bare:
        rows += [Figure(BARE_QUART, ratio=False)]
    if 32 in args.levels:
        rows += [
            Figure(CPU_CHUNK, "us", False, 1, target=at_most_value(25, " us")),
            Figure(CPU_CORE, "% of a core", False),
            Figure(WORKER_CHUNK, "us", False, 1),
            Figure(WORKER_CORE, "% of a core", False),
        ]
    for n in args.paced_levels:
        rows += [
            Figure(paced_label(n)),
            Figure(paced_ttfc_label(n, 50), "ms", False, 1, target=at_most_ratio(1)),
            Figure(paced_ttfc_label(n, 99), "ms", False, 1, target=at_most_ratio(1)),
            Figure(paced_chunk_label(n), "us", False, 1, target=at_most_ratio(1)),
            Figure(paced_worker_label(n), "us", False, 1),
        ]
        if not args.no_bare:
            rows += [
                Figure(bare_paced_label(script, n), "us", False, 1, ratio=False)
                for script in BARE_PACED
            ]
    rows += [Figure(HEALTH, "ms", False, 2)]
    if not args.no_bare:
        rows += [
            Figure(BARE, "ms", False, 2),
            Figure(HEALTH_RATIO, "x", False, 2, target=at_most_value(1.2, "x")),
        ]
    if args.hangups:
        rows += [Figure(HANG50, "ms", False, 2), Figure(HANG99, "ms", False, 2)]
    rows += [Figure(client_label(n), "% of a core", ratio=False) for n in args.levels]
    if 32 in args.levels:
        rows += [Figure(OTHERS_CORE, "% of a core", ratio=False)]
    rows += [
        Figure(OTHERS_ALL, "% of a core", ratio=False),
        Figure(IDLE_OTHERS, "% of a core", ratio=False),
        Figure(ERRORS, ratio=False),
    ]
    return rows


def choose_systems(args: argparse.Namespace) -> list[System]:
    systems: list[System] = []
    if args.systems in ("both", "trio"):
        systems.append(TrioSystem(TRIO, args.frontend_arg, args.mockers))
        for variant in args.variant:
            label, _, argv = variant.partition("=")
            systems.append(TrioSystem(f"{TRIO} {label}", shlex.split(argv), args.mockers))
    if args.systems in ("both", "dynamo"):
        python = dynamo_python(args.dynamo_venv)
        if python is not None:
            model = dynamo_model_dir(args.dynamo_venv)
            systems.append(DynamoSystem(python, model, args.dynamo_frontend_arg))
        elif args.systems == "dynamo" or args.require_dynamo:
            sys.exit(f"no Dynamo {DYNAMO_VERSION} in {args.dynamo_venv}: run setup_dynamo.sh")
        else:
            print(
                f"(no Dynamo {DYNAMO_VERSION} in {args.dynamo_venv}: dynamo-trio only; "
                "benchmarks/setup_dynamo.sh installs it)",
                file=sys.stderr,
            )
    return systems


async def main(args: argparse.Namespace) -> None:
    systems = choose_systems(args)
    Connection.quickack = args.quickack

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    started = now_stamp()
    log(f"frontend benchmark, {started}; {os.cpu_count()} cores; checkout: {git_describe()}")
    runs: Runs = {s.name: [] for s in systems}
    loads: dict[str, list[str]] = {s.name: [] for s in systems}
    samples: dict[str, dict[str, list[float]]] = {s.name: {} for s in systems}
    with tempfile.TemporaryDirectory(prefix="dynamo-trio-bench-") as tmp:
        for run in range(args.runs):
            for system in systems:
                for attempt in range(args.max_retries + 1):
                    workdir = Path(tmp) / f"run{run + 1}.{attempt}-{system.name.replace(' ', '-')}"
                    workdir.mkdir()
                    idle = await others_while_idle(args.quiet_below, args.quiet_wait, log)
                    before = load_average()
                    log(
                        f"run {run + 1}/{args.runs} {system.name}: load average {before}; "
                        f"other processes {idle:.0%} of a core before it"
                    )
                    t = time.monotonic()
                    kept: dict[str, list[float]] = {}
                    figures_ = await measure_or_exit(system, args, workdir, log, run, kept)
                    figures_[IDLE_OTHERS] = idle * 100
                    after = load_average()
                    log(f"    done in {time.monotonic() - t:.0f} s; load average {after}")
                    if args.keep_logs:
                        copy_logs(workdir, Path(args.keep_logs) / workdir.name)
                    noisy = args.discard_above > 0 and (
                        figures_[OTHERS_ALL] > args.discard_above * 100
                    )
                    if noisy and attempt < args.max_retries:
                        log(
                            f"    discarded: other processes used {figures_[OTHERS_ALL]:.0f}% "
                            "of a core during its windows; again"
                        )
                        continue
                    loads[system.name].append(f"{before.split()[0]}-{after.split()[0]}")
                    runs[system.name].append(figures_)
                    for label, values in kept.items():
                        samples[system.name].setdefault(label, []).extend(values)
                    break

    names = [s.name for s in systems]
    baseline = DYNAMO if DYNAMO in names else (names[0] if len(names) > 1 else None)
    print_table(
        f"frontend, {started}: {args.runs} run(s) per system, alternating "
        f"{' / '.join(names)}; median (min-max) over runs; a ratio is the median of the "
        "per-run ratios",
        figures(args),
        runs,
        names,
        baseline,
    )
    print(
        "load average (1 min) at the start-end of each run: "
        + "; ".join(f"{name}: {', '.join(loads[name])}" for name in names)
    )
    print(
        f"({args.stream_tokens}-token chat streams, {args.unary_tokens}-token unary chats; "
        f"{args.duration:g} s windows after staggered ramps; CPU from /proc over the window; "
        f"/health: {args.health_samples} sequential GETs; "
        f"{args.hangups} hang-ups after the 2nd SSE event; {os.cpu_count()} cores shared"
        + ("; client TCP_QUICKACK on)" if args.quickack else ")")
    )
    if args.json:
        write_json(Path(args.json), args, started, loads, runs, samples)
    if args.ttfc_plot and args.paced_levels:
        label = paced_ttfc_label(max(args.paced_levels), 0)
        plot_ttfc(Path(args.ttfc_plot), label, {n: s.get(label, []) for n, s in samples.items()})
        print(f"({label}: distributions written to {args.ttfc_plot})")


async def measure_or_exit(
    system: System,
    args: argparse.Namespace,
    workdir: Path,
    log: Callable[[str], None],
    run: int,
    samples: dict[str, list[float]],
) -> dict[str, float]:
    """``measure``; a run that fails ends the benchmark, keeping the processes' logs."""
    try:
        return await measure(system, args, workdir, log, samples)
    except* (RuntimeError, OSError, trio.TooSlowError) as failure:
        kept = Path(tempfile.mkdtemp(prefix="dynamo-trio-bench-failed-"))
        copy_logs(workdir, kept)
        for error in leaves(failure):
            log(f"{system.name}: {type(error).__name__}: {error}")
        sys.exit(f"run {run + 1} of {system.name} failed; its logs are in {kept}")
    raise AssertionError("unreachable")


def copy_logs(workdir: Path, destination: Path) -> None:
    destination.mkdir(parents=True, exist_ok=True)
    for log_file in workdir.glob("*.log"):
        (destination / log_file.name).write_bytes(log_file.read_bytes())


def leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    """The exceptions in ``group`` and its nested groups."""
    found: list[BaseException] = []
    for error in group.exceptions:
        if isinstance(error, BaseExceptionGroup):
            found += leaves(error)
        else:
            found.append(error)
    return found


async def others_while_idle(
    below: float, within: float, log: Callable[[str], None], sample: float = 1.0
) -> float:
    """CPU (in cores) the machine's other processes use while no benchmark process runs.

    With ``below`` > 0, waits (up to ``within`` seconds) for a sample under ``below``.
    """
    start = trio.current_time()
    said = -math.inf
    while True:
        busy = machine_busy_seconds()
        await trio.sleep(sample)
        others = (machine_busy_seconds() - busy) / sample
        waited = trio.current_time() - start
        if below <= 0 or others < below or waited >= within:
            if waited >= within and below > 0 and others >= below:
                log(f"    still {others:.0%} after {waited:.0f} s: measuring anyway")
            return others
        if trio.current_time() - said > 30:
            said = trio.current_time()
            log(f"    other processes use {others:.0%} of a core: waiting for under {below:.0%}")
        await trio.sleep(1.0)


def write_json(
    path: Path,
    args: argparse.Namespace,
    started: str,
    loads: dict[str, list[str]],
    runs: Runs,
    samples: dict[str, dict[str, list[float]]],
) -> None:
    record = {
        "date": started,
        "checkout": git_describe(),
        "args": vars(args) | {"dynamo_venv": str(args.dynamo_venv)},
        "load_average": loads,
        "runs": runs,
        "ttfc_seconds": samples,
    }
    path.write_text(json.dumps(record, indent=2))


def plot_ttfc(path: Path, label: str, samples: dict[str, list[float]]) -> None:
    """``label``'s times to first chunk of each system, all runs pooled: a histogram
    (log time axis) above the cumulative distribution, with p50 and p99 marked."""
    try:
        import matplotlib  # only this figure needs it

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"(no plot: `pip install matplotlib` into {sys.executable})", file=sys.stderr)
        return
    shown = {name: sorted(v * 1000 for v in values) for name, values in samples.items() if values}
    if not shown:
        return
    low = max(0.1, min(v[0] for v in shown.values()))
    high = max(v[-1] for v in shown.values())
    bins = [low * (high / low) ** (i / 60) for i in range(61)]
    fig, (hist, cdf) = plt.subplots(2, 1, figsize=(9, 8), sharex=True)
    for name, values in shown.items():
        p50, p99 = percentile(values, 0.5), percentile(values, 0.99)
        text = f"{name}: p50 {p50:.1f} ms, p99 {p99:.1f} ms, n={len(values)}"
        hist.hist(values, bins=bins, histtype="step", linewidth=1.5, label=text)
        line = cdf.plot(values, [(i + 1) / len(values) for i in range(len(values))], label=name)
        cdf.axvline(p99, color=line[0].get_color(), linestyle=":", linewidth=1)
    hist.set_xscale("log")
    hist.set_ylabel("streams")
    hist.set_title(f"{label}: time to first chunk (all runs pooled)")
    hist.legend(fontsize=8)
    cdf.set_xlabel("time to first chunk, ms (log); dotted: p99")
    cdf.set_ylabel("fraction of streams")
    cdf.grid(True, which="both", alpha=0.3)
    cdf.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _levels(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Defaults take about 4-5 minutes with both systems.  Flags for the frontend "
        "take the = form: --frontend-arg=--http-workers=2.",
    )
    parser.add_argument("--runs", type=int, default=3, help="runs per system (default 3)")
    parser.add_argument(
        "--systems",
        choices=["both", "trio", "dynamo"],
        default="both",
        help="both (default: dynamo-trio only when Dynamo is not installed), trio or dynamo",
    )
    parser.add_argument(
        "--dynamo-venv",
        type=Path,
        default=DEFAULT_DYNAMO_VENV,
        help=f"the venv setup_dynamo.sh made (default {DEFAULT_DYNAMO_VENV}; "
        "or DYN_BENCH_DYNAMO_VENV)",
    )
    parser.add_argument(
        "--require-dynamo", action="store_true", help="fail instead of skipping a missing Dynamo"
    )
    parser.add_argument(
        "--frontend-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="an extra argument for `python -m dynamo_trio frontend` (repeatable)",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="LABEL=ARGS",
        help="one more dynamo-trio system, its frontend started with ARGS, e.g. "
        "--variant '2 procs=--http-workers 2' (repeatable)",
    )
    parser.add_argument(
        "--mockers",
        type=int,
        default=1,
        help="mocker processes behind each dynamo-trio frontend (1)",
    )
    parser.add_argument(
        "--dynamo-frontend-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="an extra argument for `python -m dynamo.frontend` (repeatable)",
    )
    parser.add_argument(
        "--duration", type=float, default=4.0, help="seconds each load level is measured (4)"
    )
    parser.add_argument(
        "--max-ramp",
        type=float,
        default=8.0,
        help="longest ramp before a window (8 s; a ramp is one stream's duration, estimated)",
    )
    parser.add_argument(
        "--levels",
        type=_levels,
        default=[1, 32, 128],
        help="concurrent SSE streams (default 1,32,128; '' skips)",
    )
    parser.add_argument(
        "--unary-levels",
        type=_levels,
        default=[1, 32],
        help="concurrent unary chats (default 1,32)",
    )
    parser.add_argument("--stream-tokens", type=int, default=256, help="tokens per stream (256)")
    parser.add_argument("--unary-tokens", type=int, default=16, help="tokens per unary chat (16)")
    parser.add_argument(
        "--paced-levels",
        type=_levels,
        default=[64, 256],
        help="concurrent streams of the 10 ms-per-token model (64,256; '' skips)",
    )
    parser.add_argument(
        "--paced-tokens", type=int, default=100, help="tokens per paced stream (100)"
    )
    parser.add_argument(
        "--verify-every",
        type=int,
        default=16,
        help="parse and check every Nth stream in full (16; every stream's event count is checked)",
    )
    parser.add_argument("--health-samples", type=int, default=500, help="GET /health samples (500)")
    parser.add_argument(
        "--no-bare",
        action="store_true",
        help="skip the baselines: bare hypercorn for /health, bare quart-trio for unary",
    )
    parser.add_argument(
        "--hangups", type=int, default=50, help="hang-up samples per run (50; 0 skips)"
    )
    parser.add_argument(
        "--quiet-below",
        type=float,
        default=0.0,
        metavar="CORES",
        help="before each run, wait until other processes use under CORES (e.g. 0.3) of the "
        "machine's CPU (0: don't wait; the figure is printed either way)",
    )
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=120.0,
        help="longest wait for --quiet-below, in seconds (120)",
    )
    parser.add_argument(
        "--quickack",
        action="store_true",
        help="the load generator sets TCP_QUICKACK around every read: no ~40 ms stalls from "
        "its delayed ACKs meeting a server's Nagle (Dynamo 1.6.1's first SSE chunk on a "
        "keep-alive connection); off by default, as in common HTTP clients",
    )
    parser.add_argument(
        "--discard-above",
        type=float,
        default=0.0,
        metavar="CORES",
        help="measure a system's run again when other processes used more than CORES (e.g. "
        "0.5) of the machine's CPU on average during its load windows (0: keep every run)",
    )
    parser.add_argument(
        "--max-retries",
        type=int,
        default=3,
        help="most times one run is measured again for --discard-above (3); the last is kept",
    )
    parser.add_argument("--json", metavar="PATH", help="also write every run's figures as JSON")
    parser.add_argument(
        "--ttfc-plot",
        metavar="PNG",
        help="plot both systems' TTFC distributions at the largest paced level (matplotlib)",
    )
    parser.add_argument(
        "--keep-logs", metavar="DIR", help="copy every process's stderr log into DIR"
    )
    args = parser.parse_args(argv)
    if min(args.runs, args.verify_every, args.mockers) < 1 or args.duration <= 0:
        parser.error("--runs, --duration, --verify-every and --mockers must be positive")
    if any("=" not in v for v in args.variant):
        parser.error("--variant takes LABEL=ARGS")
    return args


if __name__ == "__main__":
    trio.run(main, parse_args())
