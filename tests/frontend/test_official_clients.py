"""The official ``openai`` and ``anthropic`` clients parse every route into their own types.

A client validates what it reads against its models, so these tests pin the
frontend's compatibility with what real users run, on top of the wire-level
checks of ``test_routes.py``.
"""

from __future__ import annotations

import base64
import io
import struct
import wave
from typing import TYPE_CHECKING

import openai
import pytest
from openai.types import Completion, CreateEmbeddingResponse, ImagesResponse
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessageParam
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseCreatedEvent,
    ResponseIncompleteEvent,
    ResponseTextDeltaEvent,
)
from PIL import Image

from tests._memhttp import http_client, sdk_http_client

from .conftest import openai_client_leaves_generators, parse_sse
from .test_media import mjpeg_parts

if TYPE_CHECKING:
    import anthropic
    import trio.testing

    from .conftest import StartStack

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


def openai_client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{url}/v1",
        api_key="unused",
        max_retries=0,
        timeout=10,
        http_client=sdk_http_client(url),
    )


def anthropic_client(url: str) -> anthropic.AsyncAnthropic:
    import anthropic  # a slow import, made only where used (see anthropic_inline)

    return anthropic.AsyncAnthropic(
        base_url=url, api_key="unused", max_retries=0, timeout=10, http_client=sdk_http_client(url)
    )


