"""A client hanging up on the frontend cancels the work on the worker (SPEC §6, seed phases 1-2).

A real frontend process and a real worker process, which the module's tests share
(so each counts what it adds to the counters, and starts once nothing is in flight);
the client is a raw socket (so the test chooses between a FIN and a reset), httpx,
or the openai client.
Each route's hang-ups by FIN are ``tests/frontend/test_hangups.py``'s (in one
process, over memory streams); the resets and the clients' own closes are here.
"""

from __future__ import annotations

import json
import socket
import struct
import uuid
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import openai
import pytest
import trio

from tests._memhttp import http_client
from tests._metrics import samples, total
from tests._procs import SharedStack, shared_stack, until_idle

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from tests._procs import Served

pytestmark = pytest.mark.slow

# httpx 0.28 (and the openai client on top of it) leaves its chain of nested
# async generators to the garbage collector when a caller abandons a stream
# (encode/httpx#3777), which trio reports as a ResourceWarning.  Abandoning
# streams is the point of the tests marked with this.
abandons_httpx_stream = pytest.mark.filterwarnings(
    "ignore::pytest.PytestUnraisableExceptionWarning"
)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedStack]:
    """One frontend and one model worker for the module (each xdist worker its own):
    starting them is most of what a test of theirs costs."""
    with shared_stack(tmp_path_factory.mktemp("stack")) as stack:
        yield stack


@pytest.fixture
async def running(shared: SharedStack, nursery: trio.Nursery) -> Served:
    """The shared stack, from this test's trio loop, once nothing is in flight on it."""
    return await shared.served(nursery)


async def cancellations(running: Served, **labels: str) -> dict[str, float]:
    """The frontend's cancellations with ``labels`` and in all, and the worker's: a test
    on the shared stack asserts what it adds to them."""
    frontend = await samples(running.url, "dynamo_frontend_model_cancellation_total")
    return {
        "labelled": total(frontend, "dynamo_frontend_model_cancellation_total", **labels),
        "frontend": total(frontend, "dynamo_frontend_model_cancellation_total"),
        "worker": await running.metric("dynamo_component_cancellation_total", worker=True),
    }


async def added(running: Served, before: dict[str, float], **labels: str) -> dict[str, float]:
    """What the cancellation counters have gained since ``before``."""
    after = await cancellations(running, **labels)
    return {name: after[name] - before[name] for name in after}


ROUTES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat_completions": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    "completions": ("/v1/completions", {"prompt": "hi"}),
    "responses": ("/v1/responses", {"input": "hi"}),
    "anthropic_messages": ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}]}),
}


async def open_raw(stack: Served, path: str, body: dict[str, Any], request_id: str) -> Any:
    """Send a POST on a raw socket and return the socket stream, response unread."""
    parts = urlsplit(stack.url)
    assert parts.hostname is not None
    assert parts.port is not None
    stream = await trio.open_tcp_stream(parts.hostname, parts.port)
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {parts.hostname}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        f"x-request-id: {request_id}\r\n\r\n"
    )
    await stream.send_all(head.encode() + data)
    return stream


async def read_until(stream: Any, marker: bytes, count: int) -> bytes:
    received = b""
    with trio.fail_after(10):
        while received.count(marker) < count:
            chunk = await stream.receive_some(65536)
            assert chunk, f"the frontend closed the stream early: {received!r}"
            received += chunk
    return received


async def hang_up(stream: Any, how: str) -> None:
    if how == "rst":
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    await stream.aclose()


async def assert_killed_on_worker(stack: Served, request_id: str, *, within: float = 15.0) -> None:
    """The worker's handler ended ``request_id`` killed for a client disconnect (``within``
    is a hang guard: the state and reason, not a time, say the hang-up did it)."""
    try:
        exit_event = await stack.worker.wait_for("exit", id=request_id, within=within)
    except trio.TooSlowError:
        seen = [event for event in stack.worker.events if event.get("id") == request_id]
        log = stack.frontend.stderr.decode(errors="replace")[-3000:]
        raise AssertionError(
            f"no exit for {request_id} within {within}s; worker saw {seen}; frontend log:\n{log}"
        ) from None
    assert exit_event["state"] == "KILLED", exit_event
    assert exit_event["reason"] == "client disconnect", exit_event
    assert exit_event["how"] in {"Cancelled", "GeneratorExit"}, exit_event


@pytest.mark.parametrize("how", ["rst"])  # a FIN: tests/frontend/test_hangups.py
@pytest.mark.parametrize("route", ["chat_completions", "completions"])
async def test_hang_up_before_the_response_starts_unary(
    running: Served, route: str, how: str
) -> None:
    path, body = ROUTES[route]
    labels = {"endpoint": route, "request_type": "unary", "model": "prefill"}
    before = await cancellations(running, **labels)
    request_id = f"unary-{uuid.uuid4()}"
    stream = await open_raw(running, path, {**body, "model": "prefill"}, request_id)
    await running.worker.wait_for("start", id=request_id)
    await hang_up(stream, how)
    await assert_killed_on_worker(running, request_id)
    counted = await added(running, before, **labels)
    assert counted["labelled"] == 1, counted
    assert counted["worker"] == 1, counted


