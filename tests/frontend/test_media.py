"""Images, videos and audio speech in one process: the real pipeline and the mock media engine.

The wire shapes, the files in them (decoded: PNG, JPEG, WAV), what bad input
gets, and how each body ends when its worker fails (before its first item
and after).
"""

from __future__ import annotations

import base64
import io
import json
import wave
from typing import TYPE_CHECKING, Any

import pytest
from PIL import Image

from dynamo_trio.mocker import MediaEngine, MockerSettings

from ._inprocess import MODEL, frontend_with_worker
from .conftest import parse_sse

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    import trio
    from quart_trio import QuartTrio

    from dynamo_trio import Context
    from dynamo_trio.discovery import ModelType

ENGINE = MediaEngine(MockerSettings(media_step_ms=1, denoising_steps=2))
IMAGES = "/v1/images/generations"
EDITS = "/v1/images/edits"
SPEECH = "/v1/audio/speech"
VIDEOS = "/v1/videos"
MJPEG = "/v1/videos/stream"


async def serving(
    nursery: trio.Nursery, model_type: ModelType, handler: Callable[..., Any] | None = None
) -> QuartTrio:
    handlers = {"images": ENGINE.images, "videos": ENGINE.videos, "audios": ENGINE.speech}
    return await frontend_with_worker(
        nursery, handler or handlers[model_type], model_type=model_type
    )


def decoded(data: bytes, image_format: str, size: tuple[int, int]) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    image.load()
    assert (image.format, image.size) == (image_format, size)
    return image


def mjpeg_parts(body: bytes) -> list[tuple[str, bytes]]:
    """The ``(content type, bytes)`` of each part of an MJPEG body, which must be whole."""
    assert body.endswith(b"--frame--\r\n"), body[-80:]
    return parts_of(body.removesuffix(b"--frame--\r\n"))


def parts_of(body: bytes) -> list[tuple[str, bytes]]:
    parts = []
    while body:
        head, _, rest = body.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        assert lines[0] == b"--frame", head
        fields = dict(line.decode().split(": ", 1) for line in lines[1:])
        length = int(fields["Content-Length"])
        assert rest[length : length + 2] == b"\r\n"
        parts.append((fields["Content-Type"], rest[:length]))
        body = rest[length + 2 :]
    return parts


# ---------------------------------------------------------------------------- images


async def test_images_are_pngs_of_the_asked_size(nursery: trio.Nursery) -> None:
    app = await serving(nursery, "images")
    body = {
        "model": MODEL,
        "prompt": "a cat",
        "n": 3,
        "size": "40x24",
        "response_format": "b64_json",
    }
    response = await app.test_client().post(IMAGES, json=body)
    payload = await response.get_json()
    assert response.status_code == 200, payload
    assert set(payload) == {
        "created", "data", "background", "output_format", "size", "quality", "usage"
    }  # fmt: skip
    assert (payload["output_format"], payload["size"]) == ("png", "40x24")
    assert len(payload["data"]) == 3
    pixels = []
    for entry in payload["data"]:
        assert entry["revised_prompt"] == "a cat"
        png = base64.b64decode(entry["b64_json"])
        assert png.startswith(b"\x89PNG\r\n\x1a\n")
        pixels.append(decoded(png, "PNG", (40, 24)).getpixel((0, 0)))
    assert len(set(pixels)) == 3, "each of the n images is its own"


async def test_images_as_jpeg_and_as_urls(nursery: trio.Nursery) -> None:
    app = await serving(nursery, "images")
    body = {"model": MODEL, "prompt": "a dog", "size": "20x12", "output_format": "jpeg"}
    response = await app.test_client().post(IMAGES, json=body)
    payload = await response.get_json()
    assert response.status_code == 200, payload
    (entry,) = payload["data"]
    prefix = "data:image/jpeg;base64,"
    assert entry["url"].startswith(prefix)
    jpeg = base64.b64decode(entry["url"].removeprefix(prefix))
    assert jpeg.startswith(b"\xff\xd8\xff") and jpeg.endswith(b"\xff\xd9")
    decoded(jpeg, "JPEG", (20, 12))


