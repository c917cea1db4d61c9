"""The frontend's functional tests: a frontend and the model worker of
``tests/e2e/_model_worker.py``, read over HTTP.

:func:`stack` runs both in the test's process (:mod:`tests._serving`): what most
tests need, the frontend's answers.  :func:`proc_stack` starts them as processes
(:mod:`tests._procs`), for what needs processes: signals, a killed worker, logs.
No test abandons a stream, so none needs the e2e suite's ``abandons_httpx_stream``.

The helpers below read the wire: SSE blocks as the server wrote them, and the
error bodies of the two API families.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio

from tests._memhttp import (
    open_connection,
    openai_client_leaves_generators as openai_client_leaves_generators,
)
from tests._procs import (
    MODEL_WORKER as MODEL_WORKER,
    Proc as Proc,
    Stack,
    frontend_url,
    start_stack,
)
from tests._serving import (
    MODELS as MODELS,
    Cluster,
    Served,
    listed_models as listed_models,
    serve_stack,
    wait_for_models as wait_for_models,
)
from tests.e2e.conftest import env as env, spawn as spawn

if TYPE_CHECKING:
    import httpx

CHAT_BODY: dict[str, Any] = {"model": "mock", "messages": [{"role": "user", "content": "hi"}]}

_frontend_url = frontend_url  # the name tests/kserve and tests/engines import

StartStack = Callable[..., Awaitable[Served]]
StartProcStack = Callable[..., Awaitable[Stack]]


def _inline(fn: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    async def run(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return run


@pytest.fixture(autouse=True)
def _sdk_platform_inline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The openai client looks its platform up in a worker thread on its first request.
    On the autojump clock, the thread's real time lets virtual time run through every
    deadline (on a busy machine a test's bound fired while the thread ran): the lookup
    runs inline instead, as any other blocking call of the SDK does."""
    import openai._base_client

    monkeypatch.setattr(openai._base_client, "asyncify", _inline)


@pytest.fixture
def anthropic_inline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same for the anthropic client, which the tests that use it import themselves
    (the slowest import of the suite, so a pytest worker that runs none skips it)."""
    import anthropic._base_client

    monkeypatch.setattr(anthropic._base_client, "asyncify", _inline)


@pytest.fixture
async def stack(nursery: trio.Nursery, env: dict[str, str]) -> StartStack:
    """``await stack(*frontend_flags, inter_token_latency_ms=, frontend_env=, memory=)``: a
    frontend and a model worker serving in this process, once the frontend lists every
    model (``memory=True``: over memory streams, see :mod:`tests._serving`)."""

    async def start(
        *frontend_flags: str,
        inter_token_latency_ms: float = 20.0,
        frontend_env: dict[str, str] | None = None,
        memory: bool = False,
    ) -> Served:
        return await serve_stack(
            nursery,
            env,
            *frontend_flags,
            inter_token_latency_ms=inter_token_latency_ms,
            frontend_env=frontend_env,
            memory=memory,
        )

    return start


@pytest.fixture
def cluster(nursery: trio.Nursery, env: dict[str, str]) -> Cluster:
    """Workers and frontends of the test's own, as their command lines would run them."""
    return Cluster(nursery, env)


@pytest.fixture
def here(nursery: trio.Nursery, env: dict[str, str]) -> Cluster:
    """The frontend, and any worker never signalled, in the test's process: on the
    discovery of the worker processes the test starts (and kills)."""
    return Cluster(nursery, env, processes=True)


@pytest.fixture
async def proc_stack(spawn: Callable[..., Any], env: dict[str, str]) -> StartProcStack:
    """:func:`stack` as two processes (``python -m dynamo_trio.frontend`` and
    ``tests/e2e/_model_worker.py``), for tests of signals, killed workers and logs."""

    async def start(
        *frontend_flags: str,
        inter_token_latency_ms: float = 20.0,
        frontend_env: dict[str, str] | None = None,
    ) -> Stack:
        return await start_stack(
            spawn,
            env,
            *frontend_flags,
            inter_token_latency_ms=inter_token_latency_ms,
            frontend_env=frontend_env,
        )

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

    def __init__(self, stream: trio.abc.HalfCloseableStream) -> None:
        self.stream = stream
        self._buffer = b""

    @classmethod
    async def open(cls, url: str) -> RawConnection:
        return cls(await open_connection(url))  # TCP, or a memory stream

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
