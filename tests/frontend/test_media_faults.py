"""Media requests end as chat requests do when the server ends them: a deadline, a silent
worker, a drain.  What the client gets depends on how far its body has gone: an HTTP
error before the first byte; after it, SSE's error event, MJPEG's error part (and no
closing boundary), or, for audio, which cannot carry an error, a body cut short.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, cast

import trio

from dynamo_trio._config import FrontendConfig
from dynamo_trio._context import CancelReason
from dynamo_trio.mocker import MediaEngine, MockerSettings

from ._inprocess import MODEL, frontend_and_pipeline, frontend_with_worker
from .conftest import parse_sse
from .test_media import parts_of

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator, Callable

    from quart_trio import QuartTrio

    from dynamo_trio import Context

ENGINE = MediaEngine(MockerSettings(media_step_ms=5))
ENDLESS_VIDEO = {"model": MODEL, "prompt": "p", "size": "8x8", "nvext": {"num_frames": 10_000}}


async def streamed(
    app: QuartTrio, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> bytes:
    """The whole body of a streamed response, read as it comes, until the app ends it
    (quart's ``post`` waits on past a body that a deadline or a drain ended)."""
    async with app.test_client().request(
        path, method="POST", headers={"Content-Type": "application/json", **(headers or {})}
    ) as connection:
        await connection.send(json.dumps(body).encode())
        await connection.send_complete()
        received = b""
        while True:
            try:
                received += await connection.receive()
            except trio.EndOfChannel:
                return received


def recorded(handler: Callable[..., Any], ended: list[Context]) -> Callable[..., Any]:
    """``handler``, appending its context to ``ended`` once it has ended (closing the
    handler's generator when it is closed itself: ``async for`` would leave it to the
    garbage collector, and trio's warning about it to whichever test runs then)."""

    async def wrapped(request: Any, context: Context) -> AsyncIterator[Any]:
        items = handler(request, context)
        try:
            async for item in items:
                yield item
        finally:
            try:
                await items.aclose()
            finally:
                ended.append(context)

    return wrapped


async def one_frame_then_silence(request: Any, context: Context) -> AsyncIterator[Any]:
    frames = cast(
        "AsyncGenerator[Any]", ENGINE.videos({**request, "nvext": {"num_frames": 2}}, context)
    )
    try:
        first = await anext(frames)
    finally:
        await frames.aclose()
    yield first
    await trio.sleep_forever()


async def test_a_deadline_during_an_images_steps_is_a_504(nursery: trio.Nursery) -> None:
    ended: list[Context] = []
    app = await frontend_with_worker(nursery, recorded(ENGINE.images, ended), model_type="images")
    body = {"model": MODEL, "prompt": "p", "nvext": {"num_inference_steps": 1000}}
    headers = {"x-request-timeout": "0.2"}
    response = await app.test_client().post("/v1/images/generations", json=body, headers=headers)
    payload = await response.get_json()
    assert (response.status_code, payload["error"]["type"]) == (504, "timeout_error"), payload
    with trio.fail_after(5):
        while not ended:  # noqa: ASYNC110
            await trio.sleep(0.01)
    assert ended[0].reason is CancelReason.DEADLINE


async def test_a_deadline_mid_mjpeg_ends_it_with_an_error_part(nursery: trio.Nursery) -> None:
    ended: list[Context] = []
    app = await frontend_with_worker(nursery, recorded(ENGINE.videos, ended), model_type="videos")
    headers = {"x-request-timeout": "0.3"}
    body = await streamed(app, "/v1/videos/stream", ENDLESS_VIDEO, headers)
    *frames, (kind, error) = parts_of(body)
    assert frames and all(frame_kind == "image/jpeg" for frame_kind, _ in frames)
    assert kind == "application/json"
    assert json.loads(error)["error"]["type"] == "timeout_error"
    assert ended[0].reason is CancelReason.DEADLINE


async def test_a_deadline_mid_speech_cuts_the_audio_short(nursery: trio.Nursery) -> None:
    app = await frontend_with_worker(nursery, ENGINE.speech, model_type="audios")
    body = {"model": MODEL, "input": "x" * 4000}
    audio = await streamed(app, "/v1/audio/speech", body, {"x-request-timeout": "0.3"})
    promised = int.from_bytes(audio[40:44], "little")
    assert 0 < len(audio) - 44 < promised, "fewer samples than the WAV header says"


async def test_a_silent_worker_mid_sse_video_is_a_timeout_event(nursery: trio.Nursery) -> None:
    app = await frontend_with_worker(
        nursery,
        one_frame_then_silence,
        model_type="videos",
        config=FrontendConfig(backend_stream_timeout=0.2),
    )
    body = {"model": MODEL, "prompt": "p", "size": "8x8", "stream": True}
    events = parse_sse((await streamed(app, "/v1/videos", body)).decode())
    assert [event.event for event in events] == [None, "error"]
    assert events[1].json()["error"]["type"] == "timeout_error"


async def test_a_drain_ends_a_running_mjpeg_with_an_error_part(nursery: trio.Nursery) -> None:
    app, pipeline = await frontend_and_pipeline(nursery, ENGINE.videos, model_type="videos")

    async def end_all_once_running() -> None:
        while pipeline.in_flight == 0:  # noqa: ASYNC110
            await trio.sleep(0.01)
        await trio.sleep(0.05)
        pipeline.begin_drain()
        pipeline.end_all()

    nursery.start_soon(end_all_once_running)
    body = await streamed(app, "/v1/videos/stream", ENDLESS_VIDEO)
    *frames, (kind, error) = parts_of(body)
    assert frames, "the stream had started"
    assert kind == "application/json"
    assert json.loads(error)["error"]["code"] == "service_unavailable"
    refused = await app.test_client().post("/v1/videos/stream", json=ENDLESS_VIDEO)
    assert refused.status_code == 503