async def test_an_image_edit_needs_its_input_reference(nursery: trio.Nursery) -> None:
    app = await serving(nursery, "images")
    body: dict[str, Any] = {"model": MODEL, "prompt": "bluer", "size": "8x8"}
    refused = await app.test_client().post(EDITS, json=body)
    error = (await refused.get_json())["error"]
    assert (refused.status_code, error["param"]) == (400, "input_reference"), error
    body["input_reference"] = "data:image/png;base64,AAAA"
    response = await app.test_client().post(EDITS, json=body)
    assert response.status_code == 200, await response.get_data(as_text=False)
    assert len((await response.get_json())["data"]) == 1


async def test_unknown_fields_reach_the_worker(nursery: trio.Nursery) -> None:
    seen: list[dict[str, Any]] = []

    async def recording(request: dict[str, Any]) -> AsyncIterator[Any]:
        seen.append(request)
        yield {"data": [{"url": "https://example.invalid/1.png"}]}

    app = await serving(nursery, "images", recording)
    body = {"model": MODEL, "prompt": "p", "moderation": "low", "nvext": {"seed": 7, "x": 1}}
    response = await app.test_client().post(IMAGES, json=body)
    assert response.status_code == 200, await response.get_data(as_text=False)
    (request,) = seen
    assert request["moderation"] == "low"
    assert request["nvext"] == {"seed": 7, "x": 1}
    assert (request["n"], request["size"], request["response_format"]) == (1, "auto", "url")


BAD_INPUT: list[tuple[str, dict[str, Any], str]] = [
    (IMAGES, {"n": 0}, "n"),
    (IMAGES, {"n": 11}, "n"),
    (IMAGES, {"n": "2"}, "n"),
    (IMAGES, {"size": "big"}, "size"),
    (IMAGES, {"size": "0x10"}, "size"),
    (IMAGES, {"size": "5000x10"}, "size"),
    (IMAGES, {"response_format": "png"}, "response_format"),
    (IMAGES, {"output_format": "gif"}, "output_format"),
    (IMAGES, {"output_compression": 101}, "output_compression"),
    (IMAGES, {"quality": "best"}, "quality"),
    (IMAGES, {"nvext": {"num_inference_steps": 0}}, "nvext.num_inference_steps"),
    (IMAGES, {"prompt": None}, "prompt"),
    (IMAGES, {"prompt": ""}, "prompt"),
    (IMAGES, {"model": None}, "model"),
    (IMAGES, {"stream": True}, "stream"),
    (SPEECH, {"input": None}, "input"),
    (SPEECH, {"input": ""}, "input"),
    (SPEECH, {"speed": 0.2}, "speed"),
    (SPEECH, {"speed": 4.5}, "speed"),
    (SPEECH, {"response_format": "ogg"}, "response_format"),
    (SPEECH, {"voice": 3}, "voice"),
    (VIDEOS, {"prompt": None}, "prompt"),
    (VIDEOS, {"size": "auto"}, "size"),
    (VIDEOS, {"seconds": "four"}, "seconds"),
    (VIDEOS, {"seconds": 0}, "seconds"),
    (VIDEOS, {"response_format": "mp4"}, "response_format"),
    (VIDEOS, {"stream": "yes"}, "stream"),
    (VIDEOS, {"nvext": {"fps": 0}}, "nvext.fps"),
    (MJPEG, {"nvext": {"num_frames": 0}}, "nvext.num_frames"),
]
_VALID = {
    IMAGES: {"model": MODEL, "prompt": "p"},
    SPEECH: {"model": MODEL, "input": "hello"},
    VIDEOS: {"model": MODEL, "prompt": "p"},
    MJPEG: {"model": MODEL, "prompt": "p"},
}
_TYPES: dict[str, ModelType] = {
    IMAGES: "images",
    SPEECH: "audios",
    VIDEOS: "videos",
    MJPEG: "videos",
}