@pytest.mark.parametrize("how", ["rst"])  # a FIN: tests/frontend/test_hangups.py
@pytest.mark.parametrize("route", list(ROUTES))
async def test_hang_up_mid_stream(running: Served, route: str, how: str) -> None:
    path, body = ROUTES[route]
    labels = {"endpoint": route, "request_type": "stream", "model": "mock"}
    before = await cancellations(running, **labels)
    request_id = f"stream-{uuid.uuid4()}"
    payload = {**body, "model": "mock", "stream": True, "max_tokens": 10_000}
    stream = await open_raw(running, path, payload, request_id)
    await read_until(stream, b"data:", 5)
    await hang_up(stream, how)
    await assert_killed_on_worker(running, request_id)
    counted = await added(running, before, **labels)
    assert counted["labelled"] == 1, counted
    assert await running.metric("dynamo_frontend_inflight_requests") == 0


@abandons_httpx_stream
async def test_httpx_leaving_a_stream_cancels_it(running: Served) -> None:
    request_id = f"httpx-{uuid.uuid4()}"
    async with http_client(running.url) as http:
        body = {"model": "mock", "prompt": "hi", "stream": True, "max_tokens": 10_000}
        headers = {"x-request-id": request_id}
        async with http.stream("POST", "/v1/completions", json=body, headers=headers) as response:
            assert response.headers["x-request-id"] == request_id
            events = 0
            async for line in response.aiter_lines():
                events += line.startswith("data:")
                if events == 3:
                    break
    await assert_killed_on_worker(running, request_id)


@abandons_httpx_stream
async def test_openai_client_closing_a_stream_cancels_it(running: Served) -> None:
    request_id = f"openai-{uuid.uuid4()}"
    client = openai.AsyncOpenAI(base_url=f"{running.url}/v1", api_key="none", max_retries=0)
    async with client:
        stream = await client.chat.completions.create(
            model="mock",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            max_tokens=10_000,
            extra_headers={"x-request-id": request_id},
        )
        chunks = 0
        async for _ in stream:
            chunks += 1
            if chunks == 3:
                break
        await stream.close()
    await assert_killed_on_worker(running, request_id)


async def test_the_frontend_counter_is_exact_over_many_requests(stack: Callable[..., Any]) -> None:
    """On a stack of its own: its worker makes tokens faster than the shared one."""
    running = await stack(inter_token_latency_ms=2.0)
    cancelled = 0
    async with http_client(running.url, timeout=30) as http:

        async def complete(i: int) -> None:
            body = {"model": "mock", "prompt": f"p{i}", "max_tokens": 5, "stream": i % 2 == 0}
            response = await http.post("/v1/completions", json=body)
            assert response.status_code == 200

        async def abandon(i: int) -> None:
            nonlocal cancelled
            path, body = ROUTES["chat_completions"]
            payload = {**body, "model": "mock", "stream": i % 2 == 0, "max_tokens": 10_000}
            stream = await open_raw(running, path, payload, f"abandon-{i}")
            await running.worker.wait_for("start", id=f"abandon-{i}")
            await hang_up(stream, "rst" if i % 3 else "fin")
            cancelled += 1

        async with trio.open_nursery() as nursery:
            for i in range(60):
                nursery.start_soon(complete, i)
            for i in range(12):
                nursery.start_soon(abandon, i)
    for i in range(12):
        await assert_killed_on_worker(running, f"abandon-{i}")
    assert cancelled == 12
    assert await running.metric("dynamo_frontend_model_cancellation_total") == 12
    assert await running.metric("dynamo_component_cancellation_total", worker=True) == 12
    succeeded = await running.metric("dynamo_frontend_requests_total", status="success")
    assert succeeded == 60


# ---------------------------------------------------------------------------- media

LONG_INPUT = "x" * 4000
"""Speech that takes minutes to say: 2000 chunks, a step each."""


def assert_counted_once(counted: dict[str, float]) -> None:
    """One cancellation with the request's labels, none with another, one on the worker."""
    assert counted["labelled"] == 1, counted
    assert counted["frontend"] == 1, ("no other label", counted)
    assert counted["worker"] == 1, counted


async def test_hang_up_during_a_unary_images_steps(running: Served) -> None:
    labels = {"endpoint": "images", "request_type": "unary", "model": "mock-image"}
    before = await cancellations(running, **labels)
    request_id = f"image-steps-{uuid.uuid4()}"
    body = {"model": "mock-image", "prompt": "hi", "nvext": {"num_inference_steps": 1000}}
    stream = await open_raw(running, "/v1/images/generations", body, request_id)
    await running.worker.wait_for("start", id=request_id)
    await hang_up(stream, "rst")
    await assert_killed_on_worker(running, request_id)
    exit_event = await running.worker.wait_for("exit", id=request_id)
    assert (exit_event["how"], exit_event["items"]) == ("Cancelled", 0), "cancelled in a step"
    assert_counted_once(await added(running, before, **labels))


