"""``examples/engines/asyncio_worker.py`` behind a real frontend: a client hanging up
mid-stream aborts the request in the example's asyncio engine; a stream read to its
end is never aborted."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import pytest
import trio

from tests._memhttp import http_client
from tests.e2e.conftest import ROOT, env as env, spawn as spawn
from tests.e2e.test_llm_examples import open_raw, start_frontend, stop_gracefully, wait_for_line

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = pytest.mark.slow

WORKER = ROOT / "examples" / "engines" / "asyncio_worker.py"


async def test_a_hang_up_aborts_the_request_in_the_asyncio_engine(
    spawn: Callable[..., Any], env: dict[str, str]
) -> None:
    worker = await spawn(str(WORKER), env=env, name="asyncio example worker")
    await wait_for_line(worker, "Worker: serving model echo", within=15)
    url = await start_frontend(spawn, env, "echo")
    body = {"model": "echo", "messages": [{"role": "user", "content": "over and over"}]}
    async with http_client(url, timeout=10) as http:
        short = str(uuid.uuid4())
        response = await http.post(
            "/v1/chat/completions",
            json={**body, "max_tokens": 3},
            headers={"x-request-id": short},
        )
        assert response.json()["choices"][0]["message"]["content"] == "over and over"
    hung_up = str(uuid.uuid4())
    stream = await open_raw(url, "/v1/chat/completions", {**body, "stream": True}, hung_up)
    received = b""
    with trio.fail_after(10):
        while received.count(b"data: ") < 3:
            received += await stream.receive_some(4096)
    await stream.aclose()  # hang up
    line = await wait_for_line(worker, f"Engine: aborted {hung_up}")
    produced = int(line.split(" after ")[1].split()[0])
    assert 2 <= produced < 150  # stopped long before its 150 words
    await stop_gracefully(worker, "Engine: aborted")
    assert not any(short in line and "Engine: aborted" in line for line in worker.stdout_lines)