@pytest.mark.parametrize(("path", "change", "param"), BAD_INPUT)
async def test_bad_input_is_a_400_naming_its_parameter(
    nursery: trio.Nursery, path: str, change: dict[str, Any], param: str
) -> None:
    seen: list[object] = []

    async def worker(request: object) -> AsyncIterator[Any]:
        seen.append(request)
        yield {}

    app = await serving(nursery, _TYPES[path], worker)
    response = await app.test_client().post(path, json={**_VALID[path], **change})
    payload = await response.get_json()
    assert response.status_code == 400, payload
    assert payload["error"]["param"] == param, payload
    assert payload["error"]["type"] == "invalid_request_error", payload
    assert seen == [], "refused before any worker was called"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (IMAGES, {"prompt": "p", "output_format": "webp"}),
        (SPEECH, {"input": "hello", "response_format": "mp3"}),
    ],
)
async def test_a_format_the_engine_cannot_make_is_its_400(
    nursery: trio.Nursery, path: str, body: dict[str, Any]
) -> None:
    app = await serving(nursery, _TYPES[path])
    response = await app.test_client().post(path, json={"model": MODEL, **body})
    payload = await response.get_json()
    assert response.status_code == 400, payload
    assert "not" in payload["error"]["message"], payload


async def test_a_media_model_serves_only_its_own_routes(nursery: trio.Nursery) -> None:
    app = await serving(nursery, "images")
    response = await app.test_client().post(SPEECH, json={"model": MODEL, "input": "hi"})
    payload = await response.get_json()
    assert response.status_code == 404, payload
    assert "audios" in payload["error"]["message"], payload


# ---------------------------------------------------------------------------- speech


def wav_of(data: bytes) -> wave.Wave_read:
    assert data[:4] == b"RIFF" and data[8:12] == b"WAVE", data[:16]
    reader = wave.open(io.BytesIO(data), "rb")  # noqa: SIM115 (reads from memory; nothing to close)
    assert (reader.getnchannels(), reader.getsampwidth(), reader.getframerate()) == (1, 2, 24000)
    assert reader.getnframes() * 2 == len(data) - 44, "the header's length is the data's"
    return reader


@pytest.mark.parametrize(("speed", "samples"), [(1.0, 4 * 2400), (2.0, 2 * 2400)])
async def test_speech_is_a_wav_of_a_tone(nursery: trio.Nursery, speed: float, samples: int) -> None:
    app = await serving(nursery, "audios")
    body = {"model": MODEL, "input": "eight ch", "speed": speed}
    response = await app.test_client().post(SPEECH, json=body)
    data = await response.get_data(as_text=False)
    assert response.status_code == 200, data
    assert response.headers["Content-Type"] == "audio/wav"
    reader = wav_of(data)
    assert reader.getnframes() == samples
    assert max(reader.readframes(samples)) > 0, "not silence"


async def test_speech_as_pcm_is_the_samples_alone(nursery: trio.Nursery) -> None:
    app = await serving(nursery, "audios")
    body = {"model": MODEL, "input": "four", "response_format": "pcm"}
    response = await app.test_client().post(SPEECH, json=body)
    data = await response.get_data(as_text=False)
    assert (response.status_code, response.headers["Content-Type"]) == (200, "audio/pcm")
    assert len(data) == 2 * 2400 * 2, "0.2 s of 16-bit samples"
    assert not data.startswith(b"RIFF")


# ---------------------------------------------------------------------------- videos


async def test_a_video_as_one_json_object(nursery: trio.Nursery) -> None:
    app = await serving(nursery, "videos")
    body = {
        "model": MODEL,
        "prompt": "waves",
        "size": "32x16",
        "nvext": {"num_frames": 3, "fps": 6},
    }
    response = await app.test_client().post(VIDEOS, json=body, headers={"x-request-id": "v-1"})
    payload = await response.get_json()
    assert response.status_code == 200, payload
    assert payload["id"] == "v-1"
    assert (payload["object"], payload["status"], payload["progress"]) == (
        "video",
        "completed",
        100,
    )
    assert payload["model"] == MODEL
    assert payload["inference_time_s"] >= 0
    (video,) = payload["data"]
    assert (video["output_format"], video["fps"]) == ("mjpeg", 6)
    frames = mjpeg_parts(base64.b64decode(video["b64_json"]))
    assert [kind for kind, _ in frames] == ["image/jpeg"] * 3
    for _, jpeg in frames:
        decoded(jpeg, "JPEG", (32, 16))