async def read_bytes(stream: Any, count: int) -> bytes:
    """The response's first ``count`` bytes after its head (more may come with them)."""
    received = b""
    with trio.fail_after(10):
        while len(received.partition(b"\r\n\r\n")[2]) < count:
            chunk = await stream.receive_some(65536)
            assert chunk, f"the frontend closed the stream early: {received[:300]!r}"
            received += chunk
    return received


MID_STREAM: dict[str, tuple[str, dict[str, Any], Callable[[Any], Any]]] = {
    "video-sse": (
        "/v1/videos",
        {"model": "mock-video", "prompt": "hi", "stream": True, "nvext": {"num_frames": 5000}},
        lambda stream: read_until(stream, b"data:", 3),
    ),
    "video-mjpeg": (
        "/v1/videos/stream",
        {"model": "mock-video", "prompt": "hi", "size": "16x16", "nvext": {"num_frames": 5000}},
        lambda stream: read_until(stream, b"--frame\r\n", 3),
    ),
    "speech-stream": (
        "/v1/audio/speech",
        {"model": "mock-speech", "input": LONG_INPUT},
        lambda stream: read_bytes(stream, 3 * 4800),
    ),
}


@pytest.mark.parametrize("how", ["rst"])  # a FIN: tests/frontend/test_hangups.py
@pytest.mark.parametrize("route", list(MID_STREAM))
async def test_media_hang_up_mid_stream(running: Served, route: str, how: str) -> None:
    path, body, read_some = MID_STREAM[route]
    endpoint = "audios" if route.startswith("speech") else "videos"
    labels = {"endpoint": endpoint, "request_type": "stream", "model": str(body["model"])}
    before = await cancellations(running, **labels)
    request_id = f"media-mid-{uuid.uuid4()}"
    stream = await open_raw(running, path, body, request_id)
    await read_some(stream)
    await hang_up(stream, how)
    await assert_killed_on_worker(running, request_id)
    exit_event = await running.worker.wait_for("exit", id=request_id)
    assert 3 <= exit_event["items"] < 2000, exit_event
    assert_counted_once(await added(running, before, **labels))
    assert await running.metric("dynamo_frontend_inflight_requests") == 0


COMPLETE: dict[str, tuple[str, dict[str, Any], bytes | None]] = {
    # route: (path, body, the response's last bytes; None: as many as its Content-Length)
    "image": (
        "/v1/images/generations",
        {"model": "mock-image", "prompt": "hi", "size": "8x8"},
        b"}",
    ),
    "speech-unary": ("/v1/audio/speech", {"model": "mock-speech", "input": "hi", "speed": 2}, None),
    "speech-stream": ("/v1/audio/speech", {"model": "mock-speech", "input": "hi"}, b"0\r\n\r\n"),
    "video-json": ("/v1/videos", {"model": "mock-video", "prompt": "hi", "size": "8x8"}, b"}"),
    "video-sse": (
        "/v1/videos",
        {"model": "mock-video", "prompt": "hi", "size": "8x8", "stream": True},
        b"data: [DONE]\n\n",
    ),
    "video-mjpeg": (
        "/v1/videos/stream",
        {"model": "mock-video", "prompt": "hi", "size": "8x8"},
        b"--frame--\r\n",
    ),
}


def whole(received: bytes, last: bytes | None) -> bool:
    """Whether ``received`` holds a response's head and its body up to ``last``."""
    head, found, body = received.partition(b"\r\n\r\n")
    if not found:
        return False
    if last is not None:
        return last in body
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return len(body) == length


@pytest.mark.parametrize("route", list(COMPLETE))
async def test_a_complete_media_response_closed_at_once_is_not_counted(
    running: Served, route: str
) -> None:
    path, body, last = COMPLETE[route]
    before = await cancellations(running)
    request_id = f"media-done-{uuid.uuid4()}"
    stream = await open_raw(running, path, body, request_id)
    exit_event = await running.worker.wait_for("exit", id=request_id)
    received = b""
    with trio.fail_after(10):
        while not whole(received, last):
            chunk = await stream.receive_some(65536)
            assert chunk, received[:300]
            received += chunk
    assert received.startswith(b"HTTP/1.1 200"), received[:300]
    await hang_up(stream, "rst")
    assert (exit_event["how"], exit_event["state"]) == ("returned", "LIVE"), exit_event
    await until_idle((running.url, "dynamo_frontend_inflight_requests"))
    counted = await added(running, before)
    assert counted["frontend"] == 0, counted
    assert counted["worker"] == 0, counted
