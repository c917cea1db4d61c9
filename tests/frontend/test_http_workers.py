"""``--http-workers N``: one port served by N frontend processes, counted as one."""

from __future__ import annotations

import json
import os
import signal
from typing import TYPE_CHECKING, Any

import pytest
import trio

from tests._memhttp import http_client
from tests._metrics import scrape as metric
from tests._procs import start_frontend, start_model_worker

from .conftest import CHAT_BODY, MODELS, children_of, raw_post, wait_for_models

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from tests._procs import Proc

pytestmark = pytest.mark.slow


async def start(
    spawn: Callable[..., Any], env: dict[str, str], tmp: Path | None = None
) -> tuple[Proc, str]:
    """A model worker and ``--http-workers 2`` (the supervisor's temporary files in ``tmp``)."""
    await start_model_worker(spawn, env, inter_token_latency_ms=5)
    return await start_frontend(
        spawn,
        env,
        "--http-workers",
        "2",
        frontend_env={"TMPDIR": str(tmp)} if tmp is not None else None,
    )


async def open_stream(url: str, tokens: int) -> trio.SocketStream:
    """A streaming chat on its own connection (the kernel picks the process), first event read."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    body = json.dumps({**CHAT_BODY, "max_tokens": tokens, "stream": True}).encode()
    await stream.send_all(raw_post("/v1/chat/completions", body))
    received = b""
    with trio.fail_after(10):
        while b"data: " not in received:
            received += await stream.receive_some(4096)
    return stream


async def test_two_processes_share_the_port_and_count_as_one(
    spawn: Callable[..., Any], env: dict[str, str], tmp_path: Path
) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    supervisor, url = await start(spawn, env, tmp)
    assert [path.name[:21] for path in tmp.iterdir()] == ["dynamo-trio-frontend-"]
    assert len(children_of(supervisor.process.pid)) == 2

    # Long streams on 12 connections: the kernel spreads them over both processes,
    # and /debug/requests on either one lists them all.
    streams = [await open_stream(url, 5000) for _ in range(12)]
    async with http_client(url) as http:
        for _ in range(3):  # ask whichever process the kernel picks, several times
            listed = (await http.get("/debug/requests")).json()
            assert len(listed) == 12
            assert {tree["attributes"]["http_worker"] for tree in listed} == {"0", "1"}
    for stream in streams:  # 12 hang-ups, wherever they were served
        await stream.aclose()

    # 20 unary requests on fresh connections too.
    for _ in range(20):
        async with http_client(url) as http:
            response = await http.post("/v1/chat/completions", json={**CHAT_BODY, "max_tokens": 2})
            assert response.status_code == 200
    with trio.fail_after(10):
        while await metric(url, "dynamo_frontend_requests_total") < 32:  # noqa: ASYNC110
            await trio.sleep(0.05)
    for _ in range(4):  # the same sums from whichever process answers
        assert await metric(url, "dynamo_frontend_model_cancellation_total") == 12
        assert await metric(url, "dynamo_frontend_requests_total", status="success") == 20
        assert await metric(url, "dynamo_frontend_inflight_requests") == 0

    supervisor.signal(signal.SIGTERM)
    assert await supervisor.wait_exit(within=20) == 0
    assert list(tmp.iterdir()) == []  # the shared metrics and sockets are gone


async def test_a_crashed_process_is_restarted_and_its_counts_are_kept(
    spawn: Callable[..., Any], env: dict[str, str]
) -> None:
    supervisor, url = await start(spawn, env)
    for _ in range(6):
        async with http_client(url) as http:
            response = await http.post("/v1/chat/completions", json={**CHAT_BODY, "max_tokens": 1})
            assert response.status_code == 200
    [first, second] = children_of(supervisor.process.pid)
    os.kill(first, signal.SIGKILL)
    with trio.fail_after(30):
        while first in (children := children_of(supervisor.process.pid)) or len(children) < 2:  # noqa: ASYNC110 - other processes
            await trio.sleep(0.1)
    assert second in children
    await wait_for_models(url, MODELS, within=30)
    for _ in range(6):
        async with http_client(url) as http:
            response = await http.post("/v1/chat/completions", json={**CHAT_BODY, "max_tokens": 1})
            assert response.status_code == 200
    assert await metric(url, "dynamo_frontend_requests_total", status="success") == 12
    assert b"restarting" in supervisor.stderr
    supervisor.signal(signal.SIGTERM)
    assert await supervisor.wait_exit(within=20) == 0


async def test_processes_whose_supervisor_was_killed_drain_and_exit(
    spawn: Callable[..., Any], env: dict[str, str], tmp_path: Path
) -> None:
    """SIGKILL leaves the supervisor no chance to pass a signal on: its processes see it
    gone and drain on their own, instead of serving the port for ever, and the last
    of them removes the supervisor's directory."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    frontend, url = await start(spawn, env, tmp)
    assert len(list(tmp.iterdir())) == 1
    processes = children_of(frontend.process.pid)
    assert len(processes) == 2
    frontend.process.kill()
    await frontend.process.wait()
    with trio.fail_after(10):
        while any([await trio.Path(f"/proc/{pid}").exists() for pid in processes]):  # noqa: ASYNC110
            await trio.sleep(0.1)
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with pytest.raises(OSError, match="all attempts to connect"):  # nobody serves the port
        await trio.open_tcp_stream(host, int(port))
    assert list(tmp.iterdir()) == []  # nothing left behind
