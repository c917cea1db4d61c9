"""What unauthenticated peers can take from a worker (issue 12, item 7), measured.

Run: ``python benchmarks/request_plane_hostile.py``

Starts a real worker process (``benchmarks/_worker.py``, default limits, a
shared token) and attacks its request-plane port from this process:

a. worker RSS while 10 connections each announce a 32 MiB frame and push its
   body, and 5 connections trickle a byte every 2 s (issue 12: 54 -> 384 MB,
   and 539 MB);
b. 1,000 connections trickling a byte every 2 s: how many the worker holds
   open, at most and after 10 s (issue 12: all 1,000);
c. wrong-token guesses judged per second, 50 guessers in parallel from one
   address for 10 s (issue 12: 1,082 per second).

Numbers depend on the machine; the structure of the result does not.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _bootstrap import ensure_project_python

ensure_project_python()

import trio  # noqa: E402

from dynamo_trio.request_plane._frames import (  # noqa: E402
    NONCE_SIZE,
    PROTOCOL_VERSION,
    Auth,
    Challenge,
    Close,
    FrameDecoder,
    Hello,
    encode_frame,
)
from dynamo_trio.request_plane._protocol import client_proof  # noqa: E402

HERE = Path(__file__).parent
TOKEN = "benchmark-token-0123456789"
MiB = 1024 * 1024


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def frame(f: object) -> bytes:
    out = bytearray()
    encode_frame(f, out, MiB)  # type: ignore[arg-type]
    return bytes(out)


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class Sampler:
    """The worker's peak RSS and peak number of open file descriptors."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0.0
        self.peak_fds = 0

    async def run(self) -> None:
        while True:
            self.peak = max(self.peak, rss_mb(self.pid))
            self.peak_fds = max(self.peak_fds, fds(self.pid))
            await trio.sleep(0.05)


async def partial_frame(port: int, stats: dict[str, int]) -> None:
    """Announce a 32 MiB frame and push its body as fast as the worker takes it."""
    try:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
    except OSError:
        stats["refused"] += 1
        return
    chunk = b"\0" * MiB
    try:
        await stream.send_all((32 * MiB).to_bytes(4, "big"))
        for _ in range(32):
            await stream.send_all(chunk)
            stats["sent"] += len(chunk)
    except (trio.BrokenResourceError, OSError):
        stats["cut"] += 1
    finally:
        await stream.aclose()


async def trickler(port: int, every: float, open_now: list[int], cut: list[int]) -> None:
    try:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
    except OSError:
        cut.append(1)
        return
    open_now.append(1)
    try:
        payload = frame(Hello(PROTOCOL_VERSION, b"x" * NONCE_SIZE, "t"))
        for byte in payload * 1000:
            await stream.send_all(bytes([byte]))
            with trio.move_on_after(every):
                if not await stream.receive_some(65536):
                    break  # the worker closed it
    except (trio.BrokenResourceError, OSError):
        pass
    finally:
        open_now.pop()
        cut.append(1)
        await stream.aclose()


async def guess(port: int) -> str:
    nonce = os.urandom(NONCE_SIZE)
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        decoder = FrameDecoder(MiB)
        await stream.send_all(frame(Hello(PROTOCOL_VERSION, nonce, "guesser")))
        while True:
            data = await stream.receive_some(65536)
            if not data:
                return "eof"
            for received in decoder.feed(data):
                if isinstance(received, Challenge):
                    proof = client_proof("wrong guess", received.nonce, nonce)
                    await stream.send_all(frame(Auth(proof)))
                elif isinstance(received, Close):
                    return received.code
                else:
                    return "welcome"


async def main() -> None:
    port = free_port()
    env = {
        **os.environ,
        "DYN_DISCOVERY_BACKEND": "file",
        "DYN_FILE_KV": tempfile.mkdtemp(prefix="hostile-kv-"),
        "DYN_TCP_RPC_PORT": str(port),
        "DYN_REQUEST_PLANE_TOKEN": TOKEN,
        "DYN_LOG": "error",
    }
    worker = await trio.lowlevel.open_process(
        [sys.executable, str(HERE / "_worker.py")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert worker.stdout is not None
        ready = b""
        while b"\n" not in ready:
            ready += await worker.stdout.receive_some(4096)
        json.loads(ready.split(b"\n")[0])
        await trio.sleep(0.5)
        results: dict[str, object] = {}
        idle = rss_mb(worker.pid)
        results["worker RSS idle, MB"] = round(idle, 1)

        sampler = Sampler(worker.pid)
        stats = {"sent": 0, "cut": 0, "refused": 0}
        open_now: list[int] = []
        cut: list[int] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sampler.run)
            for _ in range(5):
                nursery.start_soon(trickler, port, 2.0, open_now, cut)
            async with trio.open_nursery() as senders:
                for _ in range(10):
                    senders.start_soon(partial_frame, port, stats)
            await trio.sleep(8)
            nursery.cancel_scope.cancel()
        results["a. RSS peak, 10 x 32 MiB partial frames + 5 tricklers, MB"] = round(
            sampler.peak, 1
        )
        results["a. 1 MiB body chunks the worker took, in all"] = stats["sent"] // MiB
        results["a. tricklers cut off (of 5)"] = len(cut)

        open_now = []
        cut = []
        idle_fds = fds(worker.pid)
        sampler = Sampler(worker.pid)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sampler.run)
            for _ in range(1000):
                nursery.start_soon(trickler, port, 2.0, open_now, cut)
            await trio.sleep(10)
            results["b. of 1,000 tricklers, open after 10 s"] = len(open_now)
            results["b. most connections the worker held at once"] = sampler.peak_fds - idle_fds
            results["b. worker connections after 10 s"] = fds(worker.pid) - idle_fds
            nursery.cancel_scope.cancel()
        results["b. RSS after the tricklers, MB"] = round(rss_mb(worker.pid), 1)

        judged = {"unauthenticated": 0, "throttled": 0, "other": 0}

        async def guesser() -> None:
            while True:
                try:
                    code = await guess(port)
                except OSError:
                    code = "other"
                judged[code if code in judged else "other"] += 1

        start = time.monotonic()
        async with trio.open_nursery() as nursery:
            for _ in range(50):
                nursery.start_soon(guesser)
            await trio.sleep(10)
            nursery.cancel_scope.cancel()
        elapsed = time.monotonic() - start
        results["c. wrong-token guesses judged per second"] = round(
            judged["unauthenticated"] / elapsed, 2
        )
        results["c. attempts refused unjudged per second (throttled)"] = round(
            judged["throttled"] / elapsed, 1
        )
        print(json.dumps(results, indent=2))
    finally:
        worker.terminate()
        with trio.move_on_after(10):
            await worker.wait()


if __name__ == "__main__":
    trio.run(main)