async def test_a_video_as_server_sent_events(nursery: trio.Nursery) -> None:
    app = await serving(nursery, "videos")
    body = {"model": MODEL, "prompt": "waves", "size": "16x16", "seconds": "0.5", "stream": True}
    response = await app.test_client().post(VIDEOS, json=body)
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/event-stream")
    events = parse_sse(await response.get_data(as_text=True))
    assert events[-1].data == "[DONE]"
    chunks = [event.json() for event in events[:-1] if event.data is not None]
    assert [chunk["index"] for chunk in chunks] == [0, 1, 2, 3], "0.5 s at 8 fps"
    progress = [chunk["progress"] for chunk in chunks]
    assert progress == sorted(progress) and progress[-1] == 100
    for chunk in chunks:
        assert (chunk["object"], chunk["model"]) == ("video.chunk", MODEL)
        decoded(base64.b64decode(chunk["b64_json"]), "JPEG", (16, 16))


async def test_a_video_as_mjpeg(nursery: trio.Nursery) -> None:
    app = await serving(nursery, "videos")
    body = {"model": MODEL, "prompt": "waves", "size": "24x8", "nvext": {"num_frames": 4}}
    response = await app.test_client().post(MJPEG, json=body)
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "multipart/x-mixed-replace; boundary=frame"
    frames = mjpeg_parts(await response.get_data(as_text=False))
    assert len(frames) == 4
    lit = [decoded(jpeg, "JPEG", (24, 8)).getpixel((20, 4)) for _, jpeg in frames]
    assert lit[-1] != lit[0], "the progress bar fills up"


# ---------------------------------------------------------------------------- failures


def failing_after(item: object | None) -> Callable[..., Any]:
    async def handler(request: object, context: Context) -> AsyncIterator[Any]:
        if item is not None:
            yield item
        raise RuntimeError("the engine broke")

    return handler


_FRAME = {"index": 0, "progress": 50, "b64_json": base64.b64encode(b"\xff\xd8\xff\xd9").decode()}
_AUDIO = {"audio": base64.b64encode(b"RIFF....").decode()}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (IMAGES, {"prompt": "p"}),
        (SPEECH, {"input": "hi"}),
        (VIDEOS, {"prompt": "p", "stream": True}),
        (MJPEG, {"prompt": "p"}),
    ],
)
async def test_a_failure_before_any_output_is_an_http_error(
    nursery: trio.Nursery, path: str, body: dict[str, Any]
) -> None:
    app = await serving(nursery, _TYPES[path], failing_after(None))
    response = await app.test_client().post(path, json={"model": MODEL, **body})
    payload = await response.get_json()
    assert response.status_code == 500, payload
    assert payload["error"]["type"] == "server_error", payload


async def test_a_failure_mid_sse_video_is_an_error_event(nursery: trio.Nursery) -> None:
    app = await serving(nursery, "videos", failing_after(_FRAME))
    body = {"model": MODEL, "prompt": "p", "stream": True}
    response = await app.test_client().post(VIDEOS, json=body)
    events = parse_sse(await response.get_data(as_text=True))
    assert [event.event for event in events] == [None, "error"]
    assert events[0].json()["index"] == 0
    assert events[1].json()["error"]["type"] == "server_error"


async def test_a_failure_mid_mjpeg_ends_with_an_error_part(nursery: trio.Nursery) -> None:
    app = await serving(nursery, "videos", failing_after(_FRAME))
    response = await app.test_client().post(MJPEG, json={"model": MODEL, "prompt": "p"})
    body = await response.get_data(as_text=False)
    assert not body.endswith(b"--frame--\r\n"), "no closing boundary: the video is cut short"
    (frame, error) = parts_of(body)
    assert frame == ("image/jpeg", b"\xff\xd8\xff\xd9")
    assert error[0] == "application/json"
    assert json.loads(error[1])["error"]["type"] == "server_error"


async def test_a_failure_mid_speech_cuts_the_audio_short(nursery: trio.Nursery) -> None:
    app = await serving(nursery, "audios", failing_after(_AUDIO))
    response = await app.test_client().post(SPEECH, json={"model": MODEL, "input": "hi"})
    assert response.status_code == 200, "the response had started"
    assert await response.get_data(as_text=False) == b"RIFF...."
