"""``dynamo-trio run``, the README's quick start: a frontend and N mock workers, as one command.

Run as a user runs it (``python -m dynamo_trio run``, no discovery settings), it
serves, stops on Ctrl-C (SIGINT) with exit status 0, and leaves nothing behind in
the temporary directory; ``--http-workers 2`` serves the port from two frontend
processes.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Any

import pytest
import trio

from tests._memhttp import http_client
from tests.request_plane._harness import wait_until

from .conftest import _frontend_url, children_of, listed_models, parse_sse

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

pytestmark = pytest.mark.slow

MODELS = {"mock-model", "mock-embedding", "mock-image", "mock-video", "mock-speech"}


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            return file.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@pytest.mark.parametrize("http_workers", [1, 2])
async def test_run_serves_stops_on_ctrl_c_and_leaves_nothing_behind(
    spawn: Callable[..., Any], env: dict[str, str], tmp_path: Path, http_workers: int
) -> None:
    tmp = tmp_path / "run-tmp"
    tmp.mkdir()
    # As a user runs it: no discovery settings (run makes its own), temporary files here.
    own = {key: value for key, value in env.items() if key not in ("DYN_FILE_KV",)}
    run = await spawn(
        "-m",
        "dynamo_trio",
        "run",
        "--workers",
        "2",
        "--http-port",
        "0",
        "--http-workers",
        str(http_workers),
        env={**own, "TMPDIR": str(tmp)},
        name="dynamo-trio run",
    )
    url = await _frontend_url(run, within=60)
    # It says when the workers' models are served: at that moment they are listed.
    with trio.fail_after(30):
        while not any(line.startswith("dynamo-trio ready: ") for line in run.stdout_lines):
            assert not run.stdout_closed, run.stderr.decode(errors="replace")[-3000:]
            await run._changed.wait()
    assert await listed_models(url) == MODELS
    ready = next(line for line in run.stdout_lines if line.startswith("dynamo-trio ready: "))
    assert ready == (
        "dynamo-trio ready: mock-embedding, mock-image, mock-model, mock-speech, mock-video "
        f"at {url}"
    )

    pids = children_of(run.process.pid)
    children = [cmdline(pid) for pid in pids]
    assert sum("dynamo_trio.mocker" in line for line in children) == 2
    frontends = sum("dynamo_trio.frontend" in line for line in children)
    assert frontends == (http_workers if http_workers > 1 else 0)  # else: run serves itself

    body = {"model": "mock-model", "messages": [{"role": "user", "content": "hi"}]}
    async with http_client(url, timeout=10) as http:
        for _ in range(4):  # fresh connections: with 2 processes, both are likely asked
            response = await http.post(
                "/v1/chat/completions",
                json={**body, "stream": True, "max_tokens": 5},
                headers={"Connection": "close"},
            )
            assert response.status_code == 200
            events = parse_sse(response.text)
            assert events[-1].data == "[DONE]"
            assert len([event for event in events[:-1] if event.json()["choices"]]) >= 5
        embedded = await http.post("/v1/embeddings", json={"model": "mock-embedding", "input": "x"})
        assert embedded.status_code == 200
        image = {"model": "mock-image", "prompt": "x", "size": "16x16"}
        drawn = await http.post("/v1/images/generations", json=image)
        assert (drawn.status_code, len(drawn.json()["data"])) == (200, 1)
        spoken = await http.post("/v1/audio/speech", json={"model": "mock-speech", "input": "x"})
        assert (spoken.status_code, spoken.content[:4]) == (200, b"RIFF")
        video = {"model": "mock-video", "prompt": "x", "nvext": {"num_frames": 2}}
        filmed = await http.post("/v1/videos/stream", json=video)
        assert (filmed.status_code, filmed.content.count(b"\xff\xd8")) == (200, 2)

    run.signal(signal.SIGINT)
    assert await run.wait_exit(within=30) == 0
    assert [pid for pid in pids if cmdline(pid)] == []  # every process it started is gone
    assert list(tmp.iterdir()) == []  # its discovery directory (and any other) removed


@pytest.mark.parametrize("http_workers", [1, 2])
async def test_run_killed_with_sigkill_takes_every_process_it_started_with_it(
    spawn: Callable[..., Any], env: dict[str, str], tmp_path: Path, http_workers: int
) -> None:
    own = {key: value for key, value in env.items() if key not in ("DYN_FILE_KV",)}
    run = await spawn(
        "-m",
        "dynamo_trio",
        "run",
        "--workers",
        "2",
        "--http-port",
        "0",
        "--http-workers",
        str(http_workers),
        env={**own, "TMPDIR": str(tmp_path)},
        name="dynamo-trio run",
    )
    await _frontend_url(run, within=60)
    with trio.fail_after(30):
        while not any(line.startswith("dynamo-trio ready: ") for line in run.stdout_lines):
            assert not run.stdout_closed, run.stderr.decode(errors="replace")[-3000:]
            await run._changed.wait()
    pids = children_of(run.process.pid)
    assert sum("dynamo_trio.mocker" in cmdline(pid) for pid in pids) == 2

    run.process.kill()  # SIGKILL: nothing of run's own code runs again
    await run.process.wait()
    await wait_until(lambda: not any(cmdline(pid) for pid in pids), 30)
    assert [pid for pid in pids if cmdline(pid)] == []  # every process it started is gone
