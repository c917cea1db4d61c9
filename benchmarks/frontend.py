"""Frontend benchmarks: a real frontend process and mock-engine worker processes.

Run: ``python benchmarks/frontend.py [--runs 3]``

Measures, and prints the median of ``--runs`` runs:

a. SSE chunks/s and requests/s of streaming chat completions (100 tokens each,
   the mock engine generating as fast as it can) at 1, 32 and 128 concurrent
   streams;
b. latency from a client hanging up mid-stream (the socket closed after the
   second SSE event) to the worker's handler observing the kill
   (p50/p90/p99), beside Dynamo 1.6.1's frontend on this machine
   (hang-up -> Python worker observes p50 ~0.55-1.7 ms, p99 ~0.9-1.9 ms).

The load generator is a minimal h11 client on raw trio sockets, so that its
own CPU cost stays small: every process here shares the same cores.
Latencies across processes use ``time.monotonic()`` (system-wide on Linux).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import h11
import trio
from request_plane import Child, percentile

HERE = Path(__file__).parent


class H11Client:
    """One keep-alive HTTP/1.1 connection, for POSTing and counting SSE events."""

    def __init__(self, stream: trio.SocketStream, host: str) -> None:
        self._stream = stream
        self._host = host
        self._conn = h11.Connection(h11.CLIENT)

    @classmethod
    async def connect(cls, url: str) -> H11Client:
        parts = urlsplit(url)
        assert parts.hostname is not None
        assert parts.port is not None
        return cls(await trio.open_tcp_stream(parts.hostname, parts.port), parts.hostname)

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, int]:
        """POST ``body``; return ``(status, number of SSE data events before [DONE])``."""
        data = json.dumps(body).encode()
        headers = [
            ("Host", self._host),
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(data))),
        ]
        out = self._conn.send(h11.Request(method="POST", target=path, headers=headers))
        out += self._conn.send(h11.Data(data=data)) + self._conn.send(h11.EndOfMessage())
        await self._stream.send_all(out)
        status, events = 0, 0
        while True:
            event = self._conn.next_event()
            if event is h11.NEED_DATA:
                self._conn.receive_data(await self._stream.receive_some(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                events += bytes(event.data).count(b"data: ") - bytes(event.data).count(
                    b"data: [DONE]"
                )
            elif isinstance(event, h11.EndOfMessage):
                self._conn.start_next_cycle()
                return status, events
            elif isinstance(event, h11.ConnectionClosed):
                raise ConnectionError("the frontend closed the connection")

    async def aclose(self) -> None:
        await self._stream.aclose()


async def throughput(url: str, concurrency: int, requests: int) -> tuple[float, float]:
    """(chunks/s, requests/s) of ``requests`` streaming chats over ``concurrency`` connections."""
    body = {
        "model": "bench",
        "messages": [{"role": "user", "content": "benchmark"}],
        "max_tokens": 100,
        "stream": True,
    }
    remaining = requests
    chunks = 0

    async def loop() -> None:
        nonlocal remaining, chunks
        client = await H11Client.connect(url)
        try:
            while remaining > 0:
                remaining -= 1
                status, events = await client.post("/v1/chat/completions", body)
                assert status == 200, status
                chunks += events
        finally:
            await client.aclose()

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(loop)
    elapsed = time.perf_counter() - start
    return chunks / elapsed, requests / elapsed


async def hang_up_latencies(url: str, worker: Child, samples: int) -> list[float]:
    parts = urlsplit(url)
    assert parts.hostname is not None
    assert parts.port is not None
    latencies = []
    for _ in range(samples):
        request_id = str(uuid.uuid4())
        body = json.dumps(
            {
                "model": "slow",
                "messages": [{"role": "user", "content": "hang up on me"}],
                "max_tokens": 10_000,
                "stream": True,
            }
        ).encode()
        stream = await trio.open_tcp_stream(parts.hostname, parts.port)
        await stream.send_all(
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: {parts.hostname}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"x-request-id: {request_id}\r\n\r\n".encode()
            + body
        )
        received = b""
        while received.count(b"data: ") < 2:
            received += await stream.receive_some(65536)
        hung_up_at = time.monotonic()
        await stream.aclose()
        observed = await worker.wait_for("cancelled", id=request_id)
        latencies.append((observed["t"] - hung_up_at) * 1000)
        await trio.sleep(0.01)
    return latencies


async def spawn(nursery: trio.Nursery, argv: list[str], env: dict[str, str]) -> Child:
    process = await trio.lowlevel.open_process(
        [sys.executable, *argv], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env=env
    )
    child = Child(process)
    nursery.start_soon(child.read)
    return child


async def start_frontend(nursery: trio.Nursery, env: dict[str, str]) -> tuple[Child, str]:
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "dynamo_trio.frontend", "--http-port", "0"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        env=env,
    )
    assert process.stdout is not None
    line = b""
    with trio.fail_after(30):
        while b"listening on" not in line:
            line += await process.stdout.receive_some(4096)
    url = line.decode().split("listening on", 1)[1].split()[0]
    child = Child(process)
    nursery.start_soon(child.read)
    return child, url


async def wait_for_models(url: str, names: set[str]) -> None:
    client = await H11Client.connect(url)
    try:
        with trio.fail_after(30):
            while True:
                statuses = [
                    (await client.post("/v1/completions", {"model": name, "prompt": "x"}))[0]
                    for name in sorted(names)
                ]
                if all(status == 200 for status in statuses):
                    return
                await trio.sleep(0.1)
    finally:
        await client.aclose()


async def main(args: argparse.Namespace) -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith("DYN_")}
    env.update(
        DYN_DISCOVERY_BACKEND="file",
        DYN_FILE_KV=tempfile.mkdtemp(prefix="dynamo-bench-"),
        DYN_LOG="warning",
        PYTHONPATH=str(HERE.parent),
    )
    worker_script = str(HERE / "_model_worker.py")
    concurrencies = (1, 32, 128)
    results: dict[str, list[float]] = {}
    async with trio.open_nursery() as nursery:
        fast = await spawn(nursery, [worker_script, "--model-name", "bench"], env)
        slow = await spawn(
            nursery,
            [worker_script, "--model-name", "slow", "--inter-token-latency-ms", "10"],
            env,
        )
        await fast.wait_for("ready")
        await slow.wait_for("ready")
        frontend, url = await start_frontend(nursery, env)
        await wait_for_models(url, {"bench", "slow"})
        await throughput(url, 8, 64)  # warm up
        for run in range(args.runs):
            for concurrency in concurrencies:
                requests = max(args.requests, concurrency * 4)
                chunks_per_s, requests_per_s = await throughput(url, concurrency, requests)
                results.setdefault(f"SSE chunks/s, {concurrency} streams", []).append(chunks_per_s)
                results.setdefault(f"requests/s, {concurrency} streams", []).append(requests_per_s)
            hang_ups = await hang_up_latencies(url, slow, args.hangups)
            for q, key in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
                results.setdefault(f"hang-up -> worker observes, {key} ms", []).append(
                    percentile(hang_ups, q)
                )
            print(f"run {run + 1}/{args.runs} done", file=sys.stderr, flush=True)
        for child in (frontend, fast, slow):
            child.process.send_signal(signal.SIGTERM)
        for child in (frontend, fast, slow):
            await child.process.wait()

    dynamo = {
        "hang-up -> worker observes, p50 ms": "0.55-1.7",
        "hang-up -> worker observes, p99 ms": "0.9-1.9",
    }
    width = max(len(label) for label in results)
    print(f"\nfrontend, {args.runs} runs (median, min .. max); Dynamo 1.6.1 where measured")
    print(f"{'metric':<{width}}  {'median':>10}  {'min .. max':>22}  {'Dynamo 1.6.1':>12}")
    for label, values in results.items():
        digits = 0 if "/s" in label else 2
        median = f"{statistics.median(values):,.{digits}f}"
        spread = f"{min(values):,.{digits}f} .. {max(values):,.{digits}f}"
        print(f"{label:<{width}}  {median:>10}  {spread:>22}  {dynamo.get(label, '-'):>12}")
    print(
        f"(100-token streams; {args.requests}+ requests per level; "
        f"{args.hangups} hang-ups per run, each after the 2nd SSE event, FIN)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--hangups", type=int, default=100)
    trio.run(main, parser.parse_args())