@openai_client_leaves_generators
async def test_openai_chat_completions(
    stack: StartStack, autojump_clock: trio.testing.MockClock
) -> None:
    running = await stack(memory=True)
    async with openai_client(running.url) as client:
        completion = await client.chat.completions.create(
            model="mock", messages=MESSAGES, max_tokens=3
        )
        stream = await client.chat.completions.create(
            model="mock",
            messages=MESSAGES,
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
        no_usage = await client.chat.completions.create(
            model="mock", messages=MESSAGES, max_tokens=3, stream=True
        )
        plain_chunks = [chunk async for chunk in no_usage]

    assert isinstance(completion, ChatCompletion)
    [choice] = completion.choices
    assert choice.finish_reason == "length"
    assert choice.message.role == "assistant"
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 3
    assert completion.usage.total_tokens == (
        completion.usage.prompt_tokens + completion.usage.completion_tokens
    )

    assert all(isinstance(chunk, ChatCompletionChunk) for chunk in chunks)
    *content_chunks, usage_chunk = chunks
    text = "".join(c.choices[0].delta.content or "" for c in content_chunks)
    assert text == choice.message.content
    assert content_chunks[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in content_chunks)
    assert usage_chunk.choices == []
    assert usage_chunk.usage == completion.usage

    assert all(chunk.usage is None and chunk.choices for chunk in plain_chunks)
    assert plain_chunks[-1].choices[0].finish_reason == "length"


@openai_client_leaves_generators
async def test_openai_completions(
    stack: StartStack, autojump_clock: trio.testing.MockClock
) -> None:
    running = await stack(memory=True)
    async with openai_client(running.url) as client:
        completion = await client.completions.create(model="mock", prompt="hello", max_tokens=5)
        stream = await client.completions.create(
            model="mock",
            prompt="hello",
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]

    assert isinstance(completion, Completion)
    [choice] = completion.choices
    assert choice.finish_reason == "length"
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (1, 5)
    assert all(isinstance(chunk, Completion) for chunk in chunks)
    *text_chunks, usage_chunk = chunks
    assert "".join(c.choices[0].text for c in text_chunks) == choice.text
    assert text_chunks[-1].choices[0].finish_reason == "length"
    assert usage_chunk.choices == []
    assert usage_chunk.usage == completion.usage


async def test_openai_embeddings_float_and_base64(
    stack: StartStack, autojump_clock: trio.testing.MockClock
) -> None:
    running = await stack(memory=True)
    async with openai_client(running.url) as client:
        floats = await client.embeddings.create(
            model="mock-embed", input=["a", "b c"], encoding_format="float"
        )
        # Left to itself the client asks for base64 and decodes it to floats.
        decoded = await client.embeddings.create(model="mock-embed", input=["a", "b c"])
        raw = await client.embeddings.create(
            model="mock-embed", input="a", encoding_format="base64"
        )

    for response in (floats, decoded, raw):
        assert isinstance(response, CreateEmbeddingResponse)
        assert response.model == "mock-embed"
    assert [d.index for d in floats.data] == [0, 1]
    assert floats.usage.prompt_tokens == floats.usage.total_tokens == 3
    for exact, unpacked in zip(floats.data, decoded.data, strict=True):
        assert isinstance(exact.embedding, list)
        assert len(exact.embedding) == 16
        assert unpacked.embedding == pytest.approx(exact.embedding, rel=1e-6)
    assert decoded.usage == floats.usage
    packed = raw.data[0].embedding
    assert isinstance(packed, str)
    assert struct.unpack("<16f", base64.b64decode(packed)) == pytest.approx(
        floats.data[0].embedding, rel=1e-6
    )


async def test_openai_responses(stack: StartStack, autojump_clock: trio.testing.MockClock) -> None:
    running = await stack(memory=True)
    async with openai_client(running.url) as client:
        response = await client.responses.create(
            model="mock", input="hi", max_output_tokens=3, instructions="be brief"
        )
        stream = await client.responses.create(
            model="mock", input="hi", max_output_tokens=3, instructions="be brief", stream=True
        )
        events = [event async for event in stream]

    assert isinstance(response, Response)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.instructions == "be brief"
    assert response.usage is not None
    assert response.usage.output_tokens == 3
    assert response.usage.total_tokens == response.usage.input_tokens + 3
    text = response.output_text
    assert len(text.split()) == 3

    assert isinstance(events[0], ResponseCreatedEvent)
    assert isinstance(events[-1], ResponseIncompleteEvent)
    assert not any(isinstance(event, ResponseCompletedEvent) for event in events)
    deltas = [event.delta for event in events if isinstance(event, ResponseTextDeltaEvent)]
    assert "".join(deltas) == text
    final = events[-1].response
    assert final.output_text == text
    assert final.usage == response.usage


@pytest.mark.usefixtures("anthropic_inline")
async def test_anthropic_messages(
    stack: StartStack, autojump_clock: trio.testing.MockClock
) -> None:
    from anthropic.types import Message

    running = await stack(memory=True)
    async with anthropic_client(running.url) as client:
        message = await client.messages.create(
            model="mock", messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
        async with client.messages.stream(
            model="mock",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=3,
            system="be brief",
        ) as stream:
            events = [event async for event in stream]
            final = await stream.get_final_message()
        raw = await client.messages.create(
            model="mock", messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True
        )
        raw_types = [event.type async for event in raw]

    assert isinstance(message, Message)
    assert message.stop_reason == "max_tokens"
    assert message.usage.output_tokens == 3
    assert message.usage.input_tokens > 0
    [block] = message.content
    assert block.type == "text"
    assert len(block.text.split()) == 3

    assert isinstance(final, Message)
    assert final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == 3
    # The system prompt reaches the engine: more input tokens than without it.
    assert final.usage.input_tokens > message.usage.input_tokens
    assert [event.type for event in events][-1] == "message_stop"
    assert raw_types[0] == "message_start"
    assert raw_types[-3:] == ["content_block_stop", "message_delta", "message_stop"]


# ---------------------------------------------------------------------------- media


def png_size(data: bytes) -> tuple[int, int]:
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and data[12:16] == b"IHDR", data[:24]
    width, height = struct.unpack(">II", data[16:24])
    image = Image.open(io.BytesIO(data))
    image.load()
    assert image.size == (width, height)
    return width, height


async def test_openai_images_generate_and_edit(
    stack: StartStack, autojump_clock: trio.testing.MockClock
) -> None:
    running = await stack(memory=True)
    async with openai_client(running.url) as client:
        generated = await client.images.generate(
            model="mock-image", prompt="a cat", n=2, size="32x16", response_format="b64_json"
        )
        # Dynamo's edits route takes JSON with an input_reference (the client's own
        # images.edit sends multipart form data): the client's JSON call, parsed as its type.
        edited = await client.post(
            "/images/edits",
            body={
                "model": "mock-image",
                "prompt": "bluer",
                "size": "16x16",
                "response_format": "b64_json",
                "input_reference": "data:image/png;base64,AA==",
            },
            cast_to=ImagesResponse,
        )
    assert isinstance(generated, ImagesResponse)
    assert generated.data is not None and len(generated.data) == 2
    for image in generated.data:
        assert image.b64_json is not None
        assert png_size(base64.b64decode(image.b64_json)) == (32, 16)
        assert image.revised_prompt == "a cat"
    assert (generated.size, generated.output_format) == ("32x16", "png")
    assert edited.data is not None and edited.data[0].b64_json is not None
    assert png_size(base64.b64decode(edited.data[0].b64_json)) == (16, 16)


def wav_frames(data: bytes) -> int:
    assert data[:4] == b"RIFF" and data[8:16] == b"WAVEfmt ", data[:16]
    with wave.open(io.BytesIO(data), "rb") as reader:
        assert (reader.getnchannels(), reader.getframerate()) == (1, 24000)
        return reader.getnframes()


async def test_openai_speech_streamed_and_whole(
    stack: StartStack, autojump_clock: trio.testing.MockClock
) -> None:
    running = await stack(memory=True)
    async with openai_client(running.url) as client:
        async with client.audio.speech.with_streaming_response.create(
            model="mock-speech", voice="alloy", input="x" * 20, response_format="wav"
        ) as response:
            assert response.headers["content-type"] == "audio/wav"
            chunks = [chunk async for chunk in response.iter_bytes()]
        whole = await client.audio.speech.create(
            model="mock-speech", voice="alloy", input="x" * 20, speed=2.0
        )
        async with client.audio.speech.with_streaming_response.create(
            model="mock-speech", voice="alloy", input="x" * 20, response_format="pcm"
        ) as response:
            pcm = b"".join([chunk async for chunk in response.iter_bytes()])
    streamed = b"".join(chunks)
    assert wav_frames(streamed) == 24000, "one second: 20 characters at 0.05 s"
    assert len(streamed) == 44 + 2 * 24000
    assert wav_frames(whole.content) == 12000, "at twice the speed"
    assert pcm == streamed[44:], "pcm is the wav's samples"


async def test_httpx_videos_json_sse_and_mjpeg(
    stack: StartStack, autojump_clock: trio.testing.MockClock
) -> None:
    running = await stack(memory=True)
    body = {"model": "mock-video", "prompt": "waves", "size": "16x8", "nvext": {"num_frames": 3}}
    async with http_client(running.url, timeout=10) as http:
        unary = await http.post("/v1/videos", json=body)
        events = await http.post("/v1/videos", json={**body, "stream": True})
        mjpeg = await http.post("/v1/videos/stream", json=body)
    video = unary.json()
    assert (video["object"], video["status"], video["progress"]) == ("video", "completed", 100)
    frames = mjpeg_parts(base64.b64decode(video["data"][0]["b64_json"]))
    sse = parse_sse(events.text)
    assert sse[-1].data == "[DONE]"
    sse_frames = [base64.b64decode(event.json()["b64_json"]) for event in sse[:-1]]
    assert mjpeg.headers["content-type"] == "multipart/x-mixed-replace; boundary=frame"
    for jpegs in (
        [jpeg for _, jpeg in frames],
        sse_frames,
        [j for _, j in mjpeg_parts(mjpeg.content)],
    ):
        assert len(jpegs) == 3
        for jpeg in jpegs:
            assert jpeg[:3] == b"\xff\xd8\xff"
            image = Image.open(io.BytesIO(jpeg))
            image.load()
            assert (image.format, image.size) == ("JPEG", (16, 8))
