"""The mock media models: real files of the asked shape, and a stop or kill obeyed within
the step the engine is in."""

from __future__ import annotations

import base64
import io
import wave
from typing import Any

import pytest
import trio
import trio.testing
from PIL import Image

from dynamo_trio import Context
from dynamo_trio.mocker import MediaEngine, MockerSettings
from dynamo_trio.mocker._codecs import jpeg, png

FAST = MediaEngine(MockerSettings(media_step_ms=0, denoising_steps=3))
NEVER = MediaEngine(MockerSettings(media_step_ms=3_600_000))
"""An engine whose step never ends on its own: only the context can end it."""


async def collected(handler: Any, request: dict[str, Any], context: Context) -> list[Any]:
    return [item async for item in handler(request, context)]


def test_the_encoders_make_files_any_decoder_reads() -> None:
    picture = Image.open(io.BytesIO(png(9, 5, lambda y: (y * 50, 0, 255))))
    assert (picture.format, picture.size, picture.getpixel((8, 4))) == (
        "PNG",
        (9, 5),
        (200, 0, 255),
    )
    blocks = Image.open(
        io.BytesIO(jpeg(17, 9, lambda bx, by: (255, 255, 255) if bx else (0, 0, 0)))
    )
    blocks.load()
    assert (blocks.format, blocks.size) == ("JPEG", (17, 9))
    dark, light = blocks.convert("L").getpixel((3, 3)), blocks.convert("L").getpixel((12, 3))
    assert isinstance(dark, int) and isinstance(light, int)
    assert dark < 16 and light > 240


async def test_images_are_n_pictures_of_the_size() -> None:
    request = {"prompt": "p", "n": 2, "size": "12x7", "response_format": "b64_json"}
    [item] = await collected(FAST.images, request, Context())
    assert [entry["revised_prompt"] for entry in item["data"]] == ["p", "p"]
    for entry in item["data"]:
        image = Image.open(io.BytesIO(base64.b64decode(entry["b64_json"])))
        assert (image.format, image.size) == ("PNG", (12, 7))
    assert item["size"] == "12x7"


async def test_videos_report_rising_progress_per_frame() -> None:
    request = {"prompt": "p", "size": "16x16", "seconds": 0.5, "nvext": {"fps": 6}}
    frames = await collected(FAST.videos, request, Context())
    assert [frame["index"] for frame in frames] == [0, 1, 2]
    assert [frame["progress"] for frame in frames] == [33.33, 66.67, 100.0]


@pytest.mark.parametrize(("response_format", "header"), [("wav", 44), ("pcm", 0)])
async def test_speech_is_a_tone_in_chunks(response_format: str, header: int) -> None:
    request = {"input": "x" * 5, "response_format": response_format}
    chunks = await collected(FAST.speech, request, Context())
    audio = b"".join(base64.b64decode(chunk["audio"]) for chunk in chunks)
    assert len(chunks) == 3, "0.25 s in tenths"
    assert len(audio) == header + 2 * 6000
    if header:
        with wave.open(io.BytesIO(audio), "rb") as reader:
            assert reader.getnframes() == 6000


@pytest.mark.parametrize(
    ("handler", "request_body"),
    [
        ("images", {"prompt": "p"}),
        ("videos", {"prompt": "p"}),
        ("speech", {"input": "hello"}),
    ],
)
@pytest.mark.parametrize("how", ["stop", "kill"])
async def test_a_stop_or_kill_ends_the_step_the_engine_waits_in(
    handler: str, request_body: dict[str, Any], how: str
) -> None:
    context = Context()
    items: list[Any] = []
    ended = trio.Event()

    async def run() -> None:
        items.extend(await collected(getattr(NEVER, handler), request_body, context))
        ended.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        await trio.testing.wait_all_tasks_blocked()
        assert not ended.is_set(), "waiting in its first step"
        getattr(context, how)()
        with trio.fail_after(5):
            await ended.wait()
    assert items == []


async def test_a_stop_between_frames_ends_the_video_there() -> None:
    context = Context()
    frames = []
    async for frame in FAST.videos(
        {"prompt": "p", "size": "8x8", "nvext": {"num_frames": 50}}, context
    ):
        frames.append(frame)
        if len(frames) == 2:
            context.stop()
    assert [frame["index"] for frame in frames] == [0, 1]


@pytest.mark.parametrize(
    ("handler", "request_body"),
    [
        ("images", {"prompt": "p", "output_format": "webp"}),
        ("speech", {"input": "x", "response_format": "mp3"}),
    ],
)
async def test_a_format_it_cannot_make_is_a_value_error(
    handler: str, request_body: dict[str, Any]
) -> None:
    with pytest.raises(ValueError, match="not"):
        await collected(getattr(FAST, handler), request_body, Context())
