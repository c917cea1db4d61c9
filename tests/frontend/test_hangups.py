"""A client hanging up on any route cancels the work on the worker, counted once.

The in-process stack over memory streams, on the autojump clock: a hang-up here
is the client's end of the connection closing (a FIN); ``tests/e2e``'s
``test_frontend_disconnect`` shows the same across processes, with resets.
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any

import pytest
import trio
import trio.testing

from tests._memhttp import open_connection
from tests.e2e.test_frontend_disconnect import MID_STREAM, ROUTES, read_until

if TYPE_CHECKING:
    from tests._serving import Served

    from .conftest import StartStack

MEDIA: dict[str, tuple[str, str, str, dict[str, Any]]] = {
    # name: (path, endpoint label, request_type, body without model)
    "image": ("/v1/images/generations", "images", "unary", {"prompt": "hi", "size": "16x16"}),
    "image-edit": (
        "/v1/images/edits",
        "images",
        "unary",
        {"prompt": "hi", "size": "16x16", "input_reference": "data:image/png;base64,AA=="},
    ),
    "speech-unary": ("/v1/audio/speech", "audios", "unary", {"input": "hi", "speed": 2}),
    "speech-mp3": (
        "/v1/audio/speech",
        "audios",
        "unary",
        {"input": "hi", "response_format": "mp3"},
    ),
    "speech-stream": ("/v1/audio/speech", "audios", "stream", {"input": "hi"}),
    "speech-pcm": (
        "/v1/audio/speech",
        "audios",
        "stream",
        {"input": "hi", "response_format": "pcm"},
    ),
    "video-json": ("/v1/videos", "videos", "unary", {"prompt": "hi", "size": "16x16"}),
    "video-sse": ("/v1/videos", "videos", "stream", {"prompt": "hi", "stream": True}),
    "video-mjpeg": ("/v1/videos/stream", "videos", "stream", {"prompt": "hi", "size": "16x16"}),
}


async def open_raw(
    running: Served, path: str, body: dict[str, Any], request_id: str
) -> trio.abc.HalfCloseableStream:
    """A POST sent on a new connection, its response unread."""
    stream = await open_connection(running.url)
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        f"x-request-id: {request_id}\r\n\r\n"
    )
    await stream.send_all(head.encode() + data)
    return stream


async def assert_killed_on_worker(running: Served, request_id: str) -> dict[str, Any]:
    try:
        exit_event = await running.worker.wait_for("exit", id=request_id, within=30)
    except trio.TooSlowError:
        seen = [event for event in running.worker.events if event.get("id") == request_id]
        raise AssertionError(
            f"no exit for {request_id}; worker saw {seen}; log:\n{running.log()[-3000:]}"
        ) from None
    assert exit_event["state"] == "KILLED", exit_event
    assert exit_event["reason"] == "client disconnect", exit_event
    assert exit_event["how"] in {"Cancelled", "GeneratorExit"}, exit_event
    return exit_event


async def idle(running: Served) -> None:
    with trio.fail_after(30):  # a hang guard only
        while await running.metric("dynamo_frontend_inflight_requests") != 0:  # noqa: ASYNC110
            await trio.sleep(0.05)


async def assert_counted_once(running: Served, model: str, endpoint: str, kind: str) -> None:
    await idle(running)
    counted = await running.metric(
        "dynamo_frontend_model_cancellation_total",
        endpoint=endpoint,
        request_type=kind,
        model=model,
    )
    assert counted == 1
    assert await running.metric("dynamo_frontend_model_cancellation_total") == 1, "no other label"
    assert await running.metric("dynamo_component_cancellation_total", worker=True) == 1


@pytest.mark.parametrize("route", list(MEDIA))
async def test_media_hang_up_before_the_first_byte(
    stack: StartStack, route: str, autojump_clock: trio.testing.MockClock
) -> None:
    running = await stack(memory=True)
    path, endpoint, request_type, body = MEDIA[route]
    request_id = f"media-first-{uuid.uuid4()}"
    stream = await open_raw(running, path, {**body, "model": "prefill"}, request_id)
    await running.worker.wait_for("start", id=request_id)
    await stream.aclose()
    await assert_killed_on_worker(running, request_id)
    await assert_counted_once(running, "prefill", endpoint, request_type)


@pytest.mark.parametrize("route", list(MID_STREAM))
async def test_media_hang_up_mid_stream(
    stack: StartStack, route: str, autojump_clock: trio.testing.MockClock
) -> None:
    running = await stack(memory=True)
    path, body, read_some = MID_STREAM[route]
    request_id = f"media-mid-{uuid.uuid4()}"
    stream = await open_raw(running, path, body, request_id)
    await read_some(stream)
    await stream.aclose()
    exit_event = await assert_killed_on_worker(running, request_id)
    assert 3 <= exit_event["items"] < 2000, exit_event
    endpoint = "audios" if route.startswith("speech") else "videos"
    await assert_counted_once(running, str(body["model"]), endpoint, "stream")


async def test_stop_policy_lets_a_media_engine_return_at_its_step(
    stack: StartStack, autojump_clock: trio.testing.MockClock
) -> None:
    # A stop grace longer than the hang guards: "STOPPED", not "KILLED", is the engine's
    # doing.
    running = await stack("--on-disconnect", "stop", "--stop-grace", "60", memory=True)
    request_id = f"media-stop-{uuid.uuid4()}"
    path, body, read_some = MID_STREAM["video-mjpeg"]
    stream = await open_raw(running, path, body, request_id)
    await read_some(stream)
    await stream.aclose()
    exit_event = await running.worker.wait_for("exit", id=request_id, within=30)
    # Stopped, not killed: the engine's step wait ended and it returned with what it had.
    assert (exit_event["state"], exit_event["reason"]) == ("STOPPED", "client disconnect")
    assert exit_event["how"] == "returned"
    await assert_counted_once(running, "mock-video", "videos", "stream")


# ---------------------------------------------------------------------------- text


@pytest.mark.parametrize("route", ["chat_completions", "completions"])
async def test_hang_up_before_the_response_starts_unary(
    stack: StartStack, route: str, autojump_clock: trio.testing.MockClock
) -> None:
    running = await stack(memory=True)
    path, body = ROUTES[route]
    request_id = f"unary-{uuid.uuid4()}"
    stream = await open_raw(running, path, {**body, "model": "prefill"}, request_id)
    await running.worker.wait_for("start", id=request_id)
    await stream.aclose()
    await assert_killed_on_worker(running, request_id)
    await assert_counted_once(running, "prefill", route, "unary")


@pytest.mark.parametrize("route", list(ROUTES))
async def test_hang_up_before_the_first_byte_of_a_stream(
    stack: StartStack, route: str, autojump_clock: trio.testing.MockClock
) -> None:
    running = await stack(memory=True)
    path, body = ROUTES[route]
    request_id = f"prefill-{uuid.uuid4()}"
    payload = {**body, "model": "prefill", "stream": True, "max_tokens": 100}
    stream = await open_raw(running, path, payload, request_id)
    await running.worker.wait_for("start", id=request_id)
    await stream.aclose()
    await assert_killed_on_worker(running, request_id)
    await assert_counted_once(running, "prefill", route, "stream")


@pytest.mark.parametrize("route", list(ROUTES))
async def test_hang_up_mid_stream(
    stack: StartStack, route: str, autojump_clock: trio.testing.MockClock
) -> None:
    running = await stack(memory=True)
    path, body = ROUTES[route]
    request_id = f"stream-{uuid.uuid4()}"
    payload = {**body, "model": "mock", "stream": True, "max_tokens": 10_000}
    stream = await open_raw(running, path, payload, request_id)
    await read_until(stream, b"data:", 5)
    await stream.aclose()
    await assert_killed_on_worker(running, request_id)
    await assert_counted_once(running, "mock", route, "stream")


async def test_hang_up_on_embeddings_is_counted_and_cancels(
    stack: StartStack, autojump_clock: trio.testing.MockClock
) -> None:
    running = await stack(memory=True)
    request_id = f"embed-{uuid.uuid4()}"
    stream = await open_raw(
        running, "/v1/embeddings", {"model": "slow-embed", "input": "hi"}, request_id
    )
    await running.worker.wait_for("start", id=request_id)
    await stream.aclose()
    await assert_killed_on_worker(running, request_id)
    await assert_counted_once(running, "slow-embed", "embeddings", "unary")


async def test_stop_policy_lets_the_worker_drain(
    stack: StartStack, autojump_clock: trio.testing.MockClock
) -> None:
    # A stop grace longer than the hang guards: "STOPPED", not "KILLED", is the engine's
    # doing.
    running = await stack("--on-disconnect", "stop", "--stop-grace", "60", memory=True)
    request_id = f"stop-{uuid.uuid4()}"
    path, body = ROUTES["chat_completions"]
    payload = {**body, "model": "mock", "stream": True, "max_tokens": 10_000}
    stream = await open_raw(running, path, payload, request_id)
    await read_until(stream, b"data:", 3)
    await stream.aclose()
    exit_event = await running.worker.wait_for("exit", id=request_id, within=30)
    # Stopped, not killed: the engine finished on its own with a "cancelled" item and usage.
    assert (exit_event["state"], exit_event["reason"]) == ("STOPPED", "client disconnect")
    assert exit_event["how"] == "returned"
    assert exit_event["last"]["finish_reason"] == "cancelled"
    assert exit_event["last"]["usage"]["completion_tokens"] >= 1
    await assert_counted_once(running, "mock", "chat_completions", "stream")
