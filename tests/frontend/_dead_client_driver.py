"""Dead clients, for real: run inside a private network namespace (``unshare -n``).

``python tests/frontend/_dead_client_driver.py OUT.json SECONDS [WAIT]`` brings the
namespace's loopback up, starts a model worker and a frontend there (with
``DYN_HTTP_DEAD_CLIENT_SECS=SECONDS``), and plays clients whose network then
goes silent: once a request is under way, an nftables rule in the namespace
drops every packet to and from the client's port, in both directions (no FIN,
no RST: a cable pulled).  For each scenario it measures the time from the cut
to the worker's handler being killed, and writes the results, with the
frontend's counters, as JSON.

Scenarios: a unary request during a "prefill" that never ends (nothing is
ever written to the client); a streaming request in the same prefill (before
its first byte); a stream cut mid-generation (the server has data in flight).
The nftables table lives and dies with the namespace: nothing on the host is
touched.

With ``SECONDS`` 0 (detection off) and a ``WAIT``, it is the control: only the
unary scenario, reporting ``detected_after: null`` if the worker was still
serving the dead client ``WAIT`` seconds after the cut.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).parents[2]
sys.path.insert(0, str(ROOT))

from tests.e2e.conftest import MODEL_WORKER, e2e_environment, scrape  # noqa: E402

TABLE = "dt_blackhole"


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def blackhole(port: int) -> None:
    """Drop every packet from or to local TCP port ``port`` (both directions)."""
    sh("nft", "add", "rule", "inet", TABLE, "input", "tcp", "sport", str(port), "drop")
    sh("nft", "add", "rule", "inet", TABLE, "input", "tcp", "dport", str(port), "drop")


async def read_events(process: trio.Process, events: list[dict[str, Any]], lines: list[str]) -> None:
    assert process.stdout is not None
    buffer = b""
    async for chunk in process.stdout:
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        for raw in complete:
            line = raw.decode(errors="replace")
            lines.append(line)
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                events.append(event)


async def wait_for(events: list[dict[str, Any]], within: float, **fields: Any) -> dict[str, Any]:
    with trio.fail_after(within):
        while True:
            for event in events:
                if all(event.get(k) == v for k, v in fields.items()):
                    return event
            await trio.sleep(0.01)


async def open_request(host: str, port: int, path: str, body: dict[str, Any], request_id: str):  # type: ignore[no-untyped-def]
    stream = await trio.open_tcp_stream(host, port)
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nx-request-id: {request_id}\r\n\r\n"
    )
    await stream.send_all(head.encode() + data)
    return stream


async def main(out: Path, seconds: float, control_wait: float | None) -> None:
    sh("ip", "link", "set", "lo", "up")
    sh("nft", "add", "table", "inet", TABLE)
    sh("nft", "add", "chain", "inet", TABLE, "input", "{ type filter hook input priority 0; }")
    tmp = Path(tempfile.mkdtemp(prefix="dead-clients-"))
    env = e2e_environment(tmp, DYN_HTTP_DEAD_CLIENT_SECS=str(seconds))
    results: dict[str, Any] = {"seconds": seconds, "scenarios": {}}
    worker_events: list[dict[str, Any]] = []
    frontend_lines: list[str] = []
    async with trio.open_nursery() as nursery:
        worker = await trio.lowlevel.open_process(
            [sys.executable, str(MODEL_WORKER), "--inter-token-latency-ms", "20"],
            stdout=subprocess.PIPE,
            env=env,
            cwd=ROOT,
        )
        frontend = await trio.lowlevel.open_process(
            [sys.executable, "-m", "dynamo_trio.frontend", "--http-port", "0"],
            stdout=subprocess.PIPE,
            env=env,
            cwd=ROOT,
        )
        nursery.start_soon(read_events, worker, worker_events, [])
        nursery.start_soon(read_events, frontend, [], frontend_lines)
        ready = await wait_for(worker_events, 30, event="ready")
        with trio.fail_after(30):
            while not any("listening on" in line for line in frontend_lines):
                await trio.sleep(0.05)
        url = next(line for line in frontend_lines if "listening on" in line).rsplit(" ", 1)[1]
        host, port = url.removeprefix("http://").rsplit(":", 1)
        await trio.sleep(1.0)  # the frontend sees the worker's models
        chat = {"model": "prefill", "messages": [{"role": "user", "content": "hi"}]}
        scenarios = [
            ("unary prefill", "/v1/chat/completions", chat, 0),
            ("stream prefill", "/v1/chat/completions", {**chat, "stream": True}, 0),
            (
                "mid-stream",
                "/v1/chat/completions",
                {**chat, "model": "mock", "max_tokens": 100_000, "stream": True},
                2048,
            ),
        ]
        if control_wait is not None:
            scenarios = scenarios[:1]
        streams = []
        for name, path, body, read_first in scenarios:
            stream = await open_request(host, int(port), path, body, name)
            streams.append(stream)
            await wait_for(worker_events, 10, event="start", id=name)
            got = b""
            while len(got) < read_first:
                got += await stream.receive_some(65536)
            client_port = stream.socket.getsockname()[1]
            blackhole(client_port)  # from here on the client neither reads nor answers
            cut = time.monotonic()
            if control_wait is not None:
                with trio.move_on_after(control_wait):
                    await wait_for(worker_events, control_wait + 1, event="exit", id=name)
                    results["scenarios"][name] = {"detected_after": time.monotonic() - cut}
                    continue
                results["scenarios"][name] = {"detected_after": None}
                continue
            exit_event = await wait_for(worker_events, 6 * seconds + 30, event="exit", id=name)
            results["scenarios"][name] = {
                "detected_after": round(time.monotonic() - cut, 3),
                "state": exit_event["state"],
                "reason": exit_event["reason"],
            }
        results["frontend_cancellations"] = await scrape(
            url, "dynamo_frontend_model_cancellation_total"
        )
        results["frontend_inflight"] = await scrape(url, "dynamo_frontend_inflight_requests")
        results["worker_cancellations"] = await scrape(
            ready["status_url"], "dynamo_component_cancellation_total"
        )
        for stream in streams:
            stream.socket.close()
        for process in (frontend, worker):
            process.terminate()
        with trio.fail_after(15):
            await frontend.wait()
            await worker.wait()
        nursery.cancel_scope.cancel()
    out.write_text(json.dumps(results))


if __name__ == "__main__":
    assert os.environ.get("DT_IN_NAMESPACE") == "1", "run me through unshare -n (see the test)"
    control = float(sys.argv[3]) if len(sys.argv) > 3 else None
    trio.run(main, Path(sys.argv[1]), float(sys.argv[2]), control)
