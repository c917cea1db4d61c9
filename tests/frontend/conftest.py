"""The frontend's functional tests: a real frontend process and a real model worker, over HTTP.

The processes come from the multi-process harness of ``tests/e2e`` (its
``spawn`` and ``env`` fixtures are re-exported here); :func:`stack` is that
harness's stack, started faster (worker and frontend at once) and able to give
the frontend its own environment (``DYN_HTTP_MAX_BODY_SIZE``...).  No test
abandons a stream, so none needs the e2e suite's ``abandons_httpx_stream``.

The helpers below read the wire: SSE blocks as the server wrote them, and the
error bodies of the two API families.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import trio

from tests.e2e.conftest import (
    MODEL_WORKER,
    Proc,
    Stack,
    env as env,
    spawn as spawn,
)

MODELS = frozenset(
    {
        "mock",
        "mock-embed",
        "prefill",
        "stall",
        "slow-embed",
        "mock-image",
        "mock-video",
        "mock-speech",
    }
)
"""What ``tests/e2e/_model_worker.py`` registers."""

CHAT_BODY: dict[str, Any] = {"model": "mock", "messages": [{"role": "user", "content": "hi"}]}

# The openai client stops reading a stream at ``data: [DONE]`` (or at an error
# event) by breaking out of, or raising through, its own chain of event
# generators (``openai._streaming.AsyncStream.__stream__``) without closing
# them, so even a stream read to its end leaves that chain (openai, httpx2,
# httpcore2) to the garbage collector.  Those generators, by name, and nothing else.
_OPENAI_CLIENT_GENERATORS = "|".join(
    (
        r"AsyncStream\.(_iter_events|__stream__)",
        r"SSEDecoder\.aiter_bytes",
        r"Response\.aiter_(bytes|raw|text|lines)",
        r"(BoundAsyncStream|AsyncResponseStream|PoolByteStream|HTTP11ConnectionByteStream)\.__aiter__",
        r"AsyncHTTP11Connection\._receive_response_body",
    )
)
openai_client_leaves_generators = pytest.mark.filterwarnings(
    rf"ignore:Exception ignored in. <async_generator object ({_OPENAI_CLIENT_GENERATORS}) at"
    r":pytest.PytestUnraisableExceptionWarning"
)

StartStack = Callable[..., Awaitable[Stack]]


async def _frontend_url(frontend: Proc, *, within: float = 15) -> str:
    """The URL a frontend process (or ``run``, or a supervisor) says it listens on."""
    with trio.fail_after(within):
        while not any("listening on" in line for line in frontend.stdout_lines):
            if frontend.stdout_closed:
                raise AssertionError(frontend.stderr.decode(errors="replace")[-3000:])
            await frontend._changed.wait()
    line = next(line for line in frontend.stdout_lines if "listening on" in line)
    return line.rsplit(" ", 1)[1]


async def listed_models(url: str) -> set[str]:
    async with httpx.AsyncClient(base_url=url) as http:
        response = await http.get("/v1/models")
    assert response.status_code == 200, response.text
    return {model["id"] for model in response.json()["data"]}


async def wait_for_models(url: str, expected: frozenset[str] | set[str], *, within: float) -> float:
    """Poll ``/v1/models`` until it lists exactly ``expected``; return how long it took."""
    started = trio.current_time()
    with trio.fail_after(within):
        while await listed_models(url) != expected:  # noqa: ASYNC110 - polls another process
            await trio.sleep(0.02)
    return trio.current_time() - started


@pytest.fixture
async def stack(spawn: Callable[..., Any], env: dict[str, str]) -> StartStack:
    """``await stack(*frontend_flags, inter_token_latency_ms=, frontend_env=)``: a running stack.

    Returns once the frontend lists every model of the worker.
    """

    async def start(
        *frontend_flags: str,
        inter_token_latency_ms: float = 20.0,
        frontend_env: dict[str, str] | None = None,
    ) -> Stack:
        worker = await spawn(
            str(MODEL_WORKER),
            "--inter-token-latency-ms",
            str(inter_token_latency_ms),
            env=env,
            name="model worker",
        )
        frontend = await spawn(
            "-m",
            "dynamo_trio.frontend",
            "--http-port",
            "0",
            *frontend_flags,
            env={**env, **(frontend_env or {})},
            name="frontend",
        )
        ready = await worker.wait_for("ready", within=15)
        url = await _frontend_url(frontend)
        await wait_for_models(url, MODELS, within=15)
        return Stack(frontend, worker, url, ready["status_url"])

    return start


# ---------------------------------------------------------------------------- SSE


@dataclass
class Sse:
    """One SSE block as sent: its ``event:`` name, joined ``data:`` lines, and comments."""

    event: str | None = None
    data: str | None = None
    comments: list[str] = field(default_factory=list)

    def json(self) -> Any:
        assert self.data is not None, self
        return json.loads(self.data)


def parse_sse(text: str) -> list[Sse]:
    """The blocks of an SSE body, in order (strict: every line must be a known field)."""
    assert text.endswith("\n\n"), f"an SSE body ends with a blank line: {text[-200:]!r}"
    blocks = []
    for raw in text[:-2].split("\n\n"):
        block = Sse()
        data: list[str] = []
        for line in raw.split("\n"):
            if line.startswith(":"):
                block.comments.append(line[1:].strip())
            elif line.startswith("event: "):
                assert block.event is None, raw
                block.event = line.removeprefix("event: ")
            elif line.startswith("data: "):
                data.append(line.removeprefix("data: "))
            else:
                raise AssertionError(f"unexpected SSE line {line!r} in {raw!r}")
        block.data = "\n".join(data) if data else None
        blocks.append(block)
    return blocks


# ---------------------------------------------------------------------------- errors


def assert_no_traceback(text: str) -> None:
    assert "Traceback" not in text, text
    assert 'File "' not in text, text


def assert_openai_error(
    response: httpx.Response, status: int, error_type: str, **expected: Any
) -> dict[str, Any]:
    """``response`` is an OpenAI-shaped JSON error; ``expected`` pins ``param``, ``code``...

    Returns the ``error`` object.
    """
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json", response.headers
    assert_no_traceback(response.text)
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str), error
    assert error["message"], error
    assert error["type"] == error_type, error
    for key, value in expected.items():
        assert error[key] == value, (key, error)
    return dict(error)


def assert_anthropic_error(response: httpx.Response, status: int, error_type: str) -> str:
    """``response`` is an Anthropic-shaped JSON error; returns its message."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json", response.headers
    assert_no_traceback(response.text)
    body = response.json()
    assert set(body) == {"type", "error"}, body
    assert body["type"] == "error", body
    assert set(body["error"]) == {"type", "message"}, body
    assert body["error"]["type"] == error_type, body
    message: str = body["error"]["message"]
    assert message, body
    return message


