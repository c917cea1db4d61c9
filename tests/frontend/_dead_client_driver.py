"""Dead clients, for real: run inside private network and process namespaces (``unshare``).

``python tests/frontend/_dead_client_driver.py OUT.json SECONDS CONTROL_WAIT`` brings
the namespace's loopback up and starts there a model worker and two frontends:
one with ``DYN_HTTP_DEAD_CLIENT_SECS=SECONDS``, the control with ``0`` (off).
It then plays clients whose network goes silent: once their requests are under
way, iptables rules in the namespace drop every packet to and from their ports,
in both directions (no FIN, no RST: a cable pulled).  For each request it
measures the time from the cut to the worker's handler ending, and writes the
results, with the processes' counters, as JSON.

Requests to the frontend with the bound: a unary request during a "prefill"
that never ends (nothing is ever written to the client); a streaming request in
the same prefill (before its first byte); a stream cut mid-generation (the
server has data in flight).  To the control: the unary prefill and the
mid-stream cut, which must still be running ``CONTROL_WAIT`` seconds after the
cut.  The rules live and die with the namespace: nothing on the host is touched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).parents[2]
sys.path.insert(0, str(ROOT))

from tests.e2e.conftest import MODEL_WORKER, e2e_environment, scrape  # noqa: E402

PREFILL = {"model": "prefill", "messages": [{"role": "user", "content": "hi"}]}
GENERATE = {**PREFILL, "model": "mock", "max_tokens": 10_000, "stream": True}
SCENARIOS: list[tuple[str, dict[str, Any], int]] = [
    # (name, body, bytes the client reads before its network goes silent)
    ("unary prefill", PREFILL, 0),
    ("stream prefill", {**PREFILL, "stream": True}, 0),
    ("mid-stream", GENERATE, 2048),
]
CONTROL = ("unary prefill", "mid-stream")


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def blackhole(client_port: int, server_port: int) -> None:
    """Drop every packet between local TCP ports ``client_port`` and ``server_port``, both
    ways (on loopback, every packet passes INPUT once, whichever way it goes).  Both ports
    are named: connect() may give the same ephemeral port to connections to different
    servers (the frontend's own connection to the worker among them)."""
    for source, destination in ((client_port, server_port), (server_port, client_port)):
        sh(
            *("iptables", "-I", "INPUT", "-p", "tcp"),
            *("--sport", str(source), "--dport", str(destination), "-j", "DROP"),
        )


class Process:
    """A child whose stdout lines (and JSON events) are collected."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.lines: list[str] = []
        self.events: list[dict[str, Any]] = []
        self.changed = trio.Event()

    async def read(self) -> None:
        assert self.process.stdout is not None
        buffer = b""
        async for chunk in self.process.stdout:
            buffer += chunk
            *complete, buffer = buffer.split(b"\n")
            for raw in complete:
                line = raw.decode(errors="replace")
                self.lines.append(line)
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if isinstance(event, dict):
                    self.events.append(event)
            self.changed.set()
            self.changed = trio.Event()

    def find(self, **fields: Any) -> dict[str, Any] | None:
        for event in self.events:
            if all(event.get(key) == value for key, value in fields.items()):
                return event
        return None

    async def wait_for(self, within: float, **fields: Any) -> dict[str, Any]:
        with trio.fail_after(within):
            while (event := self.find(**fields)) is None:
                await self.changed.wait()
        return event

    async def url(self) -> str:
        with trio.fail_after(30):
            while not any("listening on" in line for line in self.lines):
                await self.changed.wait()
        return next(line for line in self.lines if "listening on" in line).rsplit(" ", 1)[1]


async def start(nursery: trio.Nursery, env: dict[str, str], *argv: str) -> Process:
    process = Process(
        await trio.lowlevel.open_process(
            [sys.executable, *argv], stdout=subprocess.PIPE, env=env, cwd=ROOT
        )
    )
    nursery.start_soon(process.read)
    return process


async def open_request(url: str, body: dict[str, Any], request_id: str) -> trio.SocketStream:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    data = json.dumps(body).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        f"x-request-id: {request_id}\r\n\r\n"
    )
    await stream.send_all(head.encode() + data)
    return stream


async def wait_for_models(url: str) -> None:
    import httpx

    async with httpx.AsyncClient(base_url=url) as http:
        with trio.fail_after(30):
            while True:
                listed = {model["id"] for model in (await http.get("/v1/models")).json()["data"]}
                if {"mock", "prefill"} <= listed:
                    return
                await trio.sleep(0.05)


async def main(out: Path, seconds: float, control_wait: float) -> None:
    sh("ip", "link", "set", "lo", "up")
    tmp = out.parent / "dead-clients"  # beside the results: in the test's tmp_path
    tmp.mkdir(exist_ok=True)
    # The frontends' connections to the worker must outlive any stall of a busy machine:
    # a request's end is then only ever the frontend's verdict on its client.
    env = e2e_environment(tmp, DYN_HEARTBEAT_TIMEOUT_SECS="60")
    results: dict[str, Any] = {"seconds": seconds, "bounded": {}, "control": {}}
    async with trio.open_nursery() as nursery:
        worker = await start(nursery, env, str(MODEL_WORKER), "--inter-token-latency-ms", "20")
        bounded = await start(
            nursery,
            {**env, "DYN_HTTP_DEAD_CLIENT_SECS": str(seconds)},
            "-m",
            "dynamo_trio.frontend",
            "--http-port",
            "0",
        )
        control = await start(
            nursery,
            {**env, "DYN_HTTP_DEAD_CLIENT_SECS": "0"},
            "-m",
            "dynamo_trio.frontend",
            "--http-port",
            "0",
        )
        ready = await worker.wait_for(30, event="ready")
        urls = {"bounded": await bounded.url(), "control": await control.url()}
        for url in urls.values():
            await wait_for_models(url)

        streams: list[tuple[str, str, trio.SocketStream]] = []
        for group, url in urls.items():
            for name, body, read_first in SCENARIOS:
                if group == "control" and name not in CONTROL:
                    continue
                request_id = f"{group}-{name}".replace(" ", "-")
                stream = await open_request(url, body, request_id)
                streams.append((group, name, stream))
                await worker.wait_for(10, event="start", id=request_id)
                got = b""
                while len(got) < read_first:
                    got += await stream.receive_some(65536)
        # From here on, no client reads or answers anything.
        for _, _, stream in streams:
            blackhole(stream.socket.getsockname()[1], stream.socket.getpeername()[1])
        cut = time.monotonic()

        async def detect(group: str, name: str, within: float) -> None:
            request_id = f"{group}-{name}".replace(" ", "-")
            outcome: dict[str, Any] = {"detected_after": None}
            with trio.move_on_after(within):
                exit_event = await worker.wait_for(within + 1, event="exit", id=request_id)
                outcome = {
                    "detected_after": round(time.monotonic() - cut, 3),
                    "state": exit_event["state"],
                    "reason": exit_event["reason"],
                }
            results[group][name] = outcome

        async with trio.open_nursery() as waiting:
            for group, name, _ in streams:
                waiting.start_soon(detect, group, name, control_wait)
        for group, url in urls.items():
            results[f"{group}_cancellations"] = await scrape(
                url, "dynamo_frontend_model_cancellation_total"
            )
            results[f"{group}_inflight"] = await scrape(url, "dynamo_frontend_inflight_requests")
        results["worker_cancellations"] = await scrape(
            ready["status_url"], "dynamo_component_cancellation_total"
        )
        for _, _, stream in streams:
            stream.socket.close()
        for process in (bounded, control, worker):
            process.process.terminate()
        with trio.fail_after(20):
            for process in (bounded, control, worker):
                await process.process.wait()
        nursery.cancel_scope.cancel()
    await trio.Path(out).write_text(json.dumps(results))


if __name__ == "__main__":
    assert os.environ.get("DT_IN_NAMESPACE") == "1", "run me through unshare (see the test)"
    trio.run(main, Path(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]))