# ---------------------------------------------------------------------------- raw sockets


@dataclass
class RawResponse:
    status: int
    headers: dict[bytes, bytes]
    body: bytes
    raw: bytes


class RawConnection:
    """One HTTP/1.1 connection driven byte by byte (for what httpx will not send)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self._buffer = b""

    @classmethod
    async def open(cls, url: str) -> RawConnection:
        parts = urlsplit(url)
        assert parts.hostname is not None
        assert parts.port is not None
        return cls(await trio.open_tcp_stream(parts.hostname, parts.port))

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def response(self, *, within: float = 5.0) -> RawResponse:
        """The next response, whose body has a ``Content-Length``."""
        with trio.fail_after(within):
            while True:
                head, found, body = self._buffer.partition(b"\r\n\r\n")
                if found:
                    response = _parse_head(head, body, self._buffer)
                    length = int(response.headers[b"content-length"])
                    if len(body) >= length:
                        self._buffer = body[length:]
                        response.body = body[:length]
                        return response
                chunk = await self.stream.receive_some(65536)
                assert chunk, f"the frontend closed the connection early: {self._buffer!r}"
                self._buffer += chunk

    async def aclose(self) -> None:
        await self.stream.aclose()


async def raw_exchange(url: str, request: bytes) -> RawResponse:
    """Send raw HTTP/1.1 bytes on a new connection and read one response."""
    connection = await RawConnection.open(url)
    try:
        await connection.send(request)
        return await connection.response()
    finally:
        await connection.aclose()


def _parse_head(head: bytes, body: bytes, raw: bytes) -> RawResponse:
    status_line, *lines = head.split(b"\r\n")
    match = re.fullmatch(rb"HTTP/1\.1 (\d{3})(?: .*)?", status_line)
    assert match, status_line
    headers = {}
    for line in lines:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    return RawResponse(int(match[1]), headers, body, raw)


def raw_post(path: str, body: bytes, *headers: bytes) -> bytes:
    """A ``POST`` with a JSON body and extra raw header lines."""
    head = [
        f"POST {path} HTTP/1.1".encode(),
        b"Host: localhost",
        b"Content-Type: application/json",
        b"Content-Length: " + str(len(body)).encode(),
        *headers,
    ]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def children_of(pid: int) -> list[int]:
    """The process ids whose parent is ``pid`` (from /proc), sorted."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return sorted(found)
